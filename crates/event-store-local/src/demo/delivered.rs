//! What came back on the streams: the subscription's counted deliveries, its target and the playback stream read back.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Result;
use event_store::aggregation::deaggregate;
use event_store::envelope::Envelope;
use event_store::log::PlayedEvent;
use event_store::subscription::Subscriptions;

use super::hits::run_of;
use super::DRAIN_TIMEOUT;
use crate::source::{shard_ids, ShardReader};
use crate::stack::Stack;

/// Waits until the subscription's partitions together count `expected`
/// deliveries (their checkpoints' counts: a few reads, not the target stream), or nothing moved for a while.
pub(super) async fn wait_until_counted(subscriptions: &Subscriptions, name: &str, expected: usize) -> Result<()> {
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let (_, statuses) = subscriptions.statuses().await?;
        let delivered: u64 = statuses
            .iter()
            .filter(|s| s.subscription.name == name)
            .flat_map(|s| &s.partitions)
            .map(|p| p.delivered)
            .sum();
        if delivered as usize >= expected || since.elapsed() > Duration::from_secs(30) {
            return Ok(());
        }
        if delivered > last {
            (last, since) = (delivered, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Reads the subscription's target stream until it holds every stored event of this run (or
/// nothing new came for a while): envelope ids per partition key, in stream order.
pub(super) async fn wait_until_delivered(
    stack: &Stack,
    run_id: &str,
    stored: &HashMap<String, (String, String)>,
) -> Result<(HashMap<String, Vec<String>>, Vec<Timed>)> {
    let started = Instant::now();
    loop {
        let (delivered, latencies) = read_played(stack, &stack.settings.names.subscription_stream, run_id).await?;
        let ids: HashSet<&String> = delivered.values().flatten().collect();
        if stored.keys().all(|id| ids.contains(id)) || started.elapsed() > DRAIN_TIMEOUT {
            return Ok((delivered, latencies));
        }
        eprintln!("   {} | delivered {}/{}", stack.stats.line(), ids.len(), stored.len());
        tokio::time::sleep(Duration::from_millis(1000)).await;
    }
}

/// An event's arrival and its record's arrival on a stream (ms).
pub(super) type Timed = (i64, i64);

/// This run's records on `stream` (played back, or delivered by a
/// subscription: both carry the played-record fields): envelope ids per
/// partition key, in stream order, and for each pixel hit the event's
/// arrival and its record's arrival on `stream` (ms). Entity events are
/// left out of the timings: the demo appends them before the first hit,
/// in bursts whose relay and retries are the entity path's, not the log's.
pub(super) async fn read_played(
    stack: &Stack,
    stream: &str,
    run_id: &str,
) -> Result<(HashMap<String, Vec<String>>, Vec<Timed>)> {
    let mut played: HashMap<String, Vec<String>> = HashMap::new();
    let mut latencies = Vec::new();
    for shard in shard_ids(&stack.kinesis, stream).await? {
        let mut reader = ShardReader::new(stack.kinesis.clone(), stream, &shard);
        let mut errors = 0;
        loop {
            let records = match reader.next().await {
                Ok(records) => records,
                Err(err) if errors < 10 => {
                    errors += 1;
                    tracing::warn!(error = format!("{err:#}"), "reading the playback stream; retrying");
                    continue;
                }
                Err(err) => return Err(err),
            };
            if records.is_empty() {
                break;
            }
            for record in records {
                // An aggregated record (the default) carries many played events of one key.
                let key = record.partition_key().unwrap_or_default();
                let arrived = record.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok());
                for (key, data) in deaggregate(key, record.data().as_ref())? {
                    // A played record wraps the event (the envelope) with its time and sequence number.
                    let Some((event_ms, envelope)) =
                        serde_json::from_slice::<PlayedEvent>(&data).ok().and_then(|played| {
                            Some((played.event_ms, serde_json::from_value::<Envelope>(played.data?).ok()?))
                        })
                    else {
                        continue;
                    };
                    if run_of(&envelope) == Some(run_id) {
                        if event_store::envelope::entity_stream(&key).is_none() {
                            latencies.extend(arrived.map(|at| (event_ms, at)));
                        }
                        played.entry(key).or_default().push(envelope.id);
                    }
                }
            }
        }
    }
    Ok((played, latencies))
}
