//! The slot index: one item per non-empty slot, put by the scan in the same
//! `BatchWriteItem` stream as the slot's events. Readers find slots only
//! through it, so an empty slot costs no query and a slot's events leave the
//! buffer only once its index entry is written (`docs/design.md#2-delete-after-durable-copy`).
//!
//! A slot spread over K sub-keys (`SLOT_SUBKEYS`) has the entry
//! `index#<slot>#<K>`; a slot of one (and every slot written before sub-keys)
//! has `index#<slot>`. A slot written under several K (the setting changed)
//! has several entries, and readers query the most sub-keys any names
//! (a chunk's sub-key is a hash modulo K, below the largest K).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{key, query_range, sort_key_of};
use crate::error::Result;

const PREFIX: &str = "index#";

/// A non-empty slot, and the sub-keys its chunks are stored under (`slot + 0..subkeys`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlotRef {
    pub slot: i64,
    pub subkeys: u32,
}

impl SlotRef {
    /// A slot stored under its own key only.
    pub(crate) fn single(slot: i64) -> Self {
        Self { slot, subkeys: 1 }
    }
}

/// The index entry's sort key for a slot: 13 digits, so text order is time order.
pub(crate) fn index_key(slot: i64) -> String {
    format!("{PREFIX}{slot:013}")
}

/// The index entry's sort key for a slot stored under `subkeys` sub-keys.
pub(crate) fn index_key_with(slot: i64, subkeys: u32) -> String {
    match subkeys {
        0 | 1 => index_key(slot),
        k => format!("{PREFIX}{slot:013}#{k}"),
    }
}

/// The slot an index entry's sort key names.
#[cfg(test)]
pub(crate) fn slot_of_index_key(key: &str) -> Option<i64> {
    parse_index_key(key).map(|s| s.slot)
}

/// The slot and sub-keys an index entry's sort key names.
pub(crate) fn parse_index_key(key: &str) -> Option<SlotRef> {
    let rest = key.strip_prefix(PREFIX)?;
    let (slot, subkeys) = match rest.split_once('#') {
        Some((slot, k)) => (slot, k.parse().ok()?),
        None => (rest, 1),
    };
    Some(SlotRef { slot: slot.parse().ok()?, subkeys })
}

/// The index entry saying `slot` has events, stored under `subkeys` sub-keys (put with them, by the scan).
pub fn index_item(slot: i64, subkeys: u32) -> HashMap<String, AttributeValue> {
    key(index_key_with(slot, subkeys))
}

/// The non-empty slots in `[from, to)`, in order, from the index, each with
/// the most sub-keys its entries name. Returns them with the number of
/// `Query` requests it took.
pub async fn read_index(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: i64,
    to: i64,
) -> Result<(Vec<SlotRef>, usize)> {
    if to <= from {
        return Ok((Vec::new(), 0));
    }
    // `index#<last slot>~` is past every entry of the last slot, with or without sub-keys.
    let upper = format!("{}~", index_key(to - 1));
    let (items, queries) = query_range(dynamo, table, index_key(from.max(0)), upper).await?;
    let mut slots: Vec<SlotRef> = Vec::new();
    for entry in items.iter().filter_map(|item| sort_key_of(item).and_then(parse_index_key)) {
        match slots.last_mut() {
            Some(last) if last.slot == entry.slot => last.subkeys = last.subkeys.max(entry.subkeys),
            _ => slots.push(entry),
        }
    }
    Ok((slots, queries))
}

/// The first non-empty slot in `[from, to)`, with one `Query` of one item.
pub(crate) async fn first_slot(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: i64,
    to: i64,
) -> Result<Option<SlotRef>> {
    if to <= from {
        return Ok(None);
    }
    let out = dynamo
        .query()
        .table_name(table)
        .consistent_read(true)
        .key_condition_expression("#slot = :bookkeeping AND #sk BETWEEN :from AND :to")
        .expression_attribute_names("#slot", crate::event_item::HASH_KEY)
        .expression_attribute_names("#sk", crate::event_item::RANGE_KEY)
        .expression_attribute_values(":bookkeeping", AttributeValue::N(super::BOOKKEEPING_SLOT.to_string()))
        .expression_attribute_values(":from", AttributeValue::S(index_key(from.max(0))))
        .expression_attribute_values(":to", AttributeValue::S(format!("{}~", index_key(to - 1))))
        .limit(1)
        .send()
        .await
        .map_err(|e| crate::error::Error::dynamo("Query", e))?;
    Ok(out.items().first().and_then(sort_key_of).and_then(parse_index_key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::RANGE_KEY;

    #[test]
    fn index_keys_sort_in_time_order_and_name_their_slot() {
        let t = 1_795_240_740_000;
        assert!(index_key(999) < index_key(t) && index_key(t) < index_key(t + 1000));
        assert_eq!(slot_of_index_key(&index_key(t)), Some(t));
        assert_eq!(slot_of_index_key("watermark#0001"), None);
        assert_eq!(index_item(t, 1)[RANGE_KEY], AttributeValue::S(index_key(t)));
        assert_eq!(index_item(t, 8)[RANGE_KEY], AttributeValue::S(format!("index#{t:013}#8")));
        assert_eq!(parse_index_key(&index_key_with(t, 8)), Some(SlotRef { slot: t, subkeys: 8 }));
        assert_eq!(parse_index_key(&index_key(t)), Some(SlotRef::single(t)));
        assert!(index_key_with(t, 8) < format!("{}~", index_key(t)) && index_key_with(t, 8) < index_key(t + 1));
    }
}
