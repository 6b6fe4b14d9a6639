//! The buffer table's item: one Kinesis record as the pump wrote it.
//!
//! Its key is derived from the record's identity (stream ARN + Kinesis event
//! id), never from time or randomness, so a redelivered record overwrites
//! itself and writes spread evenly over all partitions.

use std::collections::HashMap;

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Name of the buffer table's hash key.
pub const KEY: &str = "id";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferItem {
    /// Hex sha256 of (event source ARN + Kinesis event id).
    pub id: String,
    /// Kinesis event id: `shardId-...:<sequence number>`.
    pub event_id: String,
    /// Kinesis approximate arrival time, ms since the epoch.
    pub arrival: i64,
    pub partition_key: String,
    /// The record's data bytes, as sent.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// The buffer key of a Kinesis record.
pub fn buffer_key(event_source_arn: &str, event_id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(event_source_arn.as_bytes());
    hasher.update(event_id.as_bytes());
    hex::encode(hasher.finalize())
}

impl BufferItem {
    pub fn from_kinesis(record: &KinesisEventRecord) -> Result<Self> {
        let missing = |what: &str| Error::Malformed(format!("kinesis record without {what}"));
        let arn = record.event_source_arn.as_deref().ok_or_else(|| missing("eventSourceARN"))?;
        let event_id = record.event_id.as_deref().ok_or_else(|| missing("eventID"))?;
        Ok(Self {
            id: buffer_key(arn, event_id),
            event_id: event_id.to_owned(),
            arrival: record.kinesis.approximate_arrival_timestamp.timestamp_millis(),
            partition_key: record.kinesis.partition_key.clone(),
            data: record.kinesis.data.0.clone(),
        })
    }

    pub fn to_item(&self) -> HashMap<String, AttributeValue> {
        // A struct of strings, numbers and bytes always serializes.
        serde_dynamo::to_item(self).unwrap_or_default()
    }

    pub fn from_item(item: HashMap<String, AttributeValue>) -> Result<Self> {
        serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("buffer item: {e}")))
    }

    /// The key attributes of a buffer item with this id.
    pub fn key_of(id: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([(KEY.to_owned(), AttributeValue::S(id.to_owned()))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(json: &str) -> KinesisEventRecord {
        serde_json::from_str(json).unwrap()
    }

    const RECORD: &str = r#"{
        "kinesis": {"partitionKey": "pk-1", "sequenceNumber": "4956", "data": "aGVsbG8=",
                    "approximateArrivalTimestamp": 1480641523.477},
        "eventID": "shardId-000000000000:4956",
        "eventSourceARN": "arn:aws:kinesis:us-east-1:123456789012:stream/s"
    }"#;

    #[test]
    fn key_is_sha256_of_arn_and_event_id() {
        let key = buffer_key("arn:aws:kinesis:us-east-1:123456789012:stream/s", "shardId-000000000000:4956");
        assert_eq!(key.len(), 64);
        assert_eq!(key, buffer_key("arn:aws:kinesis:us-east-1:123456789012:stream/s", "shardId-000000000000:4956"));
        assert_ne!(key, buffer_key("arn:aws:kinesis:us-east-1:123456789012:stream/t", "shardId-000000000000:4956"));
        // sha256("abc") is a published test vector.
        assert_eq!(buffer_key("a", "bc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }

    #[test]
    fn converts_a_kinesis_record_keeping_raw_bytes_and_ms() {
        let item = BufferItem::from_kinesis(&record(RECORD)).unwrap();
        assert_eq!(item.data, b"hello");
        assert_eq!(item.arrival, 1_480_641_523_477);
        assert_eq!(item.partition_key, "pk-1");
        assert_eq!(item.event_id, "shardId-000000000000:4956");
        let attrs = item.to_item();
        assert_eq!(attrs["data"], AttributeValue::B(b"hello".to_vec().into()));
        assert_eq!(attrs["arrival"], AttributeValue::N("1480641523477".into()));
        assert_eq!(BufferItem::from_item(attrs).unwrap(), item);
    }

    #[test]
    fn rejects_records_without_identity_and_items_of_the_wrong_shape() {
        let no_id = RECORD.replace("\"eventID\"", "\"other\"");
        assert!(matches!(BufferItem::from_kinesis(&record(&no_id)), Err(Error::Malformed(_))));
        let mut attrs = BufferItem::from_kinesis(&record(RECORD)).unwrap().to_item();
        attrs.insert("arrival".into(), AttributeValue::S("soon".into()));
        assert!(matches!(BufferItem::from_item(attrs), Err(Error::Malformed(_))));
    }
}
