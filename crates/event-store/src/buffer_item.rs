//! The buffer table's item: a chunk of Kinesis records of one shard and one
//! slot as the pump wrote them ([`crate::chunk`]), or, in items written before
//! chunks, one record.
//!
//! Its key is derived from the records' identity (stream ARN and the first
//! and last Kinesis event ids), never from time or randomness, so a
//! redelivered batch cut the same way overwrites itself (with the same
//! bytes) and writes spread evenly over all partitions.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::chunk::{self, ChunkEvent, Packed};
use crate::encoding::decode;
use crate::error::{Error, Result};
use crate::event_item::{item_size, sort_key, EventItem, MAX_ITEM_BYTES};
use crate::time::slot_of;

/// Name of the buffer table's hash key.
pub const HASH_KEY: &str = "id";
/// The buffer table's key attributes.
pub const KEY: &[&str] = &[HASH_KEY];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferItem {
    /// Hex sha256 of the event source ARN and the Kinesis event ids of the first and last record.
    pub id: String,
    /// Kinesis event id of the (first) record: `shardId-...:<sequence number>`.
    pub event_id: String,
    /// Arrival time of the (first) record, ms since the epoch: the oldest in the item.
    pub arrival: i64,
    /// The record's partition key (single-record items only: a chunk keeps one per event).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub partition_key: String,
    /// The record's data bytes, compressed when that saves space (see [`crate::encoding`]).
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// [`chunk::CHUNK`] for a chunk; for a single record `zstd` when `data` is
    /// compressed, absent when it is the bytes as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// Records in a chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// When the pump wrote the item (ms): `buffered_at - arrival` is the pump's
    /// lag, which the scan's completeness watermark allows for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffered_at: Option<i64>,
}

/// The buffer key of a chunk of one shard's records from `first` to `last` (Kinesis event ids).
pub(crate) fn chunk_key(event_source_arn: &str, first: &str, last: &str) -> String {
    buffer_key(event_source_arn, &format!("{first}{}{last}", chunk::SEPARATOR))
}

/// The buffer key of a Kinesis record (items written before chunks).
pub fn buffer_key(event_source_arn: &str, event_id: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(event_source_arn.as_bytes());
    hasher.update(event_id.as_bytes());
    hex::encode(hasher.finalize())
}

impl BufferItem {
    /// The event-table form of a single buffered record (not a chunk): its stored bytes and
    /// encoding are copied as they are (no recompression). An unknown encoding
    /// is a newer version's ([`Error::Newer`]: the scan leaves it in place); an
    /// item over DynamoDB's limit is an error (the scan quarantines it).
    pub fn to_event_item(&self, time_unit_ms: u64) -> Result<EventItem> {
        if !crate::encoding::known(self.encoding.as_deref()) {
            let other = self.encoding.as_deref().unwrap_or_default();
            return Err(Error::Newer(format!("buffer item of event {} in encoding {other:?}", self.event_id)));
        }
        let item = EventItem {
            slot: slot_of(self.arrival, time_unit_ms),
            sort_key: sort_key(self.arrival, &self.event_id),
            event_id: self.event_id.clone(),
            arrival: self.arrival,
            partition_key: self.partition_key.clone(),
            data: Some(self.data.clone()),
            encoding: self.encoding.clone(),
            payload: None,
            expires_at: None,
            moved_at: None,
        };
        let size = item_size(&item.to_item());
        if size > MAX_ITEM_BYTES {
            return Err(Error::Malformed(format!(
                "event {} is {size} bytes, over the 400 KB item limit",
                item.event_id
            )));
        }
        Ok(item)
    }

    /// The buffer item of a record, its data compressed when that pays, stamped `now_ms`.
    #[cfg(test)]
    pub(crate) fn from_kinesis(
        record: &aws_lambda_events::event::kinesis::KinesisEventRecord,
        now_ms: i64,
    ) -> Result<Self> {
        let missing = |what: &str| Error::Malformed(format!("kinesis record without {what}"));
        let arn = record.event_source_arn.as_deref().ok_or_else(|| missing("eventSourceARN"))?;
        let event_id = record.event_id.as_deref().ok_or_else(|| missing("eventID"))?;
        let (data, encoding) = crate::encoding::encode(&record.kinesis.data.0);
        Ok(Self {
            id: buffer_key(arn, event_id),
            event_id: event_id.to_owned(),
            arrival: record.kinesis.approximate_arrival_timestamp.timestamp_millis(),
            partition_key: record.kinesis.partition_key.clone(),
            data,
            encoding,
            buffered_at: Some(now_ms),
            count: None,
        })
    }

    /// The buffer item of a chunk of `packed` records of the stream `event_source_arn`, stamped `now_ms`.
    pub(crate) fn chunk(event_source_arn: &str, packed: &Packed, now_ms: i64) -> Option<Self> {
        let first = packed.events.first()?;
        let last = packed.events.last()?;
        Some(Self {
            id: chunk_key(event_source_arn, &first.event_id, &last.event_id),
            event_id: first.event_id.clone(),
            arrival: packed.events.iter().map(|e| e.arrival).min()?,
            partition_key: String::new(),
            data: packed.bytes.clone(),
            encoding: Some(chunk::CHUNK.to_owned()),
            buffered_at: Some(now_ms),
            count: Some(packed.events.len()),
        })
    }

    /// The records the item holds, their data as sent.
    pub fn events(&self) -> Result<Vec<ChunkEvent>> {
        if self.encoding.as_deref() == Some(chunk::CHUNK) {
            return chunk::unpack(&self.data);
        }
        Ok(vec![ChunkEvent {
            event_id: self.event_id.clone(),
            arrival: self.arrival,
            partition_key: self.partition_key.clone(),
            data: self.raw_data()?,
        }])
    }

    /// True when the item holds a chunk.
    pub(crate) fn is_chunk(&self) -> bool {
        self.encoding.as_deref() == Some(chunk::CHUNK)
    }

    pub fn to_item(&self) -> HashMap<String, AttributeValue> {
        // A struct of strings, numbers and bytes always serializes.
        serde_dynamo::to_item(self).unwrap_or_default()
    }

    pub fn from_item(item: HashMap<String, AttributeValue>) -> Result<Self> {
        serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("buffer item: {e}")))
    }

    /// The record's data as it was sent.
    pub(crate) fn raw_data(&self) -> Result<Vec<u8>> {
        decode(&self.data, self.encoding.as_deref())
    }

    /// The key attributes of a buffer item with this id.
    pub fn key_of(id: &str) -> HashMap<String, AttributeValue> {
        HashMap::from([(HASH_KEY.to_owned(), AttributeValue::S(id.to_owned()))])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_lambda_events::event::kinesis::KinesisEventRecord;

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
        let item = BufferItem::from_kinesis(&record(RECORD), 7).unwrap();
        assert_eq!((item.data.as_slice(), item.encoding.as_deref()), (&b"hello"[..], None), "too small to compress");
        assert_eq!(item.buffered_at, Some(7));
        assert_eq!(item.arrival, 1_480_641_523_477);
        assert_eq!(item.partition_key, "pk-1");
        assert_eq!(item.event_id, "shardId-000000000000:4956");
        let attrs = item.to_item();
        assert_eq!(attrs["data"], AttributeValue::B(b"hello".to_vec().into()));
        assert_eq!(attrs["arrival"], AttributeValue::N("1480641523477".into()));
        assert_eq!(BufferItem::from_item(attrs).unwrap(), item);
    }

    #[test]
    fn compressible_data_is_stored_compressed_and_read_back_as_sent() {
        use base64::Engine;
        let sent = br#"{"path":"/track.gif","query":{"page":"/docs/getting-started"}}"#.repeat(10);
        let encoded = base64::engine::general_purpose::STANDARD.encode(&sent);
        let item = BufferItem::from_kinesis(&record(&RECORD.replace("aGVsbG8=", &encoded)), 0).unwrap();
        assert_eq!(item.encoding.as_deref(), Some(crate::encoding::ZSTD));
        assert!(item.data.len() < sent.len() / 4);
        let back = BufferItem::from_item(item.to_item()).unwrap();
        assert_eq!(back.raw_data().unwrap(), sent);
    }

    #[test]
    fn rejects_records_without_identity_and_items_of_the_wrong_shape() {
        let no_id = RECORD.replace("\"eventID\"", "\"other\"");
        assert!(matches!(BufferItem::from_kinesis(&record(&no_id), 0), Err(Error::Malformed(_))));
        let mut attrs = BufferItem::from_kinesis(&record(RECORD), 0).unwrap().to_item();
        attrs.insert("arrival".into(), AttributeValue::S("soon".into()));
        assert!(matches!(BufferItem::from_item(attrs), Err(Error::Malformed(_))));
    }
}
