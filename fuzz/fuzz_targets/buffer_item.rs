//! Decoding what the pump and scan read: a Kinesis event (pump) and a buffer
//! item's data turned into an event item (scan). Must never panic; an event
//! item must survive its DynamoDB encoding and give back the bytes it came
//! from, compressed or not, and stored bytes that are not valid zstd must be
//! an error, never a panic.
#![no_main]

use event_store::buffer_item::BufferItem;
use event_store::encoding::{decode, encode, ZSTD};
use event_store::event_item::{item_size, EventItem, MAX_ITEM_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = event_store::pump::parse_kinesis_event(value);
    }
    let _ = decode(data, Some(ZSTD));
    let (stored, encoding) = encode(data);
    let buffered = BufferItem {
        id: "fuzz".into(),
        event_id: "shardId-000000000000:1".into(),
        arrival: 1_795_240_724_123,
        partition_key: "pk".into(),
        data: stored,
        encoding,
        buffered_at: Some(1_795_240_724_200),
    };
    assert_eq!(BufferItem::from_item(buffered.to_item()).expect("buffer item round trip"), buffered);
    assert_eq!(buffered.raw_data().expect("decodes"), data);
    if let Ok(event) = buffered.to_event_item(1000) {
        let item = event.to_item();
        assert!(item_size(&item) <= MAX_ITEM_BYTES);
        let back = EventItem::from_item(item).expect("event item round trip");
        assert_eq!(back.bytes().expect("decodes"), data, "the event comes back as it was sent");
    }
});
