//! When the demo finds events missing from the event table: which ones
//! (pixel hit `n`, entity `stream/version`), and where each one still is
//! (the event stream, the buffer table, an event-table item outside the
//! readers' slots), so a loss under faults says at which stage it happened.

use std::collections::{BTreeMap, HashMap};

use anyhow::Result;
use event_store::buffer_item::BufferItem;
use event_store::chunk::decode_item;
use event_store::envelope::Envelope;

use crate::source::{shard_ids, ShardReader};
use crate::stack::Stack;

/// What names an event of this run: `hit <n>` or the entity event's id.
fn label(envelope: &Envelope, run_id: &str) -> Option<String> {
    if let Some(n) = envelope.query.get("n").and_then(|v| v.first()) {
        return (envelope.query.get("run").and_then(|v| v.first()).map(String::as_str) == Some(run_id))
            .then(|| format!("hit {n}"));
    }
    let run = envelope.body.as_ref()?.get("metadata")?.get("run")?.as_str()?;
    (run == run_id).then(|| envelope.id.clone())
}

fn label_of_bytes(data: &[u8], run_id: &str) -> Option<String> {
    label(&serde_json::from_slice::<Envelope>(data).ok()?, run_id)
}

/// Every place each event of the run is found: label → places.
type Places = HashMap<String, Vec<String>>;

async fn in_event_table(stack: &Stack, run_id: &str, places: &mut Places) -> Result<()> {
    for item in stack.scan_table(&stack.settings.names.event_table).await? {
        let slot = item.get(event_store::event_item::HASH_KEY).and_then(|v| v.as_n().ok()).cloned().unwrap_or_default();
        let key = item.get(event_store::event_item::RANGE_KEY).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
        for event in decode_item(0, &item).events.unwrap_or_default() {
            let Some(label) = event.bytes().ok().and_then(|b| label_of_bytes(&b, run_id)) else { continue };
            places.entry(label).or_default().push(format!("event table slot {slot} item {key} as {}", event.sort_key));
        }
    }
    Ok(())
}

async fn in_buffer_table(stack: &Stack, run_id: &str, places: &mut Places) -> Result<()> {
    for item in stack.scan_table(&stack.settings.names.buffer_table).await? {
        let Ok(buffered) = BufferItem::from_item(item) else { continue };
        for event in buffered.events().unwrap_or_default() {
            let Some(label) = label_of_bytes(&event.data, run_id) else { continue };
            places.entry(label).or_default().push(format!("buffer item {} as {}", buffered.id, event.event_id));
        }
    }
    Ok(())
}

async fn on_event_stream(stack: &Stack, run_id: &str, places: &mut Places) -> Result<()> {
    let stream = &stack.settings.names.event_stream;
    for shard in shard_ids(&stack.kinesis, stream).await? {
        let mut reader = ShardReader::new(stack.kinesis.clone(), stream, &shard);
        loop {
            let records = reader.next().await?;
            if records.is_empty() {
                break;
            }
            for record in records {
                let Some(label) = label_of_bytes(record.data().as_ref(), run_id) else { continue };
                let at = record.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or_default();
                places
                    .entry(label)
                    .or_default()
                    .push(format!("event stream {shard}:{} arrived {at}", record.sequence_number()));
            }
        }
    }
    Ok(())
}

/// One line per event of the run that no event-table slot holds, with every place it was found.
pub async fn explain(stack: &Stack, run_id: &str, hits: usize, streams: &BTreeMap<String, u64>) -> Result<Vec<String>> {
    let mut places = Places::new();
    in_event_table(stack, run_id, &mut places).await?;
    let stored = |places: &Places, label: &str| {
        places.get(label).is_some_and(|p| p.iter().any(|p| p.starts_with("event table slot ") && !p.contains("slot -")))
    };
    let expected: Vec<String> = (0..hits)
        .map(|n| format!("hit {n}"))
        .chain(streams.iter().flat_map(|(stream, count)| (0..*count).map(move |v| format!("{stream}/{v}"))))
        .collect();
    let missing: Vec<&String> = expected.iter().filter(|label| !stored(&places, label)).collect();
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    in_buffer_table(stack, run_id, &mut places).await?;
    on_event_stream(stack, run_id, &mut places).await?;
    Ok(missing
        .into_iter()
        .map(|label| match places.get(label.as_str()) {
            Some(found) => format!("missing {label}: found in {}", found.join("; ")),
            None => format!("missing {label}: found nowhere (not on the event stream: never put, or a failed hit)"),
        })
        .collect())
}
