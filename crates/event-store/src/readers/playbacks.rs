//! A playback id's item in the playbacks' bookkeeping partition (slot -5,
//! `playback#<id>`; moved from slot -2 at its first take, see
//! [`crate::bookkeeping::moving`]):
//! - its **binding**: the window and filter of its first run; another
//!   window or filter under the same id is refused;
//! - its **lease**: one runner at a time, taken with a conditional write,
//!   kept by the continuations of the chain (which carry the owner token),
//!   taken over by anyone once it has expired (a crashed runner);
//! - its **checkpoint**, saved after every put only while the lease is held,
//!   and never behind the stored one: the same request again, or the
//!   continuation, starts from it (never from a position in a payload).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity, ReturnValue};

pub use crate::bookkeeping::lease::Lease;
use crate::bookkeeping::lease::{self, n, s, Taken, LEASE_FREE};
use crate::bookkeeping::{self, moving, unless_condition_failed, Family};
use crate::error::{Error, Result};
use crate::position::Checkpoint;
use crate::position::{checkpoint_of, checkpoint_value, CHECKPOINT};

/// The sort-key prefix of playback items.
pub const KEY_PREFIX: &str = "playback#";

fn sort_key(id: &str) -> String {
    format!("{KEY_PREFIX}{id}")
}

fn key(id: &str) -> HashMap<String, AttributeValue> {
    bookkeeping::key_in(Family::Playbacks, sort_key(id))
}

/// What a playback id is bound to at its first run: its window and filter
/// (with its selection and part, when it has them).
/// A request that names the id with another window or filter is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub start: i64,
    pub end: i64,
    /// The filter as canonical JSON (the request's `binds`).
    pub filter: String,
}

impl Binding {
    pub(crate) fn new(start: i64, end: i64, filter: String) -> Self {
        Self { start, end, filter }
    }
}

/// A playback id's item: binding, lease and checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub binding: Option<Binding>,
    pub lease: Option<Lease>,
    pub checkpoint: Option<Checkpoint>,
}

impl Stored {
    pub(crate) fn from_item(item: &HashMap<String, AttributeValue>) -> Result<Self> {
        let num = |name: &str| item.get(name).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok());
        let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
        let binding = match (num("window_start"), num("window_end"), text("filter")) {
            (Some(start), Some(end), Some(filter)) => Some(Binding { start, end, filter }),
            _ => None,
        };
        Ok(Self { binding, lease: lease::lease_of(item), checkpoint: checkpoint_of(item)? })
    }
}

/// The id's item (where it is before its first take since it moved: slot -2).
pub async fn load(dynamo: &aws_sdk_dynamodb::Client, table: &str, id: &str) -> Result<Option<Stored>> {
    let item = match bookkeeping::get_in(dynamo, table, Family::Playbacks, sort_key(id)).await? {
        Some(item) => Some(item),
        None => bookkeeping::get_in(dynamo, table, Family::legacy(), sort_key(id)).await?,
    };
    item.as_ref().map(Stored::from_item).transpose()
}

/// What a runner asks [`take`] for.
#[derive(Clone, Copy)]
pub struct Claim<'a> {
    /// This invocation's own token: every invocation takes the lease under a
    /// new one, so a continuation delivered twice cannot run twice.
    pub owner: &'a str,
    /// The token the continuation was handed (the previous hop's owner).
    pub previous: Option<&'a str>,
    pub until: i64,
    pub now: i64,
    pub binding: &'a Binding,
    /// Start over: the binding and the checkpoint are replaced by these
    /// (`restart`, or an open-ended request whose last run is done).
    pub fresh: Option<&'a Checkpoint>,
}

/// Takes the id's lease for `owner`: when it is free, expired before `now`,
/// or held by `previous` (the continuation's predecessor hands it on).
/// Unless starting fresh, the stored binding must be the claim's (or
/// absent: the first run binds the id).
pub(crate) async fn take(dynamo: &aws_sdk_dynamodb::Client, table: &str, id: &str, claim: Claim<'_>) -> Result<Taken> {
    let moved = (Family::Playbacks, sort_key(id));
    if let Some(until) = moving::adopt(dynamo, table, (moved.0.slot(), &moved.1), claim.now, claim.previous).await? {
        return Ok(Taken::Busy(until));
    }
    let lease_free = LEASE_FREE;
    let same_binding =
        "(attribute_not_exists(window_start) OR (window_start = :ws AND window_end = :we AND #filter = :filter))";
    let mut update = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(id)))
        .expression_attribute_names("#filter", "filter")
        .expression_attribute_values(":me", s(claim.owner))
        // A new runner hands nothing on: its own fresh token matches no stored owner.
        .expression_attribute_values(":previous", s(claim.previous.unwrap_or(claim.owner)))
        .expression_attribute_values(":until", n(claim.until))
        .expression_attribute_values(":now", n(claim.now))
        .expression_attribute_values(":ws", n(claim.binding.start))
        .expression_attribute_values(":we", n(claim.binding.end))
        .expression_attribute_values(":filter", s(&claim.binding.filter))
        .return_values(ReturnValue::AllNew)
        .return_consumed_capacity(ReturnConsumedCapacity::Total);
    let bind = "lease_owner = :me, lease_until = :until, window_start = :ws, window_end = :we, #filter = :filter";
    update = match claim.fresh {
        Some(fresh) => update
            .update_expression(format!("SET {bind}, #checkpoint = :checkpoint"))
            .condition_expression(lease_free)
            .expression_attribute_names("#checkpoint", CHECKPOINT)
            .expression_attribute_values(":checkpoint", checkpoint_value(fresh)?),
        None => update
            .update_expression(format!("SET {bind}"))
            .condition_expression(format!("{lease_free} AND {same_binding}")),
    };
    if let Some(out) = unless_condition_failed(update.send().await)? {
        let stored = out.attributes().map(Stored::from_item).transpose()?.unwrap_or_default();
        return Ok(Taken::Held(stored.checkpoint));
    }
    let stored = load(dynamo, table, id).await?.unwrap_or_default();
    match (stored.binding, stored.lease) {
        (Some(bound), _) if claim.fresh.is_none() && bound != *claim.binding => {
            Err(Error::BadInput(format!("playback id {id:?} was bound to another window or filter meanwhile")))
        }
        // Held by another runner (or released just now: busy for an instant, try again).
        (_, lease) => Ok(Taken::Busy(lease.map_or(claim.now, |lease| lease.until.max(claim.now)))),
    }
}

/// Saves `checkpoint` while `owner` holds the lease, and never behind the
/// stored one; with `until`, the lease is extended (a hand-over) or, at 0,
/// given up. Another runner's lease: [`Error::LeaseLost`], nothing written.
pub(crate) async fn save(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    id: &str,
    owner: &str,
    checkpoint: &Checkpoint,
    until: Option<i64>,
) -> Result<()> {
    if lease::save(dynamo, table, key(id), owner, checkpoint, until).await? {
        return Ok(());
    }
    Err(Error::LeaseLost(format!("playback {id}: another run holds it now (or it is further on)")))
}

/// Gives the lease up (after an error, so a retry need not wait for it to expire).
pub(crate) async fn release(dynamo: &aws_sdk_dynamodb::Client, table: &str, id: &str, owner: &str) -> Result<()> {
    lease::release(dynamo, table, key(id), owner).await
}
