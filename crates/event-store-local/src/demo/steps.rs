//! The demo's steps, one function each, in the order `run` takes them, and what each hands on to the next.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use event_store::archive::audit::Verified;
use event_store::playback::{PlaybackRequest, PlaybackSummary};
use event_store::subscription::{Manage, NewSubscription, Subscriptions, Target};
use event_store::time::{format_ms, now_ms};
use event_store_emulator::runs::{deadline_in, run_playback};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::delivered::{read_played, wait_until_counted, wait_until_delivered, Timed};
use super::hits::send_hits;
use super::stored::wait_until_stored;
use super::watermark::watch_watermark;
use crate::entities::EntityRun;
use crate::probes::{Measured, Probes};
use crate::settings::Settings;
use crate::stack::Stack;

/// Account streams the demo appends to at once, and appends to each.
const ENTITY_STREAMS: usize = 4;
const ENTITY_APPENDS: u64 = 8;

/// The started stack and what the demo made on it before the first event.
/// Fields drop in this order (the stack, and the emulator it may own, last).
pub(super) struct Demo {
    /// The watermark watcher, and the `(seen at, watermark)` it records as the watermark moves.
    watching: JoinHandle<()>,
    completions: Arc<Mutex<Vec<(i64, i64)>>>,
    subscriptions: Subscriptions,
    /// The demo's subscription.
    subscription: String,
    /// The played-back window's start (the subscription's too).
    window_start: i64,
    /// The demo's projections.
    views: super::views::Views,
    run_id: String,
    services: JoinSet<()>,
    stop: watch::Sender<bool>,
    stack: Stack,
}

/// The entity phase, and how long it took.
pub(super) struct Entities {
    pub(super) run: EntityRun,
    pub(super) time: Duration,
}

/// The pixel hits: how many were sent and answered, the failed requests, when the first went and how long all took.
pub(super) struct Load {
    pub(super) sent: usize,
    pub(super) hits: usize,
    pub(super) failed_requests: usize,
    pub(super) started: Instant,
    pub(super) time: Duration,
}

/// What reached the event table.
pub(super) struct Stored {
    /// The events accepted: pixel hits answered, and entity events appended.
    pub(super) accepted: usize,
    /// This run's event items by envelope id: (partition key, sort key).
    pub(super) items: HashMap<String, (String, String)>,
    /// Items repeating an envelope id already seen.
    pub(super) duplicates: usize,
    /// Each pixel hit's time to the table, ms.
    pub(super) latencies: Vec<i64>,
    /// From the first hit to the end of the wait.
    pub(super) time: Duration,
}

/// The playback: its window's end, its runs' total, how long it took.
pub(super) struct Played {
    pub(super) window_end: i64,
    pub(super) total: PlaybackSummary,
    pub(super) time: Duration,
}

/// What came back: envelope ids per partition key, in stream order, on the playback stream and
/// from the subscription; each pixel hit's arrival and delivery; the watermark's moves.
pub(super) struct Delivered {
    pub(super) played: HashMap<String, Vec<String>>,
    pub(super) subscribed: HashMap<String, Vec<String>>,
    pub(super) delivered_at: Vec<Timed>,
    pub(super) completions: Vec<(i64, i64)>,
}

/// Starts the stack and its services, creates the demo's subscription, and watches the watermark.
pub(super) async fn start(settings: Settings) -> Result<Demo> {
    println!("== starting the local stack (emulator on 127.0.0.1:{})", settings.emulator_port);
    let stack = Stack::start(settings).await?;
    let (stop, shutdown) = watch::channel(false);
    let services = stack.run_services(shutdown).await?;
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let window_start = now_ms() - 1;
    let subscription = format!("demo-{}", &run_id[..8]);
    println!(
        "== creating subscription {subscription}: from now, 4 partitions, to the Kinesis stream {}",
        stack.settings.names.subscription_stream
    );
    let subscriptions = crate::subscriptions::local_with(&stack)?;
    // The watermark as it moves (read every 100 ms): when each event's slot completed, for the latency's breakdown.
    let completions: Arc<Mutex<Vec<(i64, i64)>>> = Arc::default();
    let watching = tokio::spawn(watch_watermark(
        stack.dynamo.clone(),
        stack.settings.names.event_table.clone(),
        completions.clone(),
    ));
    subscriptions
        .manage(Manage::Create(NewSubscription {
            name: subscription.clone(),
            start: Some(format_ms(window_start)),
            target: Some(Target::Kinesis(stack.settings.names.subscription_stream.clone())),
            partitions: Some(4),
            ..Default::default()
        }))
        .await?;
    let views = super::views::create(&subscriptions, &run_id, window_start).await?;
    Ok(Demo { watching, completions, subscriptions, subscription, window_start, views, run_id, services, stop, stack })
}

/// Appends to entity streams over `/streams`: the Todo flow, the Counter, the account streams, the contended one.
pub(super) async fn append_entity_streams(demo: &Demo) -> Result<Entities> {
    let port = demo.stack.settings.port;
    println!(
        "== entity streams over http://127.0.0.1:{port}/streams: the Todo flow, the Counter, {ENTITY_STREAMS} account streams at once, {} writers on one stream",
        crate::entities::CONTENDED_WRITERS
    );
    let entities_started = Instant::now();
    let entity_run = crate::entities::run(port, &demo.run_id, ENTITY_STREAMS, ENTITY_APPENDS).await?;
    Ok(Entities { run: entity_run, time: entities_started.elapsed() })
}

/// Sends `events` pixel hits over HTTP, `concurrency` at once, `rate` a second at most.
pub(super) async fn send_pixel_hits(demo: &Demo, events: usize, (concurrency, rate): (usize, Option<f64>)) -> Load {
    let port = demo.stack.settings.port;
    println!("== sending {events} pixel hits to http://127.0.0.1:{port}/track.gif (concurrency {concurrency})");
    let load_started = Instant::now();
    let (hits, failed_requests) = send_hits(port, &demo.run_id, events, (concurrency, rate)).await;
    Load { sent: events, hits, failed_requests, started: load_started, time: load_started.elapsed() }
}

/// Waits until relay, pump and scan have moved every accepted event into the event table (or
/// nothing moved for a while), and says where the missing ones are.
pub(super) async fn wait_for_the_event_table(demo: &Demo, entities: &Entities, load: &Load) -> Result<Stored> {
    let stack = &demo.stack;
    let accepted = load.hits + entities.run.events();
    println!("== waiting until relay, pump and scan have moved every event into the event table");
    let (stored, stored_duplicates, latencies) = wait_until_stored(stack, &demo.run_id, accepted).await?;
    let stored_time = load.started.elapsed();
    if stored.len() < accepted {
        println!("== {} events not in the event table; where they are:", accepted - stored.len());
        match crate::lost::explain(stack, &demo.run_id, load.sent, &entities.run.streams).await {
            Ok(lines) => lines.iter().for_each(|line| println!("   {line}")),
            Err(err) => println!("   (could not look: {err:#})"),
        }
    }
    Ok(Stored { accepted, items: stored, duplicates: stored_duplicates, latencies, time: stored_time })
}

/// Waits until the subscription has counted every stored event as delivered.
pub(super) async fn wait_for_the_subscription(demo: &Demo, stored: &Stored) -> Result<()> {
    // The subscription delivers the last events before the playback starts, so that the playback's
    // load on the emulator is not measured as the subscription's latency.
    wait_until_counted(&demo.subscriptions, &demo.subscription, stored.items.len()).await
}

/// Reads the demo's projections back over `/views` and checks them against what was sent.
pub(super) async fn check_the_views(
    demo: &Demo,
    entities: &Entities,
    load: &Load,
) -> Result<super::views::ViewsReport> {
    let place = (&demo.subscriptions, demo.stack.settings.port);
    super::views::check(place, &demo.views, (&entities.run, load.hits)).await
}

/// Archives the slots before the median stored event's arrival, as the
/// archive function would with a hot retention that short (objects cut small,
/// so that the chain has several links).
pub(super) async fn archive_first_half(demo: &Demo, stored: &Stored) -> Result<event_store::archiver::ArchiveSummary> {
    let stack = &demo.stack;
    println!(
        "== archiving the window's first half to s3://{}/events/ (the hot retention shortened for the demo)",
        stack.archive.name
    );
    let mut arrivals: Vec<i64> = stored.items.values().filter_map(|(_, key)| key.get(..13)?.parse().ok()).collect();
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

/// Plays the window, up to now, back onto the playback stream, once the watermark has passed it.
pub(super) async fn play_back(demo: &Demo) -> Result<Played> {
    let stack = &demo.stack;
    let window_end = now_ms() + 1;
    println!(
        "== playing back [{}, {}) onto the playback stream, once the watermark has passed it",
        format_ms(demo.window_start),
        format_ms(window_end)
    );
    let request = PlaybackRequest {
        start: Some(format_ms(demo.window_start)),
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
    let total = PlaybackSummary::total(&runs);
    Ok(Played { window_end, total, time: playback_started.elapsed() })
}

/// Verifies the archive's hash chain over the played window against the objects in S3.
pub(super) async fn verify_the_archive(demo: &Demo, window_end: i64) -> Result<Verified> {
    let stack = &demo.stack;
    println!("== verifying the archive's hash chain against the objects in S3");
    let table = stack.settings.names.event_table.as_str();
    event_store::archive::audit::verify(&stack.dynamo, table, &stack.archive, demo.window_start, window_end)
        .await
        .context("verifying the archive")
}

/// Reads the playback stream back, then waits until the subscription has delivered every
/// stored event; stops watching the watermark.
pub(super) async fn read_back(demo: &Demo, stored: &Stored) -> Result<Delivered> {
    let stack = &demo.stack;
    println!("== reading the playback stream back and checking order");
    let (played, _) = read_played(stack, &stack.settings.names.playback_stream, &demo.run_id).await?;
    println!("== waiting until subscription {} has delivered every event, then checking order", demo.subscription);
    let (subscribed, delivered_at) = wait_until_delivered(stack, &demo.run_id, &stored.items).await?;
    let completions = demo.completions.lock().map(|s| s.clone()).unwrap_or_default();
    demo.watching.abort();
    Ok(Delivered { played, subscribed, delivered_at, completions })
}

/// The idle probes, when asked for (`--idle-probes`): none measured otherwise.
pub(super) async fn idle_probes(demo: &Demo, probes: Probes) -> Result<Measured> {
    if probes.count > 0 {
        println!("== {} idle probes: single hits after {} s without traffic each", probes.count, probes.idle.as_secs());
        crate::probes::run(&demo.stack, &demo.run_id, probes).await
    } else {
        Ok(Measured::default())
    }
}

/// Deletes the demo's subscription and stops the services; the stack (for the report's figures) is kept.
pub(super) async fn stop(demo: Demo) -> Result<Stack> {
    // Bound in the order `start` made them: on an error they drop in reverse, the stack last.
    let Demo { stack, stop, mut services, subscription, subscriptions, views, .. } = demo;
    subscriptions.manage(Manage::Delete { name: subscription }).await?;
    for name in [views.state, views.pages] {
        subscriptions.manage(Manage::DeleteProjection { name }).await?;
    }
    let _ = stop.send(true);
    while services.join_next().await.is_some() {}
    Ok(stack)
}
