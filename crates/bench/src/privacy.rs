//! Per-subject encryption's cost (docs/privacy.md): the same events through
//! load, the pump and a playback, once with every event sealed under its
//! subject's key and once with nothing sealed, in one run on one moto; the
//! KMS and key-table requests the sealed run made, the bytes it added, and
//! what that costs per million events.
//!
//! The stages' events/s are a warm function's, whose keys are cached (what a
//! subject sending more than one event per `KEY_CACHE_SECONDS` meets); making
//! the subjects' keys (cold) is timed on its own beforehand, and a playback's
//! first round, with a cold key cache, is reported beside its best.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use std::collections::BTreeMap;

use event_store::config::{LoadConfig, PlaybackConfig, PumpConfig, ScanConfig, SubjectsConfig};
use event_store::load::Load;
use event_store::log::tiers::Tiers;
use event_store::playback::Playback;
use event_store::privacy::keys::Keys;
use event_store::privacy::maker::Maker;
use event_store::privacy::Subjects;
use event_store::pump::Pump;
use event_store::time::{format_ms, now_ms};
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_streams, create_subject_key, create_tables, read_stream, Names};
use event_store_emulator::runs::{self, deadline_in, run_scan};
use futures::StreamExt;
use serde::Serialize;

use crate::archive::read_all;
use crate::measure::{per_second, CONCURRENCY, PUMP_BATCH, STREAM_SHARDS, USD_PER_MILLION_RRU, USD_PER_MILLION_WRU};
use crate::tracking::payload;

/// KMS, us-east-1: $0.03 per 10,000 requests (aws.amazon.com/kms/pricing; as of 2026-11, not
/// re-read: no internet on this machine). The key itself, $1 a month, does not grow with events.
const USD_PER_MILLION_KMS_REQUESTS: f64 = 3.0;
/// Events a `POST /events` carries (the template's default `MaxEventsPerPost`).
const PER_POST: usize = 100;
/// Playback rounds: the best is kept, as for the other stages.
const ROUNDS: usize = 2;

/// One stage's events/s, both ways.
#[derive(Debug, Serialize)]
pub struct Pair {
    pub off: f64,
    pub on: f64,
    pub ratio_on_to_off: f64,
}

impl Pair {
    fn of(off: f64, on: f64) -> Self {
        Self { off, on, ratio_on_to_off: on / off.max(1e-9) }
    }
}

#[derive(Debug, Serialize)]
pub struct PrivacyBench {
    pub events: usize,
    pub payload_bytes: usize,
    /// Distinct subjects among the events (each has its own key).
    pub subjects: usize,
    pub load: Pair,
    pub pump: Pair,
    pub playback: Pair,
    /// The window read alone (no puts): where decrypting shows, unhidden by the stream's pace.
    pub read: Pair,
    /// The same by a reader with no key cached: every subject's key unwrapped on the way
    /// (`Tiers::OPEN_AT_ONCE` events opened at a time).
    pub read_cold_keys: Pair,
    /// Target >= 0.8: the lowest of load's, the pump's and playback's.
    pub min_ratio_on_to_off: f64,
    /// Subjects' keys made per second, 16 at once (a new subject: `GenerateDataKeyWithoutPlaintext`, its `Decrypt`, key-table reads and two writes).
    pub keys_made_per_second: f64,
    /// The first playback, every key unwrapped on the way (cold cache), events/s.
    pub playback_cold_cache: f64,
    pub record_bytes_off: f64,
    pub record_bytes_on: f64,
    /// Event-table write units per event (items rounded up to KB, as DynamoDB bills them).
    pub write_units_per_event_off: f64,
    pub write_units_per_event_on: f64,
    /// The maker's `GenerateDataKeyWithoutPlaintext`, the writer's and readers' `Decrypt`, per million events (one playback).
    pub kms_requests_per_million_events: f64,
    pub key_table_reads_per_million_events: f64,
    pub key_table_writes_per_million_events: f64,
    /// KMS, the key table, and the event table's extra write units.
    pub usd_per_million_events_added: f64,
}

/// What one run (sealed or not) measured.
struct Run {
    keys_made: f64,
    playback_cold: f64,
    load: f64,
    pump: f64,
    playback: f64,
    read: f64,
    read_cold: f64,
    record_bytes: f64,
    write_units: f64,
    /// The key table's and KMS's requests by operation: the writer's and the first playback's.
    keys: BTreeMap<String, u64>,
}

pub async fn run(
    root: &std::path::Path,
    sdk: &aws_config::SdkConfig,
    events: usize,
    size: usize,
) -> Result<PrivacyBench> {
    let subjects = (events / 20).max(1);
    let off = one(root, sdk, events, size, subjects, false).await?;
    let on = one(root, sdk, events, size, subjects, true).await?;
    let per_million = |n: u64| n as f64 * 1e6 / events as f64;
    let count = |counts: &BTreeMap<String, u64>, ops: &[&str]| {
        counts.iter().filter(|(op, _)| ops.iter().any(|o| op.ends_with(o))).map(|(_, n)| *n).sum::<u64>()
    };
    let kms = per_million(count(&on.keys, &[".GenerateDataKeyWithoutPlaintext", ".GenerateDataKey", ".Decrypt"]));
    let reads = per_million(count(&on.keys, &[".GetItem", ".Query"]));
    let writes = per_million(count(&on.keys, &[".PutItem", ".UpdateItem"]));
    let (load, pump, playback) =
        (Pair::of(off.load, on.load), Pair::of(off.pump, on.pump), Pair::of(off.playback, on.playback));
    let min_ratio = load.ratio_on_to_off.min(pump.ratio_on_to_off).min(playback.ratio_on_to_off);
    let usd = kms * USD_PER_MILLION_KMS_REQUESTS / 1e6
        + reads * USD_PER_MILLION_RRU / 1e6
        + writes * USD_PER_MILLION_WRU / 1e6
        + (on.write_units - off.write_units) * USD_PER_MILLION_WRU;
    Ok(PrivacyBench {
        events,
        payload_bytes: size,
        subjects,
        load,
        pump,
        playback,
        read: Pair::of(off.read, on.read),
        read_cold_keys: Pair::of(off.read, on.read_cold),
        min_ratio_on_to_off: min_ratio,
        keys_made_per_second: on.keys_made,
        playback_cold_cache: on.playback_cold,
        record_bytes_off: off.record_bytes,
        record_bytes_on: on.record_bytes,
        write_units_per_event_off: off.write_units,
        write_units_per_event_on: on.write_units,
        kms_requests_per_million_events: kms,
        key_table_reads_per_million_events: reads,
        key_table_writes_per_million_events: writes,
        usd_per_million_events_added: usd,
    })
}

/// One run's tables and streams on the bench's moto, and its key store's
/// requests (the key table's and KMS's) counted.
struct Stack<'a> {
    sdk: &'a aws_config::SdkConfig,
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    names: Names,
    /// The key table's and KMS's requests, counted.
    counter: RequestCounter,
}

impl<'a> Stack<'a> {
    /// The tables and streams of the sealed run or of the plain one.
    async fn create(sdk: &'a aws_config::SdkConfig, sealed: bool) -> Result<Self> {
        let dynamo = aws_sdk_dynamodb::Client::new(sdk);
        let kinesis = aws_sdk_kinesis::Client::new(sdk);
        let names = Names::for_stack(if sealed { "bench-sealed" } else { "bench-plain" });
        create_tables(&dynamo, &names).await?;
        create_streams(&kinesis, &names, STREAM_SHARDS).await?;
        Ok(Self { sdk, dynamo, kinesis, names, counter: RequestCounter::default() })
    }

    /// A key store whose key-table and KMS requests the counter sees.
    fn keys(&self) -> Keys {
        let dynamo = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(self.sdk).interceptor(self.counter.clone()).build(),
        );
        let kms = aws_sdk_kms::Client::from_conf(
            aws_sdk_kms::config::Builder::from(self.sdk).interceptor(self.counter.clone()).build(),
        );
        Keys::new(dynamo, kms, self.names.key_table.clone())
    }
}

/// One run, sealed or not: the subjects' keys made (sealed only), then load,
/// the pump, the scan, playback and the window read alone, each timed.
async fn one(
    root: &std::path::Path,
    sdk: &aws_config::SdkConfig,
    events: usize,
    size: usize,
    subjects_count: usize,
    sealed: bool,
) -> Result<Run> {
    let stack = Stack::create(sdk, sealed).await?;
    let kms_key = create_subject_key(&aws_sdk_kms::Client::new(sdk), &stack.names.subject_key_alias).await?;
    let mut load = Load::new(
        stack.kinesis.clone(),
        LoadConfig { max_event_bytes: 4 * size, ..LoadConfig::new(stack.names.event_stream.clone()) },
    );
    let mut keys_made = 0.0;
    if sealed {
        let (subjects, made) = make_subject_keys(&stack, kms_key, subjects_count).await?;
        keys_made = made;
        load = load.with_subjects(Some(subjects));
    }

    // load: POST /events of 100 events each, 8 in flight.
    let requests = post_requests(root, events, size, subjects_count)?;
    let start = now_ms() - 1;
    let load_eps = measure_load(&load, requests, events).await?;
    let (record_bytes, pump_eps) = measure_pump(&stack, events).await?;
    let end = now_ms();
    scan_events(&stack, events).await?;
    let write_units = write_units(&stack.dynamo, &stack.names.event_table).await? / events as f64;

    // One reader's keys for every round: the first round unwraps them (cold), the next finds them cached.
    let reader_keys = sealed.then(|| Arc::new(stack.keys()));
    let (playback_eps, playback_cold, keys_used) =
        measure_playback(&stack, reader_keys.clone(), (start, end), events).await?;
    let (read, read_cold) = measure_reads(&stack, reader_keys, sealed, (start, end), events).await?;
    Ok(Run {
        keys_made,
        playback_cold,
        load: load_eps,
        pump: pump_eps,
        playback: playback_eps,
        read,
        read_cold,
        record_bytes,
        write_units,
        keys: keys_used,
    })
}

/// The subjects' keys, made before the timed run (as the first events of each
/// made them), 16 at once: the subjects sealing with them, and keys made per second.
async fn make_subject_keys(stack: &Stack<'_>, kms_key: String, subjects_count: usize) -> Result<(Subjects, f64)> {
    let config = SubjectsConfig {
        key_table: stack.names.key_table.clone(),
        key_function: None,
        kms_key: Some(kms_key),
        hash_key: Some("bench-subject-hash-key-not-a-secret-at-all".into()),
        subject_from: Some("EntityId".into()),
        stream_subjects: None,
        cache: event_store::privacy::keys::DEFAULT_CACHE,
    };
    let writer = Arc::new(stack.keys().made_by(config.kms_key.clone().map(Maker::Kms)));
    let subjects = Subjects::new(writer.clone(), &config)?;
    let started = Instant::now();
    let made = futures::stream::iter((0..subjects_count).map(|s| format!("user-{s}")))
        .map(|id| {
            let subjects = &subjects;
            async move { subjects.warm(&id).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    made.into_iter().collect::<event_store::Result<()>>()?;
    Ok((subjects, per_second(subjects_count, started.elapsed())))
}

/// `POST /events` requests of `PER_POST` events each, their `EntityId`s
/// spread over `subjects_count` subjects.
fn post_requests(
    root: &std::path::Path,
    events: usize,
    size: usize,
    subjects_count: usize,
) -> Result<Vec<lambda_http::Request>> {
    let template: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("events/load-post-events.json"))?)?;
    let indices: Vec<usize> = (0..events).collect();
    indices
        .chunks(PER_POST)
        .map(|chunk| {
            let posted: Vec<serde_json::Value> = chunk
                .iter()
                .map(|i| {
                    let mut body: serde_json::Value = serde_json::from_slice(&payload(*i, size)).unwrap_or_default();
                    body["EntityId"] = serde_json::json!(format!("user-{}", i % subjects_count));
                    body
                })
                .collect();
            let mut request = template.clone();
            request["body"] = serde_json::json!(serde_json::Value::Array(posted).to_string());
            lambda_http::request::from_str(&request.to_string()).map_err(anyhow::Error::from)
        })
        .collect()
}

/// load: the requests, `CONCURRENCY` in flight, every one accepted; events/s.
async fn measure_load(load: &Load, requests: Vec<lambda_http::Request>, events: usize) -> Result<f64> {
    let started = Instant::now();
    let refused = futures::stream::iter(requests)
        .map(|request| load.handle(request))
        .buffer_unordered(CONCURRENCY)
        .filter(|answer| std::future::ready(answer.status() != 202))
        .count()
        .await;
    anyhow::ensure!(refused == 0, "load refused {refused} requests");
    Ok(per_second(events, started.elapsed()))
}

/// pump: Lambda-shaped batches of the stream's records, 8 in flight. The
/// records' bytes per event, and the pump's events/s.
async fn measure_pump(stack: &Stack<'_>, events: usize) -> Result<(f64, f64)> {
    let (dynamo, kinesis, names) = (&stack.dynamo, &stack.kinesis, &stack.names);
    let records = read_stream(kinesis, &names.event_stream).await?;
    anyhow::ensure!(records.len() == events, "{} records of {events}", records.len());
    let record_bytes = records.iter().map(|(_, r)| r.data().as_ref().len()).sum::<usize>() as f64 / events as f64;
    let arn = format!("arn:aws:kinesis:us-east-1:123456789012:stream/{}", names.event_stream);
    let mut batches = Vec::new();
    for shard in records.iter().map(|(s, _)| s.clone()).collect::<std::collections::BTreeSet<_>>() {
        let of_shard: Vec<_> = records.iter().filter(|(s, _)| *s == shard).map(|(_, r)| r.clone()).collect();
        for chunk in of_shard.chunks(PUMP_BATCH) {
            batches.push(event_store::kinesis::lambda_event(&arn, &shard, "us-east-1", chunk));
        }
    }
    let pump = Pump::new(dynamo.clone(), kinesis.clone(), PumpConfig::new(&names.buffer_table, &names.event_table));
    let started = Instant::now();
    let failures: usize = futures::stream::iter(batches)
        .map(|batch| pump.handle(batch))
        .buffer_unordered(CONCURRENCY)
        .map(|answer| answer.batch_item_failures.len())
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .sum();
    anyhow::ensure!(failures == 0, "pump failed {failures} records");
    Ok((record_bytes, per_second(events, started.elapsed())))
}

/// The scan, a second after the pump's last write: every event moved onto the event table.
async fn scan_events(stack: &Stack<'_>, events: usize) -> Result<()> {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let scan = ScanConfig {
        segments: 1,
        watermark_lag_ms: 0,
        deadline_margin: Duration::from_secs(30),
        ..runs::scan_config(&stack.names)
    };
    let (dynamo, kinesis) = (stack.dynamo.clone(), stack.kinesis.clone());
    let moved: usize = run_scan(dynamo, kinesis, scan, serde_json::json!({}), deadline_in(Duration::from_secs(900)))
        .await
        .into_iter()
        .map(|run| run.map(|s| s.moved).unwrap_or(0))
        .sum();
    anyhow::ensure!(moved == events, "scan moved {moved} of {events}");
    Ok(())
}

/// playback: the window onto the playback stream (best of the rounds), every
/// round with the same reader's keys. The best events/s, the first round's
/// (its key cache cold), and the keys' requests by the end of the first round.
async fn measure_playback(
    stack: &Stack<'_>,
    reader_keys: Option<Arc<Keys>>,
    (start, end): (i64, i64),
    events: usize,
) -> Result<(f64, f64, BTreeMap<String, u64>)> {
    let window = serde_json::json!({"start": format_ms(start), "end": format_ms(end + 1), "restart": true});
    let config = PlaybackConfig { deadline_margin: Duration::from_secs(30), ..runs::playback_config(&stack.names) };
    let (mut playback_eps, mut playback_cold) = (0.0f64, 0.0f64);
    let mut keys_used = BTreeMap::new();
    for round in 0..ROUNDS {
        let (invoker, _rx) = LocalInvoker::channel();
        let reader = reader_keys.clone();
        let playback = Playback::new(stack.dynamo.clone(), stack.kinesis.clone(), config.clone(), Arc::new(invoker))
            .with_keys(reader);
        let started = Instant::now();
        let summary = playback.handle(window.clone(), SystemTime::now() + Duration::from_secs(900)).await?;
        anyhow::ensure!(summary.events == events, "played {} of {events}", summary.events);
        playback_eps = playback_eps.max(per_second(events, started.elapsed()));
        if round == 0 {
            playback_cold = per_second(events, started.elapsed());
            // The writer's requests and one reader's: the other rounds read the same keys again.
            keys_used = stack.counter.snapshot();
        }
    }
    Ok((playback_eps, playback_cold, keys_used))
}

/// The window read alone (no puts), events/s: by the playbacks' reader, its
/// keys cached, and by a reader of its own each round, its key cache empty.
async fn measure_reads(
    stack: &Stack<'_>,
    reader_keys: Option<Arc<Keys>>,
    sealed: bool,
    (start, end): (i64, i64),
    events: usize,
) -> Result<(f64, f64)> {
    let tiers = || Tiers::new(None).with_keys(reader_keys.clone());
    // From the slot that holds `start` (the index is read by slot).
    let slots = (start - start.rem_euclid(1000), end + 1);
    let read = read_all(&stack.dynamo, &stack.names.event_table, &tiers, slots, events).await?;
    // Each round a reader of its own, its key cache empty.
    let cold_tiers = || Tiers::new(None).with_keys(sealed.then(|| Arc::new(stack.keys())));
    let read_cold = read_all(&stack.dynamo, &stack.names.event_table, &cold_tiers, slots, events).await?;
    Ok((read, read_cold))
}

/// The event table's write units: its items rounded up to KB each (the bookkeeping partition left out).
async fn write_units(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<f64> {
    let (mut units, mut start) = (0usize, None);
    loop {
        let page = dynamo.scan().table_name(table).set_exclusive_start_key(start).send().await?;
        units += page
            .items()
            .iter()
            .filter(|i| i.get("slot").and_then(|v| v.as_n().ok()).is_some_and(|n| !n.starts_with('-')))
            .map(|item| event_store::event_item::item_size(item).div_ceil(1024))
            .sum::<usize>();
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(units as f64);
        }
    }
}

pub fn markdown(bench: &PrivacyBench, date: &str, machine: &str) -> String {
    let row = |name: &str, pair: &Pair| {
        format!("| {name} | {:.0} | {:.0} | **{:.2}** |\n", pair.off, pair.on, pair.ratio_on_to_off)
    };
    format!(
        "\n## Per-subject encryption ({date}, {machine}, `make bench`; moto's DynamoDB, Kinesis and KMS)\n\n\
         {} events of {} B from {} subjects (each its own key), the same events with nothing sealed and with \
         every event sealed, in one run:\n\n\
         | stage | events/s off | events/s on | on / off |\n|---|---|---|---|\n{}{}{}{}{}\n\
         Lowest of load, pump and playback: **{:.2}** (target >= 0.8), keys cached as in a warm function. \
         Cold: {:.0} subjects' keys made per second (16 at once); the first playback, every key unwrapped \
         on the way, {:.0} events/s.\n\n\
         | figure | value |\n|---|---|\n\
         | Kinesis record bytes per event, off / on | {:.0} / {:.0} |\n\
         | event-table write units per event, off / on | {:.3} / {:.3} |\n\
         | KMS requests per million events (the writer's, and one playback's) | {:.0} |\n\
         | key-table reads / writes per million events | {:.0} / {:.0} |\n\
         | **$ per million events added** (KMS, the key table, the extra write units) | **${:.2}** |\n",
        bench.events,
        bench.payload_bytes,
        bench.subjects,
        row("load", &bench.load),
        row("pump", &bench.pump),
        row("playback", &bench.playback),
        row("the window read alone (no puts)", &bench.read),
        row("the same, no key cached (each unwrapped on the way)", &bench.read_cold_keys),
        bench.min_ratio_on_to_off,
        bench.keys_made_per_second,
        bench.playback_cold_cache,
        bench.record_bytes_off,
        bench.record_bytes_on,
        bench.write_units_per_event_off,
        bench.write_units_per_event_on,
        bench.kms_requests_per_million_events,
        bench.key_table_reads_per_million_events,
        bench.key_table_writes_per_million_events,
        bench.usd_per_million_events_added,
    )
}
