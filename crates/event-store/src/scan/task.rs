//! What a segment run is given and what it reports: its payload (a fork
//! or a continuation), its summary, and after each page whether the pass
//! goes on, is done, or hands over.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::plan::PageOutcome;

/// The payload of a segment run (a fork or a continuation). Nothing in it
/// is trusted: a scheduled pass's start, what the stream held back and
/// where the pass stands are read from its stored state
/// ([`crate::bookkeeping::segment_pass`]), found by the token; unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegmentTask {
    pub segment: u32,
    pub total_segments: u32,
    /// The scheduled pass this run belongs to. Absent for a run started by
    /// hand, which moves events but no watermark.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass: Option<String>,
    /// Runs started by hand only: the buffer key after which to resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_start_key: Option<String>,
    /// Continuations so far in this chain (bounded by `MAX_CONTINUATIONS`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hop: u32,
}

fn is_zero(hop: &u32) -> bool {
    *hop == 0
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
    /// Events moved after the watermark had passed their arrival time (docs/http-api.md: the late-event policy).
    pub late: usize,
    /// Buffer items that can neither move nor be quarantined (what names them): they hold the
    /// watermark until someone removes them (docs/operations: a stuck buffer item).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stuck: Vec<String>,
    /// The watermark this run moved its segment's part to, when it finished a pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark: Option<i64>,
    /// The watermark (the lowest of all segments' parts) once this run's pass ended and moved
    /// its part: the watermark-lag metric is now less this (a segment that stalls holds it).
    #[serde(default, rename = "sealed_to", skip_serializing_if = "Option::is_none")]
    pub complete_to: Option<i64>,
    /// A starting run: the watermark when it started the segments (ms); the awake run tells
    /// the subscriptions when it moved (absent until every segment has finished a pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watermark_at_start: Option<i64>,
    /// Moved events by the minute of their arrival (written to the ingest count at the run's end).
    #[serde(skip)]
    pub per_minute: std::collections::BTreeMap<i64, u64>,
    /// Segments a scheduled run left alone because their last pass still runs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub busy: u32,
    /// This run's pass token was not the segment's running pass: nothing done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub superseded: bool,
    /// The chain reached `MAX_CONTINUATIONS` and stopped (the next schedule starts the segment over).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped: bool,
}

impl ScanSummary {
    pub(super) fn add(&mut self, page: &PageOutcome) {
        self.pages += 1;
        self.moved += page.moved;
        self.failed += page.failed;
        self.quarantined += page.quarantined;
        self.late += page.late;
        self.stuck.extend(page.stuck.iter().cloned());
        for (minute, events) in &page.per_minute {
            *self.per_minute.entry(*minute).or_insert(0) += events;
        }
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
pub(crate) fn next_step(last_key: Option<String>, remaining: Duration, margin: Duration) -> SegmentStep {
    match last_key {
        None => SegmentStep::PassDone,
        Some(key) if remaining > margin => SegmentStep::NextPage(key),
        Some(key) => SegmentStep::HandOver(key),
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
        let task =
            SegmentTask { segment: 1, total_segments: 4, pass: Some("5f0c".into()), hop: 3, ..Default::default() };
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json, serde_json::json!({"segment": 1, "total_segments": 4, "pass": "5f0c", "hop": 3}));
        assert_eq!(serde_json::from_value::<SegmentTask>(json).unwrap(), task);
        let forged = serde_json::json!({"segment": 1, "total_segments": 4, "pass_started_at": 9_999_999_999_999i64});
        assert!(serde_json::from_value::<SegmentTask>(forged).is_err(), "a pass's start is never taken from a payload");
    }
}
