//! Latency as a deployment has it (`bench/latency.md`, `results.json`'s
//! `latency` and `subscription`): the real local stack (`event-store-local
//! demo`, release) with the template's settings and no local override, at a
//! steady pace, then single hits after idling. `BENCH_ONLY=latency` runs
//! this part alone.

use anyhow::{Context, Result};
use event_store_emulator::Emulator;
use serde_json::{json, Value};

/// Pixel hits a second in the latency run: a pace the emulator keeps up
/// with (moto serves every request on one Python core; saturated, it would
/// measure its own queue, not the pipeline's latency).
pub const DEMO_RATE: f64 = 40.0;
const DEMO_EVENTS: usize = 1200;
/// Arrival to delivery through a subscription at that steady rate, with the
/// template's defaults (issue 43's targets).
const P50_TARGET_MS: i64 = 1_500;
const P99_TARGET_MS: i64 = 3_000;
/// Single events after idling: probes, the quiet time before each (longer
/// than the scan's and the subscriptions' minute), and the p99 target.
const IDLE_PROBES: usize = 10;
const IDLE_SECONDS: u64 = 65;
const IDLE_TARGET_MS: i64 = 5_000;

/// Runs the demo and returns its report, the `subscription` figures and the markdown.
pub async fn run(
    root: &std::path::Path,
    emulator: &Emulator,
    (date, machine): (&str, &str),
) -> Result<(Value, Value, String)> {
    println!(
        "== latency: `event-store-local demo` at {DEMO_RATE} hits/s with the template's settings, then {IDLE_PROBES} probes after {IDLE_SECONDS} s idle each"
    );
    let report = root.join("target/bench-demo.json");
    let status = tokio::process::Command::new(root.join("target/release/event-store-local"))
        .args(["demo", "--events", &DEMO_EVENTS.to_string(), "--concurrency", "4", "--rate", &DEMO_RATE.to_string()])
        .args(["--idle-probes", &IDLE_PROBES.to_string(), "--idle-seconds", &IDLE_SECONDS.to_string()])
        .arg("--report-json")
        .arg(&report)
        // What a deployment runs: the template's settings, no local override.
        .env_remove("SCAN_INTERVAL")
        .env("EMULATOR_PORT", emulator.port.to_string())
        .env("PORT", event_store_emulator::free_port().to_string())
        .env("STAGE", "bench-demo")
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .context("running target/release/event-store-local (cargo build --release first)")?;
    anyhow::ensure!(status.success(), "the demo failed");
    let latency: Value = serde_json::from_slice(&std::fs::read(&report)?)?;
    println!("   {latency}");
    let subscription = json!({
        "date": date,
        "latency_p50_ms": latency["subscription_latency_p50_ms"],
        "latency_p99_ms": latency["subscription_latency_p99_ms"],
        "latency_p50_target_ms": P50_TARGET_MS,
        "latency_target_ms": P99_TARGET_MS,
        "sealing_p50_ms": latency["subscription_sealing_p50_ms"],
        "sealing_p99_ms": latency["subscription_sealing_p99_ms"],
        "delivering_p50_ms": latency["subscription_delivering_p50_ms"],
        "delivering_p99_ms": latency["subscription_delivering_p99_ms"],
        "idle_latencies_ms": latency["subscription_idle_latencies_ms"],
        "idle_latency_p99_ms": latency["subscription_idle_latency_p99_ms"],
        "idle_latency_target_ms": IDLE_TARGET_MS,
        "idle_requests_per_minute": latency["idle_requests_per_minute"],
    });
    let md = markdown(&latency, &subscription, date, machine);
    Ok((latency, subscription, md))
}

fn markdown(latency: &Value, subscription: &Value, date: &str, machine: &str) -> String {
    let within = |key: &str, target: i64| subscription[key].as_i64().is_some_and(|v| v <= target);
    let verdict = |met: bool| if met { "met" } else { "missed" };
    let steady = within("latency_p50_ms", P50_TARGET_MS) && within("latency_p99_ms", P99_TARGET_MS);
    let idle = within("idle_latency_p99_ms", IDLE_TARGET_MS);
    format!(
        "\n## Latency as deployed ({date}, {machine}, `make bench`)\n\n\
         The local stack with the template's settings and no local override (the scan on its minute \
         schedule, woken by the pump; `WATERMARK_LAG_MS`, `SUBSCRIPTION_POLL_MS` and the rest at their \
         defaults), the demo's subscription (4 partitions, a Kinesis target).\n\n\
         Pixel hit to event-table item at a steady {DEMO_RATE} hits/s ({} hits): p50 {} ms, p99 {} ms.\n\n\
         Arrival (Kinesis arrival of the event) to delivery (Kinesis arrival on the subscription's target \
         stream), at the same pace: p50 {} ms, p99 {} ms (targets: p50 <= {P50_TARGET_MS} ms, p99 <= \
         {P99_TARGET_MS} ms: {}).\n\n\
         Single hits after idling ({IDLE_PROBES} probes, each after {IDLE_SECONDS} s without traffic): p99 {} ms \
         (target: <= {IDLE_TARGET_MS} ms: {}); each: {}. What bounds it: the pump's next poll (a second), the \
         woken scan's pass, `WATERMARK_LAG_MS` (a shard with nothing new holds the watermark that far behind a \
         pass), the subscriptions' tick the scan starts and a runner's start.\n\n\
         Where the steady figure goes, split where the watermark (read every 100 ms) first passed each event:\n\n\
         | part | what waits | p50 ms | p99 ms |\n|---|---|---|---|\n\
         | arrival to complete | the pump's poll, the awake scan's next pass and its length | {} | {} |\n\
         | complete to delivered | the runner's poll, its read of the slot, the put | {} | {} |\n\n\
         The stack's own requests per minute while idle (from 15 s after a delivery: the schedules alone, \
         and the local event source's polls of the event and playback streams, a second each): {}.\n",
        latency["sent"],
        latency["latency_p50_ms"],
        latency["latency_p99_ms"],
        subscription["latency_p50_ms"],
        subscription["latency_p99_ms"],
        verdict(steady),
        subscription["idle_latency_p99_ms"],
        verdict(idle),
        subscription["idle_latencies_ms"],
        subscription["sealing_p50_ms"],
        subscription["sealing_p99_ms"],
        subscription["delivering_p50_ms"],
        subscription["delivering_p99_ms"],
        subscription["idle_requests_per_minute"]
            .as_object()
            .map(|ops| ops
                .iter()
                .map(|(op, n)| format!("{op} {:.1}", n.as_f64().unwrap_or(f64::NAN)))
                .collect::<Vec<_>>()
                .join(", "))
            .unwrap_or_default(),
    )
}
