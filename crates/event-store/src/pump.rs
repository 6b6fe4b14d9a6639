//! `pump`: Kinesis event source → buffer table. Every record becomes one
//! buffer item under a key derived from its identity, written with
//! `BatchWriteItem`; the response names exactly the records that could not
//! be written, so the event source retries those and nothing else.

use aws_lambda_events::encodings::SecondTimestamp;
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};
use chrono::{DateTime, Utc};
use serde_json::Value;
use tracing::{error, info};

use crate::batch::Backoff;
use crate::buffer_item::BufferItem;
use crate::config::PumpConfig;
use crate::dynamo::{keyed_puts, write_all};
use crate::error::{Error, Result};
use crate::event_item::{item_size, MAX_ITEM_BYTES};

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

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &["dynamodb:BatchWriteItem"];

/// Bytes an event-table item may need beyond its buffer item (slot, sort key, reason...).
pub const ITEM_HEADROOM: usize = 1024;

pub struct Pump {
    dynamo: aws_sdk_dynamodb::Client,
    config: PumpConfig,
    backoff: Backoff,
}

impl Pump {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, config: PumpConfig) -> Self {
        Self { dynamo, config, backoff: Backoff::default() }
    }

    pub async fn handle(&self, event: KinesisEvent) -> KinesisEventResponse {
        let mut failed: Vec<String> = Vec::new();
        let mut items = Vec::new();
        let now = crate::time::now_ms();
        for record in &event.records {
            let sequence = record.kinesis.sequence_number.clone();
            let item = match BufferItem::from_kinesis(record, now) {
                Ok(item) => item,
                Err(err) => {
                    error!(error = %err, sequence, "record cannot be buffered");
                    failed.push(sequence);
                    continue;
                }
            };
            let attributes = item.to_item();
            let size = item_size(&attributes);
            // Room for what the event (or quarantine) item adds, so whatever is
            // buffered can always be moved on: nothing gets stuck in the buffer.
            if size + ITEM_HEADROOM > MAX_ITEM_BYTES {
                error!(
                    sequence,
                    size, "record too large for a DynamoDB item; left to the event source's failure destination"
                );
                failed.push(sequence);
                continue;
            }
            items.push((item.id, sequence, attributes));
        }
        // A batch may carry a record twice (same key): one put, both sequence numbers.
        let puts = keyed_puts(items);
        failed.extend(puts.failed);
        let requested = puts.requests.len();
        let unwritten = write_all(&self.dynamo, &self.config.buffer_table, puts.requests, &self.backoff).await;
        let mut sources = puts.sources;
        for key in &unwritten {
            failed.extend(sources.remove(key).unwrap_or_default());
        }
        info!(records = event.records.len(), items = requested - unwritten.len(), failed = failed.len(), "buffered");
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
    fn a_malformed_event_is_bad_input() {
        assert!(matches!(parse_kinesis_event(serde_json::json!({"Records": 3})), Err(Error::BadInput(_))));
    }
}
