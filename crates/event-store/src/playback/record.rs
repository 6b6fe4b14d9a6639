//! The record a consumer of the playback stream receives: the event and
//! where it came from. Pure: a serde shape and its constructor.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event_item::EventItem;
use crate::time::format_ms;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlayedEvent {
    /// Position in this playback, from 0; a record seen again with a number
    /// already seen is a duplicate.
    pub playback_seq: u64,
    /// The event's arrival time (Kinesis approximate arrival), ISO 8601 and ms.
    pub event_time: String,
    pub event_ms: i64,
    pub event_id: String,
    pub partition_key: String,
    /// The event itself when it is JSON...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// ...else its bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
}

impl PlayedEvent {
    pub fn new(event: &EventItem, json: Option<Value>, bytes: &[u8], seq: u64) -> Self {
        use base64::Engine;
        let data_base64 = json.is_none().then(|| base64::engine::general_purpose::STANDARD.encode(bytes));
        Self {
            playback_seq: seq,
            event_time: format_ms(event.arrival),
            event_ms: event.arrival,
            event_id: event.event_id.clone(),
            partition_key: event.partition_key.clone(),
            data: json,
            data_base64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::sort_key;

    #[test]
    fn played_records_carry_time_sequence_and_the_event() {
        let event = EventItem {
            slot: 1_000,
            sort_key: sort_key(1_234, "shardId-000000000000:7"),
            event_id: "shardId-000000000000:7".into(),
            arrival: 1_234,
            partition_key: "user-1".into(),
            data: None,
            encoding: None,
            payload: None,
            expires_at: None,
            moved_at: None,
        };
        let json = PlayedEvent::new(&event, Some(serde_json::json!({"a": 1})), b"{\"a\":1}", 41);
        let value = serde_json::to_value(&json).unwrap();
        assert_eq!(value["playback_seq"], 41);
        assert_eq!(value["event_time"], "1970-01-01T00:00:01.234Z");
        assert_eq!(value["data"], serde_json::json!({"a": 1}));
        assert!(value.get("data_base64").is_none());
        let binary = PlayedEvent::new(&event, None, &[0xff, 0x00], 42);
        assert_eq!(binary.data_base64.as_deref(), Some("/wA="));
    }
}
