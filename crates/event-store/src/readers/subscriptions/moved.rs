//! A subscription's items moved from slot -2, where every family's items
//! were before each had a partition of its own ([`crate::bookkeeping::moving`]):
//! a whole subscription at a time, at its first use.

use super::{definition_key, parked_prefix, partition_key, LAST};
use crate::bookkeeping::{self, moving, query_in, Family};
use crate::error::Result;

/// Where a subscription deleted before it moved leaves word of it, so its
/// old items are never moved again.
pub(super) fn deleted_key(name: &str) -> String {
    format!("moved#{name}")
}

/// Moves subscription `name` from slot -2 (see [`moving`]) unless it moved
/// already or was deleted since: its partitions and parked events, then its
/// definition (so a move cut short is repeated whole). `Ok(Some(until))`
/// while a runner of the version before holds one of its partitions.
pub(super) async fn adopt(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str, now: i64) -> Result<Option<i64>> {
    let ours = |sort_key| bookkeeping::get_in(dynamo, table, Family::Subscriptions, sort_key);
    if ours(definition_key(name)).await?.is_some() || ours(deleted_key(name)).await?.is_some() {
        return Ok(None);
    }
    let Some(definition) = bookkeeping::get_in(dynamo, table, Family::legacy(), definition_key(name)).await? else {
        return Ok(None);
    };
    let old = |from, to| query_in(dynamo, table, Family::legacy(), (from, to));
    let (mut items, _) = old(partition_key(name, 0), partition_key(name, 9_999)).await?;
    if let Some(until) = items.iter().filter_map(|item| moving::held_until(item, now)).max() {
        return Ok(Some(until));
    }
    items.extend(old(parked_prefix(name), format!("{}{LAST}", parked_prefix(name))).await?.0);
    moving::copy(dynamo, table, Family::Subscriptions, items).await?;
    moving::copy(dynamo, table, Family::Subscriptions, vec![definition]).await?;
    Ok(None)
}
