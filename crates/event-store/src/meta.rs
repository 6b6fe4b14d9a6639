//! The event table's bookkeeping partition (`slot = -2`): what the scan
//! knows and playback needs, kept next to the events so no other table,
//! role or stack output is needed.
//!
//! | sort key | attributes | written by |
//! |---|---|---|
//! | `index#<bucket start ms, 13 digits>` | `slots`: NS of the non-empty slots' offsets in the bucket (0..59) | scan, `ADD` (a set union: idempotent) |
//! | `watermark` | `segment_<i>`: N per scan segment, `total_segments`: N, `late`: N | scan, forward only |
//! | `playback#<id>` | `slot`, `after`, `seq`, `events`, `done` | playback, after every put |
//!
//! Playback never reads negative slots, so neither this partition nor the
//! quarantine (`slot = -1`) is ever played back.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use futures::future::try_join_all;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::event_item::{PARTITION_KEY, SORT_KEY};

/// The bookkeeping partition's `slot`.
pub const META_SLOT: i64 = -2;
/// Slots per index item: a minute at the default one-second `TIME_UNIT`.
/// Small enough that an update stays within one write unit (an update is
/// billed on the item's full size), few enough that a day is 1,440 items,
/// read in one or two `Query` pages.
pub const SLOTS_PER_BUCKET: i64 = 60;
const WATERMARK_KEY: &str = "watermark";

/// Start of the index bucket holding `slot`.
pub fn bucket_of(slot: i64, unit_ms: u64) -> i64 {
    slot - slot.rem_euclid(unit_ms as i64 * SLOTS_PER_BUCKET)
}

fn index_key(bucket: i64) -> String {
    format!("index#{bucket:013}")
}

/// Non-empty slots grouped by index bucket, as offsets within the bucket.
pub fn index_entries(slots: impl IntoIterator<Item = i64>, unit_ms: u64) -> BTreeMap<i64, BTreeSet<i64>> {
    let mut buckets: BTreeMap<i64, BTreeSet<i64>> = BTreeMap::new();
    for slot in slots.into_iter().filter(|s| *s >= 0) {
        let bucket = bucket_of(slot, unit_ms);
        buckets.entry(bucket).or_default().insert((slot - bucket) / unit_ms as i64);
    }
    buckets
}

fn key(sort_key: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PARTITION_KEY.to_owned(), AttributeValue::N(META_SLOT.to_string())),
        (SORT_KEY.to_owned(), AttributeValue::S(sort_key)),
    ])
}

/// Records slots as non-empty: one `UpdateItem ADD` per bucket, all in flight at once.
pub async fn add_to_index(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    slots: impl IntoIterator<Item = i64>,
    unit_ms: u64,
) -> Result<usize> {
    let updates = index_entries(slots, unit_ms).into_iter().map(|(bucket, offsets)| {
        dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(key(index_key(bucket))))
            .update_expression("ADD #slots :offsets")
            .expression_attribute_names("#slots", "slots")
            .expression_attribute_values(":offsets", AttributeValue::Ns(offsets.iter().map(i64::to_string).collect()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
    });
    let done = try_join_all(updates).await.map_err(|e| Error::dynamo("UpdateItem", e))?;
    Ok(done.len())
}

/// The non-empty slots in `[from, to)`, in order, from the index.
/// Returns them with the number of `Query` requests it took.
pub async fn read_index(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: i64,
    to: i64,
    unit_ms: u64,
) -> Result<(Vec<i64>, usize)> {
    let mut slots = Vec::new();
    let mut start_key = None;
    let mut queries = 0;
    loop {
        let page = dynamo
            .query()
            .table_name(table)
            .consistent_read(true)
            .key_condition_expression("#slot = :meta AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#slot", PARTITION_KEY)
            .expression_attribute_names("#sk", SORT_KEY)
            .expression_attribute_values(":meta", AttributeValue::N(META_SLOT.to_string()))
            .expression_attribute_values(":from", AttributeValue::S(index_key(bucket_of(from, unit_ms))))
            .expression_attribute_values(":to", AttributeValue::S(index_key(bucket_of(to, unit_ms))))
            .set_exclusive_start_key(start_key.take())
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        queries += 1;
        for item in page.items() {
            let bucket = item
                .get(SORT_KEY)
                .and_then(|v| v.as_s().ok())
                .and_then(|k| k.strip_prefix("index#"))
                .and_then(|b| b.parse::<i64>().ok());
            let offsets = item.get("slots").and_then(|v| v.as_ns().ok());
            let (Some(bucket), Some(offsets)) = (bucket, offsets) else { continue };
            slots.extend(offsets.iter().filter_map(|o| o.parse::<i64>().ok()).map(|o| bucket + o * unit_ms as i64));
        }
        match page.last_evaluated_key() {
            Some(last) => start_key = Some(last.clone()),
            None => break,
        }
    }
    slots.retain(|s| (from..to).contains(s));
    slots.sort_unstable();
    slots.dedup();
    Ok((slots, queries))
}

/// The completeness watermark: every event that arrived (Kinesis arrival
/// time) before `time` and reached the buffer is in the event table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watermark {
    /// ms since the epoch; `None` until every scan segment has finished a pass.
    pub time: Option<i64>,
    /// Events the scan moved after the watermark had passed their arrival time.
    pub late: u64,
}

/// The most pump lag there can be: the event source mapping drops records
/// older than this (`MaximumRecordAgeInSeconds` in the template, checked by a
/// test), so the pump never buffers an event that arrived longer ago.
pub const MAX_PUMP_LAG_MS: i64 = 6 * 3600 * 1000;

/// The watermark one finished segment pass allows: the oldest arrival it had
/// to leave in the buffer, or else the pass's start less the pump's lag
/// (anything buffered after the pass started arrived at most `lag` before it).
pub fn segment_watermark(pass_started_at: i64, lag_ms: i64, oldest_left: Option<i64>) -> i64 {
    let bound = pass_started_at - lag_ms.clamp(0, MAX_PUMP_LAG_MS);
    oldest_left.map_or(bound, |oldest| oldest.min(bound))
}

/// Moves segment `segment`'s part of the watermark forward to `time`
/// (a conditional write: never backward, so overlapping passes are harmless).
/// Returns false when it was already at or past `time`.
pub async fn advance_watermark(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    segment: u32,
    total_segments: u32,
    time: i64,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(WATERMARK_KEY.into())))
        .update_expression("SET #seg = :time, total_segments = :total")
        .condition_expression("attribute_not_exists(#seg) OR #seg < :time")
        .expression_attribute_names("#seg", format!("segment_{segment}"))
        .expression_attribute_values(":time", AttributeValue::N(time.to_string()))
        .expression_attribute_values(":total", AttributeValue::N(total_segments.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    match result {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.as_service_error(), Some(UpdateItemError::ConditionalCheckFailedException(_))) => {
            Ok(false)
        }
        Err(e) => Err(Error::dynamo("UpdateItem", e)),
    }
}

/// Counts events that came in behind the watermark.
pub async fn count_late(dynamo: &aws_sdk_dynamodb::Client, table: &str, late: usize) -> Result<()> {
    dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(WATERMARK_KEY.into())))
        .update_expression("ADD late :n")
        .expression_attribute_values(":n", AttributeValue::N(late.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("UpdateItem", e))?;
    Ok(())
}

/// The watermark as stored: the lowest of the segments' parts.
pub fn watermark_of(item: &HashMap<String, AttributeValue>) -> Watermark {
    let number = |name: &str| item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
    let late = number("late").unwrap_or(0).max(0) as u64;
    let time = number("total_segments").filter(|n| *n > 0).and_then(|total| {
        (0..total).map(|i| number(&format!("segment_{i}"))).collect::<Option<Vec<i64>>>()?.into_iter().min()
    });
    Watermark { time, late }
}

pub async fn read_watermark(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Watermark> {
    let out = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key(WATERMARK_KEY.into())))
        .consistent_read(true)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    Ok(out.item().map(watermark_of).unwrap_or(Watermark { time: None, late: 0 }))
}

/// Where a playback stands: every event before `slot`, and in `slot` up to
/// and including sort key `after`, is on the stream; the next record gets `seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub slot: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    pub seq: u64,
    /// Records put so far by this playback.
    #[serde(default)]
    pub events: u64,
    #[serde(default)]
    pub done: bool,
}

fn checkpoint_key(id: &str) -> String {
    format!("playback#{id}")
}

pub async fn save_checkpoint(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    id: &str,
    checkpoint: &Checkpoint,
) -> Result<()> {
    let mut item = serde_dynamo::to_item::<_, HashMap<String, AttributeValue>>(checkpoint)
        .map_err(|e| Error::Malformed(format!("checkpoint: {e}")))?;
    item.extend(key(checkpoint_key(id)));
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

pub async fn load_checkpoint(dynamo: &aws_sdk_dynamodb::Client, table: &str, id: &str) -> Result<Option<Checkpoint>> {
    let out = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key(checkpoint_key(id))))
        .consistent_read(true)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    out.item()
        .map(|item| serde_dynamo::from_item(item.clone()).map_err(|e| Error::Malformed(format!("checkpoint: {e}"))))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_indexed_by_minute_as_offsets() {
        let t = 1_795_240_740_000; // 12:59:00 UTC, a minute boundary
        assert_eq!(bucket_of(t + 59_999, 1000), t);
        assert_eq!(bucket_of(t + 60_000, 1000), t + 60_000);
        let entries = index_entries([t + 59_000, t, t + 3_000, t + 60_000, -1_000], 1000);
        assert_eq!(
            entries,
            BTreeMap::from([(t, BTreeSet::from([0, 3, 59])), (t + 60_000, BTreeSet::from([0]))]),
            "negative slots (quarantine, bookkeeping) are never indexed"
        );
        assert_eq!(bucket_of(t + 250, 10), t, "600 ms buckets at 10 ms slots");
        assert!(index_key(t) < index_key(t + 60_000) && index_key(999) < index_key(t));
    }

    #[test]
    fn a_segment_pass_allows_for_what_it_left_and_for_the_pump_lag() {
        assert_eq!(segment_watermark(10_000, 2_000, None), 8_000);
        assert_eq!(segment_watermark(10_000, 2_000, Some(5_000)), 5_000, "a failed item holds it back");
        assert_eq!(segment_watermark(10_000, 2_000, Some(9_000)), 8_000);
        assert_eq!(segment_watermark(10_000, -5, None), 10_000);
        let now = 1_800_000_000_000;
        assert_eq!(segment_watermark(now, 90 * 86_400_000, None), now - MAX_PUMP_LAG_MS, "no lag beyond the max record age");
    }

    #[test]
    fn the_watermark_is_the_lowest_segment_and_absent_until_all_have_one() {
        let n = |v: i64| AttributeValue::N(v.to_string());
        let mut item = HashMap::from([
            ("total_segments".to_string(), n(3)),
            ("segment_0".to_string(), n(500)),
            ("segment_1".to_string(), n(300)),
        ]);
        assert_eq!(watermark_of(&item), Watermark { time: None, late: 0 });
        item.insert("segment_2".into(), n(400));
        item.insert("segment_7".into(), n(1), /* from an older, wider configuration: ignored */);
        item.insert("late".into(), n(4));
        assert_eq!(watermark_of(&item), Watermark { time: Some(300), late: 4 });
    }
}
