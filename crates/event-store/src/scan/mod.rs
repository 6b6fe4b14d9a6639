//! `scan`: buffer table → event table. A scheduled run fans out one
//! asynchronous invocation per scan segment; an awake run (woken by the
//! pump when it buffers, [`crate::bookkeeping::awake`]) does the same about
//! once a second while events keep coming; a segment run moves page after
//! page (put into the event table, then delete from the buffer only what was
//! put) until its deadline nears, then hands the rest of its segment to a
//! fresh invocation of itself with the key where it stopped.
//!
//! [`plan`] decides, without I/O, what a page's writes are and what may be
//! deleted; this module does the I/O. With a page's events go its slots'
//! index entries, and when a segment finishes a pass it moves its part of the
//! completeness watermark forward (the rule: [`crate::bookkeeping::watermark`]).

mod awake;
pub mod plan;
mod slicing;
mod task;

pub use awake::AWAKE_INTERVAL;

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use serde_json::Value;
use tracing::{info, warn};

use crate::batch::Backoff;
use crate::bookkeeping::awake::AwakeRun;
use crate::bookkeeping::frontier;
use crate::bookkeeping::segment_pass::{self, PassState};
use crate::bookkeeping::settings;
use crate::bookkeeping::watermark::{self, Pass};
use crate::bookkeeping::{ingest, late_slots};
use crate::buffer_item::{self, BufferItem};
use crate::config::ScanConfig;
use crate::dynamo::{write_all, Table};
use crate::error::{Error, Result};
use crate::event_item;
use crate::invoke::{continue_with, Invoker};
use crate::time::{effective_deadline, format_ms, now_ms, remaining};
use plan::{buffer_deletes, Moving, PageOutcome, PagePlan, TableKey};
pub(crate) use task::next_step;
pub use task::{ScanSummary, SegmentStep, SegmentTask};

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:Scan",
    "dynamodb:BatchWriteItem",
    "dynamodb:UpdateItem",
    "dynamodb:Query",
    "dynamodb:GetItem",
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
    "lambda:InvokeFunction",
];

/// A random token naming one run of a segment's pass.
fn new_token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// How long a lease outlasts the run that holds it (clock differences, the invoke of a continuation).
const LEASE_SLACK_MS: i64 = 60_000;

pub struct Scan {
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    config: ScanConfig,
    invoker: Arc<dyn Invoker>,
    /// The subscriptions function: an awake run starts its tick when the watermark moved.
    subscriptions: Option<Arc<dyn Invoker>>,
    backoff: Backoff,
    /// Set once this process has checked `TIME_UNIT` against the table.
    time_unit_checked: tokio::sync::OnceCell<()>,
}

impl Scan {
    pub fn new(
        dynamo: aws_sdk_dynamodb::Client,
        kinesis: aws_sdk_kinesis::Client,
        config: ScanConfig,
        invoker: Arc<dyn Invoker>,
    ) -> Self {
        Self {
            dynamo,
            kinesis,
            config,
            invoker,
            subscriptions: None,
            backoff: Backoff::default(),
            time_unit_checked: Default::default(),
        }
    }

    /// Starts the subscriptions tick from awake runs whenever the watermark moved
    /// (an invoker of the subscriptions function); without it, idle partitions wait for its schedule.
    pub fn with_subscriptions(mut self, invoker: Option<Arc<dyn Invoker>>) -> Self {
        self.subscriptions = invoker;
        self
    }

    /// Retries of unprocessed items with another schedule (tests shorten it).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// A payload with `segment` runs that segment; one with `awake` is an
    /// awake run (woken by the pump: passes every half second while work
    /// comes, see [`awake`]); anything else (the schedule's event) starts a
    /// pass of every segment whose last pass is over.
    pub async fn handle(&self, payload: Value, deadline: SystemTime) -> Result<ScanSummary> {
        let started = SystemTime::now();
        let deadline = effective_deadline(deadline, started);
        // A run's lease lasts its own time and then some; a queued fork's, as long again.
        let lease_ms = remaining(deadline).as_millis() as i64 + LEASE_SLACK_MS;
        self.ensure_time_unit().await?;
        if payload.get("segment").is_some() {
            let task: SegmentTask =
                serde_json::from_value(payload).map_err(|e| Error::BadInput(format!("segment task: {e}")))?;
            if task.segment >= task.total_segments {
                return Err(Error::BadInput(format!("segment {} of {}", task.segment, task.total_segments)));
            }
            return self.run_segment(task, deadline, lease_ms).await;
        }
        if let Some(run) = payload.get("awake") {
            let run: AwakeRun =
                serde_json::from_value(run.clone()).map_err(|e| Error::BadInput(format!("awake run: {e}")))?;
            return self.stay_awake(run, deadline, lease_ms).await;
        }
        self.start_passes(lease_ms).await
    }

    /// Starts a pass of every segment whose last pass is over (forks, one per segment).
    async fn start_passes(&self, lease_ms: i64) -> Result<ScanSummary> {
        let total_segments = self.config.segments;
        let mut summary = ScanSummary::default();
        // For the watermark-lag metric; a failed read leaves it out (and the alarm treats silence as a stall).
        match watermark::read(&self.dynamo, &self.config.event_table).await {
            Ok(watermark) => summary.watermark_at_start = watermark.time,
            Err(err) => warn!(error = %err, "watermark not read: no lag metric this run"),
        }
        // Every segment's last pass still running (a schedule shorter than a pass): no look at the stream.
        match segment_pass::claimable_segments(&self.dynamo, &self.config.event_table, total_segments, now_ms()).await {
            Ok(0) => {
                summary.busy = total_segments;
                info!(busy = summary.busy, "segments whose last pass still runs were left to it");
                return Ok(summary);
            }
            Ok(_) => {}
            Err(err) => warn!(error = %err, "passes not read: each segment is tried"),
        }
        let pass = self.start_pass().await;
        // One segment's failure does not keep the others from starting; the first error is reported.
        let mut first_error = None;
        for segment in 0..total_segments {
            let token = new_token();
            let now = now_ms();
            let table = &self.config.event_table;
            let which = (segment, total_segments);
            match segment_pass::claim(&self.dynamo, table, which, &token, pass, now + 2 * lease_ms, now).await {
                Ok(true) => {}
                Ok(false) => {
                    summary.busy += 1;
                    continue;
                }
                Err(err) => {
                    warn!(segment, error = %err, "segment not claimed");
                    first_error.get_or_insert(err);
                    continue;
                }
            }
            let task = SegmentTask { segment, total_segments, pass: Some(token.clone()), ..Default::default() };
            if let Err(err) = continue_with(self.invoker.as_ref(), &task).await {
                warn!(segment, error = %err, "fork not started: the segment is given back");
                self.give_back(&task).await;
                first_error.get_or_insert(err);
                continue;
            }
            summary.forked += 1;
        }
        if summary.busy > 0 {
            info!(busy = summary.busy, "segments whose last pass still runs were left to it");
        }
        info!(segments = summary.forked, "scan started");
        match first_error {
            Some(err) => Err(err),
            None => Ok(summary),
        }
    }

    /// Ends a pass that failed, without a watermark, so the next schedule
    /// claims its segment at once rather than after the lease (best effort).
    async fn give_back(&self, task: &SegmentTask) {
        let Some(token) = &task.pass else { return };
        let which = (task.segment, task.total_segments);
        if let Err(err) = segment_pass::finish(&self.dynamo, &self.config.event_table, which, token).await {
            warn!(segment = task.segment, error = %err, "pass not given back: the segment waits for its lease to expire");
        }
    }

    /// Records the slot size at first use; refuses another one (see [`settings`]).
    async fn ensure_time_unit(&self) -> Result<()> {
        let (dynamo, table, unit) = (&self.dynamo, &self.config.event_table, self.config.time_unit_ms);
        self.time_unit_checked.get_or_try_init(|| settings::ensure_time_unit(dynamo, table, unit)).await.map(|_| ())
    }

    async fn run_segment(&self, mut task: SegmentTask, deadline: SystemTime, lease_ms: i64) -> Result<ScanSummary> {
        let which = (task.segment, task.total_segments);
        let table = &self.config.event_table;
        // A scheduled pass's state comes from the table; a run by hand has none (and moves no watermark).
        let taken = match task.pass.take() {
            Some(token) => {
                let mine = new_token();
                let until = now_ms() + lease_ms;
                let taken = segment_pass::take(&self.dynamo, table, which, (&token, &mine), until).await;
                task.pass = Some(mine);
                match taken {
                    Ok(taken) => taken,
                    Err(err) => {
                        // It may have been applied before the error: give the pass back under our token.
                        self.give_back(&task).await;
                        return Err(err);
                    }
                }
            }
            None => Some(PassState { pass: Pass::default(), next_key: task.exclusive_start_key.clone() }),
        };
        let Some(state) = taken else {
            info!(
                segment = task.segment,
                "not the segment's running pass (superseded, taken on, finished or unknown): nothing done"
            );
            return Ok(ScanSummary { superseded: true, ..Default::default() });
        };
        let result = self.run_pass(&task, state, deadline, lease_ms).await;
        if result.is_err() {
            self.give_back(&task).await;
        }
        result
    }

    /// Moves the segment page after page from where the pass stands, until
    /// the pass is done or the deadline nears.
    async fn run_pass(
        &self,
        task: &SegmentTask,
        mut state: PassState,
        deadline: SystemTime,
        lease_ms: i64,
    ) -> Result<ScanSummary> {
        let mut summary = ScanSummary::default();
        let table = &self.config.event_table;
        let mut start_key = state.next_key.take();
        // Events arriving before the current watermark are late: counted (in a pass), never
        // misplaced, and their slots marked (in any run) for readers of the archive.
        let sealed = watermark::read(&self.dynamo, table).await?.time;
        let watermark = state.pass.pass_started_at.and(sealed);
        // Slots this run has already indexed: each gets one index write per run, not one per page.
        let mut indexed = BTreeSet::new();
        // Slots this run has marked late: one marker write each per run.
        let mut marked = BTreeSet::new();
        let passed: Result<()> = async {
            loop {
                let (items, last_key) = self.scan_page(task, start_key.take()).await?;
                let page = self.move_page(items, (watermark, sealed), (&mut indexed, &mut marked), deadline).await;
                summary.add(&page);
                state.pass.saw(page.oldest_left);
                self.count_late(task, &page).await;
                match next_step(last_key, remaining(deadline), self.config.deadline_margin) {
                    SegmentStep::PassDone => {
                        summary.watermark = self.finish_pass(task, &state.pass).await?;
                        if summary.watermark.is_some() {
                            // The watermark of all segments now, for the lag metric (best effort).
                            let table = &self.config.event_table;
                            summary.complete_to = watermark::read(&self.dynamo, table).await.ok().and_then(|w| w.time);
                        }
                        return Ok(());
                    }
                    SegmentStep::NextPage(key) => start_key = Some(key),
                    SegmentStep::HandOver(key) => {
                        state.next_key = Some(key);
                        return self.hand_over(task, &state, lease_ms, &mut summary).await;
                    }
                }
            }
        }
        .await;
        // What moved is counted whether or not the run ended well; best effort, as the count
        // only draws the ingest rate (see `ingest`).
        if let Err(err) = ingest::add(&self.dynamo, table, &summary.per_minute).await {
            warn!(segment = task.segment, error = %err, "ingest count not written");
        }
        passed?;
        info!(
            segment = task.segment,
            pages = summary.pages,
            moved = summary.moved,
            failed = summary.failed,
            quarantined = summary.quarantined,
            late = summary.late,
            stuck = ?summary.stuck,
            watermark = summary.watermark.map(format_ms),
            continued = summary.forked > 0,
            "segment scanned"
        );
        Ok(summary)
    }

    /// Near the deadline: saves where the pass stands and starts the
    /// continuation, unless the chain reached `MAX_CONTINUATIONS` (then the
    /// pass ends without moving the watermark, and the next schedule starts
    /// the segment over).
    async fn hand_over(
        &self,
        task: &SegmentTask,
        state: &PassState,
        lease_ms: i64,
        summary: &mut ScanSummary,
    ) -> Result<()> {
        let which = (task.segment, task.total_segments);
        let (dynamo, table) = (&self.dynamo, &self.config.event_table);
        if task.hop >= self.config.max_continuations {
            warn!(
                segment = task.segment,
                hops = task.hop,
                "the pass chain reached MAX_CONTINUATIONS: stopped without a watermark; the next scheduled run starts this segment over"
            );
            if let Some(token) = &task.pass {
                // Over, though unfinished: the next schedule may claim the segment at once.
                segment_pass::finish(dynamo, table, which, token).await?;
            }
            summary.stopped = true;
            return Ok(());
        }
        let next = match &task.pass {
            Some(token) => {
                if !segment_pass::hand_over(dynamo, table, which, token, state, now_ms() + 2 * lease_ms).await? {
                    info!(segment = task.segment, "the pass was taken over meanwhile: no continuation");
                    summary.superseded = true;
                    return Ok(());
                }
                SegmentTask { hop: task.hop + 1, ..task.clone() }
            }
            None => SegmentTask { exclusive_start_key: state.next_key.clone(), hop: task.hop + 1, ..task.clone() },
        };
        continue_with(self.invoker.as_ref(), &next).await?;
        summary.forked = 1;
        Ok(())
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
        (watermark, sealed): (Option<i64>, Option<i64>),
        (indexed, marked): (&mut BTreeSet<i64>, &mut BTreeSet<i64>),
        deadline: SystemTime,
    ) -> PageOutcome {
        // Retries stop in time for the hand-over: what is left unwritten stays in the buffer.
        let give_up = Instant::now() + remaining(deadline).saturating_sub(self.config.deadline_margin / 4);
        let moving = Moving {
            time_unit_ms: self.config.time_unit_ms,
            retention_days: self.config.retention_days,
            now_ms: now_ms(),
            slot_subkeys: self.config.slot_subkeys,
            slices: self.config.slices,
        };
        let mut plan = PagePlan::new(items, moving, indexed);
        let writes = std::mem::take(&mut plan.writes);
        // Late events' slots are marked first, so a reader of an archived slot finds them.
        let late: BTreeSet<i64> = plan.late_slots(sealed).difference(marked).copied().collect();
        if let Err(err) =
            late_slots::mark(&self.dynamo, &self.config.event_table, crate::bookkeeping::Family::Scan, &late).await
        {
            warn!(error = %err, slots = late.len(), "late slots not marked: the page stays in the buffer");
            let all: Vec<TableKey> = writes.into_iter().map(|(key, _)| key).collect();
            let settled = plan.settle(&all);
            return plan.outcome(settled, &[], watermark);
        }
        marked.extend(late);
        let events = Table { name: &self.config.event_table, key: event_item::KEY };
        let not_written = write_all(&self.dynamo, events, writes, &self.backoff, Some(give_up)).await;
        let settled = plan.settle(&not_written);
        indexed.extend(&settled.indexed);
        if !settled.unindexed.is_empty() {
            warn!(slots = settled.unindexed.len(), "slot index not written: those slots' events stay in the buffer");
        }
        let deletes = buffer_deletes(&settled.delete);
        let buffer = Table { name: &self.config.buffer_table, key: buffer_item::KEY };
        let not_deleted = write_all(&self.dynamo, buffer, deletes, &self.backoff, Some(give_up)).await;
        let outcome = plan.outcome(settled, &not_deleted, watermark);
        if outcome.late > 0 {
            warn!(
                late = outcome.late,
                first_slot = outcome.first_late_slot.map(format_ms),
                "late events: moved into slots already complete"
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

    /// A new pass: its start, and the look at the event stream that bounds
    /// its watermark. If the stream cannot be asked, the pass moves events
    /// but no watermark.
    async fn start_pass(&self) -> Pass {
        let started = now_ms();
        let (stream, table) = (&self.config.event_stream, &self.config.event_table);
        let clock_floor = started - self.config.watermark_lag_ms as i64;
        match frontier::look(&self.kinesis, &self.dynamo, stream, table, clock_floor).await {
            Ok(look) => {
                if let Some(from) = look.unbuffered_from {
                    info!(unbuffered_from = %format_ms(from), "records in the stream not buffered yet hold the watermark");
                }
                Pass::started_at(started, look.unbuffered_from, look.bound)
            }
            Err(err) => {
                warn!(error = %err, "event stream not readable: this pass moves no watermark");
                Pass::default()
            }
        }
    }

    /// A segment's pass is over: its part of the watermark moves forward,
    /// if the pass still held the segment.
    async fn finish_pass(&self, task: &SegmentTask, pass: &Pass) -> Result<Option<i64>> {
        let Some(token) = &task.pass else { return Ok(None) };
        let table = &self.config.event_table;
        let which = (task.segment, task.total_segments);
        if !segment_pass::finish(&self.dynamo, table, which, token).await? {
            info!(segment = task.segment, "the pass was taken over meanwhile: its watermark is not used");
            return Ok(None);
        }
        // A pass that could not look at the stream moves events, not the watermark.
        let Some(time) = pass.watermark(self.config.watermark_lag_ms) else { return Ok(None) };
        watermark::advance(&self.dynamo, table, task.segment, task.total_segments, time, now_ms()).await?;
        Ok(Some(time))
    }
}
