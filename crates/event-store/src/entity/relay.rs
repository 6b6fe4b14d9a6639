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
//!   stream's `logged` ([`super::log`]), however late it comes.
//! - **A stream that cannot be relayed is held, not skipped.** While a
//!   stream's puts fail, the delivery is retried from its first unrelayed
//!   record (the other streams' records in it are skipped by their positions);
//!   after `hold_after`, the stream is held (its position says so, a message
//!   goes to the relay's dead-letter queue, its alarm fires) and the other
//!   streams move on. `event-store-local relay-redrive` relays what was held
//!   from the table, in order.

use std::collections::HashMap;
use std::time::Duration;

use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use futures::StreamExt;
use serde_json::json;
use tracing::{error, info, warn};

use super::log::{Positions, RelayPosition};
use super::model::{batch_version, Batch, RecordedEvent, RANGE_KEY};
use super::{Direction, EntityError, EntityStore};
use crate::batch::Backoff;
use crate::config::RelayConfig;
use crate::envelope::{entity_event_id, entity_key, Envelope, Headers, ENTITY_ID};
use crate::error::{Error, Result};
use crate::kinesis::{put_in_key_order, send_put_records, OutgoingRecord};
use crate::time::now_ms;

/// The AWS actions the relay calls (its event source mapping needs the stream-reading ones on top;
/// `sqs:SendMessage` is both the mapping's and the relay's, for a held stream).
pub const AWS_ACTIONS: &[&str] = &[
    "kinesis:PutRecords",
    "dynamodb:BatchGetItem",
    "dynamodb:GetItem",
    "dynamodb:Query",
    "dynamodb:UpdateItem",
    "sqs:SendMessage",
];

/// Versions one read of the table fetches when filling a gap or re-driving.
const READ_PAGE: usize = 1000;
/// Streams whose positions one delivery updates at once.
const POSITION_CONCURRENCY: usize = 16;

/// The batch item a stream record inserts, if it is one (tips, snapshots,
/// positions and removals are not events).
pub fn inserted_batch(record: &EventRecord) -> std::result::Result<Option<Batch>, String> {
    if record.event_name != "INSERT" {
        return Ok(None);
    }
    let image = &record.change.new_image;
    let is_batch = match image.get(RANGE_KEY) {
        Some(serde_dynamo::AttributeValue::S(key)) => batch_version(key).is_some(),
        _ => false,
    };
    if !is_batch {
        return Ok(None);
    }
    serde_dynamo::from_item(image.clone()).map(Some).map_err(|e| e.to_string())
}

/// The log record of one entity event: an envelope whose id is `<stream>/<version>`.
pub fn log_record(event: &RecordedEvent) -> Result<OutgoingRecord> {
    let mut body = serde_json::to_value(event).map_err(|e| Error::encode("entity event", e))?;
    body[ENTITY_ID] = json!(event.stream);
    let envelope = Envelope {
        id: entity_event_id(&event.stream, event.version),
        received_at: event.time.clone(),
        method: "POST".into(),
        path: format!("/streams/{}", event.stream),
        query: Default::default(),
        headers: Headers::default(),
        source_ip: None,
        body: Some(body),
    };
    let data = serde_json::to_vec(&envelope).map_err(|e| Error::encode("envelope", e))?;
    Ok(OutgoingRecord { partition_key: entity_key(&event.stream), data })
}

/// One stream's part of a delivery: its batches (from the stream records) and
/// the index of its first record (from where the delivery is retried).
struct Delivered {
    first_record: usize,
    batches: Vec<Batch>,
}

/// The events to put for one stream from its position on, when the
/// delivered batches hold them without a gap; `None` when some are missing
/// (in another stream shard, or not delivered again after a hold).
pub fn events_after(next: u64, batches: &[Batch]) -> Option<Vec<RecordedEvent>> {
    let mut sorted: Vec<&Batch> = batches.iter().filter(|b| b.last() >= next).collect();
    sorted.sort_by_key(|b| b.first);
    let mut events: Vec<RecordedEvent> = Vec::new();
    for batch in sorted {
        for event in batch.read().filter(|e| e.version >= next) {
            let expected = events.last().map_or(next, |e| e.version + 1);
            if event.version < expected {
                continue; // the same batch delivered twice
            }
            if event.version > expected {
                return None;
            }
            events.push(event);
        }
    }
    Some(events)
}

/// How the relay's puts went for one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every version up to the last one delivered is on the event stream.
    Relayed,
    /// Some were not stored: retry the delivery.
    Failing,
    /// Failing for longer than the hold limit: the stream is held.
    Held,
}

pub struct Relay {
    kinesis: aws_sdk_kinesis::Client,
    sqs: aws_sdk_sqs::Client,
    store: EntityStore,
    positions: Positions,
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
    /// reported from the first record of the first stream still failing
    /// (the event source delivers again from there; the streams already
    /// relayed skip their records by position).
    pub async fn handle(&self, event: Event) -> DynamoDbEventResponse {
        let mut streams: Vec<(String, Delivered)> = Vec::new();
        for (index, record) in event.records.iter().enumerate() {
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
                .filter(|(name, _)| outcomes.get(name) == Some(&Outcome::Failing))
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
        response
    }

    /// Relays `streams` from their positions: the versions `delivered(name)`
    /// holds, with any gap before them read from the table.
    async fn relay(&self, delivered: &HashMap<&str, &[Batch]>) -> Result<HashMap<String, Outcome>> {
        let streams: Vec<&str> = delivered.keys().copied().collect();
        let positions = self.positions.relay_positions(&streams).await?;
        let mut plans: Vec<(RelayPosition, Vec<RecordedEvent>)> = Vec::new();
        let mut outcomes = HashMap::new();
        for name in &streams {
            let Some(position) = positions.get(*name) else { continue };
            if position.held() {
                info!(stream = name, "held: left for a re-drive");
                outcomes.insert((*name).to_owned(), Outcome::Held);
                continue;
            }
            let batches = delivered.get(name).copied().unwrap_or_default();
            let next = position.next();
            let events = match events_after(next, batches) {
                Some(events) => events,
                None => {
                    let last = batches.iter().map(Batch::last).max().unwrap_or(next);
                    match self.read_versions(name, next, last).await {
                        Ok(events) => events,
                        Err(err) => {
                            warn!(error = %err, stream = name, next, "versions before the delivered ones unreadable");
                            outcomes.insert((*name).to_owned(), Outcome::Failing);
                            continue;
                        }
                    }
                }
            };
            if !events.is_empty() {
                plans.push((position.clone(), events));
            } else {
                outcomes.insert((*name).to_owned(), Outcome::Relayed);
            }
        }
        outcomes.extend(self.put_and_record(plans).await);
        Ok(outcomes)
    }

    /// Puts each stream's events in version order, then records how far each got.
    async fn put_and_record(&self, plans: Vec<(RelayPosition, Vec<RecordedEvent>)>) -> HashMap<String, Outcome> {
        let mut records = Vec::new();
        let mut owner = Vec::new();
        let mut outcomes = HashMap::new();
        for (plan, (position, events)) in plans.iter().enumerate() {
            let built: Result<Vec<OutgoingRecord>> = events.iter().map(log_record).collect();
            match built {
                Ok(built) => {
                    owner.extend(std::iter::repeat_n(plan, built.len()));
                    records.extend(built);
                }
                Err(err) => {
                    error!(error = %err, stream = position.stream, "entity events not encodable");
                    outcomes.insert(position.stream.clone(), Outcome::Failing);
                }
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
            let plan = owner[failure.index];
            let entry = first_failed.entry(plan).or_insert((failure.index, failure.code.clone()));
            if failure.index < entry.0 {
                *entry = (failure.index, failure.code.clone());
            }
        }
        let now = now_ms();
        let mut updates = Vec::new();
        for (plan, (position, events)) in plans.iter().enumerate() {
            if outcomes.contains_key(&position.stream) {
                continue;
            }
            let start = owner.iter().position(|&o| o == plan).unwrap_or(0);
            let failed = first_failed.get(&plan).cloned();
            let stored = failed.as_ref().map_or(events.len(), |(index, _)| index - start);
            let relayed = stored.checked_sub(1).map(|i| events[i].version);
            updates.push(self.record(position, relayed, failed.map(|(_, code)| code), now));
        }
        let recorded: Vec<(String, Outcome)> =
            futures::stream::iter(updates).buffer_unordered(POSITION_CONCURRENCY).collect().await;
        info!(records = records.len(), failed = put.failures.len(), "relayed");
        outcomes.extend(recorded);
        outcomes
    }

    /// Records one stream's progress: relayed up to `relayed`; failing (with
    /// `code`), held once it has failed for the hold limit.
    async fn record(
        &self,
        position: &RelayPosition,
        relayed: Option<u64>,
        code: Option<String>,
        now: i64,
    ) -> (String, Outcome) {
        let stream = position.stream.as_str();
        (stream.to_owned(), self.progress(stream, relayed, code, now).await)
    }

    async fn progress(&self, stream: &str, relayed: Option<u64>, code: Option<String>, now: i64) -> Outcome {
        let Some(code) = code else {
            return match relayed.map(|v| self.positions.advance(stream, v)) {
                Some(advance) => match advance.await {
                    Ok(()) => Outcome::Relayed,
                    // Stored, not recorded: delivered again, the copies are dropped by the pump.
                    Err(err) => {
                        warn!(error = %err, stream, "relay position not saved");
                        Outcome::Failing
                    }
                },
                None => Outcome::Relayed,
            };
        };
        let position = match self.positions.failing(stream, relayed, now).await {
            Ok(position) => position,
            Err(err) => {
                warn!(error = %err, stream, "relay position not saved");
                return Outcome::Failing;
            }
        };
        if !position.due_for_hold(now, self.settings.hold_after) {
            warn!(stream, code, next = position.next(), "entity events not relayed; delivered again");
            return Outcome::Failing;
        }
        let reason = format!("puts failing since {} ms ago: {code}", now - position.failing_since.unwrap_or(now));
        match self.hold(stream, position.next(), &reason, now).await {
            Ok(()) => {
                error!(
                    stream,
                    next = position.next(),
                    reason,
                    "entity stream held: re-drive it once Kinesis takes its records"
                );
                Outcome::Held
            }
            Err(err) => {
                warn!(error = %err, stream, "stream not held; delivered again");
                Outcome::Failing
            }
        }
    }

    /// Holds `stream` and announces it on the dead-letter queue.
    async fn hold(&self, stream: &str, next: u64, reason: &str, now: i64) -> Result<()> {
        if let Some(queue) = &self.settings.dead_letter_queue {
            let body = json!({"heldStream": stream, "nextVersion": next, "reason": reason, "heldAt": now});
            self.sqs
                .send_message()
                .queue_url(queue)
                .message_body(body.to_string())
                .send()
                .await
                .map_err(|e| Error::Sqs { operation: "SendMessage", source: e.into() })?;
        }
        self.positions.hold(stream, now, reason).await
    }

    /// Versions `from..=to` of `stream`, from the table.
    async fn read_versions(&self, stream: &str, from: u64, to: u64) -> Result<Vec<RecordedEvent>> {
        let mut events = Vec::new();
        let mut next = Some(from);
        while let Some(at) = next.filter(|at| *at <= to) {
            let page = self.store.read(stream, Some(at), READ_PAGE, Direction::Forward).await.map_err(|e| match e {
                EntityError::Store(err) => err,
                other => Error::Malformed(format!("{stream}: {other}")),
            })?;
            events.extend(page.events.into_iter().filter(|e| e.version <= to));
            next = page.next;
        }
        Ok(events)
    }

    /// Re-drives one stream: releases its hold, then relays every version
    /// after its position up to its tip, from the table, in order.
    pub async fn redrive_stream(&self, stream: &str) -> Result<Redriven> {
        self.positions.release(stream).await?;
        let mut redriven = Redriven::default();
        loop {
            let position = self.positions.relay_position(stream).await?;
            let Some(tip) = self.store.tip(stream).await? else { return Ok(redriven) };
            let next = position.next();
            if next > tip.version {
                return Ok(redriven);
            }
            let to = tip.version.min(next + READ_PAGE as u64 - 1);
            let events = self.read_versions(stream, next, to).await?;
            let count = events.len();
            let outcomes = self.put_and_record(vec![(position, events)]).await;
            if outcomes.get(stream) != Some(&Outcome::Relayed) {
                return Err(Error::KinesisPartial {
                    operation: "PutRecords",
                    failed: count,
                    code: format!("{stream} still not relayed from version {next}"),
                });
            }
            redriven.versions += count;
        }
    }

    /// Re-drives every stream whose position is behind its tip (after the
    /// event source itself gave up on a delivery: its dead-letter message
    /// names shards, not streams). A `Scan` of the table: for rare repairs.
    pub async fn redrive_all(&self) -> Result<Redriven> {
        let names = self.store.stream_names("").await.map_err(|e| match e {
            EntityError::Store(err) => err,
            other => Error::Malformed(other.to_string()),
        })?;
        let mut total = Redriven::default();
        for name in names {
            let done = self.redrive_stream(&name).await?;
            total.versions += done.versions;
            total.streams += usize::from(done.versions > 0);
        }
        Ok(total)
    }
}

impl Relay {
    /// Re-drives what one message of the relay's dead-letter queue stands
    /// for: a held stream (the relay's own notice), or, for the event
    /// source's failure record (which names table-stream shards, not
    /// streams), every stream behind its tip.
    pub async fn redrive_message(&self, body: &str) -> Result<Redriven> {
        let message: serde_json::Value =
            serde_json::from_str(body).map_err(|e| Error::BadInput(format!("relay dead letter: {e}")))?;
        if let Some(stream) = message.get("heldStream").and_then(|s| s.as_str()) {
            let done = self.redrive_stream(stream).await?;
            return Ok(Redriven { streams: 1, versions: done.versions });
        }
        if message.get("DDBStreamBatchInfo").is_some() {
            return self.redrive_all().await;
        }
        Err(Error::BadInput("neither a held stream nor a DynamoDB stream failure record".into()))
    }
}

/// What a re-drive relayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Redriven {
    pub streams: usize,
    pub versions: usize,
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::entity::model::{batch_key, StoredEventItem, TIP};

    fn record(name: &str, image: serde_json::Value) -> EventRecord {
        serde_json::from_value(json!({
            "awsRegion": "us-east-1",
            "eventID": "1",
            "eventName": name,
            "dynamodb": {"NewImage": image, "SequenceNumber": "100", "SizeBytes": 10},
        }))
        .unwrap()
    }

    fn batch_image(stream: &str, first: u64, types: &[&str]) -> Value {
        let events: Vec<StoredEventItem> = types
            .iter()
            .enumerate()
            .map(|(i, t)| StoredEventItem {
                id: format!("id-{i}"),
                event_type: (*t).into(),
                data: "{\"n\":1}".into(),
                metadata: None,
            })
            .collect();
        let batch = Batch { stream: stream.into(), item: batch_key(first), first, at: 1_700_000_000_000, events };
        let item: serde_dynamo::Item = serde_dynamo::to_item(&batch).unwrap();
        serde_json::to_value(item).unwrap()
    }

    #[test]
    fn one_record_per_event_keyed_by_stream_in_version_order() {
        let batch = inserted_batch(&record("INSERT", batch_image("todo-1", 4, &["A", "B"]))).unwrap().unwrap();
        let records: Vec<OutgoingRecord> = batch.read().map(|e| log_record(&e).unwrap()).collect();
        assert_eq!(records.len(), 2);
        let envelopes: Vec<Envelope> = records.iter().map(|r| serde_json::from_slice(&r.data).unwrap()).collect();
        assert!(records.iter().all(|r| r.partition_key == "streams/todo-1"), "the entity namespace");
        assert_eq!(envelopes[0].id, "todo-1/4");
        assert_eq!(envelopes[1].id, "todo-1/5");
        let body = envelopes[1].body.as_ref().unwrap();
        assert_eq!(
            (body["version"].as_u64(), body["type"].as_str(), body["EntityId"].as_str()),
            (Some(5), Some("B"), Some("todo-1"))
        );
        assert_eq!(body["data"], json!({"n": 1}));
        // The pump drops copies by this version.
        assert_eq!(crate::envelope::entity_version(&records[1].data), Some(5));
    }

    #[test]
    fn tips_snapshots_positions_and_updates_are_not_events() {
        let tip = json!({"stream": {"S": "s"}, "item": {"S": TIP}, "version": {"N": "3"}, "updated_at": {"N": "1"}});
        assert!(inserted_batch(&record("INSERT", tip.clone())).unwrap().is_none());
        assert!(inserted_batch(&record("MODIFY", tip)).unwrap().is_none());
        assert!(inserted_batch(&record("REMOVE", batch_image("s", 0, &["A"]))).unwrap().is_none());
        let position = json!({"stream": {"S": "s"}, "item": {"S": "_relay"}, "relayed": {"N": "3"}});
        assert!(inserted_batch(&record("INSERT", position)).unwrap().is_none());
        let broken = json!({"stream": {"S": "s"}, "item": {"S": batch_key(0)}});
        assert!(inserted_batch(&record("INSERT", broken)).is_err());
    }

    fn batch(first: u64, events: usize) -> Batch {
        let image = batch_image("s", first, &vec!["T"; events]);
        inserted_batch(&record("INSERT", image)).unwrap().unwrap()
    }

    fn versions(events: Option<Vec<RecordedEvent>>) -> Option<Vec<u64>> {
        events.map(|events| events.iter().map(|e| e.version).collect())
    }

    #[test]
    fn a_delivery_is_put_from_the_position_in_version_order_whatever_order_its_records_came_in() {
        // Appends of one stream from two table-stream shards, the later one first.
        assert_eq!(versions(events_after(5, &[batch(7, 2), batch(5, 2)])), Some(vec![5, 6, 7, 8]));
        // Already relayed up to 5: only what follows, even from inside a batch.
        assert_eq!(versions(events_after(6, &[batch(5, 2), batch(7, 1)])), Some(vec![6, 7]));
        // A batch delivered twice is put once.
        assert_eq!(versions(events_after(0, &[batch(0, 1), batch(0, 1), batch(1, 1)])), Some(vec![0, 1]));
        // Everything at or below the position: nothing to put.
        assert_eq!(versions(events_after(9, &[batch(5, 2)])), Some(vec![]));
        // A version missing before the delivered ones: read them from the table instead.
        assert_eq!(versions(events_after(5, &[batch(7, 1)])), None);
        assert_eq!(versions(events_after(0, &[batch(0, 1), batch(3, 1)])), None);
    }
}
