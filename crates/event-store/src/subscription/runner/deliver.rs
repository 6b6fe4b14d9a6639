//! A runner's deliveries: the events a round queues (readable, no copy,
//! passing the filter), handed to the target in order, and what is recorded
//! after each (parked events, the checkpoint past what is done).

use serde_json::Value;
use tracing::warn;

use super::{Round, Runner};
use crate::error::Result;
use crate::event_item::EventItem;
use crate::log::tiers::Readable;
use crate::log::PlayedEvent;
use crate::position::Checkpoint;
use crate::readers::subscriptions::spec::{OnPoison, Target};
use crate::readers::subscriptions::{self, Parked};
use crate::subscription::run::RunStatus;
use crate::subscription::target::{self, deliver_in_order, put_on_stream, DeliveredEvent, Delivery, Outcome, Position};
use crate::time::{now_ms, remaining};

impl Runner<'_> {
    /// Keeps an event that passes the filter (and is no copy of one just delivered) for delivery.
    pub(super) fn queue(&mut self, event: EventItem, readable: Result<Readable>) -> Result<()> {
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
        let selected = self.sub.select.keeps_opened(&event.partition_key, json.as_ref());
        if !selected || !self.sub.filter.iter().all(|f| f.matches(json.as_ref())) {
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
    pub(super) fn record_latency(&mut self) {
        let Some(oldest) = self.oldest_queued.take() else { return };
        let (now, latency) = (now_ms(), (now_ms() - oldest).max(0));
        self.summary.latency_max_ms = self.summary.latency_max_ms.max(Some(latency));
        crate::subscription::metrics::write_delivery_latency(
            self.subs.metrics.as_deref(),
            &self.sub.name,
            latency,
            now,
        );
    }

    pub(super) async fn deliver_pending(&mut self) -> Result<Option<Round>> {
        let batch = std::mem::take(&mut self.pending);
        if batch.is_empty() {
            return Ok(None);
        }
        self.deliver(batch).await
    }

    /// Delivers `batch` in order, parks what keeps failing, and saves the
    /// checkpoint past what is done. `Some`: the run ends here.
    pub(super) async fn deliver(&mut self, batch: Vec<Delivery>) -> Result<Option<Round>> {
        let subs = self.subs;
        let stop_at_poison = self.sub.on_poison == OnPoison::Stop;
        let outcome = match &self.sub.target {
            Target::Kinesis(stream) => {
                let clients = (&subs.putter, &subs.kinesis);
                let ahead = self.position.ahead_since;
                let outcome =
                    put_on_stream(clients, stream, &batch, (self.sub.record_format, ahead), &subs.backoff).await;
                (batch, outcome)
            }
            Target::Lambda(function) => {
                let place = (self.sub.name.as_str(), self.partition);
                let batches = target::lambda_batches(&batch, self.sub.batch_size);
                let (deadline, margin) = (self.deadline, subs.config.deadline_margin);
                let out_of_time = move || remaining(deadline) <= margin;
                let outcome = deliver_in_order(batches, &subs.backoff, (stop_at_poison, &out_of_time), |range| {
                    target::invoke(&subs.lambda, function, (place.0, place.1, None), &batch[range])
                })
                .await;
                (batch, outcome)
            }
            Target::View(view) => {
                // Stopped after each parked event, which is parked (and the checkpoint moved past it)
                // before any later event is applied: applied past, an unparked refused event would be
                // skipped by the view's position after a crash, never parked.
                let (deadline, margin) = (self.deadline, subs.config.deadline_margin);
                let out_of_time = move || remaining(deadline) <= margin;
                let (name, partition, view) = (self.sub.name.clone(), self.partition, view.clone());
                let mut rest = batch;
                loop {
                    let batches = target::lambda_batches(&rest, self.sub.batch_size);
                    let outcome = deliver_in_order(batches, &subs.backoff, (true, &out_of_time), |range| {
                        subs.apply_view(&name, &view, partition, &rest[range])
                    })
                    .await;
                    let parked_and_on = !outcome.poison.is_empty() && !stop_at_poison && outcome.done < rest.len();
                    if !parked_and_on || outcome.unavailable.is_some() || outcome.out_of_time {
                        break (rest, outcome);
                    }
                    self.record(&rest, &outcome).await?;
                    rest = rest.split_off(outcome.done);
                }
            }
        };
        let (batch, outcome) = outcome;
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
    pub(super) async fn record(&mut self, batch: &[Delivery], outcome: &Outcome) -> Result<()> {
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
    pub(super) fn delivered_through(&self) -> Checkpoint {
        Checkpoint { ahead_since: None, ..self.position.clone() }
    }

    /// Parks the unreadable events met before `checkpoint`: every checkpoint
    /// write (a save, a stop) comes after it, so no event is passed unparked.
    pub(super) async fn park_unreadable(&mut self, checkpoint: &Checkpoint) -> Result<()> {
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
}
