//! The cold tier's figures: the same window replayed from DynamoDB and from
//! the archive in one run (events/s, side by side), one archiver run's
//! throughput, and storage and archiving costs from the bytes each tier holds.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use event_store::archive::object::Bucket;
use event_store::archiver::Archiver;
use event_store::config::{ArchiveConfig, PlaybackConfig, PumpConfig, ScanConfig};
use event_store::log::tiers::Tiers;
use event_store::playback::Playback;
use event_store::pump::Pump;
use event_store::time::format_ms;
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::resources::{create_bucket, create_streams, create_tables, Names};
use event_store_emulator::runs::{self, deadline_in, run_scan};
use serde::Serialize;

use crate::measure::{per_second, PUMP_BATCH, STREAM_SHARDS, USD_PER_MILLION_RRU, USD_PER_MILLION_WRU};
use crate::tracking::{base64, payload};

/// S3 Standard and DynamoDB Standard storage, us-east-1, per GB-month, and
/// S3 requests per thousand (aws.amazon.com/s3/pricing, aws.amazon.com/dynamodb/pricing;
/// as of 2026-11, not re-read: no internet on this machine).
const USD_PER_GB_MONTH_DYNAMODB: f64 = 0.25;
const USD_PER_GB_MONTH_S3: f64 = 0.023;
const USD_PER_THOUSAND_PUT: f64 = 0.005;
const USD_PER_THOUSAND_GET: f64 = 0.0004;
/// Replays of each tier: the best is kept, as for the other stages.
const ROUNDS: usize = 2;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

#[derive(Debug, Serialize)]
pub struct ArchiveBench {
    pub events: usize,
    pub payload_bytes: usize,
    pub hot_replay_events_per_second: f64,
    pub archive_replay_events_per_second: f64,
    /// Target >= 1.0 (both are paced to the playback stream's write limit, so they meet at it).
    pub replay_ratio_archive_to_hot: f64,
    /// The window read alone (no puts), events/s: what each tier can feed.
    pub hot_read_events_per_second: f64,
    pub archive_read_events_per_second: f64,
    pub read_ratio_archive_to_hot: f64,
    pub archive_events_per_second: f64,
    pub objects: u64,
    /// Parquet bytes per event in S3, and the event table's bytes per event (items as DynamoDB sizes them).
    pub object_bytes_per_event: f64,
    pub dynamo_bytes_per_event: f64,
    pub storage_usd_per_million_events_month_hot: f64,
    pub storage_usd_per_million_events_month_tiered: f64,
    /// Target >= 8.
    pub storage_cost_ratio_hot_to_tiered: f64,
    /// Reading the items twice (archive, then the deletes' look), deleting them, and the S3 requests.
    pub usd_per_million_events_archived: f64,
}

pub async fn run(sdk: &aws_config::SdkConfig, events: usize, size: usize) -> Result<ArchiveBench> {
    let dynamo = aws_sdk_dynamodb::Client::new(sdk);
    let kinesis = aws_sdk_kinesis::Client::new(sdk);
    let names = Names::for_stack("bench-archive");
    create_tables(&dynamo, &names).await?;
    create_streams(&kinesis, &names, STREAM_SHARDS).await?;
    let bucket = Bucket::new(sdk, names.archive_bucket.clone());
    create_bucket(&bucket.s3, &bucket.name).await?;

    // A week ago, a millisecond apart, through the pump and the scan.
    let t0 = (event_store::time::now_ms() - 7 * 86_400_000) / 60_000 * 60_000;
    let record = |i: usize| (format!("user-{}", i % 50), payload(i, size));
    pump_and_scan(&dynamo, &kinesis, &names, (t0, events), &record).await?;
    let dynamo_bytes: usize = event_items(&dynamo, &names.event_table).await?;

    let window = serde_json::json!({"start": format_ms(t0), "end": format_ms(t0 + events as i64 + 1), "restart": true});
    let config = PlaybackConfig { deadline_margin: Duration::from_secs(30), ..runs::playback_config(&names) };
    let replay = |archive: Option<Bucket>| {
        let (config, window, dynamo, kinesis) = (config.clone(), window.clone(), dynamo.clone(), kinesis.clone());
        async move {
            let (invoker, _rx) = LocalInvoker::channel();
            let playback = Playback::new(dynamo, kinesis, config, Arc::new(invoker)).with_archive(archive);
            let mut best = 0.0f64;
            for _ in 0..ROUNDS {
                let started = Instant::now();
                let summary = playback.handle(window.clone(), SystemTime::now() + Duration::from_secs(900)).await?;
                anyhow::ensure!(summary.events == events, "played {} of {events}", summary.events);
                best = best.max(per_second(events, started.elapsed()));
            }
            Ok::<_, anyhow::Error>(best)
        }
    };
    let hot = replay(None).await?;
    let (start, end) = (t0, t0 + events as i64 + 1);
    let hot_read = read_all(&dynamo, &names.event_table, &|| Tiers::new(None), (start, end), events).await?;

    let mut archive = ArchiveConfig::for_names(names.event_table.clone(), bucket.name.clone())?;
    archive.hot_retention = Duration::from_millis(1);
    let archiver = Archiver { dynamo: dynamo.clone(), bucket: bucket.clone(), config: archive };
    let started = Instant::now();
    let summary = archiver.run(event_store::time::now_ms(), Instant::now() + Duration::from_secs(900)).await?;
    let archive_eps = per_second(events, started.elapsed());
    anyhow::ensure!(summary.events == events as u64 && !summary.more, "archived {summary:?}");
    let cold = replay(Some(bucket.clone())).await?;
    let cold_read =
        read_all(&dynamo, &names.event_table, &|| Tiers::new(Some(bucket.clone())), (start, end), events).await?;

    let per_event = |bytes: f64| bytes / events as f64;
    let (object_bytes, dynamo_bytes) = (per_event(summary.bytes as f64), per_event(dynamo_bytes as f64));
    let month = |bytes_per_event: f64, usd_per_gb: f64| bytes_per_event * 1e6 / GIB * usd_per_gb;
    let (hot_month, tiered_month) =
        (month(dynamo_bytes, USD_PER_GB_MONTH_DYNAMODB), month(object_bytes, USD_PER_GB_MONTH_S3));
    // Strongly consistent reads: a unit per 4 KB, twice; a delete: a unit per KB of the item.
    let units = |bytes: f64, per: f64| bytes / per;
    let archived_usd = units(dynamo_bytes, 4096.0) * 2.0 * USD_PER_MILLION_RRU
        + units(dynamo_bytes, 1024.0) * USD_PER_MILLION_WRU
        + summary.objects as f64 * 1e6 / events as f64 * (USD_PER_THOUSAND_PUT + USD_PER_THOUSAND_GET) / 1000.0;
    Ok(ArchiveBench {
        events,
        payload_bytes: size,
        hot_replay_events_per_second: hot,
        archive_replay_events_per_second: cold,
        replay_ratio_archive_to_hot: cold / hot,
        hot_read_events_per_second: hot_read,
        archive_read_events_per_second: cold_read,
        read_ratio_archive_to_hot: cold_read / hot_read,
        archive_events_per_second: archive_eps,
        objects: summary.objects,
        object_bytes_per_event: object_bytes,
        dynamo_bytes_per_event: dynamo_bytes,
        storage_usd_per_million_events_month_hot: hot_month,
        storage_usd_per_million_events_month_tiered: tiered_month,
        storage_cost_ratio_hot_to_tiered: hot_month / tiered_month,
        usd_per_million_events_archived: archived_usd,
    })
}

/// The events, from `t0` a millisecond apart, through the pump and the scan onto the event table.
pub(crate) async fn pump_and_scan(
    dynamo: &aws_sdk_dynamodb::Client,
    kinesis: &aws_sdk_kinesis::Client,
    names: &Names,
    (t0, events): (i64, usize),
    record: &dyn Fn(usize) -> (String, Vec<u8>),
) -> Result<()> {
    let arn = "arn:aws:kinesis:us-east-1:123456789012:stream/bench-events";
    let pump = Pump::new(dynamo.clone(), kinesis.clone(), PumpConfig::new(&names.buffer_table, &names.event_table));
    for (batch, chunk) in (0..events).collect::<Vec<_>>().chunks(PUMP_BATCH).enumerate() {
        let records: Vec<serde_json::Value> = chunk
            .iter()
            .map(|i| {
                let sequence = format!("4959{:052}", i + 1);
                let (key, data) = record(*i);
                serde_json::json!({
                    "kinesis": {"partitionKey": key, "sequenceNumber": sequence,
                                "data": base64(&data), "approximateArrivalTimestamp": (t0 + *i as i64) as f64 / 1000.0},
                    "eventID": format!("shardId-bench{batch:07}:{sequence}"), "eventSourceARN": arn,
                })
            })
            .collect();
        let event = event_store::pump::parse_kinesis_event(serde_json::json!({ "Records": records }))?;
        anyhow::ensure!(pump.handle(event).await.batch_item_failures.is_empty(), "pump failed");
    }
    let scan = ScanConfig { deadline_margin: Duration::from_secs(30), ..runs::scan_config(names) };
    let moved: usize =
        run_scan(dynamo.clone(), kinesis.clone(), scan, serde_json::json!({}), deadline_in(Duration::from_secs(900)))
            .await
            .into_iter()
            .map(|run| run.map(|s| s.moved).unwrap_or(0))
            .sum();
    anyhow::ensure!(moved == events, "scan moved {moved} of {events}");
    Ok(())
}

/// Reads the window as every reader does (best of the rounds), without putting anything anywhere: events/s.
pub(crate) async fn read_all(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    tiers: &dyn Fn() -> event_store::log::tiers::Tiers,
    (start, end): (i64, i64),
    events: usize,
) -> Result<f64> {
    use event_store::log::reader::Reader;
    let mut best = 0.0f64;
    for _ in 0..ROUNDS {
        let (slots, _) = event_store::bookkeeping::slot_index::read_index(dynamo, table, start, end).await?;
        let window = event_store::log::Window { start, end };
        let tiers = tiers();
        let reader = Reader {
            dynamo,
            table,
            time_unit_ms: 1000,
            page_items: None,
            dedupe_window_ms: 0,
            window: &window,
            keys: event_store::slices::KeyRange::ALL,
            tiers: &tiers,
        };
        let mut read = 0usize;
        let started = Instant::now();
        let mut recent = event_store::log::copies::RecentIds::new(0);
        let from = event_store::position::Checkpoint::at_slot(start / 1000 * 1000);
        reader
            .each_event(slots, from, &mut recent, |_, _, _| {
                read += 1;
                std::ops::ControlFlow::Continue(())
            })
            .await?;
        anyhow::ensure!(read == events, "read {read} of {events}");
        best = best.max(per_second(events, started.elapsed()));
    }
    Ok(best)
}

/// The event table's bytes (its items as DynamoDB sizes them; the bookkeeping partition left out).
async fn event_items(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<usize> {
    let (mut bytes, mut start) = (0, None);
    loop {
        let page = dynamo.scan().table_name(table).set_exclusive_start_key(start).send().await?;
        bytes += page
            .items()
            .iter()
            .filter(|i| i.get("slot").and_then(|v| v.as_n().ok()).is_some_and(|n| !n.starts_with('-')))
            .map(event_store::event_item::item_size)
            .sum::<usize>();
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(bytes);
        }
    }
}

pub fn markdown(bench: &ArchiveBench, date: &str, machine: &str) -> String {
    format!(
        "\n## Cold tier ({date}, {machine}, `make bench`; moto's DynamoDB, Kinesis and S3)\n\n\
         {} events of {} B, one window replayed onto Kinesis from each tier in the same run (best of {ROUNDS}):\n\n\
         | figure | value |\n|---|---|\n\
         | replay from DynamoDB | {:.0} events/s |\n\
         | replay from the archive (S3, Parquet) | {:.0} events/s |\n\
         | **archive / DynamoDB** (target >= 1.0; both paced to the stream's write limit) | **{:.2}** |\n\
         | the window read alone (no puts): DynamoDB / archive | {:.0} / {:.0} events/s ({:.2}x) |\n\
         | one archiver run | {:.0} events/s, {} objects |\n\
         | bytes per event: event table / Parquet | {:.0} / {:.0} |\n\
         | storage per million events a month: hot only / after HotRetentionDays | ${:.4} / ${:.4} |\n\
         | **hot / tiered storage cost** (target >= 8) | **{:.1}** |\n\
         | archiving a million events (reads, deletes, S3 requests) | ${:.2} |\n",
        bench.events,
        bench.payload_bytes,
        bench.hot_replay_events_per_second,
        bench.archive_replay_events_per_second,
        bench.replay_ratio_archive_to_hot,
        bench.hot_read_events_per_second,
        bench.archive_read_events_per_second,
        bench.read_ratio_archive_to_hot,
        bench.archive_events_per_second,
        bench.objects,
        bench.dynamo_bytes_per_event,
        bench.object_bytes_per_event,
        bench.storage_usd_per_million_events_month_hot,
        bench.storage_usd_per_million_events_month_tiered,
        bench.storage_cost_ratio_hot_to_tiered,
        bench.usd_per_million_events_archived,
    )
}
