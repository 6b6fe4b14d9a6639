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

use anyhow::{Context, Result};
use aws_lambda_events::event::kinesis::KinesisEvent;
use event_store::bookkeeping::slot_index::read_index;
use event_store::config::{PumpConfig, ScanConfig};
use event_store::log::copies::RecentIds;
use event_store::log::reader::Reader;
use event_store::log::tiers::Tiers;
use event_store::log::Window;
use event_store::position::Checkpoint;
use event_store::pump::Pump;
use event_store::slices::KeyRange;
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_streams, create_tables, Names};
use event_store_emulator::runs::{self, deadline_in, run_scan};
use event_store_emulator::Emulator;
use futures::StreamExt;
use serde_json::{json, Value};
use std::path::Path;
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
    let batches = batches(t0)?;
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
    });
    Ok((out, md))
}

/// What one partition reads of the window: the slot index, then the slices
/// of its range; the events of its own keys (events of others it read, a
/// slice shared, are passed over as the runner passes them over).
async fn read_range(dynamo: &aws_sdk_dynamodb::Client, names: &Names, t0: i64, keys: KeyRange) -> Result<usize> {
    let (slots, _) = read_index(dynamo, &names.event_table, t0, t0 + 2_000).await?;
    let window = Window { start: t0, end: t0 + 2_000 };
    let tiers = Tiers::new(None);
    let reader = Reader {
        dynamo,
        table: &names.event_table,
        time_unit_ms: 1000,
        page_items: None,
        dedupe_window_ms: 0,
        window: &window,
        keys,
        tiers: &tiers,
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

/// The events as the pump's event source hands them over: [`PUMP_BATCH`]
/// records of one shard each, the shards round robin, all within one second.
fn batches(t0: i64) -> Result<Vec<KinesisEvent>> {
    let mut batches = Vec::new();
    let per_shard: Vec<Vec<usize>> =
        (0..SHARDS).map(|shard| (0..EVENTS).filter(|i| i % SHARDS == shard).collect()).collect();
    for (shard, events) in per_shard.iter().enumerate() {
        for chunk in events.chunks(PUMP_BATCH) {
            let records: Vec<Value> = chunk
                .iter()
                .map(|&i| {
                    let sequence = format!("4959{:052}", i + 1);
                    json!({
                        "kinesis": {"partitionKey": format!("user-{}", i % KEYS), "sequenceNumber": sequence,
                                    "data": base64(&payload(i, SIZE)),
                                    "approximateArrivalTimestamp": (t0 + (i * 900 / EVENTS) as i64) as f64 / 1000.0},
                        "eventID": format!("shardId-{shard:012}:{sequence}"), "eventSourceARN": ARN,
                    })
                })
                .collect();
            batches.push(event_store::pump::parse_kinesis_event(json!({ "Records": records }))?);
        }
    }
    Ok(batches)
}
