//! One runner at a time, fenced (`docs/design.md#6`): the expiring lease
//! and the checkpoint writes a playback id and a subscription partition
//! share. A runner takes the lease with one conditional `UpdateItem` under
//! a token of its own; every checkpoint write is conditional on still
//! holding it and on not moving the checkpoint backwards; a crashed
//! runner's lease is taken over once it has expired.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use super::unless_condition_failed;
use crate::error::Result;
use crate::position::{checkpoint_value, Checkpoint, CHECKPOINT};

/// The lease is free, expired before `:now`, handed on by the caller's
/// predecessor (`:previous`), or already the caller's own (`:me`: the SDK's
/// retry of a take that was applied before its answer was lost).
pub const LEASE_FREE: &str =
    "(attribute_not_exists(lease_until) OR lease_until < :now OR lease_owner = :previous OR lease_owner = :me)";

pub(crate) fn n(value: i64) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(crate) fn s(value: &str) -> AttributeValue {
    AttributeValue::S(value.to_owned())
}

/// What taking a lease found: the one outcome of every lease's take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The lease is ours; the checkpoint stored with it (none: from the reader's start).
    Held(Option<Checkpoint>),
    /// Another runner holds it until this time (ms).
    Busy(i64),
}

/// Who holds a lease, until when (ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub owner: String,
    pub until: i64,
}

/// The lease stored in an item, if any.
pub(crate) fn lease_of(item: &HashMap<String, AttributeValue>) -> Option<Lease> {
    let owner = item.get("lease_owner").and_then(|v| v.as_s().ok())?;
    let until = item.get("lease_until").and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok())?;
    Some(Lease { owner: owner.clone(), until })
}

/// Saves `checkpoint` in the item at `key` while `owner` holds its lease,
/// and never behind the stored one; with `until`, the lease is extended (a
/// hand-over) or, at 0, given up. False: another runner holds the lease (or
/// the stored checkpoint is further on), and nothing was written.
pub(crate) async fn save(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    key: HashMap<String, AttributeValue>,
    owner: &str,
    checkpoint: &Checkpoint,
    until: Option<i64>,
) -> Result<bool> {
    let mut update = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key))
        // Progress clears what held the runner up (`waiting`, see [`release_waiting`]).
        .update_expression(match until {
            Some(_) => "SET #checkpoint = :checkpoint, lease_until = :until REMOVE waiting",
            None => "SET #checkpoint = :checkpoint REMOVE waiting",
        })
        // `<=`: the SDK's own retry of an applied save passes; anything further on is another run's.
        .condition_expression("lease_owner = :me AND (attribute_not_exists(#checkpoint) OR #checkpoint.#seq <= :seq)")
        .expression_attribute_names("#checkpoint", CHECKPOINT)
        .expression_attribute_names("#seq", "seq")
        .expression_attribute_values(":checkpoint", checkpoint_value(checkpoint)?)
        .expression_attribute_values(":me", s(owner))
        .expression_attribute_values(":seq", n(checkpoint.seq as i64))
        .return_consumed_capacity(ReturnConsumedCapacity::Total);
    if let Some(until) = until {
        update = update.expression_attribute_values(":until", n(until));
    }
    Ok(unless_condition_failed(update.send().await)?.is_some())
}

/// Gives the lease at `key` up, if `owner` holds it (after an error, so a
/// retry need not wait for it to expire; a lost lease is not ours to give up).
pub(crate) async fn release(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    key: HashMap<String, AttributeValue>,
    owner: &str,
) -> Result<()> {
    release_waiting(dynamo, table, key, owner, None).await
}

/// [`release`], recording `why` the runner could not go on (`waiting`: an
/// item of a newer version at its checkpoint, say) until its next progress.
pub(crate) async fn release_waiting(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    key: HashMap<String, AttributeValue>,
    owner: &str,
    why: Option<&str>,
) -> Result<()> {
    let mut update = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key))
        .update_expression(if why.is_some() {
            "SET lease_until = :zero, waiting = :why"
        } else {
            "SET lease_until = :zero"
        })
        .condition_expression("lease_owner = :me")
        .expression_attribute_values(":zero", n(0))
        .expression_attribute_values(":me", s(owner))
        .return_consumed_capacity(ReturnConsumedCapacity::Total);
    if let Some(why) = why {
        update = update.expression_attribute_values(":why", s(why));
    }
    unless_condition_failed(update.send().await).map(|_| ())
}
