//! `make demo`: the main job end to end on one machine. Starts the stack,
//! sends pixel hits over HTTP, waits until pump and scan have moved them all
//! into the event table, plays the window back, reads the playback stream
//! and checks that every event came back, in time order per partition key.
//! A subscription created before the first hit (4 partitions, a Kinesis
//! target) must have delivered every event too, in order per key. Entity
//! streams appended over `/streams` first (the Todo flow, the Counter, a few
//! accounts) must come back in both, each stream in version order.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use event_store::aggregation::deaggregate;
use event_store::envelope::Envelope;
use event_store::event_item::EventItem;
use event_store::log::PlayedEvent;
use event_store::playback::PlaybackRequest;
use event_store::subscription::{Manage, NewSubscription, Subscriptions, Target};
use event_store::time::{format_ms, now_ms};
use event_store_emulator::runs::{deadline_in, run_playback};
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::watch;

use crate::probes::Probes;
use crate::settings::Settings;
use crate::source::{shard_ids, ShardReader};
use crate::stack::Stack;

/// Account streams the demo appends to at once, and appends to each.
const ENTITY_STREAMS: usize = 4;
const ENTITY_APPENDS: u64 = 8;

/// How long to wait for the pipeline to store everything before calling the rest lost.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What the demo found; `ok()` decides the exit code.
#[derive(Debug, Default)]
pub struct Report {
    pub sent: usize,
    pub failed_requests: usize,
    pub stored: usize,
    /// Event-table items repeating an event already stored: load's ambiguous
    /// puts retried by the SDK (under faults only); readers drop them.
    pub stored_duplicates: usize,
    pub played_back: usize,
    pub duplicates: usize,
    /// Envelope ids delivered more than once, in the order the copies were read.
    pub duplicate_ids: Vec<String>,
    pub lost: usize,
    pub out_of_order: usize,
    /// Entity events appended (through `/streams`), and what went wrong with them: a step of the
    /// Todo flow or Counter answered against the contract, a stream not played in version order.
    pub entity_events: usize,
    pub entity_problems: Vec<String>,
    /// The demo subscription: events delivered, lost, duplicated, out of order.
    pub subscribed: SubscriptionReport,
    pub wall: Duration,
    /// Pixel hit (load's `received_at`) to event-table item (the scan's `moved_at`), ms.
    pub latency_p50_ms: Option<i64>,
    pub latency_p99_ms: Option<i64>,
    pub scan_interval: Duration,
    /// The first half of the window, archived to S3 before the playback, and the chain verified.
    pub archive: ArchiveReport,
    pub lines: Vec<String>,
}

/// What the demo archived, and what verifying the chain found.
#[derive(Debug, Default)]
pub struct ArchiveReport {
    pub objects: u64,
    pub events: u64,
    pub verified_entries: u64,
    pub first_break: Option<String>,
}

/// Records `(seen at, watermark)` each time the watermark moves, until aborted.
async fn watch_watermark(dynamo: aws_sdk_dynamodb::Client, table: String, seen: Arc<Mutex<Vec<(i64, i64)>>>) {
    let mut last = None;
    loop {
        if let Ok(watermark) = event_store::bookkeeping::watermark::read(&dynamo, &table).await {
            if let Some(time) = watermark.time.filter(|t| Some(*t) != last) {
                last = Some(time);
                if let Ok(mut seen) = seen.lock() {
                    seen.push((now_ms(), time));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Splits each delivery's latency where the watermark first passed the
/// event's arrival: (arrival to sealed, sealed to delivered), ms each. An
/// event sealed before the watermark was first seen counts from then.
pub fn breakdown(delivered: &[(i64, i64)], seals: &[(i64, i64)]) -> (Vec<i64>, Vec<i64>) {
    let mut sealing = Vec::new();
    let mut delivering = Vec::new();
    for &(arrival, at) in delivered {
        let Some(&(sealed_at, _)) = seals.iter().find(|(_, watermark)| *watermark > arrival) else { continue };
        let sealed_at = sealed_at.min(at);
        sealing.push(sealed_at - arrival);
        delivering.push(at - sealed_at);
    }
    (sealing, delivering)
}

/// The `q` quantile (0..=1) of `values`, nearest rank.
pub fn quantile(values: &[i64], q: f64) -> Option<i64> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// What a subscription delivered, checked like the playback.
#[derive(Debug, Default)]
pub struct SubscriptionReport {
    /// Event arrival to its record's arrival on the target stream, ms.
    pub latency_p50_ms: Option<i64>,
    pub latency_p99_ms: Option<i64>,
    /// Where that time goes: event arrival to the watermark passing it
    /// (pump, scan, `WATERMARK_LAG_MS`, the scan interval), then to its
    /// delivery (the runner's poll, reading, the put), ms.
    pub sealing_p50_ms: Option<i64>,
    pub sealing_p99_ms: Option<i64>,
    pub delivering_p50_ms: Option<i64>,
    pub delivering_p99_ms: Option<i64>,
    /// Idle probes' arrival to delivery, ms, in the order sent (`--idle-probes`).
    pub idle_latencies_ms: Vec<i64>,
    /// The stack's AWS requests per minute while it idled before the probes, by operation.
    pub idle_requests_per_minute: std::collections::BTreeMap<String, f64>,
    pub delivered: usize,
    pub duplicates: usize,
    pub lost: usize,
    pub out_of_order: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.out_of_order == 0
            && self.failed_requests == 0
            && self.sent > 0
            && self.subscribed.lost == 0
            && self.subscribed.out_of_order == 0
            && self.entity_problems.is_empty()
            && self.archive.events > 0
            && self.archive.first_break.is_none()
    }
}

/// `rate`: pixel hits a second at most (none: as fast as `concurrency` allows).
pub async fn run(
    settings: Settings,
    events: usize,
    concurrency: usize,
    rate: Option<f64>,
    probes: Probes,
) -> Result<Report> {
    let started = Instant::now();
    println!("== starting the local stack (emulator on 127.0.0.1:{})", settings.emulator_port);
    let stack = Stack::start(settings).await?;
    let (stop, shutdown) = watch::channel(false);
    let mut services = stack.run_services(shutdown).await?;
    let port = stack.settings.port;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let window_start = now_ms() - 1;
    let subscription = format!("demo-{}", &run_id[..8]);
    println!(
        "== creating subscription {subscription}: from now, 4 partitions, to the Kinesis stream {}",
        stack.settings.names.subscription_stream
    );
    let subscriptions = crate::subscriptions::local_with(&stack)?;
    // The watermark as it moves (read every 100 ms): when each event was sealed, for the latency's breakdown.
    let sealed: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
    let watching =
        tokio::spawn(watch_watermark(stack.dynamo.clone(), stack.settings.names.event_table.clone(), sealed.clone()));
    subscriptions
        .manage(Manage::Create(NewSubscription {
            name: subscription.clone(),
            start: Some(format_ms(window_start)),
            target: Some(Target::Kinesis(stack.settings.names.subscription_stream.clone())),
            partitions: Some(4),
            ..Default::default()
        }))
        .await?;

    println!(
        "== entity streams over http://127.0.0.1:{port}/streams: the Todo flow, the Counter, {ENTITY_STREAMS} account streams at once, {} writers on one stream",
        crate::entities::CONTENDED_WRITERS
    );
    let entities_started = Instant::now();
    let entity_run = crate::entities::run(port, &run_id, ENTITY_STREAMS, ENTITY_APPENDS).await?;
    let entity_time = entities_started.elapsed();

    println!("== sending {events} pixel hits to http://127.0.0.1:{port}/track.gif (concurrency {concurrency})");
    let load_started = Instant::now();
    let (hits, failed_requests) = send_hits(port, &run_id, events, (concurrency, rate)).await;
    let load_time = load_started.elapsed();
    let accepted = hits + entity_run.events();

    println!("== waiting until relay, pump and scan have moved every event into the event table");
    let (stored, stored_duplicates, latencies) = wait_until_stored(&stack, &run_id, accepted).await?;
    let stored_time = load_started.elapsed();
    if stored.len() < accepted {
        println!("== {} events not in the event table; where they are:", accepted - stored.len());
        match crate::lost::explain(&stack, &run_id, events, &entity_run.streams).await {
            Ok(lines) => lines.iter().for_each(|line| println!("   {line}")),
            Err(err) => println!("   (could not look: {err:#})"),
        }
    }

    // The subscription delivers the last events before the playback starts, so that the playback's
    // load on the emulator is not measured as the subscription's latency.
    wait_until_counted(&subscriptions, &subscription, stored.len()).await?;

    println!(
        "== archiving the window's first half to s3://{}/events/ (the hot retention shortened for the demo)",
        stack.archive.name
    );
    let archived = archive_first_half(&stack, &stored).await?;

    let window_end = now_ms() + 1;
    println!(
        "== playing back [{}, {}) onto the playback stream, once the watermark has passed it",
        format_ms(window_start),
        format_ms(window_end)
    );
    let request = PlaybackRequest {
        start: Some(format_ms(window_start)),
        end: Some(format_ms(window_end)),
        wait_seconds: Some(120),
        restart: true,
        ..Default::default()
    };
    let playback_started = Instant::now();
    let config = event_store::config::PlaybackConfig::from_env()?;
    let (dynamo, kinesis) = (stack.dynamo.clone(), stack.kinesis.clone());
    let (archive, keys) = (Some(stack.archive.clone()), Some(stack.keys.clone()));
    let make = |invoker| {
        event_store::playback::Playback::new(dynamo, kinesis, config, invoker).with_archive(archive).with_keys(keys)
    };
    let runs = run_playback(make, serde_json::to_value(&request)?, deadline_in(crate::stack::PLAYBACK_TIMEOUT)).await;
    let runs = runs.into_iter().collect::<event_store::Result<Vec<_>>>().context("playback failed")?;
    let total = event_store::playback::PlaybackSummary::total(&runs);
    let playback_time = playback_started.elapsed();

    println!("== verifying the archive's hash chain against the objects in S3");
    let table = stack.settings.names.event_table.as_str();
    let verified = event_store::archive::audit::verify(&stack.dynamo, table, &stack.archive, window_start, window_end)
        .await
        .context("verifying the archive")?;

    println!("== reading the playback stream back and checking order");
    let (played, _) = read_played(&stack, &stack.settings.names.playback_stream, &run_id).await?;
    println!("== waiting until subscription {subscription} has delivered every event, then checking order");
    let (subscribed, delivered_at) = wait_until_delivered(&stack, &run_id, &stored).await?;
    let seals = sealed.lock().map(|s| s.clone()).unwrap_or_default();
    watching.abort();
    let idle = if probes.count > 0 {
        println!("== {} idle probes: single hits after {} s without traffic each", probes.count, probes.idle.as_secs());
        crate::probes::run(&stack, &run_id, probes).await?
    } else {
        crate::probes::Measured::default()
    };
    subscriptions.manage(Manage::Delete { name: subscription }).await?;
    let _ = stop.send(true);
    while services.join_next().await.is_some() {}

    let delivery_latencies: Vec<i64> = delivered_at.iter().map(|(arrival, delivered)| delivered - arrival).collect();
    let (sealing, delivering) = breakdown(&delivered_at, &seals);
    let mut report = check(&stored, &played, accepted);
    let subscription_check = check(&stored, &subscribed, accepted);
    report.entity_events = entity_run.events();
    report.entity_problems = entity_run.problems.clone();
    report.entity_problems.extend(crate::entities::check_versions(&entity_run.streams, &played, "playback"));
    report.entity_problems.extend(crate::entities::check_versions(&entity_run.streams, &subscribed, "subscription"));
    report.subscribed = SubscriptionReport {
        latency_p50_ms: quantile(&delivery_latencies, 0.5),
        latency_p99_ms: quantile(&delivery_latencies, 0.99),
        sealing_p50_ms: quantile(&sealing, 0.5),
        sealing_p99_ms: quantile(&sealing, 0.99),
        delivering_p50_ms: quantile(&delivering, 0.5),
        delivering_p99_ms: quantile(&delivering, 0.99),
        idle_latencies_ms: idle.latencies_ms,
        idle_requests_per_minute: idle.idle_requests_per_minute,
        delivered: subscription_check.played_back,
        duplicates: subscription_check.duplicates,
        lost: subscription_check.lost,
        out_of_order: subscription_check.out_of_order,
    };
    report.stored_duplicates = stored_duplicates;
    report.sent = events;
    report.failed_requests = failed_requests;
    report.wall = started.elapsed();
    report.latency_p50_ms = quantile(&latencies, 0.5);
    report.latency_p99_ms = quantile(&latencies, 0.99);
    report.scan_interval = stack.settings.scan_interval;
    report.archive = ArchiveReport {
        objects: archived.objects,
        events: archived.events,
        verified_entries: verified.entries,
        first_break: verified.first_break.clone(),
    };
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    let since_load = |t: Option<Instant>| t.map(|t| t.duration_since(load_started)).unwrap_or(stored_time);
    report.lines = vec![
        format!(
            "load      {:>8.0} events/s  ({hits} pixel hits answered in {:.2} s)",
            rate(hits, load_time),
            load_time.as_secs_f64()
        ),
        format!(
            "streams   {:>8.0} requests/s ({} entity events in {} streams, {} requests, {:.2} s, one writer per stream but the contended one)",
            rate(entity_run.requests, entity_time),
            entity_run.events(),
            entity_run.streams.len(),
            entity_run.requests,
            entity_time.as_secs_f64()
        ),
        format!(
            "pump      {:>8.0} events/s  (all buffered {:.2} s after the first hit)",
            rate(accepted, since_load(stack.stats.last_buffered())),
            since_load(stack.stats.last_buffered()).as_secs_f64()
        ),
        format!(
            "scan      {:>8.0} events/s  (all moved {:.2} s after the first hit; scan every {:.1} s)",
            rate(accepted, since_load(stack.stats.last_moved())),
            since_load(stack.stats.last_moved()).as_secs_f64(),
            stack.settings.scan_interval.as_secs_f64()
        ),
        format!(
            "playback  {:>8.0} events/s  ({} events in {} Kinesis records, {} PutRecords, {:.2} s)",
            rate(total.events, playback_time),
            total.events,
            total.kinesis_records,
            total.put_requests,
            playback_time.as_secs_f64()
        ),
        format!(
            "playback  {} records resent, {} ambiguous failures read back, {} copies of accepted events dropped",
            total.resent, total.checked_requests, total.duplicates_dropped
        ),
        format!(
            "latency   pixel hit to event table: p50 {} ms, p99 {} ms (scan every {:.1} s)",
            report.latency_p50_ms.map_or("-".into(), |v| v.to_string()),
            report.latency_p99_ms.map_or("-".into(), |v| v.to_string()),
            stack.settings.scan_interval.as_secs_f64()
        ),
        format!(
            "archive   {} events in {} Parquet objects before the playback ({} kept for late events); the playback read both tiers",
            archived.events, archived.objects, archived.kept
        ),
        format!("AWS requests by operation (whole run, incl. the demo's own checks): {:?}", stack.counter.snapshot()),
    ];
    Ok(report)
}

/// Archives the slots before the median stored event's arrival, as the
/// archive function would with a hot retention that short (objects cut small,
/// so that the chain has several links).
async fn archive_first_half(
    stack: &Stack,
    stored: &HashMap<String, (String, String)>,
) -> Result<event_store::archiver::ArchiveSummary> {
    let mut arrivals: Vec<i64> = stored.values().filter_map(|(_, key)| key.get(..13)?.parse().ok()).collect();
    arrivals.sort_unstable();
    let Some(&middle) = arrivals.get(arrivals.len() / 2) else {
        anyhow::bail!("nothing stored to archive");
    };
    let names = &stack.settings.names;
    let mut config =
        event_store::config::ArchiveConfig::for_names(names.event_table.clone(), stack.archive.name.clone())?;
    let now = now_ms();
    config.hot_retention = Duration::from_millis(u64::try_from(now - middle).unwrap_or(1).max(1));
    config.object_bytes = 16 * 1024;
    let archiver =
        event_store::archiver::Archiver { dynamo: stack.dynamo.clone(), bucket: stack.archive.clone(), config };
    let summary = archiver.run(now, Instant::now() + Duration::from_secs(300)).await?;
    if summary.busy || summary.more {
        anyhow::bail!("the archive did not finish: {summary:?}");
    }
    Ok(summary)
}

pub(crate) async fn send_hits(
    port: u16,
    run_id: &str,
    events: usize,
    (concurrency, rate): (usize, Option<f64>),
) -> (usize, usize) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let started = tokio::time::Instant::now();
    let results: Vec<bool> = futures::stream::iter(0..events)
        .map(|n| {
            let client = client.clone();
            // Paced: hit n goes out n / rate seconds after the first.
            let at = rate.map(|rate| started + Duration::from_secs_f64(n as f64 / rate.max(0.001)));
            let uri = format!(
                "http://127.0.0.1:{port}/track.gif?EntityId=visitor-{}&page=%2Fpage-{}&n={n}&run={run_id}",
                n % 25,
                n % 7
            );
            async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at).await;
                }
                let Ok(uri) = uri.parse::<hyper::Uri>() else { return false };
                match client.get(uri).await {
                    Ok(response) => {
                        let gif = response.headers().get("content-type").is_some_and(|v| v == "image/gif");
                        let ok = response.status() == hyper::StatusCode::OK && gif;
                        let body = response.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
                        ok && body == event_store::load::PIXEL.len()
                    }
                    Err(_) => false,
                }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let accepted = results.iter().filter(|ok| **ok).count();
    (accepted, events - accepted)
}

/// The run an event belongs to: a pixel hit's `run` parameter, an entity event's `metadata.run`.
pub(crate) fn run_of(envelope: &Envelope) -> Option<&str> {
    let entity = || envelope.body.as_ref()?.get("metadata")?.get("run")?.as_str();
    envelope.query.get("run").and_then(|v| v.first()).map(String::as_str).or_else(entity)
}

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

async fn wait_until_stored(
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

/// Waits until the subscription's partitions together count `expected`
/// deliveries (their checkpoints' counts: a few reads, not the target stream), or nothing moved for a while.
async fn wait_until_counted(subscriptions: &Subscriptions, name: &str, expected: usize) -> Result<()> {
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
async fn wait_until_delivered(
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
type Timed = (i64, i64);

/// This run's records on `stream` (played back, or delivered by a
/// subscription: both carry the played-record fields): envelope ids per
/// partition key, in stream order, and for each pixel hit the event's
/// arrival and its record's arrival on `stream` (ms). Entity events are
/// left out of the timings: the demo appends them before the first hit,
/// in bursts whose relay and retries are the entity path's, not the log's.
async fn read_played(stack: &Stack, stream: &str, run_id: &str) -> Result<(HashMap<String, Vec<String>>, Vec<Timed>)> {
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

/// Compares what was stored with what was played: lost events, duplicate
/// deliveries, and first deliveries out of time order per partition key (a
/// consumer that takes the first copy of each event must see each key in order).
pub fn check(
    stored: &HashMap<String, (String, String)>,
    played: &HashMap<String, Vec<String>>,
    accepted: usize,
) -> Report {
    let mut report = Report { stored: stored.len(), ..Default::default() };
    let mut seen = HashSet::new();
    for (partition_key, ids) in played {
        report.played_back += ids.len();
        let mut last: Option<&str> = None;
        for id in ids {
            if !seen.insert(id.as_str()) {
                report.duplicates += 1;
                report.duplicate_ids.push(id.clone());
                continue;
            }
            let Some((stored_key, sort_key)) = stored.get(id) else {
                continue;
            };
            if stored_key != partition_key || last.is_some_and(|l| sort_key.as_str() < l) {
                report.out_of_order += 1;
            }
            last = Some(sort_key);
        }
    }
    let not_played = stored.keys().filter(|id| !seen.contains(id.as_str())).count();
    report.lost = accepted.saturating_sub(stored.len()) + not_played;
    report
}

pub fn print(report: &Report) {
    println!("== report");
    println!("events sent          {:>7}  ({} failed requests)", report.sent, report.failed_requests);
    println!(
        "events stored        {:>7}  ({} stored twice by an ambiguous put; readers drop the copy)",
        report.stored, report.stored_duplicates
    );
    println!("events played back   {:>7}  ({} duplicates)", report.played_back, report.duplicates);
    let sub = &report.subscribed;
    println!(
        "events subscribed    {:>7}  ({} duplicates, {} lost, {} out of order; pixel hit arrival to delivery p50 {} ms, p99 {} ms)",
        sub.delivered,
        sub.duplicates,
        sub.lost,
        sub.out_of_order,
        sub.latency_p50_ms.map_or("-".into(), |v| v.to_string()),
        sub.latency_p99_ms.map_or("-".into(), |v| v.to_string())
    );
    let ms = |v: Option<i64>| v.map_or("-".into(), |v| v.to_string());
    println!(
        "  where it goes       arrival to sealed (pump, scan, watermark lag) p50 {} ms, p99 {} ms; sealed to delivered (poll, read, put) p50 {} ms, p99 {} ms",
        ms(sub.sealing_p50_ms),
        ms(sub.sealing_p99_ms),
        ms(sub.delivering_p50_ms),
        ms(sub.delivering_p99_ms)
    );
    if !sub.idle_latencies_ms.is_empty() {
        println!(
            "  after idling        {} probes: arrival to delivery p50 {} ms, p99 {} ms ({:?})",
            sub.idle_latencies_ms.len(),
            ms(quantile(&sub.idle_latencies_ms, 0.5)),
            ms(quantile(&sub.idle_latencies_ms, 0.99)),
            sub.idle_latencies_ms
        );
    }
    for id in &report.duplicate_ids {
        println!("duplicate delivery   {id}");
    }
    println!(
        "entity events        {:>7}  (in playback and subscription: every stream in version order{})",
        report.entity_events,
        if report.entity_problems.is_empty() { ", checked" } else { ": FAILED" }
    );
    for problem in &report.entity_problems {
        println!("entity problem       {problem}");
    }
    let archive = &report.archive;
    println!(
        "archived             {:>7}  (in {} objects; hash chain: {} entries verified{})",
        archive.events,
        archive.objects,
        archive.verified_entries,
        archive.first_break.as_ref().map_or(String::new(), |b| format!(", BROKEN: {b}"))
    );
    println!("lost                 {:>7}", report.lost);
    println!("out of order         {:>7}", report.out_of_order);
    println!("wall time            {:>7.1} s", report.wall.as_secs_f64());
    for line in &report.lines {
        println!("{line}");
    }
    println!("{}", if report.ok() { "RESULT: OK" } else { "RESULT: FAILED" });
}

impl Report {
    /// The figures as JSON (`demo --report-json`), for the benchmark.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "sent": self.sent, "stored": self.stored, "played_back": self.played_back, "lost": self.lost,
            "duplicates": self.duplicates, "out_of_order": self.out_of_order, "ok": self.ok(),
            "entity_events": self.entity_events, "entity_problems": self.entity_problems,
            "subscribed": self.subscribed.delivered, "subscription_lost": self.subscribed.lost,
            "subscription_out_of_order": self.subscribed.out_of_order,
            "subscription_latency_p50_ms": self.subscribed.latency_p50_ms,
            "subscription_latency_p99_ms": self.subscribed.latency_p99_ms,
            "subscription_sealing_p50_ms": self.subscribed.sealing_p50_ms,
            "subscription_sealing_p99_ms": self.subscribed.sealing_p99_ms,
            "subscription_delivering_p50_ms": self.subscribed.delivering_p50_ms,
            "subscription_delivering_p99_ms": self.subscribed.delivering_p99_ms,
            "subscription_idle_latencies_ms": self.subscribed.idle_latencies_ms,
            "subscription_idle_latency_p99_ms": quantile(&self.subscribed.idle_latencies_ms, 0.99),
            "idle_requests_per_minute": self.subscribed.idle_requests_per_minute,
            "wall_seconds": self.wall.as_secs_f64(), "scan_interval_seconds": self.scan_interval.as_secs_f64(),
            "latency_p50_ms": self.latency_p50_ms, "latency_p99_ms": self.latency_p99_ms,
            "archived": self.archive.events, "archive_objects": self.archive.objects,
            "archive_verified_entries": self.archive.verified_entries, "archive_break": self.archive.first_break,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_is_split_where_the_watermark_first_passed_its_event() {
        let seals = [(1_000, 500), (2_000, 1_500), (3_000, 2_500)];
        let (sealing, delivering) = breakdown(&[(600, 2_300), (1_600, 3_100), (4_000, 4_200)], &seals);
        assert_eq!((sealing, delivering), (vec![1_400, 1_400], vec![300, 100]), "the last is never seen sealed");
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<i64> = (1..=100).rev().collect();
        assert_eq!(
            (quantile(&values, 0.5), quantile(&values, 0.99), quantile(&values, 1.0)),
            (Some(50), Some(99), Some(100))
        );
        assert_eq!(quantile(&[7], 0.99), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }

    fn stored(entries: &[(&str, &str, &str)]) -> HashMap<String, (String, String)> {
        entries.iter().map(|(id, pk, sk)| (id.to_string(), (pk.to_string(), sk.to_string()))).collect()
    }

    fn played(entries: &[(&str, &[&str])]) -> HashMap<String, Vec<String>> {
        entries.iter().map(|(pk, ids)| (pk.to_string(), ids.iter().map(|s| s.to_string()).collect())).collect()
    }

    #[test]
    fn a_complete_ordered_playback_passes() {
        let s = stored(&[("a", "k", "1"), ("b", "k", "2"), ("c", "j", "1")]);
        let report = check(&s, &played(&[("k", &["a", "b"]), ("j", &["c"])]), 3);
        assert_eq!((report.lost, report.out_of_order, report.duplicates, report.played_back), (0, 0, 0, 3));
    }

    #[test]
    fn losses_reorders_and_duplicates_are_counted() {
        let s = stored(&[("a", "k", "1"), ("b", "k", "2"), ("c", "k", "3")]);
        let report = check(&s, &played(&[("k", &["b", "a"])]), 4);
        assert_eq!(report.out_of_order, 1, "a after b");
        assert_eq!(report.lost, 2, "c not played, one accepted hit never stored");
        assert!(!report.ok());
    }

    #[test]
    fn order_is_judged_on_first_delivery_and_copies_are_counted() {
        let s = stored(&[("a", "k", "1"), ("b", "k", "2"), ("c", "k", "3")]);
        // An ambiguous failure after a and b were applied: both sent again.
        let report = check(&s, &played(&[("k", &["a", "b", "a", "b", "c"])]), 3);
        assert_eq!((report.out_of_order, report.duplicates, report.lost, report.played_back), (0, 2, 0, 5));
        assert_eq!(report.duplicate_ids, vec!["a".to_string(), "b".to_string()]);
        // The old resend-from-the-first-failure: c stored before b on first delivery.
        let reordered = check(&s, &played(&[("k", &["a", "c", "b", "c"])]), 3);
        assert_eq!(reordered.out_of_order, 1, "b first delivered after c");
    }
}
