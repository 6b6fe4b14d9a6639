//! A scan or a playback run to the end, with every fork and continuation it
//! causes run in-process, and the configurations the tests and the bench
//! start from (the shapes of `ScanConfig` and `PlaybackConfig` live here once).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use event_store::config::{PlaybackConfig, ScanConfig, SubscriptionConfig};
use event_store::invoke::Invoker;
use event_store::playback::{Playback, PlaybackSummary};
use event_store::scan::{Scan, ScanSummary};
use event_store::subscription::Subscriptions;
use event_store::Result;
use serde_json::Value;

use crate::invoke::{recursive_loop, run_until_idle, LocalInvoker};
use crate::resources::Names;

/// A scan of `names`' tables with one-second slots, 4 segments, a 10 s
/// deadline margin, 1 MB pages, no retention and no clock allowance (one
/// machine, one clock).
pub fn scan_config(names: &Names) -> ScanConfig {
    ScanConfig {
        buffer_table: names.buffer_table.clone(),
        event_table: names.event_table.clone(),
        event_stream: names.event_stream.clone(),
        time_unit_ms: 1000,
        segments: 4,
        deadline_margin: Duration::from_secs(10),
        page_items: None,
        retention_days: None,
        watermark_lag_ms: 0,
        max_continuations: event_store::config::DEFAULT_MAX_CONTINUATIONS,
        slot_subkeys: 1,
        slices: 1,
        metrics_namespace: "EventStore".into(),
        subscriptions_tick: None,
    }
}

/// A playback of `names`' event table onto their playback stream, one-second
/// slots, a 10 s deadline margin, 1 MB pages, windows up to a day.
pub fn playback_config(names: &Names) -> PlaybackConfig {
    PlaybackConfig {
        event_table: names.event_table.clone(),
        playback_stream: names.playback_stream.clone(),
        time_unit_ms: 1000,
        deadline_margin: Duration::from_secs(10),
        page_items: None,
        max_window: Duration::from_secs(86_400),
        dedupe_window_ms: event_store::config::DEFAULT_DEDUPE_WINDOW_MS,
        max_continuations: event_store::config::DEFAULT_MAX_CONTINUATIONS,
        lease: event_store::config::DEFAULT_PLAYBACK_LEASE,
        archive_bucket: None,
        subjects: None,
    }
}

/// Subscriptions of `names`' event table, one-second slots, a 10 s deadline
/// margin, runners that stop once caught up (no following), a 1 s lease slack.
pub fn subscription_config(names: &Names) -> SubscriptionConfig {
    SubscriptionConfig {
        event_table: names.event_table.clone(),
        time_unit_ms: 1000,
        deadline_margin: Duration::from_secs(10),
        page_items: None,
        dedupe_window_ms: event_store::config::DEFAULT_DEDUPE_WINDOW_MS,
        max_continuations: event_store::config::DEFAULT_MAX_CONTINUATIONS,
        follow: Duration::ZERO,
        poll: Duration::from_millis(250),
        lease_slack_ms: 1_000,
        // Tests retry an unavailable target at once (one test checks the backoff itself).
        unavailable_backoff: Duration::ZERO,
        metrics_namespace: "EventStore/local".into(),
        archive_bucket: None,
        subjects: None,
        view_table: Some(names.view_table.clone()),
    }
}

/// A deadline `budget` from now, for each run of a chain.
pub fn deadline_in(budget: Duration) -> impl Fn() -> SystemTime + Send + Sync + 'static {
    move || SystemTime::now() + budget
}

/// Runs `first` (a schedule event, or a segment task) and every fork and
/// continuation it causes; `deadline` gives each run its deadline.
pub async fn run_scan(
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    config: ScanConfig,
    first: Value,
    deadline: impl Fn() -> SystemTime + Send + Sync + 'static,
) -> Vec<Result<ScanSummary>> {
    run_chain(
        "ScanFunction",
        |invoker| Scan::new(dynamo, kinesis, config, invoker),
        first,
        deadline,
        |scan, payload, deadline| async move { scan.handle(payload, deadline).await },
    )
    .await
}

/// Runs the playback `request` and every continuation it causes; `make`
/// builds the playback (with an observer, say) around the local invoker.
pub async fn run_playback(
    make: impl FnOnce(Arc<dyn Invoker>) -> Playback,
    request: Value,
    deadline: impl Fn() -> SystemTime + Send + Sync + 'static,
) -> Vec<Result<PlaybackSummary>> {
    run_chain("PlaybackFunction", make, request, deadline, |playback, payload, deadline| async move {
        playback.handle(payload, deadline).await
    })
    .await
}

/// Runs one invocation of the subscriptions function (a tick, a partition
/// run, an action) and every runner and continuation it starts.
pub async fn run_subscriptions(
    make: impl FnOnce(Arc<dyn Invoker>) -> Subscriptions,
    first: Value,
    deadline: impl Fn() -> SystemTime + Send + Sync + 'static,
) -> Vec<Result<Value>> {
    run_chain("SubscriptionsFunction", make, first, deadline, |subs, payload, deadline| async move {
        subs.handle(payload, deadline).await.and_then(|answer| answer.to_json())
    })
    .await
}

/// Runs `first` on `function` (a logical id of the template, whose
/// `RecursiveLoop` setting the runner follows) and every invocation it causes.
async fn run_chain<H, F, Fut, T>(
    function: &str,
    make: impl FnOnce(Arc<dyn Invoker>) -> H,
    first: Value,
    deadline: impl Fn() -> SystemTime + Send + Sync + 'static,
    handle: F,
) -> Vec<T>
where
    H: Send + Sync + 'static,
    F: Fn(Arc<H>, Value, SystemTime) -> Fut,
    Fut: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (invoker, mut rx) = LocalInvoker::with_recursion(recursive_loop(function));
    let handler = Arc::new(make(Arc::new(invoker.clone())));
    if invoker.send(first).is_err() {
        return Vec::new();
    }
    run_until_idle(&mut rx, move |payload| handle(handler.clone(), payload, deadline())).await
}
