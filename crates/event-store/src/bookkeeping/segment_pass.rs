//! A scan segment's current pass, stored so that nothing a continuation
//! trusts comes from its payload: the scheduled run *claims* the segment
//! with a new pass (its start and what the stream held back, see
//! [`super::watermark::Pass`]) and a random token; the forks and
//! continuations carry only the token. A run whose token is not the stored
//! one (superseded, finished, or forged) does nothing.
//!
//! The claim is also the segment's single-runner lease: a new pass is
//! claimed only when the last one finished or its lease ran out, so a slow
//! pass is never joined by a second one every minute, and a crashed chain
//! is taken over once its lease expires.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity, ReturnValue};
use serde::{Deserialize, Serialize};

use super::watermark::Pass;
use super::{key, unless_condition_failed};
use crate::error::{Error, Result};

/// What a segment's pass has done so far (the `state` map of its item).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassState {
    #[serde(flatten)]
    pub pass: Pass,
    /// The buffer key after which the next run goes on; absent at the segment's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_key: Option<String>,
}

fn pass_key(total_segments: u32, segment: u32) -> HashMap<String, AttributeValue> {
    key(format!("pass#{total_segments:04}#{segment:04}"))
}

fn state_value(state: &PassState) -> Result<AttributeValue> {
    serde_dynamo::to_item::<_, HashMap<String, AttributeValue>>(state)
        .map(AttributeValue::M)
        .map_err(|e| Error::encode("pass state", e))
}

fn n(value: i64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

/// Starts a new pass of the segment under `token`, unless its last pass
/// is still running (unfinished, lease not expired at `now`). True when claimed.
pub(crate) async fn claim(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (segment, total_segments): (u32, u32),
    token: &str,
    pass: Pass,
    lease_until: i64,
    now: i64,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(pass_key(total_segments, segment)))
        .update_expression("SET #token = :token, #state = :state, lease_until = :until, done = :false")
        // `#token = :token`: the SDK's own retry of this claim, applied before its answer was lost.
        .condition_expression("attribute_not_exists(#token) OR done = :true OR lease_until < :now OR #token = :token")
        .expression_attribute_names("#token", "token")
        .expression_attribute_names("#state", "state")
        .expression_attribute_values(":token", AttributeValue::S(token.to_owned()))
        .expression_attribute_values(":state", state_value(&PassState { pass, next_key: None })?)
        .expression_attribute_values(":until", n(lease_until))
        .expression_attribute_values(":now", n(now))
        .expression_attribute_values(":true", AttributeValue::Bool(true))
        .expression_attribute_values(":false", AttributeValue::Bool(false))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    Ok(unless_condition_failed(result)?.is_some())
}

/// Whether a pass item lets a new pass be claimed at `now`: the same test as [`claim`]'s condition.
fn claimable(item: &HashMap<String, AttributeValue>, now: i64) -> bool {
    let done = item.get("done").and_then(|v| v.as_bool().ok()) == Some(&true);
    let lease_until = item.get("lease_until").and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
    !item.contains_key("token") || done || lease_until.is_some_and(|until| until < now)
}

/// How many of the `total_segments` segments a new pass may claim at `now`
/// (one `Query`): a scheduled run that finds none looks at nothing else.
pub(crate) async fn claimable_segments(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    total_segments: u32,
    now: i64,
) -> Result<u32> {
    let prefix = format!("pass#{total_segments:04}#");
    let (items, _) = super::query_range(dynamo, table, format!("{prefix}0000"), format!("{prefix}9999")).await?;
    let running = items.iter().filter(|item| !claimable(item, now)).count() as u32;
    Ok(total_segments.saturating_sub(running))
}

/// A run of the pass `token` starts: hands the pass on to this run's own
/// token `next` (so a fork or continuation delivered twice runs once),
/// extends the lease to `lease_until` and returns the pass's state; `None`
/// when `token` is not the segment's running pass (a later pass claimed it,
/// another run took it on, it finished, or it never existed).
pub(crate) async fn take(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (segment, total_segments): (u32, u32),
    (token, next): (&str, &str),
    lease_until: i64,
) -> Result<Option<PassState>> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(pass_key(total_segments, segment)))
        .update_expression("SET #token = :next, lease_until = :until")
        // `:next`: the SDK's own retry of this take, applied before its answer was lost.
        .condition_expression("(#token = :token OR #token = :next) AND done = :false")
        .expression_attribute_names("#token", "token")
        .expression_attribute_values(":token", AttributeValue::S(token.to_owned()))
        .expression_attribute_values(":next", AttributeValue::S(next.to_owned()))
        .expression_attribute_values(":until", n(lease_until))
        .expression_attribute_values(":false", AttributeValue::Bool(false))
        .return_values(ReturnValue::AllNew)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    let Some(out) = unless_condition_failed(result)? else { return Ok(None) };
    let state = out
        .attributes()
        .and_then(|item| item.get("state"))
        .and_then(|value| value.as_m().ok())
        .ok_or_else(|| Error::Malformed("pass item without its state".into()))?;
    serde_dynamo::from_item(state.clone()).map(Some).map_err(|e| Error::Malformed(format!("pass state: {e}")))
}

/// Saves where the pass stands before a continuation takes over (lease
/// until `lease_until`); false when `token` lost the segment meanwhile.
pub(crate) async fn hand_over(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (segment, total_segments): (u32, u32),
    token: &str,
    state: &PassState,
    lease_until: i64,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(pass_key(total_segments, segment)))
        .update_expression("SET #state = :state, lease_until = :until")
        .condition_expression("#token = :token AND done = :false")
        .expression_attribute_names("#token", "token")
        .expression_attribute_names("#state", "state")
        .expression_attribute_values(":token", AttributeValue::S(token.to_owned()))
        .expression_attribute_values(":state", state_value(state)?)
        .expression_attribute_values(":until", n(lease_until))
        .expression_attribute_values(":false", AttributeValue::Bool(false))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    Ok(unless_condition_failed(result)?.is_some())
}

/// The pass `token` is over (finished, stopped, or failed): the next
/// scheduled run may claim the segment. False when `token` had lost the
/// segment (its watermark must not move). Idempotent, so the SDK may retry it.
pub(crate) async fn finish(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (segment, total_segments): (u32, u32),
    token: &str,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(pass_key(total_segments, segment)))
        .update_expression("SET done = :true")
        .condition_expression("#token = :token")
        .expression_attribute_names("#token", "token")
        .expression_attribute_values(":token", AttributeValue::S(token.to_owned()))
        .expression_attribute_values(":true", AttributeValue::Bool(true))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    Ok(unless_condition_failed(result)?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_map_holds_the_pass_and_where_it_stands() {
        let state = PassState { pass: Pass::started_at(1_000, Some(900), 900), next_key: Some("ab".into()) };
        let AttributeValue::M(map) = state_value(&state).unwrap() else { panic!("a map") };
        assert_eq!(map["pass_started_at"], n(1_000));
        assert_eq!(map["stream_bound"], n(900));
        assert_eq!(map["next_key"], AttributeValue::S("ab".into()));
        assert_eq!(serde_dynamo::from_item::<_, PassState>(map).unwrap(), state);
    }

    #[test]
    fn a_segment_is_claimable_when_its_pass_is_done_or_its_lease_ran_out() {
        let item = |done: bool, until: i64| {
            HashMap::from([
                ("token".to_string(), AttributeValue::S("t".into())),
                ("done".to_string(), AttributeValue::Bool(done)),
                ("lease_until".to_string(), n(until)),
            ])
        };
        assert!(!claimable(&item(false, 2_000), 1_000), "running, leased");
        assert!(claimable(&item(true, 2_000), 1_000), "done");
        assert!(claimable(&item(false, 500), 1_000), "lease ran out");
        assert!(claimable(&HashMap::new(), 1_000), "never claimed");
        let mut odd = item(false, 2_000);
        odd.remove("done");
        odd.remove("lease_until");
        assert!(!claimable(&odd, 1_000), "as the claim's condition: a missing attribute compares false");
    }
}
