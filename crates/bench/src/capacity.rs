//! `docs/capacity.md`: what the store needs, and costs, at 1,000, 100,000 and
//! 1,000,000 events of 1 KB a second. Rendered from this run's measurements
//! in `bench/results.json` (write and read units, stored bytes per event,
//! packing speed) and the AWS limits and prices below; the write pattern of
//! the scan onto the event table's partitions is simulated, not assumed.
//!
//! `make bench` writes it after each run; `event-store-bench capacity`
//! renders it again from the results on disk, and a unit test keeps the file
//! equal to what this module renders.

use std::collections::HashMap;

use anyhow::{Context, Result};

/// Prices, us-east-1, on-demand list prices as read on the date below. The
/// machines that build this have no internet: they were read from stored
/// copies of the pages named, not live.
pub const PRICES_READ: &str = "2026-11-24";
/// aws.amazon.com/api-gateway/pricing: HTTP APIs, first 300 million requests a month (metered per 512 KB).
const HTTP_API_PER_MILLION: f64 = 1.00;
/// aws.amazon.com/lambda/pricing: requests, and arm64 duration per GB-second.
const LAMBDA_PER_MILLION_REQUESTS: f64 = 0.20;
const LAMBDA_ARM_PER_GB_SECOND: f64 = 0.000_013_333_4;
/// aws.amazon.com/kinesis/data-streams/pricing, provisioned mode: shard-hour,
/// PUT payload units (25 KB each), extended retention (24 h to 7 days) per
/// shard-hour, long-term retention (past 7 days) per GB-month.
const KINESIS_SHARD_HOUR: f64 = 0.015;
const KINESIS_PER_MILLION_PUT_UNITS: f64 = 0.014;
const KINESIS_EXTENDED_SHARD_HOUR: f64 = 0.02;
const KINESIS_LONG_TERM_GB_MONTH: f64 = 0.023;
/// aws.amazon.com/dynamodb/pricing/on-demand (since the 2024-11-01 reduction) and Standard storage.
const DYNAMO_PER_MILLION_WRU: f64 = 0.625;
const DYNAMO_PER_MILLION_RRU: f64 = 0.125;
const DYNAMO_GB_MONTH: f64 = 0.25;
/// aws.amazon.com/eventbridge/pricing: custom events per million (per 64 KB
/// chunk), archive processing per GB and archive storage per GB-month.
const EVENTBRIDGE_PER_MILLION: f64 = 1.00;
const EVENTBRIDGE_ARCHIVE_GB: f64 = 0.10;
const EVENTBRIDGE_ARCHIVE_GB_MONTH: f64 = 0.023;

/// AWS limits (docs/DESIGN.md): per Kinesis shard in, per DynamoDB partition.
const SHARD_RECORDS_PER_S: f64 = 1000.0;
const SHARD_BYTES_PER_S: f64 = 1_048_576.0;
const PARTITION_WCU: f64 = 1000.0;
const PARTITION_RCU: f64 = 3000.0;
/// Plan every limit at this share of it: headroom for bursts and uneven keys.
const UTILISATION: f64 = 0.8;
/// Lambda gives a function CPU in proportion to memory: one vCPU at 1,769 MB.
const MB_PER_VCPU: f64 = 1769.0;

/// The template's defaults the plan starts from.
const EVENT_BYTES: f64 = 1024.0;
const PUMP_BATCH: f64 = 500.0;
const PUMP_MEMORY_MB: f64 = 128.0;
/// The other functions' memory (the template's global default).
const MEMORY_MB: f64 = 128.0;
const TIME_UNIT_S: f64 = 1.0;
const SCAN_CYCLE_S: f64 = 60.0;
const MAX_SCAN_SEGMENTS: usize = 100;
const MAX_SUBSCRIPTION_PARTITIONS: usize = 64;

/// Assumed, not measured (no AWS account here): what one scan segment moves
/// (a 1 MB Scan page, its chunks written and deleted, about 200 ms), what one
/// DynamoDB batch write takes, and what one subscription runner or playback
/// delivers (decode, JSON, PutRecords of up to 5 MB; order per key keeps one
/// request in flight).
const SEGMENT_BYTES_PER_S: f64 = 5e6;
const WRITE_LATENCY_S: f64 = 0.025;
const RUNNER_RAW_BYTES_PER_S: f64 = 4e6;
/// A pixel hit's billed duration (assumed, too).
const PIXEL_SECONDS: f64 = 0.010;
/// An event-table chunk's attributes besides its data (keys, counts, times).
const CHUNK_OVERHEAD_BYTES: f64 = 200.0;

/// This run's figures for 1 KB events.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub date: String,
    pub write_units_per_event: f64,
    pub read_units_per_event: f64,
    pub stored_bytes_per_event: f64,
    pub pack_mb_per_second: f64,
    /// The cold tier's figures (`archive` in bench/results.json), once measured.
    pub archive: Option<serde_json::Value>,
    /// The local stack's own DynamoDB and Kinesis requests per minute while idle, by
    /// operation (`subscription.idle_requests_per_minute`), once measured.
    pub idle_requests_per_minute: Option<(std::collections::BTreeMap<String, f64>, String)>,
}

impl Measured {
    /// The 1 KB row of `bench/results.json`.
    pub fn from_results(results: &serde_json::Value) -> Result<Self> {
        let row = results["results"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["payload_bytes"] == 1024))
            .context("no 1 KB row in bench/results.json (run make bench)")?;
        let figure = |name: &str| {
            row["capacity"][name].as_f64().with_context(|| format!("capacity.{name} missing: run make bench"))
        };
        Ok(Self {
            date: results["date"].as_str().unwrap_or("?").to_string(),
            write_units_per_event: figure("write_units_per_event")?,
            read_units_per_event: figure("read_units_per_event")?,
            stored_bytes_per_event: figure("stored_bytes_per_event")?,
            pack_mb_per_second: figure("pack_mb_per_second")?,
            archive: results.get("archive").cloned(),
            idle_requests_per_minute: serde_json::from_value(
                results["subscription"]["idle_requests_per_minute"].clone(),
            )
            .ok()
            .map(|idle| {
                let date = results["subscription"]["date"].as_str().or(results["date"].as_str()).unwrap_or("?");
                (idle, date.to_string())
            }),
        })
    }
}

/// What one rate needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub events_per_s: f64,
    pub shards: usize,
    /// Pump invocations per shard per second, and the share of the shard's time they run.
    pub pump_invocations_per_shard_s: f64,
    pub pump_duty: f64,
    pub chunk_bytes: f64,
    pub scan_segments: usize,
    pub scan_pass_s: f64,
    /// Simulated peak write units a second on one event-table partition key, with K = 1 and the K chosen.
    pub peak_wcu_one_key: f64,
    pub subkeys: usize,
    pub peak_wcu: f64,
    pub buffer_wcu_s: f64,
    pub event_wcu_s: f64,
    /// Read units a second one real-time reader (playback, or one subscription partition) takes from one sub-key.
    pub reader_rcu_per_key: f64,
    /// Readers (subscription partitions, each reading the whole log) one sub-key carries at real time.
    pub readers_per_key: usize,
    pub subscription_partitions: usize,
    pub target_shards: usize,
    /// Peak Lambda concurrency: pump, scan, one subscription's runners, the pixel.
    pub concurrency: usize,
}

pub fn plan(events_per_s: f64, m: &Measured) -> Plan {
    let per_shard = (SHARD_RECORDS_PER_S.min(SHARD_BYTES_PER_S / EVENT_BYTES)) * UTILISATION;
    let shards = (events_per_s / per_shard).ceil() as usize;
    let shard_rate = events_per_s / shards as f64;
    // The event source mapping fills a batch or waits up to its 1 s window.
    let batch = PUMP_BATCH.min(shard_rate);
    let pump_invocations_per_shard_s = shard_rate / batch;
    let cpu_share = PUMP_MEMORY_MB / MB_PER_VCPU;
    let pack_s = batch * EVENT_BYTES / (m.pack_mb_per_second * 1e6 * cpu_share);
    let pump_duty = pump_invocations_per_shard_s * (pack_s + 2.0 * WRITE_LATENCY_S);
    let chunk_bytes = batch * m.stored_bytes_per_event + CHUNK_OVERHEAD_BYTES;

    let moved_per_s = events_per_s * m.stored_bytes_per_event;
    // Segments so that a pass takes at most half the cycle.
    let scan_segments = ((moved_per_s * 2.0 / SEGMENT_BYTES_PER_S).ceil() as usize).clamp(1, MAX_SCAN_SEGMENTS);
    let scan_pass_s = moved_per_s * SCAN_CYCLE_S / (scan_segments as f64 * SEGMENT_BYTES_PER_S);

    let pattern = Pattern { shards, shard_rate, batch, bytes_per_event: m.stored_bytes_per_event, scan_segments };
    let peak_wcu_one_key = pattern.peak_wcu(1);
    let mut subkeys = 1;
    let mut peak_wcu = peak_wcu_one_key;
    while peak_wcu > PARTITION_WCU * UTILISATION && subkeys < 1000 {
        subkeys = (subkeys * 2).min(1000);
        peak_wcu = pattern.peak_wcu(subkeys);
    }

    // Writes: the pump's put and the scan's delete on the buffer, the scan's put on the event table.
    let buffer_wcu_s = events_per_s * m.write_units_per_event * 2.0 / 3.0;
    let event_wcu_s = events_per_s * m.write_units_per_event / 3.0;
    // A strongly consistent read costs a unit per 4 KB; a real-time reader reads a second of log a second.
    let reader_rcu_per_key = moved_per_s / 4096.0 / subkeys as f64;
    let readers_per_key = (PARTITION_RCU * UTILISATION / reader_rcu_per_key).floor() as usize;
    let subscription_partitions = (events_per_s * EVENT_BYTES / RUNNER_RAW_BYTES_PER_S).ceil() as usize;
    let target_shards = (events_per_s * EVENT_BYTES / (SHARD_BYTES_PER_S * UTILISATION)).ceil() as usize;
    let pixel = (events_per_s * PIXEL_SECONDS).ceil() as usize;
    let pump = (shards as f64 * pump_duty.min(1.0)).ceil() as usize;
    let concurrency = pump + scan_segments + subscription_partitions.min(MAX_SUBSCRIPTION_PARTITIONS) + pixel;
    Plan {
        events_per_s,
        shards,
        pump_invocations_per_shard_s,
        pump_duty,
        chunk_bytes,
        scan_segments,
        scan_pass_s,
        peak_wcu_one_key,
        subkeys,
        peak_wcu,
        buffer_wcu_s,
        event_wcu_s,
        reader_rcu_per_key,
        readers_per_key,
        subscription_partitions,
        target_shards,
        concurrency,
    }
}

/// The scan's writes onto the event table, simulated: every shard's pump
/// batches of one cycle cut into chunks at slot boundaries, the chunks dealt
/// to segments as the hash of their buffer key deals them, each segment
/// writing its chunks in scan (hash) order at its speed, each chunk onto
/// `slot + hash(sort key) % K`.
struct Pattern {
    shards: usize,
    shard_rate: f64,
    batch: f64,
    bytes_per_event: f64,
    scan_segments: usize,
}

impl Pattern {
    /// The highest write units a second any one partition key takes.
    fn peak_wcu(&self, subkeys: usize) -> f64 {
        let mut rng = fastrand::Rng::with_seed(16);
        let batch_s = self.batch / self.shard_rate;
        let mut segments: Vec<Vec<(i64, f64)>> = vec![Vec::new(); self.scan_segments];
        for _ in 0..self.shards {
            let mut t = rng.f64() * batch_s;
            while t < SCAN_CYCLE_S {
                let end = t + batch_s;
                // One chunk per slot the batch touches, with that slot's share of its events.
                let mut from = t;
                while from < end {
                    let slot = (from / TIME_UNIT_S).floor();
                    let to = end.min((slot + 1.0) * TIME_UNIT_S);
                    let events = self.shard_rate * (to - from);
                    let bytes = events * self.bytes_per_event + CHUNK_OVERHEAD_BYTES;
                    segments[rng.usize(..self.scan_segments)].push((slot as i64, bytes));
                    from = to;
                }
                t = end;
            }
        }
        let mut load: HashMap<(i64, usize, i64), f64> = HashMap::new();
        for mut items in segments {
            rng.shuffle(&mut items);
            let mut clock = 0.0;
            for (slot, bytes) in items {
                clock += bytes / SEGMENT_BYTES_PER_S;
                let key = (slot, rng.usize(..subkeys), clock.floor() as i64);
                *load.entry(key).or_default() += (bytes / 1024.0).ceil();
            }
        }
        load.into_values().fold(0.0, f64::max)
    }
}

/// Dollars per million events, each line of the bill.
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    pub http_api: f64,
    pub lambda: f64,
    pub kinesis: f64,
    pub dynamodb: f64,
    /// Per month each million events is kept.
    pub storage_month: f64,
}

impl Cost {
    pub fn ingest(&self, function_url: bool) -> f64 {
        self.lambda + self.kinesis + self.dynamodb + if function_url { 0.0 } else { self.http_api }
    }
}

pub fn cost(p: &Plan, m: &Measured) -> Cost {
    let per_million = 1e6;
    let gb_s = |seconds: f64, mb: f64| seconds * mb / 1024.0 * LAMBDA_ARM_PER_GB_SECOND;
    // The pixel: one invocation of about 10 ms per hit; the pump: its duty per shard.
    let pixel = LAMBDA_PER_MILLION_REQUESTS + per_million * gb_s(PIXEL_SECONDS, MEMORY_MB);
    let pump_seconds_per_event = p.pump_duty / (p.events_per_s / p.shards as f64);
    let pump = LAMBDA_PER_MILLION_REQUESTS / (p.events_per_s / p.shards as f64 / p.pump_invocations_per_shard_s)
        + per_million * gb_s(pump_seconds_per_event, PUMP_MEMORY_MB);
    let scan_seconds_per_event = m.stored_bytes_per_event / SEGMENT_BYTES_PER_S;
    let scan = per_million * gb_s(scan_seconds_per_event, MEMORY_MB);
    let shard_hours_per_million = p.shards as f64 / p.events_per_s / 3600.0 * per_million;
    Cost {
        http_api: HTTP_API_PER_MILLION,
        lambda: pixel + pump + scan,
        kinesis: shard_hours_per_million * KINESIS_SHARD_HOUR + KINESIS_PER_MILLION_PUT_UNITS,
        dynamodb: m.write_units_per_event * DYNAMO_PER_MILLION_WRU + m.read_units_per_event * DYNAMO_PER_MILLION_RRU,
        storage_month: per_million * m.stored_bytes_per_event / 1e9 * DYNAMO_GB_MONTH,
    }
}

/// EventBridge custom events into an archive, and a Kinesis stream keeping a
/// year, for the same events, each behind the same HTTP API (a direct service
/// integration, no Lambda): (ingest $ per million, storage $ per million a month).
pub fn alternatives(p: &Plan) -> [(&'static str, f64, f64); 2] {
    let gb_per_million = 1e6 * EVENT_BYTES / 1e9;
    let eventbridge = (
        HTTP_API_PER_MILLION + EVENTBRIDGE_PER_MILLION + gb_per_million * EVENTBRIDGE_ARCHIVE_GB,
        gb_per_million * EVENTBRIDGE_ARCHIVE_GB_MONTH,
    );
    let shard_hours_per_million = p.shards as f64 / p.events_per_s / 3600.0 * 1e6;
    let kinesis = (
        HTTP_API_PER_MILLION
            + shard_hours_per_million * (KINESIS_SHARD_HOUR + KINESIS_EXTENDED_SHARD_HOUR)
            + KINESIS_PER_MILLION_PUT_UNITS,
        gb_per_million * KINESIS_LONG_TERM_GB_MONTH,
    );
    [
        ("EventBridge custom events + archive", eventbridge.0, eventbridge.1),
        ("Kinesis, 365-day retention", kinesis.0, kinesis.1),
    ]
}

const RATES: [f64; 3] = [1e3, 1e5, 1e6];

pub fn render(m: &Measured) -> String {
    let plans: Vec<Plan> = RATES.iter().map(|r| plan(*r, m)).collect();
    let costs: Vec<Cost> = plans.iter().map(|p| cost(p, m)).collect();
    let rate = |p: &Plan| thousands(p.events_per_s as u64);
    let header = format!(
        "| | {} |\n|---|---|---|---|\n",
        plans.iter().map(|p| format!("{} events/s", rate(p))).collect::<Vec<_>>().join(" | ")
    );
    let row = |name: &str, f: &dyn Fn(&Plan) -> String| {
        format!("| {name} | {} |\n", plans.iter().map(f).collect::<Vec<_>>().join(" | "))
    };
    let mut md = format!(
        "# Capacity and cost\n\n\
         Generated by `event-store-bench capacity` (crates/bench/src/capacity.rs) from the measurements of \
         `make bench` on {date} (bench/results.json, 1 KB events: {w:.3} write units, {r:.3} read units and {s:.0} \
         stored bytes per event, packing at {pack:.0} MB/s on one core) and AWS's limits and prices (us-east-1, \
         list prices read {PRICES_READ} from stored copies of the AWS pricing pages; check them before you plan). \
         Figures marked *assumed* were not measured: there is no AWS account behind this repository.\n\n\
         Every limit is planned at {util:.0} % of itself.\n\n## What each rate needs\n\n",
        date = m.date,
        w = m.write_units_per_event,
        r = m.read_units_per_event,
        s = m.stored_bytes_per_event,
        pack = m.pack_mb_per_second,
        util = UTILISATION * 100.0,
    );
    md.push_str(&header);
    md.push_str(&row("event stream shards (`EventShardCount`; 1,000 records and 1 MiB a second each)", &|p| {
        thousands(p.shards as u64)
    }));
    md.push_str(&row("pump invocations per shard a second (a batch of 500, or what the poll a second finds)", &|p| {
        format!("{:.2}", p.pump_invocations_per_shard_s)
    }));
    md.push_str(&row("pump busy share of each shard's time (128 MB; ParallelizationFactor 1)", &|p| {
        format!("{:.0} %", p.pump_duty * 100.0)
    }));
    md.push_str(&row("chunk size (a batch's events of one slot)", &|p| format!("{:.0} KB", p.chunk_bytes / 1024.0)));
    md.push_str(&row(
        "scan segments (`ScanSegments`; a minute's pass, the schedule's when no awake run passes, in half the minute, *assumed* 5 MB/s a segment)",
        &|p| thousands(p.scan_segments as u64),
    ));
    md.push_str(&row("scan pass", &|p| format!("{:.1} s", p.scan_pass_s)));
    md.push_str(&row("hottest event-table key with K = 1, write units/s (simulated)", &|p| {
        thousands(p.peak_wcu_one_key as u64)
    }));
    md.push_str(&row("slot sub-keys K (`SlotSubkeys`) for <= 800 write units/s a key", &|p| {
        thousands(p.subkeys as u64)
    }));
    md.push_str(&row("hottest key with that K, write units/s (simulated)", &|p| format!("{:.0}", p.peak_wcu)));
    md.push_str(&row("buffer table write units/s (put + delete)", &|p| thousands(p.buffer_wcu_s as u64)));
    md.push_str(&row("event table write units/s (average)", &|p| thousands(p.event_wcu_s as u64)));
    md.push_str(&row("one real-time reader's read units/s on one sub-key", &|p| {
        format!("{:.1}", p.reader_rcu_per_key)
    }));
    md.push_str(&row("real-time readers one sub-key carries (3,000 read units/s)", &|p| {
        thousands(p.readers_per_key as u64)
    }));
    md.push_str(&row("subscription partitions to keep up (*assumed* 4 MB/s of events a runner; at most 64)", &|p| {
        let n = p.subscription_partitions;
        if n > MAX_SUBSCRIPTION_PARTITIONS {
            format!("{n}: over 64, breaks")
        } else {
            n.to_string()
        }
    }));
    md.push_str(&row("playback or subscription target shards (aggregated records, 1 MiB/s each)", &|p| {
        thousands(p.target_shards as u64)
    }));
    md.push_str(&row("Lambda concurrency at peak (pump, scan, one subscription, pixel at ~10 ms)", &|p| {
        thousands(p.concurrency as u64)
    }));

    md.push_str(&format!("\n## What it costs, $ per million 1 KB events\n\n{header}"));
    let money = |name: &str, f: &dyn Fn(&Cost) -> f64| {
        format!("| {name} | {} |\n", costs.iter().map(|c| format!("{:.3}", f(c))).collect::<Vec<_>>().join(" | "))
    };
    md.push_str(&money("HTTP API (the pixel)", &|c| c.http_api));
    md.push_str(&money("Lambda (pixel, pump, scan; arm64)", &|c| c.lambda));
    md.push_str(&money("Kinesis event stream (shard-hours, PUT units)", &|c| c.kinesis));
    md.push_str(&money("DynamoDB writes and reads (measured units)", &|c| c.dynamodb));
    md.push_str(&money("**all-in, HTTP API**", &|c| c.ingest(false)));
    md.push_str(&money("**all-in, function URL** (`PixelFunctionUrl=on`)", &|c| c.ingest(true)));
    md.push_str(&money("storage, per month kept", &|c| c.storage_month));
    for (i, name) in [
        "**EventBridge custom events + archive**, HTTP API in front",
        "**Kinesis, 365-day retention**, HTTP API in front",
    ]
    .iter()
    .enumerate()
    {
        md.push_str(&format!(
            "| {name} | {} |\n",
            plans
                .iter()
                .map(|p| {
                    let a = alternatives(p)[i];
                    format!("{:.3} + {:.3}/month", a.1, a.2)
                })
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    if let Some((idle, date)) = &m.idle_requests_per_minute {
        md.push_str(&in_seconds(idle, date));
    }
    if let Some(archive) = &m.archive {
        md.push_str(&cold_tier(archive));
    }
    md.push_str(NOTES);
    md
}

/// Seconds in a month (730 hours, as AWS prices a month).
const MONTH_S: f64 = 730.0 * 3600.0;
/// The template's memory for the scan (the global default) and the subscriptions function.
const SCAN_MEMORY_MB: f64 = 128.0;
const SUBSCRIPTIONS_MEMORY_MB: f64 = 256.0;
/// The demo's subscription, which the idle figures were measured with.
const PARTITIONS: f64 = 4.0;
/// Awake passes a second (`scan::AWAKE_INTERVAL`, 500 ms) and runner polls a second (`SUBSCRIPTION_POLL_MS`, 250).
const PASSES_PER_S: f64 = 2.0;
const POLLS_PER_S: f64 = 4.0;
/// *Assumed* billed duration of a scheduled or forked invocation with little to do
/// (a segment pass, a tick, an idle runner's look): a few sequential requests.
const SHORT_INVOCATION_S: f64 = 0.3;
/// DynamoDB requests of one awake pass besides the events it moves, counted from the code
/// (scan/awake.rs, scan/mod.rs): writes (the lease renewal, the segment's claim, its end,
/// its part of the watermark), reads (the watermark, the passes, the shard positions, the
/// buffer's page, the watermark after); a tick's reads (the definitions and partitions, the
/// watermark); a following runner's round (the slot index read, the checkpoint written) and
/// its look at the subscription's state once a second.
const PASS_WRITES: f64 = 4.0;
const PASS_READS: f64 = 5.0;
const TICK_READS: f64 = 2.0;
const ROUND_WRITES: f64 = 1.0;
const ROUND_READS: f64 = 1.0;
const STATE_READS_PER_S: f64 = 1.0;
/// aws.amazon.com/cloudwatch/pricing: a custom metric a month, and log ingestion per GB;
/// *assumed* size of an embedded-metric log line.
const CLOUDWATCH_METRIC_MONTH: f64 = 0.30;
const CLOUDWATCH_LOGS_PER_GB: f64 = 0.50;
const EMF_LINE_BYTES: f64 = 350.0;

fn is_write(operation: &str) -> bool {
    ["PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"]
        .iter()
        .any(|w| operation.ends_with(w))
}

/// What keeping sealing and delivery in seconds costs a month: at idle (the
/// stack's requests measured while idle, the schedules' invocations), and the
/// fixed part while events come (the awake scan, its ticks, followers).
fn in_seconds(idle_per_minute: &std::collections::BTreeMap<String, f64>, date: &str) -> String {
    let gb_s = |seconds: f64, mb: f64| seconds * mb / 1024.0 * LAMBDA_ARM_PER_GB_SECOND;
    let requests = |n: f64| n / 1e6 * LAMBDA_PER_MILLION_REQUESTS;
    let minutes = MONTH_S / 60.0;
    // DynamoDB: small bookkeeping items, a unit a request (Kinesis reads are not billed per request).
    let dynamo_per_minute =
        |writes: f64, reads: f64| writes * DYNAMO_PER_MILLION_WRU / 1e6 + reads * DYNAMO_PER_MILLION_RRU / 1e6;
    let (writes, reads) = idle_per_minute
        .iter()
        .filter(|(op, _)| op.starts_with("DynamoDB."))
        .fold((0.0, 0.0), |(w, r), (op, n)| if is_write(op) { (w + n, r) } else { (w, r + n) });
    // Each minute: the scan's schedule and its segment's fork (128 MB), the tick and a runner's
    // look per partition (256 MB), each a short invocation.
    let (scan_invocations, subs_invocations) = (2.0, 1.0 + PARTITIONS);
    // Custom metrics: the watermark's lag, the largest subscription lag, and per subscription its
    // lag (written busy or idle) and its delivery latency (written only while events come).
    let idle_metrics = 3.0 * CLOUDWATCH_METRIC_MONTH;
    let metrics = 4.0 * CLOUDWATCH_METRIC_MONTH;
    let idle = [
        requests((scan_invocations + subs_invocations) * minutes),
        minutes
            * (scan_invocations * gb_s(SHORT_INVOCATION_S, SCAN_MEMORY_MB)
                + subs_invocations * gb_s(SHORT_INVOCATION_S, SUBSCRIPTIONS_MEMORY_MB)),
        minutes * dynamo_per_minute(writes, reads),
        idle_metrics,
    ];
    // While events come: one awake run (128 MB, all the time), a segment fork and a tick per pass,
    // a runner per partition following (256 MB, all the time), their requests.
    let per_s = |n: f64| n * MONTH_S;
    let busy = [
        requests(per_s(2.0 * PASSES_PER_S)),
        gb_s(MONTH_S, SCAN_MEMORY_MB)
            + per_s(PASSES_PER_S)
                * (gb_s(SHORT_INVOCATION_S, SCAN_MEMORY_MB) + gb_s(SHORT_INVOCATION_S, SUBSCRIPTIONS_MEMORY_MB))
            + PARTITIONS * gb_s(MONTH_S, SUBSCRIPTIONS_MEMORY_MB),
        per_s(1.0 / 60.0)
            * dynamo_per_minute(
                60.0 * PASSES_PER_S * (PASS_WRITES + PARTITIONS * ROUND_WRITES),
                60.0 * (PASSES_PER_S * (PASS_READS + TICK_READS + PARTITIONS * ROUND_READS)
                    + PARTITIONS * (POLLS_PER_S + STATE_READS_PER_S)),
            ),
        // Embedded-metric lines: a pass's lag, a tick's two, a round's latency per partition.
        metrics + per_s(PASSES_PER_S * (1.0 + 2.0 + PARTITIONS)) * EMF_LINE_BYTES / 1e9 * CLOUDWATCH_LOGS_PER_GB,
    ];
    let total = |parts: &[f64; 4]| parts.iter().sum::<f64>();
    format!(
        "\n## Seconds, not a minute: what it costs\n\n\
         A deployed stack seals and delivers within seconds ([subscriptions.md](subscriptions.md#latency)): \
         the pump wakes the scan, which passes every half second while events come and starts the \
         subscriptions' tick; runners follow while events come. At idle nothing runs but the schedules: the \
         scan's and the tick's minute, whose runners look once and end. A month (730 h), one subscription of \
         {PARTITIONS} partitions, arm64:\n\n\
         | $ a month | idle | while events come (fixed, beside the per-event costs above) |\n|---|---|---|\n\
         | Lambda requests (idle: {idle_invocations:.0} a minute; busy: a segment pass and a tick per pass) | {:.2} | {:.2} |\n\
         | Lambda duration (idle: *assumed* {SHORT_INVOCATION_S} s each; busy: the awake run and {PARTITIONS} runners all the time) | {:.2} | {:.2} |\n\
         | DynamoDB bookkeeping requests (idle: measured, {writes:.1} writes and {reads:.1} reads a minute; busy: counted per pass, tick, round and poll) | {:.2} | {:.2} |\n\
         | CloudWatch (custom metrics: 3 idle, 4 busy; busy: the embedded-metric lines, *assumed* {EMF_LINE_BYTES} bytes each) | {:.2} | {:.2} |\n\
         | **total** (idle target: <= $5) | **{:.2}** | **{:.2}** |\n\n\
         Idle requests measured by `make bench` on {date} (the local stack with the template's settings, \
         between the idle probes, from 15 s after the last delivery; a unit a request, as bookkeeping items \
         are small); Kinesis reads are not billed per request, and the functions' own log lines are not \
         counted. Not included: the stack's standing costs, unchanged by any of this (each \
         provisioned shard ${shard:.2} a month, the alarms). While events come, the runners following (a \
         Lambda each, all the time) are most of the fixed part; a runner ends `SUBSCRIPTION_FOLLOW_SECONDS` \
         after the last event, so traffic with longer gaps pays a runner start per event instead.\n",
        idle[0],
        busy[0],
        idle[1],
        busy[1],
        idle[2],
        busy[2],
        idle[3],
        busy[3],
        total(&idle),
        total(&busy),
        idle_invocations = scan_invocations + subs_invocations,
        shard = KINESIS_SHARD_HOUR * 730.0,
    )
}

/// The cold tier's section: what keeping events costs once they move to S3.
fn cold_tier(archive: &serde_json::Value) -> String {
    let f = |name: &str| archive["figures"][name].as_f64().unwrap_or(f64::NAN);
    format!(
        "\n## Kept for good: the cold tier\n\n\
         Measured by `make bench` on {date} (bench/archive.md: {events} events of 1 KB, moto; prices as above, \
         S3 Standard $0.023 per GB-month). After `HotRetentionDays` events live in S3 as Parquet \
         ([storage.md](storage.md#cold-tier-s3)).\n\n\
         | per million 1 KB events | hot only (DynamoDB) | tiered (S3, after HotRetentionDays) |\n|---|---|---|\n\
         | bytes per event | {hot_bytes:.0} | {cold_bytes:.0} |\n\
         | storage, per month kept | ${hot:.4} | ${cold:.4} (**{ratio:.1}x** cheaper; target 8x) |\n\
         | replay onto Kinesis, events/s (same window, same run; paced to the stream's limit) | {hot_eps:.0} | {cold_eps:.0} (**{replay:.2}x**; target 1.0) |\n\
         | the window read alone, events/s | {hot_read:.0} | {cold_read:.0} ({read:.2}x) |\n\
         | archiving them once (item reads, deletes, S3 requests) | | ${archived:.2} |\n",
        date = archive["date"].as_str().unwrap_or("?"),
        events = f("events"),
        hot_bytes = f("dynamo_bytes_per_event"),
        cold_bytes = f("object_bytes_per_event"),
        hot = f("storage_usd_per_million_events_month_hot"),
        cold = f("storage_usd_per_million_events_month_tiered"),
        ratio = f("storage_cost_ratio_hot_to_tiered"),
        hot_eps = f("hot_replay_events_per_second"),
        cold_eps = f("archive_replay_events_per_second"),
        replay = f("replay_ratio_archive_to_hot"),
        hot_read = f("hot_read_events_per_second"),
        cold_read = f("archive_read_events_per_second"),
        read = f("read_ratio_archive_to_hot"),
        archived = f("usd_per_million_events_archived"),
    )
}

/// 1000000 as 1,000,000.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

const NOTES: &str = "
The alternatives (ingest + storage a month) have the same HTTP API in front,
integrated straight with the service (no Lambda); they store the event as
sent (1 KB), the store keeps it packed. Against the function URL, the store
costs less to ingest than EventBridge at every rate and stores events for
twice EventBridge's archive price per event-month (DynamoDB's $0.25 per GB
against $0.023, on a fifth of the bytes).
EventBridge bills a custom event per 64 KB and its archive per GB processed
and per GB-month; replaying it bills the replayed events as events again. A
Kinesis stream keeping a year pays extended retention per shard-hour for the
first week and long-term retention per GB-month after, and reading it back
pays retrieval per GB; the stream is not a table (no query by time other than
an iterator, no entity streams, no per-key index).

## How to read it, and where it breaks

- **Event stream and pump.** A shard takes 1,000 records a second: one record
  per hit, so shards grow with the rate. The pump runs one batch per shard at a
  time (ParallelizationFactor 1: the shard positions it keeps need one writer
  per shard); its busy share is what packing costs on 128 MB (Lambda gives
  1/14 of a vCPU there) plus two writes. Near 100 %, raise the pump's memory
  (CPU grows with it) before raising ParallelizationFactor.
- **Scan.** Moves the cycle's chunks. More segments shorten the pass but also
  make the writes onto each slot's key denser: the simulation deals a cycle's
  chunks to segments and times every write, then reports the hottest
  (slot, sub-key) second. `SlotSubkeys` is that K; `ScanReservedConcurrency`
  must be at least `ScanSegments`.
- **Readers.** Every playback and every subscription partition reads the whole
  log of a slot (a partition keeps the events whose key hashes to it), so read
  units grow with partitions; a sub-key carries a number of real-time readers
  (the row above) and K raises it. At the highest rate a single subscription
  needs more runners than its 64 partitions: that is where this design
  breaks. What would fix it: a runner reading only the sub-keys its keys hash
  to (the pump would have to cut chunks by key hash), or runners with more
  memory.
- **Quotas.** Kinesis allows 20,000 shards an account in us-east-1 (1,000 or
  6,000 elsewhere). DynamoDB on-demand tables are bounded by the account's
  table-level quota of 40,000 read and 40,000 write units a second: the buffer
  table passes it at 100,000 events a second, so raise the quota (and set warm
  throughput before a launch) first. Lambda's default concurrency is 1,000 a
  region.
- **The pixel's endpoint.** The HTTP API's $1.00 per million requests is the
  largest line at every rate. The function URL (`PixelFunctionUrl=on`) costs
  nothing per request beyond Lambda's own, and has no route throttling: its
  bound is the load function's reserved concurrency (`LoadReservedConcurrency`,
  default 100; the URL answers 429 beyond it, and beyond 10 requests a second
  per unit of concurrency), `MaxEventBytes` per event, and the event stream's
  shards (a put beyond them answers 429 with `Retry-After`). Behind the HTTP
  API instead, the default route rates keep ingest within one shard in records
  and bytes (`template.yaml`, beside the parameters); at 1,000 pixel hits a
  second raise `EventShardCount` and the rates together. No custom domain, WAF or access log
  without CloudFront in front.
";

#[cfg(test)]
mod tests {
    use super::*;

    fn measured() -> Measured {
        Measured {
            archive: None,
            idle_requests_per_minute: None,
            date: "test".into(),
            write_units_per_event: 0.5,
            read_units_per_event: 0.1,
            stored_bytes_per_event: 200.0,
            pack_mb_per_second: 50.0,
        }
    }

    #[test]
    fn shards_follow_the_record_limit_and_subkeys_grow_with_the_rate() {
        let m = measured();
        let [small, medium, large] = RATES.map(|r| plan(r, &m));
        assert_eq!((small.shards, medium.shards, large.shards), (2, 125, 1250));
        assert_eq!(small.subkeys, 1, "{small:?}");
        assert!(large.subkeys > 1 && large.peak_wcu <= 800.0, "{large:?}");
        assert!(large.peak_wcu_one_key > 1000.0, "one key a slot breaks at a million a second: {large:?}");
        assert!(medium.scan_segments < large.scan_segments);
    }

    #[test]
    fn more_subkeys_spread_the_same_writes() {
        let pattern =
            Pattern { shards: 100, shard_rate: 800.0, batch: 500.0, bytes_per_event: 200.0, scan_segments: 20 };
        let one = pattern.peak_wcu(1);
        let eight = pattern.peak_wcu(8);
        // The hottest of 8 keys a second is above an eighth of one key: whole chunks land at random.
        assert!(eight < one / 2.0, "K = 8 {eight}, K = 1 {one}");
    }

    #[test]
    fn the_function_url_takes_the_http_api_off_the_bill() {
        let m = measured();
        let c = cost(&plan(1e5, &m), &m);
        assert!((c.ingest(false) - c.ingest(true) - HTTP_API_PER_MILLION).abs() < 1e-9);
        assert!((c.dynamodb - (0.5 * 0.625 + 0.1 * 0.125)).abs() < 1e-9);
    }

    #[test]
    fn docs_capacity_md_is_what_the_results_on_disk_render() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let results: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(root.join("bench/results.json")).unwrap()).unwrap();
        let rendered = render(&Measured::from_results(&results).unwrap());
        let on_disk = std::fs::read_to_string(root.join("docs/capacity.md")).unwrap();
        assert!(on_disk == rendered, "docs/capacity.md is stale: run `cargo run -p event-store-bench -- capacity`");
    }
}
