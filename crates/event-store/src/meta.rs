//! The event table's bookkeeping partition (`slot = -2`): what the scan
//! knows and playback needs, kept next to the events so no other table,
//! role or stack output is needed.
//!
//! | sort key | attributes | written by |
//! |---|---|---|
//! | `index#<slot start ms, 13 digits>` | none: the item says "this slot has events" | scan, a put with the slot's events (idempotent) |
//! | `watermark#<segments, 4 digits>#<segment, 4 digits>` | `time`, `updated_at`, `late` (N) | scan, forward only; `late` by `ADD` |
//! | `playback#<id>` | `checkpoint`: M of `slot`, `after`, `seq`, `events`, `done` | playback, after every put |
//!
//! Every item is written by one writer at a time (a scan page, a scan
//! segment, a playback run), never read-modified-written by two at once.
//! Playback never reads negative slots, so neither this partition nor the
//! quarantine (`slot = -1`) is ever played back.

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::event_item::{PARTITION_KEY, SORT_KEY};

/// The bookkeeping partition's `slot`.
pub const META_SLOT: i64 = -2;
const WATERMARK_PREFIX: &str = "watermark#";
const INDEX_PREFIX: &str = "index#";

/// The index entry's sort key for a slot: 13 digits, so text order is time order.
pub fn index_key(slot: i64) -> String {
    format!("{INDEX_PREFIX}{slot:013}")
}

/// The slot an index entry's sort key names.
pub fn slot_of_index_key(key: &str) -> Option<i64> {
    key.strip_prefix(INDEX_PREFIX)?.parse().ok()
}

/// The index entry saying `slot` has events (put with them, by the scan).
pub fn index_item(slot: i64) -> HashMap<String, AttributeValue> {
    key(index_key(slot))
}

fn key(sort_key: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PARTITION_KEY.to_owned(), AttributeValue::N(META_SLOT.to_string())),
        (SORT_KEY.to_owned(), AttributeValue::S(sort_key)),
    ])
}

/// All items of the bookkeeping partition whose sort key is in `[from, to]`, page by page.
/// Returns them with the number of `Query` requests it took.
async fn query_meta(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: String,
    to: String,
) -> Result<(Vec<HashMap<String, AttributeValue>>, usize)> {
    let mut items = Vec::new();
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
            .expression_attribute_values(":from", AttributeValue::S(from.clone()))
            .expression_attribute_values(":to", AttributeValue::S(to.clone()))
            .set_exclusive_start_key(start_key.take())
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        queries += 1;
        items.extend(page.items().iter().cloned());
        match page.last_evaluated_key() {
            Some(last) => start_key = Some(last.clone()),
            None => return Ok((items, queries)),
        }
    }
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
    let (items, queries) = query_meta(dynamo, table, index_key(from.max(0)), index_key(to - 1)).await?;
    let slots =
        items.iter().filter_map(|item| item.get(SORT_KEY)?.as_s().ok().and_then(|k| slot_of_index_key(k))).collect();
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
/// (anything that lands in the buffer after the pass started arrived at most `lag` before it).
pub fn segment_watermark(pass_started_at: i64, lag_ms: i64, oldest_left: Option<i64>) -> i64 {
    let bound = pass_started_at - lag_ms.clamp(0, MAX_PUMP_LAG_MS);
    oldest_left.map_or(bound, |oldest| oldest.min(bound))
}

/// Keyed by the segment count too: segments of different counts cover
/// different parts of the table, so only a full set of one count is a watermark.
fn watermark_key(total_segments: u32, segment: u32) -> String {
    format!("{WATERMARK_PREFIX}{total_segments:04}#{segment:04}")
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
    now_ms: i64,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(watermark_key(total_segments, segment))))
        .update_expression("SET #time = :time, updated_at = :now")
        .condition_expression("attribute_not_exists(#time) OR #time < :time")
        .expression_attribute_names("#time", "time")
        .expression_attribute_values(":time", AttributeValue::N(time.to_string()))
        .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
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

/// Counts events that came in behind the watermark (on the segment's own item).
pub async fn count_late(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    segment: u32,
    total_segments: u32,
    late: usize,
) -> Result<()> {
    dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(watermark_key(total_segments, segment))))
        .update_expression("ADD late :n")
        .expression_attribute_values(":n", AttributeValue::N(late.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("UpdateItem", e))?;
    Ok(())
}

/// The watermark from the segments' items: among the segment counts whose
/// every segment has finished a pass, the one written to most recently, and
/// its lowest `time`. Absent until one count is complete.
pub fn watermark_of(items: &[HashMap<String, AttributeValue>]) -> Watermark {
    let number = |item: &HashMap<String, AttributeValue>, name: &str| {
        item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok())
    };
    let late = items.iter().filter_map(|i| number(i, "late")).sum::<i64>().max(0) as u64;
    // segment count -> (segment -> time), and the latest write to that count.
    let mut counts: HashMap<u32, (HashMap<u32, i64>, i64)> = HashMap::new();
    for item in items {
        let Some(rest) = item.get(SORT_KEY).and_then(|v| v.as_s().ok()).and_then(|k| k.strip_prefix(WATERMARK_PREFIX))
        else {
            continue;
        };
        let Some((total, segment)) = rest.split_once('#') else { continue };
        let (Ok(total), Ok(segment), Some(time)) = (total.parse::<u32>(), segment.parse::<u32>(), number(item, "time"))
        else {
            continue;
        };
        let entry = counts.entry(total).or_default();
        entry.0.insert(segment, time);
        entry.1 = entry.1.max(number(item, "updated_at").unwrap_or(0));
    }
    let time = counts
        .into_iter()
        .filter(|(total, (times, _))| *total > 0 && (0..*total).all(|s| times.contains_key(&s)))
        .max_by_key(|(_, (_, updated))| *updated)
        .and_then(|(_, (times, _))| times.into_values().min());
    Watermark { time, late }
}

pub async fn read_watermark(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Watermark> {
    let (items, _) = query_meta(dynamo, table, format!("{WATERMARK_PREFIX}0"), format!("{WATERMARK_PREFIX}9")).await?;
    Ok(watermark_of(&items))
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

/// The checkpoint's fields live in one map attribute (its `slot` would clash with the key's).
const CHECKPOINT: &str = "checkpoint";

fn checkpoint_key(id: &str) -> String {
    format!("playback#{id}")
}

pub async fn save_checkpoint(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    id: &str,
    checkpoint: &Checkpoint,
) -> Result<()> {
    let fields = serde_dynamo::to_item::<_, HashMap<String, AttributeValue>>(checkpoint)
        .map_err(|e| Error::Malformed(format!("checkpoint: {e}")))?;
    let mut item = key(checkpoint_key(id));
    item.insert(CHECKPOINT.to_owned(), AttributeValue::M(fields));
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
        .and_then(|item| item.get(CHECKPOINT))
        .and_then(|value| value.as_m().ok())
        .map(|fields| serde_dynamo::from_item(fields.clone()).map_err(|e| Error::Malformed(format!("checkpoint: {e}"))))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_keys_sort_in_time_order_and_name_their_slot() {
        let t = 1_795_240_740_000;
        assert!(index_key(999) < index_key(t) && index_key(t) < index_key(t + 1000));
        assert_eq!(slot_of_index_key(&index_key(t)), Some(t));
        assert_eq!(slot_of_index_key("watermark#0001"), None);
        assert_eq!(index_item(t)[SORT_KEY], AttributeValue::S(index_key(t)));
    }

    #[test]
    fn a_segment_pass_allows_for_what_it_left_and_for_the_pump_lag() {
        assert_eq!(segment_watermark(10_000, 2_000, None), 8_000);
        assert_eq!(segment_watermark(10_000, 2_000, Some(5_000)), 5_000, "a failed item holds it back");
        assert_eq!(segment_watermark(10_000, 2_000, Some(9_000)), 8_000);
        assert_eq!(segment_watermark(10_000, -5, None), 10_000);
        let now = 1_800_000_000_000;
        assert_eq!(
            segment_watermark(now, 90 * 86_400_000, None),
            now - MAX_PUMP_LAG_MS,
            "no lag beyond the max record age"
        );
    }

    #[test]
    fn the_watermark_is_the_lowest_segment_of_the_latest_complete_configuration() {
        let n = |v: i64| AttributeValue::N(v.to_string());
        let segment = |total: u32, i: u32, time: i64, updated: i64| {
            let mut item = key(watermark_key(total, i));
            item.extend([("time".to_string(), n(time)), ("updated_at".to_string(), n(updated))]);
            item
        };
        let mut items = vec![segment(3, 0, 500, 1), segment(3, 1, 300, 2)];
        assert_eq!(watermark_of(&items), Watermark { time: None, late: 0 }, "segment 2 has not finished a pass");
        items.push(segment(3, 2, 400, 3));
        assert_eq!(watermark_of(&items).time, Some(300));
        // Reconfigured to 2 segments: until both have finished a pass, the 3-segment set still holds.
        items.push(segment(2, 0, 900, 9));
        assert_eq!(watermark_of(&items).time, Some(300), "half a new configuration proves nothing");
        items.push(segment(2, 1, 800, 10));
        items[0].insert("late".into(), n(4));
        assert_eq!(watermark_of(&items), Watermark { time: Some(800), late: 4 });
        assert_eq!(watermark_of(&[]), Watermark { time: None, late: 0 });
        assert!(watermark_key(4, 1).starts_with("watermark#0004#"));
    }
}
