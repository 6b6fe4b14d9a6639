//! Slots that received events after the watermark had passed them (late
//! events: a re-buffer days later, say). The scan marks such a slot before
//! it writes the events; a reader of an archived slot reads the marked ones
//! from the event table too, where the late events stay (the archive's
//! objects are never rewritten). The scan marks in its partition; the
//! archiver, keeping an earlier attempt's object that misses late events,
//! in its own: readers read both.

use std::collections::BTreeSet;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use super::{key_in, query_in, Family};
use crate::error::{Error, Result};
use crate::time::now_ms;

const LATE: &str = "late#";

fn late_key(slot: i64) -> String {
    format!("{LATE}{slot:013}")
}

/// Marks `slots` as having late events, in `family`'s partition (the
/// scan's or the archiver's; idempotent: the last time is kept).
pub(crate) async fn mark(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    family: Family,
    slots: &BTreeSet<i64>,
) -> Result<()> {
    for slot in slots {
        dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(key_in(family, late_key(*slot))))
            .update_expression("SET marked_at = :now")
            .expression_attribute_values(":now", AttributeValue::N(now_ms().to_string()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("UpdateItem", e))?;
    }
    Ok(())
}

/// The marked slots in `[from, to)`, by whichever of the two.
pub async fn in_range(dynamo: &aws_sdk_dynamodb::Client, table: &str, from: i64, to: i64) -> Result<BTreeSet<i64>> {
    let range = || (late_key(from.max(0)), late_key(to.max(1) - 1));
    let (scan, archive) =
        tokio::join!(query_in(dynamo, table, Family::Scan, range()), query_in(dynamo, table, Family::Archive, range()));
    Ok(scan?
        .0
        .iter()
        .chain(archive?.0.iter())
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
