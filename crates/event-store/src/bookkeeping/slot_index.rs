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
//!
//! A slot cut into S slices (`SLICES` > 1: [`crate::slices`]) has the entry
//! `index#<slot>#s<S>`, and its slices are stored under keys of their own; a
//! slot written under several counts has an entry for each, and a reader
//! queries its slices under each (and every sub-key, which any key may be in).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{key, query_range, sort_key_of};
use crate::error::Result;
use crate::slices::{self, KeyRange};

const PREFIX: &str = "index#";

/// A non-empty slot, and where its chunks are stored: under the sub-keys
/// `slot + 0..subkeys` (none when 0), and under the slices of each count in `sliced`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct SlotRef {
    pub slot: i64,
    pub subkeys: u32,
    /// Bit k set: the slot has chunks cut into 2^k slices.
    pub sliced: u16,
}

impl SlotRef {
    /// A slot stored under its own key only.
    pub(crate) fn single(slot: i64) -> Self {
        Self { slot, subkeys: 1, sliced: 0 }
    }

    /// A slot cut into `slices` slices only.
    pub(crate) fn sliced(slot: i64, slices: u32) -> Self {
        Self { slot, subkeys: 0, sliced: slice_bit(slices) }
    }

    /// The hash keys that may hold events of `range` in this slot, in order
    /// of sub-key, then of slice count and slice.
    pub(crate) fn storage_keys(&self, range: KeyRange) -> Vec<i64> {
        let mut keys: Vec<i64> = (0..i64::from(self.subkeys)).map(|k| self.slot + k).collect();
        for bit in 0..u16::BITS {
            if self.sliced & (1 << bit) != 0 {
                let slices = 1u32 << bit;
                keys.extend(range.slices(slices).map(|s| slices::storage_key(self.slot, slices, s)));
            }
        }
        keys
    }

    /// The most slices the slot's chunks were cut into (1: not cut).
    pub(crate) fn most_slices(&self) -> u32 {
        match self.sliced {
            0 => 1,
            sliced => 1 << (u16::BITS - 1 - sliced.leading_zeros()),
        }
    }

    /// Every hash key the slot's chunks are stored under.
    pub(crate) fn all_storage_keys(&self) -> Vec<i64> {
        self.storage_keys(KeyRange::ALL)
    }

    /// Both entries' places.
    fn merge(&mut self, other: &SlotRef) {
        self.subkeys = self.subkeys.max(other.subkeys);
        self.sliced |= other.sliced;
    }
}

fn slice_bit(slices: u32) -> u16 {
    1 << slices.max(1).trailing_zeros().min(15)
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

/// The index entry's sort key for a slot cut into `slices` slices.
pub(crate) fn index_key_sliced(slot: i64, slices: u32) -> String {
    format!("{PREFIX}{slot:013}#s{slices}")
}

/// The slot and its places an index entry's sort key names.
pub(crate) fn parse_index_key(key: &str) -> Option<SlotRef> {
    let rest = key.strip_prefix(PREFIX)?;
    let Some((slot, place)) = rest.split_once('#') else {
        return Some(SlotRef::single(rest.parse().ok()?));
    };
    let slot = slot.parse().ok()?;
    match place.strip_prefix('s') {
        Some(slices) => Some(SlotRef::sliced(slot, slices::check_slices(slices.parse().ok()?).ok()?)),
        None => Some(SlotRef { slot, subkeys: place.parse().ok()?, sliced: 0 }),
    }
}

/// The index entry saying `slot` has events, stored under `subkeys` sub-keys (put with them, by the scan).
pub fn index_item(slot: i64, subkeys: u32) -> HashMap<String, AttributeValue> {
    key(index_key_with(slot, subkeys))
}

/// The index entry saying `slot` has events cut into `slices` slices.
pub(crate) fn sliced_index_item(slot: i64, slices: u32) -> HashMap<String, AttributeValue> {
    key(index_key_sliced(slot, slices))
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
            Some(last) if last.slot == entry.slot => last.merge(&entry),
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
        assert_eq!(parse_index_key(&index_key_with(t, 8)), Some(SlotRef { slot: t, subkeys: 8, sliced: 0 }));
        assert_eq!(parse_index_key(&index_key(t)), Some(SlotRef::single(t)));
        assert!(index_key_with(t, 8) < format!("{}~", index_key(t)) && index_key_with(t, 8) < index_key(t + 1));
        assert!(index_key_sliced(t, 256) < format!("{}~", index_key(t)) && index_key_sliced(t, 256) < index_key(t + 1));
        assert_eq!(parse_index_key(&index_key_sliced(t, 256)), Some(SlotRef::sliced(t, 256)));
        assert_eq!(parse_index_key(&format!("index#{t:013}#s3")), None, "not a slice count");
    }

    #[test]
    fn a_slot_under_sub_keys_and_slices_is_read_under_all_of_them() {
        let t = 1_795_240_740_000;
        let mut slot = SlotRef { slot: t, subkeys: 2, sliced: 0 };
        slot.merge(&SlotRef::sliced(t, 4));
        slot.merge(&SlotRef::sliced(t, 2));
        let all = slot.all_storage_keys();
        let k = |n, s| slices::storage_key(t, n, s);
        assert_eq!(all, vec![t, t + 1, k(2, 0), k(2, 1), k(4, 0), k(4, 1), k(4, 2), k(4, 3)]);
        // The second half of the keys: every sub-key (any key may be there), and only its slices.
        assert_eq!(slot.storage_keys(KeyRange::new(1, 2)), vec![t, t + 1, k(2, 1), k(4, 2), k(4, 3)]);
        assert_eq!(SlotRef::sliced(t, 256).storage_keys(KeyRange::new(3, 256)), vec![k(256, 3)]);
        assert_eq!(SlotRef::single(t).all_storage_keys(), vec![t]);
        assert_eq!(
            (slot.most_slices(), SlotRef::single(t).most_slices(), SlotRef::sliced(t, 1024).most_slices()),
            (4, 1, 1024)
        );
    }
}
