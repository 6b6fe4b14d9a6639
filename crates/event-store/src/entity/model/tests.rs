use serde_json::json;

use super::*;

#[test]
fn names_are_one_plain_path_segment() {
    assert!(check_name("Todo-42").is_ok());
    assert!(check_name("order:2026.11@eu+x=y~z_").is_ok());
    assert!(check_name(&"a".repeat(256)).is_ok());
    assert!(check_name(&"a".repeat(257)).is_err());
    assert!(check_name("").is_err());
    for bad in ["a/b", "a b", "a%2F", "a#b", "a?b", "é"] {
        assert!(check_name(bad).is_err(), "{bad}");
    }
}

#[test]
fn parses_one_event_or_an_array_and_rejects_the_rest() {
    let one = parse_events(br#"{"type":"Created","data":{"title":"x"}}"#).unwrap();
    assert_eq!(one, vec![NewEvent::new("Created", json!({"title": "x"}))]);
    let two = parse_events(br#"[{"type":"A","data":1},{"type":"B","data":null,"metadata":{"by":"me"}}]"#).unwrap();
    assert_eq!(two.len(), 2);
    assert_eq!(two[1].metadata, Some(json!({"by": "me"})));
    assert!(parse_events(b"[1,2]").is_err());
    assert!(parse_events(b"{\"type\":\"A\"}").is_err(), "data is required");
    assert!(parse_events(b"{\"type\":\"A\",\"data\":1,\"extra\":2}").is_err(), "unknown fields are refused");
    assert!(parse_events(b"{\"type\":\"A\",\"data\":1,\"id\":\"not-a-uuid\"}").is_err());
    assert!(matches!(parse_events(b"{oops"), Err(Invalid::BadRequest(m)) if m.contains("malformed JSON")));
}

#[test]
fn prepare_enforces_the_limits() {
    let event = |size: usize| NewEvent::new("T", Value::String("x".repeat(size)));
    assert!(matches!(prepare(vec![], Limits::INLINE), Err(Invalid::BadRequest(_))));
    assert!(prepare(vec![event(1); 100], Limits::INLINE).is_ok());
    assert!(matches!(prepare(vec![event(1); 101], Limits::INLINE), Err(Invalid::TooLarge(_))));
    assert!(
        matches!(prepare(vec![event(MAX_EVENT_BYTES)], Limits::INLINE), Err(Invalid::TooLarge(m)) if m.contains("event 0"))
    );
    assert!(
        matches!(prepare(vec![event(60 * 1024); 6], Limits::INLINE), Err(Invalid::TooLarge(m)) if m.contains("together"))
    );
    let id = uuid::Uuid::new_v4();
    let twice = vec![NewEvent { id: Some(id), ..event(1) }, NewEvent { id: Some(id), ..event(1) }];
    assert!(matches!(prepare(twice, Limits::INLINE), Err(Invalid::BadRequest(m)) if m.contains("twice")));
    let empty_type = NewEvent::new("", json!(1));
    assert!(prepare(vec![empty_type], Limits::INLINE).is_err());
    // With a bucket: events up to the large limit, counted in the item as their reference.
    let offloading = Limits { event: 4 << 20, offload_over: Some(64 * 1024) };
    assert!(prepare(vec![event(3 << 20); 3], offloading).is_ok());
    assert!(matches!(prepare(vec![event(4 << 20)], offloading), Err(Invalid::TooLarge(m)) if m.contains("event 0")));
    assert!(
        matches!(prepare(vec![event(60 * 1024); 6], offloading), Err(Invalid::TooLarge(m)) if m.contains("together"))
    );
    let big_metadata = NewEvent { metadata: Some(Value::String("m".repeat(70 * 1024))), ..event(10) };
    assert!(matches!(prepare(vec![big_metadata], offloading), Err(Invalid::TooLarge(m)) if m.contains("metadata")));
}

#[test]
fn data_comes_back_exactly() {
    let data = json!({"n": 12345678901234567u64, "f": 0.1, "s": "", "nested": [null, true]});
    let stored = prepare(vec![NewEvent::new("T", data.clone())], Limits::INLINE).unwrap();
    let batch = Batch { stream: "s".into(), item: batch_key(7), first: 7, at: 0, events: stored };
    let read: Vec<RecordedEvent> = batch.read().collect();
    assert_eq!(read[0].data, data);
    assert_eq!(read[0].version, 7);
    assert_eq!(batch.last(), 7);
}

#[test]
fn a_batch_stores_its_events_as_one_json_string() {
    let events =
        prepare(vec![NewEvent::new("T", json!({"a": 1})), NewEvent::new("U", json!(null))], Limits::INLINE).unwrap();
    let batch = Batch { stream: "s".into(), item: batch_key(0), first: 0, at: 5, events };
    let item: HashMap<String, AttributeValue> = serde_dynamo::to_item(&batch).unwrap();
    assert!(matches!(&item["events"], AttributeValue::S(text) if text.starts_with("[{")));
    assert_eq!(StreamItem::decode(item).unwrap(), StreamItem::Batch(batch));
}

#[test]
fn sort_keys_order_batches_then_snapshot_then_tip() {
    let mut keys = vec![TIP.to_owned(), batch_key(10), SNAPSHOT.to_owned(), batch_key(9), batch_key(MAX_VERSION)];
    keys.sort();
    assert_eq!(keys, vec![batch_key(9), batch_key(10), batch_key(MAX_VERSION), SNAPSHOT.to_owned(), TIP.to_owned()]);
    assert_eq!(batch_version(&batch_key(42)), Some(42));
    assert_eq!(batch_version(TIP), None);
    assert_eq!(batch_version(SNAPSHOT), None);
}

#[test]
fn request_keys_follow_the_ids_and_delete_has_a_fixed_id() {
    let with_ids = |ids: &[&str]| -> Vec<StoredEventItem> {
        ids.iter()
            .map(|id| StoredEventItem {
                id: (*id).into(),
                event_type: "T".into(),
                data: "1".into(),
                metadata: None,
                data_ref: None,
                subject: None,
                sealed: None,
                schema_version: None,
                trace: None,
            })
            .collect()
    };
    assert_eq!(request_key(&with_ids(&["a", "b"])), request_key(&with_ids(&["a", "b"])));
    assert_ne!(request_key(&with_ids(&["a", "b"])), request_key(&with_ids(&["b", "a"])));
    assert_ne!(request_key(&with_ids(&["ab"])), request_key(&with_ids(&["a", "b"])));
    assert_eq!(deleted_event("x"), deleted_event("x"));
    assert_ne!(deleted_event("x").id, deleted_event("y").id);
}
