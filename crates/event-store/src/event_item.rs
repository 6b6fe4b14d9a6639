//! The event table's item, and the playback record made from it.
//!
//! Partition key `slot` = arrival time truncated to `TIME_UNIT`; sort key
//! `sort_key` = zero-padded arrival ms, then the event id with its sequence
//! number made sortable, so a plain `Query` of a slot returns events in
//! arrival order with a deterministic tie-break (`docs/design.md#3-order`).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};

use crate::encoding::decode;
use crate::error::{Error, Result};

/// The event table's hash key: the slot (named for DynamoDB's key kind, not
/// to be confused with an event's Kinesis `partition_key`).
pub const HASH_KEY: &str = "slot";
/// The event table's quarantine partition: buffer items the scan could not
/// turn into events, kept with the reason (`slot = -1`, sort key = buffer id).
/// Playback never reads it: windows start at or after 1970.
pub const QUARANTINE_SLOT: i64 = -1;
/// The event table's range key: arrival time, then the event id.
pub const RANGE_KEY: &str = "sort_key";
/// The event table's key attributes.
pub const KEY: &[&str] = &[HASH_KEY, RANGE_KEY];
/// DynamoDB's item size limit, "400 KB", taken as 400,000 bytes: AWS allows a
/// little more and moto a little less than 400 KiB; 400,000 holds on both.
pub const MAX_ITEM_BYTES: usize = 400_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventItem {
    /// Slot start, ms since the epoch.
    pub slot: i64,
    pub sort_key: String,
    pub event_id: String,
    /// Kinesis approximate arrival time, ms since the epoch.
    pub arrival: i64,
    pub partition_key: String,
    /// The event's bytes, compressed when that saves space (see [`crate::encoding`]).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "serde_bytes")]
    pub data: Option<Vec<u8>>,
    /// `zstd` when `data` is compressed; absent when it is the bytes as sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// Items written before compression kept JSON events as a document; read, never written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// TTL (epoch seconds) when a retention is configured; absent = kept forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// When the scan moved it here (ms): `moved_at - arrival` is the event's
    /// time from stream to table (the benchmark's latency).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_at: Option<i64>,
}

/// Sort key for an event: `<arrival ms, 13 digits>#<shard>#<len><sequence>`.
///
/// Kinesis sequence numbers are decimal strings of varying length; prefixing
/// their length (3 digits) makes string order equal numeric order.
pub(crate) fn sort_key(arrival_ms: i64, event_id: &str) -> String {
    let (shard, sequence) = event_id.rsplit_once(':').unwrap_or(("", event_id));
    format!("{arrival_ms:013}#{shard}#{}", sortable_sequence(sequence))
}

/// A Kinesis sequence number as text whose order is numeric order (its
/// length in 3 digits, then the digits); anything else is kept as it is.
pub(crate) fn sortable_sequence(sequence: &str) -> String {
    if !sequence.is_empty() && sequence.bytes().all(|b| b.is_ascii_digit()) {
        format!("{:03}{sequence}", sequence.len())
    } else {
        sequence.to_owned()
    }
}

/// The smallest sort key of any event that arrived at `ms` or later.
pub fn sort_key_floor(ms: i64) -> String {
    format!("{ms:013}")
}

impl EventItem {
    /// Sets the TTL to `days` after the event's arrival (so a repeated move writes the same value).
    #[cfg(test)]
    pub(crate) fn with_retention(mut self, days: Option<u32>) -> Self {
        self.expires_at = days.map(|d| self.arrival.div_euclid(1000) + i64::from(d) * 86_400);
        self
    }

    pub fn moved(mut self, now_ms: i64) -> Self {
        self.moved_at = Some(now_ms);
        self
    }

    pub fn to_item(&self) -> HashMap<String, AttributeValue> {
        serde_dynamo::to_item(self).unwrap_or_default()
    }

    pub(crate) fn from_item(item: HashMap<String, AttributeValue>) -> Result<Self> {
        serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("event item: {e}")))
    }

    /// The event's bytes as they were sent (decompressed; a legacy JSON document re-encoded).
    pub fn bytes(&self) -> Result<Vec<u8>> {
        match (&self.data, &self.payload) {
            (Some(data), _) => decode(data, self.encoding.as_deref()),
            (None, Some(value)) => serde_json::to_vec(value).map_err(|e| Error::Malformed(e.to_string())),
            (None, None) => Err(Error::Malformed(format!("event {} has no data", self.event_id))),
        }
    }

    /// Whether this stands for a stored item that does not decode (its events
    /// unknown: every partition of a reader meets it, and parks it or waits
    /// on it), as the log's reader hands such an item on in its place.
    pub(crate) fn in_its_place(&self) -> bool {
        self.partition_key.is_empty()
    }

    /// The event as JSON, when it is JSON.
    pub fn json(&self) -> Option<serde_json::Value> {
        match &self.payload {
            Some(value) => Some(value.clone()),
            None => serde_json::from_slice(&self.bytes().ok()?).ok(),
        }
    }
}

/// The quarantine item for a stored item that cannot be read (a buffer item
/// that cannot become an event, a damaged item of the event table): its
/// original attributes and the reason. `None` when even that would not fit
/// in an item (the buffer item then stays where it is, logged).
pub(crate) fn quarantine_item(
    buffer_id: &str,
    reason: &str,
    original: HashMap<String, AttributeValue>,
    now_ms: i64,
) -> Option<HashMap<String, AttributeValue>> {
    let item = HashMap::from([
        (HASH_KEY.to_owned(), AttributeValue::N(QUARANTINE_SLOT.to_string())),
        (RANGE_KEY.to_owned(), AttributeValue::S(buffer_id.to_owned())),
        ("reason".to_owned(), AttributeValue::S(reason.chars().take(1000).collect())),
        ("quarantined_at".to_owned(), AttributeValue::N(now_ms.to_string())),
        ("original".to_owned(), AttributeValue::M(original)),
    ]);
    (item_size(&item) <= MAX_ITEM_BYTES).then_some(item)
}

/// DynamoDB's size of an item: attribute names plus values, as documented.
pub fn item_size(item: &HashMap<String, AttributeValue>) -> usize {
    item.iter().map(|(name, value)| name.len() + value_size(value)).sum()
}

fn value_size(value: &AttributeValue) -> usize {
    match value {
        AttributeValue::S(s) => s.len(),
        // Numbers: about one byte per two significant digits, plus one.
        AttributeValue::N(n) => n.len().div_ceil(2) + 1,
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(v) => 3 + v.iter().map(|x| 1 + value_size(x)).sum::<usize>(),
        AttributeValue::M(m) => 3 + m.iter().map(|(k, x)| 1 + k.len() + value_size(x)).sum::<usize>(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer_item::BufferItem;
    use crate::encoding::ZSTD;

    fn buffered(arrival: i64, event_id: &str, data: &[u8]) -> BufferItem {
        let (data, encoding) = crate::encoding::encode(data);
        BufferItem {
            id: "k".into(),
            event_id: event_id.into(),
            arrival,
            partition_key: "pk".into(),
            data,
            encoding,
            buffered_at: None,
            count: None,
        }
    }

    #[test]
    fn sort_keys_order_by_time_then_numeric_sequence() {
        let mut keys = vec![
            sort_key(1_000, "shardId-000000000000:10"),
            sort_key(999, "shardId-000000000000:99999"),
            sort_key(1_000, "shardId-000000000000:9"),
            sort_key(1_000, "shardId-000000000001:1"),
            sort_key(12_000, "shardId-000000000000:1"),
        ];
        keys.sort();
        assert_eq!(
            keys,
            vec![
                "0000000000999#shardId-000000000000#00599999",
                "0000000001000#shardId-000000000000#0019",
                "0000000001000#shardId-000000000000#00210",
                "0000000001000#shardId-000000000001#0011",
                "0000000012000#shardId-000000000000#0011",
            ]
        );
        assert!(sort_key_floor(1_000) < keys[1] && sort_key_floor(1_001) > keys[3]);
    }

    #[test]
    fn events_keep_their_stored_bytes_and_read_back_as_sent() {
        let text = br#"{"a":[1,"x"],"path":"/track.gif","ua":"Mozilla/5.0 (X11; Linux x86_64)"}"#.repeat(8);
        let json = buffered(1_234, "s:1", &text).to_event_item(1000).unwrap();
        assert_eq!(json.slot, 1_000);
        assert_eq!(json.encoding.as_deref(), Some(ZSTD), "stored compressed, as the pump wrote it");
        assert!(json.data.as_ref().unwrap().len() < text.len() / 4);
        assert_eq!(json.bytes().unwrap(), text);
        assert_eq!(EventItem::from_item(json.to_item()).unwrap(), json);

        let binary = buffered(1_234, "s:1", &[0xff, 0x00, 0x7b]).to_event_item(1000).unwrap();
        assert_eq!((binary.data.as_deref(), binary.encoding.as_deref()), (Some(&[0xff, 0x00, 0x7b][..]), None));
        assert_eq!(EventItem::from_item(binary.to_item()).unwrap().bytes().unwrap(), [0xff, 0x00, 0x7b]);
        assert!(binary.json().is_none());

        assert!(!json.to_item().contains_key("expires_at"), "kept forever by default");
        let kept = json.clone().with_retention(Some(30)).moved(5);
        assert_eq!(kept.expires_at, Some(1 + 30 * 86_400));
        assert_eq!(kept.to_item()["expires_at"], AttributeValue::N((1 + 30 * 86_400).to_string()));
        assert_eq!(kept.to_item()["moved_at"], AttributeValue::N("5".into()));
    }

    #[test]
    fn items_written_as_json_documents_still_read() {
        let mut item = buffered(1, "s:1", b"{}").to_event_item(1000).unwrap().to_item();
        item.remove("data");
        item.insert("payload".into(), AttributeValue::M(HashMap::from([("n".into(), AttributeValue::N("7".into()))])));
        let legacy = EventItem::from_item(item).unwrap();
        assert_eq!(legacy.json(), Some(serde_json::json!({"n": 7})));
        assert_eq!(legacy.bytes().unwrap(), br#"{"n":7}"#);
    }

    #[test]
    fn unknown_encodings_are_a_newer_versions() {
        let mut odd = buffered(1, "s:1", b"x");
        odd.encoding = Some("lz4".into());
        assert!(matches!(odd.to_event_item(1000), Err(Error::Newer(m)) if m.contains("lz4")));
    }

    #[test]
    fn quarantine_keeps_the_original_and_the_reason_when_it_fits() {
        let original = HashMap::from([("id".to_string(), AttributeValue::S("abc".into()))]);
        let item = quarantine_item("abc", "buffer item: missing field `arrival`", original.clone(), 7).unwrap();
        assert_eq!(item[HASH_KEY], AttributeValue::N("-1".into()));
        assert_eq!(item[RANGE_KEY], AttributeValue::S("abc".into()));
        assert_eq!(item["original"], AttributeValue::M(original));
        let huge = HashMap::from([("data".to_string(), AttributeValue::B(vec![0; MAX_ITEM_BYTES].into()))]);
        assert!(quarantine_item("abc", "too large", huge, 7).is_none());
    }

    #[test]
    fn oversized_items_are_refused() {
        let mut rng = fastrand::Rng::with_seed(7);
        let noise: Vec<u8> = (0..=MAX_ITEM_BYTES).map(|_| rng.u8(..)).collect();
        assert!(matches!(buffered(1, "s:1", &noise).to_event_item(1000), Err(Error::Malformed(_))));
        let compressible = vec![b'x'; MAX_ITEM_BYTES + 1];
        assert!(buffered(1, "s:1", &compressible).to_event_item(1000).is_ok(), "compressed, it fits");
    }
}
