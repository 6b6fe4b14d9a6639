//! playback → playback stream, against a real emulator (moto_server, or dynalite + kinesalite with EMULATOR=strict), continuations run in-process.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{buffer_through_pump, sample_event, TestEnv};
use event_store::config::{PlaybackConfig, ScanConfig};
use event_store::invoke::{run_until_idle, LocalInvoker};
use event_store::playback::{Playback, PlaybackSummary};
use event_store::scan::Scan;
use event_store::time::format_ms;
use event_store::Error;
use serde_json::{json, Value};

const T0: i64 = 1_795_327_124_000;

/// Fills the event table through pump and scan: `n` events for 5 entities, spread over `slots` seconds.
async fn stored_events(env: &TestEnv, n: i64, slots: i64) {
    let records: Vec<_> = (0..n)
        .map(|i| {
            (
                format!("user-{}", i % 5),
                json!({"n": i, "pad": "x".repeat(100)}).to_string().into_bytes(),
                T0 + i * slots * 1000 / n,
            )
        })
        .collect();
    buffer_through_pump(env, &records).await;
    let config = ScanConfig {
        buffer_table: env.names.buffer_table.clone(),
        event_table: env.names.event_table.clone(),
        time_unit_ms: 1000,
        segments: 2,
        deadline_margin: Duration::from_secs(10),
        page_items: None,
        retention_days: None,
    };
    let (invoker, mut rx) = LocalInvoker::channel();
    let scan = Arc::new(Scan::new(env.dynamo.clone(), config, Arc::new(invoker.clone())));
    invoker.send(json!({})).unwrap();
    run_until_idle(&mut rx, move |p: Value| {
        let scan = scan.clone();
        async move { scan.handle(p, SystemTime::now() + Duration::from_secs(900)).await.unwrap() }
    })
    .await;
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
}

fn config(env: &TestEnv, page_items: Option<i32>) -> PlaybackConfig {
    PlaybackConfig {
        event_table: env.names.event_table.clone(),
        playback_stream: env.names.playback_stream.clone(),
        time_unit_ms: 1000,
        deadline_margin: Duration::from_secs(10),
        page_items,
        max_window: Duration::from_secs(86_400),
    }
}

/// Runs a playback request and every continuation it causes.
async fn play(
    env: &TestEnv,
    config: PlaybackConfig,
    request: Value,
    deadline: fn() -> SystemTime,
) -> Vec<PlaybackSummary> {
    let (invoker, mut rx) = LocalInvoker::channel();
    let playback = Arc::new(Playback::new(env.dynamo.clone(), env.kinesis.clone(), config, Arc::new(invoker.clone())));
    invoker.send(request).unwrap();
    run_until_idle(&mut rx, move |p: Value| {
        let playback = playback.clone();
        async move { playback.handle(p, deadline()).await.expect("playback run") }
    })
    .await
}

/// The `n` of every played-back record, per partition key, in stream order.
async fn played(env: &TestEnv) -> HashMap<String, Vec<i64>> {
    let mut out: HashMap<String, Vec<i64>> = HashMap::new();
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        let data: Value = serde_json::from_slice(record.data().as_ref()).unwrap();
        out.entry(record.partition_key().unwrap().to_owned()).or_default().push(data["n"].as_i64().unwrap());
    }
    out
}

fn window(start: i64, end: i64) -> Value {
    json!({"start": format_ms(start), "end": format_ms(end)})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_window_plays_back_in_order_per_partition_key_at_under_1_request_per_100_events() {
    let env = TestEnv::start(2).await;
    stored_events(&env, 1500, 4).await;
    env.counter.reset();
    let summaries =
        play(&env, config(&env, Some(100)), window(T0, T0 + 4000), || SystemTime::now() + Duration::from_secs(900))
            .await;
    assert_eq!(summaries.len(), 1);
    let summary = &summaries[0];
    assert_eq!((summary.slots, summary.events, summary.continued), (4, 1500, false));
    assert_eq!(summary.first_event.as_deref(), Some(format_ms(T0).as_str()));
    let kinesis = env.counter.service_total("Kinesis");
    common::assert_only_declared_actions(&env.counter, event_store::playback::AWS_ACTIONS);
    println!(
        "playback: {kinesis} Kinesis requests for 1500 events = {:.4} per event; {:?}",
        kinesis as f64 / 1500.0,
        env.counter.snapshot()
    );
    assert!(kinesis as f64 / 1500.0 <= 0.01);
    assert!(env.counter.get("DynamoDB.Query") >= 15, "several query pages per slot");

    let played = played(&env).await;
    assert_eq!(played.len(), 5);
    for (key, ns) in &played {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let expected: Vec<i64> = (0..1500).filter(|n| n % 5 == user).collect();
        assert_eq!(ns, &expected, "{key}: every event once, in order");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_window_is_played_and_its_edges_are_exact() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 300, 3).await; // event n arrives at T0 + 10 n ms
    let summaries =
        play(&env, config(&env, None), window(T0 + 500, T0 + 2500), || SystemTime::now() + Duration::from_secs(900))
            .await;
    assert_eq!(summaries[0].events, 200);
    let mut all: Vec<i64> = played(&env).await.into_values().flatten().collect();
    all.sort();
    assert_eq!(all, (50..250).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn near_the_deadline_it_continues_asynchronously_from_where_it_stopped() {
    let env = TestEnv::start(2).await;
    stored_events(&env, 700, 3).await;
    // 50 items a page and no time left: every page ends in a continuation.
    let summaries =
        play(&env, config(&env, Some(50)), window(T0, T0 + 3000), || SystemTime::now() + Duration::from_secs(1)).await;
    let continued = summaries.iter().filter(|s| s.continued).count();
    assert!(continued >= 700 / 50 - 1, "{continued} continuations");
    assert_eq!(summaries.iter().map(|s| s.events).sum::<usize>(), 700);
    let played = played(&env).await;
    for (key, ns) in &played {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        assert_eq!(ns, &(0..700).filter(|n| n % 5 == user).collect::<Vec<_>>(), "{key}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn empty_and_invalid_windows() {
    let env = TestEnv::start(1).await;
    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker));
    let later = SystemTime::now() + Duration::from_secs(900);

    let sample: Value = serde_json::from_str(&sample_event("playback.json")).unwrap();
    let empty = playback.handle(sample, later).await.unwrap();
    assert_eq!((empty.events, empty.slots, empty.first_event), (0, 0, None));
    assert_eq!(empty.start, "2026-11-21T05:58:00.000Z");

    let reversed = playback.handle(window(T0 + 1000, T0), later).await.unwrap_err();
    assert!(matches!(reversed, Error::BadInput(ref m) if m.contains("before start")), "{reversed}");
    let garbage = playback.handle(json!({"start": "noon"}), later).await.unwrap_err();
    assert!(matches!(garbage, Error::BadInput(_)));
    let wrong_shape = playback.handle(json!({"start": 5, "end": []}), later).await.unwrap_err();
    assert!(matches!(wrong_shape, Error::BadInput(_)));
    assert_eq!(env.counter.service_total("Kinesis"), 0);
}

/// Keeps each record at its last delivery (the resend after a partial failure).
fn last_deliveries(ns: &[i64]) -> Vec<i64> {
    let last: HashMap<i64, usize> = ns.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    ns.iter().enumerate().filter(|(i, n)| last[n] == *i).map(|(_, n)| *n).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn records_kinesis_rejects_are_resent_from_the_first_failure_keeping_order() {
    use event_store_fault_proxy::{Config, Fault, FaultProxy};
    let env = TestEnv::start(2).await;
    stored_events(&env, 1200, 3).await;
    let only: &'static [Fault] = &[Fault::PartialPutRecords];
    let proxy =
        FaultProxy::start(&env.kinesis_endpoint, Config { seed: 5, rate: 0.5, only: Some(only) }).await.unwrap();
    let faulty = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(&env.sdk).endpoint_url(&proxy.endpoint).build(),
    );
    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), faulty, config(&env, None), Arc::new(invoker));
    let summary = playback.handle(window(T0, T0 + 3000), SystemTime::now() + Duration::from_secs(900)).await.unwrap();
    let injected = proxy.counts().get("PartialPutRecords").copied().unwrap_or(0);
    println!("partial PutRecords failures injected: {injected}; resent {} records", summary.resent);
    assert!(injected > 0 && summary.resent > 0);
    assert_eq!(summary.events, 1200);
    for (key, ns) in played(&env).await {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let expected: Vec<i64> = (0..1200).filter(|n| n % 5 == user).collect();
        assert_eq!(last_deliveries(&ns), expected, "{key}: in order by last delivery, none missing");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_playback_that_dies_mid_window_and_is_run_again_delivers_everything_in_order() {
    let env = TestEnv::start(2).await;
    stored_events(&env, 1300, 3).await;
    let later = || SystemTime::now() + Duration::from_secs(900);
    let dying = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(&env.sdk)
            .endpoint_url(&env.kinesis_endpoint)
            // The first request gets through, every later one fails.
            .interceptor(common::FailRequests::new(|_, seen| seen >= 1))
            .build(),
    );
    let (invoker, _rx) = LocalInvoker::channel();
    let first = Playback::new(env.dynamo.clone(), dying, config(&env, Some(200)), Arc::new(invoker));
    assert!(first.handle(window(T0, T0 + 3000), later()).await.is_err(), "the first run died");
    let delivered_before: usize = played(&env).await.values().map(Vec::len).sum();
    assert_eq!(delivered_before, 500, "one request of 500 got out before it died");

    // The same payload again (what a retried invocation does).
    let summaries = play(&env, config(&env, Some(200)), window(T0, T0 + 3000), later).await;
    assert_eq!(summaries.iter().map(|s| s.events).sum::<usize>(), 1300);
    for (key, ns) in played(&env).await {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let expected: Vec<i64> = (0..1300).filter(|n| n % 5 == user).collect();
        assert_eq!(last_deliveries(&ns), expected, "{key}: every event at least once, in order");
    }
}
