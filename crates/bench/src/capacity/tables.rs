//! docs/capacity.md's two tables, a column per rate: what each rate needs, and what it costs.

use super::cost::{alternatives, Cost};
use super::plan::Plan;
use super::prices::MAX_SUBSCRIPTION_PARTITIONS;

/// The rates' header row, above both tables.
pub(super) fn header(plans: &[Plan]) -> String {
    let rate = |p: &Plan| thousands(p.events_per_s as u64);
    format!(
        "| | {} |\n|---|---|---|---|\n",
        plans.iter().map(|p| format!("{} events/s", rate(p))).collect::<Vec<_>>().join(" | ")
    )
}

/// What each rate needs, a row per figure.
pub(super) fn need_rows(plans: &[Plan]) -> String {
    let row = |name: &str, f: &dyn Fn(&Plan) -> String| {
        format!("| {name} | {} |\n", plans.iter().map(f).collect::<Vec<_>>().join(" | "))
    };
    let mut md = String::new();
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
    md.push_str(&row("hottest event-table key with one key a slot, write units/s (simulated)", &|p| {
        thousands(p.peak_wcu_one_key as u64)
    }));
    md.push_str(&row("slices S (`Slices`): <= 800 write units/s a key, and at least the partitions below", &|p| {
        thousands(p.slices as u64)
    }));
    md.push_str(&row("hottest key with those slices, write units/s (simulated)", &|p| format!("{:.0}", p.peak_wcu)));
    md.push_str(&row(
        "write units per event (pump + scan; measured not cut, and cut into 256 slices for any count above 1)",
        &|p| format!("{:.3}", p.write_units_per_event),
    ));
    md.push_str(&row("buffer table write units/s (put + delete)", &|p| thousands(p.buffer_wcu_s as u64)));
    md.push_str(&row("event table write units/s (average)", &|p| thousands(p.event_wcu_s as u64)));
    md.push_str(&row("read units per delivered event, one subscription, any partitions dividing S (measured)", &|p| {
        format!("{:.4}", p.read_units_per_delivered)
    }));
    md.push_str(&row("one real-time subscription's read units/s on one slice key", &|p| {
        format!("{:.1}", p.subscription_rcu_per_slice)
    }));
    md.push_str(&row("real-time subscriptions one slice key carries (3,000 read units/s)", &|p| {
        thousands(p.subscriptions_per_slice as u64)
    }));
    md.push_str(&row("subscription runners to keep up (*assumed* 4 MB/s of events a runner)", &|p| {
        thousands(p.subscription_runners as u64)
    }));
    md.push_str(&row("subscription partitions (a power of two; at most 1,024)", &|p| {
        let n = p.subscription_runners;
        if n > MAX_SUBSCRIPTION_PARTITIONS {
            format!("{n}: over 1,024, breaks")
        } else {
            thousands(p.subscription_partitions as u64)
        }
    }));
    md.push_str(&row("playback or subscription target shards (aggregated records, 1 MiB/s each)", &|p| {
        thousands(p.target_shards as u64)
    }));
    md.push_str(&row(
        "playback runs filling those shards (`--parallel`; a power of two, *assumed* 4 MB/s a run; past S, runs share slices)",
        &|p| thousands(p.playback_runs as u64),
    ));
    md.push_str(&row("one hour played back: those runs / one run", &|p| {
        format!("{} / {}", span(p.playback_hour_s), span(p.playback_hour_one_run_s))
    }));
    md.push_str(&row("Lambda concurrency at peak (pump, scan, one subscription, pixel at ~10 ms)", &|p| {
        thousands(p.concurrency as u64)
    }));
    md
}

/// What each rate costs, $ per million events: a row per line of the bill, then the alternatives.
pub(super) fn cost_rows(plans: &[Plan], costs: &[Cost]) -> String {
    let money = |name: &str, f: &dyn Fn(&Cost) -> f64| {
        format!("| {name} | {} |\n", costs.iter().map(|c| format!("{:.3}", f(c))).collect::<Vec<_>>().join(" | "))
    };
    let mut md = String::new();
    md.push_str(&money("HTTP API (the pixel)", &|c| c.http_api));
    md.push_str(&money("Lambda (pixel, pump, scan; arm64)", &|c| c.lambda));
    md.push_str(&money("Kinesis event stream (shard-hours, PUT units)", &|c| c.kinesis));
    md.push_str(&money("DynamoDB writes and reads (measured units)", &|c| c.dynamodb));
    md.push_str(&money("**all-in, HTTP API**", &|c| c.ingest(false)));
    md.push_str(&money("**all-in, function URL** (`PixelFunctionUrl=on`)", &|c| c.ingest(true)));
    md.push_str(&money("storage, per month kept", &|c| c.storage_month));
    md.push_str(&money(
        "one subscription, per million events delivered (reads, and runners at *assumed* 4 MB/s on 128 MB)",
        &|c| c.delivered_per_subscription,
    ));
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
    md
}

/// Seconds as minutes, hours or days, whichever reads best.
fn span(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7_200.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3_600.0),
        s => format!("{:.1} days", s / 86_400.0),
    }
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
