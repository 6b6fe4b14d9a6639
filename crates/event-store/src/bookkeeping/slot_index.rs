//! The slot index: one item per non-empty slot, put by the scan in the same
//! `BatchWriteItem` stream as the slot's events. Readers find slots only
//! through it, so an empty slot costs no query and a slot's events leave the
//! buffer only once its index entry is written (`docs/design.md#2-delete-after-durable-copy`).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use super::{key, query_range, sort_key_of};
use crate::error::Result;

const PREFIX: &str = "index#";

/// The index entry's sort key for a slot: 13 digits, so text order is time order.
pub fn index_key(slot: i64) -> String {
    format!("{PREFIX}{slot:013}")
}

/// The slot an index entry's sort key names.
pub fn slot_of_index_key(key: &str) -> Option<i64> {
    key.strip_prefix(PREFIX)?.parse().ok()
}

/// The index entry saying `slot` has events (put with them, by the scan).
pub fn index_item(slot: i64) -> HashMap<String, AttributeValue> {
    key(index_key(slot))
}

/// The non-empty slots in `[from, to)`, in order, from the index.
/// Returns them with the number of `Query` requests it took.
pub async fn read_index(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: i64,
    to: i64,
) -> Result<(Vec<i64>, usize)> {
    if to <= from {
        return Ok((Vec::new(), 0));
    }
    let (items, queries) = query_range(dynamo, table, index_key(from.max(0)), index_key(to - 1)).await?;
    let slots = items.iter().filter_map(|item| sort_key_of(item).and_then(slot_of_index_key)).collect();
    Ok((slots, queries))
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
        assert_eq!(index_item(t)[RANGE_KEY], AttributeValue::S(index_key(t)));
    }
}
