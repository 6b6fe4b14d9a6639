//! `relay`: the entity table's DynamoDB stream → the event stream, so entity
//! events reach the time-ordered log (and playback, and subscriptions).
//!
//! Each new batch item becomes one Kinesis record per event, partition key =
//! the stream name, put in key order (`kinesis::put_in_key_order`): an
//! entity's events keep their version order end to end. DynamoDB Streams
//! orders the records of one partition key, and appends to one stream are
//! serialized by their version check, so batches arrive in version order.
//!
//! At least once: a batch retried after it was applied (a timeout after the
//! put) puts copies. Every record is an envelope whose id is
//! `<stream>/<version>`, so readers of the log drop a copy like any other
//! copy of an accepted event (`dedupe`), keyed by (stream, version).

use std::time::Duration;

use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use aws_lambda_events::event::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use serde_json::json;
use tracing::{error, info, warn};

use super::model::{batch_version, Batch, RANGE_KEY};
use crate::batch::Backoff;
use crate::envelope::{Envelope, Headers, ENTITY_ID};
use crate::kinesis::{put_in_key_order, send_put_records, OutgoingRecord};

/// The AWS actions the relay calls (its event source mapping needs the stream-reading ones on top).
pub const AWS_ACTIONS: &[&str] = &["kinesis:PutRecords"];

/// The envelope id of an entity event in the log: unique per (stream, version).
pub fn log_id(stream: &str, version: u64) -> String {
    format!("{stream}/{version}")
}

/// The log records of one stream record: one per event of a new batch item,
/// none for anything else (the tip, the snapshot, removals).
pub fn log_records(record: &EventRecord) -> Result<Vec<OutgoingRecord>, String> {
    if record.event_name != "INSERT" {
        return Ok(vec![]);
    }
    let image = &record.change.new_image;
    let is_batch = match image.get(RANGE_KEY) {
        Some(serde_dynamo::AttributeValue::S(key)) => batch_version(key).is_some(),
        _ => false,
    };
    if !is_batch {
        return Ok(vec![]);
    }
    let batch: Batch = serde_dynamo::from_item(image.clone()).map_err(|e| e.to_string())?;
    batch
        .read()
        .map(|event| {
            let mut body = serde_json::to_value(&event).map_err(|e| e.to_string())?;
            body[ENTITY_ID] = json!(event.stream);
            let envelope = Envelope {
                id: log_id(&event.stream, event.version),
                received_at: event.time.clone(),
                method: "POST".into(),
                path: format!("/streams/{}", event.stream),
                query: Default::default(),
                headers: Headers::default(),
                source_ip: None,
                body: Some(body),
            };
            let data = serde_json::to_vec(&envelope).map_err(|e| e.to_string())?;
            Ok(OutgoingRecord { partition_key: event.stream, data })
        })
        .collect()
}

pub struct Relay {
    kinesis: aws_sdk_kinesis::Client,
    event_stream: String,
    backoff: Backoff,
}

impl Relay {
    pub fn new(kinesis: aws_sdk_kinesis::Client, event_stream: impl Into<String>) -> Self {
        let backoff = Backoff { base: Duration::from_millis(50), cap: Duration::from_secs(1), max_attempts: 6 };
        Self { kinesis, event_stream: event_stream.into(), backoff }
    }

    /// Relays one batch of stream records; what could not be put is reported
    /// from its first failed record on (the event source retries from there,
    /// so nothing after a failure overtakes it).
    pub async fn handle(&self, event: Event) -> DynamoDbEventResponse {
        let mut records = Vec::new();
        let mut owner = Vec::new();
        for (index, record) in event.records.iter().enumerate() {
            match log_records(record) {
                Ok(out) => {
                    owner.extend(std::iter::repeat_n(index, out.len()));
                    records.extend(out);
                }
                // Written by this code, so never expected: say so loudly, do not block the stream.
                Err(err) => error!(error = %err, keys = ?record.change.keys, "entity stream record not relayed"),
            }
        }
        let stream = self.event_stream.as_str();
        let put = put_in_key_order(
            &records,
            &self.backoff,
            |batch| async move { send_put_records(&self.kinesis, stream, &batch).await },
            |batch| async move { Ok(vec![false; batch.len()]) },
        )
        .await;
        let first_failed = put.failures.iter().map(|f| owner[f.index]).min();
        let mut response = DynamoDbEventResponse::default();
        if let Some(index) = first_failed {
            let sequence = event.records[index].change.sequence_number.clone();
            warn!(failed = put.failures.len(), from = ?sequence, "entity events not relayed; retried from the first");
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = sequence;
            response.batch_item_failures.push(failure);
        }
        info!(records = event.records.len(), relayed = records.len() - put.failures.len(), "relayed");
        response
    }
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
        let records = log_records(&record("INSERT", batch_image("todo-1", 4, &["A", "B"]))).unwrap();
        assert_eq!(records.len(), 2);
        let envelopes: Vec<Envelope> = records.iter().map(|r| serde_json::from_slice(&r.data).unwrap()).collect();
        assert!(records.iter().all(|r| r.partition_key == "todo-1"));
        assert_eq!(envelopes[0].id, "todo-1/4");
        assert_eq!(envelopes[1].id, "todo-1/5");
        let body = envelopes[1].body.as_ref().unwrap();
        assert_eq!(
            (body["version"].as_u64(), body["type"].as_str(), body["EntityId"].as_str()),
            (Some(5), Some("B"), Some("todo-1"))
        );
        assert_eq!(body["data"], json!({"n": 1}));
        // Readers drop copies by this id.
        let json: Value = serde_json::from_slice(&records[0].data).unwrap();
        assert_eq!(crate::dedupe::envelope_id(&json), Some("todo-1/4"));
    }

    #[test]
    fn tips_snapshots_and_updates_are_not_events() {
        let tip = json!({"stream": {"S": "s"}, "item": {"S": TIP}, "version": {"N": "3"}, "updated_at": {"N": "1"}});
        assert!(log_records(&record("INSERT", tip.clone())).unwrap().is_empty());
        assert!(log_records(&record("MODIFY", tip)).unwrap().is_empty());
        assert!(log_records(&record("REMOVE", batch_image("s", 0, &["A"]))).unwrap().is_empty());
        let broken = json!({"stream": {"S": "s"}, "item": {"S": batch_key(0)}});
        assert!(log_records(&record("INSERT", broken)).is_err());
    }
}
