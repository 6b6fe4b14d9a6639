//! Events a subscription's target kept refusing, parked in the
//! subscriptions' partition (`parked#<name>#<slot>#<sort key>`) until
//! `redrive` or `unpark`.

use aws_sdk_dynamodb::types::ReturnConsumedCapacity;
use serde::Serialize;

use super::{decode, encode, key, parked_key, parked_prefix, query_range, Subscription, LAST};
use crate::error::{Error, Result};

/// An event a subscription's target kept refusing: where it is in the event table, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Parked {
    /// The subscription's `id` (see [`Subscription::id`]).
    #[serde(default)]
    pub sub_id: String,
    pub partition: u32,
    /// Stored as `event_slot`: the item's own `slot` is the bookkeeping partition's.
    #[serde(rename = "event_slot")]
    pub slot: i64,
    pub event_sort_key: String,
    pub event_id: String,
    pub partition_key: String,
    /// The partition's delivery sequence number it had (a re-delivery delivers it with the same).
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

/// The parked events of `sub`, in log order.
pub(crate) async fn parked(dynamo: &aws_sdk_dynamodb::Client, table: &str, sub: &Subscription) -> Result<Vec<Parked>> {
    let prefix = parked_prefix(&sub.name);
    let (items, _) = query_range(dynamo, table, prefix.clone(), format!("{prefix}{LAST}")).await?;
    let all: Vec<Parked> = items.iter().map(|item| decode(item, "parked event")).collect::<Result<_>>()?;
    Ok(all.into_iter().filter(|p| p.sub_id == sub.id).collect())
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
