//! `scan`: buffer table → event table. A scheduled run fans out one
//! asynchronous invocation per scan segment; a segment run moves page after
//! page (put into the event table, then delete from the buffer only what was
//! put) until its deadline nears, then hands the rest of its segment to a
//! fresh invocation of itself with the key where it stopped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
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
use crate::time::{effective_deadline, now_ms, remaining};

/// The payload of a segment run (a fork or a continuation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentTask {
    pub segment: u32,
    pub total_segments: u32,
    /// Buffer key after which to resume; absent at the segment's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<String>,
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
pub const AWS_ACTIONS: &[&str] = &["dynamodb:Scan", "dynamodb:BatchWriteItem", "lambda:InvokeFunction"];

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
        for segment in 0..total_segments {
            let task = SegmentTask { segment, total_segments, exclusive_start_key: None };
            self.fork(&task).await?;
        }
        info!(segments = total_segments, "scan started");
        Ok(ScanSummary { forked: total_segments, ..Default::default() })
    }

    async fn fork(&self, task: &SegmentTask) -> Result<()> {
        let payload = serde_json::to_value(task).map_err(|e| Error::Invoke(e.to_string()))?;
        self.invoker.invoke_async(payload).await
    }

    async fn run_segment(&self, task: SegmentTask, deadline: SystemTime) -> Result<ScanSummary> {
        let mut summary = ScanSummary::default();
        let mut start_key = task.exclusive_start_key.clone();
        loop {
            let page = self
                .dynamo
                .scan()
                .table_name(&self.config.buffer_table)
                .segment(task.segment as i32)
                .total_segments(task.total_segments as i32)
                .set_limit(self.config.page_items)
                .set_exclusive_start_key(start_key.as_deref().map(BufferItem::key_of))
                .send()
                .await
                .map_err(|e| Error::dynamo("Scan", e))?;
            summary.pages += 1;
            let moved = self.move_items(page.items().to_vec()).await;
            summary.moved += moved.moved;
            summary.failed += moved.failed;
            summary.quarantined += moved.quarantined;
            let last_key =
                page.last_evaluated_key().and_then(|k| k.get(buffer_item::KEY)).and_then(|v| v.as_s().ok()).cloned();
            match next_step(last_key, remaining(deadline), self.config.deadline_margin) {
                Next::Done => break,
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
            continued = summary.forked > 0,
            "segment scanned"
        );
        Ok(summary)
    }

    /// Moves one page: puts into the event table, then deletes from the
    /// buffer exactly the items whose put succeeded (invariant 2).
    async fn move_items(&self, items: Vec<HashMap<String, AttributeValue>>) -> Moved {
        let mut result = Moved::default();
        let mut events = Vec::new();
        let now = now_ms();
        for attributes in items {
            let Some(id) = attributes.get(buffer_item::KEY).and_then(|v| v.as_s().ok()).cloned() else {
                warn!("buffer item without a string id: left in place");
                result.failed += 1;
                continue;
            };
            let event = BufferItem::from_item(attributes.clone())
                .and_then(|b| EventItem::from_buffer(&b, self.config.time_unit_ms))
                .map(|e| e.with_retention(self.config.retention_days).moved(now));
            match event {
                Ok(event) => events.push(((event.slot, event.sort_key.clone()), id, event.to_item())),
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
        result.failed += puts.failed.len();
        let not_put = write_all(&self.dynamo, &self.config.event_table, puts.requests, &self.backoff).await;
        let mut sources = puts.sources;
        for key in &not_put {
            result.failed += sources.remove(key).map_or(0, |ids| ids.len());
        }
        // Only what is now in the event table leaves the buffer.
        let deletes: Vec<(String, WriteRequest)> = sources
            .into_values()
            .flatten()
            .filter_map(|id| {
                let delete = DeleteRequest::builder().set_key(Some(BufferItem::key_of(&id))).build().ok()?;
                Some((id, WriteRequest::builder().delete_request(delete).build()))
            })
            .collect();
        let to_delete = deletes.len();
        let not_deleted = write_all(&self.dynamo, &self.config.buffer_table, deletes, &self.backoff).await;
        result.failed += not_deleted.len();
        result.moved += to_delete - not_deleted.len();
        result
    }
}

#[derive(Debug, Default)]
struct Moved {
    moved: usize,
    failed: usize,
    quarantined: usize,
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
        let task = SegmentTask { segment: 1, total_segments: 4, exclusive_start_key: Some("ab12".into()) };
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json, serde_json::json!({"segment": 1, "total_segments": 4, "exclusive_start_key": "ab12"}));
        assert_eq!(serde_json::from_value::<SegmentTask>(json).unwrap(), task);
    }
}
