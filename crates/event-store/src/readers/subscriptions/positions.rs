//! Management that moves where a subscription's partitions stand: `reset`
//! (every partition back to a time) and `rescale` (a new partition count,
//! each key in order across the change).
//!
//! A rescale never lets two partitions deliver one key's events at once:
//! 1. `rescale` records the new count in the definition; runners stop at
//!    their next look (within a second, after the delivery in flight, its
//!    checkpoint saved) and the tick starts none;
//! 2. once no partition's lease is held, the tick sets the common position
//!    `at`: the start of the slot after the farthest checkpoint, so no
//!    partition has delivered anything at or after it;
//! 3. the old partitions run again up to `at` (never past it) and end;
//! 4. once every one stands at `at` and none runs, the tick switches the
//!    definition in one conditional write: the new count, the next epoch,
//!    and where its partitions start: at `at`, with sequence numbers past
//!    every one used before (the consumer's rule holds for a key whose
//!    partition changed). Partition items of the old epoch are replaced at
//!    their first take; those past the new count are deleted.
//!
//! Keys are never rehashed: a key's hash is fixed, and the new partitions
//! are ranges of it ([`crate::slices::KeyRange`]); a subscription created
//! before slices (`hash mod N`) gets ranges at its first rescale.

use aws_sdk_dynamodb::types::{DeleteRequest, ReturnConsumedCapacity, ReturnValue, WriteRequest};

use super::spec::{check_partitions, EpochStart, Keying, Rescale, Subscription};
use super::{
    checkpoint_of, definition_key, existing, key, move_partition, partition_item_key, partitions, position_ms,
    Partition, EPOCH,
};
use crate::batch::Backoff;
use crate::bookkeeping::lease::{n, s};
use crate::bookkeeping::unless_condition_failed;
use crate::dynamo::{write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::{sort_key_floor, HASH_KEY, RANGE_KEY};
use crate::position::{checkpoint_value, Checkpoint, CHECKPOINT};

/// Sets every partition of `sub` to deliver from `to` (ms) and clears
/// `stopped`. Per partition, in two writes: the first takes the lease away
/// from whoever holds it (their later writes fail) for a minute and returns
/// the stored count, the second writes the new checkpoint and frees the
/// lease, conditional on the fence still holding it. The count goes on past
/// the stored one by a batch (what a runner can deliver before its next
/// save), so a sequence number never names two events. The subscription's
/// `start_ms` becomes `to`. Refused while a rescale is under way.
pub(crate) async fn reset(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    sub: &Subscription,
    to: i64,
    unit: u64,
) -> Result<()> {
    if sub.rescale.is_some() {
        return Err(Error::BadInput(format!("subscription {}: a rescale is under way; reset after it", sub.name)));
    }
    super::update(dynamo, table, &sub.name, &[("start_ms", n(to))]).await?;
    let fence = format!("reset-{}", uuid::Uuid::new_v4().simple());
    let first_seq = sub.start_checkpoint(unit).seq;
    for partition in 0..sub.partitions {
        move_partition(dynamo, table, &sub.name, partition).await?;
        let item_key = partition_item_key(&sub.name, partition);
        // The item becomes this epoch's (epoch 0 is never written: items of before rescales have none).
        let (epoch, epoch_value) = match sub.epoch {
            0 => (" REMOVE #epoch", None),
            e => (", #epoch = :epoch", Some(n(i64::from(e)))),
        };
        let fenced = dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(item_key.clone()))
            .update_expression(format!("SET lease_owner = :fence, lease_until = :minute, sub_id = :sub{epoch}"))
            .expression_attribute_names("#epoch", EPOCH)
            .expression_attribute_values(":fence", s(&fence))
            .expression_attribute_values(":minute", n(crate::time::now_ms() + 60_000))
            .expression_attribute_values(":sub", s(&sub.id));
        let fenced = match epoch_value {
            Some(value) => fenced.expression_attribute_values(":epoch", value),
            None => fenced,
        };
        let fenced = fenced
            .return_values(ReturnValue::AllOld)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("UpdateItem", e))?;
        let ours = fenced.attributes().filter(|old| old.get("sub_id").and_then(|v| v.as_s().ok()) == Some(&sub.id));
        let (seq, events) = match ours {
            // A runner of this subscription may have delivered one batch past its last save
            // (a crash, or this reset's fence came just before its save): skip its numbers.
            Some(old) => {
                let before = checkpoint_of(old)?;
                let (seq, events) = before.map_or((0, 0), |c| (c.seq, c.events));
                (seq + sub.batch_size as u64, events)
            }
            None => (0, 0),
        };
        let checkpoint = Checkpoint { seq: seq.max(first_seq), events, ..Checkpoint::starting_at(to, unit) };
        let result = dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(item_key))
            .update_expression("SET #checkpoint = :checkpoint, lease_until = :zero REMOVE stopped")
            .condition_expression("lease_owner = :fence")
            .expression_attribute_names("#checkpoint", CHECKPOINT)
            .expression_attribute_values(":checkpoint", checkpoint_value(&checkpoint)?)
            .expression_attribute_values(":fence", s(&fence))
            .expression_attribute_values(":zero", n(0))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        if unless_condition_failed(result)?.is_none() {
            return Err(Error::LeaseLost(format!(
                "subscription {} partition {partition}: reset raced another reset",
                sub.name
            )));
        }
    }
    Ok(())
}

/// Asks for `to` partitions: recorded in the definition (a rescale under
/// way gets the new count); the tick does the rest ([`rescale_step`]).
pub(crate) async fn rescale(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str, to: u32) -> Result<()> {
    let to = check_partitions(to)?;
    let sub = existing(dynamo, table, name).await?;
    if sub.rescale.is_none() && sub.partitions == to && sub.keying == Keying::Ranges {
        return Err(Error::BadInput(format!("subscription {name} has {to} partitions already")));
    }
    let rescale = Rescale { to, at: sub.stop_at() };
    let mut request = dynamo.update_item();
    if let Some(at) = sub.stop_at() {
        request = request.expression_attribute_values(":at", n(at));
    }
    let value = serde_dynamo::to_attribute_value(&rescale).map_err(|e| Error::encode("rescale", e))?;
    let result = request
        .table_name(table)
        .set_key(Some(key(definition_key(name))))
        .update_expression("SET #rescale = :rescale")
        .condition_expression(format!("#id = :id AND {} AND {}", epoch_is(&sub), at_is(&sub)))
        .expression_attribute_names("#epoch", EPOCH)
        .expression_attribute_names("#id", "id")
        .expression_attribute_names("#rescale", "rescale")
        .expression_attribute_names("#at", "at")
        .expression_attribute_values(":rescale", value)
        .expression_attribute_values(":id", s(&sub.id))
        .expression_attribute_values(":epoch", n(i64::from(sub.epoch)))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    match unless_condition_failed(result)? {
        Some(_) => Ok(()),
        None => {
            Err(Error::BadInput(format!("subscription {name} changed meanwhile (rescaled, or deleted): try again")))
        }
    }
}

/// The definition's epoch is `sub`'s (epoch 0: absent or 0), with `:epoch` bound.
fn epoch_is(sub: &Subscription) -> &'static str {
    match sub.epoch {
        0 => "(#epoch = :epoch OR attribute_not_exists(#epoch))",
        _ => "#epoch = :epoch",
    }
}

/// The rescale's `at` is as `sub` read it (none: none set), with `:at` bound when it is set.
fn at_is(sub: &Subscription) -> &'static str {
    match sub.stop_at() {
        Some(_) => "#rescale.#at = :at",
        None => "attribute_not_exists(#rescale.#at)",
    }
}

/// Where a rescale stands after a tick's step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RescaleStep {
    /// No rescale: run the partitions as usual.
    None,
    /// Partitions still run: start none.
    Stopping,
    /// The old partitions deliver up to this (ms): start those behind it (listed).
    Draining(i64, Vec<u32>),
    /// The new count is in place: run the partitions of the stored definition.
    Switched,
}

/// One step of `sub`'s rescale, if one is under way (see the module doc).
pub(crate) async fn rescale_step(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    sub: &Subscription,
    unit: u64,
    now: i64,
) -> Result<RescaleStep> {
    let Some(rescale) = &sub.rescale else { return Ok(RescaleStep::None) };
    let stored = partitions(dynamo, table, sub).await?;
    let stands = |partition: u32| {
        let item = stored.iter().find(|p| p.partition == partition);
        item.and_then(|p| p.checkpoint.clone()).unwrap_or_else(|| sub.start_checkpoint(unit))
    };
    // Before `at` is set every runner counts; after, only those of partitions behind it (a runner
    // of one at `at` saw it when it took its lease, and can deliver nothing more).
    let behind: Vec<u32> =
        (0..sub.partitions).filter(|p| rescale.at.is_none_or(|at| position_ms(&stands(*p)) < at)).collect();
    let running =
        stored.iter().any(|p| behind.contains(&p.partition) && p.lease.as_ref().is_some_and(|l| l.until > now));
    match rescale.at {
        _ if running => Ok(rescale.at.map_or(RescaleStep::Stopping, |at| RescaleStep::Draining(at, behind))),
        None => {
            let at = (0..sub.partitions).map(|p| clear_of(&stands(p), unit)).max().unwrap_or(0);
            let set = set_stop(dynamo, table, sub, at).await?;
            let behind: Vec<u32> = behind.into_iter().filter(|p| position_ms(&stands(*p)) < at).collect();
            Ok(if set { RescaleStep::Draining(at, behind) } else { RescaleStep::Stopping })
        }
        Some(at) if (0..sub.partitions).all(|p| position_ms(&stands(p)) >= at) => {
            // A runner may have delivered a batch past its last save (a lost save): skip its numbers too.
            let seq = (0..sub.partitions).map(|p| stands(p).seq).max().unwrap_or(0) + sub.batch_size as u64;
            switch(dynamo, table, sub, (rescale.to, EpochStart { at, seq }), &stored).await?;
            Ok(RescaleStep::Switched)
        }
        Some(at) => Ok(RescaleStep::Draining(at, behind)),
    }
}

/// The first slot start at or after which `checkpoint`'s partition has
/// delivered nothing: its slot's, when it stands at the slot's start; else the next slot's.
fn clear_of(checkpoint: &Checkpoint, unit: u64) -> i64 {
    match checkpoint.after.as_deref() {
        Some(after) if after > sort_key_floor(checkpoint.slot).as_str() => checkpoint.slot + unit as i64,
        _ => checkpoint.slot,
    }
}

/// Records where the old partitions stop, once (conditional on none being set).
async fn set_stop(dynamo: &aws_sdk_dynamodb::Client, table: &str, sub: &Subscription, at: i64) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(definition_key(&sub.name))))
        .update_expression("SET #rescale.#at = :at")
        .condition_expression("#id = :id AND attribute_exists(#rescale) AND attribute_not_exists(#rescale.#at)")
        .expression_attribute_names("#at", "at")
        .expression_attribute_names("#id", "id")
        .expression_attribute_names("#rescale", "rescale")
        .expression_attribute_values(":at", n(at))
        .expression_attribute_values(":id", s(&sub.id))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    Ok(unless_condition_failed(result)?.is_some())
}

/// The new count in place (one conditional write of the definition), then
/// the partition items past it deleted.
async fn switch(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    sub: &Subscription,
    (to, start): (u32, EpochStart),
    stored: &[Partition],
) -> Result<()> {
    let start_value = serde_dynamo::to_attribute_value(start).map_err(|e| Error::encode("epoch start", e))?;
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(definition_key(&sub.name))))
        .update_expression("SET #partitions = :to, #keying = :ranges, #epoch = :next, #start = :start REMOVE #rescale")
        .condition_expression(format!("#id = :id AND #rescale.#at = :at AND #rescale.#to = :to AND {}", epoch_is(sub)))
        .expression_attribute_names("#epoch", EPOCH)
        .expression_attribute_names("#at", "at")
        .expression_attribute_names("#to", "to")
        .expression_attribute_values(":epoch", n(i64::from(sub.epoch)))
        .expression_attribute_names("#id", "id")
        .expression_attribute_names("#rescale", "rescale")
        .expression_attribute_names("#partitions", "partitions")
        .expression_attribute_names("#keying", "keying")
        .expression_attribute_names("#start", "epoch_start")
        .expression_attribute_values(":to", n(i64::from(to)))
        .expression_attribute_values(":ranges", s("ranges"))
        .expression_attribute_values(":next", n(i64::from(sub.epoch) + 1))
        .expression_attribute_values(":start", start_value)
        .expression_attribute_values(":id", s(&sub.id))
        .expression_attribute_values(":at", n(start.at))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    if unless_condition_failed(result)?.is_none() {
        return Ok(()); // Switched by another tick, or deleted: nothing of this one's to do.
    }
    tracing::info!(subscription = %sub.name, from = sub.partitions, to, at = %crate::time::format_ms(start.at), "subscription rescaled");
    let past: Vec<u32> = stored.iter().map(|p| p.partition).filter(|p| *p >= to).collect();
    let requests = past
        .into_iter()
        .map(|partition| {
            let delete = DeleteRequest::builder().set_key(Some(partition_item_key(&sub.name, partition))).build()?;
            Ok(((), WriteRequest::builder().delete_request(delete).build()))
        })
        .collect::<Result<Vec<_>>>()?;
    let items = Table { name: table, key: &[HASH_KEY, RANGE_KEY] };
    let left = write_all(dynamo, items, requests, &Backoff::default(), None).await;
    if !left.is_empty() {
        // Harmless where they are (of the old epoch: replaced if the count grows again); said, not fatal.
        tracing::warn!(subscription = %sub.name, left = left.len(), "partition items past the new count not deleted");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::sort_key;

    #[test]
    fn the_common_position_is_past_everything_a_partition_delivered() {
        let slot = 1_795_000_000_000;
        let at_start = Checkpoint::starting_at(slot, 1000);
        assert_eq!(clear_of(&at_start, 1000), slot, "nothing of the slot delivered: its start");
        let inside = Checkpoint { after: Some(sort_key(slot + 5, "shardId-1:1")), ..Checkpoint::at_slot(slot) };
        assert_eq!(clear_of(&inside, 1000), slot + 1000, "an event of the slot delivered: the next slot");
        let checkpoint = Checkpoint { seq: 7, ..Checkpoint::starting_at(slot + 1000, 1000) };
        assert!(position_ms(&checkpoint) >= clear_of(&inside, 1000));
    }
}
