use serde_json::json;

use super::*;

fn tip(version: u64, deleted: bool) -> Option<Tip> {
    Some(Tip {
        stream: "s".into(),
        item: TIP.into(),
        version,
        deleted,
        last_request: None,
        last_first: None,
        updated_at: 0,
        meta_version: None,
        retention: None,
        trimmed: None,
    })
}

fn part(stream: &str, expected: Expected) -> Part {
    let events =
        super::super::model::prepare(vec![NewEvent::new("T", json!({}))], super::super::model::Limits::INLINE).unwrap();
    Part { stream: stream.into(), expected, events }
}

#[test]
fn the_first_refuted_expectation_or_condition_names_its_stream() {
    let parts = [part("a", Expected::Version(3)), part("b", Expected::Any)];
    let conditions = [("c".to_owned(), Condition::Version(7)), ("d".to_owned(), Condition::NoStream)];
    let ok = expectations(&parts, &conditions, &[tip(3, false), tip(9, false), tip(7, false), None]).unwrap();
    assert_eq!(ok, vec![Expected::Version(3), Expected::Version(9)], "Any takes the version the tip has");
    let stale = expectations(&parts, &conditions, &[tip(3, false), None, tip(8, false), None]).unwrap_err();
    assert!(matches!(stale, EntityError::Refused { ref stream, current: Some(8), deleted: false } if stream == "c"));
    let exists = expectations(&parts, &conditions, &[tip(3, false), None, tip(7, false), tip(0, false)]);
    assert!(matches!(exists, Err(EntityError::Refused { ref stream, current: Some(0), .. }) if stream == "d"));
    let deleted = expectations(&parts, &[], &[tip(3, true), None]).unwrap_err();
    assert!(matches!(deleted, EntityError::Refused { deleted: true, .. }));
    // To a condition, a deleted stream exists at its version: refused as a 409, not a 410.
    let deleted_c = [tip(3, false), None, tip(7, true), None];
    assert!(expectations(&parts, &conditions, &deleted_c).is_ok());
    let absent = [("c".to_owned(), Condition::NoStream)];
    let refused = expectations(&parts, &absent, &[tip(3, false), None, tip(7, true)]).unwrap_err();
    assert!(matches!(refused, EntityError::Refused { ref stream, deleted: false, .. } if stream == "c"));
    let missing = expectations(&parts, &[], &[None, None]).unwrap_err();
    assert!(matches!(missing, EntityError::Refused { ref stream, current: None, .. } if stream == "a"));
}

#[test]
fn requests_are_checked_before_anything_is_sent() {
    let one = |stream: &str| StreamAppend {
        stream: stream.into(),
        expected: Expected::Any,
        events: vec![NewEvent::new("T", json!({}))],
    };
    assert!(check_across(&[one("a"), one("b")], &[("c".into(), Condition::Exists)]).is_ok());
    assert!(check_across(&[], &[("c".into(), Condition::Exists)]).is_err(), "nothing written");
    assert!(check_across(&[one("a"), one("a")], &[]).is_err(), "a stream twice");
    assert!(check_across(&[one("a")], &[("a".into(), Condition::Exists)]).is_err(), "written and checked");
    let many: Vec<StreamAppend> = (0..=MAX_STREAMS_ACROSS).map(|i| one(&format!("s{i}"))).collect();
    assert!(check_across(&many, &[]).is_err());
    assert!(check_across(&[one("a b")], &[]).is_err(), "a bad name");
    let empty = StreamAppend { events: vec![], ..one("a") };
    assert!(check_across(&[empty], &[]).is_err());
}

#[test]
fn the_body_names_each_stream_s_expectation_and_condition() {
    let body = json!({
        "appends": [
            {"stream": "a", "expected_version": 3, "events": [{"type": "T", "data": {}}]},
            {"stream": "b", "expected_version": "no_stream", "events": [{"type": "T", "data": 1}]},
            {"stream": "e", "events": [{"type": "T", "data": 1}]},
        ],
        "conditions": [{"stream": "c", "expected_version": 7}, {"stream": "d", "expected_version": "exists"}],
    });
    let (appends, conditions) = parse_across(body.to_string().as_bytes()).unwrap();
    let expected: Vec<Expected> = appends.iter().map(|a| a.expected).collect();
    assert_eq!(expected, vec![Expected::Version(3), Expected::NoStream, Expected::Any]);
    assert_eq!(conditions, vec![("c".to_owned(), Condition::Version(7)), ("d".to_owned(), Condition::Exists)]);
    for bad in [
        json!({"appends": [{"stream": "a", "expected_version": "exists", "events": []}]}),
        json!({"appends": [], "conditions": [{"stream": "c"}]}),
        json!({"appends": [{"stream": "a", "events": [{"type": "T", "data": 1, "extra": 1}]}]}),
        json!({"append": []}),
        json!({"appends": [], "conditions": [{"stream": "c", "expected_version": -1}]}),
    ] {
        assert!(parse_across(bad.to_string().as_bytes()).is_err(), "{bad}");
    }
}

#[test]
fn the_request_key_depends_on_streams_and_ids_in_order() {
    let (a, b) = (part("a", Expected::Any), part("b", Expected::Any));
    let key = across_key(&[a, b]);
    let (a, b) = (part("a", Expected::Any), part("b", Expected::Any));
    assert_ne!(key, across_key(&[a, b]), "random ids: another request");
    let a = part("a", Expected::Any);
    let mut moved = Part { stream: "b".into(), expected: Expected::Any, events: a.events.clone() };
    assert_ne!(across_key(std::slice::from_ref(&a)), across_key(std::slice::from_mut(&mut moved)));
}
