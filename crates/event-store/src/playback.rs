//! `playback`: event table → playback stream, for a time window `[start, end)`.
//! Slots are read in order with `Query` (sort key = time order), records go
//! out with `PutRecords` in full requests of 500, in order; near the
//! deadline the rest of the window goes to an asynchronous continuation
//! that carries exactly where this run stopped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};

use crate::batch::{Backoff, KINESIS_BATCH_RECORDS};
use crate::config::PlaybackConfig;
use crate::error::{Error, Result};
use crate::event_item::{self, sort_key_floor, EventItem};
use crate::invoke::Invoker;
use crate::kinesis::{put_ordered, send_put_records, Record};
use crate::time::{effective_deadline, format_ms, now_ms, parse_time, remaining, slot_of};

/// Window played back when the request names no start: the last 15 minutes.
pub const DEFAULT_WINDOW_MS: i64 = 15 * 60 * 1000;

/// The invocation payload. Times are ISO 8601 (or epoch ms).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaybackRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// Continuations only: the sort key of the last event already played in
    /// the slot of `start`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_after: Option<String>,
}

/// A validated window, in ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
    pub resume_after: Option<String>,
}

impl Window {
    /// Defaults: `end` = now, `start` = `end` - 15 minutes. `end` before
    /// `start`, a start before 1970 or a window over `max` is an error.
    pub fn parse(request: &PlaybackRequest, now: i64, max: Duration) -> Result<Self> {
        let end = request.end.as_deref().map(parse_time).transpose()?.unwrap_or(now);
        let start = request.start.as_deref().map(parse_time).transpose()?.unwrap_or(end - DEFAULT_WINDOW_MS);
        if end < start {
            return Err(Error::BadInput(format!("end {} is before start {}", format_ms(end), format_ms(start))));
        }
        if start < 0 {
            return Err(Error::BadInput("start is before 1970".into()));
        }
        let max_ms = i64::try_from(max.as_millis()).unwrap_or(i64::MAX);
        if end - start > max_ms {
            return Err(Error::BadInput(format!(
                "the window is {} hours long; at most {} per request (PLAYBACK_MAX_HOURS)",
                (end - start) / 3_600_000,
                max_ms / 3_600_000
            )));
        }
        Ok(Self { start, end, resume_after: request.resume_after.clone() })
    }

    /// The sort-key range of `slot` that lies in the window (inclusive bounds:
    /// every real key is longer than the 13-digit floor, so `[floor(a), floor(b)]`
    /// holds exactly the events of `[a, b)`).
    pub fn key_range(&self, slot: i64, unit_ms: u64) -> (String, String) {
        let from = self.start.max(slot);
        let to = self.end.min(slot + unit_ms as i64);
        (sort_key_floor(from), sort_key_floor(to))
    }
}

/// What one invocation played back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaybackSummary {
    pub start: String,
    pub end: String,
    /// Non-empty slots played.
    pub slots: usize,
    pub events: usize,
    pub first_event: Option<String>,
    pub last_event: Option<String>,
    pub put_requests: usize,
    /// Records sent twice because an earlier record of their request failed.
    pub resent: usize,
    /// Items in the event table that could not be decoded (skipped, logged).
    pub unreadable: usize,
    /// True when the rest of the window was handed to a continuation.
    pub continued: bool,
}

/// One non-empty slot played back (possibly in part, when a run stopped inside it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotPlayed {
    pub slot: i64,
    pub first_event: i64,
    pub count: usize,
}

/// Told about every non-empty slot as it is played: the local CLI prints these.
pub type SlotObserver = Arc<dyn Fn(&SlotPlayed) + Send + Sync>;

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &["dynamodb:Query", "kinesis:PutRecords", "lambda:InvokeFunction"];

pub struct Playback {
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    config: PlaybackConfig,
    invoker: Arc<dyn Invoker>,
    backoff: Backoff,
    observer: Option<SlotObserver>,
}

impl Playback {
    pub fn new(
        dynamo: aws_sdk_dynamodb::Client,
        kinesis: aws_sdk_kinesis::Client,
        config: PlaybackConfig,
        invoker: Arc<dyn Invoker>,
    ) -> Self {
        Self { dynamo, kinesis, config, invoker, backoff: Backoff::default(), observer: None }
    }

    pub fn with_observer(mut self, observer: SlotObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    pub async fn handle(&self, payload: Value, deadline: SystemTime) -> Result<PlaybackSummary> {
        let request: PlaybackRequest = if payload.is_null() {
            PlaybackRequest::default()
        } else {
            serde_json::from_value(payload).map_err(|e| Error::BadInput(format!("playback request: {e}")))?
        };
        let window = Window::parse(&request, now_ms(), self.config.max_window)?;
        let deadline = effective_deadline(deadline, SystemTime::now());
        info!(
            start = %format_ms(window.start),
            end = %format_ms(window.end),
            remaining_ms = remaining(deadline).as_millis() as u64,
            "playback run"
        );
        self.play(&window, deadline).await
    }

    pub async fn play(&self, window: &Window, deadline: SystemTime) -> Result<PlaybackSummary> {
        let unit = self.config.time_unit_ms;
        let mut summary =
            PlaybackSummary { start: format_ms(window.start), end: format_ms(window.end), ..Default::default() };
        let mut pending: Vec<Record> = Vec::new();
        let mut slot = slot_of(window.start, unit);
        let mut resume_key = window.resume_after.clone();
        while slot < window.end {
            let (from, to) = window.key_range(slot, unit);
            let mut start_key = resume_key.take().map(|k| event_key(slot, k));
            let mut in_slot = 0usize;
            let mut first_in_slot = None;
            loop {
                let page = self
                    .dynamo
                    .query()
                    .table_name(&self.config.event_table)
                    .consistent_read(true)
                    .key_condition_expression("#slot = :slot AND #sk BETWEEN :from AND :to")
                    .expression_attribute_names("#slot", event_item::PARTITION_KEY)
                    .expression_attribute_names("#sk", event_item::SORT_KEY)
                    .expression_attribute_values(":slot", AttributeValue::N(slot.to_string()))
                    .expression_attribute_values(":from", AttributeValue::S(from.clone()))
                    .expression_attribute_values(":to", AttributeValue::S(to.clone()))
                    .set_limit(self.config.page_items)
                    .set_exclusive_start_key(start_key.take())
                    .send()
                    .await
                    .map_err(|e| Error::dynamo("Query", e))?;
                for item in page.items() {
                    match EventItem::from_item(item.clone()).and_then(|e| Ok((e.bytes()?, e))) {
                        Ok((data, event)) => {
                            first_in_slot.get_or_insert(event.arrival);
                            summary.first_event.get_or_insert_with(|| format_ms(event.arrival));
                            summary.last_event = Some(format_ms(event.arrival));
                            in_slot += 1;
                            pending.push(Record { partition_key: event.partition_key.clone(), data });
                        }
                        Err(err) => {
                            warn!(slot, error = %err, "event item skipped");
                            summary.unreadable += 1;
                        }
                    }
                }
                // Send only full requests here; the rest waits for more events.
                let full = pending.len() - pending.len() % KINESIS_BATCH_RECORDS;
                if full > 0 {
                    self.put(&pending[..full], &mut summary).await?;
                    pending.drain(..full);
                }
                let last_key = page
                    .last_evaluated_key()
                    .and_then(|k| k.get(event_item::SORT_KEY))
                    .and_then(|v| v.as_s().ok())
                    .cloned();
                if remaining(deadline) <= self.config.deadline_margin {
                    self.put(&pending, &mut summary).await?;
                    pending.clear();
                    self.slot_done(slot, first_in_slot, in_slot, &mut summary);
                    let next = match last_key {
                        Some(key) => Window { start: window.start.max(slot), end: window.end, resume_after: Some(key) },
                        None => Window { start: slot + unit as i64, end: window.end, resume_after: None },
                    };
                    if next.start < window.end {
                        self.continue_with(&next).await?;
                        summary.continued = true;
                    }
                    return Ok(summary);
                }
                match last_key {
                    Some(key) => start_key = Some(event_key(slot, key)),
                    None => break,
                }
            }
            self.slot_done(slot, first_in_slot, in_slot, &mut summary);
            slot += unit as i64;
        }
        self.put(&pending, &mut summary).await?;
        info!(slots = summary.slots, events = summary.events, requests = summary.put_requests, "playback done");
        Ok(summary)
    }

    async fn put(&self, records: &[Record], summary: &mut PlaybackSummary) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let stream = self.config.playback_stream.as_str();
        let stats = put_ordered(records, &self.backoff, |batch| async move {
            send_put_records(&self.kinesis, stream, &batch).await
        })
        .await?;
        summary.events += records.len();
        summary.put_requests += stats.requests;
        summary.resent += stats.resent;
        Ok(())
    }

    /// Counts a slot and logs the original's line: `<slot>: <first event time> [<count>]`.
    fn slot_done(&self, slot: i64, first: Option<i64>, count: usize, summary: &mut PlaybackSummary) {
        let Some(first) = first else { return };
        summary.slots += 1;
        info!(slot = %format_ms(slot), first = %format_ms(first), count, "{}: {} [{count}]", format_ms(slot), format_ms(first));
        if let Some(observer) = &self.observer {
            observer(&SlotPlayed { slot, first_event: first, count });
        }
    }

    async fn continue_with(&self, next: &Window) -> Result<()> {
        let request = PlaybackRequest {
            start: Some(format_ms(next.start)),
            end: Some(format_ms(next.end)),
            resume_after: next.resume_after.clone(),
        };
        info!(start = ?request.start, resume_after = ?request.resume_after, "playback continues asynchronously");
        let payload = serde_json::to_value(&request).map_err(|e| Error::Invoke(e.to_string()))?;
        self.invoker.invoke_async(payload).await
    }
}

fn event_key(slot: i64, sort_key: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (event_item::PARTITION_KEY.to_owned(), AttributeValue::N(slot.to_string())),
        (event_item::SORT_KEY.to_owned(), AttributeValue::S(sort_key)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::sort_key;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn window_defaults_to_the_last_15_minutes() {
        let now = 1_800_000_000_000;
        let w = Window::parse(&PlaybackRequest::default(), now, DAY).unwrap();
        assert_eq!((w.start, w.end), (now - 900_000, now));
        let only_start = PlaybackRequest { start: Some("1970-01-01T00:00:01Z".into()), ..Default::default() };
        assert!(Window::parse(&only_start, now, DAY).is_err(), "decades: over the maximum");
        let recent = PlaybackRequest { start: Some(format_ms(now - 3_600_000)), ..Default::default() };
        assert_eq!(Window::parse(&recent, now, DAY).unwrap().start, now - 3_600_000);
    }

    #[test]
    fn reversed_or_unparseable_windows_are_bad_input() {
        let reversed = PlaybackRequest {
            start: Some("2026-01-02T00:00:00Z".into()),
            end: Some("2026-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(Window::parse(&reversed, 0, DAY), Err(Error::BadInput(_))));
        let too_long = PlaybackRequest {
            start: Some("2026-01-01T00:00:00Z".into()),
            end: Some("2026-01-03T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(Window::parse(&too_long, 0, DAY), Err(Error::BadInput(m)) if m.contains("48 hours")));
        let before_1970 = PlaybackRequest {
            start: Some("1969-12-31T23:00:00Z".into()),
            end: Some("1970-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(Window::parse(&before_1970, 0, DAY), Err(Error::BadInput(_))));
        let garbage = PlaybackRequest { start: Some("last tuesday".into()), ..Default::default() };
        assert!(matches!(Window::parse(&garbage, 0, DAY), Err(Error::BadInput(_))));
    }

    #[test]
    fn key_ranges_clip_the_first_and_last_slot_to_the_window() {
        let w = Window { start: 1_500, end: 3_250, resume_after: None };
        let (from, to) = w.key_range(1_000, 1000);
        assert!(sort_key(1_499, "s:1") < from && from <= sort_key(1_500, "s:1"));
        assert!(sort_key(1_999, "s:9") <= to);
        let (from, to) = w.key_range(3_000, 1000);
        assert!(from <= sort_key(3_000, "s:1"));
        assert!(sort_key(3_249, "s:1") <= to && to < sort_key(3_250, "s:1"));
    }
}
