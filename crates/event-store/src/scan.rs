//! `scan`: buffer table → event table. A scheduled run fans out one
//! asynchronous invocation per scan segment; a segment run moves page after
//! page (put into the event table, then delete from the buffer only what was
//! put) until its deadline nears, then hands the rest of its segment to a
//! fresh invocation of itself with the key where it stopped.
//!
//! With a page's events it writes the page's slots into the slot index, and when a segment finishes a pass it moves its part of the
//! completeness watermark forward (see [`crate::meta`]).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, ReturnConsumedCapacity, WriteRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{error, info, warn};

use crate::batch::Backoff;
use crate::buffer_item::{self, BufferItem};
use crate::config::ScanConfig;
use crate::dynamo::{keyed_puts, write_all};
use crate::error::{Error, Result};
use crate::event_item::{quarantine_item, EventItem, QUARANTINE_SLOT};
use crate::invoke::Invoker;
use crate::meta::{
    advance_watermark, count_late, index_item, index_key, read_watermark, segment_watermark, slot_of_index_key,
    META_SLOT,
};
use crate::time::{effective_deadline, format_ms, now_ms, remaining};

/// The payload of a segment run (a fork or a continuation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentTask {
    pub segment: u32,
    pub total_segments: u32,
    /// Buffer key after which to resume; absent at the segment's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<String>,
    /// When the scheduled run that started this pass began (ms). Absent (a
    /// segment invoked by hand): the pass moves events but no watermark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass_started_at: Option<i64>,
    /// Oldest arrival the pass so far had to leave in the buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_left: Option<i64>,
    /// Largest pump lag (`buffered_at - arrival`) seen by the pass so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lag_ms: Option<i64>,
}

impl SegmentTask {
    fn saw(&mut self, moved: &Moved) {
        self.oldest_left = min_opt(self.oldest_left, moved.oldest_left);
        self.max_lag_ms = self.max_lag_ms.max(moved.max_lag_ms);
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What one invocation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScanSummary {
    /// Segment runs this invocation started (the fan-out or a continuation).
    pub forked: u32,
    pub pages: u32,
    /// Items now in the event table and gone from the buffer.
    pub moved: usize,
    /// Items whose put or delete failed; they stay in the buffer for the next scan.
    pub failed: usize,
    /// Buffer items that cannot become events: moved to the quarantine partition with the reason.
    pub quarantined: usize,
    /// Events moved after the watermark had passed their arrival time (see the README's late-event policy).
    pub late: usize,
    /// The watermark this run moved its segment's part to, when it finished a pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<i64>,
}

/// What a segment run does after a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    Done,
    Page(String),
    Fork(String),
}

/// After a page: finished when DynamoDB returned no last key, else go on
/// while more than `margin` is left, else hand over.
pub fn next_step(last_key: Option<String>, remaining: Duration, margin: Duration) -> Next {
    match last_key {
        None => Next::Done,
        Some(key) if remaining > margin => Next::Page(key),
        Some(key) => Next::Fork(key),
    }
}

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] =
    &["dynamodb:Scan", "dynamodb:BatchWriteItem", "dynamodb:UpdateItem", "dynamodb:Query", "lambda:InvokeFunction"];

pub struct Scan {
    dynamo: aws_sdk_dynamodb::Client,
    config: ScanConfig,
    invoker: Arc<dyn Invoker>,
    backoff: Backoff,
}

impl Scan {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, config: ScanConfig, invoker: Arc<dyn Invoker>) -> Self {
        Self { dynamo, config, invoker, backoff: Backoff::default() }
    }

    /// Retries of unprocessed items with another schedule (tests shorten it).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// A payload with `segment` runs that segment; anything else (the
    /// schedule's event) starts one run per segment.
    pub async fn handle(&self, payload: Value, deadline: SystemTime) -> Result<ScanSummary> {
        let deadline = effective_deadline(deadline, SystemTime::now());
        if payload.get("segment").is_some() {
            let task: SegmentTask =
                serde_json::from_value(payload).map_err(|e| Error::BadInput(format!("segment task: {e}")))?;
            if task.segment >= task.total_segments {
                return Err(Error::BadInput(format!("segment {} of {}", task.segment, task.total_segments)));
            }
            return self.run_segment(task, deadline).await;
        }
        let total_segments = self.config.segments;
        let pass_started_at = Some(now_ms());
        for segment in 0..total_segments {
            let task = SegmentTask { segment, total_segments, pass_started_at, ..Default::default() };
            self.fork(&task).await?;
        }
        info!(segments = total_segments, "scan started");
        Ok(ScanSummary { forked: total_segments, ..Default::default() })
    }

    async fn fork(&self, task: &SegmentTask) -> Result<()> {
        let payload = serde_json::to_value(task).map_err(|e| Error::Invoke(e.to_string()))?;
        self.invoker.invoke_async(payload).await
    }

    async fn run_segment(&self, mut task: SegmentTask, deadline: SystemTime) -> Result<ScanSummary> {
        let mut summary = ScanSummary::default();
        let mut start_key = task.exclusive_start_key.clone();
        // Events arriving before the current watermark are late: counted, never misplaced.
        let watermark = match task.pass_started_at {
            Some(_) => read_watermark(&self.dynamo, &self.config.event_table).await?.time,
            None => None,
        };
        // Slots this run has already indexed: each gets one index write per run, not one per page.
        let mut indexed = BTreeSet::new();
        loop {
            let page = self
                .dynamo
                .scan()
                .table_name(&self.config.buffer_table)
                .segment(task.segment as i32)
                .total_segments(task.total_segments as i32)
                // Strongly consistent: a pass must see everything buffered before it started.
                .consistent_read(true)
                .set_limit(self.config.page_items)
                .set_exclusive_start_key(start_key.as_deref().map(BufferItem::key_of))
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| Error::dynamo("Scan", e))?;
            summary.pages += 1;
            let moved = self.move_items(page.items().to_vec(), watermark, &mut indexed).await;
            summary.moved += moved.moved;
            summary.failed += moved.failed;
            summary.quarantined += moved.quarantined;
            summary.late += moved.late;
            task.saw(&moved);
            if moved.late > 0 {
                if let Err(err) =
                    count_late(&self.dynamo, &self.config.event_table, task.segment, task.total_segments, moved.late)
                        .await
                {
                    warn!(error = %err, late = moved.late, "late events moved but not counted");
                }
            }
            let last_key =
                page.last_evaluated_key().and_then(|k| k.get(buffer_item::KEY)).and_then(|v| v.as_s().ok()).cloned();
            match next_step(last_key, remaining(deadline), self.config.deadline_margin) {
                Next::Done => {
                    summary.watermark = self.finish_pass(&task).await?;
                    break;
                }
                Next::Page(key) => start_key = Some(key),
                Next::Fork(key) => {
                    self.fork(&SegmentTask { exclusive_start_key: Some(key), ..task.clone() }).await?;
                    summary.forked = 1;
                    break;
                }
            }
        }
        info!(
            segment = task.segment,
            pages = summary.pages,
            moved = summary.moved,
            failed = summary.failed,
            quarantined = summary.quarantined,
            late = summary.late,
            watermark = summary.watermark.map(format_ms),
            continued = summary.forked > 0,
            "segment scanned"
        );
        Ok(summary)
    }

    /// A segment's pass is over: its part of the watermark moves forward.
    async fn finish_pass(&self, task: &SegmentTask) -> Result<Option<i64>> {
        let Some(started) = task.pass_started_at else { return Ok(None) };
        // The stamp is taken before the pump's writes, which may land up to its timeout later.
        let lag = task.max_lag_ms.unwrap_or(0).max(0) + self.config.watermark_lag_ms as i64;
        let time = segment_watermark(started, lag, task.oldest_left);
        let table = &self.config.event_table;
        advance_watermark(&self.dynamo, table, task.segment, task.total_segments, time, now_ms()).await?;
        Ok(Some(time))
    }

    /// Moves one page: puts into the event table, records the slots in the
    /// index, then deletes from the buffer exactly the items whose put and
    /// index update succeeded (invariant 2).
    async fn move_items(
        &self,
        items: Vec<HashMap<String, AttributeValue>>,
        watermark: Option<i64>,
        indexed: &mut BTreeSet<i64>,
    ) -> Moved {
        let mut result = Moved::default();
        let mut events = Vec::new();
        // Arrival and slot of each buffer id that became an event.
        let mut arrivals: HashMap<String, (i64, i64)> = HashMap::new();
        let now = now_ms();
        for attributes in items {
            let Some(id) = attributes.get(buffer_item::KEY).and_then(|v| v.as_s().ok()).cloned() else {
                warn!("buffer item without a string id: left in place");
                result.failed += 1;
                continue;
            };
            let event = BufferItem::from_item(attributes.clone()).and_then(|b| {
                let event = EventItem::from_buffer(&b, self.config.time_unit_ms)?;
                Ok((event.with_retention(self.config.retention_days).moved(now), b.buffered_at))
            });
            match event {
                Ok((event, buffered_at)) => {
                    if let Some(at) = buffered_at {
                        result.max_lag_ms = result.max_lag_ms.max(Some(at - event.arrival));
                    }
                    arrivals.insert(id.clone(), (event.arrival, event.slot));
                    events.push(((event.slot, event.sort_key.clone()), id, event.to_item()));
                }
                Err(err) => match quarantine_item(&id, &err.to_string(), attributes, now) {
                    Some(item) => {
                        warn!(id, reason = %err, "buffer item quarantined");
                        result.quarantined += 1;
                        events.push(((QUARANTINE_SLOT, id.clone()), id, item));
                    }
                    None => {
                        error!(id, reason = %err, "buffer item can be neither moved nor quarantined: left in place");
                        result.failed += 1;
                    }
                },
            }
        }
        // Buffer ids by event-table key (slot, sort key): one put per key.
        let puts = keyed_puts(events);
        let mut left: Vec<String> = puts.failed;
        let mut requests = puts.requests;
        // With the events, one index entry per non-empty slot of the page: playback
        // finds a slot only through the index, so its events leave the buffer only once both are written.
        let slots: BTreeSet<i64> =
            puts.sources.keys().map(|(slot, _)| *slot).filter(|s| *s >= 0 && !indexed.contains(s)).collect();
        requests.extend(slots.iter().filter_map(|&slot| {
            let put = PutRequest::builder().set_item(Some(index_item(slot))).build().ok()?;
            Some(((META_SLOT, index_key(slot)), WriteRequest::builder().put_request(put).build()))
        }));
        let not_written = write_all(&self.dynamo, &self.config.event_table, requests, &self.backoff).await;
        let mut sources = puts.sources;
        let mut unindexed = BTreeSet::new();
        for key in &not_written {
            match key {
                (META_SLOT, index) => unindexed.extend(slot_of_index_key(index)),
                key => left.extend(sources.remove(key).unwrap_or_default()),
            }
        }
        indexed.extend(slots.difference(&unindexed));
        if !unindexed.is_empty() {
            warn!(slots = unindexed.len(), "slot index not written: those slots' events stay in the buffer");
            let (kept, rest): (HashMap<_, _>, HashMap<_, _>) =
                sources.into_iter().partition(|((slot, _), _)| unindexed.contains(slot));
            left.extend(kept.into_values().flatten());
            sources = rest;
        }
        // Only what is now in the event table and its index leaves the buffer.
        let ids: Vec<String> = sources.into_values().flatten().collect();
        let deletes: Vec<(String, WriteRequest)> = ids
            .iter()
            .filter_map(|id| {
                let delete = DeleteRequest::builder().set_key(Some(BufferItem::key_of(id))).build().ok()?;
                Some((id.clone(), WriteRequest::builder().delete_request(delete).build()))
            })
            .collect();
        let not_deleted: BTreeSet<String> =
            write_all(&self.dynamo, &self.config.buffer_table, deletes, &self.backoff).await.into_iter().collect();
        let moved: Vec<&String> = ids.iter().filter(|id| !not_deleted.contains(*id)).collect();
        result.moved += moved.len();
        left.extend(not_deleted);
        result.failed += left.len();
        result.oldest_left = left.iter().filter_map(|id| arrivals.get(id)).map(|(arrival, _)| *arrival).min();
        if let Some(watermark) = watermark {
            // Late: moved (so counted once) into a slot the watermark had already passed.
            let late: Vec<i64> = moved
                .iter()
                .filter_map(|id| arrivals.get(*id))
                .filter(|(arrival, _)| *arrival < watermark)
                .map(|(_, slot)| *slot)
                .collect();
            if !late.is_empty() {
                warn!(
                    late = late.len(),
                    first_slot = late.iter().min().map(|s| format_ms(*s)),
                    "late events: moved into slots already sealed"
                );
                result.late = late.len();
            }
        }
        result
    }
}

#[derive(Debug, Default)]
struct Moved {
    moved: usize,
    failed: usize,
    quarantined: usize,
    late: usize,
    oldest_left: Option<i64>,
    max_lag_ms: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_runs_go_on_until_done_or_near_the_deadline() {
        let margin = Duration::from_secs(10);
        assert_eq!(next_step(None, Duration::ZERO, margin), Next::Done);
        assert_eq!(next_step(Some("k".into()), Duration::from_secs(60), margin), Next::Page("k".into()));
        assert_eq!(next_step(Some("k".into()), Duration::from_secs(10), margin), Next::Fork("k".into()));
        assert_eq!(next_step(Some("k".into()), Duration::ZERO, margin), Next::Fork("k".into()));
    }

    #[test]
    fn segment_tasks_round_trip_as_the_documented_payload() {
        let task = SegmentTask {
            segment: 1,
            total_segments: 4,
            exclusive_start_key: Some("ab12".into()),
            pass_started_at: Some(1_000),
            ..Default::default()
        };
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"segment": 1, "total_segments": 4, "exclusive_start_key": "ab12", "pass_started_at": 1000})
        );
        assert_eq!(serde_json::from_value::<SegmentTask>(json).unwrap(), task);
    }
}
