//! What a run writes besides each section's page: results.json's parts, results.md, docs/capacity.md.

use std::path::Path;

use anyhow::Result;

use crate::measure::STREAM_SHARDS;
use crate::put_path::CAP_EVENTS;
use crate::stages::PayloadResult;
use crate::{archive, capacity, privacy};

/// `encryption` in results.json: the figures, and the target's ratio at its top.
pub(crate) fn encryption_json(sealed: &privacy::PrivacyBench, date: &str, machine: &str) -> serde_json::Value {
    serde_json::json!({
        "date": date, "machine": machine, "figures": sealed,
        "min_ratio_on_to_off": sealed.min_ratio_on_to_off,
        "kms_requests_per_million_events": sealed.kms_requests_per_million_events,
        "usd_per_million_events_added": sealed.usd_per_million_events_added,
    })
}

/// `archive` in results.json: the figures, and the two targets at its top.
pub(crate) fn archive_json(archived: &archive::ArchiveBench, date: &str, machine: &str) -> serde_json::Value {
    serde_json::json!({
        "date": date, "machine": machine, "figures": archived,
        "replay_ratio_archive_to_hot": archived.replay_ratio_archive_to_hot,
        "storage_cost_ratio_hot_to_tiered": archived.storage_cost_ratio_hot_to_tiered,
    })
}

/// Replaces `parts` of results.json at `path`, leaving the rest as the last full run wrote it.
pub(crate) fn replace_in_results(path: &Path, parts: Vec<(&str, serde_json::Value)>) -> Result<()> {
    let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path)?)?;
    for (key, value) in parts {
        json[key] = value;
    }
    std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
    Ok(())
}

/// docs/capacity.md from the results on disk.
pub(crate) fn write_capacity(root: &Path) -> Result<()> {
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("bench/results.json"))?)?;
    let md = capacity::render(&capacity::Measured::from_results(&results)?);
    std::fs::write(root.join("docs/capacity.md"), md)?;
    println!("wrote docs/capacity.md");
    Ok(())
}

/// bench/results.md's tables of the stages per payload size, their targets and the arm64 bootstrap sizes.
pub(crate) fn markdown(results: &[PayloadResult], machine: &str, date: &str) -> String {
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
pub(crate) fn bootstrap_sizes() -> Vec<(&'static str, u64)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/lambda");
    ["load", "pump", "scan", "playback", "subscriptions"]
        .into_iter()
        .filter_map(|name| Some((name, std::fs::metadata(root.join(name).join("bootstrap")).ok()?.len())))
        .collect()
}
