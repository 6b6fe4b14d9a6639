//! Moving a family's items out of slot -2, where every family's items were
//! before each had a partition of its own ([`super::Family::legacy`]). Each
//! family's owner moves its items at first use: it copies them into its
//! own partition and from then on reads and writes only there. The old
//! items stay where they were, unread by the owner once moved (their role
//! may no longer write there, so it could not delete them).
//!
//! Only a runner of the version before could still use an old item, and
//! only under its lease: the template takes its write to slot -2 away in
//! the same deploy, and a leased item is moved only once its lease has
//! lapsed, so that runner's last write is in what is copied.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, ReturnConsumedCapacity, WriteRequest};

use super::lease::lease_of;
use super::{get_at, get_in, sort_key_of, Family};
use crate::batch::Backoff;
use crate::dynamo::{write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::{HASH_KEY, RANGE_KEY};

/// `item` under partition key `slot` (a family's, or one of its own keys).
pub(crate) fn into_slot(slot: i64, mut item: HashMap<String, AttributeValue>) -> HashMap<String, AttributeValue> {
    item.insert(HASH_KEY.to_owned(), AttributeValue::N(slot.to_string()));
    item
}

/// When a runner of the version before still holds the old item's lease
/// at `now`: until when (ms).
pub(crate) fn held_until(item: &HashMap<String, AttributeValue>, now: i64) -> Option<i64> {
    lease_of(item).map(|lease| lease.until).filter(|until| *until >= now)
}

/// Copies `items` (old ones) into `family`'s partition, replacing what is
/// there under their keys (a copy cut short is repeated whole).
pub(crate) async fn copy(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    family: Family,
    items: Vec<HashMap<String, AttributeValue>>,
) -> Result<()> {
    let requests = items
        .into_iter()
        .map(|item| {
            let sort_key = sort_key_of(&item).unwrap_or_default().to_owned();
            let put =
                PutRequest::builder().set_item(Some(into_slot(family.slot(), item))).build().map_err(Error::from)?;
            Ok((sort_key, WriteRequest::builder().put_request(put).build()))
        })
        .collect::<Result<Vec<_>>>()?;
    let bookkeeping = Table { name: table, key: &[HASH_KEY, RANGE_KEY] };
    let left = write_all(dynamo, bookkeeping, requests, &Backoff::default(), None).await;
    if !left.is_empty() {
        let message =
            format!("{} bookkeeping items not moved to slot {} (moved again next time)", left.len(), family.slot());
        return Err(Error::Dynamo { operation: "BatchWriteItem", source: message.into() });
    }
    Ok(())
}

/// Moves one leased item (a playback's, a subscription partition's) to
/// `family` at its first use there: `Ok(None)` when `family` has it now (or
/// there was none to move), `Ok(Some(until))` while a runner of the version
/// before holds the old one (the caller is busy until then), unless that
/// runner handed it to the caller (`handed`: a continuation it started).
pub(crate) async fn adopt(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (slot, sort_key): (i64, &str),
    now: i64,
    handed: Option<&str>,
) -> Result<Option<i64>> {
    if get_at(dynamo, table, slot, sort_key.to_owned()).await?.is_some() {
        return Ok(None);
    }
    let Some(old) = get_in(dynamo, table, Family::legacy(), sort_key.to_owned()).await? else { return Ok(None) };
    let handed_to_caller = handed.is_some() && lease_of(&old).map(|lease| lease.owner).as_deref() == handed;
    if let Some(until) = held_until(&old, now).filter(|_| !handed_to_caller) {
        return Ok(Some(until));
    }
    put_absent(dynamo, table, slot, old).await?;
    Ok(None)
}

/// Puts the old `item` under partition key `slot` unless an item is there
/// under its key already (one written since is newer than the old one).
pub(crate) async fn put_absent(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    slot: i64,
    old: HashMap<String, AttributeValue>,
) -> Result<()> {
    let put = dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(into_slot(slot, old)))
        .condition_expression("attribute_not_exists(#sk)")
        .expression_attribute_names("#sk", RANGE_KEY)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    match put {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.as_service_error(), Some(PutItemError::ConditionalCheckFailedException(_))) => Ok(()),
        Err(e) => Err(Error::dynamo("PutItem", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_item_keeps_everything_but_its_partition() {
        let item = HashMap::from([
            (HASH_KEY.to_owned(), AttributeValue::N("-2".into())),
            (RANGE_KEY.to_owned(), AttributeValue::S("playback#p".into())),
            ("lease_owner".to_owned(), AttributeValue::S("a".into())),
        ]);
        let moved = into_slot(Family::Playbacks.slot(), item.clone());
        assert_eq!(moved[HASH_KEY], AttributeValue::N("-5".into()));
        assert_eq!((&moved[RANGE_KEY], &moved["lease_owner"]), (&item[RANGE_KEY], &item["lease_owner"]));
    }

    #[test]
    fn an_old_lease_holds_a_move_until_it_lapses() {
        let with_lease = |until: i64| {
            HashMap::from([
                ("lease_owner".to_owned(), AttributeValue::S("old".into())),
                ("lease_until".to_owned(), AttributeValue::N(until.to_string())),
            ])
        };
        assert_eq!(held_until(&with_lease(2_000), 1_000), Some(2_000));
        assert_eq!(held_until(&with_lease(1_000), 1_000), Some(1_000));
        assert_eq!(held_until(&with_lease(999), 1_000), None, "lapsed");
        assert_eq!(held_until(&with_lease(0), 1_000), None, "given up");
        assert_eq!(held_until(&HashMap::new(), 1_000), None, "never taken");
    }
}
