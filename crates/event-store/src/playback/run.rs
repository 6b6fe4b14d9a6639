//! One invocation's playing: pages come in from the reader in order; each is
//! accepted (decoded, filtered, numbered, queued), full batches are put, and
//! near the deadline the run stops at a checkpoint and hands the rest over.
//! Steps: [`Run::accept`], [`Run::finish`], [`Run::hand_over`].

use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use serde_json::Value;
use tracing::{info, warn};

use super::pacer::Pacer;
use super::request::PlaybackRequest;
use super::summary::{PlaybackSummary, Progress, SlotPlayed, Status};
use super::Playback;
use crate::batch::KINESIS_BATCH_RECORDS;
use crate::error::{Error, Result};
use crate::event_item::EventItem;
use crate::invoke::continue_with;
use crate::kinesis::{put_in_key_order, send_put_records, stored_since, OutgoingRecord};
use crate::log::copies::RecentIds;
use crate::log::reader::Page;
use crate::log::record::{fits_one_record, kinesis_records, PlayedEvent};
use crate::log::tiers::Readable;
use crate::log::Checkpoint;
use crate::log::Window;
use crate::readers::playbacks;
use crate::select::pass_over;
use crate::time::{format_ms, now_ms, remaining};

/// How long before a put its read-back starts, for clock differences with Kinesis.
const READ_BACK_MARGIN_MS: i64 = 5_000;
/// How long a handed-over lease waits for its continuation to start; after
/// that, the same request again may take the run over (Lambda drops older
/// queued continuations anyway: `MaximumEventAgeInSeconds` in the template).
const HANDOVER_LEASE_MS: i64 = 300_000;

/// A record accepted but not yet put, with its event's place in the table.
struct Pending {
    slot: i64,
    sort_key: String,
    record: OutgoingRecord,
}

/// Queued records are put once they hold this much (besides every 500): a
/// run's memory stays bounded when events are large.
const PENDING_BYTES: usize = 8 << 20;

fn pending_bytes(pending: &[Pending]) -> usize {
    pending.iter().map(|p| p.record.data.len()).sum()
}

/// Where a run starts: its position, its pace, the envelope ids delivered
/// just before, and the lease it holds (the owner token).
pub struct Start {
    pub position: Checkpoint,
    pub pacer: Pacer,
    pub recent: RecentIds,
    pub owner: String,
}

/// What the run does after a step.
pub enum Flow {
    Go,
    /// Stop here; the continuation starts from this checkpoint.
    HandOver(Checkpoint),
}

/// What a put did.
enum Put {
    Sent,
    /// Nothing sent: waiting for the pace would run into the deadline margin.
    WouldCrossDeadline,
}

/// The current slot's first played event and count, for the observer.
#[derive(Default)]
struct SlotTally {
    first: Option<i64>,
    count: usize,
}

pub struct Run<'a> {
    playback: &'a Playback,
    request: &'a PlaybackRequest,
    window: &'a Window,
    deadline: SystemTime,
    pacer: Pacer,
    started: Instant,
    /// The sequence number the next accepted event gets.
    seq: u64,
    /// Where the stream stands: after the last put.
    checkpoint: Checkpoint,
    pending: Vec<Pending>,
    /// Envelope ids of the last `dedupe_window_ms`, to skip a second copy of an accepted event.
    recent: RecentIds,
    slot: SlotTally,
    summary: PlaybackSummary,
    /// The lease this run holds: every checkpoint write is conditional on it.
    owner: String,
    /// When the lease was last renewed (taken, or a checkpoint saved).
    renewed: Instant,
}

impl<'a> Run<'a> {
    pub(crate) fn new(
        playback: &'a Playback,
        request: &'a PlaybackRequest,
        window: &'a Window,
        start: Start,
        deadline: SystemTime,
        summary: PlaybackSummary,
    ) -> Self {
        let Start { position, pacer, recent, owner } = start;
        Self {
            playback,
            request,
            window,
            deadline,
            pacer,
            started: Instant::now(),
            seq: position.seq,
            checkpoint: position,
            pending: Vec::new(),
            recent,
            slot: SlotTally::default(),
            summary,
            owner,
            renewed: Instant::now(),
        }
    }

    /// Takes one page: queues its events, puts every full batch, reports a
    /// finished slot, and near the deadline stops.
    pub(crate) async fn accept(&mut self, page: Page) -> Result<Flow> {
        self.summary.queries += page.queries;
        self.summary.unreadable += page.unreadable;
        // Only this run's keys, and what the selection keeps by fields in the clear, are opened.
        let keys = self.request.key_range();
        let passed = pass_over(page.events, |key| keys.holds(key), &self.request.select);
        self.summary.other_keys += passed.other_keys;
        self.summary.filtered_out += passed.excluded;
        let mut opened = self.playback.tiers.opened(passed.kept);
        while let Some((event, readable)) = opened.next().await {
            self.queue(page.slot, event, readable)?;
            // Large events (payloads put back from S3) go out before more are held.
            if pending_bytes(&self.pending) >= PENDING_BYTES {
                if let Put::WouldCrossDeadline = self.put_full_batches().await? {
                    return Ok(Flow::HandOver(self.checkpoint.clone()));
                }
            }
        }
        // Pages with nothing to put (a filter that keeps little) still keep the lease alive.
        if self.renewed.elapsed() >= self.playback.lease() / 3 {
            self.save(&self.checkpoint.clone()).await?;
        }
        if let Put::WouldCrossDeadline = self.put_full_batches().await? {
            // The next run starts after the last put.
            return Ok(Flow::HandOver(self.checkpoint.clone()));
        }
        if page.last_key.is_none() {
            self.slot_done(page.slot);
        }
        if remaining(self.deadline) <= self.playback.config.deadline_margin {
            return self.stop_after(page.slot, page.last_key).await;
        }
        Ok(Flow::Go)
    }

    /// Decodes, filters and numbers one event, and queues its record.
    fn queue(&mut self, slot: i64, event: EventItem, readable: Result<Readable>) -> Result<()> {
        let Readable { bytes, offloaded } = match readable {
            Ok(readable) => readable,
            Err(err) if !err.is_unreadable() => return Err(err),
            Err(err) => {
                warn!(slot, error = %err, "event skipped");
                self.summary.unreadable += 1;
                return Ok(());
            }
        };
        let json: Option<Value> = serde_json::from_slice(&bytes).ok();
        if self.recent.is_copy(json.as_ref(), event.arrival) {
            self.summary.duplicates_dropped += 1;
            return Ok(());
        }
        if !self.request.wants(&event.partition_key, json.as_ref()) {
            self.summary.filtered_out += 1;
            return Ok(());
        }
        self.slot.first.get_or_insert(event.arrival);
        self.slot.count += 1;
        self.summary.first_event.get_or_insert_with(|| format_ms(event.arrival));
        self.summary.last_event = Some(format_ms(event.arrival));
        let played = PlayedEvent { keys: self.request.keys, ..PlayedEvent::new(&event, json, &bytes, self.seq) };
        let mut data = serde_json::to_vec(&played).map_err(|e| Error::encode("played event", e))?;
        if !fits_one_record(&event.partition_key, data.len()) {
            // Kinesis would refuse the whole request: a marker takes its place, in order.
            warn!(slot, sort_key = %event.sort_key, bytes = data.len(), "played event over the Kinesis record limit: a marker is put instead");
            self.summary.oversized += 1;
            let marker = PlayedEvent {
                keys: self.request.keys,
                ..PlayedEvent::too_large(&event, data.len(), offloaded.as_ref(), self.seq)
            };
            data = serde_json::to_vec(&marker).map_err(|e| Error::encode("played event", e))?;
        }
        self.seq += 1;
        let record = OutgoingRecord { partition_key: event.partition_key, data };
        self.pending.push(Pending { slot, sort_key: event.sort_key, record });
        Ok(())
    }

    /// Puts what is queued in batches of 500 records, and all of it once it holds [`PENDING_BYTES`].
    async fn put_full_batches(&mut self) -> Result<Put> {
        while self.pending.len() >= KINESIS_BATCH_RECORDS || pending_bytes(&self.pending) >= PENDING_BYTES {
            let n = self.pending.len().min(KINESIS_BATCH_RECORDS);
            let batch: Vec<Pending> = self.pending.drain(..n).collect();
            let next_seq = self.seq - self.pending.len() as u64;
            if let Put::WouldCrossDeadline = self.put(batch, next_seq, Some(self.margin())).await? {
                return Ok(Put::WouldCrossDeadline);
            }
        }
        Ok(Put::Sent)
    }

    fn slot_done(&mut self, slot: i64) {
        let tally = std::mem::take(&mut self.slot);
        let Some(first) = tally.first else { return };
        let count = tally.count;
        self.playback.tell(Progress::Slot(SlotPlayed { slot, first_event: first, count }));
        info!(slot = %format_ms(slot), first = %format_ms(first), count, "{}: {} [{count}]", format_ms(slot), format_ms(first));
    }

    /// Near the deadline: puts what is queued, and saves the position after
    /// the page just read (everything consumed so far is done, filtered events included).
    async fn stop_after(&mut self, slot: i64, last_key: Option<String>) -> Result<Flow> {
        let batch = std::mem::take(&mut self.pending);
        // Inside the margin already: this last put may use half of it (the save and the invoke need the rest).
        if let Put::WouldCrossDeadline = self.put(batch, self.seq, Some(self.margin() / 2)).await? {
            return Ok(Flow::HandOver(self.checkpoint.clone()));
        }
        let base = Checkpoint { seq: self.seq, ..self.checkpoint.clone() };
        let resume = match last_key {
            Some(key) => Checkpoint { slot, after: Some(key), ..base },
            None => Checkpoint { slot: slot + self.playback.config.time_unit_ms as i64, after: None, ..base },
        };
        self.save(&resume).await?;
        Ok(Flow::HandOver(resume))
    }

    /// The last page is in: puts the rest (unless the pace would take it
    /// into the deadline margin: then the continuation does) and marks the
    /// checkpoint done, giving up the lease.
    pub(crate) async fn finish(mut self) -> Result<PlaybackSummary> {
        let batch = std::mem::take(&mut self.pending);
        if let Put::WouldCrossDeadline = self.put(batch, self.seq, Some(self.margin())).await? {
            let resume = self.checkpoint.clone();
            return self.hand_over(resume).await;
        }
        self.checkpoint.done = true;
        self.checkpoint.seq = self.seq;
        let (dynamo, table) = (&self.playback.dynamo, &self.playback.config.event_table);
        playbacks::save(dynamo, table, &self.summary.id, &self.owner, &self.checkpoint, Some(0)).await?;
        let summary = PlaybackSummary { next_seq: self.seq, ..self.summary };
        info!(
            id = %summary.id,
            slots = summary.slots,
            events = summary.events,
            queries = summary.queries,
            requests = summary.put_requests,
            "playback done"
        );
        Ok(summary)
    }

    /// Hands the rest of the window, from `resume` (saved with the lease
    /// extended for the continuation), to a continuation that carries the
    /// lease token; at `MAX_CONTINUATIONS` the chain stops instead, and
    /// gives the lease up: the same request again goes on from the checkpoint.
    pub(crate) async fn hand_over(self, resume: Checkpoint) -> Result<PlaybackSummary> {
        let (dynamo, table) = (&self.playback.dynamo, &self.playback.config.event_table);
        let id = self.summary.id.clone();
        if self.request.hop >= self.playback.config.max_continuations {
            playbacks::save(dynamo, table, &id, &self.owner, &resume, Some(0)).await?;
            warn!(
                id,
                hops = self.request.hop,
                "MAX_CONTINUATIONS reached: stopped; send the same request again to go on"
            );
            return Ok(PlaybackSummary { status: Status::Stopped, next_seq: resume.seq, ..self.summary });
        }
        playbacks::save(dynamo, table, &id, &self.owner, &resume, Some(now_ms() + HANDOVER_LEASE_MS)).await?;
        let next = PlaybackRequest {
            start: Some(format_ms(self.window.start)),
            end: Some(format_ms(self.window.end)),
            wait_seconds: None,
            id: Some(id.clone()),
            restart: false,
            lease: Some(self.owner.clone()),
            hop: self.request.hop + 1,
            ..self.request.clone()
        };
        info!(id, slot = resume.slot, seq = resume.seq, hop = next.hop, "playback continues asynchronously");
        continue_with(self.playback.invoker.as_ref(), &next).await?;
        Ok(PlaybackSummary { status: Status::Continued, next_seq: resume.seq, ..self.summary })
    }

    fn margin(&self) -> Duration {
        self.playback.config.deadline_margin
    }

    /// Puts `batch` in order, at the pace, then saves the checkpoint after its
    /// last event; the first record of the batch gets `next_seq - batch.len()`.
    /// With a `reserve`, sends nothing when waiting for the pace would leave
    /// less than it before the deadline and this run has already put
    /// something (so every run makes progress).
    async fn put(&mut self, batch: Vec<Pending>, next_seq: u64, reserve: Option<Duration>) -> Result<Put> {
        let Some(last) = batch.last() else { return Ok(Put::Sent) };
        let (slot, after) = (last.slot, last.sort_key.clone());
        let wait = self.pacer.next_at().saturating_sub(self.started.elapsed());
        if let Some(reserve) = reserve {
            if self.summary.put_requests > 0 && remaining(self.deadline) <= reserve + wait {
                return Ok(Put::WouldCrossDeadline);
            }
        }
        // Waiting for the pace, in steps that keep the lease alive (a slow rate can wait for minutes).
        let step = self.playback.lease() / 3;
        let mut left = wait;
        while !left.is_zero() {
            let nap = left.min(step);
            tokio::time::sleep(nap).await;
            left -= nap;
            if !left.is_zero() {
                self.save(&self.checkpoint.clone()).await?;
            }
        }
        let events_in_batch = batch.len();
        let records = kinesis_records(batch.into_iter().map(|p| p.record).collect(), self.request.record_format);
        let (putter, reader) = (&self.playback.putter, &self.playback.kinesis);
        let stream = self.playback.config.playback_stream.as_str();
        // Read-backs start a little before the first send (Kinesis' clock is not ours).
        let since = now_ms() - READ_BACK_MARGIN_MS;
        let stats = put_in_key_order(
            &records,
            &self.playback.backoff,
            |batch| async move { send_put_records(putter, stream, &batch).await },
            |batch| async move { stored_since(reader, stream, since, &batch).await },
        )
        .await;
        self.summary.put_requests += stats.requests;
        self.summary.resent += stats.retried;
        self.summary.checked_requests += stats.checked;
        if let Some(first) = stats.failures.first() {
            return Err(Error::KinesisPartial {
                operation: "PutRecords",
                failed: stats.failures.len(),
                code: first.code.clone(),
            });
        }
        // A rate the request names counts played events; the stream's own limit counts its records.
        let paced = if self.request.max_records_per_second.is_some() { events_in_batch } else { records.len() };
        self.pacer.sent(paced, records.iter().map(OutgoingRecord::size).sum());
        self.summary.events += events_in_batch;
        self.summary.kinesis_records += records.len();
        let events = self.checkpoint.events + events_in_batch as u64;
        self.checkpoint = Checkpoint { slot, after: Some(after), seq: next_seq, events, ..Checkpoint::default() };
        self.save(&self.checkpoint.clone()).await?;
        Ok(Put::Sent)
    }

    /// Saves the position while this run holds the lease, and renews the
    /// lease (else: [`Error::LeaseLost`], and the run stops).
    async fn save(&mut self, checkpoint: &Checkpoint) -> Result<()> {
        let (dynamo, table) = (&self.playback.dynamo, &self.playback.config.event_table);
        let until = now_ms() + self.playback.lease().as_millis() as i64;
        playbacks::save(dynamo, table, &self.summary.id, &self.owner, checkpoint, Some(until)).await?;
        self.renewed = Instant::now();
        Ok(())
    }
}
