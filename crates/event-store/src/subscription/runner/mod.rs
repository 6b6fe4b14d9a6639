//! One partition's runner: takes the partition's lease, then delivers the
//! partition's newly sealed events from its checkpoint, in rounds (each up
//! to the complete end the watermark gives), saving the checkpoint after every
//! delivery while it holds the lease. Caught up, it follows the complete log
//! (a look at the watermark every `SUBSCRIPTION_POLL_MS`) as [`super::follow`]
//! decides; near its deadline with more to deliver, it hands the lease to a
//! continuation, like playback.

use std::time::{Instant, SystemTime};

use tokio::sync::mpsc;
use tracing::{info, warn};

mod deliver;

use super::follow::{Follow, Next};
use super::run::{PartitionTask, RunStatus, RunSummary};
use super::target::Delivery;
use super::Subscriptions;
use crate::bookkeeping::lease::Taken;
use crate::bookkeeping::slot_index::read_index;
use crate::error::{Error, Result};
use crate::invoke::continue_with;
use crate::log::copies::RecentIds;
use crate::log::reader::{Page, PAGES_AHEAD};
use crate::log::Window;
use crate::position::Checkpoint;
use crate::readers::subscriptions::spec::{State, Subscription};
use crate::readers::subscriptions::{self, Parked, Take};
use crate::select::pass_over;
use crate::time::{effective_deadline, format_ms, ms_of, now_ms, remaining, slot_of};

/// How long a handed-over lease waits for its continuation to start (as for playback).
const HANDOVER_LEASE_MS: i64 = 300_000;
/// Queued deliveries go out once they hold this much (besides every batch), so that large events keep memory bounded.
const PENDING_BYTES: usize = 8 << 20;

/// How often a following runner asks whether its subscription was paused or deleted.
const STATE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// How a round (one pass up to a complete end) ended.
enum Round {
    Done,
    HandOver,
    Ended(RunStatus),
}

impl Subscriptions {
    /// One partition run (see the module doc).
    pub async fn run_partition(&self, task: PartitionTask, deadline: SystemTime) -> Result<RunSummary> {
        let deadline = effective_deadline(deadline, SystemTime::now());
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let mut summary =
            RunSummary { subscription: task.subscription.clone(), partition: task.partition, ..Default::default() };
        let Some(sub) = subscriptions::get(dynamo, table, &task.subscription).await? else {
            return Ok(RunSummary { status: RunStatus::Gone, ..summary });
        };
        if task.partition >= sub.partitions {
            return Err(Error::BadInput(format!(
                "subscription {} has {} partitions; there is no partition {}",
                sub.name, sub.partitions, task.partition
            )));
        }
        if sub.state == State::Paused {
            // A lease handed to this run is given up, so a resume does not wait for it to expire.
            if let Some(handed) = task.lease.as_deref() {
                subscriptions::release(dynamo, table, (&sub.name, task.partition), handed, None).await?;
            }
            return Ok(RunSummary { status: RunStatus::Paused, ..summary });
        }
        self.ensure_time_unit().await?;
        // A token of this invocation's own, handed on to its continuation.
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let until = ms_of(deadline) + self.config.lease_slack_ms;
        let name = sub.name.clone();
        let place = (name.as_str(), task.partition);
        let claim = (owner.as_str(), task.lease.as_deref());
        let position = match subscriptions::take(dynamo, table, (&sub, task.partition), claim, until, now_ms()).await? {
            Take::Lease(Taken::Held(checkpoint)) => {
                checkpoint.unwrap_or_else(|| sub.start_checkpoint(self.config.time_unit_ms))
            }
            Take::Gone => return Ok(RunSummary { status: RunStatus::Gone, ..summary }),
            Take::Lease(Taken::Busy(until)) => {
                summary.busy_until = Some(format_ms(until));
                return Ok(RunSummary { status: RunStatus::Busy, ..summary });
            }
            Take::Stopped(error) => {
                return Ok(RunSummary { status: RunStatus::Stopped, error: Some(error), ..summary })
            }
        };
        // Read again with the lease held: a rescale asked before the take is seen (its partitions stop,
        // or deliver up to where it says), and a rescale done since the definition was read ends this run.
        let sub = match subscriptions::get(dynamo, table, &sub.name).await? {
            Some(now) if now.epoch == sub.epoch && now.id == sub.id && !now.stopping() => now,
            now => {
                subscriptions::release(dynamo, table, place, &owner, None).await?;
                let status =
                    if now.is_some_and(|now| now.id == sub.id) { RunStatus::Rescaling } else { RunStatus::Gone };
                return Ok(RunSummary { status, ..summary });
            }
        };
        info!(subscription = %sub.name, partition = task.partition, slot = %format_ms(position.slot), hop = task.hop, "subscription run");
        let runner = Runner {
            subs: self,
            recent: RecentIds::new(self.config.dedupe_window_ms),
            sub,
            partition: task.partition,
            owner: owner.clone(),
            seq: position.seq,
            position,
            pending: Vec::new(),
            unreadable: Vec::new(),
            oldest_queued: None,
            deadline,
            summary,
        };
        let result = runner.run(&task).await;
        if let Err(err) = &result {
            if !matches!(err, Error::LeaseLost(_)) {
                // A newer version's item: the partition waits at its checkpoint, and status says why.
                let why = err.is_newer().then(|| err.to_string());
                if let Err(release) = subscriptions::release(dynamo, table, place, &owner, why.as_deref()).await {
                    warn!(error = %release, "lease not released");
                }
            }
        }
        result
    }
}

struct Runner<'a> {
    subs: &'a Subscriptions,
    sub: Subscription,
    partition: u32,
    /// The lease this run holds: every checkpoint write is conditional on it.
    owner: String,
    /// Where the partition stands: everything before it is delivered or parked.
    position: Checkpoint,
    /// The sequence number the next queued event gets.
    seq: u64,
    /// Envelope ids of the last `dedupe_window_ms`, to skip a second copy of an accepted event.
    recent: RecentIds,
    pending: Vec<Delivery>,
    /// Events that could not be decoded, parked at the next save.
    unreadable: Vec<Parked>,
    /// The arrival (ms) of the oldest event queued for delivery in the current round.
    oldest_queued: Option<i64>,
    deadline: SystemTime,
    summary: RunSummary,
}

impl Runner<'_> {
    async fn run(mut self, task: &PartitionTask) -> Result<RunSummary> {
        self.recent = self.recent_ids().await?;
        // Everything before this (ms) is delivered: a round runs once the watermark is past it.
        let mut delivered_to = super::position_ms(&self.position);
        let config = &self.subs.config;
        let mut follow = Follow::new(config.follow, task.lease.is_some(), Instant::now());
        let mut state_checked = Instant::now();
        loop {
            // A rescale's old partition delivers up to where it says, and ends there.
            let stop_at = self.sub.stop_at();
            if stop_at.is_some_and(|at| delivered_to >= at) {
                return self.end(RunStatus::Rescaling).await;
            }
            let complete = self.subs.complete_to().await?.map(|end| stop_at.map_or(end, |at| end.min(at)));
            if let Some(end) = complete.filter(|end| delivered_to < *end) {
                match self.round(end).await? {
                    Round::Done => {
                        delivered_to = end;
                        self.record_latency();
                    }
                    Round::HandOver => return self.hand_over(task).await,
                    Round::Ended(status) => return self.end(status).await,
                }
            }
            let s = &self.summary;
            let met = s.delivered + s.parked + s.filtered_out + s.duplicates_dropped + s.other_partitions;
            let near_deadline = remaining(self.deadline) <= config.deadline_margin + config.poll;
            match follow.next(met, near_deadline, config.poll, Instant::now()) {
                Next::Look(wait) => tokio::time::sleep(wait).await,
                Next::End => return self.end(RunStatus::CaughtUp).await,
                // Not to a successor of a subscription paused or deleted meanwhile (it would
                // find it paused and leave the handed-over lease to expire).
                Next::HandOver => {
                    return match subscriptions::get(&self.subs.dynamo, &config.event_table, &self.sub.name).await? {
                        None => self.end(RunStatus::Gone).await,
                        Some(sub) if sub.state == State::Paused => self.end(RunStatus::Paused).await,
                        Some(_) => self.hand_over(task).await,
                    };
                }
            }
            // Paused or deleted meanwhile? Asked once a second at most, whatever the poll
            // (a reset takes the lease away: the next save fails).
            if state_checked.elapsed() >= STATE_CHECK {
                state_checked = Instant::now();
                match subscriptions::get(&self.subs.dynamo, &config.event_table, &self.sub.name).await? {
                    None => return self.end(RunStatus::Gone).await,
                    Some(sub) if sub.state == State::Paused => return self.end(RunStatus::Paused).await,
                    Some(sub) if sub.stopping() || sub.epoch != self.sub.epoch => {
                        return self.end(RunStatus::Rescaling).await
                    }
                    Some(_) => {}
                }
            }
        }
    }

    fn unit(&self) -> i64 {
        self.subs.config.time_unit_ms as i64
    }

    /// The envelope ids delivered just before the position.
    async fn recent_ids(&mut self) -> Result<RecentIds> {
        let lookback = self.position.lookback(0, self.subs.config.dedupe_window_ms);
        let from = slot_of(lookback.from_ms, self.subs.config.time_unit_ms);
        let (slots, queries) =
            read_index(&self.subs.dynamo, &self.subs.config.event_table, from, self.position.slot + 1).await?;
        let window = Window { start: lookback.from_ms, end: self.position.slot + self.unit() };
        let keys = self.sub.keys_of(self.partition);
        let (recent, lookback_queries) = self.subs.reader(&window, keys).recent_ids(&slots, &lookback).await?;
        self.summary.queries += queries + lookback_queries;
        Ok(recent)
    }

    /// Delivers the partition's events from the position up to `complete_end`
    /// (ms: the watermark; events that arrived before it).
    async fn round(&mut self, complete_end: i64) -> Result<Round> {
        let subs = self.subs;
        let (dynamo, table) = (&subs.dynamo, subs.config.event_table.as_str());
        // Where to start within a slot is in the position (`after`), not in the window.
        let window = Window { start: 0, end: complete_end };
        let (mut slots, index_queries) = read_index(dynamo, table, self.position.slot, complete_end).await?;
        slots.retain(|s| s.slot >= self.position.slot);
        self.summary.queries += index_queries;
        let reader = subs.reader(&window, self.sub.keys_of(self.partition));
        let (tx, rx) = mpsc::channel::<Result<Page>>(PAGES_AHEAD);
        let producer = reader.fetch_pages(slots, self.position.clone(), tx);
        let consumer = async {
            // Owned here: returning early drops it, which stops the reader (else it would wait on a full channel).
            let mut rx = rx;
            while let Some(page) = rx.recv().await {
                let page = page?;
                self.summary.queries += page.queries;
                self.summary.unreadable += page.unreadable;
                // Read whole (a payload fetched from S3, sealed parts opened) only in its partition's runner,
                // and only when the selection does not exclude it by fields in the clear.
                let (sub, partition) = (&self.sub, self.partition);
                let passed = pass_over(page.events, |key| sub.partition_of(key) == partition, &sub.select);
                self.summary.other_partitions += passed.other_keys;
                self.summary.filtered_out += passed.excluded;
                let mine = passed.kept;
                let mut opened = subs.tiers.opened(mine);
                while let Some((event, readable)) = futures::StreamExt::next(&mut opened).await {
                    if let Err(err) = self.queue(event, readable) {
                        // An item of a newer version: what came before it is delivered, then the run stops at it.
                        if err.is_newer() {
                            if let Some(end) = self.deliver_pending().await? {
                                return Ok(end);
                            }
                        }
                        return Err(err);
                    }
                    if self.pending.iter().map(|d| d.data.len()).sum::<usize>() >= PENDING_BYTES {
                        if let Some(end) = self.deliver_pending().await? {
                            return Ok(end);
                        }
                    }
                }
                while self.pending.len() >= self.sub.batch_size {
                    let batch: Vec<Delivery> = self.pending.drain(..self.sub.batch_size).collect();
                    if let Some(end) = self.deliver(batch).await? {
                        return Ok(end);
                    }
                }
                if remaining(self.deadline) <= subs.config.deadline_margin {
                    // Deliver what is queued, and go on after this page in a continuation.
                    if let Some(end) = self.deliver_pending().await? {
                        return Ok(end);
                    }
                    let resume = match page.last_key {
                        Some(key) => Checkpoint { slot: page.slot, after: Some(key), ..self.delivered_through() },
                        None => Checkpoint { slot: page.slot + self.unit(), after: None, ..self.delivered_through() },
                    };
                    self.save(resume).await?;
                    return Ok(Round::HandOver);
                }
            }
            if let Some(end) = self.deliver_pending().await? {
                return Ok(end);
            }
            // Everything before the complete end is done, events of other partitions included.
            let end = Checkpoint::starting_at(complete_end, subs.config.time_unit_ms);
            self.save(Checkpoint { slot: end.slot, after: end.after, ..self.delivered_through() }).await?;
            Ok(Round::Done)
        };
        let ((), result) = tokio::join!(producer, consumer);
        result
    }

    /// Saves `checkpoint` while this run holds the lease (else [`Error::LeaseLost`]: the run stops);
    /// unreadable events before it are parked first.
    async fn save(&mut self, checkpoint: Checkpoint) -> Result<()> {
        let (dynamo, table) = (&self.subs.dynamo, self.subs.config.event_table.as_str());
        self.park_unreadable(&checkpoint).await?;
        subscriptions::save(dynamo, table, (&self.sub.name, self.partition), &self.owner, &checkpoint, None).await?;
        self.position = checkpoint;
        Ok(())
    }

    /// Ends the run: the lease is given up (a stopped partition gave it up already); after an
    /// unavailable target it is kept for the backoff instead, so the next ticks leave it alone.
    async fn end(mut self, status: RunStatus) -> Result<RunSummary> {
        let (dynamo, table) = (&self.subs.dynamo, self.subs.config.event_table.as_str());
        let backoff = self.subs.config.unavailable_backoff;
        if status == RunStatus::Unavailable && !backoff.is_zero() {
            let (place, until) = ((self.sub.name.as_str(), self.partition), now_ms() + backoff.as_millis() as i64);
            let kept = subscriptions::save(dynamo, table, place, &self.owner, &self.position, Some(until)).await;
            // Reset or deleted meanwhile (the lease fenced): nothing of this run's to keep.
            kept.or_else(|err| if matches!(err, Error::LeaseLost(_)) { Ok(()) } else { Err(err) })?;
        } else if status != RunStatus::Stopped {
            // Unreadable events before the saved position are parked already; later ones are met again.
            subscriptions::release(dynamo, table, (&self.sub.name, self.partition), &self.owner, None).await?;
        }
        self.summary.status = status;
        self.summary.position = Some(format_ms(super::position_ms(&self.position).max(self.sub.start_floor())));
        info!(
            subscription = %self.sub.name,
            partition = self.partition,
            status = ?status,
            delivered = self.summary.delivered,
            parked = self.summary.parked,
            position = ?self.summary.position,
            "subscription run ends"
        );
        Ok(self.summary)
    }

    /// Hands the rest to a continuation that carries the lease token; at
    /// `MAX_CONTINUATIONS` the chain stops instead (the next tick starts a new one).
    async fn hand_over(mut self, task: &PartitionTask) -> Result<RunSummary> {
        let (dynamo, table) = (&self.subs.dynamo, self.subs.config.event_table.as_str());
        let place = (self.sub.name.as_str(), self.partition);
        if task.hop >= self.subs.config.max_continuations {
            subscriptions::save(dynamo, table, place, &self.owner, &self.position, Some(0)).await?;
            warn!(subscription = %self.sub.name, partition = self.partition, hops = task.hop, "MAX_CONTINUATIONS reached: the next tick goes on");
            self.summary.status = RunStatus::ChainStopped;
            return Ok(self.summary);
        }
        subscriptions::save(dynamo, table, place, &self.owner, &self.position, Some(now_ms() + HANDOVER_LEASE_MS))
            .await?;
        let next = PartitionTask {
            subscription: self.sub.name.clone(),
            partition: self.partition,
            lease: Some(self.owner.clone()),
            hop: task.hop + 1,
        };
        continue_with(self.subs.invoker.as_ref(), &serde_json::json!({ "run": next })).await?;
        self.summary.status = RunStatus::Continued;
        self.summary.position = Some(format_ms(super::position_ms(&self.position)));
        Ok(self.summary)
    }
}
