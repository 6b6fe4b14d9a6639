//! The pump's records, without I/O: the Lambda Kinesis event parsed with
//! exact arrival times, its records grouped by shard, each shard's events cut
//! into runs of one slot and packed into buffer chunks.

use aws_lambda_events::encodings::SecondTimestamp;
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tracing::error;

use super::ITEM_HEADROOM;
use crate::buffer_item::BufferItem;
use crate::chunk::{pack_to_fit, ChunkEvent, MAX_CHUNK_BYTES};
use crate::error::{Error, Result};
use crate::event_item::MAX_ITEM_BYTES;
use crate::time::slot_of;

/// Parses the Lambda Kinesis event, reading `approximateArrivalTimestamp`
/// ourselves: aws_lambda_events 1.2 parses the digits after the decimal
/// point as an integer, so `1795327124.01` (10 ms) would become 1 ms and
/// `.1234` would fail the whole batch. The arrival time orders the event
/// table, so it must be exact.
pub fn parse_kinesis_event(mut value: Value) -> Result<KinesisEvent> {
    let mut arrivals = Vec::new();
    if let Some(records) = value.get_mut("Records").and_then(Value::as_array_mut) {
        for record in records {
            let timestamp = record.get_mut("kinesis").and_then(|k| k.get_mut("approximateArrivalTimestamp"));
            let seconds = timestamp.as_deref().and_then(|t| match t {
                Value::Number(n) => n.as_f64(),
                Value::String(s) => s.parse().ok(),
                _ => None,
            });
            if let (Some(t), Some(seconds)) = (timestamp, seconds) {
                *t = Value::from(seconds.trunc() as i64);
            }
            arrivals.push(seconds.map(|s| (s * 1000.0).round() as i64));
        }
    }
    let mut event: KinesisEvent =
        serde_json::from_value(value).map_err(|e| Error::BadInput(format!("kinesis event: {e}")))?;
    for (record, arrival) in event.records.iter_mut().zip(arrivals) {
        if let Some(ms) = arrival.and_then(DateTime::<Utc>::from_timestamp_millis) {
            record.kinesis.approximate_arrival_timestamp = SecondTimestamp(ms);
        }
    }
    Ok(event)
}

/// One record as a chunk's event with its stored arrival, unless it is
/// malformed or too large for an item even alone and compressed (with room
/// for what the event item adds, so whatever is buffered can always be moved on).
pub fn chunk_event(record: &KinesisEventRecord, arrival: i64) -> Result<ChunkEvent> {
    let event_id =
        record.event_id.as_deref().ok_or_else(|| Error::Malformed("kinesis record without eventID".into()))?;
    if record.event_source_arn.is_none() {
        return Err(Error::Malformed("kinesis record without eventSourceARN".into()));
    }
    let event = ChunkEvent {
        event_id: event_id.to_owned(),
        arrival,
        partition_key: record.kinesis.partition_key.clone(),
        data: record.kinesis.data.0.clone(),
    };
    // Anything smaller than a chunk's limit fits, compressed or not; larger ones are tried alone.
    if event.raw_len() > MAX_CHUNK_BYTES {
        let packed = crate::chunk::pack(std::slice::from_ref(&event))?;
        let size = packed.len() + event.event_id.len();
        if size + ITEM_HEADROOM > MAX_ITEM_BYTES {
            return Err(Error::Malformed(format!(
                "record of {size} bytes compressed is too large for a DynamoDB item"
            )));
        }
    }
    Ok(event)
}

/// The buffer items of one shard's events (in order): one chunk per run of
/// one slot, cut to fit an item, each with the sequence numbers it holds;
/// and the sequence numbers of events that could not be packed (none, but
/// for a defect: every event was checked to fit alone).
pub fn buffer_chunks(
    event_source_arn: &str,
    events: Vec<ChunkEvent>,
    time_unit_ms: u64,
    now_ms: i64,
) -> (Vec<(BufferItem, Vec<String>)>, Vec<String>) {
    let (mut items, mut failed) = (Vec::new(), Vec::new());
    for run in slot_runs(events, time_unit_ms) {
        for packed in pack_to_fit(run, MAX_CHUNK_BYTES) {
            let packed = match packed {
                Ok(packed) => packed,
                Err((event, err)) => {
                    error!(error = %err, event_id = event.event_id, "record not packed: delivered again");
                    failed.push(sequence_of(&event.event_id));
                    continue;
                }
            };
            let sequences: Vec<String> = packed.events.iter().map(|e| sequence_of(&e.event_id)).collect();
            match BufferItem::chunk(event_source_arn, &packed, now_ms) {
                Some(item) => items.push((item, sequences)),
                None => failed.extend(sequences),
            }
        }
    }
    (items, failed)
}

/// The sequence number of a Kinesis event id (`shardId-…:<sequence>`).
pub(super) fn sequence_of(event_id: &str) -> String {
    event_id.rsplit_once(':').map_or(event_id, |(_, sequence)| sequence).to_owned()
}

/// Consecutive events of one slot together: one shard's events in order, cut where the slot changes.
fn slot_runs(events: Vec<ChunkEvent>, time_unit_ms: u64) -> Vec<Vec<ChunkEvent>> {
    let mut runs: Vec<Vec<ChunkEvent>> = Vec::new();
    for event in events {
        let slot = slot_of(event.arrival, time_unit_ms);
        match runs.last_mut() {
            Some(run) if run.last().is_some_and(|e| slot_of(e.arrival, time_unit_ms) == slot) => run.push(event),
            _ => runs.push(vec![event]),
        }
    }
    runs
}

/// The batch's records by shard (from the event id `shardId-...:<sequence>`), each in delivery order.
pub(super) fn by_shard(records: &[KinesisEventRecord]) -> Vec<(String, Vec<&KinesisEventRecord>)> {
    let mut shards: Vec<(String, Vec<&KinesisEventRecord>)> = Vec::new();
    for record in records {
        let shard = record.event_id.as_deref().and_then(|id| id.rsplit_once(':')).map_or("", |(shard, _)| shard);
        match shards.iter_mut().find(|(id, _)| id == shard) {
            Some((_, list)) => list.push(record),
            None => shards.push((shard.to_owned(), vec![record])),
        }
    }
    shards
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival_of(timestamp: Value) -> i64 {
        let event = serde_json::json!({"Records": [{
            "kinesis": {"partitionKey": "p", "sequenceNumber": "1", "data": "", "approximateArrivalTimestamp": timestamp},
            "eventID": "shardId-000000000000:1", "eventSourceARN": "arn"
        }]});
        parse_kinesis_event(event).unwrap().records[0].kinesis.approximate_arrival_timestamp.timestamp_millis()
    }

    #[test]
    fn arrival_times_keep_their_milliseconds_whatever_the_digits() {
        assert_eq!(arrival_of(serde_json::json!(1795327124.477)), 1_795_327_124_477);
        assert_eq!(arrival_of(serde_json::json!(1795327124.01)), 1_795_327_124_010);
        assert_eq!(arrival_of(serde_json::json!(1795327124.1)), 1_795_327_124_100);
        assert_eq!(arrival_of(serde_json::json!(1795327124.1234)), 1_795_327_124_123);
        assert_eq!(arrival_of(serde_json::json!(1795327124)), 1_795_327_124_000);
        assert_eq!(arrival_of(serde_json::json!("1795327124.05")), 1_795_327_124_050);
    }

    #[test]
    fn records_are_grouped_by_slot_in_order() {
        let event = |arrival: i64| ChunkEvent {
            event_id: format!("shardId-000000000000:{arrival}"),
            arrival,
            partition_key: "p".into(),
            data: Vec::new(),
        };
        let runs = slot_runs([10, 999, 1_000, 1_500, 2_000].map(event).to_vec(), 1000);
        let arrivals: Vec<Vec<i64>> = runs.iter().map(|r| r.iter().map(|e| e.arrival).collect()).collect();
        assert_eq!(arrivals, vec![vec![10, 999], vec![1_000, 1_500], vec![2_000]]);
        assert_eq!(sequence_of("shardId-000000000000:4959"), "4959");
    }

    #[test]
    fn a_malformed_event_is_bad_input() {
        assert!(matches!(parse_kinesis_event(serde_json::json!({"Records": 3})), Err(Error::BadInput(_))));
    }
}
