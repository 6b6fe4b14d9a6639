//! The completeness watermark, the whole rule in one place: what a scan
//! pass observes, how the segments' parts are stored and combined, and
//! which slots a reader may treat as complete
//! (`docs/design.md#4-completeness-the-watermark`).
//!
//! A pass starts with a look at the event stream ([`super::frontier`]):
//! for every shard, the lowest arrival a record not buffered yet can be
//! stored with. The pump stores a shard's arrivals non-decreasing from its
//! position, so that is the first waiting record's arrival (at least the
//! position's); for a shard buffered up to its tip it is the position's
//! arrival, but no less than the pass start less `WATERMARK_LAG_MS` (for
//! clock differences between Kinesis' arrival stamps and the scan: a record
//! put later arrives after it); a closed shard read to its end bounds
//! nothing. The lowest of these is the pass's *stream bound*. Each scan
//! segment, when it finishes the pass over its part of the buffer, moves its
//! own item forward to the lower of the stream bound and the oldest arrival
//! it had to leave in the buffer.
//!
//! Every event is therefore either in the buffer when the pass starts (and
//! the pass moves it or is held back by it), or stored later with an arrival
//! at or after the stream bound. So a busy shard completes slots on its own arrival
//! stamps, and only a shard that has been idle for longer than the lag
//! holds the watermark at the clock allowance. The watermark is the lowest
//! part of the newest complete set of segments; every slot before the
//! watermark's slot is complete.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use serde::{Deserialize, Serialize};

use super::{key, moved_forward, query_range, sort_key_of};
use crate::error::{Error, Result};
use crate::time::slot_of;

const PREFIX: &str = "watermark#";

/// The arrival of an item left in the buffer whose arrival cannot be read:
/// earlier than any, so it holds the watermark where it is.
pub const UNKNOWN_ARRIVAL: i64 = i64::MIN;

/// A segment's pass so far, carried from run to run in the segment's stored
/// state. Without `pass_started_at` (a segment invoked by hand, or a pass
/// whose look at the stream failed) the pass moves events but no watermark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pass {
    /// When the scheduled run that started this pass looked at the stream (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_started_at: Option<i64>,
    /// The earliest arrival of a record that was in the event stream but not
    /// yet buffered when the pass started; absent when every shard was buffered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unbuffered_from: Option<i64>,
    /// Every record not in the buffer when the pass started is stored with an
    /// arrival at or after this ([`super::frontier::Look`]). Absent in a
    /// pass started by an earlier version, which bounds by the clock alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_bound: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_left: Option<i64>,
}

impl Pass {
    pub(crate) fn started_at(ms: i64, unbuffered_from: Option<i64>, stream_bound: i64) -> Self {
        Self { pass_started_at: Some(ms), unbuffered_from, stream_bound: Some(stream_bound), oldest_left: None }
    }

    /// Adds what one page had to leave in the buffer.
    pub(crate) fn saw(&mut self, oldest_left: Option<i64>) {
        self.oldest_left = match (self.oldest_left, oldest_left) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }

    /// The time this pass, once finished, lets its segment's part move to.
    /// `clock_allowance_ms` (`WATERMARK_LAG_MS`) only serves a pass without a
    /// stream bound (started by an earlier version: the pass start less the
    /// allowance, and no later than a waiting record). `None` for a pass with
    /// no start, and for one that left an item whose arrival nobody can read
    /// (`oldest_left` is [`UNKNOWN_ARRIVAL`]): the watermark stays where it is.
    pub(crate) fn watermark(&self, clock_allowance_ms: u64) -> Option<i64> {
        let started = self.pass_started_at?;
        if self.oldest_left == Some(UNKNOWN_ARRIVAL) {
            return None;
        }
        let stream = self.stream_bound.unwrap_or_else(|| {
            let by_clock = started - clock_allowance_ms as i64;
            self.unbuffered_from.map_or(by_clock, |from| from.min(by_clock))
        });
        Some(self.oldest_left.map_or(stream, |oldest| oldest.min(stream)))
    }
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

impl Watermark {
    /// The end of the complete part of the log: every slot before the
    /// watermark's own slot is complete. `None` before the first watermark.
    pub fn complete_end(&self, unit_ms: u64) -> Option<i64> {
        self.time.map(|t| slot_of(t, unit_ms))
    }
}

/// Keyed by the segment count too: segments of different counts cover
/// different parts of the table, so only a full set of one count is a watermark.
fn watermark_key(total_segments: u32, segment: u32) -> String {
    format!("{PREFIX}{total_segments:04}#{segment:04}")
}

/// Moves segment `segment`'s part of the watermark forward to `time`
/// (a conditional write: never backward, so overlapping passes are harmless).
/// Returns false when it was already at or past `time`.
pub async fn advance(
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
    moved_forward(result)
}

/// Counts events that came in behind the watermark (on the segment's own item).
pub(crate) async fn count_late(
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
pub(crate) fn watermark_of(items: &[HashMap<String, AttributeValue>]) -> Watermark {
    let number = |item: &HashMap<String, AttributeValue>, name: &str| {
        item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok())
    };
    let late = items.iter().filter_map(|i| number(i, "late")).sum::<i64>().max(0) as u64;
    // segment count -> (segment -> time), and the latest write to that count.
    let mut counts: HashMap<u32, (HashMap<u32, i64>, i64)> = HashMap::new();
    for item in items {
        let Some(rest) = sort_key_of(item).and_then(|k| k.strip_prefix(PREFIX)) else { continue };
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

pub async fn read(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Watermark> {
    let (items, _) = query_range(dynamo, table, format!("{PREFIX}0"), format!("{PREFIX}9")).await?;
    Ok(watermark_of(&items))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_is_held_back_by_what_it_left_and_by_its_stream_bound() {
        let mut pass = Pass::started_at(100_000, None, 99_500);
        assert_eq!(pass.watermark(1_000), Some(99_500), "all buffered and moved: the stream bound");
        pass.saw(None);
        pass.saw(Some(95_000));
        pass.saw(Some(90_000));
        assert_eq!(pass.oldest_left, Some(90_000));
        assert_eq!(pass.watermark(1_000), Some(90_000), "what was left holds it back");
        let stalled = Pass { stream_bound: Some(40_000), ..pass };
        assert_eq!(stalled.watermark(1_000), Some(40_000), "a record still in the stream holds it back");
        assert_eq!(Pass::default().watermark(1_000), None, "a hand-started segment moves no watermark");
        // A pass stored by the earlier version has no stream bound: the clock allowance, and what waited.
        let earlier = Pass { pass_started_at: Some(100_000), ..Pass::default() };
        assert_eq!(earlier.watermark(1_000), Some(99_000));
        assert_eq!(Pass { unbuffered_from: Some(98_000), ..earlier }.watermark(1_000), Some(98_000));
    }

    #[test]
    fn the_complete_end_is_the_start_of_the_watermarks_slot() {
        let w = Watermark { time: Some(12_345), late: 0 };
        assert_eq!(w.complete_end(1000), Some(12_000));
        assert_eq!(Watermark { time: None, late: 0 }.complete_end(1000), None);
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
