//! `playback`: event table → playback stream, for a time window `[start, end)`.
//!
//! - Only sealed slots: the window must end at or before the slot holding
//!   the completeness watermark (by default it ends there); a later `end`
//!   waits up to `wait_seconds`, or the run answers `incomplete`.
//! - Only non-empty slots: the slot index names them, so an empty slot costs
//!   no query.
//! - Pipelined: the next slots are queried ([`reader`]) while the current
//!   batch is put ([`run`]); records go out in order with `PutRecords` in
//!   requests of 500, paced ([`pacer`]) to `max_records_per_second`
//!   (default: the stream's open shards × 1,000).
//! - Resumable: after every put a [`checkpoint`] is saved under the run's id;
//!   the same request again, or the continuation handed over near the
//!   deadline, starts from it, so a crash repeats at most one batch.
//! - Every [`record`] carries the original event time and a playback sequence
//!   number, so consumers can check order and drop duplicates.

pub mod checkpoint;
pub mod pacer;
pub mod reader;
pub mod record;
pub mod request;
mod run;
pub mod summary;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_kinesis::config::retry::RetryConfig;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::info;

pub use checkpoint::Checkpoint;
pub use pacer::Pacer;
pub use record::{kinesis_records, PlayedEvent};
pub use request::{run_id, Filter, PlaybackRequest, RecordFormat, Window};
pub use summary::{PlaybackSummary, Progress, ProgressObserver, SlotPlayed, Status};

use crate::batch::Backoff;
use crate::bookkeeping::slot_index::read_index;
use crate::bookkeeping::watermark::{self, Watermark};
use crate::config::PlaybackConfig;
use crate::error::{Error, Result};
use crate::invoke::Invoker;
use crate::time::{effective_deadline, format_ms, now_ms, remaining, slot_of};
use reader::{Page, Reader, PAGES_AHEAD};
use run::{Flow, Run, Start};

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:Query",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "kinesis:PutRecords",
    "kinesis:DescribeStreamSummary",
    // Reading back after an ambiguous put failure.
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
    "lambda:InvokeFunction",
];

pub struct Playback {
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    /// The same client without the SDK's retries, for `PutRecords`: a blind
    /// resend of an applied request would duplicate it; the put loop retries
    /// itself and reads back what an ambiguous failure stored.
    putter: aws_sdk_kinesis::Client,
    config: PlaybackConfig,
    invoker: Arc<dyn Invoker>,
    backoff: Backoff,
    observer: Option<ProgressObserver>,
}

impl Playback {
    pub fn new(
        dynamo: aws_sdk_dynamodb::Client,
        kinesis: aws_sdk_kinesis::Client,
        config: PlaybackConfig,
        invoker: Arc<dyn Invoker>,
    ) -> Self {
        let no_retries = kinesis.config().to_builder().retry_config(RetryConfig::disabled()).build();
        let putter = aws_sdk_kinesis::Client::from_conf(no_retries);
        Self { dynamo, kinesis, putter, config, invoker, backoff: Backoff::default(), observer: None }
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

    /// One invocation: a request from a user, or a continuation.
    pub async fn handle(&self, payload: Value, deadline: SystemTime) -> Result<PlaybackSummary> {
        let request = PlaybackRequest::from_payload(payload)?;
        let deadline = effective_deadline(deadline, SystemTime::now());
        let unit = self.config.time_unit_ms;
        let watermark = self.wait_for_watermark(&request, deadline).await?;
        let sealed_end = watermark.sealed_end(unit);
        // Without a watermark yet, `end` defaults to now: the window is valid but not complete.
        let window = Window::parse(&request, sealed_end.unwrap_or_else(now_ms), self.config.max_window)?;
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
        if request.resume.is_none() && sealed_end.is_none_or(|sealed_end| window.end > sealed_end) {
            info!(id, end = %summary.end, watermark = ?summary.watermark, "window not yet complete");
            summary.status = Status::Incomplete;
            return Ok(summary);
        }
        let table = self.config.event_table.as_str();
        let saved = if request.restart { None } else { checkpoint::load(&self.dynamo, table, &id).await? };
        if let Some(done) = saved.as_ref().filter(|c| c.done) {
            info!(id, "already played back; send restart: true to play it again");
            summary.status = Status::AlreadyDone;
            summary.events = done.events as usize;
            return Ok(summary);
        }
        let from_request = request.resume.clone().unwrap_or_else(|| Checkpoint::at_slot(slot_of(window.start, unit)));
        // The further of the two: a retried request resumes where its predecessor saved.
        let position = match saved {
            Some(saved) if saved.is_past(&from_request) => saved,
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
            None => Pacer::for_shards(self.open_shards().await?),
        };
        self.play(&request, &window, position, pacer, deadline, summary).await
    }

    /// The watermark, after waiting up to `wait_seconds` (and never into the
    /// deadline margin) for it to pass the request's `end`.
    async fn wait_for_watermark(&self, request: &PlaybackRequest, deadline: SystemTime) -> Result<Watermark> {
        let table = self.config.event_table.as_str();
        let mut watermark = watermark::read(&self.dynamo, table).await?;
        let (Some(end), Some(wait)) = (request.end_ms()?, request.wait_seconds.map(Duration::from_secs)) else {
            return Ok(watermark);
        };
        let waited = Instant::now();
        while !wait.is_zero()
            && watermark.sealed_end(self.config.time_unit_ms).is_none_or(|s| s < end)
            && waited.elapsed() < wait
            && remaining(deadline) > self.config.deadline_margin
        {
            tokio::time::sleep(Duration::from_secs(1)).await;
            watermark = watermark::read(&self.dynamo, table).await?;
        }
        Ok(watermark)
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

    /// Plays the window's non-empty slots from `position`: the reader
    /// queries ahead while the run puts.
    async fn play(
        &self,
        request: &PlaybackRequest,
        window: &Window,
        position: Checkpoint,
        pacer: Pacer,
        deadline: SystemTime,
        mut summary: PlaybackSummary,
    ) -> Result<PlaybackSummary> {
        let unit = self.config.time_unit_ms as i64;
        // One index read for the window and the lookback before it.
        let lookback = position.lookback(window.start, self.config.dedupe_window_ms);
        let (mut slots, index_queries) =
            read_index(&self.dynamo, &self.config.event_table, slot_of(lookback.from_ms, unit as u64), window.end)
                .await?;
        let behind: Vec<i64> = slots.iter().copied().filter(|s| *s <= position.slot).collect();
        slots.retain(|s| *s >= position.slot && *s + unit > window.start);
        summary.index_queries = index_queries;
        summary.slots = slots.len();
        self.tell(Progress::Planned { slots: slots.len() });

        let reader = Reader { dynamo: &self.dynamo, config: &self.config, window };
        // The envelope ids delivered just before the position: a copy of one of them is not played again.
        let (recent, lookback_queries) = reader.recent_ids(&behind, &lookback).await?;
        summary.queries += lookback_queries;
        let (tx, mut rx) = mpsc::channel::<Result<Page>>(PAGES_AHEAD);
        let producer = reader.fetch_pages(slots, position.clone(), tx);
        let consumer = async move {
            let start = Start { position, pacer, recent };
            let mut run = Run::new(self, request, window, start, deadline, summary);
            // Returning drops `rx`, which stops the reader.
            while let Some(page) = rx.recv().await {
                if let Flow::HandOver(resume) = run.accept(page?).await? {
                    return run.hand_over(resume).await;
                }
            }
            run.finish().await
        };
        let ((), result) = tokio::join!(producer, consumer);
        result
    }
}
