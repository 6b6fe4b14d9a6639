//! load's parsing of what a client sends: the `POST /events` body and the
//! envelope built from it (partition key, size). Must never panic, and must
//! accept only what it documents: 1 to 500 JSON objects.
#![no_main]

use event_store::envelope::{Envelope, Headers};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(events) = event_store::load::parse_posted_events(text) else { return };
    assert!((1..=event_store::load::MAX_EVENTS_PER_POST).contains(&events.len()));
    for event in events {
        assert!(event.is_object());
        let envelope = Envelope {
            id: "fuzz".into(),
            received_at: "2026-11-21T00:00:00.000Z".into(),
            method: "POST".into(),
            path: "/events".into(),
            query: Default::default(),
            headers: Headers::default(),
            source_ip: None,
            body: Some(event),
        };
        if let Ok(key) = envelope.partition_key() {
            assert!((1..=256).contains(&key.chars().count()));
        }
        let encoded = serde_json::to_vec(&envelope).expect("an envelope always encodes");
        let decoded: Envelope = serde_json::from_slice(&encoded).expect("and decodes");
        assert_eq!(decoded.id, envelope.id);
    }
});
