//! Idle probes (`demo --idle-probes N`, the bench): single pixel hits, each
//! sent after the stack has had no traffic for a while, timed from the
//! event's arrival to its record's arrival on the demo subscription's target
//! stream. What bounds that time is not the steady pipeline but the wake-up:
//! the pump's next poll, the scan woken and its pass, `WATERMARK_LAG_MS` (a
//! shard with nothing new holds the watermark that far behind a pass), the
//! subscriptions' tick started by the scan and a runner's start.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use event_store::aggregation::deaggregate;
use event_store::envelope::Envelope;
use event_store::log::PlayedEvent;

use crate::source::{shard_ids, ShardReader};
use crate::stack::Stack;

/// How long after the last delivery idle requests start to be counted (longer than
/// `SUBSCRIPTION_FOLLOW_SECONDS` and the awake scan's linger).
const SETTLE: Duration = Duration::from_secs(15);

/// How long a probe may take to be delivered before the demo gives up on it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// What the demo asks of the probes.
#[derive(Debug, Clone, Copy)]
pub struct Probes {
    pub count: usize,
    /// Time without traffic before each probe.
    pub idle: Duration,
}

/// What the probes measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Each probe's arrival to delivery (ms), in the order sent.
    pub latencies_ms: Vec<i64>,
    /// The stack's own AWS requests while it idled (the schedules, the scan's and the
    /// subscriptions' minute), per operation, per minute.
    pub idle_requests_per_minute: BTreeMap<String, f64>,
}

/// Sends `probes.count` hits of run `run_id`, each after `probes.idle` without traffic
/// (the last delivery before it), timing each to its delivery, and counts the requests
/// the stack makes while it idles.
pub async fn run(stack: &Stack, run_id: &str, probes: Probes) -> Result<Measured> {
    let stream = stack.settings.names.subscription_stream.clone();
    // Readers at the stream's end: the probes' records are the next ones.
    let mut readers = Vec::new();
    for shard in shard_ids(&stack.kinesis, &stream).await? {
        let mut reader = ShardReader::new(stack.kinesis.clone(), &stream, &shard);
        while !reader.next().await?.is_empty() {}
        readers.push(reader);
    }
    let mut out = Measured::default();
    let mut idled = Duration::ZERO;
    for i in 0..probes.count {
        println!("   probe {}/{}: {} s without traffic first", i + 1, probes.count, probes.idle.as_secs());
        // The runners' follow and the awake scan's linger end first: then only the schedules run.
        let settle = SETTLE.min(probes.idle);
        tokio::time::sleep(settle).await;
        let before = stack.counter.snapshot();
        tokio::time::sleep(probes.idle - settle).await;
        for (operation, after) in stack.counter.snapshot() {
            let made = after.saturating_sub(before.get(&operation).copied().unwrap_or(0));
            *out.idle_requests_per_minute.entry(operation).or_default() += made as f64;
        }
        idled += probes.idle - settle;
        let probe = format!("{run_id}-probe-{i}");
        let (accepted, _) = crate::demo::send_hits(stack.settings.port, &probe, 1, (1, None)).await;
        if accepted != 1 {
            bail!("probe {i} was not accepted");
        }
        let sent = Instant::now();
        let latency = loop {
            if let Some(latency) = delivered(&mut readers, &probe).await? {
                break latency;
            }
            if sent.elapsed() > PROBE_TIMEOUT {
                bail!("probe {i} not delivered within {} s", PROBE_TIMEOUT.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        println!("   probe {}/{}: delivered {latency} ms after its arrival", i + 1, probes.count);
        out.latencies_ms.push(latency);
    }
    let minutes = idled.as_secs_f64() / 60.0;
    out.idle_requests_per_minute.retain(|_, made| *made > 0.0);
    out.idle_requests_per_minute.values_mut().for_each(|made| *made /= minutes.max(1e-9));
    Ok(out)
}

/// The probe's arrival-to-delivery time, if its record is among those the readers read now.
async fn delivered(readers: &mut [ShardReader], probe: &str) -> Result<Option<i64>> {
    let mut found = None;
    for reader in readers {
        for record in reader.next().await? {
            let arrived = record.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok());
            let key = record.partition_key().unwrap_or_default();
            for (_, data) in deaggregate(key, record.data().as_ref())? {
                let Ok(played) = serde_json::from_slice::<PlayedEvent>(&data) else { continue };
                let Some(envelope) = played.data.and_then(|d| serde_json::from_value::<Envelope>(d).ok()) else {
                    continue;
                };
                if crate::demo::run_of(&envelope) == Some(probe) {
                    found = arrived.map(|at| at - played.event_ms);
                }
            }
        }
    }
    Ok(found)
}
