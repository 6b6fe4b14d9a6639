//! Decoding what the pump and scan read: a Kinesis event (pump) and a buffer
//! item's data turned into an event item (scan). Must never panic; an event
//! item must survive its DynamoDB encoding and give back the bytes it came from.
#![no_main]

use serde_json::Value;

use event_store::buffer_item::BufferItem;
use event_store::event_item::{item_size, EventItem, MAX_ITEM_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = event_store::pump::parse_event(value);
    }
    let buffered = BufferItem {
        id: "fuzz".into(),
        event_id: "shardId-000000000000:1".into(),
        arrival: 1_795_240_724_123,
        partition_key: "pk".into(),
        data: data.to_vec(),
    };
    assert_eq!(BufferItem::from_item(buffered.to_item()).expect("buffer item round trip"), buffered);
    if let Ok(event) = EventItem::from_buffer(&buffered, 1000) {
        let item = event.to_item();
        assert!(item_size(&item) <= MAX_ITEM_BYTES);
        let back = EventItem::from_item(item).expect("event item round trip");
        if event.data.is_some() {
            assert_eq!(back.bytes(), data, "binary data comes back as it was");
        } else {
            let original: serde_json::Value = serde_json::from_slice(data).expect("stored as JSON, so it parsed");
            let replayed: serde_json::Value = serde_json::from_slice(&back.bytes()).expect("replays as JSON");
            assert!(same_json(&replayed, &original), "JSON comes back equal: {replayed} vs {original}");
        }
    }
});

/// Equal as JSON values, numbers compared as numbers: DynamoDB keeps a
/// number's value, not its spelling (`1.0` may come back `1`, `-0` as `0`).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}
