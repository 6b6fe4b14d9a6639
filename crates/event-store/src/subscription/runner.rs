//! One partition's runner: takes the partition's lease, then delivers the
//! partition's newly sealed events from its checkpoint, in rounds (each up
//! to the sealed end the watermark gives), saving the checkpoint after every
//! delivery while it holds the lease. Caught up, it follows the sealed log
//! (a look at the watermark every `SUBSCRIPTION_POLL_MS`) as [`super::follow`]
//! decides; near its deadline with more to deliver, it hands the lease to a
//! continuation, like playback.

use std::time::{Instant, SystemTime};

use serde_json::Value;
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::follow::{Follow, Next};
use super::run::{PartitionTask, RunStatus, RunSummary};
use super::target::{self, deliver_in_order, put_on_stream, DeliveredEvent, Delivery, Outcome, Position};
use super::Subscriptions;
use crate::bookkeeping::slot_index::read_index;
use crate::error::{Error, Result};
use crate::event_item::EventItem;
use crate::invoke::continue_with;
use crate::log::copies::RecentIds;
use crate::log::reader::{Page, PAGES_AHEAD};
use crate::log::tiers::Readable;
use crate::log::{PlayedEvent, Window};
use crate::position::Checkpoint;
use crate::readers::subscriptions::spec::{partition_of, OnPoison, State, Subscription, Target};
use crate::readers::subscriptions::{self, Parked, Taken};
use crate::time::{effective_deadline, format_ms, ms_of, now_ms, remaining, slot_of};

/// How long a handed-over lease waits for its continuation to start (as for playback).
const HANDOVER_LEASE_MS: i64 = 300_000;
/// Queued deliveries go out once they hold this much (besides every batch), so that large events keep memory bounded.
const PENDING_BYTES: usize = 8 << 20;

/// How often a following runner asks whether its subscription was paused or deleted.
const STATE_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// How a round (one pass up to a sealed end) ended.
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
                subscriptions::release(dynamo, table, (&sub.name, task.partition), handed).await?;
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
            Taken::Held(checkpoint) => {
                checkpoint.unwrap_or_else(|| Checkpoint::starting_at(sub.start_ms, self.config.time_unit_ms))
            }
            Taken::Gone => return Ok(RunSummary { status: RunStatus::Gone, ..summary }),
            Taken::Busy(until) => {
                summary.busy_until = Some(format_ms(until));
                return Ok(RunSummary { status: RunStatus::Busy, ..summary });
            }
            Taken::Stopped(error) => {
                return Ok(RunSummary { status: RunStatus::Stopped, error: Some(error), ..summary })
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
                if let Err(release) = subscriptions::release(dynamo, table, place, &owner).await {
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
            if let Some(end) = self.subs.sealed_to().await?.filter(|end| delivered_to < *end) {
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
        let (recent, lookback_queries) = self.subs.reader(&window).recent_ids(&slots, &lookback).await?;
        self.summary.queries += queries + lookback_queries;
        Ok(recent)
    }

    /// Delivers the partition's events from the position up to `sealed_end`
    /// (ms: the watermark; events that arrived before it).
    async fn round(&mut self, sealed_end: i64) -> Result<Round> {
        let subs = self.subs;
        let (dynamo, table) = (&subs.dynamo, subs.config.event_table.as_str());
        // Where to start within a slot is in the position (`after`), not in the window.
        let window = Window { start: 0, end: sealed_end };
        let (mut slots, index_queries) = read_index(dynamo, table, self.position.slot, sealed_end).await?;
        slots.retain(|s| s.slot >= self.position.slot);
        self.summary.queries += index_queries;
        let reader = subs.reader(&window);
        let (tx, rx) = mpsc::channel::<Result<Page>>(PAGES_AHEAD);
        let producer = reader.fetch_pages(slots, self.position.clone(), tx);
        let consumer = async {
            // Owned here: returning early drops it, which stops the reader (else it would wait on a full channel).
            let mut rx = rx;
            while let Some(page) = rx.recv().await {
                let page = page?;
                self.summary.queries += page.queries;
                self.summary.unreadable += page.unreadable;
                // Read whole (a payload fetched from S3, sealed parts opened) only in its partition's runner.
                let (n, partition) = (self.sub.partitions, self.partition);
                let (mine, others): (Vec<_>, Vec<_>) =
                    page.events.into_iter().partition(|e: &EventItem| partition_of(&e.partition_key, n) == partition);
                self.summary.other_partitions += others.len();
                let mut opened = subs.tiers.opened(mine);
                while let Some((event, readable)) = futures::StreamExt::next(&mut opened).await {
                    self.queue(event, readable)?;
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
            // Everything before the sealed end is done, events of other partitions included.
            let end = Checkpoint::starting_at(sealed_end, subs.config.time_unit_ms);
            self.save(Checkpoint { slot: end.slot, after: end.after, ..self.delivered_through() }).await?;
            Ok(Round::Done)
        };
        let ((), result) = tokio::join!(producer, consumer);
        result
    }

    /// Keeps an event that passes the filter (and is no copy of one just delivered) for delivery.
    fn queue(&mut self, event: EventItem, readable: Result<Readable>) -> Result<()> {
        let Readable { bytes, offloaded } = match readable {
            Ok(readable) => readable,
            Err(err) if !err.is_unreadable() => return Err(err),
            Err(err) => {
                // Not deliverable, and not to be skipped silently: parked with why (before the checkpoint passes it).
                warn!(slot = event.slot, error = %err, "unreadable event parked");
                self.summary.unreadable += 1;
                let place = Delivery {
                    seq: self.seq,
                    slot: event.slot,
                    sort_key: event.sort_key.clone(),
                    event_id: event.event_id.clone(),
                    partition_key: event.partition_key.clone(),
                    data: Vec::new(),
                };
                self.unreadable.push(place.parked(&self.sub.id, self.partition, format!("unreadable: {err}")));
                return Ok(());
            }
        };
        let json: Option<Value> = serde_json::from_slice(&bytes).ok();
        if self.recent.is_copy(json.as_ref(), event.arrival) {
            self.summary.duplicates_dropped += 1;
            return Ok(());
        }
        if !self.sub.filter.iter().all(|f| f.matches(json.as_ref())) {
            self.summary.filtered_out += 1;
            return Ok(());
        }
        let delivered = DeliveredEvent {
            subscription: self.sub.name.clone(),
            subscription_id: self.sub.id.clone(),
            partition: self.partition,
            position: Position { slot: event.slot, sort_key: event.sort_key.clone() },
            redriven: false,
            event: PlayedEvent::new(&event, json, &bytes, self.seq),
        };
        let data = delivered.record(&event, &self.sub.target, offloaded.as_ref())?;
        self.oldest_queued = Some(self.oldest_queued.map_or(event.arrival, |oldest| oldest.min(event.arrival)));
        self.pending.push(Delivery {
            seq: self.seq,
            slot: event.slot,
            sort_key: event.sort_key,
            event_id: event.event_id,
            partition_key: event.partition_key,
            data,
        });
        self.seq += 1;
        Ok(())
    }

    /// After a round: how long its oldest event took from arrival to delivery, in the
    /// summary and, where metrics are on, as `DeliveryLatencySeconds` for the subscription.
    fn record_latency(&mut self) {
        let Some(oldest) = self.oldest_queued.take() else { return };
        let (now, latency) = (now_ms(), (now_ms() - oldest).max(0));
        self.summary.latency_max_ms = self.summary.latency_max_ms.max(Some(latency));
        super::metrics::write_delivery_latency(self.subs.metrics.as_deref(), &self.sub.name, latency, now);
    }

    async fn deliver_pending(&mut self) -> Result<Option<Round>> {
        let batch = std::mem::take(&mut self.pending);
        if batch.is_empty() {
            return Ok(None);
        }
        self.deliver(batch).await
    }

    /// Delivers `batch` in order, parks what keeps failing, and saves the
    /// checkpoint past what is done. `Some`: the run ends here.
    async fn deliver(&mut self, batch: Vec<Delivery>) -> Result<Option<Round>> {
        let subs = self.subs;
        let stop_at_poison = self.sub.on_poison == OnPoison::Stop;
        let outcome = match &self.sub.target {
            Target::Kinesis(stream) => {
                let clients = (&subs.putter, &subs.kinesis);
                let ahead = self.position.ahead_since;
                put_on_stream(clients, stream, &batch, (self.sub.record_format, ahead), &subs.backoff).await
            }
            Target::Lambda(function) => {
                let place = (self.sub.name.as_str(), self.partition);
                let batches = target::lambda_batches(&batch, self.sub.batch_size);
                let (deadline, margin) = (self.deadline, subs.config.deadline_margin);
                let out_of_time = move || remaining(deadline) <= margin;
                deliver_in_order(batches, &subs.backoff, (stop_at_poison, &out_of_time), |range| {
                    target::invoke(&subs.lambda, function, place, &batch[range])
                })
                .await
            }
        };
        self.record(&batch, &outcome).await?;
        if let Some(error) = outcome.unavailable {
            warn!(subscription = %self.sub.name, partition = self.partition, error, "target unavailable: the partition is tried again after the backoff");
            self.summary.error = Some(error);
            return Ok(Some(Round::Ended(RunStatus::Unavailable)));
        }
        if stop_at_poison && !outcome.poison.is_empty() {
            self.summary.error = outcome.poison.last().map(|(_, e)| e.clone());
            return Ok(Some(Round::Ended(RunStatus::Stopped)));
        }
        if outcome.out_of_time {
            // Near the deadline inside a delivery: what is done is saved; the continuation goes on from it.
            return Ok(Some(Round::HandOver));
        }
        Ok(None)
    }

    /// Parks the poison events of `outcome`, then moves the checkpoint past what is done.
    async fn record(&mut self, batch: &[Delivery], outcome: &Outcome) -> Result<()> {
        let (dynamo, table) = (&self.subs.dynamo, self.subs.config.event_table.as_str());
        self.summary.target_requests += outcome.requests;
        for (index, error) in &outcome.poison {
            let event = &batch[*index];
            warn!(subscription = %self.sub.name, partition = self.partition, event_id = %event.event_id, error, "event parked");
            let parked = event.parked(&self.sub.id, self.partition, error.clone());
            subscriptions::park(dynamo, table, &self.sub.name, &parked).await?;
        }
        self.summary.parked += outcome.poison.len();
        self.summary.delivered += outcome.done - outcome.poison.len();
        let Some(last) = outcome.done.checked_sub(1).map(|i| &batch[i]) else {
            // Nothing done, but some of the batch may be stored ahead: the next delivery must know.
            if outcome.ahead_since != self.position.ahead_since {
                self.save(Checkpoint { ahead_since: outcome.ahead_since, ..self.position.clone() }).await?;
            }
            return Ok(());
        };
        let events = self.position.events + outcome.done as u64;
        let next = Checkpoint {
            slot: last.slot,
            after: Some(last.sort_key.clone()),
            seq: last.seq + 1,
            events,
            done: false,
            ahead_since: outcome.ahead_since,
        };
        match outcome.poison.last().filter(|_| self.sub.on_poison == OnPoison::Stop) {
            // The checkpoint past the parked event and the stop in one write: a crash cannot keep one without the other.
            Some((_, error)) => {
                self.park_unreadable(&next).await?;
                subscriptions::stop(dynamo, table, (&self.sub.name, self.partition), &self.owner, &next, error).await?;
                self.position = next;
                Ok(())
            }
            None => self.save(next).await,
        }
    }

    /// The position with every queued delivery done: nothing is stored ahead of it.
    fn delivered_through(&self) -> Checkpoint {
        Checkpoint { ahead_since: None, ..self.position.clone() }
    }

    /// Parks the unreadable events met before `checkpoint`: every checkpoint
    /// write (a save, a stop) comes after it, so no event is passed unparked.
    async fn park_unreadable(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let (dynamo, table) = (&self.subs.dynamo, self.subs.config.event_table.as_str());
        let passed = |p: &Parked| {
            p.slot < checkpoint.slot
                || (p.slot == checkpoint.slot
                    && checkpoint.after.as_deref().is_some_and(|a| p.event_sort_key.as_str() <= a))
        };
        let (now, later): (Vec<Parked>, Vec<Parked>) =
            std::mem::take(&mut self.unreadable).into_iter().partition(passed);
        self.unreadable = later;
        for parked in now {
            subscriptions::park(dynamo, table, &self.sub.name, &parked).await?;
            self.summary.parked += 1;
        }
        Ok(())
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
            subscriptions::release(dynamo, table, (&self.sub.name, self.partition), &self.owner).await?;
        }
        self.summary.status = status;
        self.summary.position = Some(format_ms(super::position_ms(&self.position).max(self.sub.start_ms)));
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
