//! "Seconds, not a minute": what completing slots and delivering within seconds costs a month, idle and busy.

use super::prices::{
    DYNAMO_PER_MILLION_RRU, DYNAMO_PER_MILLION_WRU, KINESIS_SHARD_HOUR, LAMBDA_ARM_PER_GB_SECOND,
    LAMBDA_PER_MILLION_REQUESTS,
};

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

/// What keeping completion and delivery in seconds costs a month: at idle (the
/// stack's requests measured while idle, the schedules' invocations), and the
/// fixed part while events come (the awake scan, its ticks, followers).
pub(super) fn in_seconds(idle_per_minute: &std::collections::BTreeMap<String, f64>, date: &str) -> String {
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
         A deployed stack completes slots and delivers within seconds ([subscriptions.md](subscriptions.md#latency)): \
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
