//! `make bench`: every stage against a local moto_server, with the
//! emulator's own raw capacity measured in the same run by a tight client
//! loop, so the figures are ratios that hold on a noisy machine.
//!
//! Per payload size: throughput per stage on moto and its ratio to the raw
//! batch APIs, AWS requests per event by operation; DynamoDB capacity units
//! per event on dynalite (moto reports a constant) with and without
//! compression, and $ per million events; the arm64 bootstrap sizes.

use anyhow::Result;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;
use event_store_emulator::{moto_server, Emulator};

mod archive;
mod capacity;
mod cleanup;
mod cold_start;
mod delivery;
mod entity;
mod latency;
mod measure;
mod privacy;
mod projection;
mod put_path;
mod raw;
mod results;
mod sections;
mod stages;
mod trace_cost;
mod tracking;
mod units;

#[tokio::main]
async fn main() -> Result<()> {
    let events: usize = std::env::var("BENCH_EVENTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if std::env::args().nth(1).as_deref() == Some("capacity") {
        return results::write_capacity(&root);
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
    let run = sections::Run { root: &root, sdk: &sdk, emulator: &emulator, events, date: &date, machine: &machine };
    std::fs::create_dir_all(run.dir())?;
    // BENCH_ONLY runs one section alone; anything else, or nothing, the full run.
    let only = std::env::var("BENCH_ONLY").ok();
    match only.as_deref() {
        Some("privacy") => sections::only_privacy(&run).await,
        Some("latency") => sections::only_latency(&run).await,
        Some("archive") => sections::only_archive(&run).await,
        Some("entity") => sections::only_entity(&run).await,
        Some("delivery") => sections::only_delivery(&run).await,
        Some("projection") => sections::only_projection(&run).await,
        Some("trace") => sections::only_trace(&run),
        _ => sections::full(&run).await,
    }
}
