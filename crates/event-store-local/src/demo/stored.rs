//! What reached the event table: this run's items read back, and the wait until all are there.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use event_store::envelope::Envelope;
use event_store::event_item::EventItem;

use super::hits::run_of;
use super::DRAIN_TIMEOUT;
use crate::stack::Stack;

/// This run's event items by envelope id: (partition key, sort key), how
/// many items repeated an envelope id already seen (duplicates in the table),
/// and each item's time from pixel hit to table (ms).
async fn stored_items(stack: &Stack, run_id: &str) -> Result<(HashMap<String, (String, String)>, usize, Vec<i64>)> {
    let mut items: HashMap<String, (String, String)> = HashMap::new();
    let mut duplicates = 0;
    let mut latencies = Vec::new();
    let stored = stack.scan_table(&stack.settings.names.event_table).await?;
    // Events are stored in chunks (one item, many events): each item's events, with its `moved_at`.
    let events = stored
        .iter()
        .filter(|i| i.get("slot").and_then(|v| v.as_n().ok()).is_some_and(|n| !n.starts_with('-')))
        .flat_map(|item| {
            let moved = item.get("moved_at").and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
            let events: Vec<EventItem> = event_store::chunk::decode_item(0, item).events.unwrap_or_default();
            events.into_iter().map(move |mut e| {
                e.moved_at = e.moved_at.or(moved);
                e
            })
        });
    // Opened as every reader opens them (pixel hits have a subject: their parts are sealed).
    let tiers = event_store::log::tiers::Tiers::new(Some(stack.archive.clone())).with_keys(Some(stack.keys.clone()));
    for event in events {
        let bytes = tiers.bytes(&event).await?.bytes;
        let Ok(envelope) = serde_json::from_slice::<Envelope>(&bytes) else {
            continue;
        };
        if run_of(&envelope) != Some(run_id) {
            continue;
        }
        // Pixel hits only: the entity events come through the relay, before the first hit.
        let hit = event_store::envelope::entity_stream(&event.partition_key).is_none();
        if let (true, Some(moved), Ok(at)) = (hit, event.moved_at, event_store::time::parse_time(&envelope.received_at))
        {
            latencies.push(moved - at);
        }
        // A copy (load's ambiguous put, sent again): readers deliver the first in log order.
        match items.entry(envelope.id) {
            std::collections::hash_map::Entry::Occupied(mut first) => {
                duplicates += 1;
                if event.sort_key < first.get().1 {
                    first.insert((event.partition_key, event.sort_key));
                }
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert((event.partition_key, event.sort_key));
            }
        }
    }
    Ok((items, duplicates, latencies))
}

pub(super) async fn wait_until_stored(
    stack: &Stack,
    run_id: &str,
    expected: usize,
) -> Result<(HashMap<String, (String, String)>, usize, Vec<i64>)> {
    let mut last_progress = Instant::now();
    let mut seen = 0;
    // The scan's own count first (in memory): scanning the whole table every second meanwhile
    // would take the emulator's time from the pipeline whose latency the demo measures.
    let moved = || stack.stats.moved.load(std::sync::atomic::Ordering::Relaxed) as usize;
    let mut counted = moved();
    while counted < expected && stack.stats.last_moved().is_none_or(|t| t.elapsed() < Duration::from_secs(10)) {
        if last_progress.elapsed() > DRAIN_TIMEOUT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if moved() > counted {
            (counted, last_progress) = (moved(), Instant::now());
        }
    }
    loop {
        let (items, duplicates, latencies) = stored_items(stack, run_id).await?;
        if items.len() >= expected || last_progress.elapsed() > DRAIN_TIMEOUT {
            return Ok((items, duplicates, latencies));
        }
        if items.len() > seen {
            seen = items.len();
            last_progress = Instant::now();
        }
        eprintln!("   {} | stored {}/{expected}", stack.stats.line(), items.len());
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}
