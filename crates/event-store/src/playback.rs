//! `playback`: event table → playback stream, for a time window `[start, end)`.
//!
//! - Only sealed slots: the window must end at or before the slot holding
//!   the scan's completeness watermark (by default it ends there); a later
//!   `end` waits up to `wait_seconds`, or the run answers `incomplete`.
//! - Only non-empty slots: the slot index names them, so an empty slot costs
//!   no query.
//! - Pipelined: the next slots are queried while the current batch is put;
//!   records go out in order with `PutRecords` in requests of 500, paced to
//!   `max_records_per_second` (default: the stream's open shards × 1,000).
//! - Resumable: after every put a checkpoint (slot, last sort key, next
//!   playback sequence number) is saved under the run's id; the same request
//!   again, or the continuation handed over near the deadline, starts from
//!   it, so a crash repeats at most one batch.
//! - Every record carries the original event time and a playback sequence
//!   number, so consumers can check order and drop duplicates.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::batch::{Backoff, KINESIS_BATCH_RECORDS};
use crate::config::PlaybackConfig;
use crate::error::{Error, Result};
use crate::event_item::{self, sort_key_floor, EventItem};
use crate::invoke::Invoker;
use crate::kinesis::{put_ordered, send_put_records, Record};
use crate::meta::{load_checkpoint, read_index, read_watermark, save_checkpoint, Checkpoint};
use crate::time::{effective_deadline, format_ms, now_ms, parse_time, remaining, slot_of};

/// Window played back when the request names no start: the 15 minutes before its end.
pub const DEFAULT_WINDOW_MS: i64 = 15 * 60 * 1000;
/// Slots whose first page is queried ahead of the one being put.
const QUERY_AHEAD: usize = 8;
/// Pages fetched but not yet consumed (memory bound: about this many MB).
const PAGES_AHEAD: usize = 4;
/// Kinesis' write limits per shard.
const RECORDS_PER_SHARD_SECOND: u64 = 1000;
const BYTES_PER_SHARD_SECOND: u64 = 1024 * 1024;

/// The invocation payload. Times are ISO 8601 (or epoch ms).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaybackRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// Default: the end of the last sealed slot (the watermark's slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// When `end` is past the watermark: how long to wait for it (default 0: answer `incomplete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    /// Pace of delivery; default: the playback stream's open shards × 1,000 (and × 1 MiB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records_per_second: Option<u64>,
    /// Only events whose JSON matches every filter are played.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<Filter>,
    /// Names the run's checkpoint; default: derived from start, end and filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Play again from the start even if a checkpoint says this run is done.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart: bool,
    /// Continuations only: where the previous run stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<Checkpoint>,
}

/// `field` is a JSON pointer into the event (`/path`, `/query/page`); the
/// event matches when the value there equals `equals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    pub field: String,
    pub equals: Value,
}

impl Filter {
    pub fn matches(&self, event: Option<&Value>) -> bool {
        event.and_then(|e| e.pointer(&self.field)) == Some(&self.equals)
    }
}

/// A validated window, in ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

impl Window {
    /// `end` defaults to `default_end` (the sealed bound), `start` to 15
    /// minutes before `end`. `end` before `start`, a start before 1970 or a
    /// window over `max` is an error.
    pub fn parse(request: &PlaybackRequest, default_end: i64, max: Duration) -> Result<Self> {
        let end = request.end.as_deref().map(parse_time).transpose()?.unwrap_or(default_end);
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
        Ok(Self { start, end })
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

/// The id of a run when the request names none: the same window and filter give the same id.
pub fn run_id(window: &Window, filter: &[Filter]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(format!("{}-{}-", window.start, window.end));
    hasher.update(serde_json::to_vec(filter).unwrap_or_default());
    hex::encode(&hasher.finalize()[..8])
}

/// How a run ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Everything up to `end` is on the stream.
    #[default]
    Complete,
    /// The rest was handed to an asynchronous continuation.
    Continued,
    /// `end` is past the watermark (after waiting `wait_seconds`): nothing played.
    Incomplete,
    /// A checkpoint says this run already finished (send `restart: true` to play again).
    AlreadyDone,
}

/// What one invocation played back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaybackSummary {
    pub id: String,
    pub status: Status,
    pub start: String,
    pub end: String,
    /// The completeness watermark when the run began.
    pub watermark: Option<String>,
    /// Events the scan moved after the watermark had passed them (all time; see the README).
    pub late_events: u64,
    /// Non-empty slots this run read (from the slot index).
    pub slots: usize,
    pub events: usize,
    /// Events skipped by the filter.
    pub filtered_out: usize,
    pub first_event: Option<String>,
    pub last_event: Option<String>,
    /// `Query` requests for events, and for the slot index.
    pub queries: usize,
    pub index_queries: usize,
    pub put_requests: usize,
    /// Records sent twice because an earlier record of their request failed.
    pub resent: usize,
    /// Items in the event table that could not be decoded (skipped, logged).
    pub unreadable: usize,
    /// The playback sequence number the next record would get.
    pub next_seq: u64,
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

/// What a run tells an observer (the local CLI draws its progress bar from these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The non-empty slots this run will read.
    Planned {
        slots: usize,
    },
    Slot(SlotPlayed),
}

pub type ProgressObserver = Arc<dyn Fn(&Progress) + Send + Sync>;

/// The record a consumer of the playback stream receives: the event and where it came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlayedEvent {
    /// Position in this playback, from 0; a record seen again with a number
    /// already seen is a duplicate.
    pub playback_seq: u64,
    /// The event's arrival time (Kinesis approximate arrival), ISO 8601 and ms.
    pub event_time: String,
    pub event_ms: i64,
    pub event_id: String,
    pub partition_key: String,
    /// The event itself when it is JSON...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// ...else its bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
}

impl PlayedEvent {
    pub fn new(event: &EventItem, json: Option<Value>, bytes: &[u8], seq: u64) -> Self {
        use base64::Engine;
        let data_base64 = json.is_none().then(|| base64::engine::general_purpose::STANDARD.encode(bytes));
        Self {
            playback_seq: seq,
            event_time: format_ms(event.arrival),
            event_ms: event.arrival,
            event_id: event.event_id.clone(),
            partition_key: event.partition_key.clone(),
            data: json,
            data_base64,
        }
    }
}

/// Paces puts to a rate in records and bytes per second. The first request
/// goes at once; each next one waits until the ones before it fit the rate.
#[derive(Debug, Clone)]
pub struct Pacer {
    records_per_second: f64,
    bytes_per_second: f64,
    records: u64,
    bytes: u64,
}

impl Pacer {
    pub fn new(records_per_second: u64, bytes_per_second: u64) -> Self {
        Self {
            records_per_second: records_per_second.max(1) as f64,
            bytes_per_second: bytes_per_second.max(1) as f64,
            records: 0,
            bytes: 0,
        }
    }

    /// Time from the start before the next request may go.
    pub fn next_at(&self) -> Duration {
        let by_records = self.records as f64 / self.records_per_second;
        let by_bytes = self.bytes as f64 / self.bytes_per_second;
        Duration::from_secs_f64(by_records.max(by_bytes))
    }

    pub fn sent(&mut self, records: usize, bytes: usize) {
        self.records += records as u64;
        self.bytes += bytes as u64;
    }
}

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:Query",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "kinesis:PutRecords",
    "kinesis:DescribeStreamSummary",
    "lambda:InvokeFunction",
];

pub struct Playback {
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    config: PlaybackConfig,
    invoker: Arc<dyn Invoker>,
    backoff: Backoff,
    observer: Option<ProgressObserver>,
}

/// The pace of one run's puts, and the deadline it must not wait into (none: the last put).
struct Pace<'a> {
    pacer: &'a mut Pacer,
    started: Instant,
    deadline: Option<SystemTime>,
}

/// One page of one slot, decoded.
struct Page {
    slot: i64,
    events: Vec<EventItem>,
    unreadable: usize,
    /// Set when the slot has more pages.
    last_key: Option<String>,
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

    pub fn with_observer(mut self, observer: ProgressObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    fn tell(&self, progress: Progress) {
        if let Some(observer) = &self.observer {
            observer(&progress);
        }
    }

    pub async fn handle(&self, payload: Value, deadline: SystemTime) -> Result<PlaybackSummary> {
        let request: PlaybackRequest = if payload.is_null() {
            PlaybackRequest::default()
        } else {
            serde_json::from_value(payload).map_err(|e| Error::BadInput(format!("playback request: {e}")))?
        };
        for filter in &request.filter {
            if !(filter.field.is_empty() || filter.field.starts_with('/')) {
                return Err(Error::BadInput(format!("filter field {:?} is not a JSON pointer (/a/b)", filter.field)));
            }
        }
        let deadline = effective_deadline(deadline, SystemTime::now());
        let unit = self.config.time_unit_ms;
        let table = self.config.event_table.as_str();

        // Sealed: every slot before the watermark's slot is complete.
        let mut watermark = read_watermark(&self.dynamo, table).await?;
        let sealed = |w: &crate::meta::Watermark| w.time.map(|t| slot_of(t, unit));
        let requested_end = request.end.as_deref().map(parse_time).transpose()?;
        let waited = Instant::now();
        let wait = Duration::from_secs(request.wait_seconds.unwrap_or(0));
        while let (Some(end), true) = (requested_end, wait > Duration::ZERO) {
            if sealed(&watermark).is_some_and(|s| s >= end)
                || waited.elapsed() >= wait
                || remaining(deadline) <= self.config.deadline_margin
            {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            watermark = read_watermark(&self.dynamo, table).await?;
        }
        // Without a watermark yet, `end` defaults to now: the window is valid but not complete.
        let window = Window::parse(&request, sealed(&watermark).unwrap_or_else(now_ms), self.config.max_window)?;
        let id = request.id.clone().unwrap_or_else(|| run_id(&window, &request.filter));
        let mut summary = PlaybackSummary {
            id: id.clone(),
            start: format_ms(window.start),
            end: format_ms(window.end),
            watermark: watermark.time.map(format_ms),
            late_events: watermark.late,
            ..Default::default()
        };
        // A continuation's window was found complete by the run that started it.
        if request.resume.is_none() && sealed(&watermark).is_none_or(|sealed_end| window.end > sealed_end) {
            info!(id, end = %summary.end, watermark = ?summary.watermark, "window not yet complete");
            summary.status = Status::Incomplete;
            return Ok(summary);
        }

        let saved = if request.restart { None } else { load_checkpoint(&self.dynamo, table, &id).await? };
        if saved.as_ref().is_some_and(|c| c.done) {
            info!(id, "already played back; send restart: true to play it again");
            summary.status = Status::AlreadyDone;
            summary.events = saved.map_or(0, |c| c.events as usize);
            return Ok(summary);
        }
        let from_request =
            request.resume.clone().unwrap_or(Checkpoint { slot: slot_of(window.start, unit), ..Default::default() });
        // The further of the two: a retried request resumes where its predecessor saved.
        let position = match saved {
            Some(saved) if (saved.slot, &saved.after) > (from_request.slot, &from_request.after) => saved,
            _ => from_request,
        };
        info!(
            id,
            start = %summary.start,
            end = %summary.end,
            from_slot = %format_ms(position.slot),
            seq = position.seq,
            remaining_ms = remaining(deadline).as_millis() as u64,
            "playback run"
        );
        let pacer = match request.max_records_per_second {
            Some(rate) => Pacer::new(rate, u64::MAX),
            None => {
                let shards = self.open_shards().await?;
                Pacer::new(shards * RECORDS_PER_SHARD_SECOND, shards * BYTES_PER_SHARD_SECOND)
            }
        };
        self.play(&window, position, &request, pacer, deadline, summary).await
    }

    async fn open_shards(&self) -> Result<u64> {
        let out = self
            .kinesis
            .describe_stream_summary()
            .stream_name(&self.config.playback_stream)
            .send()
            .await
            .map_err(|e| Error::kinesis("DescribeStreamSummary", e))?;
        Ok(out.stream_description_summary().map_or(1, |s| s.open_shard_count().max(1) as u64))
    }

    async fn play(
        &self,
        window: &Window,
        position: Checkpoint,
        request: &PlaybackRequest,
        mut pacer: Pacer,
        deadline: SystemTime,
        mut summary: PlaybackSummary,
    ) -> Result<PlaybackSummary> {
        let unit = self.config.time_unit_ms;
        let table = self.config.event_table.as_str();
        let (mut slots, index_queries) = read_index(&self.dynamo, table, position.slot, window.end).await?;
        slots.retain(|s| *s + unit as i64 > window.start);
        summary.index_queries = index_queries;
        summary.slots = slots.len();
        self.tell(Progress::Planned { slots: slots.len() });

        let (tx, mut rx) = mpsc::channel::<Result<Page>>(PAGES_AHEAD);
        let producer = self.fetch_pages(window, slots, position.clone(), tx);
        let consumer = async move {
            let started = Instant::now();
            let mut seq = position.seq;
            let mut checkpoint = position.clone();
            // Records not yet put, each with its event's (slot, sort key).
            let mut pending: Vec<((i64, String), Record)> = Vec::new();
            let mut slot_first: Option<i64> = None;
            let mut slot_count = 0usize;
            while let Some(page) = rx.recv().await {
                let page = page?;
                summary.queries += 1;
                summary.unreadable += page.unreadable;
                for event in page.events {
                    let bytes = match event.bytes() {
                        Ok(bytes) => bytes,
                        Err(err) => {
                            warn!(slot = page.slot, error = %err, "event skipped");
                            summary.unreadable += 1;
                            continue;
                        }
                    };
                    let json: Option<Value> = serde_json::from_slice(&bytes).ok();
                    if !request.filter.iter().all(|f| f.matches(json.as_ref())) {
                        summary.filtered_out += 1;
                        continue;
                    }
                    slot_first.get_or_insert(event.arrival);
                    slot_count += 1;
                    summary.first_event.get_or_insert_with(|| format_ms(event.arrival));
                    summary.last_event = Some(format_ms(event.arrival));
                    let played = PlayedEvent::new(&event, json, &bytes, seq);
                    let data = serde_json::to_vec(&played).map_err(|e| Error::Malformed(e.to_string()))?;
                    seq += 1;
                    pending.push(((page.slot, event.sort_key), Record { partition_key: event.partition_key, data }));
                }
                while pending.len() >= KINESIS_BATCH_RECORDS {
                    let batch: Vec<_> = pending.drain(..KINESIS_BATCH_RECORDS).collect();
                    let next = seq - pending.len() as u64;
                    let pace = Pace { pacer: &mut pacer, started, deadline: Some(deadline) };
                    if !self.put(&batch, next, pace, &mut checkpoint, &mut summary).await? {
                        // Pacing would cross the deadline: the next run starts after the last put.
                        return self.hand_over(request, window, checkpoint.clone(), summary).await;
                    }
                }
                if page.last_key.is_none() {
                    if let Some(first) = slot_first.take() {
                        self.tell(Progress::Slot(SlotPlayed {
                            slot: page.slot,
                            first_event: first,
                            count: slot_count,
                        }));
                        info!(slot = %format_ms(page.slot), first = %format_ms(first), count = slot_count, "{}: {} [{slot_count}]", format_ms(page.slot), format_ms(first));
                    }
                    slot_count = 0;
                }
                if remaining(deadline) <= self.config.deadline_margin {
                    let batch = std::mem::take(&mut pending);
                    let pace = Pace { pacer: &mut pacer, started, deadline: Some(deadline) };
                    if !self.put(&batch, seq, pace, &mut checkpoint, &mut summary).await? {
                        return self.hand_over(request, window, checkpoint.clone(), summary).await;
                    }
                    // Everything consumed so far is done, filtered events included.
                    let resume = match page.last_key {
                        Some(key) => Checkpoint { slot: page.slot, after: Some(key), seq, ..checkpoint.clone() },
                        None => Checkpoint { slot: page.slot + unit as i64, after: None, seq, ..checkpoint.clone() },
                    };
                    save_checkpoint(&self.dynamo, table, &summary.id, &resume).await?;
                    return self.hand_over(request, window, resume, summary).await;
                }
            }
            let batch = std::mem::take(&mut pending);
            let pace = Pace { pacer: &mut pacer, started, deadline: None };
            self.put(&batch, seq, pace, &mut checkpoint, &mut summary).await?;
            checkpoint.done = true;
            checkpoint.seq = seq;
            save_checkpoint(&self.dynamo, table, &summary.id, &checkpoint).await?;
            summary.next_seq = seq;
            info!(
                id = %summary.id,
                slots = summary.slots,
                events = summary.events,
                queries = summary.queries,
                requests = summary.put_requests,
                "playback done"
            );
            Ok(summary)
        };
        let ((), result) = tokio::join!(producer, consumer);
        result
    }

    /// Queries the slots' pages in order into `tx`: the first pages of the
    /// next slots are in flight together; a slot's further pages follow one
    /// by one. Stops when the consumer hangs up.
    async fn fetch_pages(&self, window: &Window, slots: Vec<i64>, from: Checkpoint, tx: mpsc::Sender<Result<Page>>) {
        let first_pages = futures::stream::iter(slots)
            .map(|slot| {
                let after = if slot == from.slot { from.after.clone() } else { None };
                async move { self.query_page(window, slot, after).await }
            })
            .buffered(QUERY_AHEAD);
        futures::pin_mut!(first_pages);
        while let Some(mut page) = first_pages.next().await {
            loop {
                let next = page.as_ref().ok().and_then(|p| p.last_key.clone().map(|k| (p.slot, k)));
                if tx.send(page).await.is_err() {
                    return;
                }
                match next {
                    Some((slot, key)) => page = self.query_page(window, slot, Some(key)).await,
                    None => break,
                }
            }
        }
    }

    async fn query_page(&self, window: &Window, slot: i64, after: Option<String>) -> Result<Page> {
        let (from, to) = window.key_range(slot, self.config.time_unit_ms);
        let out = self
            .dynamo
            .query()
            .table_name(&self.config.event_table)
            .consistent_read(true)
            .key_condition_expression("#slot = :slot AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#slot", event_item::PARTITION_KEY)
            .expression_attribute_names("#sk", event_item::SORT_KEY)
            .expression_attribute_values(":slot", AttributeValue::N(slot.to_string()))
            .expression_attribute_values(":from", AttributeValue::S(from))
            .expression_attribute_values(":to", AttributeValue::S(to))
            .set_limit(self.config.page_items)
            .set_exclusive_start_key(after.map(|key| event_key(slot, key)))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        let mut page = Page { slot, events: Vec::new(), unreadable: 0, last_key: None };
        for item in out.items() {
            match EventItem::from_item(item.clone()) {
                Ok(event) => page.events.push(event),
                Err(err) => {
                    warn!(slot, error = %err, "event item skipped");
                    page.unreadable += 1;
                }
            }
        }
        page.last_key =
            out.last_evaluated_key().and_then(|k| k.get(event_item::SORT_KEY)).and_then(|v| v.as_s().ok()).cloned();
        Ok(page)
    }

    /// Hands the rest of the window, from `resume`, to a continuation.
    async fn hand_over(
        &self,
        request: &PlaybackRequest,
        window: &Window,
        resume: Checkpoint,
        mut summary: PlaybackSummary,
    ) -> Result<PlaybackSummary> {
        summary.next_seq = resume.seq;
        self.continue_with(request, window, resume, &summary.id).await?;
        summary.status = Status::Continued;
        summary.continued = true;
        Ok(summary)
    }

    /// Puts `batch` in order, at the pace, then saves the checkpoint after its
    /// last event. Returns false, sending nothing, when waiting for the pace
    /// would run into the deadline margin and this run has already put
    /// something (so every run makes progress).
    async fn put(
        &self,
        batch: &[((i64, String), Record)],
        next_seq: u64,
        pace: Pace<'_>,
        checkpoint: &mut Checkpoint,
        summary: &mut PlaybackSummary,
    ) -> Result<bool> {
        let Some(((slot, sort_key), _)) = batch.last() else { return Ok(true) };
        let records: Vec<Record> = batch.iter().map(|(_, r)| r.clone()).collect();
        let wait = pace.pacer.next_at().saturating_sub(pace.started.elapsed());
        if let Some(deadline) = pace.deadline {
            if summary.put_requests > 0 && remaining(deadline) <= self.config.deadline_margin + wait {
                return Ok(false);
            }
        }
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let pacer = pace.pacer;
        let stream = self.config.playback_stream.as_str();
        let stats = put_ordered(&records, &self.backoff, |batch| async move {
            send_put_records(&self.kinesis, stream, &batch).await
        })
        .await?;
        pacer.sent(records.len(), records.iter().map(Record::size).sum());
        summary.events += records.len();
        summary.put_requests += stats.requests;
        summary.resent += stats.resent;
        *checkpoint = Checkpoint {
            slot: *slot,
            after: Some(sort_key.clone()),
            seq: next_seq,
            events: checkpoint.events + records.len() as u64,
            done: false,
        };
        save_checkpoint(&self.dynamo, &self.config.event_table, &summary.id, checkpoint).await?;
        Ok(true)
    }

    async fn continue_with(
        &self,
        request: &PlaybackRequest,
        window: &Window,
        resume: Checkpoint,
        id: &str,
    ) -> Result<()> {
        let next = PlaybackRequest {
            start: Some(format_ms(window.start)),
            end: Some(format_ms(window.end)),
            wait_seconds: None,
            id: Some(id.to_owned()),
            resume: Some(resume),
            restart: false,
            ..request.clone()
        };
        info!(id, resume = ?next.resume, "playback continues asynchronously");
        let payload = serde_json::to_value(&next).map_err(|e| Error::Invoke(e.to_string()))?;
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
    fn window_defaults_to_the_15_minutes_before_the_sealed_bound() {
        let sealed = 1_800_000_000_000;
        let w = Window::parse(&PlaybackRequest::default(), sealed, DAY).unwrap();
        assert_eq!((w.start, w.end), (sealed - 900_000, sealed));
        let only_start = PlaybackRequest { start: Some("1970-01-01T00:00:01Z".into()), ..Default::default() };
        assert!(Window::parse(&only_start, sealed, DAY).is_err(), "decades: over the maximum");
        let recent = PlaybackRequest { start: Some(format_ms(sealed - 3_600_000)), ..Default::default() };
        assert_eq!(Window::parse(&recent, sealed, DAY).unwrap().start, sealed - 3_600_000);
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
        let w = Window { start: 1_500, end: 3_250 };
        let (from, to) = w.key_range(1_000, 1000);
        assert!(sort_key(1_499, "s:1") < from && from <= sort_key(1_500, "s:1"));
        assert!(sort_key(1_999, "s:9") <= to);
        let (from, to) = w.key_range(3_000, 1000);
        assert!(from <= sort_key(3_000, "s:1"));
        assert!(sort_key(3_249, "s:1") <= to && to < sort_key(3_250, "s:1"));
    }

    #[test]
    fn the_pacer_holds_both_rates_and_lets_the_first_request_go_at_once() {
        let mut pacer = Pacer::new(1000, 1_000_000);
        assert_eq!(pacer.next_at(), Duration::ZERO);
        pacer.sent(500, 50_000);
        assert_eq!(pacer.next_at(), Duration::from_millis(500));
        pacer.sent(500, 1_950_000);
        assert_eq!(pacer.next_at(), Duration::from_secs(2), "bytes are the tighter limit now");
    }

    #[test]
    fn filters_compare_the_value_at_a_json_pointer() {
        let event = serde_json::json!({"path": "/track.gif", "query": {"page": "/docs"}, "n": 3});
        let f = |field: &str, equals: Value| Filter { field: field.into(), equals };
        assert!(f("/path", "/track.gif".into()).matches(Some(&event)));
        assert!(f("/query/page", "/docs".into()).matches(Some(&event)));
        assert!(f("/n", 3.into()).matches(Some(&event)));
        assert!(!f("/n", "3".into()).matches(Some(&event)), "types must match");
        assert!(!f("/missing", Value::Null).matches(Some(&event)));
        assert!(!f("/path", "/track.gif".into()).matches(None), "binary events never match a filter");
    }

    #[test]
    fn requests_parse_strictly_and_ids_follow_window_and_filter() {
        let request: PlaybackRequest = serde_json::from_value(serde_json::json!({
            "start": "2026-11-21T10:00:00Z", "end": "2026-11-21T10:05:00Z", "wait_seconds": 30,
            "max_records_per_second": 200, "filter": [{"field": "/path", "equals": "/track.gif"}]
        }))
        .unwrap();
        assert_eq!(request.filter.len(), 1);
        assert!(
            serde_json::from_value::<PlaybackRequest>(serde_json::json!({"strat": "x"})).is_err(),
            "typos are errors"
        );
        let w = Window { start: 1, end: 2 };
        assert_eq!(run_id(&w, &[]), run_id(&w, &[]));
        assert_ne!(run_id(&w, &[]), run_id(&w, &request.filter));
        assert_ne!(run_id(&w, &[]), run_id(&Window { start: 1, end: 3 }, &[]));
    }

    #[test]
    fn played_records_carry_time_sequence_and_the_event() {
        let event = EventItem {
            slot: 1_000,
            sort_key: sort_key(1_234, "shardId-000000000000:7"),
            event_id: "shardId-000000000000:7".into(),
            arrival: 1_234,
            partition_key: "user-1".into(),
            data: None,
            encoding: None,
            payload: None,
            expires_at: None,
            moved_at: None,
        };
        let json = PlayedEvent::new(&event, Some(serde_json::json!({"a": 1})), b"{\"a\":1}", 41);
        let value = serde_json::to_value(&json).unwrap();
        assert_eq!(value["playback_seq"], 41);
        assert_eq!(value["event_time"], "1970-01-01T00:00:01.234Z");
        assert_eq!(value["data"], serde_json::json!({"a": 1}));
        assert!(value.get("data_base64").is_none());
        let binary = PlayedEvent::new(&event, None, &[0xff, 0x00], 42);
        assert_eq!(binary.data_base64.as_deref(), Some("/wA="));
    }
}
