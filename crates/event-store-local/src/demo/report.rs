//! The demo's report: what it found, made from what its steps measured, printed at the end and written as JSON.

use std::time::{Duration, Instant};

use super::check::check;
use super::watermark::breakdown;
use super::Outcome;
use crate::probes::Measured;
use crate::stack::Stack;

/// What the demo found; `ok()` decides the exit code.
#[derive(Debug, Default)]
pub struct Report {
    pub sent: usize,
    pub failed_requests: usize,
    pub stored: usize,
    /// Event-table items repeating an event already stored: load's ambiguous
    /// puts retried by the SDK (under faults only); readers drop them.
    pub stored_duplicates: usize,
    pub played_back: usize,
    pub duplicates: usize,
    /// Envelope ids delivered more than once, in the order the copies were read.
    pub duplicate_ids: Vec<String>,
    pub lost: usize,
    pub out_of_order: usize,
    /// Entity events appended (through `/streams`), and what went wrong with them: a step of the
    /// Todo flow or Counter answered against the contract, a stream not played in version order.
    pub entity_events: usize,
    pub entity_problems: Vec<String>,
    /// The demo subscription: events delivered, lost, duplicated, out of order.
    pub subscribed: SubscriptionReport,
    pub wall: Duration,
    /// Pixel hit (load's `received_at`) to event-table item (the scan's `moved_at`), ms.
    pub latency_p50_ms: Option<i64>,
    pub latency_p99_ms: Option<i64>,
    pub scan_interval: Duration,
    /// The first half of the window, archived to S3 before the playback, and the chain verified.
    pub archive: ArchiveReport,
    /// The demo's projections, read back over `/views`.
    pub views: super::views::ViewsReport,
    pub lines: Vec<String>,
}

/// What the demo archived, and what verifying the chain found.
#[derive(Debug, Default)]
pub struct ArchiveReport {
    pub objects: u64,
    pub events: u64,
    pub verified_entries: u64,
    pub first_break: Option<String>,
}

/// The `q` quantile (0..=1) of `values`, nearest rank.
pub fn quantile(values: &[i64], q: f64) -> Option<i64> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied()
}

/// What a subscription delivered, checked like the playback.
#[derive(Debug, Default)]
pub struct SubscriptionReport {
    /// Event arrival to its record's arrival on the target stream, ms.
    pub latency_p50_ms: Option<i64>,
    pub latency_p99_ms: Option<i64>,
    /// Where that time goes: event arrival to the watermark passing it
    /// (pump, scan, `WATERMARK_LAG_MS`, the scan interval), then to its
    /// delivery (the runner's poll, reading, the put), ms.
    pub completing_p50_ms: Option<i64>,
    pub completing_p99_ms: Option<i64>,
    pub delivering_p50_ms: Option<i64>,
    pub delivering_p99_ms: Option<i64>,
    /// Idle probes' arrival to delivery, ms, in the order sent (`--idle-probes`).
    pub idle_latencies_ms: Vec<i64>,
    /// The stack's AWS requests per minute while it idled before the probes, by operation.
    pub idle_requests_per_minute: std::collections::BTreeMap<String, f64>,
    pub delivered: usize,
    pub duplicates: usize,
    pub lost: usize,
    pub out_of_order: usize,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.lost == 0
            && self.out_of_order == 0
            && self.failed_requests == 0
            && self.sent > 0
            && self.subscribed.lost == 0
            && self.subscribed.out_of_order == 0
            && self.entity_problems.is_empty()
            && self.archive.events > 0
            && self.archive.first_break.is_none()
            && self.views.problems.is_empty()
            && self.views.streams_checked > 0
    }

    /// The report of a run (`started` at its start): what the checks found, the figures, the lines.
    pub(super) fn of(run: &Outcome, idle: Measured, stack: &Stack, started: Instant) -> Self {
        let mut report = Self::checked(run, idle);
        report.add_figures(run, stack, started);
        report.lines = lines(run, &report, stack);
        report
    }

    /// What was stored checked against the playback and the subscription's deliveries, the entity
    /// streams' versions in both, and the subscription's latencies (the idle probes' included).
    fn checked(run: &Outcome, idle: Measured) -> Self {
        let (stored, accepted) = (&run.stored.items, run.stored.accepted);
        let (played, subscribed) = (&run.delivered.played, &run.delivered.subscribed);
        let delivered_at = &run.delivered.delivered_at;
        let delivery_latencies: Vec<i64> =
            delivered_at.iter().map(|(arrival, delivered)| delivered - arrival).collect();
        let (completing, delivering) = breakdown(delivered_at, &run.delivered.completions);
        let mut report = check(stored, played, accepted);
        let subscription_check = check(stored, subscribed, accepted);
        let entity_run = &run.entities.run;
        report.entity_events = entity_run.events();
        report.views = run.views.clone();
        report.entity_problems = entity_run.problems.clone();
        report.entity_problems.extend(crate::entities::check_versions(&entity_run.streams, played, "playback"));
        report.entity_problems.extend(crate::entities::check_versions(&entity_run.streams, subscribed, "subscription"));
        report.subscribed = SubscriptionReport {
            latency_p50_ms: quantile(&delivery_latencies, 0.5),
            latency_p99_ms: quantile(&delivery_latencies, 0.99),
            completing_p50_ms: quantile(&completing, 0.5),
            completing_p99_ms: quantile(&completing, 0.99),
            delivering_p50_ms: quantile(&delivering, 0.5),
            delivering_p99_ms: quantile(&delivering, 0.99),
            idle_latencies_ms: idle.latencies_ms,
            idle_requests_per_minute: idle.idle_requests_per_minute,
            delivered: subscription_check.played_back,
            duplicates: subscription_check.duplicates,
            lost: subscription_check.lost,
            out_of_order: subscription_check.out_of_order,
        };
        report
    }

    /// The figures: hits sent and failed, copies stored, the wall time, the latency to the event table, the archive.
    fn add_figures(&mut self, run: &Outcome, stack: &Stack, started: Instant) {
        self.stored_duplicates = run.stored.duplicates;
        self.sent = run.load.sent;
        self.failed_requests = run.load.failed_requests;
        self.wall = started.elapsed();
        self.latency_p50_ms = quantile(&run.stored.latencies, 0.5);
        self.latency_p99_ms = quantile(&run.stored.latencies, 0.99);
        self.scan_interval = stack.settings.scan_interval;
        self.archive = ArchiveReport {
            objects: run.archived.objects,
            events: run.archived.events,
            verified_entries: run.verified.entries,
            first_break: run.verified.first_break.clone(),
        };
    }
}

/// The report's closing lines: each stage's rate, the latency to the event table, the archive,
/// and the AWS requests by operation.
fn lines(run: &Outcome, report: &Report, stack: &Stack) -> Vec<String> {
    let (hits, load_time, load_started, accepted) =
        (run.load.hits, run.load.time, run.load.started, run.stored.accepted);
    let (entity_run, entity_time) = (&run.entities.run, run.entities.time);
    let (total, playback_time, archived) = (&run.played.total, run.played.time, &run.archived);
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    let since_load = |t: Option<Instant>| t.map(|t| t.duration_since(load_started)).unwrap_or(run.stored.time);
    vec![
        format!(
            "load      {:>8.0} events/s  ({hits} pixel hits answered in {:.2} s)",
            rate(hits, load_time),
            load_time.as_secs_f64()
        ),
        format!(
            "streams   {:>8.0} requests/s ({} entity events in {} streams, {} requests, {:.2} s, one writer per stream but the contended one)",
            rate(entity_run.requests, entity_time),
            entity_run.events(),
            entity_run.streams.len(),
            entity_run.requests,
            entity_time.as_secs_f64()
        ),
        format!(
            "pump      {:>8.0} events/s  (all buffered {:.2} s after the first hit)",
            rate(accepted, since_load(stack.stats.last_buffered())),
            since_load(stack.stats.last_buffered()).as_secs_f64()
        ),
        format!(
            "scan      {:>8.0} events/s  (all moved {:.2} s after the first hit; scan every {:.1} s)",
            rate(accepted, since_load(stack.stats.last_moved())),
            since_load(stack.stats.last_moved()).as_secs_f64(),
            stack.settings.scan_interval.as_secs_f64()
        ),
        format!(
            "playback  {:>8.0} events/s  ({} events in {} Kinesis records, {} PutRecords, {:.2} s)",
            rate(total.events, playback_time),
            total.events,
            total.kinesis_records,
            total.put_requests,
            playback_time.as_secs_f64()
        ),
        format!(
            "playback  {} records resent, {} ambiguous failures read back, {} copies of accepted events dropped",
            total.resent, total.checked_requests, total.duplicates_dropped
        ),
        format!(
            "latency   pixel hit to event table: p50 {} ms, p99 {} ms (scan every {:.1} s)",
            report.latency_p50_ms.map_or("-".into(), |v| v.to_string()),
            report.latency_p99_ms.map_or("-".into(), |v| v.to_string()),
            stack.settings.scan_interval.as_secs_f64()
        ),
        format!(
            "archive   {} events in {} Parquet objects before the playback ({} kept for late events); the playback read both tiers",
            archived.events, archived.objects, archived.kept
        ),
        format!("AWS requests by operation (whole run, incl. the demo's own checks): {:?}", stack.counter.snapshot()),
    ]
}

pub fn print(report: &Report) {
    println!("== report");
    println!("events sent          {:>7}  ({} failed requests)", report.sent, report.failed_requests);
    println!(
        "events stored        {:>7}  ({} stored twice by an ambiguous put; readers drop the copy)",
        report.stored, report.stored_duplicates
    );
    println!("events played back   {:>7}  ({} duplicates)", report.played_back, report.duplicates);
    let sub = &report.subscribed;
    println!(
        "events subscribed    {:>7}  ({} duplicates, {} lost, {} out of order; pixel hit arrival to delivery p50 {} ms, p99 {} ms)",
        sub.delivered,
        sub.duplicates,
        sub.lost,
        sub.out_of_order,
        sub.latency_p50_ms.map_or("-".into(), |v| v.to_string()),
        sub.latency_p99_ms.map_or("-".into(), |v| v.to_string())
    );
    let ms = |v: Option<i64>| v.map_or("-".into(), |v| v.to_string());
    println!(
        "  where it goes       arrival to complete (pump, scan, watermark lag) p50 {} ms, p99 {} ms; complete to delivered (poll, read, put) p50 {} ms, p99 {} ms",
        ms(sub.completing_p50_ms),
        ms(sub.completing_p99_ms),
        ms(sub.delivering_p50_ms),
        ms(sub.delivering_p99_ms)
    );
    if !sub.idle_latencies_ms.is_empty() {
        println!(
            "  after idling        {} probes: arrival to delivery p50 {} ms, p99 {} ms ({:?})",
            sub.idle_latencies_ms.len(),
            ms(quantile(&sub.idle_latencies_ms, 0.5)),
            ms(quantile(&sub.idle_latencies_ms, 0.99)),
            sub.idle_latencies_ms
        );
    }
    for id in &report.duplicate_ids {
        println!("duplicate delivery   {id}");
    }
    println!(
        "entity events        {:>7}  (in playback and subscription: every stream in version order{})",
        report.entity_events,
        if report.entity_problems.is_empty() { ", checked" } else { ": FAILED" }
    );
    for problem in &report.entity_problems {
        println!("entity problem       {problem}");
    }
    println!(
        "views                {:>7}  (entity streams at their versions and pages counted, read over /views{})",
        report.views.streams_checked + report.views.pages_checked,
        if report.views.problems.is_empty() { ", checked" } else { ": FAILED" }
    );
    for problem in &report.views.problems {
        println!("view problem         {problem}");
    }
    let archive = &report.archive;
    println!(
        "archived             {:>7}  (in {} objects; hash chain: {} entries verified{})",
        archive.events,
        archive.objects,
        archive.verified_entries,
        archive.first_break.as_ref().map_or(String::new(), |b| format!(", BROKEN: {b}"))
    );
    println!("lost                 {:>7}", report.lost);
    println!("out of order         {:>7}", report.out_of_order);
    println!("wall time            {:>7.1} s", report.wall.as_secs_f64());
    for line in &report.lines {
        println!("{line}");
    }
    println!("{}", if report.ok() { "RESULT: OK" } else { "RESULT: FAILED" });
}

impl Report {
    /// The figures as JSON (`demo --report-json`), for the benchmark.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "sent": self.sent, "stored": self.stored, "played_back": self.played_back, "lost": self.lost,
            "duplicates": self.duplicates, "out_of_order": self.out_of_order, "ok": self.ok(),
            "entity_events": self.entity_events, "entity_problems": self.entity_problems,
            "subscribed": self.subscribed.delivered, "subscription_lost": self.subscribed.lost,
            "subscription_out_of_order": self.subscribed.out_of_order,
            "subscription_latency_p50_ms": self.subscribed.latency_p50_ms,
            "subscription_latency_p99_ms": self.subscribed.latency_p99_ms,
            "subscription_sealing_p50_ms": self.subscribed.completing_p50_ms,
            "subscription_sealing_p99_ms": self.subscribed.completing_p99_ms,
            "subscription_delivering_p50_ms": self.subscribed.delivering_p50_ms,
            "subscription_delivering_p99_ms": self.subscribed.delivering_p99_ms,
            "subscription_idle_latencies_ms": self.subscribed.idle_latencies_ms,
            "subscription_idle_latency_p99_ms": quantile(&self.subscribed.idle_latencies_ms, 0.99),
            "idle_requests_per_minute": self.subscribed.idle_requests_per_minute,
            "wall_seconds": self.wall.as_secs_f64(), "scan_interval_seconds": self.scan_interval.as_secs_f64(),
            "latency_p50_ms": self.latency_p50_ms, "latency_p99_ms": self.latency_p99_ms,
            "archived": self.archive.events, "archive_objects": self.archive.objects,
            "archive_verified_entries": self.archive.verified_entries, "archive_break": self.archive.first_break,
            "view_problems": self.views.problems,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<i64> = (1..=100).rev().collect();
        assert_eq!(
            (quantile(&values, 0.5), quantile(&values, 0.99), quantile(&values, 1.0)),
            (Some(50), Some(99), Some(100))
        );
        assert_eq!(quantile(&[7], 0.99), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
