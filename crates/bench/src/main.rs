//! `make bench`: every stage against a local moto_server, with the
//! emulator's own raw capacity measured in the same run by a tight client
//! loop, so the figures are ratios that hold on a noisy machine.
//!
//! First cut for issue #6: throughput per stage and its ratio to the raw
//! batch APIs, and AWS requests per event by operation. Still to come:
//! consumed capacity and $ per million events, pixel-to-table latency,
//! bootstrap size, init time and RSS, payload compression.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use event_store::config::{PlaybackConfig, PumpConfig, ScanConfig};
use event_store::invoke::{run_until_idle, LocalInvoker};
use event_store::metrics::RequestCounter;
use event_store::playback::Playback;
use event_store::pump::Pump;
use event_store::resources::{create_streams, create_tables, Names};
use event_store::scan::Scan;
use event_store::time::format_ms;
use event_store_emulator::{moto_server, Emulator};
use futures::StreamExt;
use serde::Serialize;

/// In-flight requests for the raw loops and the stages alike.
const CONCURRENCY: usize = 8;
/// Records per pump invocation (the template's batch size).
const PUMP_BATCH: usize = 100;
/// Arrival time of the first synthetic event.
const T0: i64 = 1_795_240_724_000;

#[derive(Debug, Serialize)]
struct StageResult {
    stage: &'static str,
    events_per_second: f64,
    raw_baseline: &'static str,
    ratio_to_raw: f64,
    requests_per_event: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
struct PayloadResult {
    payload_bytes: usize,
    events: usize,
    raw_batch_write_items_per_second: f64,
    raw_put_records_per_second: f64,
    stages: Vec<StageResult>,
}

fn payload(n: usize, size: usize) -> Vec<u8> {
    let head = format!("{{\"n\":{n},\"EntityId\":\"user-{}\",\"pad\":\"", n % 50);
    let pad = size.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad)).into_bytes()
}

fn per_second(n: usize, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}

fn per_event(counter: &RequestCounter, events: usize) -> BTreeMap<String, f64> {
    counter.snapshot().into_iter().map(|(op, n)| (op, n as f64 / events as f64)).collect()
}

/// The emulator's raw `BatchWriteItem` capacity: items/s from a tight loop.
async fn raw_batch_write(dynamo: &aws_sdk_dynamodb::Client, table: &str, events: usize, size: usize) -> Result<f64> {
    let started = Instant::now();
    let batches: Vec<Vec<WriteRequest>> = (0..events)
        .collect::<Vec<_>>()
        .chunks(25)
        .map(|chunk| {
            chunk
                .iter()
                .filter_map(|&i| {
                    let item = [
                        ("id".to_string(), AttributeValue::S(format!("raw-{i}"))),
                        ("data".to_string(), AttributeValue::B(payload(i, size).into())),
                    ];
                    let put = PutRequest::builder().set_item(Some(item.into_iter().collect())).build().ok()?;
                    Some(WriteRequest::builder().put_request(put).build())
                })
                .collect()
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(batches)
        .map(|batch| dynamo.batch_write_item().request_items(table, batch).send())
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for result in results {
        result.context("raw BatchWriteItem")?;
    }
    Ok(per_second(events, started.elapsed()))
}

/// The emulator's raw `PutRecords` capacity: records/s from a tight loop.
async fn raw_put_records(kinesis: &aws_sdk_kinesis::Client, stream: &str, events: usize, size: usize) -> Result<f64> {
    let started = Instant::now();
    let batches: Vec<Vec<PutRecordsRequestEntry>> = (0..events)
        .collect::<Vec<_>>()
        .chunks(500)
        .map(|chunk| {
            chunk
                .iter()
                .filter_map(|&i| {
                    PutRecordsRequestEntry::builder()
                        .partition_key(format!("user-{}", i % 50))
                        .data(Blob::new(payload(i, size)))
                        .build()
                        .ok()
                })
                .collect()
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(batches)
        .map(|batch| kinesis.put_records().stream_name(stream).set_records(Some(batch)).send())
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for result in results {
        result.context("raw PutRecords")?;
    }
    Ok(per_second(events, started.elapsed()))
}

async fn bench_payload(sdk: &aws_config::SdkConfig, events: usize, size: usize) -> Result<PayloadResult> {
    let counter = RequestCounter::default();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk).interceptor(counter.clone()).build(),
    );
    let kinesis = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(sdk).interceptor(counter.clone()).build(),
    );
    let names = Names::for_stack(&format!("bench-{size}"));
    let raw = Names::for_stack(&format!("bench-raw-{size}"));
    for n in [&names, &raw] {
        create_tables(&dynamo, n).await?;
        create_streams(&kinesis, n, 2).await?;
    }
    let raw_writes = raw_batch_write(&dynamo, &raw.buffer_table, events, size).await?;
    let raw_puts = raw_put_records(&kinesis, &raw.event_stream, events, size).await?;
    let mut stages = Vec::new();
    let mut stage = |name: &'static str, eps: f64, baseline: &'static str, raw: f64, counter: &RequestCounter| {
        stages.push(StageResult {
            stage: name,
            events_per_second: eps,
            raw_baseline: baseline,
            ratio_to_raw: eps / raw,
            requests_per_event: per_event(counter, events),
        });
        counter.reset();
    };
    counter.reset();

    // pump: Lambda-shaped batches of 100, as many in flight as the raw loop.
    let records: Vec<_> = (0..events).map(|i| (i, payload(i, size))).collect();
    let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/bench";
    let batches: Vec<_> = records
        .chunks(PUMP_BATCH)
        .map(|chunk| {
            let json: Vec<serde_json::Value> = chunk
                .iter()
                .map(|(i, data)| {
                    let sequence = format!("4959{:052}", i + 1);
                    serde_json::json!({
                        "kinesis": {"partitionKey": format!("user-{}", i % 50), "sequenceNumber": sequence,
                                    "data": base64(data), "approximateArrivalTimestamp": (T0 + *i as i64) as f64 / 1000.0},
                        "eventID": format!("shardId-000000000000:{sequence}"), "eventSourceARN": arn,
                    })
                })
                .collect();
            event_store::pump::parse_event(serde_json::json!({ "Records": json }))
        })
        .collect::<event_store::Result<_>>()?;
    let pump = Pump::new(dynamo.clone(), PumpConfig { buffer_table: names.buffer_table.clone() });
    let started = Instant::now();
    let failures: usize = futures::stream::iter(batches)
        .map(|batch| pump.handle(batch))
        .buffer_unordered(CONCURRENCY)
        .map(|response| response.batch_item_failures.len())
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .sum();
    anyhow::ensure!(failures == 0, "pump failed {failures} records");
    stage("pump", per_second(events, started.elapsed()), "raw BatchWriteItem", raw_writes, &counter);

    // scan: one scheduled run and its forks.
    let config = ScanConfig {
        buffer_table: names.buffer_table.clone(),
        event_table: names.event_table.clone(),
        time_unit_ms: 1000,
        segments: 4,
        deadline_margin: Duration::from_secs(30),
        page_items: None,
        retention_days: None,
    };
    let (invoker, mut rx) = LocalInvoker::channel();
    let scan = Arc::new(Scan::new(dynamo.clone(), config, Arc::new(invoker.clone())));
    invoker.send(serde_json::json!({}))?;
    let started = Instant::now();
    let moved: usize = run_until_idle(&mut rx, move |p| {
        let scan = scan.clone();
        async move { scan.handle(p, SystemTime::now() + Duration::from_secs(900)).await.map(|s| s.moved).unwrap_or(0) }
    })
    .await
    .into_iter()
    .sum();
    anyhow::ensure!(moved == events, "scan moved {moved} of {events}");
    // Two BatchWriteItem per event (put + delete) against the raw loop's one.
    stage("scan", per_second(events, started.elapsed()), "raw BatchWriteItem / 2", raw_writes / 2.0, &counter);

    // playback: the whole window.
    let config = PlaybackConfig {
        event_table: names.event_table.clone(),
        playback_stream: names.playback_stream.clone(),
        time_unit_ms: 1000,
        deadline_margin: Duration::from_secs(30),
        page_items: None,
        max_window: Duration::from_secs(86_400),
    };
    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(dynamo.clone(), kinesis.clone(), config, Arc::new(invoker));
    let window = serde_json::json!({"start": format_ms(T0), "end": format_ms(T0 + events as i64 + 1)});
    let started = Instant::now();
    let summary = playback.handle(window, SystemTime::now() + Duration::from_secs(900)).await?;
    anyhow::ensure!(summary.events == events, "playback played {} of {events}", summary.events);
    stage("playback", per_second(events, started.elapsed()), "raw PutRecords", raw_puts, &counter);

    Ok(PayloadResult {
        payload_bytes: size,
        events,
        raw_batch_write_items_per_second: raw_writes,
        raw_put_records_per_second: raw_puts,
        stages,
    })
}

fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn markdown(results: &[PayloadResult], machine: &str, date: &str) -> String {
    let mut md = format!(
        "# Benchmark results\n\n{date}, {machine}. Local moto_server; every figure is a ratio to the emulator's raw \
         capacity measured in the same run (`make bench`).\n\n\
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
    md
}

#[tokio::main]
async fn main() -> Result<()> {
    let events: usize = std::env::var("BENCH_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let emulator = Emulator::start_on_free_port(&moto_server(&root))?;
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(&emulator.endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "bench"))
        .load()
        .await;
    let mut results = Vec::new();
    for size in [200, 1024, 4096] {
        println!("== {events} events of {size} B");
        let result = bench_payload(&sdk, events, size).await?;
        for s in &result.stages {
            println!(
                "   {:<9} {:>8.0} events/s = {:.2} x {}",
                s.stage, s.events_per_second, s.ratio_to_raw, s.raw_baseline
            );
        }
        results.push(result);
    }
    let machine = format!("{} cores", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0));
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let dir = root.join("bench");
    std::fs::create_dir_all(&dir)?;
    let json = serde_json::json!({ "date": date, "machine": machine, "results": results });
    std::fs::write(dir.join("results.json"), serde_json::to_string_pretty(&json)?)?;
    std::fs::write(dir.join("results.md"), markdown(&results, &machine, &date))?;
    println!("wrote bench/results.md and bench/results.json");
    Ok(())
}
