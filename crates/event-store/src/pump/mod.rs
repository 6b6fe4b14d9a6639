//! `pump`: Kinesis event source → buffer table. A shard's records of one
//! slot are packed into chunks ([`crate::chunk`]: as few items as fit, zstd
//! over all of them), each a buffer item under a key derived from its
//! records' identity, written with `BatchWriteItem`; the response names
//! exactly the records that could not be written, so the event source
//! retries those and nothing else.

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_sdk_dynamodb::types::AttributeValue;
use tracing::{error, info, warn};

mod again;
mod copies;
pub mod rebuffer;
mod records;

use records::by_shard;
pub use records::{buffer_chunks, chunk_event, parse_kinesis_event};

use copies::{client_copies, entity_copies, Copies};

use crate::batch::Backoff;
use crate::bookkeeping::awake::{self, Waker};
use crate::bookkeeping::entity_positions::Positions;
use crate::bookkeeping::shard_position::{self, non_decreasing, ShardPosition};
use crate::config::PumpConfig;
use crate::dynamo::{keyed_puts, write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::quarantine_item;
use crate::invoke::Invoker;

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:BatchWriteItem",
    "dynamodb:GetItem",
    "dynamodb:UpdateItem",
    "dynamodb:PutItem",
    "dynamodb:BatchGetItem",
    "kinesis:ListShards",
    // Wakes the scan when it buffered records (`SCAN_FUNCTION`, see `bookkeeping::awake`).
    "lambda:InvokeFunction",
];

/// Bytes an event-table item may need beyond its buffer item (slot, sort key, reason...).
pub const ITEM_HEADROOM: usize = 1024;

pub struct Pump {
    dynamo: aws_sdk_dynamodb::Client,
    /// To find a new shard's parents (`ListShards`), whose positions are its arrivals' floor.
    kinesis: aws_sdk_kinesis::Client,
    config: PumpConfig,
    backoff: Backoff,
    /// The entity streams' logged versions, to drop copies of entity events.
    entity_log: Option<Positions>,
    /// Wakes the scan after records are buffered; without it, they wait for the schedule.
    scan: Option<Waker>,
}

impl Pump {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, kinesis: aws_sdk_kinesis::Client, config: PumpConfig) -> Self {
        let entity_log = config.entity_table.as_ref().map(|table| Positions::new(dynamo.clone(), table.clone()));
        Self { dynamo, kinesis, config, backoff: Backoff::default(), entity_log, scan: None }
    }

    /// Wakes the scan whenever a batch buffered records (an invoker of the scan function).
    pub fn with_scan(mut self, invoker: Option<Arc<dyn Invoker>>) -> Self {
        let table = self.config.event_table.clone();
        self.scan = invoker.map(|invoker| Waker::new(self.dynamo.clone(), table, awake::SCAN, invoker));
        self
    }

    /// Retries of unprocessed items with another schedule (tests shorten it).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Buffers a batch, shard by shard (an event source mapping sends one
    /// shard per batch), and names the records the event source must send again.
    pub async fn handle(&self, event: KinesisEvent) -> KinesisEventResponse {
        let mut failed: Vec<String> = Vec::new();
        for (shard_id, records) in by_shard(&event.records) {
            failed.extend(self.buffer_shard(&shard_id, &records).await);
        }
        // Something new is in the buffer: the scan passes within a second, not at its schedule.
        if failed.len() < event.records.len() {
            if let Some(scan) = &self.scan {
                match scan.wake(crate::time::now_ms()).await {
                    Ok(started) => info!(started, "scan woken"),
                    Err(err) => warn!(error = %err, "scan not woken: the buffered records wait for its schedule"),
                }
            }
        }
        let mut response = KinesisEventResponse::default();
        response.batch_item_failures = failed
            .into_iter()
            .map(|sequence| {
                let mut failure = KinesisBatchItemFailure::default();
                failure.item_identifier = Some(sequence);
                failure
            })
            .collect();
        response
    }

    /// Writes the buffer items of `records` (stored with `arrivals`). A
    /// record that can never become an item (too large, malformed) is
    /// quarantined in the event table instead, with where to find it in the
    /// stream, so that it does not block its shard until the record age
    /// limit; if even that fails, writing stops before it. Returns how many
    /// records were dealt with, and the sequence numbers of those not written.
    async fn write(&self, records: &[&KinesisEventRecord], arrivals: &[i64]) -> (usize, Vec<String>) {
        let now = crate::time::now_ms();
        let mut events = Vec::new();
        let mut buildable = records.len();
        for (i, (record, arrival)) in records.iter().zip(arrivals).enumerate() {
            let sequence = record.kinesis.sequence_number.clone();
            match chunk_event(record, *arrival) {
                Ok(event) => events.push(event),
                Err(err) => match self.quarantine(record, *arrival, &err, now).await {
                    Ok(()) => {
                        warn!(error = %err, sequence, "record cannot be buffered: quarantined with its place in the stream")
                    }
                    Err(quarantine) => {
                        error!(error = %err, %quarantine, sequence, "record cannot be buffered nor quarantined: delivered again");
                        buildable = i;
                        break;
                    }
                },
            }
        }
        let arn = records.first().and_then(|r| r.event_source_arn.clone()).unwrap_or_default();
        let (chunks, mut not_done) = buffer_chunks(&arn, events, self.config.time_unit_ms, now);
        let items = chunks.into_iter().map(|(item, sequences)| (item.id.clone(), sequences, item.to_item()));
        let puts = keyed_puts(items);
        let buffer = Table { name: &self.config.buffer_table, key: crate::buffer_item::KEY };
        let unwritten = write_all(&self.dynamo, buffer, puts.requests, &self.backoff, None).await;
        not_done.extend(puts.failed.into_iter().flatten());
        let mut sources = puts.sources;
        for key in &unwritten {
            not_done.extend(sources.remove(key).unwrap_or_default().into_iter().flatten());
        }
        (buildable, not_done)
    }

    /// The quarantine item of a record that cannot be buffered: its identity,
    /// size and arrival (its data stays in the stream, within its retention).
    async fn quarantine(&self, record: &KinesisEventRecord, arrival: i64, err: &Error, now: i64) -> Result<()> {
        let sequence = &record.kinesis.sequence_number;
        let event_id = record.event_id.clone().unwrap_or_else(|| format!("?:{sequence}"));
        let arn = record.event_source_arn.clone().unwrap_or_default();
        let original = HashMap::from([
            ("event_id".to_owned(), AttributeValue::S(event_id.clone())),
            ("stream_arn".to_owned(), AttributeValue::S(arn.clone())),
            ("sequence".to_owned(), AttributeValue::S(sequence.clone())),
            ("partition_key".to_owned(), AttributeValue::S(record.kinesis.partition_key.clone())),
            ("arrival".to_owned(), AttributeValue::N(arrival.to_string())),
            ("bytes".to_owned(), AttributeValue::N(record.kinesis.data.0.len().to_string())),
        ]);
        let id = crate::buffer_item::buffer_key(&arn, &event_id);
        let reason = format!("not buffered: {err}");
        let item = quarantine_item(&id, &reason, original, now)
            .ok_or_else(|| Error::Malformed("quarantine item too large".into()))?;
        self.dynamo
            .put_item()
            .table_name(&self.config.event_table)
            .set_item(Some(item))
            .return_consumed_capacity(aws_sdk_dynamodb::types::ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("PutItem", e))?;
        Ok(())
    }

    /// Buffers one shard's records, in sequence order, and moves the shard's
    /// position past the unbroken run of records now buffered. Returns the
    /// sequence numbers to deliver again: from the first record that could
    /// not be buffered on (the event source resends from there anyway, and
    /// the arrival order must be rebuilt from the same point).
    async fn buffer_shard(&self, shard_id: &str, records: &[&KinesisEventRecord]) -> Vec<String> {
        let sequences = || records.iter().map(|r| r.kinesis.sequence_number.clone()).collect::<Vec<_>>();
        let table = &self.config.event_table;
        let position = match shard_position::read(&self.dynamo, table, shard_id).await {
            Ok(position) => position,
            Err(err) => {
                error!(error = %err, shard_id, "shard position unreadable: the batch is delivered again");
                return sequences();
            }
        };
        // Records at or before the position were buffered by an earlier delivery: done.
        let new: Vec<&KinesisEventRecord> = records
            .iter()
            .copied()
            .filter(|r| !position.as_ref().is_some_and(|p| p.covers(&r.kinesis.sequence_number)))
            .collect();
        // A shard's arrivals go on from its position; a new shard's from its parents' (a reshard).
        let floor = match &position {
            Some(position) => Some(position.arrival),
            None => match self.parents_floor(records, shard_id).await {
                Ok(floor) => floor,
                Err(err) => {
                    error!(error = %err, shard_id, "parent shards unknown: the batch is delivered again");
                    return sequences();
                }
            },
        };
        let arrivals =
            non_decreasing(floor, new.iter().map(|r| r.kinesis.approximate_arrival_timestamp.timestamp_millis()));
        // Arrivals are made over every record first, so a delivery that drops
        // other copies stores the rest with the same arrivals (and sort keys).
        let copies = match self.copies(shard_id, &new).await {
            Ok(copies) => copies,
            Err(err) => {
                error!(error = %err, shard_id, "entity log positions or client ids unreadable: the batch is delivered again");
                return sequences();
            }
        };
        let kept: Vec<usize> = (0..new.len()).filter(|i| !copies.dropped[*i]).collect();
        let kept_records: Vec<&KinesisEventRecord> = kept.iter().map(|&i| new[i]).collect();
        let kept_arrivals: Vec<i64> = kept.iter().map(|&i| arrivals[i]).collect();
        let (buildable, not_done) = self.write(&kept_records, &kept_arrivals).await;
        let buildable = kept.get(buildable).copied().unwrap_or(new.len());
        // The unbroken run: records before the first unbuilt or unwritten one (copies count as done).
        let done = new[..buildable].iter().take_while(|r| !not_done.contains(&r.kinesis.sequence_number)).count();
        info!(shard_id, records = records.len(), copies = copies.count(), done, "buffered");
        if done > 0 {
            if let Err(err) = self.save_logged(&copies, done).await {
                error!(error = %err, shard_id, "entity log positions or client ids not saved: the batch is delivered again");
                return self.hand_back(shard_id, &new, 0, floor).await;
            }
            let reached = ShardPosition {
                shard_id: shard_id.to_owned(),
                sequence: new[done - 1].kinesis.sequence_number.clone(),
                arrival: arrivals[done - 1],
            };
            if let Err(err) = shard_position::advance(&self.dynamo, table, &reached, crate::time::now_ms()).await {
                // Written but not recorded: delivered again, the same records get the same items.
                error!(error = %err, shard_id, "shard position not saved: the batch is delivered again");
                return self.hand_back(shard_id, &new, 0, floor).await;
            }
        }
        self.hand_back(shard_id, &new, done, done.checked_sub(1).map(|i| arrivals[i]).or(floor)).await
    }

    /// The sequence numbers of `new[from..]`, for the event source to deliver
    /// again, after recording the floor their arrivals were made from (should
    /// the source give them up, a re-buffer starts from the same floor, so
    /// what was stored ahead gets its stored sort keys again).
    async fn hand_back(
        &self,
        shard_id: &str,
        new: &[&KinesisEventRecord],
        from: usize,
        floor: Option<i64>,
    ) -> Vec<String> {
        let Some(first) = new.get(from) else { return Vec::new() };
        if let Some(floor) = floor {
            let (table, at) = (&self.config.event_table, (shard_id, first.kinesis.sequence_number.as_str()));
            if let Err(err) = shard_position::save_floor(&self.dynamo, table, at, floor, crate::time::now_ms()).await {
                warn!(error = %err, shard_id, "arrival floor not saved (the next delivery saves it)");
            }
        }
        new[from..].iter().map(|r| r.kinesis.sequence_number.clone()).collect()
    }

    /// The floor of a new shard's arrivals: the latest arrival its parent
    /// shards were stored with (both, after a merge). The event source
    /// pumps a parent to its end before its children, so a key's first
    /// record in the child never sorts before its last in the parent.
    async fn parents_floor(&self, records: &[&KinesisEventRecord], shard_id: &str) -> Result<Option<i64>> {
        let arn = records.first().and_then(|r| r.event_source_arn.as_deref()).unwrap_or_default();
        let Some((_, stream)) = arn.rsplit_once(":stream/") else { return Ok(None) };
        // A shard Kinesis does not list (or no such stream) has no parents to go on from.
        let shards = crate::kinesis::existing_shards(&self.kinesis, stream).await?.unwrap_or_default();
        let parents_of = |id: &str| -> Vec<String> {
            let Some(shard) = shards.iter().find(|s| s.shard_id() == id) else { return Vec::new() };
            [shard.parent_shard_id(), shard.adjacent_parent_shard_id()]
                .into_iter()
                .flatten()
                .map(str::to_owned)
                .collect()
        };
        // A parent that never had a record (so no position) passes the question on to its own parents.
        let (mut floor, mut asked, mut seen) = (None, parents_of(shard_id), HashSet::new());
        while let Some(parent) = asked.pop() {
            if !seen.insert(parent.clone()) {
                continue;
            }
            match shard_position::read(&self.dynamo, &self.config.event_table, &parent).await? {
                Some(position) => floor = floor.max(Some(position.arrival)),
                None => asked.extend(parents_of(&parent)),
            }
        }
        Ok(floor)
    }
}

impl Pump {
    /// Which of a shard's records are copies of events already in the log
    /// ([`Copies`]); none are without the entity table.
    async fn copies(&self, shard_id: &str, records: &[&KinesisEventRecord]) -> Result<Copies> {
        let mut copies = Copies::new(shard_id, records.len());
        if let Some(log) = &self.entity_log {
            entity_copies(log, records, &mut copies).await?;
            client_copies(log, records, &mut copies).await?;
        }
        Ok(copies)
    }

    /// Records what the records before index `done` logged: entity streams'
    /// versions and client event ids. Before the shard position moves past them.
    async fn save_logged(&self, copies: &Copies, done: usize) -> Result<()> {
        let Some(log) = &self.entity_log else { return Ok(()) };
        let logged = copies.logged_through(done);
        if !logged.is_empty() {
            log.save_logged(&logged).await?;
        }
        let ids: Vec<(String, String)> =
            copies.ids.iter().filter(|(i, _, _)| *i < done).map(|(_, m, s)| (m.clone(), s.clone())).collect();
        match ids.is_empty() {
            true => Ok(()),
            false => log.save_buffered_ids(&ids, crate::time::now_ms() / 1000).await,
        }
    }
}
