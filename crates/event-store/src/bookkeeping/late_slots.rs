//! Slots that received events after the watermark had passed them (late
//! events: a re-buffer days later, say). The scan marks such a slot before
//! it writes the events; a reader of an archived slot reads the marked ones
//! from the event table too, where the late events stay (the archive's
//! objects are never rewritten).

use std::collections::BTreeSet;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use super::{key, query_range};
use crate::error::{Error, Result};
use crate::time::now_ms;

const LATE: &str = "late#";

fn late_key(slot: i64) -> String {
    format!("{LATE}{slot:013}")
}

/// Marks `slots` as having late events (idempotent: the last time is kept).
pub(crate) async fn mark(dynamo: &aws_sdk_dynamodb::Client, table: &str, slots: &BTreeSet<i64>) -> Result<()> {
    for slot in slots {
        dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(key(late_key(*slot))))
            .update_expression("SET marked_at = :now")
            .expression_attribute_values(":now", AttributeValue::N(now_ms().to_string()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("UpdateItem", e))?;
    }
    Ok(())
}

/// The marked slots in `[from, to)`.
pub async fn in_range(dynamo: &aws_sdk_dynamodb::Client, table: &str, from: i64, to: i64) -> Result<BTreeSet<i64>> {
    let (items, _) = query_range(dynamo, table, late_key(from.max(0)), late_key(to.max(1) - 1)).await?;
    Ok(items
        .iter()
        .filter_map(|item| item.get(crate::event_item::RANGE_KEY)?.as_s().ok()?.strip_prefix(LATE)?.parse().ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_sort_by_slot_and_stand_apart_from_the_other_items() {
        assert!(late_key(999_999_999_999) < late_key(1_795_000_000_000));
        for other in ["index#", "watermark#", "archive#", "settings", "shard#", "pass#"] {
            assert!(!other.starts_with(LATE) && !LATE.starts_with(other), "{other}");
        }
    }
}
