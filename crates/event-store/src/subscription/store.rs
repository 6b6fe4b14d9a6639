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

use super::spec::{State, Subscription};
use crate::batch::Backoff;
use crate::bookkeeping::lease::{self, n, s, Lease, CHECKPOINT, LEASE_FREE};
use crate::bookkeeping::{key, query_range, sort_key_of, unless_condition_failed};
use crate::dynamo::{write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::{HASH_KEY, RANGE_KEY};
use crate::playback::Checkpoint;

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

/// After every character a name may hold: the end of a prefix's range.
const LAST: &str = "~";

fn decode<T: serde::de::DeserializeOwned>(item: &HashMap<String, AttributeValue>, what: &str) -> Result<T> {
    serde_dynamo::from_item(item.clone()).map_err(|e| Error::Malformed(format!("{what}: {e}")))
}

fn encode(value: &impl Serialize, what: &'static str) -> Result<HashMap<String, AttributeValue>> {
    serde_dynamo::to_item(value).map_err(|e| Error::encode(what, e))
}

/// Stores a new subscription; one of that name already: `BadInput`, nothing written.
pub async fn create(dynamo: &aws_sdk_dynamodb::Client, table: &str, sub: &Subscription) -> Result<()> {
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
            Err(Error::BadInput(format!("a subscription named {:?} exists already", sub.name)))
        }
        Err(e) => Err(Error::dynamo("PutItem", e)),
    }
}

pub async fn get(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Option<Subscription>> {
    let out = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key(definition_key(name))))
        .consistent_read(true)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    out.item().map(|item| decode(item, "subscription")).transpose()
}

/// The subscription, or `BadInput` naming it.
pub async fn existing(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Subscription> {
    get(dynamo, table, name).await?.ok_or_else(|| Error::BadInput(format!("no subscription named {name:?}")))
}

pub async fn list(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<Subscription>> {
    let (items, _) = query_range(dynamo, table, definition_key(""), definition_key(LAST)).await?;
    items.iter().map(|item| decode(item, "subscription")).collect()
}

/// Updates a stored subscription's fields (`SET` each); unknown: `BadInput`.
async fn update(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    name: &str,
    set: &[(&str, AttributeValue)],
) -> Result<()> {
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

pub async fn set_state(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str, state: State) -> Result<()> {
    let state = serde_json::to_value(state).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default();
    update(dynamo, table, name, &[("state", s(&state))]).await
}

/// A partition's stored state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partition {
    pub partition: u32,
    pub checkpoint: Option<Checkpoint>,
    pub lease: Option<Lease>,
    /// Why the partition stopped (a parked event, with `on_poison: stop`), until `resume`.
    pub stopped: Option<String>,
}

impl Partition {
    fn from_item(item: &HashMap<String, AttributeValue>) -> Result<Self> {
        let partition = sort_key_of(item)
            .and_then(|k| k.rsplit_once('#'))
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(|| Error::Malformed("subscription partition item without its number".into()))?;
        Ok(Self {
            partition,
            checkpoint: lease::checkpoint_of(item)?,
            lease: lease::lease_of(item),
            stopped: item.get("stopped").and_then(|v| v.as_s().ok()).cloned(),
        })
    }
}

/// The stored partitions of `name` (those never run have no item yet).
pub async fn partitions(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Vec<Partition>> {
    let (items, _) = query_range(dynamo, table, partition_key(name, 0), partition_key(name, 9_999)).await?;
    items.iter().map(Partition::from_item).collect()
}

/// What [`take`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The lease is ours; the checkpoint to go on from (none: the subscription's start).
    Held(Option<Checkpoint>),
    /// Another runner holds it until this time (ms).
    Busy(i64),
    /// The partition stopped on a parked event (the error); `resume` goes on.
    Stopped(String),
}

/// Takes partition `partition`'s lease for `owner` until `until`: when it is
/// free, expired before `now`, or handed on by `previous`; never while the
/// partition is stopped.
pub async fn take(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, partition): (&str, u32),
    (owner, previous): (&str, Option<&str>),
    until: i64,
    now: i64,
) -> Result<Taken> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(partition_key(name, partition))))
        .update_expression("SET lease_owner = :me, lease_until = :until")
        .condition_expression(format!("{LEASE_FREE} AND attribute_not_exists(stopped)"))
        .expression_attribute_values(":me", s(owner))
        .expression_attribute_values(":previous", s(previous.unwrap_or(owner)))
        .expression_attribute_values(":until", n(until))
        .expression_attribute_values(":now", n(now))
        .return_values(ReturnValue::AllNew)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    if let Some(out) = unless_condition_failed(result)? {
        return Ok(Taken::Held(out.attributes().map(lease::checkpoint_of).transpose()?.flatten()));
    }
    let stored = partitions(dynamo, table, name).await?.into_iter().find(|p| p.partition == partition);
    Ok(match stored {
        Some(Partition { stopped: Some(error), .. }) => Taken::Stopped(error),
        stored => Taken::Busy(stored.and_then(|p| p.lease).map_or(now, |lease| lease.until.max(now))),
    })
}

/// Saves the partition's checkpoint while `owner` holds the lease (see
/// [`lease::save`]); lost: [`Error::LeaseLost`], nothing written.
pub async fn save(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, partition): (&str, u32),
    owner: &str,
    checkpoint: &Checkpoint,
    until: Option<i64>,
) -> Result<()> {
    let key = key(partition_key(name, partition));
    if lease::save(dynamo, table, key, owner, checkpoint, until).await? {
        return Ok(());
    }
    Err(Error::LeaseLost(format!("subscription {name} partition {partition}: another runner holds it now")))
}

pub async fn release(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, partition): (&str, u32),
    owner: &str,
) -> Result<()> {
    lease::release(dynamo, table, key(partition_key(name, partition)), owner).await
}

/// Stops the partition (its lease holder found a poison event and the
/// subscription says stop), giving the lease up; `resume` clears it.
pub async fn stop(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, partition): (&str, u32),
    owner: &str,
    error: &str,
) -> Result<()> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(partition_key(name, partition))))
        .update_expression("SET stopped = :error, lease_until = :zero")
        .condition_expression("lease_owner = :me")
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

/// Sets every partition of `sub` to deliver from `to` (ms), takes each
/// partition's lease away from whoever holds it (their later writes fail),
/// and clears `stopped`. Also the subscription's `start_ms` becomes `to`.
pub async fn reset(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    sub: &Subscription,
    to: i64,
    unit: u64,
) -> Result<()> {
    let stored = partitions(dynamo, table, &sub.name).await?;
    let fence = format!("reset-{}", uuid::Uuid::new_v4().simple());
    for partition in 0..sub.partitions {
        let before = stored.iter().find(|p| p.partition == partition).and_then(|p| p.checkpoint.clone());
        // The count of delivered events goes on (checkpoints are compared by it).
        let (seq, events) = before.map_or((0, 0), |c| (c.seq, c.events));
        let checkpoint = Checkpoint { slot: crate::time::slot_of(to, unit), after: None, seq, events, done: false };
        dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(key(partition_key(&sub.name, partition))))
            .update_expression(
                "SET #checkpoint = :checkpoint, lease_owner = :fence, lease_until = :zero REMOVE stopped",
            )
            .expression_attribute_names("#checkpoint", CHECKPOINT)
            .expression_attribute_values(":checkpoint", lease::checkpoint_value(&checkpoint)?)
            .expression_attribute_values(":fence", s(&fence))
            .expression_attribute_values(":zero", n(0))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("UpdateItem", e))?;
    }
    update(dynamo, table, &sub.name, &[("start_ms", n(to))]).await
}

/// Clears `stopped` on every partition of `name`.
pub async fn unstop(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<()> {
    for partition in partitions(dynamo, table, name).await?.into_iter().filter(|p| p.stopped.is_some()) {
        dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(key(partition_key(name, partition.partition))))
            .update_expression("REMOVE stopped")
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("UpdateItem", e))?;
    }
    Ok(())
}

/// An event a subscription's target kept refusing: where it is in the event table, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Parked {
    pub partition: u32,
    /// Stored as `event_slot`: the item's own `slot` is the bookkeeping partition's.
    #[serde(rename = "event_slot")]
    pub slot: i64,
    pub event_sort_key: String,
    pub event_id: String,
    pub partition_key: String,
    /// The partition's delivery sequence number it had (a re-drive delivers it with the same).
    #[serde(default)]
    pub seq: u64,
    pub error: String,
    pub parked_at: String,
}

/// Parks an event (an idempotent put: parking it again overwrites).
pub async fn park(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str, parked: &Parked) -> Result<()> {
    let mut item = encode(parked, "parked event")?;
    item.extend(key(parked_key(name, parked.slot, &parked.event_sort_key)));
    dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("PutItem", e))?;
    Ok(())
}

/// The parked events of `name`, in log order.
pub async fn parked(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Vec<Parked>> {
    let prefix = parked_prefix(name);
    let (items, _) = query_range(dynamo, table, prefix.clone(), format!("{prefix}{LAST}")).await?;
    items.iter().map(|item| decode(item, "parked event")).collect()
}

pub async fn unpark(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str, parked: &Parked) -> Result<()> {
    dynamo
        .delete_item()
        .table_name(table)
        .set_key(Some(key(parked_key(name, parked.slot, &parked.event_sort_key))))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("DeleteItem", e))?;
    Ok(())
}

/// Deletes the subscription, its partitions and its parked events (runners
/// still going stop at their next look at the definition, or lose their lease).
pub async fn delete(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<()> {
    existing(dynamo, table, name).await?;
    let mut keys = vec![definition_key(name)];
    for (from, to) in [
        (partition_key(name, 0), partition_key(name, 9_999)),
        (parked_prefix(name), format!("{}{LAST}", parked_prefix(name))),
    ] {
        let (items, _) = query_range(dynamo, table, from, to).await?;
        keys.extend(items.iter().filter_map(|item| sort_key_of(item).map(str::to_owned)));
    }
    let requests = keys
        .into_iter()
        .map(|sort_key| {
            let delete = DeleteRequest::builder().set_key(Some(key(sort_key.clone()))).build().map_err(Error::from)?;
            Ok((sort_key, WriteRequest::builder().delete_request(delete).build()))
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
