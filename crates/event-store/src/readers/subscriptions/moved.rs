//! A subscription an upgraded stack still has in slot -2, where every
//! family's items were before each had a partition of its own
//! ([`crate::bookkeeping::moving`]): its definition and parked events move at
//! its first use by name (and at every tick), each partition at its
//! runner's first take, once a lease a runner of the version before held
//! there has lapsed.

use std::collections::HashSet;

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{ConditionCheck, Put, TransactWriteItem};

use super::{definition_key, key, parked_prefix, partition_key, LAST};
use crate::bookkeeping::{self, moving, query_in, sort_key_of, Family};
use crate::error::{Error, Result};
use crate::event_item::RANGE_KEY;

/// Where a subscription deleted before it moved leaves word of it, so its
/// old items are never moved again.
pub(super) fn deleted_key(name: &str) -> String {
    format!("moved#{name}")
}

/// The names of the subscriptions still only in slot -2 (not moved, not deleted since).
pub(super) async fn unmoved(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<String>> {
    let names = |family, prefix: String| async move {
        let (items, _) = query_in(dynamo, table, family, (prefix.clone(), format!("{prefix}{LAST}"))).await?;
        let names: Vec<String> =
            items.iter().filter_map(|item| Some(sort_key_of(item)?.strip_prefix(&prefix)?.to_owned())).collect();
        Ok::<_, Error>(names)
    };
    let old = names(Family::legacy(), definition_key("")).await?;
    if old.is_empty() {
        return Ok(old);
    }
    let ours: HashSet<String> = names(Family::Subscriptions, definition_key("")).await?.into_iter().collect();
    let deleted: HashSet<String> = names(Family::Subscriptions, deleted_key("")).await?.into_iter().collect();
    Ok(old.into_iter().filter(|name| !ours.contains(name) && !deleted.contains(name)).collect())
}

/// Moves subscription `name`'s definition and parked events from slot -2,
/// unless it moved already or was deleted since: its parked events first
/// (each only where none is: never over one handled since), then its
/// definition, in one transaction with the check that no `delete` left word
/// since (so a slow move cannot bring a deleted subscription back).
pub(super) async fn adopt(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<()> {
    let ours = |sort_key| bookkeeping::get_in(dynamo, table, Family::Subscriptions, sort_key);
    if ours(definition_key(name)).await?.is_some() || ours(deleted_key(name)).await?.is_some() {
        return Ok(());
    }
    let Some(definition) = bookkeeping::get_in(dynamo, table, Family::legacy(), definition_key(name)).await? else {
        return Ok(());
    };
    let range = (parked_prefix(name), format!("{}{LAST}", parked_prefix(name)));
    for parked in query_in(dynamo, table, Family::legacy(), range).await?.0 {
        moving::put_absent(dynamo, table, Family::Subscriptions.slot(), parked).await?;
    }
    let not_deleted = ConditionCheck::builder()
        .table_name(table)
        .set_key(Some(key(deleted_key(name))))
        .condition_expression("attribute_not_exists(#sk)")
        .expression_attribute_names("#sk", RANGE_KEY)
        .build()?;
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(moving::into_slot(Family::Subscriptions.slot(), definition)))
        .condition_expression("attribute_not_exists(#sk)")
        .expression_attribute_names("#sk", RANGE_KEY)
        .build()?;
    let moved = dynamo
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().condition_check(not_deleted).build())
        .transact_items(TransactWriteItem::builder().put(put).build())
        .send()
        .await;
    match moved {
        Ok(_) => Ok(()),
        // Deleted, or moved by another, meanwhile.
        Err(e) if matches!(e.as_service_error(), Some(TransactWriteItemsError::TransactionCanceledException(_))) => {
            Ok(())
        }
        Err(e) => Err(Error::dynamo("TransactWriteItems", e)),
    }
}

/// Moves partition `partition` of `name` from slot -2 unless it moved
/// already, whatever its lease: for the management writes that take no
/// lease (`reset` takes it away from any runner; `resume` clears `stopped`,
/// which only a partition without a runner has), so they never write an
/// item of their own in its place (which would read as a fresh partition).
pub(super) async fn move_partition(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    name: &str,
    partition: u32,
) -> Result<()> {
    let (slot, sort_key) = (super::partition_slot(partition), partition_key(name, partition));
    if bookkeeping::get_at(dynamo, table, slot, sort_key.clone()).await?.is_some() {
        return Ok(());
    }
    if let Some(old) = bookkeeping::get_in(dynamo, table, Family::legacy(), sort_key).await? {
        moving::put_absent(dynamo, table, slot, old).await?;
    }
    Ok(())
}
