//! The event table's item, and the playback record made from it.
//!
//! Partition key `slot` = arrival time truncated to `TIME_UNIT`; sort key
//! `sort_key` = zero-padded arrival ms, then the event id with its sequence
//! number made sortable, so a plain `Query` of a slot returns events in
//! arrival order with a deterministic tie-break (invariant 3).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};

use crate::buffer_item::BufferItem;
use crate::error::{Error, Result};
use crate::time::slot_of;

pub const PARTITION_KEY: &str = "slot";
/// The event table's quarantine partition: buffer items the scan could not
/// turn into events, kept with the reason (`slot = -1`, sort key = buffer id).
/// Playback never reads it: windows start at or after 1970.
pub const QUARANTINE_SLOT: i64 = -1;
pub const SORT_KEY: &str = "sort_key";
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
    /// The event, decoded, when its data is JSON (readable in the console).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    /// The event's bytes, when they are not JSON (or too large as a map).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "serde_bytes")]
    pub data: Option<Vec<u8>>,
    /// TTL (epoch seconds) when a retention is configured; absent = kept forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

/// Sort key for an event: `<arrival ms, 13 digits>#<shard>#<len><sequence>`.
///
/// Kinesis sequence numbers are decimal strings of varying length; prefixing
/// their length (3 digits) makes string order equal numeric order.
pub fn sort_key(arrival_ms: i64, event_id: &str) -> String {
    let (shard, sequence) = event_id.rsplit_once(':').unwrap_or(("", event_id));
    if !sequence.is_empty() && sequence.bytes().all(|b| b.is_ascii_digit()) {
        format!("{arrival_ms:013}#{shard}#{:03}{sequence}", sequence.len())
    } else {
        format!("{arrival_ms:013}#{shard}#{sequence}")
    }
}

/// The smallest sort key of any event that arrived at `ms` or later.
pub fn sort_key_floor(ms: i64) -> String {
    format!("{ms:013}")
}

impl EventItem {
    /// The event-table form of a buffered record. JSON data is stored decoded
    /// unless that would push the item over DynamoDB's limit, in which case the
    /// bytes are kept as they are; an item too large either way is an error.
    pub fn from_buffer(buffer: &BufferItem, time_unit_ms: u64) -> Result<Self> {
        let payload = std::str::from_utf8(&buffer.data)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok());
        let mut item = Self {
            slot: slot_of(buffer.arrival, time_unit_ms),
            sort_key: sort_key(buffer.arrival, &buffer.event_id),
            event_id: buffer.event_id.clone(),
            arrival: buffer.arrival,
            partition_key: buffer.partition_key.clone(),
            data: None,
            payload,
            expires_at: None,
        };
        let storable = item.payload.as_ref().is_some_and(|p| fits_dynamodb(p, 1));
        if !storable || item_size(&item.to_item()) > MAX_ITEM_BYTES {
            item.payload = None;
            item.data = Some(buffer.data.clone());
        }
        let size = item_size(&item.to_item());
        if size > MAX_ITEM_BYTES {
            return Err(Error::Malformed(format!(
                "event {} is {size} bytes, over the 400 KB item limit",
                item.event_id
            )));
        }
        Ok(item)
    }

    /// Sets the TTL to `days` after the event's arrival (so a repeated move writes the same value).
    pub fn with_retention(mut self, days: Option<u32>) -> Self {
        self.expires_at = days.map(|d| self.arrival.div_euclid(1000) + i64::from(d) * 86_400);
        self
    }

    pub fn to_item(&self) -> HashMap<String, AttributeValue> {
        serde_dynamo::to_item(self).unwrap_or_default()
    }

    pub fn from_item(item: HashMap<String, AttributeValue>) -> Result<Self> {
        serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("event item: {e}")))
    }

    /// The event's bytes as they should go out again: raw data, or the JSON payload re-encoded.
    pub fn bytes(&self) -> Vec<u8> {
        match (&self.data, &self.payload) {
            (Some(data), _) => data.clone(),
            (None, Some(value)) => serde_json::to_vec(value).unwrap_or_default(),
            (None, None) => b"null".to_vec(),
        }
    }
}

/// The quarantine item for a buffer item that cannot become an event: its
/// original attributes and the reason. `None` when even that would not fit
/// in an item (the buffer item then stays where it is, logged).
pub fn quarantine_item(
    buffer_id: &str,
    reason: &str,
    original: HashMap<String, AttributeValue>,
    now_ms: i64,
) -> Option<HashMap<String, AttributeValue>> {
    let item = HashMap::from([
        (PARTITION_KEY.to_owned(), AttributeValue::N(QUARANTINE_SLOT.to_string())),
        (SORT_KEY.to_owned(), AttributeValue::S(buffer_id.to_owned())),
        ("reason".to_owned(), AttributeValue::S(reason.chars().take(1000).collect())),
        ("quarantined_at".to_owned(), AttributeValue::N(now_ms.to_string())),
        ("original".to_owned(), AttributeValue::M(original)),
    ]);
    (item_size(&item) <= MAX_ITEM_BYTES).then_some(item)
}

/// DynamoDB nests maps and lists at most 32 levels deep.
const MAX_DEPTH: usize = 32;

/// True when DynamoDB can store this JSON as a document: numbers within its
/// range (magnitude 1e-130 to below 1e126), at most 32 levels of nesting, no
/// empty map keys. (Floats come back bit for bit: serde_json parses them with
/// `float_roundtrip`, which the fuzzer showed is needed.) Anything else would fail the whole `BatchWriteItem` it
/// travels in, so such events are stored as bytes instead.
pub fn fits_dynamodb(value: &serde_json::Value, depth: usize) -> bool {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => true,
        Value::Number(n) => n.as_f64().is_some_and(|f| f == 0.0 || (f.abs() >= 1e-130 && f.abs() < 1e126)),
        Value::Array(items) => depth <= MAX_DEPTH && items.iter().all(|v| fits_dynamodb(v, depth + 1)),
        Value::Object(map) => {
            depth <= MAX_DEPTH && map.iter().all(|(k, v)| !k.is_empty() && fits_dynamodb(v, depth + 1))
        }
        _ => true,
    }
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

    fn buffered(arrival: i64, event_id: &str, data: &[u8]) -> BufferItem {
        BufferItem {
            id: "k".into(),
            event_id: event_id.into(),
            arrival,
            partition_key: "pk".into(),
            data: data.to_vec(),
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
    fn json_is_stored_decoded_and_other_bytes_as_binary() {
        let json = EventItem::from_buffer(&buffered(1_234, "s:1", br#"{"a":[1,"x"]}"#), 1000).unwrap();
        assert_eq!(json.slot, 1_000);
        assert_eq!(json.payload, Some(serde_json::json!({"a": [1, "x"]})));
        assert!(json.data.is_none());
        assert!(matches!(json.to_item()["payload"], AttributeValue::M(_)));
        assert_eq!(json.bytes(), br#"{"a":[1,"x"]}"#);

        let binary = EventItem::from_buffer(&buffered(1_234, "s:1", &[0xff, 0x00, 0x7b]), 1000).unwrap();
        assert_eq!(binary.data.as_deref(), Some(&[0xff, 0x00, 0x7b][..]));
        assert!(binary.payload.is_none());
        assert_eq!(EventItem::from_item(binary.to_item()).unwrap(), binary);
        assert_eq!(EventItem::from_item(json.to_item()).unwrap(), json);
        assert!(!json.to_item().contains_key("expires_at"), "kept forever by default");
        let kept = json.clone().with_retention(Some(30));
        assert_eq!(kept.expires_at, Some(1 + 30 * 86_400));
        assert_eq!(kept.to_item()["expires_at"], AttributeValue::N((1 + 30 * 86_400).to_string()));
    }

    #[test]
    fn json_dynamodb_cannot_hold_is_kept_as_bytes() {
        for text in
            [r#"{"x":1e200}"#, r#"{"x":1e-200}"#, r#"{"":1}"#, &format!("{}1{}", "[".repeat(40), "]".repeat(40))]
        {
            let item = EventItem::from_buffer(&buffered(1, "s:1", text.as_bytes()), 1000).unwrap();
            assert!(item.payload.is_none(), "{text}");
            assert_eq!(item.data.as_deref(), Some(text.as_bytes()));
        }
        let fine = format!(
            "{}{{\"n\":[0,-0,1.5e125,-2e-129,18446744073709551615,230.9920888880188182]}}{}",
            "[".repeat(30),
            "]".repeat(30)
        );
        assert!(EventItem::from_buffer(&buffered(1, "s:1", fine.as_bytes()), 1000).unwrap().payload.is_some());
    }

    #[test]
    fn quarantine_keeps_the_original_and_the_reason_when_it_fits() {
        let original = HashMap::from([("id".to_string(), AttributeValue::S("abc".into()))]);
        let item = quarantine_item("abc", "buffer item: missing field `arrival`", original.clone(), 7).unwrap();
        assert_eq!(item[PARTITION_KEY], AttributeValue::N("-1".into()));
        assert_eq!(item[SORT_KEY], AttributeValue::S("abc".into()));
        assert_eq!(item["original"], AttributeValue::M(original));
        let huge = HashMap::from([("data".to_string(), AttributeValue::B(vec![0; MAX_ITEM_BYTES].into()))]);
        assert!(quarantine_item("abc", "too large", huge, 7).is_none());
    }

    #[test]
    fn large_json_falls_back_to_binary_and_oversized_items_are_refused() {
        // Many tiny numbers: the map form costs more than the text.
        let many: Vec<u32> = vec![1; 150_000];
        let text = serde_json::to_vec(&many).unwrap();
        assert!(text.len() < MAX_ITEM_BYTES);
        let item = EventItem::from_buffer(&buffered(1, "s:1", &text), 1000).unwrap();
        assert!(item.payload.is_none() && item.data.as_deref() == Some(&text[..]));

        let huge = vec![b'x'; MAX_ITEM_BYTES + 1];
        assert!(matches!(EventItem::from_buffer(&buffered(1, "s:1", &huge), 1000), Err(Error::Malformed(_))));
    }
}
