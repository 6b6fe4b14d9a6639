//! Delivery's cost by partitions (results.json's `delivery`), on a fresh
//! dynalite + kinesalite (dynalite reports consumed capacity; moto a
//! constant): the same events pumped and moved into a log not cut (`SLICES`
//! 1, the default) and into one cut into [`SLICES_AT_1M`] slices; write
//! units per 1 KB event for each; then, on the cut log, the read units per
//! delivered event when 1, 8, 64 and 256 partitions each read their range
//! of keys, as a subscription's runners read it (the slot index, then their
//! slices of each slot: `log::reader::Reader` with the partition's keys).
//!
//! The events are dense, as at 1,000,000 events/s: [`EVENTS`] of 1 KB
//! within a second, one slot, over [`KEYS`] keys on [`SHARDS`] shards.
//!
//! Then parallel playback ([`playback_speedup`]): a window of
//! [`PLAYBACK_EVENTS`] played onto a stream of [`TARGET_SHARDS`] shards by
//! one run, then by [`RUNS`] runs each playing its range of keys, each run
//! paced at one shard's rate ([`SHARD_RATE`], a setting of the bench: a run
//! keeps one request in flight, so it stands for what one run sustains),
//! and both again unpaced: the emulators' own limit. A paced rate is taken
//! from when every run has put its first batch (which goes at once) to the
//! end: the pace's rate, not the first batch's burst.
//!
//! Then the same window archived ([`archive_fetches`]): the bytes 1, 8 and
//! 64 partitions fetch from S3 between them to read it, each its range.

use anyhow::{Context, Result};
use aws_lambda_events::event::kinesis::KinesisEvent;
use event_store::archive::object::Bucket;
use event_store::archiver::Archiver;
use event_store::bookkeeping::slot_index::read_index;
use event_store::config::{ArchiveConfig, PumpConfig, ScanConfig};
use event_store::log::copies::RecentIds;
use event_store::log::reader::Reader;
use event_store::log::tiers::Tiers;
use event_store::log::Window;
use event_store::position::Checkpoint;
use event_store::pump::Pump;
use event_store::readers::playbacks;
use event_store::slices::KeyRange;
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_bucket, create_streams, create_tables, Names};
use event_store_emulator::runs::{self, deadline_in, run_scan};
use event_store_emulator::Emulator;
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::measure::PUMP_BATCH;
use crate::tracking::{base64, payload};

/// The slice count the capacity model takes for 1,000,000 events/s (`docs/capacity.md`).
pub(crate) const SLICES_AT_1M: u32 = 256;
/// Partition counts of one subscription whose reads are measured.
const PARTITIONS: [u32; 4] = [1, 8, 64, 256];
const EVENTS: usize = 20_000;
const KEYS: usize = 5_000;
const SHARDS: usize = 8;
const SIZE: usize = 1024;
const ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/bench-delivery";
/// Events of the window played back: some 1,250 for each of 8 runs (three
/// batches of up to 500 however the keys fall), 20 batches for one run.
const PLAYBACK_EVENTS: usize = 10_000;
/// Shards of the playback's target, and the runs that play it together.
const TARGET_SHARDS: i32 = 8;
const RUNS: u32 = 8;
/// What each run is paced at, events a second: one target shard's rate,
/// scaled from Kinesis' 1,000 to well below what moto sustains for 8 runs
/// (whose batches of 500 come in bursts).
const SHARD_RATE: u64 = 50;

/// The section: its JSON for results.json, and what it printed.
pub(crate) async fn run(root: &Path, sdk: &aws_config::SdkConfig) -> Result<(Value, String)> {
    let node = root.join(".node/node_modules/.bin");
    let dynalite = Emulator::start_node_on_free_port(&node.join("dynalite")).context("dynalite (make tools-node)")?;
    let kinesalite =
        Emulator::start_node_on_free_port(&node.join("kinesalite")).context("kinesalite (make tools-node)")?;
    let counter = RequestCounter::default();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk)
            .endpoint_url(&dynalite.endpoint)
            .interceptor(counter.clone())
            .build(),
    );
    let kinesis = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(sdk).endpoint_url(&kinesalite.endpoint).build(),
    );
    let t0 = (event_store::time::now_ms() - 7 * 86_400_000) / 60_000 * 60_000;
    let batches = batches(t0, EVENTS)?;
    let mut md = String::from("\n## Delivery: reads by partitions on a log cut into slices\n\n");
    let mut writes = Vec::new();
    let mut cut = None;
    for slices in [1, SLICES_AT_1M] {
        let names = Names::for_stack(&format!("bench-delivery-{slices}"));
        create_tables(&dynamo, &names).await?;
        create_streams(&kinesis, &names, 1).await?;
        counter.reset();
        let pump = Pump::new(
            dynamo.clone(),
            kinesis.clone(),
            PumpConfig::new(names.buffer_table.clone(), names.event_table.clone()),
        );
        for batch in &batches {
            let failed = pump.handle(batch.clone()).await.batch_item_failures.len();
            anyhow::ensure!(failed == 0, "pump failed {failed} records");
        }
        let config = ScanConfig {
            slices,
            deadline_margin: Duration::from_secs(30),
            watermark_lag_ms: 0,
            ..runs::scan_config(&names)
        };
        let moved: usize =
            run_scan(dynamo.clone(), kinesis.clone(), config, json!({}), deadline_in(Duration::from_secs(900)))
                .await
                .into_iter()
                .map(|run| run.map(|s| s.moved).unwrap_or(0))
                .sum();
        anyhow::ensure!(moved == EVENTS, "scan moved {moved} of {EVENTS}");
        let units: f64 = counter.capacity().into_iter().filter(|(op, _)| op.contains("Write")).map(|(_, n)| n).sum();
        let per_event = units / EVENTS as f64;
        println!("   delivery  {per_event:.3} write units per 1 KB event (pump + scan), {slices} slices");
        md.push_str(&format!("- write units per {SIZE} B event (pump + scan), {slices} slices: {per_event:.3}\n"));
        writes.push(json!({"slices": slices, "write_units_per_event": per_event}));
        cut = Some(names);
    }
    let names = cut.context("the cut log")?;
    let mut reads = serde_json::Map::new();
    let mut first = None;
    for partitions in PARTITIONS {
        counter.reset();
        let delivered: usize = futures::stream::iter(0..partitions)
            .map(|part| read_range(&dynamo, &names, t0, KeyRange::new(part, partitions)))
            .buffer_unordered(8)
            .collect::<Vec<Result<usize>>>()
            .await
            .into_iter()
            .sum::<Result<usize>>()?;
        anyhow::ensure!(delivered == EVENTS, "{partitions} partitions delivered {delivered} of {EVENTS}");
        let units: f64 = counter.capacity().into_iter().filter(|(op, _)| op.contains("Query")).map(|(_, n)| n).sum();
        let per_event = units / EVENTS as f64;
        first.get_or_insert(per_event);
        println!("   delivery  {per_event:.4} read units per delivered event, {partitions} partitions");
        md.push_str(&format!("- read units per delivered event, {partitions} partitions: {per_event:.4}\n"));
        reads.insert(partitions.to_string(), json!(per_event));
    }
    let ratio = reads["256"].as_f64().unwrap_or(0.0) / first.unwrap_or(1.0).max(1e-12);
    let (playback, playback_md) = playback_speedup(root, sdk, t0).await?;
    md.push_str(&format!(
        "- 256 partitions against 1: {ratio:.2}x the read units per event ({SLICES_AT_1M} slices; {EVENTS} events of \
         {SIZE} B in one second over {KEYS} keys)\n"
    ));
    let out = json!({
        "slices": SLICES_AT_1M,
        "events": EVENTS,
        "payload_bytes": SIZE,
        "write_units_per_event_by_slices": writes,
        "read_units_per_event_by_partitions": reads,
        "read_ratio_256_to_1": ratio,
        "playback_speedup_8_runs": playback["speedup"],
        "playback": playback,
    });
    md.push_str(&playback_md);
    Ok((out, md))
}

/// What one partition reads of the window: the slot index, then the slices
/// of its range; the events of its own keys (events of others it read, a
/// slice shared, are passed over as the runner passes them over).
async fn read_range(dynamo: &aws_sdk_dynamodb::Client, names: &Names, t0: i64, keys: KeyRange) -> Result<usize> {
    read_tiers(dynamo, names, (t0, &Tiers::new(None)), keys).await
}

/// [`read_range`] through `tiers` (an archive bucket's, for archived slots).
async fn read_tiers(
    dynamo: &aws_sdk_dynamodb::Client,
    names: &Names,
    (t0, tiers): (i64, &Tiers),
    keys: KeyRange,
) -> Result<usize> {
    let (slots, _) = read_index(dynamo, &names.event_table, t0, t0 + 2_000).await?;
    let window = Window { start: t0, end: t0 + 2_000 };
    let reader = Reader {
        dynamo,
        table: &names.event_table,
        time_unit_ms: 1000,
        page_items: None,
        dedupe_window_ms: 0,
        window: &window,
        keys,
        tiers,
    };
    let mut mine = 0;
    let count = |event: &event_store::event_item::EventItem, _: Option<Value>, _: &[u8]| {
        if keys.holds(&event.partition_key) {
            mine += 1;
        }
        std::ops::ControlFlow::Continue(())
    };
    reader.each_event(slots, Checkpoint::at_slot(t0), &mut RecentIds::new(0), count).await?;
    Ok(mine)
}

/// One run, then [`RUNS`] runs together, onto a stream of [`TARGET_SHARDS`]
/// shards: events a second of each, paced at [`SHARD_RATE`] a run and
/// unpaced; the window is a log of its own, cut into [`SLICES_AT_1M`]
/// slices, on a moto of its own (the scan's look at the stream completes
/// the window there; moto serializes requests, hence the pace).
async fn playback_speedup(root: &Path, sdk: &aws_config::SdkConfig, t0: i64) -> Result<(Value, String)> {
    let moto = Emulator::start_on_free_port(&event_store_emulator::moto_server(root))?;
    let sdk = sdk.to_builder().endpoint_url(&moto.endpoint).build();
    let (dynamo, kinesis) = (&aws_sdk_dynamodb::Client::new(&sdk), &aws_sdk_kinesis::Client::new(&sdk));
    let names = Names::for_stack("bench-delivery-playback");
    create_tables(dynamo, &names).await?;
    create_streams(kinesis, &names, TARGET_SHARDS).await?;
    let pump = Pump::new(
        dynamo.clone(),
        kinesis.clone(),
        PumpConfig::new(names.buffer_table.clone(), names.event_table.clone()),
    );
    for batch in batches(t0, PLAYBACK_EVENTS)? {
        let failed = pump.handle(batch).await.batch_item_failures.len();
        anyhow::ensure!(failed == 0, "pump failed {failed} records");
    }
    let config = ScanConfig { slices: SLICES_AT_1M, watermark_lag_ms: 0, ..runs::scan_config(&names) };
    for run in run_scan(dynamo.clone(), kinesis.clone(), config, json!({}), deadline_in(Duration::from_secs(900))).await
    {
        run?;
    }
    let window = (event_store::time::format_ms(t0), event_store::time::format_ms(t0 + 2_000));
    // Events a second of `runs` runs together, each paced at `rate` (`None`: unpaced), under ids of `name`.
    let play = |runs: u32, rate: Option<u64>, name: &'static str| {
        let (names, window) = (&names, &window);
        async move {
            let requests = (0..runs).map(|part| {
                let mut request = json!({"start": window.0, "end": window.1, "id": name,
                                         "max_records_per_second": rate.unwrap_or(10_000_000) * u64::from(runs)});
                if runs > 1 {
                    request["keys"] = json!({"part": part, "parts": runs});
                }
                let make = |invoker| {
                    event_store::playback::Playback::new(
                        dynamo.clone(),
                        kinesis.clone(),
                        runs::playback_config(names),
                        invoker,
                    )
                };
                runs::run_playback(make, request, deadline_in(Duration::from_secs(900)))
            });
            let ids: Vec<String> =
                (0..runs).map(|p| if runs > 1 { format!("{name}-{p}of{runs}") } else { name.to_owned() }).collect();
            let started = std::time::Instant::now();
            let played = futures::future::join_all(requests);
            futures::pin_mut!(played);
            // Once every run has put its first batch (which goes at once, unpaced): when, and what was played by then.
            let mut steady: Option<(std::time::Instant, u64)> = None;
            let results = loop {
                tokio::select! {
                    results = &mut played => break results,
                    () = tokio::time::sleep(Duration::from_millis(200)), if steady.is_none() => {
                        let mut put = Vec::new();
                        for id in &ids {
                            let stored = playbacks::load(dynamo, &names.event_table, id).await?;
                            put.push(stored.and_then(|s| s.checkpoint).map_or(0, |c| c.events));
                        }
                        if put.iter().all(|&n| n > 0) {
                            steady = Some((std::time::Instant::now(), put.iter().sum()));
                        }
                    }
                }
            };
            let (mut events, mut last, mut per_run) = (0, None, Vec::new());
            for runs in results {
                let runs = runs.into_iter().collect::<event_store::Result<Vec<_>>>()?;
                let total = event_store::playback::PlaybackSummary::total(&runs);
                events += total.events;
                per_run.push(total.events);
                last = Some(total);
            }
            anyhow::ensure!(events == PLAYBACK_EVENTS, "{runs} runs played {events} of {PLAYBACK_EVENTS}: {last:?}");
            let (from, before) = steady.filter(|_| rate.is_some()).unwrap_or((started, 0));
            let after = events as u64 - before;
            anyhow::ensure!(after > 0, "{runs} runs: nothing played after the first batches (a longer window?)");
            Ok::<(f64, Vec<usize>), anyhow::Error>((after as f64 / from.elapsed().as_secs_f64(), per_run))
        }
    };
    let (one, _) = play(1, Some(SHARD_RATE), "paced-1").await?;
    let (together, parts) = play(RUNS, Some(SHARD_RATE), "paced-8").await?;
    let (one_unpaced, _) = play(1, None, "unpaced-1").await?;
    let (together_unpaced, _) = play(RUNS, None, "unpaced-8").await?;
    let speedup = together / one;
    let bound = pace_bound(&parts);
    println!(
        "   delivery  playback {speedup:.2}x events/s with {RUNS} runs ({together:.0}/s) against 1 ({one:.0}/s), \
         {SHARD_RATE}/s a run; unpaced {together_unpaced:.0}/s and {one_unpaced:.0}/s (the emulators' limit)"
    );
    let md = format!(
        "- parallel playback of {PLAYBACK_EVENTS} events onto {TARGET_SHARDS} shards (moto), each run paced at \
         {SHARD_RATE} events/s, events/s from every run's first put on: {RUNS} runs {together:.0}, 1 run \
         {one:.0}: **{speedup:.2}x** (target 5; pacing alone would allow {bound:.2}x with these runs' events, \
         {parts:?}: a run's last batch waits a whole interval however few it holds); unpaced, the emulator's own \
         limit: {RUNS} runs {together_unpaced:.0} events/s, 1 run {one_unpaced:.0} events/s\n"
    );
    let (cold, cold_md) = archive_fetches(&sdk, (dynamo, &names), t0).await?;
    let md = md + &cold_md;
    let out = json!({
        "archive_fetches": cold,
        "events": PLAYBACK_EVENTS,
        "target_shards": TARGET_SHARDS,
        "runs": RUNS,
        "events_per_s_a_run_paced": SHARD_RATE,
        "one_run_events_per_s": one,
        "runs_events_per_s": together,
        "speedup": speedup,
        "pace_bound": bound,
        "events_by_run": parts,
        "unpaced_one_run_events_per_s": one_unpaced,
        "unpaced_runs_events_per_s": together_unpaced,
    });
    Ok((out, md))
}

/// Partition counts whose fetches from the archive are measured.
const COLD_PARTITIONS: [u32; 3] = [1, 8, 64];

/// The window archived (objects cut as its slots were, but for
/// `DEFAULT_MIN_SLICE_ROWS`), then read by 1, 8 and 64 partitions, each its
/// range: the bytes of S3's answers between them (the footer and the row
/// groups of its slices each, the entries' anchors), against one reader's.
async fn archive_fetches(
    sdk: &aws_config::SdkConfig,
    (dynamo, names): (&aws_sdk_dynamodb::Client, &Names),
    t0: i64,
) -> Result<(Value, String)> {
    let fetched = Fetched::default();
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(sdk).interceptor(fetched.clone()).build());
    let bucket = Bucket { s3, name: names.archive_bucket.clone() };
    create_bucket(&bucket.s3, &bucket.name).await?;
    let mut config = ArchiveConfig::for_names(names.event_table.clone(), bucket.name.clone())?;
    config.hot_retention = Duration::from_millis(1);
    let archiver = Archiver { dynamo: dynamo.clone(), bucket: bucket.clone(), config };
    let deadline = std::time::Instant::now() + Duration::from_secs(900);
    let archived = archiver.run(event_store::time::now_ms(), deadline).await?;
    anyhow::ensure!(archived.events == PLAYBACK_EVENTS as u64 && !archived.more, "archived {archived:?}");
    let entries = event_store::archive::store::entries_from(dynamo, &names.event_table, 0).await?;
    let slices = entries.iter().filter_map(|e| e.cut.as_ref()).map(|cut| cut.slices).max().unwrap_or(1);
    let mut by_partitions = serde_json::Map::new();
    let mut first = None;
    for partitions in COLD_PARTITIONS {
        fetched.0.store(0, Ordering::Relaxed);
        let mut delivered = 0;
        for part in 0..partitions {
            // A reader of its own, as each partition's runner is: nothing fetched by another is reused.
            let tiers = Tiers::new(Some(bucket.clone()));
            delivered += read_tiers(dynamo, names, (t0, &tiers), KeyRange::new(part, partitions)).await?;
        }
        anyhow::ensure!(delivered == PLAYBACK_EVENTS, "{partitions} partitions read {delivered} archived events");
        let bytes = fetched.0.load(Ordering::Relaxed) as f64;
        let ratio = bytes / *first.get_or_insert(bytes);
        println!(
            "   delivery  archive: {partitions} partitions fetch {ratio:.2}x the bytes one does ({slices} slices)"
        );
        by_partitions.insert(partitions.to_string(), json!({"bytes": bytes, "ratio_to_1": ratio}));
    }
    let ratio = |p: &str| by_partitions[p]["ratio_to_1"].as_f64().unwrap_or(0.0);
    let md = format!(
        "- the window archived ({PLAYBACK_EVENTS} events in {} object(s) of {} bytes, cut into {slices} slices: \
         1,024 events a slice on average at least), read by partitions each its range: S3 bytes fetched by 8 \
         partitions {:.2}x one reader's, by 64 {:.2}x (each partition fetches the footer and its slices' row groups, and \
         past {slices} partitions they share slices; objects read whole by each partition would be 8x and 64x, \
         computed)\n",
        archived.objects,
        archived.bytes,
        ratio("8"),
        ratio("64"),
    );
    Ok((json!({"slices": slices, "objects": archived.objects, "by_partitions": by_partitions}), md))
}

/// The bytes of S3's answers (their `Content-Length`), added up.
#[derive(Debug, Clone, Default)]
struct Fetched(Arc<AtomicU64>);

impl aws_sdk_s3::config::Intercept for Fetched {
    fn name(&self) -> &'static str {
        "Fetched"
    }

    fn read_before_deserialization(
        &self,
        context: &aws_sdk_s3::config::interceptors::BeforeDeserializationInterceptorContextRef<'_>,
        _: &aws_sdk_s3::config::RuntimeComponents,
        _: &mut aws_sdk_s3::config::ConfigBag,
    ) -> std::result::Result<(), aws_sdk_s3::error::BoxError> {
        let length = context.response().headers().get("content-length").and_then(|n| n.parse::<u64>().ok());
        self.0.fetch_add(length.unwrap_or(0), Ordering::Relaxed);
        Ok(())
    }
}

/// The speed-up pacing alone allows runs of `parts` events against one run of
/// them all, from every run's first put on: each batch of 500 after the first
/// waits 500 / rate, full or not.
fn pace_bound(parts: &[usize]) -> f64 {
    let waits = |events: usize| events.div_ceil(500).saturating_sub(1).max(1) as f64;
    let all: usize = parts.iter().sum();
    let after_first: usize = parts.iter().map(|&e| e.saturating_sub(500)).sum();
    let longest = parts.iter().map(|&e| waits(e)).fold(0.0, f64::max);
    (after_first as f64 / longest) / ((all.saturating_sub(500)) as f64 / waits(all))
}

/// The events as the pump's event source hands them over: [`PUMP_BATCH`]
/// records of one shard each, the shards round robin, all within one second.
fn batches(t0: i64, count: usize) -> Result<Vec<KinesisEvent>> {
    let mut batches = Vec::new();
    let per_shard: Vec<Vec<usize>> =
        (0..SHARDS).map(|shard| (0..count).filter(|i| i % SHARDS == shard).collect()).collect();
    for (shard, events) in per_shard.iter().enumerate() {
        for chunk in events.chunks(PUMP_BATCH) {
            let records: Vec<Value> = chunk
                .iter()
                .map(|&i| {
                    let sequence = format!("4959{:052}", i + 1);
                    json!({
                        "kinesis": {"partitionKey": format!("user-{}", i % KEYS), "sequenceNumber": sequence,
                                    "data": base64(&payload(i, SIZE)),
                                    "approximateArrivalTimestamp": (t0 + (i * 900 / count) as i64) as f64 / 1000.0},
                        "eventID": format!("shardId-{shard:012}:{sequence}"), "eventSourceARN": ARN,
                    })
                })
                .collect();
            batches.push(event_store::pump::parse_kinesis_event(json!({ "Records": records }))?);
        }
    }
    Ok(batches)
}
