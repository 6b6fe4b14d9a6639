//! Waking a function on work instead of looping (`awake#<function>`): a
//! writer that leaves work (the pump, after it buffers records) records
//! *when* it wanted the function, and starts a run of it unless one is
//! already awake; the awake run passes again and again while the last want
//! is recent, holding the item's lease, and stops once it is not. At idle
//! nothing runs but the schedule.
//!
//! The want is the writer's item (the pump's family, slot -3), the lease
//! the run's (the scan's, slot -2): each role writes only its own, and the
//! run claims the lease itself when it starts.
//!
//! No want is lost between the two: the writer records its want *before*
//! it reads the lease, and the run gives its lease up *before* it reads the
//! want (all strongly consistent, so each read sees every write that
//! finished before it). So either the writer sees the lease still held (and
//! the run, whose read of the want comes after, sees the new want and takes
//! the lease again), or the writer sees the lease free and starts a run.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity, ReturnValue};
use serde::{Deserialize, Serialize};

use super::lease::{n, s};
use super::{get_in, key_in, unless_condition_failed, Family};
use crate::error::{Error, Result};
use crate::invoke::{continue_with, Invoker};

/// The scan's items: the pump's want, the awake scan's lease.
pub const SCAN: &str = "awake#scan";

/// How long a lease lasts past its last renewal: an awake run renews it
/// about once a second, so a crashed one holds it (and new wakes wait for
/// the schedule) at most this long.
pub const LEASE_MS: i64 = 30_000;

/// The payload of an awake run: `{"awake": {"owner": …, "hop": …}}`. The
/// owner is only a name to hold the stored lease under: the first hop
/// claims it, and a run whose owner does not hold it does nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwakeRun {
    pub owner: String,
    /// Continuations so far in this chain (bounded by `MAX_CONTINUATIONS`).
    #[serde(default)]
    pub hop: u32,
}

impl AwakeRun {
    /// The function's payload: the run under `awake`.
    pub(crate) fn payload(&self) -> HashMap<&'static str, &AwakeRun> {
        HashMap::from([("awake", self)])
    }
}

/// What a writer holds to wake a function on work: the item, and how to
/// start a run of the function (`Invoke`, asynchronously).
#[derive(Clone)]
pub struct Waker {
    dynamo: aws_sdk_dynamodb::Client,
    table: String,
    which: &'static str,
    invoker: Arc<dyn Invoker>,
}

impl Waker {
    pub(crate) fn new(
        dynamo: aws_sdk_dynamodb::Client,
        table: String,
        which: &'static str,
        invoker: Arc<dyn Invoker>,
    ) -> Self {
        Self { dynamo, table, which, invoker }
    }

    /// Records a want at `now` and starts an awake run unless one holds the
    /// lease, or a writer started one moments ago (it reads this want when it
    /// claims the lease; of two started at once, one goes on and the other
    /// stops at once). True when this call started one.
    pub(crate) async fn wake(&self, now: i64) -> Result<bool> {
        let (dynamo, table, which) = (&self.dynamo, self.table.as_str(), self.which);
        let lease = wanted(dynamo, table, which, now).await?;
        if held(number(lease.as_ref(), "lease_until"), now)
            || !starting(dynamo, table, which, now, number(lease.as_ref(), "claimed_at")).await?
        {
            return Ok(false);
        }
        let run = AwakeRun { owner: uuid::Uuid::new_v4().simple().to_string(), hop: 0 };
        if let Err(err) = continue_with(self.invoker.as_ref(), &run.payload()).await {
            // No run is on its way: the next want starts one, not two seconds later.
            let _ = not_starting(dynamo, table, which, now).await;
            return Err(err);
        }
        Ok(true)
    }
}

fn number(item: Option<&HashMap<String, AttributeValue>>, name: &str) -> Option<i64> {
    item?.get(name)?.as_n().ok()?.parse().ok()
}

/// Whether the lease `until` (absent: never taken) is held by a run at `now`.
pub(crate) fn held(until: Option<i64>, now: i64) -> bool {
    until.is_some_and(|until| until >= now)
}

/// Whether an awake run passes again at `now`: the last want is at most
/// `linger_ms` old (long enough for the wanted work's slots to be complete).
pub(crate) fn keep_going(wanted_at: Option<i64>, now: i64, linger_ms: i64) -> bool {
    wanted_at.is_some_and(|wanted| now - wanted <= linger_ms)
}

/// Records a want at `now` (the writer's item) and answers whether a run
/// holds the lease (then the want is that run's to see; otherwise the
/// caller should start one).
pub async fn want(dynamo: &aws_sdk_dynamodb::Client, table: &str, which: &str, now: i64) -> Result<bool> {
    let lease = wanted(dynamo, table, which, now).await?;
    Ok(held(number(lease.as_ref(), "lease_until"), now))
}

/// [`want`], answering with the lease's item as read after the want.
async fn wanted(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    which: &str,
    now: i64,
) -> Result<Option<HashMap<String, AttributeValue>>> {
    dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key_in(Family::Pump, which.to_owned())))
        .update_expression("SET wanted_at = :now")
        .expression_attribute_values(":now", n(now))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("UpdateItem", e))?;
    get_in(dynamo, table, Family::Scan, which.to_owned()).await
}

/// How long after a writer started a run that has not claimed the lease yet
/// no other writer starts one: about as long as an asynchronous invocation
/// takes to start (the run reads every want written before its claim).
pub const STARTING_MS: i64 = 2_000;

/// Records, in the writer's item, that a run is being started at `now`,
/// unless one was within [`STARTING_MS`] and has not claimed the lease since
/// (`claimed_at`, as the caller read it): true when the caller should start it.
async fn starting(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    which: &str,
    now: i64,
    claimed_at: Option<i64>,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key_in(Family::Pump, which.to_owned())))
        .update_expression("SET started_at = :now")
        .condition_expression("attribute_not_exists(started_at) OR started_at <= :recent OR started_at <= :claimed")
        .expression_attribute_values(":now", n(now))
        .expression_attribute_values(":recent", n(now - STARTING_MS))
        .expression_attribute_values(":claimed", n(claimed_at.unwrap_or(i64::MIN)))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    Ok(unless_condition_failed(result)?.is_some())
}

/// Undoes [`starting`] at `now` (the run was not started).
async fn not_starting(dynamo: &aws_sdk_dynamodb::Client, table: &str, which: &str, now: i64) -> Result<()> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key_in(Family::Pump, which.to_owned())))
        .update_expression("REMOVE started_at")
        .condition_expression("started_at = :now")
        .expression_attribute_values(":now", n(now))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    unless_condition_failed(result).map(|_| ())
}

/// Records that a run started by a writer looked at the lease at `now` and
/// found it held by another (which reads the writer's want): writers may
/// start the next run without waiting out [`STARTING_MS`].
pub async fn looked(dynamo: &aws_sdk_dynamodb::Client, table: &str, which: &str, now: i64) -> Result<()> {
    dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key_in(Family::Scan, which.to_owned())))
        .update_expression("SET claimed_at = :now")
        .expression_attribute_values(":now", n(now))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("UpdateItem", e))?;
    Ok(())
}

/// Takes the lease for `owner` until `until`, if no run holds it at `now`
/// (or `owner` already does: the SDK's retry of an applied claim). True when taken.
pub async fn claim(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    which: &str,
    owner: &str,
    until: i64,
    now: i64,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key_in(Family::Scan, which.to_owned())))
        // `claimed_at`: writers start another run once the one they started has claimed (see `starting`).
        .update_expression("SET lease_owner = :me, lease_until = :until, claimed_at = :now")
        .condition_expression("attribute_not_exists(lease_until) OR lease_until < :now OR lease_owner = :me")
        .expression_attribute_values(":me", s(owner))
        .expression_attribute_values(":until", n(until))
        .expression_attribute_values(":now", n(now))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    Ok(unless_condition_failed(result)?.is_some())
}

/// What the item says after a write of the lease holder's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// The caller holds (or gave up) the lease; the last want, if any.
    Mine { wanted_at: Option<i64> },
    /// Another run holds the lease (or none did): nothing was written.
    Lost,
}

/// Extends `owner`'s lease to `until` (0: gives it up), then reads the
/// last want (the writer's item; or, from a writer of the version before
/// wants had an item of their own, the lease's item).
pub async fn hold(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    which: &str,
    owner: &str,
    until: i64,
) -> Result<Held> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key_in(Family::Scan, which.to_owned())))
        .update_expression("SET lease_until = :until")
        .condition_expression("lease_owner = :me")
        .expression_attribute_values(":me", s(owner))
        .expression_attribute_values(":until", n(until))
        .return_values(ReturnValue::AllNew)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    let Some(out) = unless_condition_failed(result)? else { return Ok(Held::Lost) };
    let wanted = get_in(dynamo, table, Family::Pump, which.to_owned()).await?;
    let wanted_at = number(wanted.as_ref(), "wanted_at").max(number(out.attributes(), "wanted_at"));
    Ok(Held::Mine { wanted_at })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_held_until_its_end_and_never_when_never_taken() {
        assert!(!held(None, 1_000));
        assert!(held(Some(1_000), 1_000));
        assert!(!held(Some(999), 1_000));
        assert!(!held(Some(0), 1_000), "given up");
    }

    #[test]
    fn an_awake_run_is_its_owner_and_hop_and_nothing_else() {
        let run: AwakeRun = serde_json::from_value(serde_json::json!({"owner": "5f0c"})).unwrap();
        assert_eq!(run, AwakeRun { owner: "5f0c".into(), hop: 0 });
        assert!(serde_json::from_value::<AwakeRun>(serde_json::json!({"owner": "5f0c", "until": 1})).is_err());
    }

    #[test]
    fn a_run_keeps_going_while_the_last_want_is_recent() {
        assert!(!keep_going(None, 10_000, 5_000), "never wanted");
        assert!(keep_going(Some(5_000), 10_000, 5_000));
        assert!(!keep_going(Some(4_999), 10_000, 5_000));
        assert!(keep_going(Some(12_000), 10_000, 5_000), "a want from a clock ahead of ours");
    }
}
