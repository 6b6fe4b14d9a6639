//! `docs/capacity.md`: what the store needs, and costs, at 1,000, 100,000 and
//! 1,000,000 events of 1 KB a second. Rendered from this run's measurements
//! in `bench/results.json` (write and read units, stored bytes per event,
//! packing speed) and the AWS limits and prices below; the write pattern of
//! the scan onto the event table's partitions is simulated, not assumed.
//!
//! `make bench` writes it after each run; `event-store-bench capacity`
//! renders it again from the results on disk, and a unit test keeps the file
//! equal to what this module renders.
//!
//! Its parts: the prices, limits and defaults it plans with (`prices`), what
//! a rate needs (`plan`) and costs (`cost`), the two tables (`tables`), and
//! the sections on keeping delivery within seconds (`in_seconds`) and on the
//! cold tier (`cold_tier`).

mod cold_tier;
mod cost;
mod in_seconds;
mod plan;
mod prices;
mod tables;

use anyhow::{Context, Result};

use self::cold_tier::cold_tier;
use self::cost::{cost, Cost};
use self::in_seconds::in_seconds;
use self::plan::{plan, Plan};
use self::prices::{PRICES_READ, UTILISATION};

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
    /// Delivery's figures (`delivery` in bench/results.json), once measured.
    pub delivery: Option<Delivery>,
}

/// What `make bench-delivery` measured on a log cut into slices.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub date: String,
    pub slices: u64,
    /// Pump and scan's write units per 1 KB event, the log cut into `slices`.
    pub write_units_cut: f64,
    /// One subscription's read units per delivered event, the most of 1 to 256 partitions.
    pub read_units_per_event: f64,
}

impl Delivery {
    fn from_results(results: &serde_json::Value) -> Option<Self> {
        let figures = &results["delivery"]["figures"];
        let slices = figures["slices"].as_u64()?;
        let cut = figures["write_units_per_event_by_slices"].as_array()?.iter().find(|w| w["slices"] == slices)?;
        let reads = figures["read_units_per_event_by_partitions"].as_object()?;
        Some(Self {
            date: results["delivery"]["date"].as_str().unwrap_or("?").to_owned(),
            slices,
            write_units_cut: cut["write_units_per_event"].as_f64()?,
            read_units_per_event: reads.values().filter_map(serde_json::Value::as_f64).fold(0.0, f64::max),
        })
        .filter(|d| d.read_units_per_event > 0.0)
    }
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
            delivery: Delivery::from_results(results),
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

const RATES: [f64; 3] = [1e3, 1e5, 1e6];

pub fn render(m: &Measured) -> String {
    let plans: Vec<Plan> = RATES.iter().map(|r| plan(*r, m)).collect();
    let costs: Vec<Cost> = plans.iter().map(|p| cost(p, m)).collect();
    let header = tables::header(&plans);
    let mut md = intro(m);
    md.push_str(&header);
    md.push_str(&tables::need_rows(&plans));
    md.push_str(&format!("\n## What it costs, $ per million 1 KB events\n\n{header}"));
    md.push_str(&tables::cost_rows(&plans, &costs));
    if let Some((idle, date)) = &m.idle_requests_per_minute {
        md.push_str(&in_seconds(idle, date));
    }
    if let Some(archive) = &m.archive {
        md.push_str(&cold_tier(archive));
    }
    md.push_str(NOTES);
    md
}

/// The title, and the measurements, limits and prices the figures come from.
fn intro(m: &Measured) -> String {
    format!(
        "# Capacity and cost\n\n\
         Generated by `event-store-bench capacity` (crates/bench/src/capacity.rs) from the measurements of \
         `make bench` on {date} (bench/results.json, 1 KB events: {w:.3} write units, {r:.3} read units and {s:.0} \
         stored bytes per event, packing at {pack:.0} MB/s on one core) and AWS's limits and prices (us-east-1, \
         list prices read {PRICES_READ} from stored copies of the AWS pricing pages; check them before you plan). \
         Figures marked *assumed* were not measured: there is no AWS account behind this repository.{delivery}\n\n\
         Every limit is planned at {util:.0} % of itself.\n\n## What each rate needs\n\n",
        date = m.date,
        w = m.write_units_per_event,
        r = m.read_units_per_event,
        s = m.stored_bytes_per_event,
        pack = m.pack_mb_per_second,
        util = UTILISATION * 100.0,
        delivery = m.delivery.as_ref().map_or(String::new(), |d| format!(
            " Delivery from `make bench-delivery` on {} (bench/delivery.md): a log cut into {} slices, {:.3} write \
             units per event, and the most read units per delivered event of one subscription with 1 to 256 \
             partitions, {:.4}.",
            d.date, d.slices, d.write_units_cut, d.read_units_per_event
        )),
    )
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
  (slot, key) second. `Slices` is the number of keys it needs (or
  `SlotSubkeys` on a stack that does not cut slots); `ScanReservedConcurrency`
  must be at least `ScanSegments`.
- **Slices and readers.** With `Slices` above 1 the scan cuts each slot by key
  hash, each slice under a key of its own (docs/storage.md#slices): a slot's
  writes spread over the slices, and a subscription partition reads only the
  slices of its range of keys, so a subscription's read units per delivered
  event grow little with its partitions (measured: 1.18 times from 1 to 256
  partitions, each partition's own reads of the slot index; the row above is
  the most of them). A slice key carries a number of real-time
  subscriptions (3,000 read units a second each); more need more slices.
  Partitions go up to 1,024, a power of two at most the slices reading each
  slice once. A playback of one run and every reader of all keys read every
  slice. One run keeps one request in flight, so a playback onto many shards
  runs in parallel (`--parallel N`, docs/playback.md#parallel-runs), each run
  reading the slices of its range; past S runs, two runs share a slice and
  each reads it whole (read units x 2, small beside the time saved). Keep
  `Slices` at 1 while one key a slot takes the writes: cut, each slice's
  chunks are smaller and cost more write units per event.
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

    pub(super) fn measured() -> Measured {
        Measured {
            archive: None,
            delivery: None,
            idle_requests_per_minute: None,
            date: "test".into(),
            write_units_per_event: 0.5,
            read_units_per_event: 0.1,
            stored_bytes_per_event: 200.0,
            pack_mb_per_second: 50.0,
        }
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
