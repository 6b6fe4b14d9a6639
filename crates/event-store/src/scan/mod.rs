//! `scan`: buffer table → event table. A scheduled run fans out one
//! asynchronous invocation per scan segment; a segment run moves page after
//! page (put into the event table, then delete from the buffer only what was
//! put) until its deadline nears, then hands the rest of its segment to a
//! fresh invocation of itself with the key where it stopped.
//!
//! [`plan`] decides, without I/O, what a page's writes are and what may be
//! deleted; this module does the I/O. With a page's events go its slots'
//! index entries, and when a segment finishes a pass it moves its part of the
//! completeness watermark forward (the rule: [`crate::bookkeeping::watermark`]).

pub mod plan;
pub mod stream;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};

use crate::batch::Backoff;
use crate::bookkeeping::watermark::{self, Pass};
use crate::buffer_item::{self, BufferItem};
use crate::config::ScanConfig;
use crate::dynamo::write_all;
use crate::error::{Error, Result};
use crate::invoke::{continue_with, Invoker};
use crate::time::{effective_deadline, format_ms, now_ms, remaining};
use plan::{buffer_deletes, Moving, PageOutcome, PagePlan};

/// The payload of a segment run (a fork or a continuation).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentTask {
    pub segment: u32,
    pub total_segments: u32,
    /// Buffer key after which to resume; absent at the segment's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<String>,
    /// The pass so far: when it started and what it has seen.
    #[serde(flatten)]
    pub pass: Pass,
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

impl ScanSummary {
    fn add(&mut self, page: &PageOutcome) {
        self.pages += 1;
        self.moved += page.moved;
        self.failed += page.failed;
        self.quarantined += page.quarantined;
        self.late += page.late;
    }
}

/// What a segment run does after a page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegmentStep {
    /// DynamoDB returned no last key: the pass over the segment is over.
    PassDone,
    NextPage(String),
    /// Too close to the deadline: a continuation goes on after this key.
    HandOver(String),
}

/// After a page: the pass is done when DynamoDB returned no last key, else
/// go on while more than `margin` is left, else hand over.
pub fn next_step(last_key: Option<String>, remaining: Duration, margin: Duration) -> SegmentStep {
    match last_key {
        None => SegmentStep::PassDone,
        Some(key) if remaining > margin => SegmentStep::NextPage(key),
        Some(key) => SegmentStep::HandOver(key),
    }
}

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:Scan",
    "dynamodb:BatchWriteItem",
    "dynamodb:UpdateItem",
    "dynamodb:Query",
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
    "lambda:InvokeFunction",
];

pub struct Scan {
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    config: ScanConfig,
    invoker: Arc<dyn Invoker>,
    backoff: Backoff,
}

impl Scan {
    pub fn new(
        dynamo: aws_sdk_dynamodb::Client,
        kinesis: aws_sdk_kinesis::Client,
        config: ScanConfig,
        invoker: Arc<dyn Invoker>,
    ) -> Self {
        Self { dynamo, kinesis, config, invoker, backoff: Backoff::default() }
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
        let pass = self.start_pass().await;
        for segment in 0..total_segments {
            let task = SegmentTask { segment, total_segments, exclusive_start_key: None, pass };
            continue_with(self.invoker.as_ref(), &task).await?;
        }
        info!(segments = total_segments, "scan started");
        Ok(ScanSummary { forked: total_segments, ..Default::default() })
    }

    async fn run_segment(&self, mut task: SegmentTask, deadline: SystemTime) -> Result<ScanSummary> {
        let mut summary = ScanSummary::default();
        let mut start_key = task.exclusive_start_key.clone();
        // Events arriving before the current watermark are late: counted, never misplaced.
        let watermark = match task.pass.pass_started_at {
            Some(_) => watermark::read(&self.dynamo, &self.config.event_table).await?.time,
            None => None,
        };
        // Slots this run has already indexed: each gets one index write per run, not one per page.
        let mut indexed = BTreeSet::new();
        loop {
            let (items, last_key) = self.scan_page(&task, start_key.take()).await?;
            let page = self.move_page(items, watermark, &mut indexed).await;
            summary.add(&page);
            task.pass.saw(page.oldest_left);
            self.count_late(&task, &page).await;
            match next_step(last_key, remaining(deadline), self.config.deadline_margin) {
                SegmentStep::PassDone => {
                    summary.watermark = self.finish_pass(&task).await?;
                    break;
                }
                SegmentStep::NextPage(key) => start_key = Some(key),
                SegmentStep::HandOver(key) => {
                    let next = SegmentTask { exclusive_start_key: Some(key), ..task.clone() };
                    continue_with(self.invoker.as_ref(), &next).await?;
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

    /// One page of the task's segment after `start_key`, and the key to go on from.
    async fn scan_page(
        &self,
        task: &SegmentTask,
        start_key: Option<String>,
    ) -> Result<(Vec<HashMap<String, AttributeValue>>, Option<String>)> {
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
        let last_key =
            page.last_evaluated_key().and_then(|k| k.get(buffer_item::HASH_KEY)).and_then(|v| v.as_s().ok()).cloned();
        Ok((page.items().to_vec(), last_key))
    }

    /// Moves one page: puts its events and index entries into the event
    /// table, then deletes from the buffer exactly what [`PagePlan::settle`] allows.
    async fn move_page(
        &self,
        items: Vec<HashMap<String, AttributeValue>>,
        watermark: Option<i64>,
        indexed: &mut BTreeSet<i64>,
    ) -> PageOutcome {
        let moving = Moving {
            time_unit_ms: self.config.time_unit_ms,
            retention_days: self.config.retention_days,
            now_ms: now_ms(),
        };
        let mut plan = PagePlan::new(items, moving, indexed);
        let writes = std::mem::take(&mut plan.writes);
        let not_written = write_all(&self.dynamo, &self.config.event_table, writes, &self.backoff).await;
        let settled = plan.settle(&not_written);
        indexed.extend(&settled.indexed);
        if !settled.unindexed.is_empty() {
            warn!(slots = settled.unindexed.len(), "slot index not written: those slots' events stay in the buffer");
        }
        let deletes = buffer_deletes(&settled.delete);
        let not_deleted = write_all(&self.dynamo, &self.config.buffer_table, deletes, &self.backoff).await;
        let outcome = plan.outcome(settled, &not_deleted, watermark);
        if outcome.late > 0 {
            warn!(
                late = outcome.late,
                first_slot = outcome.first_late_slot.map(format_ms),
                "late events: moved into slots already sealed"
            );
        }
        outcome
    }

    /// Adds the page's late events to the segment's count (best effort: logged if it fails).
    async fn count_late(&self, task: &SegmentTask, page: &PageOutcome) {
        if page.late == 0 {
            return;
        }
        let (table, segment, total) = (&self.config.event_table, task.segment, task.total_segments);
        if let Err(err) = watermark::count_late(&self.dynamo, table, segment, total, page.late).await {
            warn!(error = %err, late = page.late, "late events moved but not counted");
        }
    }

    /// A new pass: its start, and what the event stream holds that the pump
    /// has not buffered yet. If the stream cannot be asked, the pass moves
    /// events but no watermark.
    async fn start_pass(&self) -> Pass {
        let started = now_ms();
        let (stream, table) = (&self.config.event_stream, &self.config.event_table);
        match stream::unbuffered_from(&self.kinesis, &self.dynamo, stream, table).await {
            Ok(unbuffered_from) => {
                if let Some(from) = unbuffered_from {
                    info!(unbuffered_from = %format_ms(from), "records in the stream not buffered yet hold the watermark");
                }
                Pass::started_at(started, unbuffered_from)
            }
            Err(err) => {
                warn!(error = %err, "event stream not readable: this pass moves no watermark");
                Pass::default()
            }
        }
    }

    /// A segment's pass is over: its part of the watermark moves forward.
    async fn finish_pass(&self, task: &SegmentTask) -> Result<Option<i64>> {
        let Some(time) = task.pass.watermark(self.config.watermark_lag_ms) else { return Ok(None) };
        let table = &self.config.event_table;
        watermark::advance(&self.dynamo, table, task.segment, task.total_segments, time, now_ms()).await?;
        Ok(Some(time))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_runs_go_on_until_done_or_near_the_deadline() {
        let margin = Duration::from_secs(10);
        assert_eq!(next_step(None, Duration::ZERO, margin), SegmentStep::PassDone);
        assert_eq!(next_step(Some("k".into()), Duration::from_secs(60), margin), SegmentStep::NextPage("k".into()));
        assert_eq!(next_step(Some("k".into()), Duration::from_secs(10), margin), SegmentStep::HandOver("k".into()));
        assert_eq!(next_step(Some("k".into()), Duration::ZERO, margin), SegmentStep::HandOver("k".into()));
    }

    #[test]
    fn segment_tasks_round_trip_as_the_documented_payload() {
        let task = SegmentTask {
            segment: 1,
            total_segments: 4,
            exclusive_start_key: Some("ab12".into()),
            pass: Pass::started_at(1_000, Some(900)),
        };
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "segment": 1, "total_segments": 4, "exclusive_start_key": "ab12",
                "pass_started_at": 1000, "unbuffered_from": 900
            })
        );
        assert_eq!(serde_json::from_value::<SegmentTask>(json).unwrap(), task);
    }
}
