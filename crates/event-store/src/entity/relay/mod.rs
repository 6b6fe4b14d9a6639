//! `relay`: the entity table's DynamoDB stream → the event stream, so entity
//! events reach the time-ordered log (and playback, and subscriptions).
//!
//! Each new batch item becomes one Kinesis record per event, partition key
//! `streams/<name>` ([`crate::envelope::entity_key`]), put in version order. What makes the
//! log hold each version once and in order, whatever the retries:
//! - **A position per stream** (`_relay`): a delivery puts only the versions
//!   after the stream's `relayed`, so a batch delivered again (one stream's
//!   key refused for an hour while the others were stored) puts nothing the
//!   log already has.
//! - **Version order from the table, not from the stream records.** DynamoDB
//!   Streams orders changes per item, and every append is a new item: two
//!   appends of one stream may sit in different stream shards. A delivery
//!   whose records start after `relayed + 1` reads the missing versions from
//!   the entity table (the source of truth) and puts them first.
//! - **Copies dropped by identity.** A put applied but answered with an
//!   error, or two relays racing on one stream, can still put a version
//!   twice; the pump drops every record of a version at or below the
//!   stream's `logged` ([`crate::bookkeeping::entity_positions`]), however late it comes.
//! - **A stream that cannot be relayed is held, not skipped.** While a
//!   stream's puts fail, the delivery is retried from its first unrelayed
//!   record (the other streams' records in it are skipped by their positions);
//!   after `hold_after`, the stream is held (its position says so, a message
//!   goes to the relay's dead-letter queue, its alarm fires) and the other
//!   streams move on. `event-store redrive --relay` relays what was held
//!   from the table, in order.

use std::collections::HashMap;
use std::time::Duration;

use aws_lambda_events::event::dynamodb::Event;
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use futures::StreamExt;
use serde_json::json;
use tracing::{error, info, warn};

use super::model::{Batch, RecordedEvent};
use super::{Direction, EntityError, EntityStore};
use crate::batch::Backoff;
use crate::bookkeeping::entity_positions::{Positions, RelayPosition};
use crate::config::RelayConfig;
use crate::error::{Error, Result};
use crate::kinesis::{put_in_key_order, send_put_records, OutgoingRecord};
use crate::time::now_ms;

mod records;

pub use records::{events_after, inserted_batch, log_record, retained_tip};

/// The AWS actions the relay calls (its event source mapping needs the stream-reading ones on top;
/// `sqs:SendMessage` is both the mapping's and the relay's, for a held stream).
pub const AWS_ACTIONS: &[&str] = &[
    "kinesis:PutRecords",
    "dynamodb:BatchGetItem",
    // Cleaning up what streams' metadata hides (`EntityStore::trim`).
    "dynamodb:BatchWriteItem",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:UpdateItem",
    "sqs:SendMessage",
];

/// Versions one read of the table fetches when filling a gap or re-relaying.
const READ_PAGE: usize = 1000;
/// Versions of one stream one delivery puts at most: a key's records go one
/// request each (the next only once the one before is stored), so a long gap
/// is relayed over several deliveries, each well inside the function's timeout.
pub const MAX_VERSIONS_PER_DELIVERY: u64 = 200;
/// How long after a delivery starts the cleanup of hidden history starts no
/// more steps: a delivery puts in seconds, and the function's timeout is 30 s.
const CLEANUP_BUDGET: Duration = Duration::from_secs(15);
/// Streams whose positions one delivery updates at once.
const POSITION_CONCURRENCY: usize = 16;

/// One stream's part of a delivery: its batches (from the stream records) and
/// the index of its first record (from where the delivery is retried).
struct Delivered {
    first_record: usize,
    batches: Vec<Batch>,
}

/// How one delivery went for one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every version up to the last one delivered is on the event stream.
    Relayed,
    /// Stored so far, with more to go than one delivery puts: delivered again.
    Partial,
    /// Some were not stored: delivered again.
    Failing,
    /// Failing for longer than the hold limit: the stream is held.
    Held,
}

impl Outcome {
    /// True when the delivery must come again for this stream.
    pub(crate) fn retry(self) -> bool {
        matches!(self, Outcome::Partial | Outcome::Failing)
    }
}

/// What to put for one stream: its position, the next versions in order, and
/// whether they reach the last version its delivery named.
pub(super) struct Plan {
    pub(super) position: RelayPosition,
    pub(super) events: Vec<RecordedEvent>,
    pub(super) complete: bool,
}

pub struct Relay {
    kinesis: aws_sdk_kinesis::Client,
    sqs: aws_sdk_sqs::Client,
    pub(super) store: EntityStore,
    pub(super) positions: Positions,
    settings: RelayConfig,
    backoff: Backoff,
}

impl Relay {
    pub fn new(
        kinesis: aws_sdk_kinesis::Client,
        dynamo: aws_sdk_dynamodb::Client,
        sqs: aws_sdk_sqs::Client,
        settings: RelayConfig,
    ) -> Self {
        let backoff = Backoff { base: Duration::from_millis(50), cap: Duration::from_secs(1), max_attempts: 6 };
        let store = EntityStore::new(dynamo.clone(), settings.entity_table.clone());
        let positions = Positions::new(dynamo, settings.entity_table.clone());
        Self { kinesis, sqs, store, positions, settings, backoff }
    }

    /// Relays one delivery of stream records. What could not be put is
    /// reported from the first record of the first stream still to go
    /// (the event source delivers again from there; the streams already
    /// relayed skip their records by position).
    pub async fn handle(&self, event: Event) -> DynamoDbEventResponse {
        let started = std::time::Instant::now();
        let mut streams: Vec<(String, Delivered)> = Vec::new();
        let mut retained: Vec<String> = Vec::new();
        for (index, record) in event.records.iter().enumerate() {
            match retained_tip(record) {
                Ok(Some(tip)) => {
                    if !retained.contains(&tip.stream) {
                        retained.push(tip.stream);
                    }
                    continue;
                }
                Ok(None) => {}
                Err(err) => error!(error = %err, keys = ?record.change.keys, "entity tip not read"),
            }
            match inserted_batch(record) {
                Ok(Some(batch)) => match streams.iter_mut().find(|(name, _)| *name == batch.stream) {
                    Some((_, delivered)) => delivered.batches.push(batch),
                    None => {
                        streams.push((batch.stream.clone(), Delivered { first_record: index, batches: vec![batch] }))
                    }
                },
                Ok(None) => {}
                // Written by this code, so never expected: say so loudly, do not block the stream.
                Err(err) => error!(error = %err, keys = ?record.change.keys, "entity stream record not relayed"),
            }
        }
        let delivered: HashMap<&str, &[Batch]> =
            streams.iter().map(|(name, d)| (name.as_str(), d.batches.as_slice())).collect();
        let retry_from = match self.relay(&delivered).await {
            Ok(outcomes) => streams
                .iter()
                .filter(|(name, _)| outcomes.get(name).is_some_and(|o| o.retry()))
                .map(|(_, d)| d.first_record)
                .min(),
            Err(err) => {
                error!(error = %err, "relay positions unreadable: the delivery is retried");
                streams.iter().map(|(_, d)| d.first_record).min()
            }
        };
        let mut response = DynamoDbEventResponse::default();
        if let Some(index) = retry_from {
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = event.records[index].change.sequence_number.clone();
            response.batch_item_failures.push(failure);
        }
        self.clean_up(&retained, started + CLEANUP_BUDGET).await;
        response
    }

    /// Removes from the table what these streams' metadata hides, up to what
    /// the log holds (on the event stream, and buffered: the smaller of their
    /// relay and logged positions), starting no stream's step after
    /// `give_up`. What is left waits for the stream's next change: readers
    /// never see hidden events anyway.
    async fn clean_up(&self, streams: &[String], give_up: std::time::Instant) {
        if streams.is_empty() {
            return;
        }
        let names: Vec<&str> = streams.iter().map(String::as_str).collect();
        let positions = self.positions.relay_positions(&names).await;
        let logged = self.positions.logged(&names).await;
        let (positions, logged) = match (positions, logged) {
            (Ok(positions), Ok(logged)) => (positions, logged),
            (Err(err), _) | (_, Err(err)) => return warn!(error = %err, "positions unreadable: no cleanup now"),
        };
        let now = now_ms();
        for stream in streams {
            if std::time::Instant::now() >= give_up {
                return info!(stream, "out of the cleanup's time: left for the stream's next change");
            }
            let relayed = positions.get(stream).and_then(|p| p.relayed);
            let durable = relayed.zip(logged.get(stream).copied()).map(|(r, l)| r.min(l));
            match self.store.trim(stream, durable, now, give_up).await {
                Ok(done) if done.batches > 0 => {
                    info!(stream, batches = done.batches, events = done.events, more = done.more, "cleaned up")
                }
                Ok(_) => {}
                Err(err) => {
                    warn!(error = %err, stream, "cleanup failed: retried at the stream's next change")
                }
            }
        }
    }

    /// Relays the delivered streams from their positions: the versions their
    /// batches hold, with any gap before them read from the table.
    async fn relay(&self, delivered: &HashMap<&str, &[Batch]>) -> Result<HashMap<String, Outcome>> {
        let streams: Vec<&str> = delivered.keys().copied().collect();
        let positions = self.positions.relay_positions(&streams).await?;
        let now = now_ms();
        let mut plans = Vec::new();
        let mut outcomes = HashMap::new();
        for (name, position) in positions {
            let batches = delivered.get(name.as_str()).copied().unwrap_or_default();
            let outcome = match self.plan(position, batches).await {
                Ok(Some(plan)) => {
                    plans.push(plan);
                    continue;
                }
                Ok(None) => Outcome::Relayed,
                Err((position, reason)) if position.held() => {
                    info!(stream = name, reason, "held: left for a re-relay");
                    Outcome::Held
                }
                Err((position, reason)) => self.failed(&position, position.next(), &reason, now).await,
            };
            outcomes.insert(name, outcome);
        }
        outcomes.extend(self.put_and_record(plans).await);
        Ok(outcomes)
    }

    /// What to put for one stream, `None` when it is caught up; the reason
    /// when nothing can be put now (held, or the table unreadable).
    async fn plan(
        &self,
        mut position: RelayPosition,
        batches: &[Batch],
    ) -> std::result::Result<Option<Plan>, (RelayPosition, String)> {
        let stream = position.stream.clone();
        if position.held() {
            return Err((position, "held".into()));
        }
        let Some(last) = batches.iter().map(Batch::last).max() else { return Ok(None) };
        if !position.known {
            // Relayed before positions existed: its history is on the event stream
            // already, so it starts at what this delivery holds.
            if let Some(first) = batches.iter().map(|b| b.first).min().filter(|first| *first > 0) {
                if let Err(err) = self.positions.advance(&stream, first - 1).await {
                    return Err((position, format!("position not saved: {err}")));
                }
                position.relayed = Some(first - 1);
            }
        }
        let next = position.next();
        let to = last.min(next + MAX_VERSIONS_PER_DELIVERY - 1);
        let mut events = match events_after(next, batches) {
            Some(events) => events,
            None => match self.read_versions(&stream, next, to).await {
                Ok(events) => events,
                Err(err) => return Err((position, format!("versions from {next} unreadable: {err}"))),
            },
        };
        events.retain(|e| e.version <= to);
        if events.is_empty() {
            if position.failing_since.is_some() {
                // Caught up (another relay stored them): the failure mark is stale.
                if let Err(err) = self.positions.clear_failing(&stream).await {
                    warn!(error = %err, stream, "stale failure mark not cleared");
                }
            }
            return Ok(None);
        }
        Ok(Some(Plan { position, events, complete: to == last }))
    }

    /// Puts each stream's events in version order, then records how far each got.
    pub(super) async fn put_and_record(&self, plans: Vec<Plan>) -> HashMap<String, Outcome> {
        let mut records = Vec::new();
        let mut owner = Vec::new();
        let mut unencodable = Vec::new();
        for (index, plan) in plans.iter().enumerate() {
            match plan.events.iter().map(log_record).collect::<Result<Vec<OutgoingRecord>>>() {
                Ok(built) => {
                    owner.extend(std::iter::repeat_n(index, built.len()));
                    records.extend(built);
                }
                Err(err) => unencodable.push((index, err.to_string())),
            }
        }
        let stream = self.settings.event_stream.as_str();
        let put = put_in_key_order(
            &records,
            &self.backoff,
            |batch| async move { send_put_records(&self.kinesis, stream, &batch).await },
            |batch| async move { Ok(vec![false; batch.len()]) },
        )
        .await;
        // A stream's records go in order: the first failure ends what it stored.
        let mut first_failed: HashMap<usize, (usize, String)> = HashMap::new();
        for failure in &put.failures {
            let entry = first_failed.entry(owner[failure.index]).or_insert((failure.index, failure.code.clone()));
            if failure.index < entry.0 {
                *entry = (failure.index, failure.code.clone());
            }
        }
        let now = now_ms();
        let mut updates = Vec::new();
        for (index, plan) in plans.iter().enumerate() {
            let start = owner.iter().position(|&o| o == index).unwrap_or(0);
            let failed = match unencodable.iter().find(|(i, _)| *i == index) {
                Some((_, err)) => Some((start, format!("not encodable: {err}"))),
                None => first_failed.get(&index).cloned(),
            };
            let stored = failed.as_ref().map_or(plan.events.len(), |(at, _)| at - start);
            let relayed = stored.checked_sub(1).map(|i| plan.events[i].version);
            updates.push(self.record(plan, relayed, failed.map(|(_, code)| code), now));
        }
        let recorded: Vec<(String, Outcome)> =
            futures::stream::iter(updates).buffer_unordered(POSITION_CONCURRENCY).collect().await;
        info!(records = records.len(), failed = put.failures.len(), "relayed");
        recorded.into_iter().collect()
    }

    /// Records one stream's progress: relayed up to `relayed`; failing (with
    /// `code`) from the version after it.
    async fn record(&self, plan: &Plan, relayed: Option<u64>, code: Option<String>, now: i64) -> (String, Outcome) {
        let stream = plan.position.stream.clone();
        if let Some(version) = relayed {
            if let Err(err) = self.positions.advance(&stream, version).await {
                // Stored, not recorded: delivered again, the copies are dropped by the pump.
                warn!(error = %err, stream, "relay position not saved");
                return (stream, Outcome::Failing);
            }
        }
        let outcome = match code {
            None if plan.complete => Outcome::Relayed,
            None => Outcome::Partial,
            Some(code) => {
                let failed_at = relayed.map_or(plan.position.next(), |v| v + 1);
                self.failed(&plan.position, failed_at, &code, now).await
            }
        };
        (stream, outcome)
    }

    /// A stream could not be relayed from version `failed_at`: marked failing
    /// (unless another relay has stored it since), held once it has failed for
    /// the hold limit.
    async fn failed(&self, position: &RelayPosition, failed_at: u64, code: &str, now: i64) -> Outcome {
        let stream = position.stream.as_str();
        let position = match self.positions.failing(stream, failed_at, now).await {
            Ok(Some(position)) => position,
            // Another relay has stored it since (or the stream has no position yet): the
            // delivery comes again and skips what is stored.
            Ok(None) => return Outcome::Failing,
            Err(err) => {
                warn!(error = %err, stream, code, "entity events not relayed, nor the failure recorded; delivered again");
                return Outcome::Failing;
            }
        };
        if !position.due_for_hold(now, self.settings.hold_after) {
            warn!(stream, code, next = failed_at, "entity events not relayed; delivered again");
            return Outcome::Failing;
        }
        let since = position.failing_since.unwrap_or(now);
        let reason = format!("not relayed for {} s: {code}", (now - since) / 1000);
        match self.hold(stream, since, failed_at, &reason, now).await {
            Ok(()) => {
                error!(
                    stream,
                    next = failed_at,
                    reason,
                    "entity stream held: re-relay it (drain the relay dead-letter queue)"
                );
                Outcome::Held
            }
            Err(err) => {
                warn!(error = %err, stream, "stream not held; delivered again");
                Outcome::Failing
            }
        }
    }

    /// Holds `stream` (unless a re-relay released it or another relay holds it
    /// since the failure was seen), then announces it on the dead-letter queue;
    /// without a queue to announce it on, a stream is never held (the
    /// delivery is retried, and the iterator-age alarm fires).
    async fn hold(&self, stream: &str, since: i64, next: u64, reason: &str, now: i64) -> Result<()> {
        let Some(queue) = &self.settings.dead_letter_queue else {
            return Err(Error::Config("RELAY_DLQ_URL is not set: nowhere to announce a held stream".into()));
        };
        self.positions.hold(stream, since, now, reason).await?;
        let body = json!({"heldStream": stream, "nextVersion": next, "reason": reason, "heldAt": now});
        let sent = self.sqs.send_message().queue_url(queue).message_body(body.to_string()).send().await;
        if let Err(err) = sent {
            self.positions.release(stream).await?;
            return Err(Error::Sqs { operation: "SendMessage", source: err.into() });
        }
        Ok(())
    }

    /// Versions `from..=to` of `stream`, from the table.
    pub(super) async fn read_versions(&self, stream: &str, from: u64, to: u64) -> Result<Vec<RecordedEvent>> {
        let mut events = Vec::new();
        let mut next = Some(from);
        while let Some(at) = next.filter(|at| *at <= to) {
            let page = self.store.read_with_refs(stream, Some(at), READ_PAGE, Direction::Forward).await.map_err(
                |e| match e {
                    EntityError::Store(err) => err,
                    other => Error::Malformed(format!("{stream}: {other}")),
                },
            )?;
            events.extend(page.events.into_iter().filter(|e| e.version <= to));
            next = page.next;
        }
        Ok(events)
    }
}
