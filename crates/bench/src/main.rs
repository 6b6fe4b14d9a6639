//! `make bench`: every stage against a local moto_server, with the
//! emulator's own raw capacity measured in the same run by a tight client
//! loop, so the figures are ratios that hold on a noisy machine.
//!
//! Per payload size: throughput per stage on moto and its ratio to the raw
//! batch APIs, AWS requests per event by operation; DynamoDB capacity units
//! per event on dynalite (moto reports a constant) with and without
//! compression, and $ per million events; the arm64 bootstrap sizes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use event_store::batch::{Backoff, KINESIS_BATCH_RECORDS};
use event_store::bookkeeping::shard_position;
use event_store::config::{PlaybackConfig, PumpConfig, ScanConfig, SubscriptionConfig};
use event_store::kinesis::{put_in_key_order, send_put_records, OutgoingRecord};
use event_store::log::record::kinesis_records;
use event_store::log::RecordFormat;
use event_store::playback::{Pacer, Playback};
use event_store::pump::Pump;
use event_store::subscription::Subscriptions;
use event_store::time::format_ms;
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_streams, create_tables, Names};
use event_store_emulator::runs::{self, deadline_in, run_scan, run_subscriptions};
use event_store_emulator::{moto_server, Emulator};
use futures::StreamExt;
use serde::Serialize;

mod archive;
mod capacity;
mod cold_start;
mod entity;
mod latency;
mod privacy;
mod raw;

/// In-flight requests for the raw loops and the stages alike.
pub(crate) const CONCURRENCY: usize = 8;
/// Alternating rounds of pump and its raw loop (the best of each is kept).
const PUMP_ROUNDS: usize = 3;
/// Records per pump invocation (the template's `PumpBatchSize` default).
const PUMP_BATCH: usize = 500;
/// DynamoDB on-demand prices, us-east-1, per million request units: $0.625 per
/// million write request units and $0.125 per million read request units
/// (aws.amazon.com/dynamodb/pricing/on-demand/, the prices since the
/// 2024-11-01 reduction; not re-read on 2026-11-21: no internet on this machine).
const USD_PER_MILLION_WRU: f64 = 0.625;
const USD_PER_MILLION_RRU: f64 = 0.125;
/// Events per payload size for the capacity pass on dynalite (which, unlike
/// moto, reports consumed capacity as DynamoDB computes it).
const CAPACITY_EVENTS: usize = 2000;
/// Shards of each bench stream: the playback stream's write limit is 1,000 records and 1 MiB a second per shard.
const STREAM_SHARDS: i32 = 2;

#[derive(Debug, Serialize)]
struct StageResult {
    stage: &'static str,
    events_per_second: f64,
    raw_baseline: &'static str,
    raw_events_per_second: f64,
    ratio_to_raw: f64,
    requests_per_event: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
struct PayloadResult {
    payload_bytes: usize,
    events: usize,
    stages: Vec<StageResult>,
    /// Playback's Kinesis records per played event (aggregated records carry many).
    playback_records_per_event: f64,
    /// A one-partition subscription catching up over the same events onto a
    /// Kinesis target: its events/s over playback's, in the same run (target >= 0.8).
    subscription_to_playback: f64,
    /// Playback's put path alone on one paced shard, events/s by record format (200 B only).
    put_path: Vec<(RecordFormat, f64)>,
    capacity: Option<Capacity>,
}

/// Capacity units per event through pump, scan and playback, as dynalite reports them.
#[derive(Debug, Serialize, Default)]
struct Capacity {
    events: usize,
    /// By operation, e.g. `DynamoDB.BatchWriteItem` (pump and scan writes).
    units_per_event: BTreeMap<String, f64>,
    write_units_per_event: f64,
    read_units_per_event: f64,
    /// The same events' write units computed from item sizes, data stored as sent (no compression).
    uncompressed_write_units_per_event: f64,
    usd_per_million_events: f64,
    /// Event-table bytes per event (items as DynamoDB sizes them, bookkeeping left out).
    stored_bytes_per_event: f64,
    /// The events' JSON as sent, bytes per event.
    raw_bytes_per_event: f64,
    /// The pump's packing (postcard + zstd) on one core of this machine, MB of raw events a second.
    pack_mb_per_second: f64,
}

const WORDS: &[&str] = &[
    "home",
    "pricing",
    "docs",
    "blog",
    "signup",
    "checkout",
    "cart",
    "search",
    "product",
    "account",
    "settings",
    "click",
    "view",
    "scroll",
    "submit",
    "play",
    "pause",
    "share",
    "like",
    "download",
    "en-US",
    "de-DE",
    "fr-FR",
    "mobile",
    "desktop",
    "tablet",
    "chrome",
    "firefox",
    "safari",
    "edge",
    "newsletter",
    "campaign",
    "spring-sale",
];

/// A tracking event like the ones load produces (an envelope with query,
/// headers and a hashed IP), padded with a property bag drawn from a small
/// vocabulary, as real analytics events are; ids and hashes are random.
fn payload(n: usize, size: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(n as u64);
    let hex = |rng: &mut fastrand::Rng, len: usize| (0..len).map(|_| rng.digit(16)).collect::<String>();
    let word = |rng: &mut fastrand::Rng| WORDS[rng.usize(..WORDS.len())];
    let mut event = serde_json::json!({
        "id": hex(&mut rng, 32),
        "received_at": format_ms(1_795_240_724_000 + n as i64),
        "method": "GET",
        "path": "/track.gif",
        "query": {"EntityId": [format!("user-{}", n % 50)], "page": [format!("/{}/{}", word(&mut rng), word(&mut rng))]},
        "headers": {
            "user-agent": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
            "accept-language": "en-US,en;q=0.9",
            "referer": format!("https://www.example.com/{}/{}", word(&mut rng), word(&mut rng)),
        },
        "ip": hex(&mut rng, 64),
        "props": {},
    });
    let mut i = 0;
    while serde_json::to_vec(&event).map_or(0, |v| v.len()) + 24 < size {
        event["props"][format!("{}_{i}", word(&mut rng))] = serde_json::json!(word(&mut rng));
        i += 1;
    }
    serde_json::to_vec(&event).unwrap_or_default()
}

fn per_second(n: usize, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn per_event(counter: &RequestCounter, events: usize) -> BTreeMap<String, f64> {
    counter.snapshot().into_iter().map(|(op, n)| (op, n as f64 / events as f64)).collect()
}

async fn bench_payload(
    dynamo_sdk: &aws_config::SdkConfig,
    kinesis_sdk: &aws_config::SdkConfig,
    events: usize,
    size: usize,
) -> Result<PayloadResult> {
    let counter = RequestCounter::default();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(dynamo_sdk).interceptor(counter.clone()).build(),
    );
    let kinesis = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(kinesis_sdk).interceptor(counter.clone()).build(),
    );
    // A week ago: sealed as soon as the scan has passed.
    let t0 = (event_store::time::now_ms() - 7 * 86_400_000) / 60_000 * 60_000;
    let names = Names::for_stack(&format!("bench-{size}"));
    let raw = Names::for_stack(&format!("bench-raw-{size}"));
    for n in [&names, &raw] {
        create_tables(&dynamo, n).await?;
        create_streams(&kinesis, n, STREAM_SHARDS).await?;
    }
    let mut stages = Vec::new();
    let mut units: BTreeMap<String, f64> = BTreeMap::new();
    let mut stage = |name: &'static str, eps: f64, baseline: &'static str, raw: f64, counter: &RequestCounter| {
        for (op, n) in counter.capacity() {
            *units.entry(op).or_default() += n;
        }
        stages.push(StageResult {
            stage: name,
            events_per_second: eps,
            raw_baseline: baseline,
            raw_events_per_second: raw,
            ratio_to_raw: eps / raw,
            requests_per_event: per_event(counter, events),
        });
        counter.reset();
    };

    // pump: Lambda-shaped batches of the template's size, as many in flight as the raw loop.
    let records: Vec<_> = (0..events).map(|i| (i, payload(i, size))).collect();
    let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/bench";
    // Each batch from its own shard, as Lambda runs them concurrently (one batch per shard at a time).
    let batches: Vec<aws_lambda_events::event::kinesis::KinesisEvent> = records
        .chunks(PUMP_BATCH)
        .enumerate()
        .map(|(batch, chunk)| {
            let json: Vec<serde_json::Value> = chunk
                .iter()
                .map(|(i, data)| {
                    let sequence = format!("4959{:052}", i + 1);
                    serde_json::json!({
                        "kinesis": {"partitionKey": format!("user-{}", i % 50), "sequenceNumber": sequence,
                                    "data": base64(data), "approximateArrivalTimestamp": (t0 + *i as i64) as f64 / 1000.0},
                        "eventID": format!("shardId-bench{batch:07}:{sequence}"), "eventSourceARN": arn,
                    })
                })
                .collect();
            event_store::pump::parse_kinesis_event(serde_json::json!({ "Records": json }))
        })
        .collect::<event_store::Result<_>>()?;

    // The raw baselines first, on their own tables: the same items and records, tight loops.
    let now = event_store::time::now_ms();
    // The pump's own chunks of each batch (one shard each), as it writes them.
    let batch_events = batches
        .iter()
        .map(|batch| {
            batch
                .records
                .iter()
                .map(|r| event_store::pump::chunk_event(r, r.kinesis.approximate_arrival_timestamp.timestamp_millis()))
                .collect::<event_store::Result<Vec<_>>>()
        })
        .collect::<event_store::Result<Vec<_>>>()?;
    let mut buffer_items = Vec::new();
    for events in batch_events.iter().cloned() {
        let (chunks, failed) = event_store::pump::buffer_chunks(arn, events, 1000, now);
        anyhow::ensure!(failed.is_empty(), "records not packed");
        buffer_items.extend(chunks.into_iter().map(|(item, _)| item.to_item()));
    }
    let slots: Vec<i64> = {
        let set: std::collections::BTreeSet<i64> = (0..events as i64).map(|i| (t0 + i) / 1000 * 1000).collect();
        set.into_iter().collect()
    };
    // The raw loops go through clients that the request counter does not see.
    let plain = aws_sdk_dynamodb::Client::new(dynamo_sdk);
    let plain_kinesis = aws_sdk_kinesis::Client::new(kinesis_sdk);

    // pump, and its raw loop, in alternating rounds: the best of each, so a
    // moment of noise on the shared machine does not decide the ratio.
    // Pump writes are idempotent, so a round overwrites the previous one's items
    // (once the shard positions are forgotten).
    let pump_config = PumpConfig::new(names.buffer_table.clone(), names.event_table.clone());
    let pump = Pump::new(dynamo.clone(), kinesis.clone(), pump_config);
    let (mut raw_pump, mut pumped) = (0.0f64, 0.0f64);
    for _ in 0..PUMP_ROUNDS {
        let started = Instant::now();
        raw::put_items(&plain, &raw.buffer_table, buffer_items.clone()).await?;
        raw_pump = raw_pump.max(per_second(events, started.elapsed()));
        // A new round must write again, not skip what the shard positions say is buffered.
        shard_position::forget_all(&plain, &names.event_table).await?;
        counter.reset();
        let started = Instant::now();
        let failures: usize = futures::stream::iter(batches.clone())
            .map(|batch| pump.handle(batch))
            .buffer_unordered(CONCURRENCY)
            .map(|response| response.batch_item_failures.len())
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .sum();
        anyhow::ensure!(failures == 0, "pump failed {failures} records");
        pumped = pumped.max(per_second(events, started.elapsed()));
    }
    stage("pump", pumped, "BatchWriteItem of the same items", raw_pump, &counter);
    let raw_scan = raw::scan(&plain, &raw.buffer_table, &raw.event_table, now).await?;
    let raw_playback = raw::playback(&plain, &plain_kinesis, &raw.event_table, &raw.playback_stream, slots).await?;
    counter.reset();

    // scan: one scheduled run and its forks.
    let config = ScanConfig { deadline_margin: Duration::from_secs(30), ..runs::scan_config(&names) };
    let started = Instant::now();
    let moved: usize =
        run_scan(dynamo.clone(), kinesis.clone(), config, serde_json::json!({}), deadline_in(Duration::from_secs(900)))
            .await
            .into_iter()
            .map(|run| run.map(|s| s.moved).unwrap_or(0))
            .sum();
    anyhow::ensure!(moved == events, "scan moved {moved} of {events}");
    stage("scan", per_second(events, started.elapsed()), "Scan + puts + deletes of the same items", raw_scan, &counter);

    // playback: the whole window.
    let config = PlaybackConfig { deadline_margin: Duration::from_secs(30), ..runs::playback_config(&names) };
    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(dynamo.clone(), kinesis.clone(), config, Arc::new(invoker));
    let window = serde_json::json!({"start": format_ms(t0), "end": format_ms(t0 + events as i64 + 1), "restart": true});
    let started = Instant::now();
    let summary = playback.handle(window, SystemTime::now() + Duration::from_secs(900)).await?;
    anyhow::ensure!(summary.events == events, "playback played {} of {events}", summary.events);
    let started_playback_elapsed = started.elapsed();
    let playback_records_per_event = summary.kinesis_records as f64 / events as f64;
    stage(
        "playback",
        per_second(events, started_playback_elapsed),
        "Query + PutRecords of the same records",
        raw_playback,
        &counter,
    );

    let playback_eps = per_second(events, started_playback_elapsed);

    // subscription: a one-partition subscription from the window's start catches up over the same
    // events onto a Kinesis target (the same put path as playback), in one tick and its runner.
    counter.reset();
    let sub_config =
        SubscriptionConfig { deadline_margin: Duration::from_secs(30), ..runs::subscription_config(&names) };
    let subscriptions = Subscriptions::new(
        dynamo.clone(),
        kinesis.clone(),
        aws_sdk_lambda::Client::new(dynamo_sdk),
        sub_config.clone(),
        Arc::new(LocalInvoker::channel().0),
    );
    let create = serde_json::json!({
        "action": "create", "name": "bench", "start": format_ms(t0), "target": {"kinesis": names.subscription_stream}
    });
    subscriptions.handle(create, SystemTime::now() + Duration::from_secs(60)).await?;
    counter.reset();
    let (d, k, l) = (dynamo.clone(), kinesis.clone(), aws_sdk_lambda::Client::new(dynamo_sdk));
    let make = move |invoker| Subscriptions::new(d, k, l, sub_config, invoker);
    let started = Instant::now();
    let delivered: u64 = run_subscriptions(make, serde_json::json!({}), deadline_in(Duration::from_secs(900)))
        .await
        .into_iter()
        .map(|answer| answer.map(|a| a["delivered"].as_u64().unwrap_or(0)).unwrap_or(0))
        .sum();
    let subscription_eps = per_second(events, started.elapsed());
    anyhow::ensure!(delivered == events as u64, "the subscription delivered {delivered} of {events}");
    let subscription = StageResult {
        stage: "subscription",
        events_per_second: subscription_eps,
        raw_baseline: "Query + PutRecords of the same records",
        raw_events_per_second: raw_playback,
        ratio_to_raw: subscription_eps / raw_playback,
        requests_per_event: per_event(&counter, events),
    };
    stages.push(subscription);

    let per_event = |n: f64| n / events as f64;
    let writes: f64 = ["DynamoDB.BatchWriteItem", "DynamoDB.UpdateItem", "DynamoDB.PutItem"]
        .iter()
        .filter_map(|op| units.get(*op))
        .sum();
    let reads: f64 =
        ["DynamoDB.Scan", "DynamoDB.Query", "DynamoDB.GetItem"].iter().filter_map(|op| units.get(*op)).sum();
    let capacity = Capacity {
        events,
        units_per_event: units.iter().map(|(op, n)| (op.clone(), per_event(*n))).collect(),
        write_units_per_event: per_event(writes),
        read_units_per_event: per_event(reads),
        uncompressed_write_units_per_event: uncompressed_write_units(events, size, t0)?,
        usd_per_million_events: per_event(writes) * USD_PER_MILLION_WRU + per_event(reads) * USD_PER_MILLION_RRU,
        stored_bytes_per_event: per_event(stored_bytes(&plain, &names.event_table).await? as f64),
        raw_bytes_per_event: per_event(records.iter().map(|(_, data)| data.len()).sum::<usize>() as f64),
        pack_mb_per_second: pack_mb_per_second(&batch_events)?,
    };
    Ok(PayloadResult {
        payload_bytes: size,
        events,
        stages,
        playback_records_per_event,
        subscription_to_playback: subscription_eps / playback_eps,
        put_path: Vec::new(),
        capacity: Some(capacity),
    })
}

/// Bytes of the event table's event items (slots from 0; bookkeeping and quarantine are negative).
async fn stored_bytes(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<usize> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let mut pages = client
        .scan()
        .table_name(table)
        .filter_expression("#slot >= :zero")
        .expression_attribute_names("#slot", "slot")
        .expression_attribute_values(":zero", AttributeValue::N("0".into()))
        .into_paginator()
        .send();
    let mut bytes = 0;
    while let Some(page) = pages.next().await {
        bytes += page?.items().iter().map(event_store::event_item::item_size).sum::<usize>();
    }
    Ok(bytes)
}

/// The pump's packing of its batches' events, timed on one core.
fn pack_mb_per_second(batches: &[Vec<event_store::chunk::ChunkEvent>]) -> Result<f64> {
    let started = Instant::now();
    for events in batches {
        event_store::chunk::pack(events)?;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let raw: usize = batches.iter().flatten().map(|e| e.data.len()).sum();
    Ok(raw as f64 / 1e6 / elapsed)
}

/// Write units per event (buffer put + buffer delete + event put) computed
/// from item sizes as DynamoDB bills them (per started KB) had the data been
/// stored as sent: the "before" of compression.
fn uncompressed_write_units(events: usize, size: usize, t0: i64) -> Result<f64> {
    use event_store::buffer_item::{buffer_key, BufferItem};
    use event_store::event_item::item_size;
    let kb = |bytes: usize| bytes.div_ceil(1024) as f64;
    let mut total = 0.0;
    for i in 0..events {
        let event_id = format!("shardId-000000000000:4959{:052}", i + 1);
        let arrival = t0 + i as i64;
        let buffered = BufferItem {
            id: buffer_key("arn:aws:kinesis:us-east-1:123456789012:stream/bench", &event_id),
            event_id,
            arrival,
            partition_key: format!("user-{}", i % 50),
            data: payload(i, size),
            encoding: None,
            buffered_at: Some(arrival),
            count: None,
        };
        let event = buffered.to_event_item(1000)?.moved(arrival);
        total += 2.0 * kb(item_size(&buffered.to_item())) + kb(item_size(&event.to_item()));
    }
    Ok(total / events as f64)
}

fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn markdown(results: &[PayloadResult], machine: &str, date: &str) -> String {
    let ratios: Vec<String> =
        results.iter().map(|r| format!("{} B: {:.2}", r.payload_bytes, r.subscription_to_playback)).collect();
    let subscription_line = format!(
        "\nSubscription catch-up (one partition, Kinesis target, one tick and its runner) over the same events as \
         playback, in the same run, as a ratio of playback's events/s (target >= 0.8): {}.\n",
        ratios.join(", ")
    );
    let mut md = format!(
        "# Benchmark results\n\n{date}, {machine}. Local moto_server. Each stage's events/s is compared with the \
         emulator's raw capacity for the same work, measured in the same run: the same items and records, built \
         beforehand, sent in tight loops with 8 requests in flight (`make bench`).\n\n\
         | payload | stage | events/s | raw baseline | ratio to raw | requests per event |\n|---|---|---|---|---|---|\n"
    );
    for r in results {
        for s in &r.stages {
            let requests: Vec<String> = s.requests_per_event.iter().map(|(op, n)| format!("{op} {n:.4}")).collect();
            md.push_str(&format!(
                "| {} B | {} | {:.0} | {} | {:.2} | {} |\n",
                r.payload_bytes,
                s.stage,
                s.events_per_second,
                s.raw_baseline,
                s.ratio_to_raw,
                requests.join(", ")
            ));
        }
    }
    md.push_str(&format!(
        "\nPlayback against Kinesis' write limit per shard ({STREAM_SHARDS} shards; 1,000 records and 1 MiB a second \
         each). One record per event could never pass 1,000 events/s per shard; aggregated records carry a \
         partition key's events of a batch, so the 1 MiB/s is what bounds them:\n\n\
         | payload | playback events/s | per shard | Kinesis records per event | per-shard record cap, in events/s |\n|---|---|---|---|---|\n"
    ));
    for r in results {
        if let Some(s) = r.stages.iter().find(|s| s.stage == "playback") {
            let per_shard = s.events_per_second / STREAM_SHARDS as f64;
            let cap = 1000.0 / r.playback_records_per_event.max(1e-9);
            md.push_str(&format!(
                "| {} B | {:.0} | {:.0} | {:.3} | {:.0} |\n",
                r.payload_bytes, s.events_per_second, per_shard, r.playback_records_per_event, cap
            ));
        }
    }
    md.push_str(&subscription_line);
    for r in results.iter().filter(|r| !r.put_path.is_empty()) {
        md.push_str(&format!(
            "\nPlayback's put path alone ({CAP_EVENTS} played events of {} B built beforehand, no DynamoDB), \
             onto one shard paced at its write limit:\n\n| records | events/s | against 1,000/s |\n|---|---|---|\n",
            r.payload_bytes
        ));
        for (format, eps) in &r.put_path {
            md.push_str(&format!("| {format:?} | {eps:.0} | {:.2} x |\n", eps / 1000.0));
        }
    }
    md.push_str(
        "\nDynamoDB capacity per event (pump + scan + playback), as dynalite reports it (moto reports a constant), \
         and the cost at on-demand prices (us-east-1: $0.625 per million write units, $0.125 per million read units):\n\n\
         | payload | write units/event | write units/event if stored one uncompressed event per item | read units/event | $ per million events | stored bytes/event | stored / raw JSON | pack MB/s (one core) |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        if let Some(c) = &r.capacity {
            md.push_str(&format!(
                "| {} B | {:.3} | {:.2} | {:.3} | {:.3} | {:.0} | {:.3} | {:.0} |\n",
                r.payload_bytes,
                c.write_units_per_event,
                c.uncompressed_write_units_per_event,
                c.read_units_per_event,
                c.usd_per_million_events,
                c.stored_bytes_per_event,
                c.stored_bytes_per_event / c.raw_bytes_per_event,
                c.pack_mb_per_second
            ));
        }
    }
    md.push_str(&targets(results));
    let sizes = bootstrap_sizes();
    if !sizes.is_empty() {
        md.push_str("\narm64 bootstrap sizes (`make build`, release, LTO, stripped):\n\n| function | bytes | MB |\n|---|---|---|\n");
        for (name, bytes) in sizes {
            md.push_str(&format!("| {name} | {bytes} | {:.2} |\n", bytes as f64 / 1e6));
        }
    }
    md
}

/// Packed storage's targets (issue 16) against this run's capacity pass.
fn targets(results: &[PayloadResult]) -> String {
    let capacity = |size: usize| results.iter().find(|r| r.payload_bytes == size).and_then(|r| r.capacity.as_ref());
    let mut md = String::from(
        "\nPacked storage against its targets (one run):\n\n| figure | target | measured | |\n|---|---|---|---|\n",
    );
    let mut row = |figure: String, target: f64, measured: Option<f64>| {
        if let Some(m) = measured {
            let verdict = if m <= target { "met" } else { "missed" };
            md.push_str(&format!("| {figure} | <= {target} | {m:.3} | {verdict} |\n"));
        }
    };
    for (size, target) in [(200, 0.15), (1024, 0.5), (3072, 1.2)] {
        row(format!("write units per {size} B event"), target, capacity(size).map(|c| c.write_units_per_event));
    }
    for size in [200, 1024, 3072, 4096] {
        let ratio = capacity(size).map(|c| c.stored_bytes_per_event / c.raw_bytes_per_event);
        row(format!("stored bytes / raw JSON bytes, {size} B"), 0.3, ratio);
    }
    row("DynamoDB $ per million 1 KB events".into(), 0.35, capacity(1024).map(|c| c.usd_per_million_events));
    md
}

/// Sizes of the arm64 bootstraps `make build` left in target/lambda.
fn bootstrap_sizes() -> Vec<(&'static str, u64)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/lambda");
    ["load", "pump", "scan", "playback", "subscriptions"]
        .into_iter()
        .filter_map(|name| Some((name, std::fs::metadata(root.join(name).join("bootstrap")).ok()?.len())))
        .collect()
}

/// Cold starts per function (the median is reported).
const COLD_STARTS: usize = 5;

/// A function's own environment variables.
type Env<'a> = Vec<(&'a str, &'a str)>;

/// Events through playback's put path alone, at 200 B: enough to see the pace.
const CAP_EVENTS: usize = 10_000;

/// Playback's put path alone (no DynamoDB, which is what bounds the full
/// stage on moto), onto a 1-shard stream paced at its write limit: events/s
/// with one record per event (`plain`, held to 1,000 records/s) and with
/// aggregated records. The played events are built beforehand.
async fn put_path_against_the_cap(sdk: &aws_config::SdkConfig, size: usize) -> Result<Vec<(RecordFormat, f64)>> {
    let kinesis = aws_sdk_kinesis::Client::new(sdk);
    let events: Vec<OutgoingRecord> = (0..CAP_EVENTS)
        .map(|i| OutgoingRecord { partition_key: format!("user-{}", i % 50), data: payload(i, size) })
        .collect();
    let mut out = Vec::new();
    for format in [RecordFormat::Plain, RecordFormat::Aggregated] {
        let names = Names::for_stack(&format!("bench-cap-{format:?}").to_lowercase());
        create_streams(&kinesis, &names, 1).await?;
        let stream = names.playback_stream.as_str();
        let mut pacer = Pacer::for_shards(1);
        let started = Instant::now();
        for batch in events.chunks(KINESIS_BATCH_RECORDS) {
            let records = kinesis_records(batch.to_vec(), format);
            tokio::time::sleep(pacer.next_at().saturating_sub(started.elapsed())).await;
            let kinesis = &kinesis;
            let put = put_in_key_order(
                &records,
                &Backoff::default(),
                |b| async move { send_put_records(kinesis, stream, &b).await },
                |b| async move { Ok(vec![false; b.len()]) },
            )
            .await;
            anyhow::ensure!(put.failures.is_empty(), "the put path failed {} records", put.failures.len());
            pacer.sent(records.len(), records.iter().map(OutgoingRecord::size).sum());
        }
        out.push((format, per_second(CAP_EVENTS, started.elapsed())));
    }
    Ok(out)
}

/// Each function's cold start, the median of `COLD_STARTS` runs, against the bench's moto.
async fn cold_starts(
    root: &std::path::Path,
    sdk: &aws_config::SdkConfig,
    endpoint: &str,
) -> Result<Vec<(&'static str, cold_start::ColdStart)>> {
    let names = Names::for_stack("bench-cold");
    create_tables(&aws_sdk_dynamodb::Client::new(sdk), &names).await?;
    create_streams(&aws_sdk_kinesis::Client::new(sdk), &names, 1).await?;
    // (function, sample event, its environment variables)
    let functions: [(&str, &str, Env); 4] = [
        ("load", "load.json", vec![("EVENT_STREAM", &names.event_stream), ("IP_SALT", "bench-salt-not-secret")]),
        (
            "pump",
            "pump.json",
            vec![("DYNAMO_BUFFER_TABLE", &names.buffer_table), ("DYNAMO_EVENT_TABLE", &names.event_table)],
        ),
        (
            "scan",
            "scan-segment.json",
            vec![
                ("DYNAMO_BUFFER_TABLE", &names.buffer_table),
                ("DYNAMO_EVENT_TABLE", &names.event_table),
                ("EVENT_STREAM", &names.event_stream),
            ],
        ),
        (
            "playback",
            "playback.json",
            vec![("DYNAMO_EVENT_TABLE", &names.event_table), ("PLAYBACK_STREAM", &names.playback_stream)],
        ),
    ];
    let mut out = Vec::new();
    for (name, event, vars) in functions {
        let mut env: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        for (k, v) in [
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "bench"),
            ("AWS_SECRET_ACCESS_KEY", "bench"),
            ("AWS_LAMBDA_FUNCTION_NAME", name),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
            ("AWS_LAMBDA_LOG_STREAM_NAME", "bench"),
            ("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench"),
        ] {
            env.push((k.to_string(), v.to_string()));
        }
        let payload = std::fs::read(root.join("events").join(event))?;
        let mut runs = Vec::new();
        for _ in 0..COLD_STARTS {
            runs.push(cold_start::measure(&root.join("target/release").join(name), &env, payload.clone()).await?);
        }
        let median = |f: fn(&cold_start::ColdStart) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        out.push((
            name,
            cold_start::ColdStart {
                init_ms: median(|c| c.init_ms),
                first_response_ms: median(|c| c.first_response_ms),
                peak_rss_mb: median(|c| c.peak_rss_mb),
                outcome: runs.iter().find(|c| c.outcome != "ok").map_or("ok".into(), |c| c.outcome.clone()),
            },
        ));
    }
    Ok(out)
}

#[tokio::main]
async fn main() -> Result<()> {
    let events: usize = std::env::var("BENCH_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if std::env::args().nth(1).as_deref() == Some("capacity") {
        return write_capacity(&root);
    }
    let emulator = Emulator::start_on_free_port(&moto_server(&root))?;
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(&emulator.endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .load()
        .await;
    let machine = format!("{} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let dir = root.join("bench");
    std::fs::create_dir_all(&dir)?;
    if std::env::var("BENCH_ONLY").as_deref() == Ok("privacy") {
        let (sealed, _) = bench_privacy(&root, &sdk, events, (&date, &machine)).await?;
        let path = dir.join("results.json");
        let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        json["encryption"] = encryption_json(&sealed, &date, &machine);
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
        println!(
            "wrote bench/privacy.md and results.json's encryption (BENCH_ONLY=privacy: the other stages were not run)"
        );
        return Ok(());
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("latency") {
        let (latency, subscription, md) = latency::run(&root, &emulator, (&date, &machine)).await?;
        std::fs::write(dir.join("latency.md"), &md)?;
        // The other figures stay as the last full run left them; these are this run's.
        let path = dir.join("results.json");
        let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        json["latency"] = latency;
        json["subscription"] = subscription;
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
        println!("wrote bench/latency.md and results.json's latency and subscription (BENCH_ONLY=latency)");
        return write_capacity(&root);
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("archive") {
        let (archived, _) = bench_archive(&root, &sdk, events, (&date, &machine)).await?;
        // The other figures stay as the last full run left them; `archive` is this run's.
        let path = dir.join("results.json");
        let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        json["archive"] = archive_json(&archived, &date, &machine);
        std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
        println!(
            "wrote bench/archive.md and results.json's archive (BENCH_ONLY=archive: the other stages were not run)"
        );
        return write_capacity(&root);
    }
    // Entity streams first, on a moto of their own (moto copies a table per transaction).
    println!("== entity streams: appends across {} streams vs the raw transaction loop, loads, one hot stream", 100);
    let entity_emulator = Emulator::start_on_free_port(&moto_server(&root))?;
    let entity_sdk = sdk.to_builder().endpoint_url(&entity_emulator.endpoint).build();
    let entity = entity::run(&entity_sdk, &entity_emulator.endpoint).await?;
    drop(entity_emulator);
    let entity_md = entity::markdown(&entity, &date, &machine);
    print!("{entity_md}");
    std::fs::write(dir.join("entity.md"), &entity_md)?;
    if std::env::var("BENCH_ONLY").as_deref() == Ok("entity") {
        println!("wrote bench/entity.md (BENCH_ONLY=entity: the other stages were not run)");
        return Ok(());
    }
    let (archived, archive_md) = bench_archive(&root, &sdk, events, (&date, &machine)).await?;
    let (sealed, privacy_md) = bench_privacy(&root, &sdk, events, (&date, &machine)).await?;
    let node = root.join(".node/node_modules/.bin");
    let mut results = Vec::new();
    for size in [200, 1024, 3072, 4096] {
        println!("== {events} events of {size} B");
        let mut result = bench_payload(&sdk, &sdk, events, size).await?;
        if size == 200 {
            result.put_path = put_path_against_the_cap(&sdk, size).await?;
            for (format, eps) in &result.put_path {
                println!("   put path  {eps:>8.0} events/s on 1 shard paced at its limit, {format:?} records");
            }
        }
        // Fresh dynalite + kinesalite per size (kinesalite allows 10 shards an account).
        let dynalite =
            Emulator::start_node_on_free_port(&node.join("dynalite")).context("dynalite (make tools-node)")?;
        let kinesalite =
            Emulator::start_node_on_free_port(&node.join("kinesalite")).context("kinesalite (make tools-node)")?;
        let strict_dynamo = sdk.to_builder().endpoint_url(&dynalite.endpoint).build();
        let strict_kinesis = sdk.to_builder().endpoint_url(&kinesalite.endpoint).build();
        let strict = bench_payload(&strict_dynamo, &strict_kinesis, CAPACITY_EVENTS.min(events), size).await?;
        result.capacity = strict.capacity;
        if let Some(c) = &result.capacity {
            println!(
                "   capacity  {:.2} WCU/event ({:.2} uncompressed), {:.2} RCU/event, ${:.2} per million events",
                c.write_units_per_event,
                c.uncompressed_write_units_per_event,
                c.read_units_per_event,
                c.usd_per_million_events
            );
        }
        for s in &result.stages {
            println!(
                "   {:<9} {:>8.0} events/s = {:.2} x {}",
                s.stage, s.events_per_second, s.ratio_to_raw, s.raw_baseline
            );
        }
        results.push(result);
    }
    let (latency, subscription, latency_md) = latency::run(&root, &emulator, (&date, &machine)).await?;
    std::fs::write(dir.join("latency.md"), &latency_md)?;
    println!("== cold starts of the x86_64 release binaries under a Lambda runtime API ({COLD_STARTS} each)");
    let cold = cold_starts(&root, &sdk, &emulator.endpoint).await?;
    for (name, c) in &cold {
        println!(
            "   {name:<9} init {:.1} ms, first response {:.1} ms, peak RSS {:.1} MB ({})",
            c.init_ms, c.first_response_ms, c.peak_rss_mb, c.outcome
        );
    }
    let bootstraps: BTreeMap<&str, u64> = bootstrap_sizes().into_iter().collect();
    let json = serde_json::json!({
        "date": date, "machine": machine, "results": results, "arm64_bootstrap_bytes": bootstraps,
        "latency": latency, "subscription": subscription, "cold_starts": cold, "entity": entity,
        "archive": archive_json(&archived, &date, &machine),
        "encryption": encryption_json(&sealed, &date, &machine),
    });
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&json)?)?;
    let mut md = markdown(&results, &machine, &date);
    md.push_str(&latency_md);
    md.push_str(&format!(
        "\nCold start of each x86_64 release binary under a minimal Lambda runtime API (median of {COLD_STARTS}; \
         absolute times, so noisy on a shared machine):\n\n| function | init ms | first response ms | peak RSS MB | outcome |\n|---|---|---|---|---|\n"
    ));
    for (name, c) in &cold {
        md.push_str(&format!(
            "| {name} | {:.1} | {:.1} | {:.1} | {} |\n",
            c.init_ms, c.first_response_ms, c.peak_rss_mb, c.outcome
        ));
    }
    md.push('\n');
    md.push_str(&entity_md);
    md.push_str(&archive_md);
    md.push_str(&privacy_md);
    std::fs::write(dir.join("results.md"), md)?;
    println!("wrote bench/results.md and bench/results.json");
    write_capacity(&root)
}

/// The cold tier's figures on a moto of their own (bench/archive.md, and its part of the results).
async fn bench_archive(
    root: &std::path::Path,
    sdk: &aws_config::SdkConfig,
    events: usize,
    (date, machine): (&str, &str),
) -> Result<(archive::ArchiveBench, String)> {
    println!("== cold tier: a window replayed from DynamoDB and from the archive, archiving, storage cost");
    let emulator = Emulator::start_on_free_port(&moto_server(root))?;
    let archive_sdk = sdk.to_builder().endpoint_url(&emulator.endpoint).build();
    let archived = archive::run(&archive_sdk, events, 1024).await?;
    let md = archive::markdown(&archived, date, machine);
    print!("{md}");
    std::fs::write(root.join("bench/archive.md"), &md)?;
    Ok((archived, md))
}

/// Per-subject encryption's figures on a moto of their own (bench/privacy.md, and its part of the results).
async fn bench_privacy(
    root: &std::path::Path,
    sdk: &aws_config::SdkConfig,
    events: usize,
    (date, machine): (&str, &str),
) -> Result<(privacy::PrivacyBench, String)> {
    println!("== per-subject encryption: load, pump and playback with every event sealed and with none");
    let emulator = Emulator::start_on_free_port(&moto_server(root))?;
    let privacy_sdk = sdk.to_builder().endpoint_url(&emulator.endpoint).build();
    let sealed = privacy::run(root, &privacy_sdk, events, 1024).await?;
    let md = privacy::markdown(&sealed, date, machine);
    print!("{md}");
    std::fs::write(root.join("bench/privacy.md"), &md)?;
    Ok((sealed, md))
}

/// `encryption` in results.json: the figures, and the target's ratio at its top.
fn encryption_json(sealed: &privacy::PrivacyBench, date: &str, machine: &str) -> serde_json::Value {
    serde_json::json!({
        "date": date, "machine": machine, "figures": sealed,
        "min_ratio_on_to_off": sealed.min_ratio_on_to_off,
        "kms_requests_per_million_events": sealed.kms_requests_per_million_events,
        "usd_per_million_events_added": sealed.usd_per_million_events_added,
    })
}

/// `archive` in results.json: the figures, and the two targets at its top.
fn archive_json(archived: &archive::ArchiveBench, date: &str, machine: &str) -> serde_json::Value {
    serde_json::json!({
        "date": date, "machine": machine, "figures": archived,
        "replay_ratio_archive_to_hot": archived.replay_ratio_archive_to_hot,
        "storage_cost_ratio_hot_to_tiered": archived.storage_cost_ratio_hot_to_tiered,
    })
}

/// docs/capacity.md from the results on disk.
fn write_capacity(root: &std::path::Path) -> Result<()> {
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("bench/results.json"))?)?;
    let md = capacity::render(&capacity::Measured::from_results(&results)?);
    std::fs::write(root.join("docs/capacity.md"), md)?;
    println!("wrote docs/capacity.md");
    Ok(())
}
