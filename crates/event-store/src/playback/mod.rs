//! `playback`: event table → playback stream, for a time window `[start, end)`.
//!
//! - Only complete slots: the window must end at or before the slot holding
//!   the completeness watermark (by default it ends there); a later `end`
//!   waits up to `wait_seconds`, or the run answers `incomplete`.
//! - Only non-empty slots: the slot index names them, so an empty slot costs
//!   no query.
//! - Pipelined: the next slots are queried ([`crate::log::reader`]) while the current
//!   batch is put ([`run`]); records go out in order with `PutRecords` in
//!   requests of 500, paced ([`pacer`]) to `max_records_per_second`
//!   (default: the stream's open shards × 1,000).
//! - Resumable, one runner at a time: the run's id is bound to its window
//!   and filter, and leased by one runner (continuations keep the lease);
//!   after every put a checkpoint ([`crate::readers::playbacks`]) is saved while the lease is held. The
//!   same request again, or the continuation handed over near the deadline,
//!   starts from it, so a crash repeats at most one batch.
//! - Bounded chains: a run continues itself at most `MAX_CONTINUATIONS` times.
//! - Every record ([`crate::log::record`]) carries the original event time and a playback sequence
//!   number, so consumers can check order and drop duplicates.

pub(crate) mod pacer;
pub(crate) mod request;
mod run;
pub(crate) mod summary;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_kinesis::config::retry::RetryConfig;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{info, warn};

pub use crate::readers::playbacks::{self, Binding, Lease};
pub use pacer::Pacer;
pub use request::{run_id, PlaybackRequest};
pub use summary::{PlaybackSummary, Progress, ProgressObserver, SlotPlayed, Status};

use crate::archive::object::Bucket;
use crate::batch::Backoff;
use crate::bookkeeping::lease::Taken;
use crate::bookkeeping::settings;
use crate::bookkeeping::slot_index::read_index;
use crate::bookkeeping::watermark::{self, Watermark};
use crate::config::PlaybackConfig;
use crate::error::{Error, Result};
use crate::invoke::Invoker;
use crate::log::reader::{Page, Reader, PAGES_AHEAD};
use crate::log::tiers::Tiers;
use crate::log::{Checkpoint, Window};
use crate::time::{effective_deadline, format_ms, now_ms, remaining, slot_of};
use run::{Flow, Run, Start};

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:Query",
    "dynamodb:GetItem",
    "dynamodb:UpdateItem",
    // A playback's item, moved from slot -2 at its first take (`bookkeeping::moving`).
    "dynamodb:PutItem",
    "kinesis:PutRecords",
    "kinesis:DescribeStreamSummary",
    // Reading back after an ambiguous put failure.
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
    "lambda:InvokeFunction",
    // Slots before the archive's boundary (`ARCHIVE_BUCKET`).
    "s3:GetObject",
    // Not called: S3 answers a missing key 404 (an unreadable event) only to a role that may list
    // the bucket, and 403 (a failure retried for ever) to one that may not.
    "s3:ListBucket",
    // Unwrapping subjects' data keys, to open sealed events (`KEY_TABLE`).
    "kms:Decrypt",
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
    /// Set once this process has checked `TIME_UNIT` against the table.
    time_unit_checked: tokio::sync::OnceCell<()>,
    /// Where slots are read from: the event table, or the archive before its boundary.
    tiers: Tiers,
}

/// What [`Playback::bind`] found for a request.
struct Bound {
    id: String,
    window: Window,
    fresh: bool,
    stored: playbacks::Stored,
    start: Checkpoint,
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
        Self {
            dynamo,
            kinesis,
            putter,
            config,
            invoker,
            backoff: Backoff::default(),
            observer: None,
            time_unit_checked: Default::default(),
            tiers: Tiers::new(None),
        }
    }

    /// Reads archived slots from `bucket` (`ARCHIVE_BUCKET`).
    pub fn with_archive(mut self, bucket: Option<Bucket>) -> Self {
        self.tiers = Tiers::new(bucket).with_keys(self.tiers.keys());
        self
    }

    /// Opens sealed events with `keys` (`KEY_TABLE`, [`crate::privacy`]).
    pub fn with_keys(mut self, keys: Option<std::sync::Arc<crate::privacy::keys::Keys>>) -> Self {
        self.tiers = std::mem::replace(&mut self.tiers, crate::log::tiers::Tiers::new(None)).with_keys(keys);
        self
    }

    /// How long a run's lease lasts past its last renewal.
    pub(crate) fn lease(&self) -> Duration {
        self.config.lease
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
        let table = self.config.event_table.as_str();
        self.ensure_time_unit().await?;
        let watermark = self.wait_for_watermark(&request, deadline).await?;
        let complete_end = watermark.complete_end(unit);
        let Bound { id, window, fresh, stored, start } = self.bind(&request, complete_end).await?;
        let done = stored.checkpoint.as_ref().is_some_and(|c| c.done);
        let mut summary = PlaybackSummary {
            id: id.clone(),
            start: format_ms(window.start),
            end: format_ms(window.end),
            watermark: watermark.time.map(format_ms),
            late_events: watermark.late,
            ..Default::default()
        };
        // Checked on every run, continuations too: nothing in a payload skips it.
        if complete_end.is_none_or(|complete_end| window.end > complete_end) {
            info!(id, end = %summary.end, watermark = ?summary.watermark, "window not yet complete");
            summary.status = Status::Incomplete;
            return Ok(summary);
        }
        if !fresh && done {
            info!(id, "already played back; send restart: true to play it again");
            summary.status = Status::AlreadyDone;
            summary.events = stored.checkpoint.map_or(0, |c| c.events as usize);
            return Ok(summary);
        }
        // A token of this invocation's own, handed on to its continuation.
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let binding = Binding::new(window.start, window.end, request.binds());
        let claim = playbacks::Claim {
            owner: &owner,
            previous: request.lease.as_deref(),
            until: 0,
            now: 0,
            binding: &binding,
            // Start over only what exists: a first run binds the id by the ordinary take.
            fresh: (fresh && (stored.binding.is_some() || stored.checkpoint.is_some())).then_some(&start),
        };
        let position = match self.take_lease(&id, claim, deadline).await? {
            Ok(position) => position.unwrap_or(start.clone()),
            Err(until) => {
                info!(id, until = %format_ms(until), "another run plays this id now");
                return Ok(PlaybackSummary { status: Status::Busy, busy_until: Some(format_ms(until)), ..summary });
            }
        };
        if position.done {
            playbacks::release(&self.dynamo, table, &id, &owner).await?;
            return Ok(PlaybackSummary { status: Status::AlreadyDone, events: position.events as usize, ..summary });
        }
        info!(
            id,
            start = %summary.start,
            end = %summary.end,
            from_slot = %format_ms(position.slot),
            seq = position.seq,
            hop = request.hop,
            remaining_ms = remaining(deadline).as_millis() as u64,
            "playback run"
        );
        let result = match self.pacer(&request).await {
            Ok(pacer) => self.play(&request, &window, (position, owner.clone()), pacer, deadline, summary).await,
            Err(err) => Err(err),
        };
        if result.is_err() {
            // A retry need not wait for the lease to expire (a lost lease is not ours to give up).
            if let Err(err) = playbacks::release(&self.dynamo, table, &id, &owner).await {
                warn!(id, error = %err, "lease not released");
            }
        }
        result
    }

    /// The run `request` asks for: its id, its window (bound to the id by
    /// its first run), whether it starts over, what is stored under the id,
    /// and the window's first position.
    async fn bind(&self, request: &PlaybackRequest, complete_end: Option<i64>) -> Result<Bound> {
        let unit = self.config.time_unit_ms;
        // Without a watermark yet, `end` defaults to now: the window is valid but not complete.
        let asked = request.window(complete_end.unwrap_or_else(now_ms), self.config.max_window)?;
        let (id, open_ended) = request.id_for(&asked);
        let stored = playbacks::load(&self.dynamo, &self.config.event_table, &id).await?.unwrap_or_default();
        let done = stored.checkpoint.as_ref().is_some_and(|c| c.done);
        let (window, fresh) = bound_window(&id, request, asked, &stored, open_ended && done)?;
        let start = Checkpoint::at_slot(slot_of(window.start, unit));
        // A checkpoint from before ids were bound (no binding) counts only inside the window.
        let legacy_outside = stored.binding.is_none()
            && stored.checkpoint.as_ref().is_some_and(|c| c.slot < start.slot || c.slot >= window.end);
        Ok(Bound { id, window, fresh: fresh || legacy_outside, stored, start })
    }

    /// Takes `id`'s lease under `claim` (its times set here): the stored
    /// position, or `Err(until)` while another run holds it. A live run renews
    /// its lease with every save; a crashed one's lapses within `lease` of its
    /// last save, so Lambda's retry of the crashed invocation (this payload
    /// again) waits that out once, when its time allows, and goes on.
    async fn take_lease(
        &self,
        id: &str,
        mut claim: playbacks::Claim<'_>,
        deadline: SystemTime,
    ) -> Result<std::result::Result<Option<Checkpoint>, i64>> {
        let table = self.config.event_table.as_str();
        let mut waited = false;
        loop {
            claim.now = now_ms();
            claim.until = claim.now + self.config.lease.as_millis() as i64;
            let until = match playbacks::take(&self.dynamo, table, id, claim).await? {
                Taken::Held(position) => return Ok(Ok(position)),
                Taken::Busy(until) => until,
            };
            let lapse = Duration::from_millis((until + 1 - now_ms()).max(0) as u64);
            if waited || remaining(deadline) <= self.config.deadline_margin + lapse + self.config.lease {
                return Ok(Err(until));
            }
            info!(id, until = %format_ms(until), "this id's lease is held: waiting for it to lapse (a crashed run?)");
            tokio::time::sleep(lapse).await;
            waited = true;
        }
    }

    /// The pace of this run: the request's rate or the stream's limit, shared
    /// evenly by the runs playing the window together.
    async fn pacer(&self, request: &PlaybackRequest) -> Result<Pacer> {
        let runs = u64::from(request.key_range().parts);
        Ok(match request.max_records_per_second {
            Some(rate) => Pacer::new(rate.div_ceil(runs), u64::MAX),
            None => Pacer::for_shards(self.open_shards().await?).one_of(runs),
        })
    }

    /// Refuses a slot size other than the one the scan recorded (see [`settings`]).
    async fn ensure_time_unit(&self) -> Result<()> {
        let (dynamo, table, unit) = (&self.dynamo, &self.config.event_table, self.config.time_unit_ms);
        self.time_unit_checked.get_or_try_init(|| settings::check_time_unit(dynamo, table, unit)).await.map(|_| ())
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
            && watermark.complete_end(self.config.time_unit_ms).is_none_or(|s| s < end)
            && waited.elapsed() < wait
            && remaining(deadline) > self.config.deadline_margin
        {
            tokio::time::sleep(Duration::from_secs(1)).await;
            watermark = watermark::read(&self.dynamo, table).await?;
        }
        Ok(watermark)
    }

    /// The playback stream's open shards. Throttling (20 calls a second an
    /// account: many parallel runs starting at once) is waited out with backoff.
    async fn open_shards(&self) -> Result<u64> {
        let mut retry = 0;
        loop {
            let asked = self.kinesis.describe_stream_summary().stream_name(&self.config.playback_stream).send().await;
            match asked.map_err(|e| Error::kinesis("DescribeStreamSummary", e)) {
                Ok(out) => {
                    return Ok(out.stream_description_summary().map_or(1, |s| s.open_shard_count().max(1) as u64))
                }
                Err(err) if err.is_throttled() && retry + 1 < self.backoff.max_attempts => {
                    self.backoff.wait(retry).await;
                    retry += 1;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Plays the window's non-empty slots from `position`: the reader
    /// queries ahead while the run puts.
    async fn play(
        &self,
        request: &PlaybackRequest,
        window: &Window,
        (position, owner): (Checkpoint, String),
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
        let behind: Vec<_> = slots.iter().copied().filter(|s| s.slot <= position.slot).collect();
        slots.retain(|s| s.slot >= position.slot && s.slot + unit > window.start);
        summary.index_queries = index_queries;
        summary.slots = slots.len();
        self.tell(Progress::Planned { slots: slots.len() });

        let config = &self.config;
        let reader = Reader {
            dynamo: &self.dynamo,
            table: &config.event_table,
            time_unit_ms: config.time_unit_ms,
            page_items: config.page_items,
            dedupe_window_ms: config.dedupe_window_ms,
            window,
            keys: request.key_range(),
            tiers: &self.tiers,
        };
        // The envelope ids delivered just before the position: a copy of one of them is not played again.
        let (recent, lookback_queries) = reader.recent_ids(&behind, &lookback).await?;
        summary.queries += lookback_queries;
        let (tx, mut rx) = mpsc::channel::<Result<Page>>(PAGES_AHEAD);
        let producer = reader.fetch_pages(slots, position.clone(), tx);
        let consumer = async move {
            let start = Start { position, pacer, recent, owner };
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

/// The window a request plays under its id, and whether the run starts
/// fresh (new binding and checkpoint). A stored binding is reused for what
/// the request leaves out (a retry of a request without `end`), and
/// refused when the request names another window or filter, unless it
/// restarts. `rebind`: the id is an open-ended request's whose last run is
/// done, so the request means the window of now.
pub fn bound_window(
    id: &str,
    request: &PlaybackRequest,
    asked: Window,
    stored: &playbacks::Stored,
    rebind: bool,
) -> Result<(Window, bool)> {
    let Some(bound) = stored.binding.as_ref().filter(|_| !rebind) else {
        return Ok((asked, request.restart || rebind));
    };
    let names_window = request.start.is_some() || request.end.is_some();
    let filter = request.binds();
    if request.restart && names_window {
        return Ok((asked, true));
    }
    let start_differs = request.start.is_some() && asked.start != bound.start;
    let end_differs = request.end.is_some() && asked.end != bound.end;
    if start_differs || end_differs || filter != bound.filter {
        return Err(Error::BadInput(format!(
            "playback id {id:?} is bound to the window {} to {} with filter {}; this request names another \
             (use another id, or send restart: true to rebind it)",
            format_ms(bound.start),
            format_ms(bound.end),
            bound.filter
        )));
    }
    Ok((Window { start: bound.start, end: bound.end }, request.restart))
}
