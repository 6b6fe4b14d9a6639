//! What the relay reads and what it writes, without I/O: the batch item a
//! table-stream record inserts, the log record of an entity event, and the
//! versions a delivery holds from a stream's position on.

use aws_lambda_events::event::dynamodb::EventRecord;
use serde_json::json;

use crate::entity::model::{batch_version, Batch, RecordedEvent, Tip, RANGE_KEY, TIP};
use crate::envelope::{entity_event_id, entity_key, Envelope, Headers, ENTITY_ID};
use crate::error::{Error, Result};
use crate::kinesis::OutgoingRecord;

/// The batch item a stream record inserts, if it is one (tips, snapshots,
/// bookkeeping and removals are not events).
pub fn inserted_batch(record: &EventRecord) -> std::result::Result<Option<Batch>, String> {
    if record.event_name != "INSERT" {
        return Ok(None);
    }
    let image = &record.change.new_image;
    let is_batch = match image.get(RANGE_KEY) {
        Some(serde_dynamo::AttributeValue::S(key)) => batch_version(key).is_some(),
        _ => false,
    };
    if !is_batch {
        return Ok(None);
    }
    serde_dynamo::from_item(image.clone()).map(Some).map_err(|e| e.to_string())
}

/// The tip a stream record changes, if it is one with a retention (an append
/// to, a metadata change of, or a cleanup of such a stream): what the relay
/// cleans up after.
pub fn retained_tip(record: &EventRecord) -> std::result::Result<Option<Tip>, String> {
    let image = &record.change.new_image;
    let is_tip = matches!(image.get(RANGE_KEY), Some(serde_dynamo::AttributeValue::S(key)) if key == TIP);
    if record.event_name == "REMOVE" || !is_tip || !image.contains_key("retention") {
        return Ok(None);
    }
    serde_dynamo::from_item(image.clone()).map(Some).map_err(|e| e.to_string())
}

/// The log record of one entity event: an envelope whose id is `<stream>/<version>`.
pub fn log_record(event: &RecordedEvent) -> Result<OutgoingRecord> {
    let mut body = serde_json::to_value(event).map_err(|e| Error::encode("entity event", e))?;
    body[ENTITY_ID] = json!(event.stream);
    // The trace context is the envelope's (`trace`), as for every event in the log: not twice.
    if let Some(fields) = body.as_object_mut() {
        fields.remove("trace");
    }
    let envelope = Envelope {
        id: entity_event_id(&event.stream, event.version),
        event_id: None,
        received_at: event.time.clone(),
        method: "POST".into(),
        path: format!("/streams/{}", event.stream),
        query: Default::default(),
        headers: Headers::default(),
        source_ip: None,
        body: Some(body),
        body_ref: None,
        subject: None,
        sealed: None,
        sealed_ref: None,
        trace: event.trace.clone(),
    };
    let data = serde_json::to_vec(&envelope).map_err(|e| Error::encode("envelope", e))?;
    Ok(OutgoingRecord { partition_key: entity_key(&event.stream), data })
}

/// The events to put for one stream from its position on, when the
/// delivered batches hold them without a gap; `None` when some are missing
/// (in another stream shard, or not delivered again after a hold).
pub fn events_after(next: u64, batches: &[Batch]) -> Option<Vec<RecordedEvent>> {
    let mut sorted: Vec<&Batch> = batches.iter().filter(|b| b.last() >= next).collect();
    sorted.sort_by_key(|b| b.first);
    let mut events: Vec<RecordedEvent> = Vec::new();
    for batch in sorted {
        for event in batch.read().filter(|e| e.version >= next) {
            let expected = events.last().map_or(next, |e| e.version + 1);
            if event.version < expected {
                continue; // the same batch delivered twice
            }
            if event.version > expected {
                return None;
            }
            events.push(event);
        }
    }
    Some(events)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::entity::model::{batch_key, StoredEventItem, TIP};

    fn record(name: &str, image: serde_json::Value) -> EventRecord {
        serde_json::from_value(json!({
            "awsRegion": "us-east-1",
            "eventID": "1",
            "eventName": name,
            "dynamodb": {"NewImage": image, "SequenceNumber": "100", "SizeBytes": 10},
        }))
        .unwrap()
    }

    fn batch_image(stream: &str, first: u64, types: &[&str]) -> Value {
        let events: Vec<StoredEventItem> = types
            .iter()
            .enumerate()
            .map(|(i, t)| StoredEventItem {
                id: format!("id-{i}"),
                event_type: (*t).into(),
                data: "{\"n\":1}".into(),
                metadata: None,
                data_ref: None,
                subject: None,
                sealed: None,
                schema_version: None,
                trace: None,
            })
            .collect();
        let batch = Batch { stream: stream.into(), item: batch_key(first), first, at: 1_700_000_000_000, events };
        let item: serde_dynamo::Item = serde_dynamo::to_item(&batch).unwrap();
        serde_json::to_value(item).unwrap()
    }

    #[test]
    fn one_record_per_event_keyed_by_stream_in_version_order() {
        let batch = inserted_batch(&record("INSERT", batch_image("todo-1", 4, &["A", "B"]))).unwrap().unwrap();
        let records: Vec<OutgoingRecord> = batch.read().map(|e| log_record(&e).unwrap()).collect();
        assert_eq!(records.len(), 2);
        let envelopes: Vec<Envelope> = records.iter().map(|r| serde_json::from_slice(&r.data).unwrap()).collect();
        assert!(records.iter().all(|r| r.partition_key == "streams/todo-1"), "the entity namespace");
        assert_eq!(envelopes[0].id, "todo-1/4");
        assert_eq!(envelopes[1].id, "todo-1/5");
        let body = envelopes[1].body.as_ref().unwrap();
        assert_eq!(
            (body["version"].as_u64(), body["type"].as_str(), body["EntityId"].as_str()),
            (Some(5), Some("B"), Some("todo-1"))
        );
        assert_eq!(body["data"], json!({"n": 1}));
        // The pump drops copies by this version.
        assert_eq!(crate::envelope::entity_event(&records[1].data), Some(("todo-1".to_owned(), 5)));
    }

    #[test]
    fn tips_snapshots_positions_and_updates_are_not_events() {
        let tip = json!({"stream": {"S": "s"}, "item": {"S": TIP}, "version": {"N": "3"}, "updated_at": {"N": "1"}});
        assert!(inserted_batch(&record("INSERT", tip.clone())).unwrap().is_none());
        assert!(inserted_batch(&record("MODIFY", tip)).unwrap().is_none());
        assert!(inserted_batch(&record("REMOVE", batch_image("s", 0, &["A"]))).unwrap().is_none());
        let position = json!({"stream": {"S": "s"}, "item": {"S": "_relay"}, "relayed": {"N": "3"}});
        assert!(inserted_batch(&record("INSERT", position)).unwrap().is_none());
        let broken = json!({"stream": {"S": "s"}, "item": {"S": batch_key(0)}});
        assert!(inserted_batch(&record("INSERT", broken)).is_err());
    }

    #[test]
    fn a_tip_with_a_retention_is_one_to_clean_up_after() {
        let tip = |retention: Option<&str>| {
            let mut image =
                json!({"stream": {"S": "s"}, "item": {"S": TIP}, "version": {"N": "24"}, "updated_at": {"N": "1"}});
            if let Some(text) = retention {
                image["retention"] = json!({"S": text});
            }
            image
        };
        let kept = retained_tip(&record("MODIFY", tip(Some(r#"{"max_count":10}"#)))).unwrap().unwrap();
        assert_eq!((kept.stream.as_str(), kept.cut(0).from), ("s", 15));
        assert!(retained_tip(&record("MODIFY", tip(None))).unwrap().is_none(), "no retention: nothing to do");
        assert!(retained_tip(&record("INSERT", batch_image("s", 0, &["A"]))).unwrap().is_none());
    }

    fn batch(first: u64, events: usize) -> Batch {
        let image = batch_image("s", first, &vec!["T"; events]);
        inserted_batch(&record("INSERT", image)).unwrap().unwrap()
    }

    fn versions(events: Option<Vec<RecordedEvent>>) -> Option<Vec<u64>> {
        events.map(|events| events.iter().map(|e| e.version).collect())
    }

    #[test]
    fn a_delivery_is_put_from_the_position_in_version_order_whatever_order_its_records_came_in() {
        // Appends of one stream from two table-stream shards, the later one first.
        assert_eq!(versions(events_after(5, &[batch(7, 2), batch(5, 2)])), Some(vec![5, 6, 7, 8]));
        // Already relayed up to 5: only what follows, even from inside a batch.
        assert_eq!(versions(events_after(6, &[batch(5, 2), batch(7, 1)])), Some(vec![6, 7]));
        // A batch delivered twice is put once.
        assert_eq!(versions(events_after(0, &[batch(0, 1), batch(0, 1), batch(1, 1)])), Some(vec![0, 1]));
        // Everything at or below the position: nothing to put.
        assert_eq!(versions(events_after(9, &[batch(5, 2)])), Some(vec![]));
        // A version missing before the delivered ones: read them from the table instead.
        assert_eq!(versions(events_after(5, &[batch(7, 1)])), None);
        assert_eq!(versions(events_after(0, &[batch(0, 1), batch(3, 1)])), None);
    }
}
