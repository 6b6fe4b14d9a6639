//! A subscription's items in the event table's bookkeeping partition:
//!
//! | sort key | holds |
//! |---|---|
//! | `sub#<name>` | the definition ([`Subscription`]) |
//! | `subpart#<name>#<partition, 4 digits>` | the partition's checkpoint, lease, and `stopped` (why it stopped) |
//! | `parked#<name>#<slot, 13 digits>#<sort key>` | an event its target kept refusing: where it is, the error |
//!
//! Partition items are written only by the lease holder (fenced, forward
//! only), or by `reset`, which takes the lease away from whoever holds it.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, ReturnConsumedCapacity, ReturnValue, WriteRequest};
use serde::Serialize;

use crate::batch::Backoff;
use crate::bookkeeping::lease::{self, n, s, Lease, Taken, LEASE_FREE};
use crate::bookkeeping::{self, moving, query_in, sort_key_of, unless_condition_failed, Family};
use crate::dynamo::{write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::{HASH_KEY, RANGE_KEY};
use crate::position::Checkpoint;
use crate::position::{checkpoint_of, checkpoint_value, CHECKPOINT};

mod moved;
mod parked;
mod partitions;
mod positions;
pub mod spec;
pub mod status;

use moved::{adopt, deleted_key, move_partition, unmoved};
pub(crate) use parked::parked;
pub use parked::{park, unpark, Parked};
use partitions::partition_items;
pub use partitions::{partition_item_key, partition_slot};
pub(crate) use positions::{rescale, rescale_step, reset, RescaleStep};

pub use spec::{NewSubscription, OnPoison, State, Subscription, Target};
pub(crate) use status::position_ms;
pub use status::{status, statuses, PartitionStatus, SubscriptionStatus};

/// The key of the subscriptions' item with sort key `sort_key` (their own
/// partition, slot -6; moved from slot -2 by [`adopt`]).
fn key(sort_key: String) -> HashMap<String, AttributeValue> {
    bookkeeping::key_in(Family::Subscriptions, sort_key)
}

async fn query_range(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: String,
    to: String,
) -> Result<(Vec<HashMap<String, AttributeValue>>, usize)> {
    query_in(dynamo, table, Family::Subscriptions, (from, to)).await
}

fn definition_key(name: &str) -> String {
    format!("sub#{name}")
}

fn partition_key(name: &str, partition: u32) -> String {
    format!("subpart#{name}#{partition:04}")
}

fn parked_prefix(name: &str) -> String {
    format!("parked#{name}#")
}

fn parked_key(name: &str, slot: i64, sort_key: &str) -> String {
    format!("{}{slot:013}#{sort_key}", parked_prefix(name))
}

/// A partition item's epoch (absent: 0).
const EPOCH: &str = "epoch";

/// After every character a name may hold: the end of a prefix's range.
const LAST: &str = "~";

fn decode<T: serde::de::DeserializeOwned>(item: &HashMap<String, AttributeValue>, what: &str) -> Result<T> {
    serde_dynamo::from_item(item.clone()).map_err(|e| Error::Malformed(format!("{what}: {e}")))
}

fn encode(value: &impl Serialize, what: &'static str) -> Result<HashMap<String, AttributeValue>> {
    serde_dynamo::to_item(value).map_err(|e| Error::encode(what, e))
}

/// Stores a new subscription; one of that name already: `BadInput`, nothing
/// written, unless it is this very one (the SDK's retry of a put that was
/// applied and then answered with an error: the same create's random id).
pub async fn create(dynamo: &aws_sdk_dynamodb::Client, table: &str, sub: &Subscription) -> Result<()> {
    // One of that name still in slot -2 is one of that name already.
    Box::pin(adopt(dynamo, table, &sub.name)).await?;
    let mut item = encode(sub, "subscription")?;
    item.extend(key(definition_key(&sub.name)));
    let result = dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(#sk)")
        .expression_attribute_names("#sk", RANGE_KEY)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    match result {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.as_service_error(), Some(PutItemError::ConditionalCheckFailedException(_))) => {
            match get(dynamo, table, &sub.name).await? {
                Some(stored) if stored.id == sub.id && !sub.id.is_empty() => Ok(()),
                _ => Err(Error::BadInput(format!("a subscription named {:?} exists already", sub.name))),
            }
        }
        Err(e) => Err(Error::dynamo("PutItem", e)),
    }
}

pub async fn get(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Option<Subscription>> {
    if let Some(item) = bookkeeping::get_in(dynamo, table, Family::Subscriptions, definition_key(name)).await? {
        return decode(&item, "subscription").map(Some);
    }
    Box::pin(adopt(dynamo, table, name)).await?;
    let item = bookkeeping::get_in(dynamo, table, Family::Subscriptions, definition_key(name)).await?;
    item.map(|item| decode(&item, "subscription")).transpose()
}

/// The subscription, or `BadInput` naming it.
pub(crate) async fn existing(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Subscription> {
    get(dynamo, table, name).await?.ok_or_else(|| Error::BadInput(format!("no subscription named {name:?}")))
}

/// Every subscription, with those an upgraded stack still has only in
/// slot -2 (read there, not moved: see [`move_all`]).
pub(crate) async fn list(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<Subscription>> {
    let (items, _) = query_range(dynamo, table, definition_key(""), definition_key(LAST)).await?;
    let mut subs: Vec<Subscription> = items.iter().map(|item| decode(item, "subscription")).collect::<Result<_>>()?;
    for name in unmoved(dynamo, table).await? {
        if let Some(item) = bookkeeping::get_in(dynamo, table, Family::legacy(), definition_key(&name)).await? {
            subs.push(decode(&item, "subscription")?);
        }
    }
    Ok(subs)
}

/// Moves every subscription an upgraded stack still has only in slot -2
/// (definitions and parked events; partitions move at their runners' takes).
pub(crate) async fn move_all(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<()> {
    for name in unmoved(dynamo, table).await? {
        Box::pin(adopt(dynamo, table, &name)).await?;
    }
    Ok(())
}

/// Updates a stored subscription's fields (`SET` each); unknown: `BadInput`.
async fn update(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    name: &str,
    set: &[(&str, AttributeValue)],
) -> Result<()> {
    Box::pin(adopt(dynamo, table, name)).await?;
    let mut request = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(definition_key(name))))
        .condition_expression("attribute_exists(#sk)")
        .expression_attribute_names("#sk", RANGE_KEY)
        .return_consumed_capacity(ReturnConsumedCapacity::Total);
    let mut parts = Vec::new();
    for (i, (field, value)) in set.iter().enumerate() {
        parts.push(format!("#f{i} = :v{i}"));
        request = request
            .expression_attribute_names(format!("#f{i}"), *field)
            .expression_attribute_values(format!(":v{i}"), value.clone());
    }
    let request = request.update_expression(format!("SET {}", parts.join(", ")));
    match unless_condition_failed(request.send().await)? {
        Some(_) => Ok(()),
        None => Err(Error::BadInput(format!("no subscription named {name:?}"))),
    }
}

pub(crate) async fn set_state(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str, state: State) -> Result<()> {
    let state = serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    update(dynamo, table, name, &[("state", s(&state))]).await
}

/// A partition's stored state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partition {
    pub partition: u32,
    /// The subscription's `id` the item belongs to (another: left by an earlier subscription of the name).
    pub sub_id: Option<String>,
    /// The subscription's epoch the item belongs to (another: the partitions before a rescale).
    pub epoch: u32,
    pub checkpoint: Option<Checkpoint>,
    pub lease: Option<Lease>,
    /// Why the partition stopped (a parked event, with `on_poison: stop`), until `resume`.
    pub stopped: Option<String>,
    /// Why its last run could not go on (an item of a newer version at its checkpoint), until it does.
    pub waiting: Option<String>,
}

impl Partition {
    fn from_item(item: &HashMap<String, AttributeValue>) -> Result<Self> {
        let partition = sort_key_of(item)
            .and_then(|k| k.rsplit_once('#'))
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(|| Error::Malformed("subscription partition item without its number".into()))?;
        Ok(Self {
            partition,
            sub_id: item.get("sub_id").and_then(|v| v.as_s().ok()).cloned(),
            epoch: item.get(EPOCH).and_then(|v| v.as_n().ok()).and_then(|v| v.parse().ok()).unwrap_or(0),
            checkpoint: checkpoint_of(item)?,
            lease: lease::lease_of(item),
            stopped: item.get("stopped").and_then(|v| v.as_s().ok()).cloned(),
            waiting: item.get("waiting").and_then(|v| v.as_s().ok()).cloned(),
        })
    }
}

/// The stored partitions of `sub` (not those an earlier subscription of its name left).
pub(crate) async fn partitions(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    sub: &Subscription,
) -> Result<Vec<Partition>> {
    let mut stored = partition_items(dynamo, table, &sub.name, sub.partitions).await?;
    stored.retain(|p| p.sub_id.as_deref() == Some(sub.id.as_str()) && p.epoch == sub.epoch);
    Ok(stored)
}

/// What [`take`] found: the lease (taken, with the checkpoint to go on from,
/// none meaning the subscription's start; or busy), or a partition not to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    Lease(Taken),
    /// The partition stopped on a parked event (the error); `resume` goes on.
    Stopped(String),
    /// The subscription was deleted (or deleted and created again) since the caller read it.
    Gone,
}

/// Takes partition `partition`'s lease for `owner` until `until`: when it is
/// free, expired before `now`, or handed on by `previous`; never while the
/// partition is stopped. The item is `sub`'s own (`sub_id`) and of its
/// epoch; one an earlier subscription of the name left behind, or the
/// partitions' before a rescale, is replaced by a fresh one.
pub async fn take(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (sub, partition): (&Subscription, u32),
    (owner, previous): (&str, Option<&str>),
    until: i64,
    now: i64,
) -> Result<Take> {
    let moved = (partition_slot(partition), partition_key(&sub.name, partition));
    if let Some(until) = moving::adopt(dynamo, table, (moved.0, &moved.1), now, previous).await? {
        return Ok(Take::Lease(Taken::Busy(until)));
    }
    let item_key = partition_item_key(&sub.name, partition);
    // Epoch 0 is never written (items of before rescales have none); another epoch's item is not taken.
    let (set_epoch, of_epoch) = match sub.epoch {
        0 => ("", format!("attribute_not_exists({EPOCH})")),
        _ => (", #epoch = :epoch", "(#epoch = :epoch OR attribute_not_exists(#sk))".to_owned()),
    };
    let mut request = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(item_key.clone()))
        .update_expression(format!("SET lease_owner = :me, lease_until = :until, sub_id = :sub{set_epoch}"))
        .condition_expression(format!(
            "{LEASE_FREE} AND attribute_not_exists(stopped) AND (attribute_not_exists(sub_id) OR sub_id = :sub) AND {of_epoch}"
        ))
        .expression_attribute_values(":me", s(owner))
        .expression_attribute_values(":previous", s(previous.unwrap_or(owner)))
        .expression_attribute_values(":until", n(until))
        .expression_attribute_values(":now", n(now))
        .expression_attribute_values(":sub", s(&sub.id));
    if sub.epoch > 0 {
        request = request
            .expression_attribute_names("#epoch", EPOCH)
            .expression_attribute_names("#sk", RANGE_KEY)
            .expression_attribute_values(":epoch", n(i64::from(sub.epoch)));
    }
    let result =
        request.return_values(ReturnValue::AllNew).return_consumed_capacity(ReturnConsumedCapacity::Total).send().await;
    if let Some(out) = unless_condition_failed(result)? {
        return Ok(Take::Lease(Taken::Held(out.attributes().map(checkpoint_of).transpose()?.flatten())));
    }
    let stored = partition_items(dynamo, table, &sub.name, sub.partitions).await?;
    let stored = stored.into_iter().find(|p| p.partition == partition);
    let left = match &stored {
        // Left by an earlier subscription of this name, or this runner is the stale one.
        Some(Partition { sub_id: Some(other), .. }) if *other != sub.id => {
            ("sub_id = :other".to_owned(), vec![(":other", s(other))])
        }
        // The partition's item of before a rescale (or this runner read the subscription before it).
        Some(Partition { epoch, .. }) if *epoch != sub.epoch => match epoch {
            0 => (format!("sub_id = :sub AND attribute_not_exists({EPOCH})"), vec![(":sub", s(&sub.id))]),
            _ => (
                format!("sub_id = :sub AND {EPOCH} = :old"),
                vec![(":sub", s(&sub.id)), (":old", n(i64::from(*epoch)))],
            ),
        },
        Some(Partition { stopped: Some(error), .. }) => return Ok(Take::Stopped(error.clone())),
        stored => {
            let until = stored.as_ref().and_then(|p| p.lease.as_ref()).map_or(now, |lease| lease.until.max(now));
            return Ok(Take::Lease(Taken::Busy(until)));
        }
    };
    if get(dynamo, table, &sub.name).await?.is_none_or(|current| current.id != sub.id || current.epoch != sub.epoch) {
        return Ok(Take::Gone);
    }
    let mut fresh = item_key;
    fresh.insert("sub_id".into(), s(&sub.id));
    fresh.insert("lease_owner".into(), s(owner));
    fresh.insert("lease_until".into(), n(until));
    if sub.epoch > 0 {
        fresh.insert(EPOCH.into(), n(i64::from(sub.epoch)));
    }
    let (condition, values) = left;
    let mut replace = dynamo.put_item().table_name(table).set_item(Some(fresh)).condition_expression(condition);
    for (name, value) in values {
        replace = replace.expression_attribute_values(name, value);
    }
    match replace.return_consumed_capacity(ReturnConsumedCapacity::Total).send().await {
        Ok(_) => Ok(Take::Lease(Taken::Held(None))),
        Err(e) if matches!(e.as_service_error(), Some(PutItemError::ConditionalCheckFailedException(_))) => {
            Ok(Take::Lease(Taken::Busy(now)))
        }
        Err(e) => Err(Error::dynamo("PutItem", e)),
    }
}

/// Saves the partition's checkpoint while `owner` holds the lease (see
/// [`lease::save`]); lost: [`Error::LeaseLost`], nothing written.
pub(crate) async fn save(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, partition): (&str, u32),
    owner: &str,
    checkpoint: &Checkpoint,
    until: Option<i64>,
) -> Result<()> {
    let key = partition_item_key(name, partition);
    if lease::save(dynamo, table, key, owner, checkpoint, until).await? {
        return Ok(());
    }
    Err(Error::LeaseLost(format!("subscription {name} partition {partition}: another runner holds it now")))
}

/// Gives the partition's lease up, with `why` it could not go on, if that is worth showing (`status`).
pub(crate) async fn release(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, partition): (&str, u32),
    owner: &str,
    why: Option<&str>,
) -> Result<()> {
    lease::release_waiting(dynamo, table, partition_item_key(name, partition), owner, why).await
}

/// Saves `checkpoint` (just past a parked event) and stops the partition in
/// the same write (its lease holder parked an event and the subscription
/// says stop), giving the lease up; `resume` clears it.
pub(crate) async fn stop(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, partition): (&str, u32),
    owner: &str,
    checkpoint: &Checkpoint,
    error: &str,
) -> Result<()> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(partition_item_key(name, partition)))
        .update_expression("SET #checkpoint = :checkpoint, stopped = :error, lease_until = :zero")
        .condition_expression("lease_owner = :me AND (attribute_not_exists(#checkpoint) OR #checkpoint.#seq <= :seq)")
        .expression_attribute_names("#checkpoint", CHECKPOINT)
        .expression_attribute_names("#seq", "seq")
        .expression_attribute_values(":checkpoint", checkpoint_value(checkpoint)?)
        .expression_attribute_values(":seq", n(checkpoint.seq as i64))
        .expression_attribute_values(":error", s(error))
        .expression_attribute_values(":zero", n(0))
        .expression_attribute_values(":me", s(owner))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    match unless_condition_failed(result)? {
        Some(_) => Ok(()),
        None => {
            Err(Error::LeaseLost(format!("subscription {name} partition {partition}: another runner holds it now")))
        }
    }
}

/// Clears `stopped` on every partition of `sub`.
pub(crate) async fn unstop(dynamo: &aws_sdk_dynamodb::Client, table: &str, sub: &Subscription) -> Result<()> {
    for partition in partitions(dynamo, table, sub).await?.into_iter().filter(|p| p.stopped.is_some()) {
        move_partition(dynamo, table, &sub.name, partition.partition).await?;
        let result = dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(partition_item_key(&sub.name, partition.partition)))
            .update_expression("REMOVE stopped")
            .condition_expression("attribute_exists(#sk)")
            .expression_attribute_names("#sk", RANGE_KEY)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await;
        unless_condition_failed(result)?;
    }
    Ok(())
}

/// Deletes the subscription, its partitions and its parked events (runners
/// still going stop at their next look at the definition, or lose their lease).
pub(crate) async fn delete(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<()> {
    let sub = existing(dynamo, table, name).await?;
    if bookkeeping::get_in(dynamo, table, Family::legacy(), definition_key(name)).await?.is_some() {
        // Its old items stay in slot -2 (not this role's to delete): never move them again.
        let mut word = key(deleted_key(name));
        word.insert("deleted_at".into(), n(crate::time::now_ms()));
        moving::copy(dynamo, table, Family::Subscriptions, vec![word]).await?;
    }
    let mut keys = vec![key(definition_key(name))];
    let (parked, _) = query_range(dynamo, table, parked_prefix(name), format!("{}{LAST}", parked_prefix(name))).await?;
    keys.extend(parked.iter().filter_map(|item| sort_key_of(item).map(|k| key(k.to_owned()))));
    // Its partitions, and every number an earlier version allowed (an earlier subscription of the
    // name may have had more; a rescale down deletes the partitions it leaves).
    let numbers = sub.partitions.max(spec::MAX_PARTITIONS_BEFORE_SLICES);
    keys.extend((0..numbers).map(|partition| partition_item_key(name, partition)));
    let requests = keys
        .into_iter()
        .map(|key| {
            let delete = DeleteRequest::builder().set_key(Some(key)).build().map_err(Error::from)?;
            Ok(((), WriteRequest::builder().delete_request(delete).build()))
        })
        .collect::<Result<Vec<_>>>()?;
    let bookkeeping = Table { name: table, key: &[HASH_KEY, RANGE_KEY] };
    let left = write_all(dynamo, bookkeeping, requests, &Backoff::default(), None).await;
    if !left.is_empty() {
        let message = format!("subscription {name}: {} items not deleted (send delete again)", left.len());
        return Err(Error::Dynamo { operation: "BatchWriteItem", source: message.into() });
    }
    Ok(())
}
