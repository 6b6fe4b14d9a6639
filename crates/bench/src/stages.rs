//! The stages per payload size on moto against raw loops of the same work, then their capacity units.

mod payload_run;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, Result};
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::types::AttributeValue;
use event_store::chunk::ChunkEvent;
use event_store::log::RecordFormat;
use event_store_emulator::Emulator;
use serde::Serialize;

use self::payload_run::PayloadRun;
use crate::measure::PUMP_BATCH;
use crate::put_path::put_path_against_the_cap;
use crate::tracking::{base64, payload};
use crate::units::Capacity;

/// Events per payload size for the capacity pass on dynalite (which, unlike
/// moto, reports consumed capacity as DynamoDB computes it).
const CAPACITY_EVENTS: usize = 2000;
/// The event source of the pump's batches.
const ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/bench";

/// A DynamoDB item, as the raw loops write it.
type Item = HashMap<String, AttributeValue>;

#[derive(Debug, Serialize)]
pub(crate) struct StageResult {
    pub(crate) stage: &'static str,
    pub(crate) events_per_second: f64,
    pub(crate) raw_baseline: &'static str,
    pub(crate) raw_events_per_second: f64,
    pub(crate) ratio_to_raw: f64,
    pub(crate) requests_per_event: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PayloadResult {
    pub(crate) payload_bytes: usize,
    pub(crate) events: usize,
    pub(crate) stages: Vec<StageResult>,
    /// Playback's Kinesis records per played event (aggregated records carry many).
    pub(crate) playback_records_per_event: f64,
    /// A one-partition subscription catching up over the same events onto a
    /// Kinesis target: its events/s over playback's, in the same run (target >= 0.8).
    pub(crate) subscription_to_playback: f64,
    /// Playback's put path alone on one paced shard, events/s by record format (200 B only).
    pub(crate) put_path: Vec<(RecordFormat, f64)>,
    pub(crate) capacity: Option<Capacity>,
}

/// Every payload size: the stages on the bench's moto (and the put path at
/// 200 B), then their capacity units on a fresh dynalite + kinesalite; each
/// size printed as it ends.
pub(crate) async fn every_size(root: &Path, sdk: &aws_config::SdkConfig, events: usize) -> Result<Vec<PayloadResult>> {
    let node = root.join(".node/node_modules/.bin");
    let mut results = Vec::new();
    for size in [200, 1024, 3072, 4096] {
        println!("== {events} events of {size} B");
        let mut result = bench_payload(sdk, sdk, events, size).await?;
        if size == 200 {
            result.put_path = put_path_against_the_cap(sdk, size).await?;
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
        print_figures(&result);
        results.push(result);
    }
    Ok(results)
}

/// A size's capacity units and its stages against their raw loops, as the run prints them.
fn print_figures(result: &PayloadResult) {
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
}

/// One payload size: the inputs built beforehand, the raw loops and the
/// stages timed, and the capacity units the stages used.
async fn bench_payload(
    dynamo_sdk: &aws_config::SdkConfig,
    kinesis_sdk: &aws_config::SdkConfig,
    events: usize,
    size: usize,
) -> Result<PayloadResult> {
    let mut run = PayloadRun::start(dynamo_sdk, kinesis_sdk, events, size).await?;

    // pump: Lambda-shaped batches of the template's size, as many in flight as the raw loop.
    let records: Vec<_> = (0..events).map(|i| (i, payload(i, size))).collect();
    let batches = pump_batches(&records, run.t0)?;

    // The raw baselines first, on their own tables: the same items and records, tight loops.
    let now = event_store::time::now_ms();
    let batch_events = chunk_events(&batches)?;
    let buffer_items = buffer_items(&batch_events, now)?;
    let slots: Vec<i64> = {
        let set: std::collections::BTreeSet<i64> = (0..events as i64).map(|i| (run.t0 + i) / 1000 * 1000).collect();
        set.into_iter().collect()
    };

    run.pump(&batches, &buffer_items).await?;
    let (raw_scan, raw_playback) = run.raw_scan_and_playback(now, slots).await?;
    run.scan(raw_scan).await?;
    let (playback_eps, playback_records_per_event) = run.playback(raw_playback).await?;
    let subscription_eps = run.subscription(dynamo_sdk, raw_playback).await?;
    let capacity = run.capacity(size, &records, &batch_events).await?;
    Ok(PayloadResult {
        payload_bytes: size,
        events,
        stages: run.stages,
        playback_records_per_event,
        subscription_to_playback: subscription_eps / playback_eps,
        put_path: Vec::new(),
        capacity: Some(capacity),
    })
}

/// The records as the pump's Kinesis events: each batch from its own shard,
/// as Lambda runs them concurrently (one batch per shard at a time).
fn pump_batches(records: &[(usize, Vec<u8>)], t0: i64) -> Result<Vec<KinesisEvent>> {
    let batches = records
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
                        "eventID": format!("shardId-bench{batch:07}:{sequence}"), "eventSourceARN": ARN,
                    })
                })
                .collect();
            event_store::pump::parse_kinesis_event(serde_json::json!({ "Records": json }))
        })
        .collect::<event_store::Result<Vec<_>>>()?;
    Ok(batches)
}

/// The pump's own chunks of each batch (one shard each), as it writes them.
fn chunk_events(batches: &[KinesisEvent]) -> Result<Vec<Vec<ChunkEvent>>> {
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
    Ok(batch_events)
}

/// The buffer items the pump writes for those chunks: the raw pump loop's items.
fn buffer_items(batch_events: &[Vec<ChunkEvent>], now: i64) -> Result<Vec<Item>> {
    let mut buffer_items = Vec::new();
    for events in batch_events.iter().cloned() {
        let (chunks, failed) = event_store::pump::buffer_chunks(ARN, events, 1000, now);
        anyhow::ensure!(failed.is_empty(), "records not packed");
        buffer_items.extend(chunks.into_iter().map(|(item, _)| item.to_item()));
    }
    Ok(buffer_items)
}
