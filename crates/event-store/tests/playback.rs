//! playback → playback stream, against a real emulator (moto_server, or dynalite + kinesalite with EMULATOR=strict), continuations run in-process.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

static PUTS: AtomicUsize = AtomicUsize::new(0);

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{buffer_through_pump, sample_event, TestEnv};
use event_store::bookkeeping::Family;
use event_store::config::{PlaybackConfig, ScanConfig};
use event_store::log::PlayedEvent;
use event_store::playback::{Playback, PlaybackSummary, Status};
use event_store::time::{format_ms, now_ms};
use event_store::Error;
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::runs::{self, deadline_in, run_playback, run_scan};
use serde_json::{json, Value};

/// Weeks before any run of these tests: complete as soon as a scan pass ends.
const T0: i64 = 1_790_000_000_000;

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
    // An item per event, so that page sizes (in items) count events, as the tests of paging need.
    common::buffer_one_by_one(env, &records).await;
    scan_pass(env, scan_config(env, 0)).await;
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
}

/// One scheduled scan run and its forks: moves the buffer, indexes, moves the watermark.
async fn scan_pass(env: &TestEnv, config: ScanConfig) {
    for result in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), config, json!({}), deadline_in(Duration::from_secs(900)))
            .await
    {
        result.unwrap();
    }
}

fn scan_config(env: &TestEnv, watermark_lag_ms: u64) -> ScanConfig {
    ScanConfig { segments: 2, watermark_lag_ms, ..runs::scan_config(&env.names) }
}

fn config(env: &TestEnv, page_items: Option<i32>) -> PlaybackConfig {
    PlaybackConfig { page_items, ..runs::playback_config(&env.names) }
}

/// Runs a playback request and every continuation it causes.
async fn play(
    env: &TestEnv,
    config: PlaybackConfig,
    request: Value,
    deadline: fn() -> SystemTime,
) -> Vec<PlaybackSummary> {
    play_on(env.dynamo.clone(), env.kinesis.clone(), config, request, deadline).await
}

/// [`play`] with clients of the caller's (through a proxy, say).
async fn play_on(
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    config: PlaybackConfig,
    request: Value,
    deadline: fn() -> SystemTime,
) -> Vec<PlaybackSummary> {
    let runs = run_playback(|invoker| Playback::new(dynamo, kinesis, config, invoker), request, deadline).await;
    runs.into_iter().map(|run| run.expect("playback run")).collect()
}

/// Every played-back event (aggregated records unpacked), in stream order per shard.
async fn played_events(env: &TestEnv) -> Vec<PlayedEvent> {
    let mut out = Vec::new();
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        let key = record.partition_key().unwrap();
        for (inner_key, data) in event_store::aggregation::deaggregate(key, record.data().as_ref()).unwrap() {
            let event: PlayedEvent = serde_json::from_slice(&data).unwrap();
            assert_eq!(inner_key, event.partition_key, "the original partition key");
            out.push(event);
        }
    }
    out
}

/// The `n` of every played-back record, per partition key, in stream order.
async fn played(env: &TestEnv) -> HashMap<String, Vec<i64>> {
    let mut out: HashMap<String, Vec<i64>> = HashMap::new();
    for event in played_events(env).await {
        let n = event.data.as_ref().unwrap()["n"].as_i64().unwrap();
        out.entry(event.partition_key).or_default().push(n);
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
    assert_eq!((summary.slots, summary.events, summary.status), (4, 1500, Status::Complete));
    assert_eq!(summary.first_event.as_deref(), Some(format_ms(T0).as_str()));
    let kinesis = env.counter.service_total("Kinesis");
    common::assert_only_declared_actions(&env.counter, event_store::playback::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "PlaybackFunction");
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
    // Metadata: playback sequence numbers 0..n in event order, and the original event time.
    let mut events = played_events(&env).await;
    events.sort_by_key(|e| e.playback_seq);
    assert_eq!(events.iter().map(|e| e.playback_seq).collect::<Vec<_>>(), (0..1500).collect::<Vec<u64>>());
    assert!(events.windows(2).all(|w| w[0].event_ms <= w[1].event_ms), "sequence numbers follow event time");
    assert_eq!(events[0].event_time, format_ms(T0));
    assert_eq!(summary.next_seq, 1500);
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
    let continued = summaries.iter().filter(|s| s.status == Status::Continued).count();
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
    let before_any_pass = playback.handle(sample.clone(), later).await.unwrap();
    assert_eq!((before_any_pass.status, before_any_pass.events), (Status::Incomplete, 0), "nothing complete yet");
    scan_pass(&env, scan_config(&env, 0)).await;
    env.counter.reset();
    let empty = playback.handle(sample, later).await.unwrap();
    assert_eq!((empty.status, empty.events, empty.slots, empty.first_event), (Status::Complete, 0, 0, None));
    assert_eq!(empty.start, "2026-11-01T05:58:00.000Z");
    assert_eq!(env.counter.get("DynamoDB.Query"), 2, "the watermark and the index read, no slot queried");
    let typo = playback.handle(json!({"start": format_ms(T0), "ned": format_ms(T0)}), later).await.unwrap_err();
    assert!(matches!(typo, Error::BadInput(ref m) if m.contains("ned")), "{typo}");
    let filter = json!({"start": format_ms(T0), "end": format_ms(T0), "filter": [{"field": "path", "equals": 1}]});
    assert!(matches!(playback.handle(filter, later).await, Err(Error::BadInput(_))), "not a JSON pointer");

    let reversed = playback.handle(window(T0 + 1000, T0), later).await.unwrap_err();
    assert!(matches!(reversed, Error::BadInput(ref m) if m.contains("before start")), "{reversed}");
    let garbage = playback.handle(json!({"start": "noon"}), later).await.unwrap_err();
    assert!(matches!(garbage, Error::BadInput(_)));
    let wrong_shape = playback.handle(json!({"start": 5, "end": []}), later).await.unwrap_err();
    assert!(matches!(wrong_shape, Error::BadInput(_)));
    assert_eq!(env.counter.get("Kinesis.PutRecords"), 0);
}

/// Each record at its first delivery: what a consumer that drops copies sees.
fn first_deliveries(ns: &[i64]) -> Vec<i64> {
    let mut seen = std::collections::HashSet::new();
    ns.iter().copied().filter(|n| seen.insert(*n)).collect()
}

/// Plays `window` through a proxy that fails half the puts in part or
/// ambiguously (applied, then a 500), in `format`, and checks every key is
/// delivered in order on first delivery with no copy.
async fn play_through_faults(format: &str) {
    use event_store_fault_proxy::{Config, Fault};
    let env = TestEnv::start(2).await;
    stored_events(&env, 1200, 3).await;
    let only: &'static [Fault] = &[Fault::PartialPutRecords, Fault::AppliedThenInternalError];
    let (faulty, proxy) = common::through_faults(&env, Config { seed: 5, rate: 0.5, only: Some(only) }).await;
    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), faulty, config(&env, None), Arc::new(invoker));
    let mut request = window(T0, T0 + 3000);
    request["record_format"] = json!(format);
    let summary = playback.handle(request, SystemTime::now() + Duration::from_secs(900)).await.unwrap();
    let counts = proxy.counts();
    println!(
        "{format}: {counts:?}; {} requests, {} records resent, {} ambiguous failures read back",
        summary.put_requests, summary.resent, summary.checked_requests
    );
    assert!(counts.get("PartialPutRecords").copied().unwrap_or(0) > 0 && summary.resent > 0);
    assert!(counts.get("AppliedThenInternalError").copied().unwrap_or(0) > 0 && summary.checked_requests > 0);
    assert_eq!(summary.events, 1200);
    let played = played(&env).await;
    assert_eq!(played.len(), 5);
    for (key, ns) in played {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let expected: Vec<i64> = (0..1200).filter(|n| n % 5 == user).collect();
        assert_eq!(first_deliveries(&ns), expected, "{key}: in order on first delivery, none missing");
        assert_eq!(
            ns.len(),
            expected.len(),
            "{key}: no copies: refused records alone were resent, applied ones read back"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_and_ambiguous_put_failures_keep_each_keys_order_on_first_delivery_aggregated() {
    play_through_faults("aggregated").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_and_ambiguous_put_failures_keep_each_keys_order_on_first_delivery_plain() {
    play_through_faults("plain").await;
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
            .interceptor(common::FailRequests::new(|body, _| {
                // DescribeStreamSummary gets through, and the first PutRecords; every later one fails.
                body.windows(7).any(|w| w == b"Records") && PUTS.fetch_add(1, Ordering::SeqCst) >= 1
            }))
            .build(),
    );
    let (invoker, _rx) = LocalInvoker::channel();
    let first = Playback::new(env.dynamo.clone(), dying, config(&env, Some(200)), Arc::new(invoker));
    assert!(first.handle(window(T0, T0 + 3000), later()).await.is_err(), "the first run died");
    let delivered_before: usize = played(&env).await.values().map(Vec::len).sum();
    assert_eq!(delivered_before, 500, "one request of 500 got out before it died");

    // The same payload again (what a retried invocation does): it starts from the checkpoint.
    let summaries = play(&env, config(&env, Some(200)), window(T0, T0 + 3000), later).await;
    assert_eq!(summaries.iter().map(|s| s.events).sum::<usize>(), 800, "only what the first run had not put");
    let delivered: usize = played(&env).await.values().map(Vec::len).sum();
    assert!(delivered <= 1300 + 500, "at most one batch repeated: {delivered}");
    for (key, ns) in played(&env).await {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let expected: Vec<i64> = (0..1300).filter(|n| n % 5 == user).collect();
        assert_eq!(first_deliveries(&ns), expected, "{key}: every event at least once, in order");
    }
    let mut seqs: Vec<u64> = played_events(&env).await.iter().map(|e| e.playback_seq).collect();
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs, (0..1300).collect::<Vec<u64>>(), "sequence numbers continue across the crash");

    // Done: the same request again plays nothing, unless asked to.
    let again = play(&env, config(&env, None), window(T0, T0 + 3000), later).await;
    assert_eq!((again[0].status, again[0].events), (Status::AlreadyDone, 1300));
    let mut restart = window(T0, T0 + 3000);
    restart["restart"] = json!(true);
    let replayed = play(&env, config(&env, None), restart, later).await;
    assert_eq!((replayed[0].status, replayed[0].events), (Status::Complete, 1300));
}

#[tokio::test(flavor = "multi_thread")]
async fn incomplete_slots_are_never_played_and_a_later_end_waits_or_answers_incomplete() {
    let env = TestEnv::start(1).await;
    let lag: i64 = 100;
    let later = || SystemTime::now() + Duration::from_secs(900);
    // Batch A now; then, once A's slot is over, batch B: the next pass completes A's slot but not B's.
    let a = now_ms();
    buffer_through_pump(&env, &[("k".into(), json!({"n": 1}).to_string().into_bytes(), a)]).await;
    let a_slot_end = a - a.rem_euclid(1000) + 1000;
    tokio::time::sleep(Duration::from_millis((a_slot_end + lag + 300 - now_ms()).max(0) as u64)).await;
    let b = now_ms();
    buffer_through_pump(&env, &[("k".into(), json!({"n": 2}).to_string().into_bytes(), b)]).await;
    scan_pass(&env, scan_config(&env, lag as u64)).await;
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty(), "both moved");

    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker));
    let past_the_watermark = playback.handle(window(a - 1000, b + 1), later()).await.unwrap();
    assert_eq!((past_the_watermark.status, past_the_watermark.events), (Status::Incomplete, 0));
    assert!(played_events(&env).await.is_empty(), "nothing of an incomplete slot went out");

    // Default end: the complete end. A is played, B (moved, but its slot not complete) is not.
    let sealed = playback.handle(json!({"start": format_ms(a - 1000)}), later()).await.unwrap();
    assert_eq!((sealed.status, sealed.events), (Status::Complete, 1), "{sealed:?}");
    let ns: Vec<i64> = played(&env).await.into_values().flatten().collect();
    assert_eq!(ns, vec![1]);

    // Waiting: a pass that starts while playback waits completes B's slot.
    let b_slot_end = b - b.rem_euclid(1000) + 1000;
    let sealer = async {
        tokio::time::sleep(Duration::from_millis((b_slot_end + lag + 300 - now_ms()).max(0) as u64)).await;
        scan_pass(&env, scan_config(&env, lag as u64)).await;
    };
    let mut waiting = window(b - 1, b + 1);
    waiting["wait_seconds"] = json!(20);
    let (waited, ()) = tokio::join!(playback.handle(waiting, later()), sealer);
    let waited = waited.unwrap();
    assert_eq!((waited.status, waited.events), (Status::Complete, 1), "{waited:?}");
}

/// Puts `n` events for 5 entities on the event stream (`{"n": i}`), in order per entity.
async fn put_on_event_stream(env: &TestEnv, range: std::ops::Range<i64>) {
    for i in range {
        env.kinesis
            .put_record()
            .stream_name(&env.names.event_stream)
            .partition_key(format!("user-{}", i % 5))
            .data(aws_sdk_kinesis::primitives::Blob::new(json!({"n": i}).to_string()))
            .send()
            .await
            .unwrap();
    }
}

/// Arrival stamps (ms) of the event stream's records.
async fn arrivals_in_stream(env: &TestEnv) -> Vec<i64> {
    let records = env.read_stream(&env.names.event_stream).await;
    records.iter().filter_map(|(_, r)| r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok())).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_busy_shard_completes_slots_on_its_own_arrivals_an_idle_one_on_the_clock() {
    let env = TestEnv::start(1).await;
    let pump = common::pump(&env);
    put_on_event_stream(&env, 0..20).await;
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let last = arrivals_in_stream(&env).await.into_iter().max().unwrap();
    // An hour's clock allowance: by the clock alone the watermark would stand an hour back.
    scan_pass(&env, scan_config(&env, 3_600_000)).await;
    let watermark = event_store::bookkeeping::watermark::read(&env.dynamo, &env.names.event_table).await.unwrap();
    assert_eq!(
        watermark.time,
        Some(last),
        "buffered to its tip: the pump stores every later record at or after the last one's arrival"
    );
    // Nothing comes any more: the clock (no allowance here) takes it on.
    let idle_from = now_ms();
    scan_pass(&env, scan_config(&env, 0)).await;
    let watermark = event_store::bookkeeping::watermark::read(&env.dynamo, &env.names.event_table).await.unwrap();
    assert!(watermark.time.unwrap() >= idle_from, "{watermark:?} < {idle_from}");
    assert_eq!(watermark.late, 0, "nothing came in behind it");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_pump_holds_the_watermark_behind_the_events_still_in_the_stream() {
    let env = TestEnv::start(2).await;
    let config_scan = scan_config(&env, 0);
    let pump = common::pump(&env);
    // 40 events buffered, then the pump stalls: 60 more wait in the stream.
    put_on_event_stream(&env, 0..40).await;
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let stalled_from = now_ms();
    put_on_event_stream(&env, 40..100).await;
    // The end of the last waiting event's slot, and past it by more than any allowance (0 here).
    let end = now_ms() / 1000 * 1000 + 1000;
    tokio::time::sleep(Duration::from_millis((end + 300 - now_ms()).max(0) as u64)).await;
    scan_pass(&env, config_scan.clone()).await;
    let watermark = event_store::bookkeeping::watermark::read(&env.dynamo, &env.names.event_table).await.unwrap();
    let held = watermark.time.unwrap();
    let first_waiting = env
        .read_stream(&env.names.event_stream)
        .await
        .iter()
        .filter(|(_, r)| serde_json::from_slice::<Value>(r.data().as_ref()).unwrap()["n"].as_i64() >= Some(40))
        .filter_map(|(_, r)| r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()))
        .min()
        .unwrap();
    assert!(held >= stalled_from - 10_000, "the buffered events are not what holds it: {held}");
    assert!(held <= first_waiting, "watermark {held} passed an event waiting in the stream since {first_waiting}");

    let later = || SystemTime::now() + Duration::from_secs(900);
    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker));
    let early = playback.handle(window(stalled_from - 60_000, end), later()).await.unwrap();
    assert_eq!((early.status, early.events), (Status::Incomplete, 0), "{early:?}");

    // The pump recovers (the event source redelivers from its checkpoint: the whole shard here).
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let recovered = now_ms();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    scan_pass(&env, config_scan).await;
    let watermark = event_store::bookkeeping::watermark::read(&env.dynamo, &env.names.event_table).await.unwrap();
    assert!(watermark.time.unwrap() >= recovered, "idle, fully buffered shards hold nothing back");
    assert_eq!(watermark.late, 0, "nothing came in behind the watermark");
    let done = playback.handle(window(stalled_from - 60_000, recovered), later()).await.unwrap();
    assert_eq!((done.status, done.events), (Status::Complete, 100), "{done:?}");
    for (key, ns) in played(&env).await {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let expected: Vec<i64> = (0..100).filter(|n| n % 5 == user).collect();
        assert_eq!(ns, expected, "{key}: every event once, in order");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_split_shard_holds_the_watermark_until_its_children_are_buffered() {
    // moto moves a split parent's records into the children (new sequence numbers); Kinesis and
    // kinesalite keep them in the closed parent. So this runs in the strict suite only.
    if std::env::var("EMULATOR").as_deref() != Ok("strict") {
        println!("moto re-puts a split shard's records: this test runs against kinesalite (EMULATOR=strict)");
        return;
    }
    let env = TestEnv::start(1).await;
    let pump = common::pump(&env);
    let started = now_ms();
    put_on_event_stream(&env, 0..20).await;
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let stream = &env.names.event_stream;
    let parent = env.kinesis.list_shards().stream_name(stream).send().await.unwrap().shards()[0].shard_id().to_owned();
    env.kinesis
        .split_shard()
        .stream_name(stream)
        .shard_to_split(&parent)
        .new_starting_hash_key("170141183460469231731687303715884105728")
        .send()
        .await
        .unwrap();
    loop {
        let summary = env.kinesis.describe_stream_summary().stream_name(stream).send().await.unwrap();
        if summary.stream_description_summary().unwrap().stream_status()
            == &aws_sdk_kinesis::types::StreamStatus::Active
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // New events land in the children, which the pump has not read yet (the event source reads the parent first).
    put_on_event_stream(&env, 20..40).await;
    let shards = env.kinesis.list_shards().stream_name(stream).send().await.unwrap();
    assert_eq!(shards.shards().len(), 3, "the closed parent and two children");
    let end = now_ms() / 1000 * 1000 + 1000;
    tokio::time::sleep(Duration::from_millis((end + 300 - now_ms()).max(0) as u64)).await;
    scan_pass(&env, scan_config(&env, 0)).await;
    let held =
        event_store::bookkeeping::watermark::read(&env.dynamo, &env.names.event_table).await.unwrap().time.unwrap();
    let first_in_children = env
        .read_stream(stream)
        .await
        .iter()
        .filter(|(shard, _)| *shard != parent)
        .filter_map(|(_, r)| r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()))
        .min()
        .unwrap();
    assert!(
        held <= first_in_children,
        "watermark {held} passed the unread children's first record {first_in_children}"
    );

    // The event source goes on with the children (the parent's records again: skipped by its position).
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let recovered = now_ms();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    scan_pass(&env, scan_config(&env, 0)).await;
    let watermark = event_store::bookkeeping::watermark::read(&env.dynamo, &env.names.event_table).await.unwrap();
    assert!(watermark.time.unwrap() >= recovered, "a closed parent read to its end holds nothing back");
    let later = || SystemTime::now() + Duration::from_secs(900);
    let done = play(&env, config(&env, None), window(started - 1000, recovered), later).await;
    assert_eq!(done[0].events, 40, "{:?}", done[0]);
    for (key, ns) in played(&env).await {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let expected: Vec<i64> = (0..40).filter(|n| n % 5 == user).collect();
        assert_eq!(ns, expected, "{key}: every event once, in order across the split");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_load_stored_twice_after_an_ambiguous_put_is_played_once() {
    use event_store::config::{IpMode, LoadConfig, DEFAULT_MAX_EVENT_BYTES};
    use event_store_fault_proxy::{Config, Fault};
    let env = TestEnv::start(1).await;
    // Every other PutRecord is applied and then answered with a 500: the SDK sends it again.
    let only: &'static [Fault] = &[Fault::AppliedThenInternalError];
    let (faulty, proxy) = common::through_faults(&env, Config { seed: 3, rate: 0.5, only: Some(only) }).await;
    let load_config = LoadConfig {
        max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
        max_events_per_post: 100,
        ip_mode: IpMode::None,
        ..LoadConfig::new(env.names.event_stream.clone())
    };
    let load = event_store::load::Load::new(faulty, load_config);
    let start = now_ms();
    for _ in 0..30 {
        load.handle(lambda_http::request::from_str(&sample_event("load.json")).unwrap()).await;
    }
    let pump = common::pump(&env);
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let end = now_ms() / 1000 * 1000 + 1000;
    tokio::time::sleep(Duration::from_millis((end + 200 - now_ms()).max(0) as u64)).await;
    scan_pass(&env, scan_config(&env, 0)).await;

    let envelope_ids = |events: Vec<PlayedEvent>| -> Vec<String> {
        events.into_iter().map(|e| e.data.unwrap()["id"].as_str().unwrap().to_owned()).collect()
    };
    let items: Vec<event_store::event_item::EventItem> = common::stored_events(&env).await;
    let id_of = |e: &event_store::event_item::EventItem| e.json().unwrap()["id"].as_str().unwrap().to_owned();
    let stored: Vec<String> = items.iter().map(id_of).collect();
    let unique: std::collections::HashSet<&String> = stored.iter().collect();
    let copies = stored.len() - unique.len();
    println!("{} envelopes, {} stored items ({copies} copies); {:?}", unique.len(), stored.len(), proxy.counts());
    assert!(copies > 0, "the ambiguous puts stored some events twice");

    let later = || SystemTime::now() + Duration::from_secs(900);
    let summaries = play(&env, config(&env, None), window(start - 1000, end), later).await;
    let played = envelope_ids(played_events(&env).await);
    let played_unique: std::collections::HashSet<&String> = played.iter().collect();
    assert_eq!(played.len(), played_unique.len(), "every accepted event played once");
    assert_eq!(played_unique, unique, "and none missing");
    assert_eq!(summaries.iter().map(|s| s.duplicates_dropped).sum::<usize>(), copies);

    // Two windows that split a copy from its original: the second run looks back and still drops it.
    let mut by_id: HashMap<String, Vec<i64>> = HashMap::new();
    for item in &items {
        by_id.entry(id_of(item)).or_default().push(item.arrival);
    }
    let split = by_id.values().filter(|a| a.len() > 1).map(|a| *a.iter().max().unwrap()).min().unwrap();
    let first = play(&env, config(&env, None), window(start - 1000, split), later).await;
    let second = play(&env, config(&env, None), window(split, end), later).await;
    let (first, second) = (&first[0], &second[0]);
    assert_eq!(first.events + second.events, unique.len(), "each accepted event once over both windows");
    assert!(second.duplicates_dropped >= 1, "the copy after the split, its original before it: {second:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sparse_day_costs_one_query_per_non_empty_slot() {
    let env = TestEnv::start(1).await;
    // 10 events in 10 seconds scattered over a day.
    let seconds = [3, 4_000, 9_999, 20_000, 33_333, 50_000, 61_234, 70_000, 80_000, 86_399];
    let records: Vec<_> = seconds
        .iter()
        .enumerate()
        .map(|(n, s)| (format!("user-{n}"), json!({"n": n}).to_string().into_bytes(), T0 + s * 1000 + 17))
        .collect();
    buffer_through_pump(&env, &records).await;
    scan_pass(&env, scan_config(&env, 0)).await;
    env.counter.reset();
    let summaries =
        play(&env, config(&env, None), window(T0, T0 + 86_400_000), || SystemTime::now() + Duration::from_secs(900))
            .await;
    let summary = &summaries[0];
    assert_eq!((summary.events, summary.slots, summary.queries), (10, 10, 10), "{summary:?}");
    let queries = env.counter.get("DynamoDB.Query") as usize;
    println!("a day with 10 non-empty seconds: {queries} Query requests ({} for the index)", summary.index_queries);
    assert_eq!(queries, 1 + summary.index_queries + 10, "watermark, index, 10 slots: 0 for the 86,390 empty ones");
    assert!(summary.index_queries <= 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rate_limit_holds_and_filters_pick_events_by_a_json_field() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 1500, 3).await;
    let mut request = window(T0, T0 + 3000);
    request["max_records_per_second"] = json!(500);
    let started = std::time::Instant::now();
    let summaries = play(&env, config(&env, None), request, || SystemTime::now() + Duration::from_secs(900)).await;
    let elapsed = started.elapsed();
    assert_eq!(summaries[0].events, 1500);
    // Batches of 500 at 500/s: the first at once, the second after 1 s, the third after 2 s.
    assert!(elapsed >= Duration::from_secs(2), "{elapsed:?}");

    let mut filtered = window(T0, T0 + 3000);
    filtered["filter"] = json!([{"field": "/n", "equals": 7}]);
    let summaries = play(&env, config(&env, None), filtered, || SystemTime::now() + Duration::from_secs(900)).await;
    assert_eq!((summaries[0].events, summaries[0].filtered_out), (1, 1499));
    // A selection by fields in the clear: a run of its own (another id), passing over what it excludes.
    let mut selected = window(T0, T0 + 3000);
    selected["select"] = json!({"sources": ["stream"]});
    let summaries = play(&env, config(&env, None), selected, || SystemTime::now() + Duration::from_secs(900)).await;
    assert_eq!((summaries[0].status, summaries[0].events, summaries[0].filtered_out), (Status::Complete, 0, 1500));
    let mut posts = window(T0, T0 + 3000);
    posts["select"] = json!({"sources": ["post"], "stream_prefix": ""});
    let refused =
        Playback::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(LocalInvoker::channel().0));
    let err = refused.handle(posts, SystemTime::now() + Duration::from_secs(900)).await.unwrap_err();
    assert!(err.to_string().contains("is empty"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_would_wait_for_the_pace_into_its_deadline_hands_over_instead() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 1500, 3).await;
    let mut request = window(T0, T0 + 3000);
    request["max_records_per_second"] = json!(500);
    // 10.5 s left and a 10 s margin: the second batch would have to wait 1 s, into the margin.
    let summaries = play(&env, config(&env, None), request, || SystemTime::now() + Duration::from_millis(10_500)).await;
    assert!(summaries.len() >= 3, "{} runs", summaries.len());
    assert!(summaries.iter().all(|s| s.events <= 500), "one batch a run: {summaries:?}");
    assert_eq!(summaries.iter().map(|s| s.events).sum::<usize>(), 1500);
    let played = played(&env).await;
    assert_eq!(played.values().map(Vec::len).sum::<usize>(), 1500, "nothing put twice");
    for (key, ns) in &played {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        assert_eq!(ns, &(0..1500).filter(|n| n % 5 == user).collect::<Vec<_>>(), "{key}");
    }

    // Two runs of the window, each its half of the keys, each handing over at every batch: a
    // continuation goes on under its run's id, from its run's checkpoint.
    let part = |p: u32| {
        let mut request = window(T0, T0 + 3000);
        request["max_records_per_second"] = json!(1000);
        request["keys"] = json!({"part": p, "parts": 2});
        request
    };
    let short = || SystemTime::now() + Duration::from_millis(10_500);
    let (first, second) =
        tokio::join!(play(&env, config(&env, None), part(0), short), play(&env, config(&env, None), part(1), short));
    let run_id = event_store::playback::run_id(&event_store::log::Window { start: T0, end: T0 + 3000 }, &[]);
    for (p, runs) in [&first, &second].into_iter().enumerate() {
        assert_eq!(runs.last().unwrap().status, Status::Complete, "{runs:?}");
        assert!(runs.iter().all(|s| s.id == format!("{run_id}-{p}of2")), "{runs:?}");
    }
    assert_eq!(first.iter().chain(&second).map(|s| s.events).sum::<usize>(), 1500);
    let mut halves: HashMap<String, Vec<i64>> = HashMap::new();
    for event in played_events(&env).await.into_iter().filter(|e| e.keys.is_some()) {
        assert!(event.keys.unwrap().holds(&event.partition_key));
        halves.entry(event.partition_key).or_default().push(event.data.unwrap()["n"].as_i64().unwrap());
    }
    assert_eq!(halves, played, "each key's events once, in order, by the run of its half");
}

/// The played events of one run per partition key are each the expected `n`s, once, in order,
/// and the playback sequence numbers are 0..n without a gap or a repeat.
async fn assert_played_once_in_order(env: &TestEnv, n: i64) {
    for (key, ns) in played(env).await {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        assert_eq!(ns, (0..n).filter(|i| i % 5 == user).collect::<Vec<_>>(), "{key}: each once, in order");
    }
    let mut seqs: Vec<u64> = played_events(env).await.iter().map(|e| e.playback_seq).collect();
    seqs.sort();
    assert_eq!(seqs, (0..n as u64).collect::<Vec<_>>(), "continuous sequence numbers, none twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_playback_needing_40_continuations_finishes_in_order_with_continuous_sequence_numbers() {
    let env = TestEnv::start(2).await;
    stored_events(&env, 2100, 3).await;
    // 50 items a page and no time left: 42 runs in one chain (Lambda stops chains after
    // 16 hops unless the function allows recursion: the local runner follows the template).
    let summaries =
        play(&env, config(&env, Some(50)), window(T0, T0 + 3000), || SystemTime::now() + Duration::from_secs(1)).await;
    let continued = summaries.iter().filter(|s| s.status == Status::Continued).count();
    assert!(continued >= 40, "{continued} continuations");
    assert_eq!(summaries.iter().filter(|s| s.status == Status::Complete).count(), 1);
    assert_played_once_in_order(&env, 2100).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_stopped_at_max_continuations_goes_on_when_the_request_is_sent_again() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 700, 3).await;
    let no_time = || SystemTime::now() + Duration::from_secs(1);
    let bounded = PlaybackConfig { max_continuations: 3, ..config(&env, Some(50)) };
    let summaries = play(&env, bounded, window(T0, T0 + 3000), no_time).await;
    assert_eq!(summaries.iter().filter(|s| s.status == Status::Stopped).count(), 1, "{summaries:?}");
    assert_eq!(summaries.iter().map(|s| s.events).sum::<usize>(), 4 * 50, "the first run and 3 continuations");
    // Meanwhile the stack is upgraded from the version that kept every bookkeeping item in slot -2,
    // where a run of that version holds the id's lease for a second and a half more.
    common::as_the_version_before(&env, Family::Playbacks).await;
    let id = event_store::playback::run_id(&event_store::log::Window { start: T0, end: T0 + 3000 }, &[]);
    let old_lease_until = now_ms() + 1_500;
    common::an_old_lease(&env, &format!("playback#{id}"), old_lease_until).await;
    let later = || SystemTime::now() + Duration::from_secs(900);
    let rest = play(&env, config(&env, Some(50)), window(T0, T0 + 3000), later).await;
    assert!(now_ms() > old_lease_until, "it waited for the old run's lease to lapse");
    assert_eq!(rest.iter().map(|s| s.events).sum::<usize>(), 500, "the rest, from the checkpoint it moved");
    assert_played_once_in_order(&env, 700).await;
    let moved = event_store::bookkeeping::key_in(Family::Playbacks, format!("playback#{id}"));
    let get = env.dynamo.get_item().table_name(&env.names.event_table).set_key(Some(moved));
    assert!(get.send().await.unwrap().item().is_some(), "in its own partition now");
}

/// Issue 27, item 14: a run killed mid-window (out of memory, the sandbox
/// gone) keeps its lease; Lambda's retry of the invocation (the same payload)
/// waits for the lease to lapse and goes on from the checkpoint, instead of
/// answering `busy` and counting as done.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_killed_mid_window_is_taken_over_by_the_retry_of_its_invocation() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 1500, 3).await;
    let short_lease = PlaybackConfig { lease: Duration::from_secs(2), ..config(&env, Some(100)) };
    let mut request = window(T0, T0 + 3000);
    request["max_records_per_second"] = json!(300);
    let later = || SystemTime::now() + Duration::from_secs(900);
    let (invoker, _rx) = LocalInvoker::channel();
    let first = Playback::new(env.dynamo.clone(), env.kinesis.clone(), short_lease.clone(), Arc::new(invoker));
    let payload = request.clone();
    let running = tokio::spawn(async move { first.handle(payload, later()).await });
    let id = event_store::playback::run_id(&event_store::log::Window { start: T0, end: T0 + 3000 }, &[]);
    common::kill_playback_after(&env, &id, 300, running).await;
    let retried = play(&env, short_lease, request, later).await;
    assert_eq!(retried.last().unwrap().status, Status::Complete, "{retried:?}");
    let mut seqs: Vec<u64> = played_events(&env).await.iter().map(|e| e.playback_seq).collect();
    let delivered = seqs.len();
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs, (0..1500).collect::<Vec<u64>>(), "every event, numbers continuing across the kill");
    assert!(delivered <= 1500 + 500, "at most the batch in flight again: {delivered}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_concurrent_runs_of_one_request_deliver_each_event_once() {
    let env = TestEnv::start(2).await;
    stored_events(&env, 1000, 3).await;
    // moto checks a conditional write's condition and applies it without a
    // lock, so both runs could take the lease there (and one then fail with
    // LeaseLost: a CI run did); DynamoDB and dynalite cannot. The runs' table
    // requests go to it one at a time; the runs still race request by request.
    let serial =
        event_store_fault_proxy::FaultProxy::start_one_at_a_time(env.sdk.endpoint_url().unwrap()).await.unwrap();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk).endpoint_url(&serial.endpoint).build(),
    );
    let no_time = || SystemTime::now() + Duration::from_secs(1);
    let run = || play_on(dynamo.clone(), env.kinesis.clone(), config(&env, Some(100)), window(T0, T0 + 3000), no_time);
    let (a, b) = tokio::join!(run(), run());
    let statuses: Vec<Status> = a.iter().chain(&b).map(|s| s.status).collect();
    assert!(
        statuses.iter().any(|s| matches!(s, Status::Busy | Status::AlreadyDone)),
        "one of the two found the other running: {statuses:?}"
    );
    assert_eq!(a.iter().chain(&b).map(|s| s.events).sum::<usize>(), 1000, "each batch put once");
    assert_played_once_in_order(&env, 1000).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_id_is_bound_to_the_window_and_filter_of_its_first_run() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 300, 3).await;
    let later = || SystemTime::now() + Duration::from_secs(900);
    let named = |start: i64, end: i64| json!({"id": "daily", "start": format_ms(start), "end": format_ms(end)});
    let first = play(&env, config(&env, None), named(T0, T0 + 2000), later).await;
    assert_eq!((first[0].status, first[0].events), (Status::Complete, 200));

    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker));
    let other_window = playback.handle(named(T0 + 1000, T0 + 3000), later()).await.unwrap_err();
    assert!(matches!(other_window, Error::BadInput(ref m) if m.contains("\"daily\"")), "{other_window}");
    let mut other_filter = named(T0, T0 + 2000);
    other_filter["filter"] = json!([{"field": "/n", "equals": 7}]);
    assert!(matches!(playback.handle(other_filter, later()).await, Err(Error::BadInput(_))));
    // The id alone names its window.
    let by_id = playback.handle(json!({"id": "daily"}), later()).await.unwrap();
    assert_eq!((by_id.status, by_id.start.as_str()), (Status::AlreadyDone, format_ms(T0).as_str()));
    // Restarting with another window rebinds it.
    let mut rebind = named(T0 + 2000, T0 + 3000);
    rebind["restart"] = json!(true);
    let rebound = playback.handle(rebind, later()).await.unwrap();
    assert_eq!((rebound.status, rebound.events), (Status::Complete, 100));
    assert_eq!(played(&env).await.values().map(Vec::len).sum::<usize>(), 300, "nothing played twice");
}

static OPEN_PUTS: AtomicUsize = AtomicUsize::new(0);

/// A request without `end` means "up to the watermark": a retry after a
/// crash must finish that window, not start another one from sequence 0.
#[tokio::test(flavor = "multi_thread")]
async fn a_retried_open_ended_request_reuses_its_first_window() {
    let env = TestEnv::start(1).await;
    let base = now_ms() - 60_000;
    let records: Vec<_> = (0..700)
        .map(|i| (format!("user-{}", i % 5), json!({"n": i}).to_string().into_bytes(), base + i * 10))
        .collect();
    buffer_through_pump(&env, &records).await;
    scan_pass(&env, scan_config(&env, 0)).await;
    let dying = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(&env.sdk)
            .endpoint_url(&env.kinesis_endpoint)
            // The first PutRecords gets through, every later one fails.
            .interceptor(common::FailRequests::new(|body, _| {
                body.windows(7).any(|w| w == b"Records") && OPEN_PUTS.fetch_add(1, Ordering::SeqCst) >= 1
            }))
            .build(),
    );
    let later = || SystemTime::now() + Duration::from_secs(900);
    let (invoker, _rx) = LocalInvoker::channel();
    let first = Playback::new(env.dynamo.clone(), dying, config(&env, Some(200)), Arc::new(invoker));
    assert!(first.handle(json!({}), later()).await.is_err(), "the first run died after one request");
    // Meanwhile the watermark moves on by a slot or more.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    buffer_through_pump(&env, &[("user-9".into(), json!({"n": 9999}).to_string().into_bytes(), now_ms())]).await;
    scan_pass(&env, scan_config(&env, 0)).await;
    let retry = play(&env, config(&env, Some(200)), json!({}), later).await;
    assert_eq!(retry.iter().map(|s| s.events).sum::<usize>(), 200, "only what the first run had not put");
    assert_played_once_in_order(&env, 700).await;
}

/// Anyone allowed to invoke playback can send a payload: where to resume
/// and whether the window is complete never come from it.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_payload_cannot_play_an_incomplete_window() {
    let env = TestEnv::start(1).await;
    let now = now_ms();
    buffer_through_pump(&env, &[("k".into(), json!({"n": 1}).to_string().into_bytes(), now - 5_000)]).await;
    scan_pass(&env, scan_config(&env, 0)).await;
    let (invoker, _rx) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker));
    let later = SystemTime::now() + Duration::from_secs(900);
    let incomplete = window(now - 60_000, now + 60_000);
    let mut resume = incomplete.clone();
    resume["resume"] = json!({"slot": now - 60_000, "seq": 0});
    assert!(matches!(playback.handle(resume, later).await, Err(Error::BadInput(_))), "an unknown field");
    let mut lease = incomplete.clone();
    lease["lease"] = json!("0123456789abcdef");
    lease["hop"] = json!(5);
    let answer = playback.handle(lease, later).await.unwrap();
    assert_eq!((answer.status, answer.events), (Status::Incomplete, 0));
    assert!(played_events(&env).await.is_empty(), "nothing of an incomplete window went out");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_too_large_for_a_kinesis_record_is_replaced_by_a_marker_in_its_place() {
    let env = TestEnv::start(1).await;
    // 900 KB of binary data: stored compressed, but base64 makes its played record ~1.2 MB.
    let large: Vec<u8> = (0..900_000).map(|i| (i % 251) as u8 | 0x80).collect();
    let mut records: Vec<_> =
        (0..4).map(|i| ("user-0".to_string(), json!({"n": i}).to_string().into_bytes(), T0 + i * 100)).collect();
    records.insert(2, ("user-0".to_string(), large, T0 + 150));
    buffer_through_pump(&env, &records).await;
    scan_pass(&env, scan_config(&env, 0)).await;
    let summaries =
        play(&env, config(&env, None), window(T0, T0 + 1000), || SystemTime::now() + Duration::from_secs(900)).await;
    assert_eq!((summaries[0].status, summaries[0].events, summaries[0].oversized), (Status::Complete, 5, 1));
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        let size = record.data().as_ref().len() + record.partition_key().unwrap_or_default().len();
        assert!(size <= 1024 * 1024, "a record of {size} bytes");
    }
    let events = played_events(&env).await;
    let shape: Vec<(u64, Option<i64>, bool)> = events
        .iter()
        .map(|e| (e.playback_seq, e.data.as_ref().and_then(|d| d["n"].as_i64()), e.too_large.is_some()))
        .collect();
    assert_eq!(
        shape,
        vec![(0, Some(0), false), (1, Some(1), false), (2, None, true), (3, Some(2), false), (4, Some(3), false)]
    );
    let marker = events[2].too_large.as_ref().unwrap();
    assert!(marker.bytes > 1024 * 1024 && marker.slot == T0, "{marker:?}");
    assert!(events[2].data_base64.is_none(), "the marker says where the event is, without it");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_put_of_a_run_hands_over_rather_than_wait_into_the_margin() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 600, 3).await;
    let mut request = window(T0, T0 + 3000);
    request["max_records_per_second"] = json!(100);
    // 13 s left and a 10 s margin: after the first 500, the last 100 events would have to
    // wait 5 s for the pace, into the margin.
    let summaries = play(&env, config(&env, None), request, || SystemTime::now() + Duration::from_secs(13)).await;
    assert!(summaries.len() >= 2, "{summaries:?}");
    assert!(summaries.iter().all(|s| s.events <= 500), "one batch a run: {summaries:?}");
    assert_played_once_in_order(&env, 600).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_playback_with_another_time_unit_than_the_tables_is_refused() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 10, 1).await;
    let (invoker, _rx) = LocalInvoker::channel();
    let halves = PlaybackConfig { time_unit_ms: 500, ..config(&env, None) };
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), halves, Arc::new(invoker));
    let err = playback.handle(window(T0, T0 + 1000), SystemTime::now() + Duration::from_secs(900)).await.unwrap_err();
    assert!(matches!(err, Error::Config(ref m) if m.contains("TIME_UNIT is 500")), "{err}");
}

/// Lambda may deliver an asynchronous invocation twice (and the SDK may send
/// an `Invoke` again): each run takes the lease under a token of its own, so
/// the second copy of a continuation finds the lease handed on and plays nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_continuation_delivered_twice_runs_once() {
    let env = TestEnv::start(1).await;
    stored_events(&env, 300, 3).await;
    let (invoker, mut continuations) = LocalInvoker::channel();
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, Some(50)), Arc::new(invoker));
    let no_time = || SystemTime::now() + Duration::from_secs(1);
    let first = playback.handle(window(T0, T0 + 3000), no_time()).await.unwrap();
    assert_eq!((first.status, first.events), (Status::Continued, 50));
    let (continuation, _) = continuations.try_recv().unwrap();
    let second = playback.handle(continuation.clone(), no_time()).await.unwrap();
    assert_eq!((second.status, second.events), (Status::Continued, 50));
    let copy = playback.handle(continuation, no_time()).await.unwrap();
    assert_eq!((copy.status, copy.events), (Status::Busy, 0), "{copy:?}");
    // The chain goes on from the second run's continuation and finishes.
    let mut total = first.events + second.events;
    while let Ok((next, _)) = continuations.try_recv() {
        total += playback.handle(next, no_time()).await.unwrap().events;
    }
    assert_eq!(total, 300);
    assert_played_once_in_order(&env, 300).await;
}

/// Packed storage: items written before chunks (one event each) and chunks
/// in one slot, and chunks that hold the same events cut at other boundaries
/// (a batch buffered again after its shard's position was lost): every
/// event is played once, each key in order.
#[tokio::test(flavor = "multi_thread")]
async fn old_items_and_chunks_in_one_slot_and_chunks_cut_twice_play_each_event_once_in_order() {
    use event_store::buffer_item::BufferItem;
    let env = TestEnv::start(1).await;
    let record = |n: i64| {
        (format!("user-{}", n % 5), json!({"n": n, "pad": "x".repeat(100)}).to_string().into_bytes(), T0 + n * 5)
    };
    let records: Vec<_> = (0..300).map(record).collect();
    let event = common::kinesis_event(common::TEST_ARN, &records);
    let pump = common::pump(&env);
    assert!(pump.handle(event.clone()).await.batch_item_failures.is_empty());
    // The same records again in two other pieces, as if the shard's position had been lost.
    event_store::bookkeeping::shard_position::forget_all(&env.dynamo, &env.names.event_table).await.unwrap();
    for range in [50..120, 120..200] {
        let mut piece = event.clone();
        piece.records = event.records[range].to_vec();
        assert!(pump.handle(piece).await.batch_item_failures.is_empty());
    }
    scan_pass(&env, scan_config(&env, 0)).await;
    // Events 300..360 as the scan wrote them before chunks: one item each, in the same slots.
    for n in 300..360 {
        let (data, encoding) = event_store::encoding::encode(&record(n).1);
        let buffered = BufferItem {
            id: format!("old-{n}"),
            event_id: format!("shardId-000000000009:{}", 1000 + n),
            arrival: T0 + (n - 300) * 25 + 1,
            partition_key: record(n).0,
            data,
            encoding,
            buffered_at: None,
            count: None,
        };
        let item = buffered.to_event_item(1000).unwrap().to_item();
        env.dynamo.put_item().table_name(&env.names.event_table).set_item(Some(item)).send().await.unwrap();
    }
    let stored = common::stored_events(&env).await.len();
    assert_eq!(stored, 300 + 150 + 60, "the copies are stored (the documented cost of a lost position)");

    let summaries =
        play(&env, config(&env, Some(3)), window(T0, T0 + 2000), || SystemTime::now() + Duration::from_secs(900)).await;
    assert_eq!(summaries.iter().map(|s| s.events).sum::<usize>(), 360, "{summaries:?}");
    let mut by_time: Vec<PlayedEvent> = played_events(&env).await;
    by_time.sort_by_key(|e| e.playback_seq);
    assert_eq!(by_time.iter().map(|e| e.playback_seq).collect::<Vec<_>>(), (0..360).collect::<Vec<u64>>());
    assert!(by_time.windows(2).all(|w| w[0].event_ms <= w[1].event_ms), "in the order of the log");
    for (key, ns) in played(&env).await {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let mut expected: Vec<(i64, i64)> = (0..360)
            .filter(|n| n % 5 == user)
            .map(|n| (if n < 300 { T0 + n * 5 } else { T0 + (n - 300) * 25 + 1 }, n))
            .collect();
        expected.sort();
        assert_eq!(ns, expected.into_iter().map(|(_, n)| n).collect::<Vec<_>>(), "{key}: each once, in order");
    }
}

/// A slot spread over 8 sub-keys (`SLOT_SUBKEYS`): chunks land on every
/// sub-key, the index says 8, and a playback merging the 8 queries (in
/// small pages, so the merge waits on the slowest) plays everything once, in order.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_spread_over_8_sub_keys_plays_back_complete_and_in_order() {
    let env = TestEnv::start(1).await;
    let records: Vec<_> =
        (0..600).map(|n| (format!("user-{}", n % 5), json!({"n": n}).to_string().into_bytes(), T0 + n * 5)).collect();
    common::buffer_one_by_one(&env, &records).await;
    scan_pass(&env, ScanConfig { slot_subkeys: 8, ..scan_config(&env, 0) }).await;
    let (slots, _) =
        event_store::bookkeeping::slot_index::read_index(&env.dynamo, &env.names.event_table, T0, T0 + 3000)
            .await
            .unwrap();
    assert_eq!(
        slots.iter().map(|s| (s.slot, s.subkeys)).collect::<Vec<_>>(),
        vec![(T0, 8), (T0 + 1000, 8), (T0 + 2000, 8)]
    );
    let items = env.scan_table(&env.names.event_table).await;
    let subkeys: std::collections::BTreeSet<i64> = items
        .iter()
        .filter_map(|i| i["slot"].as_n().ok()?.parse::<i64>().ok())
        .filter(|s| (T0..T0 + 1000).contains(s))
        .collect();
    assert_eq!(subkeys, (T0..T0 + 8).collect(), "all 8 sub-keys of the first slot hold chunks");
    // What the scan stored, before playback reads it (a shortfall here is the store's or the emulator's).
    assert_eq!(common::stored_events(&env).await.len(), 600, "stored by the scan");

    let summaries =
        play(&env, config(&env, Some(7)), window(T0, T0 + 3000), || SystemTime::now() + Duration::from_secs(900)).await;
    assert_eq!(summaries.iter().map(|s| s.events).sum::<usize>(), 600, "{summaries:?}");
    assert_played_once_in_order(&env, 600).await;
    let mut events = played_events(&env).await;
    events.sort_by_key(|e| e.playback_seq);
    assert!(events.windows(2).all(|w| w[0].event_ms < w[1].event_ms), "in time order across the 8 sub-keys");
}
