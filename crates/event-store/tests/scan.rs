//! scan → event table, against a real emulator (moto_server, or dynalite + kinesalite with EMULATOR=strict), with forks run in-process.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use common::{buffer_one_by_one, buffer_through_pump, buffered_events, sample_event, TestEnv};
use event_store::bookkeeping::{ingest, slot_index, watermark};
use event_store::config::ScanConfig;
use event_store::event_item::EventItem;
use event_store::scan::{Scan, ScanSummary};
use event_store::time::now_ms;
use event_store_emulator::invoke::{recursive_loop, LocalInvoker};
use event_store_emulator::runs::{self, run_scan};

const T0: i64 = 1_795_327_124_000;

fn config(env: &TestEnv, page_items: Option<i32>) -> ScanConfig {
    ScanConfig { page_items, ..runs::scan_config(&env.names) }
}

/// Runs one scheduled scan and every fork it causes; `deadline` gives each invocation its deadline.
async fn scan_until_idle(env: &TestEnv, config: ScanConfig, deadline: fn() -> SystemTime) -> Vec<ScanSummary> {
    let schedule = serde_json::from_str(&sample_event("scan.json")).unwrap();
    let runs = run_scan(env.dynamo.clone(), env.kinesis.clone(), config, schedule, deadline).await;
    runs.into_iter().map(|run| run.expect("scan run")).collect()
}

fn plenty_of_time() -> SystemTime {
    SystemTime::now() + Duration::from_secs(900)
}

/// Inside the 10 s margin from the start: each run does one page, then hands over.
fn no_time() -> SystemTime {
    SystemTime::now() + Duration::from_secs(1)
}

/// `n` events over three slots, for four entities, arrivals strictly increasing.
fn events(n: i64) -> Vec<(String, Vec<u8>, i64)> {
    (0..n).map(|i| (format!("user-{}", i % 4), format!("{{\"n\":{i}}}").into_bytes(), T0 + i * 3000 / n)).collect()
}

/// The events in the event table (chunks decoded; not the bookkeeping partition).
async fn event_items(env: &TestEnv) -> Vec<EventItem> {
    common::stored_events(env).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_scan_moves_everything_into_time_slots() {
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(300)).await;
    buffer_through_pump(&env, &[("bin".into(), vec![0xff, 0xfe, 0x00], T0 + 500)]).await;

    // The four segments each ADD their count to one minute's item at the end of their runs: moto
    // applies concurrent updates of one item without a lock (seen: one segment's 101 lost), DynamoDB
    // atomically. The segments' requests reach moto one at a time.
    let endpoint = env.sdk.endpoint_url().unwrap().to_owned();
    let serial = event_store_fault_proxy::FaultProxy::start_one_at_a_time(&endpoint).await.unwrap();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk).endpoint_url(&serial.endpoint).build(),
    );
    let schedule = serde_json::from_str(&sample_event("scan.json")).unwrap();
    let runs = run_scan(dynamo, env.kinesis.clone(), config(&env, None), schedule, plenty_of_time).await;
    let summaries: Vec<ScanSummary> = runs.into_iter().map(|run| run.expect("scan run")).collect();
    drop(serial);
    assert_eq!(summaries.iter().map(|s| s.forked).sum::<u32>(), 4, "one fork per segment, no continuations");
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 301);
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty(), "buffer drained");

    let items = event_items(&env).await;
    assert_eq!(items.len(), 301);
    for item in &items {
        assert_eq!(item.slot, item.arrival - item.arrival.rem_euclid(1000), "slot is the truncated arrival");
        assert!(item.sort_key.starts_with(&format!("{:013}#", item.arrival)));
    }
    let binary = items.iter().find(|i| i.partition_key == "bin").unwrap();
    assert_eq!(binary.data.as_deref(), Some(&[0xff, 0xfe, 0x00][..]));
    let json = items.iter().find(|i| i.partition_key == "user-1").unwrap();
    assert!(json.json().unwrap()["n"].is_number(), "JSON reads back");

    let mut slots: Vec<i64> = items.iter().map(|i| i.slot).collect();
    slots.dedup();
    slots.sort();
    slots.dedup();
    assert_eq!(slots, vec![T0, T0 + 1000, T0 + 2000]);
    // Status's ingest count: every moved event under the minute of its arrival (T0 is 44 s into one).
    let counts = ingest::per_minute(&env.dynamo, &env.names.event_table, T0 + 3_000, 2).await.unwrap();
    assert_eq!(counts, vec![0, 301]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_query_of_a_slot_returns_events_in_arrival_order() {
    let env = TestEnv::start(1).await;
    // Same arrival ms for a run of events: the sequence number breaks the tie.
    let records: Vec<_> =
        (0..120).map(|i| ("k".to_string(), format!("{{\"n\":{i}}}").into_bytes(), T0 + i / 10)).collect();
    buffer_through_pump(&env, &records).await;
    scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    let out = env
        .dynamo
        .query()
        .table_name(&env.names.event_table)
        .key_condition_expression("slot = :s")
        .expression_attribute_values(":s", aws_sdk_dynamodb::types::AttributeValue::N(T0.to_string()))
        .send()
        .await
        .unwrap();
    // Chunks come in the order of their first event; within one, events are in order.
    let order: Vec<i64> = out
        .items()
        .iter()
        .flat_map(|i| event_store::chunk::decode_item(T0, i).events.unwrap())
        .map(|e| e.json().unwrap()["n"].as_i64().unwrap())
        .collect();
    assert_eq!(order, (0..120).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_multi_page_buffer_is_finished_by_self_invoked_continuations() {
    let env = TestEnv::start(1).await;
    buffer_one_by_one(&env, &events(400)).await;
    // 20 items a page and no time left: every page ends in a continuation.
    let summaries = scan_until_idle(&env, config(&env, Some(20)), no_time).await;
    let continuations = summaries.iter().filter(|s| s.pages > 0 && s.forked == 1).count();
    assert!(continuations >= 400 / 20 - 4, "{continuations} continuations");
    assert!(summaries.iter().all(|s| s.pages <= 1), "each run did one page, then handed over");
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 400);
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
    assert_eq!(event_items(&env).await.len(), 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn moving_costs_at_most_one_request_per_10_events_and_overlapping_scans_do_not_duplicate() {
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(1000)).await;
    env.counter.reset();
    // Two schedules firing at once: both scan the same buffer.
    let (a, b) = tokio::join!(
        scan_until_idle(&env, config(&env, None), plenty_of_time),
        scan_until_idle(&env, config(&env, None), plenty_of_time)
    );
    let requests = env.counter.service_total("DynamoDB");
    println!(
        "scan (two overlapping runs): {requests} DynamoDB requests for 1000 events = {:.3} per event: {:?}",
        requests as f64 / 1000.0,
        env.counter.snapshot()
    );
    assert!(a.iter().chain(&b).map(|s| s.moved).sum::<usize>() >= 1000);
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
    let items = event_items(&env).await;
    assert_eq!(items.len(), 1000, "no duplicates, no loss");

    // A single run's cost.
    buffer_through_pump(&env, &events(1000).into_iter().map(|(k, d, t)| (k, d, t + 10_000)).collect::<Vec<_>>()).await;
    env.counter.reset();
    scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    let requests = env.counter.service_total("DynamoDB");
    common::assert_only_declared_actions(&env.counter, event_store::scan::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "ScanFunction");
    println!(
        "scan: {requests} DynamoDB requests for 1000 events = {:.3} per event: {:?}",
        requests as f64 / 1000.0,
        env.counter.snapshot()
    );
    // Moving: at most one request per 10 events; bookkeeping: a few writes per segment and pass
    // (claim, take, finish, watermark, the ingest count of the one minute these arrived in),
    // whatever the number of events.
    let moving = requests - env.counter.get("DynamoDB.UpdateItem");
    assert!(moving as f64 / 1000.0 <= 0.1, "{moving} requests to move 1000 events");
    // These arrived behind the watermark (late): a marker per slot they went into, once a run.
    let table = &env.names.event_table;
    let marked =
        event_store::bookkeeping::late_slots::in_range(&env.dynamo, table, 0, i64::MAX).await.unwrap().len() as u64;
    assert!(marked <= 3, "{marked} slots marked late");
    assert!(env.counter.get("DynamoDB.UpdateItem") <= 6 * 4 + 1 + marked, "{:?}", env.counter.snapshot());
    assert_eq!(event_items(&env).await.len(), 2000);
}

#[tokio::test(flavor = "multi_thread")]
async fn items_that_cannot_become_events_are_quarantined_with_the_reason_and_the_scan_goes_on() {
    use aws_sdk_dynamodb::types::AttributeValue::{B, N, S};
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(50)).await;
    let bad = [
        ("no-arrival", vec![("event_id", S("shardId-000000000000:1".into())), ("partition_key", S("k".into()))]),
        (
            "text-arrival",
            vec![
                ("event_id", S("shardId-000000000000:2".into())),
                ("arrival", S("soon".into())),
                ("partition_key", S("k".into())),
                ("data", B(b"{}".to_vec().into())),
            ],
        ),
        (
            "number-data",
            vec![
                ("event_id", S("shardId-000000000000:3".into())),
                ("arrival", N(T0.to_string())),
                ("partition_key", S("k".into())),
                ("data", N("7".into())),
            ],
        ),
    ];
    for (id, attributes) in &bad {
        let mut request = env.dynamo.put_item().table_name(&env.names.buffer_table).item("id", S(id.to_string()));
        for (name, value) in attributes {
            request = request.item(*name, value.clone());
        }
        request.send().await.unwrap();
    }

    env.counter.reset();
    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    assert_eq!(summaries.iter().map(|s| s.quarantined).sum::<usize>(), 3);
    common::assert_allowed_by_the_template(&env.counter, "ScanFunction");
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty(), "good items moved, bad ones quarantined");
    let all = env.scan_table(&env.names.event_table).await;
    // Bookkeeping partitions are slots below the quarantine's (-1).
    let all = all.into_iter().filter(|i| i["slot"].as_n().unwrap().parse::<i64>().unwrap() >= -1);
    let (quarantined, events): (Vec<_>, Vec<_>) = all.partition(|i| i["slot"] == N("-1".into()));
    let events: usize = events.iter().map(|i| event_store::chunk::decode_item(0, i).events.unwrap().len()).sum();
    assert_eq!(events, 50, "the good events all went through");
    let mut ids: Vec<String> = quarantined.iter().map(|i| i["sort_key"].as_s().unwrap().clone()).collect();
    ids.sort();
    assert_eq!(ids, vec!["no-arrival", "number-data", "text-arrival"]);
    for item in &quarantined {
        let reason = item["reason"].as_s().unwrap();
        assert!(reason.starts_with("malformed item: buffer item"), "{reason}");
        assert!(item["original"].as_m().unwrap().contains_key("partition_key"), "the original is kept");
    }
}

/// Issue 27, item 13: an item that can neither move nor be quarantined
/// holds the watermark at its arrival, and the scan's summary names it.
#[tokio::test(flavor = "multi_thread")]
async fn an_item_that_can_neither_move_nor_be_quarantined_holds_the_watermark() {
    use aws_sdk_dynamodb::types::AttributeValue::{N, S};
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(50)).await;
    // Data of the wrong type (so no event), and too large to be copied into a quarantine item.
    let huge = env.dynamo.put_item().table_name(&env.names.buffer_table).item("id", S("huge".into()));
    let huge = huge.item("event_id", S("shardId-000000000000:9".into())).item("partition_key", S("k".into()));
    let huge = huge.item("arrival", N((T0 + 1_000).to_string())).item("data", N("7".into()));
    let huge = huge.item("pad", S("x".repeat(400_000)));
    huge.send().await.unwrap();
    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 50, "the others move on: {summaries:?}");
    let stuck: Vec<&String> = summaries.iter().flat_map(|s| &s.stuck).collect();
    assert_eq!(stuck, ["huge"], "{summaries:?}");
    let mark = watermark::read(&env.dynamo, &env.names.event_table).await.unwrap().time.unwrap();
    assert!(mark <= T0 + 1_000, "held at the stuck item's arrival: {mark}");
    assert_eq!(env.scan_table(&env.names.buffer_table).await.len(), 1, "left in place");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_between_put_and_delete_is_repaired_by_the_next_scan_without_duplicates() {
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(120)).await;
    let crashing = aws_sdk_dynamodb::Client::from_conf(
        // Every BatchWriteItem that deletes fails: the crash between put and delete.
        aws_sdk_dynamodb::config::Builder::from(&env.sdk)
            .interceptor(common::FailRequests::new(|body, _| body.windows(13).any(|w| w == b"DeleteRequest")))
            .build(),
    );
    let fast =
        event_store::batch::Backoff { base: Duration::from_millis(1), cap: Duration::from_millis(5), max_attempts: 3 };
    let (invoker, _rx) = LocalInvoker::channel();
    let scan = Scan::new(crashing, env.kinesis.clone(), config(&env, None), Arc::new(invoker)).with_backoff(fast);
    let task = serde_json::json!({"segment": 0, "total_segments": 1});
    let summary = scan.handle(task, plenty_of_time()).await.unwrap();
    assert_eq!((summary.moved, summary.failed), (0, 120), "nothing counted as moved");
    assert_eq!(buffered_events(&env).await, 120, "the buffer still holds everything");
    assert_eq!(event_items(&env).await.len(), 120, "the puts happened");

    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 120);
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
    let items = event_items(&env).await;
    assert_eq!(items.len(), 120, "the repeated put overwrote: no duplicate");
    let mut ns: Vec<i64> = items.iter().map(|i| i.json().unwrap()["n"].as_i64().unwrap()).collect();
    ns.sort();
    assert_eq!(ns, (0..120).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn events_near_the_400_kb_item_limit_are_moved_or_refused_at_the_pump_never_stuck() {
    let env = TestEnv::start(1).await;
    let pump = common::pump(&env);
    let limit = event_store::event_item::MAX_ITEM_BYTES - event_store::pump::ITEM_HEADROOM;
    // Random bytes: compression cannot shrink them under the limit.
    let mut rng = fastrand::Rng::with_seed(2026);
    let mut noise = |n: usize| (0..n).map(|_| rng.u8(..)).collect::<Vec<u8>>();
    let records = vec![
        ("near".to_string(), noise(limit - 400), T0), // fits with its attributes
        ("over".to_string(), noise(limit), T0 + 1),   // does not, with them
        ("json".to_string(), format!("{{\"s\":\"{}\"}}", "j".repeat(limit - 400)).into_bytes(), T0 + 2),
    ];
    let event = common::kinesis_event(common::TEST_ARN, &records);
    let sequences: Vec<String> = event.records.iter().map(|r| r.kinesis.sequence_number.clone()).collect();
    // Refused at the pump and quarantined there, with its place in the stream: its shard goes on.
    assert!(pump.handle(event).await.batch_item_failures.is_empty());
    let quarantined: Vec<_> = env
        .scan_table(&env.names.event_table)
        .await
        .into_iter()
        .filter(|i| i["slot"] == AttributeValue::N("-1".into()))
        .collect();
    assert_eq!(quarantined.len(), 1);
    let original = quarantined[0]["original"].as_m().unwrap();
    assert_eq!(original["sequence"].as_s().unwrap(), &sequences[1]);
    assert!(quarantined[0]["reason"].as_s().unwrap().contains("too large"));

    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 2);
    assert_eq!(summaries.iter().map(|s| s.quarantined).sum::<usize>(), 0);
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty(), "nothing stuck in the buffer");
    let items = event_items(&env).await;
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|i| i.bytes().unwrap().len() >= limit - 400));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pass_indexes_the_non_empty_slots_and_moves_the_watermark_forward_only() {
    let env = TestEnv::start(1).await;
    let table = &env.names.event_table;
    assert_eq!(watermark::read(&env.dynamo, table).await.unwrap().time, None, "no pass yet");
    // Three non-empty slots with gaps between them.
    let records: Vec<_> =
        [0, 5_000, 5_400, 61_000].iter().map(|&dt| ("k".to_string(), b"{}".to_vec(), T0 + dt)).collect();
    buffer_through_pump(&env, &records).await;
    let before = now_ms();
    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    let marks: Vec<i64> = summaries.iter().filter_map(|s| s.watermark).collect();
    assert_eq!(marks.len(), 4, "each of the 4 segments finished its pass");
    assert!(summaries.iter().all(|s| s.watermark_at_start.is_none()), "no watermark when the run started");
    let (slots, _) = slot_index::read_index(&env.dynamo, table, T0 - 60_000, T0 + 120_000).await.unwrap();
    assert_eq!(slots.iter().map(|s| s.slot).collect::<Vec<_>>(), vec![T0, T0 + 5_000, T0 + 61_000]);
    let first = watermark::read(&env.dynamo, table).await.unwrap().time.unwrap();
    assert!(first >= before - 1 && first <= now_ms(), "pass start, no lag allowed in this config: {first} vs {before}");
    // The lag metric's watermark, read as each segment's pass ends: none until all four have
    // a part (nothing is complete before), then the watermark itself.
    let ends: Vec<i64> = summaries.iter().filter_map(|s| s.complete_to).collect();
    assert!(ends.contains(&first) && ends.iter().all(|w| *w <= first), "{ends:?} vs {first}");

    env.counter.reset();
    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    let second = watermark::read(&env.dynamo, table).await.unwrap().time.unwrap();
    assert!(second > first, "a later pass moves it on");
    // The scheduled run reports the watermark it found (the awake run tells the subscriptions
    // when it moved); each segment's end the watermark then, for the lag metric.
    let found: Vec<i64> = summaries.iter().filter_map(|s| s.watermark_at_start).collect();
    assert_eq!(found, vec![first], "the scheduled run, and only it, reads the watermark at its start");
    let ends: Vec<i64> = summaries.iter().filter_map(|s| s.complete_to).collect();
    assert!(ends.contains(&second) && ends.iter().all(|w| (first..=second).contains(w)), "{ends:?}");
    common::assert_only_declared_actions(&env.counter, event_store::scan::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "ScanFunction");
}

/// Anyone allowed to invoke scan can send a segment payload: a pass's start
/// and what it saw come from the stored pass, never from the payload.
#[tokio::test(flavor = "multi_thread")]
async fn a_forged_segment_payload_moves_no_watermark() {
    let env = TestEnv::start(1).await;
    let table = &env.names.event_table;
    buffer_through_pump(&env, &events(40)).await;
    scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    let before = watermark::read(&env.dynamo, table).await.unwrap().time.unwrap();
    let (invoker, _rx) = LocalInvoker::channel();
    let scan = Scan::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker));
    let hour_ahead = now_ms() + 3_600_000;
    for forged in [
        serde_json::json!({"segment": 0, "total_segments": 4, "pass_started_at": hour_ahead}),
        serde_json::json!({"segment": 1, "total_segments": 4, "pass_started_at": hour_ahead, "oldest_left": hour_ahead}),
        serde_json::json!({"segment": 2, "total_segments": 4, "pass": "0123456789abcdef"}),
        serde_json::json!({"segment": 3, "total_segments": 4}),
    ] {
        let answer = scan.handle(forged.clone(), plenty_of_time()).await;
        assert!(answer.as_ref().map_or(true, |s| s.watermark.is_none()), "{forged}: {answer:?}");
    }
    assert_eq!(watermark::read(&env.dynamo, table).await.unwrap().time, Some(before), "not moved by any of them");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backlog_needing_40_continuations_of_one_segment_finishes() {
    let env = TestEnv::start(1).await;
    buffer_one_by_one(&env, &events(450)).await;
    // One segment, 10 items a page, one page a run: a chain of 45 runs (Lambda stops
    // chains after 16 hops unless the function allows recursion: the runner follows the template).
    let config = ScanConfig { segments: 1, ..config(&env, Some(10)) };
    let summaries = scan_until_idle(&env, config, no_time).await;
    let continuations = summaries.iter().filter(|s| s.forked == 1 && s.pages > 0).count();
    assert!(continuations >= 40, "{continuations} continuations");
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 450);
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
    assert!(summaries.iter().any(|s| s.watermark.is_some()), "the chain finished its pass");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chain_stops_at_max_continuations_and_the_next_schedule_starts_the_segment_over() {
    let env = TestEnv::start(1).await;
    buffer_one_by_one(&env, &events(100)).await;
    let config = ScanConfig { segments: 1, max_continuations: 3, ..config(&env, Some(10)) };
    let summaries = scan_until_idle(&env, config.clone(), no_time).await;
    assert_eq!(summaries.iter().filter(|s| s.stopped).count(), 1, "{summaries:?}");
    assert!(summaries.iter().all(|s| s.watermark.is_none()), "an unfinished pass moves no watermark");
    let moved: usize = summaries.iter().map(|s| s.moved).sum();
    assert_eq!(moved, 40, "the first run and 3 continuations, a page each");
    let summaries = scan_until_idle(&env, ScanConfig { max_continuations: 100, ..config }, no_time).await;
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 60, "the next pass moves the rest");
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
}

/// The schedule fires every minute whether or not the last pass finished:
/// a segment whose pass still runs (its lease not expired) is left to it.
#[tokio::test(flavor = "multi_thread")]
async fn a_scheduled_run_leaves_segments_whose_pass_still_runs_alone() {
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(40)).await;
    let schedule: serde_json::Value = serde_json::from_str(&sample_event("scan.json")).unwrap();
    let (invoker, mut forks) = LocalInvoker::channel();
    let scan = Scan::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker));
    let first = scan.handle(schedule.clone(), plenty_of_time()).await.unwrap();
    assert_eq!(first.forked, 4);
    // Its forks have not run yet (a slow pass): the next tick starts nothing.
    let second = scan.handle(schedule.clone(), plenty_of_time()).await.unwrap();
    assert_eq!((second.forked, second.busy), (0, 4), "{second:?}");
    // The forks run and finish their pass: the next tick starts a new one.
    let mut tasks = Vec::new();
    while let Ok((task, _)) = forks.try_recv() {
        tasks.push(task);
    }
    for task in tasks {
        assert!(scan.handle(task.clone(), plenty_of_time()).await.unwrap().watermark.is_some());
        // Lambda may deliver an asynchronous invocation twice: the second copy does nothing.
        assert!(scan.handle(task, plenty_of_time()).await.unwrap().superseded, "a fork delivered twice runs once");
    }
    let third = scan.handle(schedule, plenty_of_time()).await.unwrap();
    assert_eq!((third.forked, third.busy), (4, 0));
    assert!(env.scan_table(&env.names.buffer_table).await.is_empty());
}

/// A page of small items under throttling can take longer than the margin:
/// retries stop in time, and what was not written stays in the buffer.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_page_gives_up_its_retries_before_the_deadline() {
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(60)).await;
    let failing = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk)
            .interceptor(common::FailRequests::new(|body, _| body.windows(12).any(|w| w == b"RequestItems")))
            .build(),
    );
    let (invoker, _rx) = LocalInvoker::channel();
    let config = ScanConfig { deadline_margin: Duration::from_secs(2), ..config(&env, None) };
    let scan = Scan::new(failing, env.kinesis.clone(), config, Arc::new(invoker));
    let task = serde_json::json!({"segment": 0, "total_segments": 1});
    let started = std::time::Instant::now();
    let summary = scan.handle(task, SystemTime::now() + Duration::from_secs(3)).await.unwrap();
    assert!(started.elapsed() < Duration::from_secs(3), "past the deadline: {:?}", started.elapsed());
    assert_eq!((summary.moved, summary.failed), (0, 60));
    assert_eq!(buffered_events(&env).await, 60, "nothing lost");
}

/// The slot size is recorded at first use: another one would misfile and skip events.
#[tokio::test(flavor = "multi_thread")]
async fn a_different_time_unit_on_a_table_with_data_is_refused() {
    let env = TestEnv::start(1).await;
    buffer_through_pump(&env, &events(20)).await;
    scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    buffer_through_pump(&env, &events(20)).await;
    let (invoker, _rx) = LocalInvoker::channel();
    let config = ScanConfig { time_unit_ms: 500, ..config(&env, None) };
    let scan = Scan::new(env.dynamo.clone(), env.kinesis.clone(), config, Arc::new(invoker));
    let schedule: serde_json::Value = serde_json::from_str(&sample_event("scan.json")).unwrap();
    let err = scan.handle(schedule, plenty_of_time()).await.unwrap_err().to_string();
    assert!(err.contains("TIME_UNIT is 500") && err.contains("TIME_UNIT=1000"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn late_events_go_to_their_own_slot_and_are_counted() {
    let env = TestEnv::start(1).await;
    let table = &env.names.event_table;
    let now = now_ms();
    buffer_through_pump(&env, &[("k".to_string(), b"{\"n\":1}".to_vec(), now - 2_000)]).await;
    scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    let watermark = watermark::read(&env.dynamo, table).await.unwrap().time.unwrap();
    // Arrived (by its Kinesis timestamp) before the watermark, buffered only now: late. Only
    // a shard the scan did not know of can do that (the stream's own shards hold the watermark).
    let late_at = watermark - 10_000;
    let mut event = common::kinesis_event(common::TEST_ARN, &[("k".to_string(), b"{\"n\":2}".to_vec(), late_at)]);
    let sequence = event.records[0].kinesis.sequence_number.clone();
    event.records[0].event_id = Some(format!("shardId-unknown000:{sequence}"));
    let pump = common::pump(&env);
    assert!(pump.handle(event).await.batch_item_failures.is_empty());
    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    assert_eq!(summaries.iter().map(|s| s.late).sum::<usize>(), 1);
    assert_eq!(watermark::read(&env.dynamo, table).await.unwrap().late, 1);
    let item = event_items(&env).await.into_iter().find(|e| e.arrival == late_at).unwrap();
    assert_eq!(item.slot, late_at - late_at.rem_euclid(1000), "in the slot of its arrival, never elsewhere");
    let (slots, _) = slot_index::read_index(&env.dynamo, table, late_at - 1000, late_at + 1000).await.unwrap();
    assert_eq!(slots.iter().map(|s| s.slot).collect::<Vec<_>>(), vec![item.slot], "and indexed, so a replay finds it");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_whose_slots_are_not_indexed_stays_in_the_buffer() {
    let env = TestEnv::start(1).await;
    // A day old: well behind any watermark a pass sets.
    let base = (now_ms() - 86_400_000) / 1000 * 1000;
    let records: Vec<_> = (0..40).map(|i| ("k".to_string(), b"{}".to_vec(), base + i * 75)).collect();
    buffer_through_pump(&env, &records).await;
    let failing = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk)
            .interceptor(common::FailRequests::new(|body, _| body.windows(6).any(|w| w == b"index#")))
            .build(),
    );
    let schedule = serde_json::from_str(&sample_event("scan.json")).unwrap();
    let one_segment = ScanConfig { segments: 1, ..config(&env, None) };
    let runs = run_scan(failing, env.kinesis.clone(), one_segment, schedule, plenty_of_time).await;
    let summary = runs.into_iter().map(|run| run.unwrap()).find(|s| s.pages > 0).unwrap();
    assert_eq!((summary.moved, summary.failed), (0, 40));
    assert_eq!(buffered_events(&env).await, 40, "nothing deleted");
    assert_eq!(summary.watermark, Some(base), "held back at the oldest event left behind");

    let summaries = scan_until_idle(&env, config(&env, None), plenty_of_time).await;
    assert_eq!(summaries.iter().map(|s| s.moved).sum::<usize>(), 40);
    let (slots, _) = slot_index::read_index(&env.dynamo, &env.names.event_table, base, base + 3000).await.unwrap();
    assert_eq!(slots.iter().map(|s| s.slot).collect::<Vec<_>>(), vec![base, base + 1000, base + 2000]);
}

/// Slots complete in seconds without the schedule (docs/http-api.md, the awake
/// scan): a pump batch that buffered records wakes the scan, whose awake run
/// passes until the records' slot is complete, telling the subscriptions each
/// time the watermark moved, then gives its lease up and ends; the next
/// batch wakes a new run.
#[tokio::test(flavor = "multi_thread")]
async fn a_pump_batch_wakes_the_scan_which_completes_its_slot_without_the_schedule_then_stops() {
    let env = TestEnv::start(1).await;
    let (invoker, mut invocations) = LocalInvoker::with_recursion(recursive_loop("ScanFunction"));
    let pump = common::pump(&env).with_scan(Some(Arc::new(invoker.clone())));
    let (subscriptions, mut ticks) = LocalInvoker::channel();
    let scan = Arc::new(
        Scan::new(env.dynamo.clone(), env.kinesis.clone(), config(&env, None), Arc::new(invoker.clone()))
            .with_subscriptions(Some(Arc::new(subscriptions))),
    );
    let arrival = now_ms();
    let records: Vec<_> = (0..30).map(|i| (format!("user-{}", i % 3), b"{}".to_vec(), arrival + i)).collect();
    assert!(pump.handle(common::kinesis_event(common::TEST_ARN, &records[..20])).await.batch_item_failures.is_empty());
    // Another batch before the run it started has claimed the lease: that run reads its want, none starts.
    assert!(pump.handle(common::kinesis_event(common::TEST_ARN, &records[20..])).await.batch_item_failures.is_empty());

    let woken = match drain(&mut invocations).as_slice() {
        [(woken, _)] => woken.clone(),
        other => panic!("one wake, not {other:?}"),
    };
    assert!(woken["awake"]["owner"].is_string(), "{woken}");
    // The wake, its forks and anything they start, each run as Lambda runs it: concurrently.
    invoker.send(woken).unwrap();
    let runs = event_store_emulator::invoke::run_until_idle(&mut invocations, |payload| {
        let scan = scan.clone();
        async move { scan.handle(payload, plenty_of_time()).await.expect("scan run") }
    })
    .await;
    let awake: Vec<&ScanSummary> = runs.iter().filter(|run| run.forked > 0 && run.pages == 0).collect();
    assert_eq!(awake.len(), 1, "one awake run (no continuation in its time): {runs:?}");
    assert_eq!(runs.iter().map(|run| run.moved).sum::<usize>(), 30);
    assert_eq!(event_items(&env).await.len(), 30);
    let sealed = watermark::read(&env.dynamo, &env.names.event_table).await.unwrap().time.unwrap();
    assert!(sealed >= arrival + 29 - (arrival + 29).rem_euclid(1000) + 1000, "the records' slot sealed: {sealed}");
    // The subscriptions' tick, each time the watermark had moved: the last one told of the records' slot.
    let told: Vec<i64> = drain(&mut ticks).iter().filter_map(|(tick, _)| tick["sealed"].as_i64()).collect();
    assert!(told.windows(2).all(|w| w[0] < w[1]), "only when it moved: {told:?}");
    assert!(told.last().is_some_and(|last| *last > arrival + 29), "{told:?} vs {arrival}");

    // The run gave its lease up: the next batch wakes a run of its own.
    let later: Vec<_> = (0..3).map(|i| (format!("user-{i}"), b"{}".to_vec(), now_ms() + i)).collect();
    assert!(pump.handle(common::kinesis_event(common::TEST_ARN, &later)).await.batch_item_failures.is_empty());
    assert_eq!(drain(&mut invocations).len(), 1, "woken again");
}

/// The wake protocol (`bookkeeping::awake`): a want while a run holds the
/// lease starts no second run and is seen by the run when it gives the lease
/// up; after that, a want finds the lease free.
#[tokio::test(flavor = "multi_thread")]
async fn a_want_while_a_run_is_awake_is_seen_by_that_run_and_starts_no_second_one() {
    use event_store::bookkeeping::awake::{self, Held};
    let env = TestEnv::start(1).await;
    let (dynamo, table, now) = (&env.dynamo, env.names.event_table.as_str(), now_ms());
    assert!(!awake::want(dynamo, table, awake::SCAN, now).await.unwrap(), "nothing awake: start a run");
    assert!(awake::claim(dynamo, table, awake::SCAN, "a", now + 30_000, now).await.unwrap());
    assert!(!awake::claim(dynamo, table, awake::SCAN, "b", now + 30_000, now).await.unwrap(), "one run at a time");
    assert!(awake::want(dynamo, table, awake::SCAN, now + 5).await.unwrap(), "a run holds it: no second run");
    let held = awake::hold(dynamo, table, awake::SCAN, "a", 0).await.unwrap();
    assert_eq!(held, Held::Mine { wanted_at: Some(now + 5) }, "giving up, the run sees the last want");
    assert!(!awake::want(dynamo, table, awake::SCAN, now + 6).await.unwrap(), "given up: the next want starts a run");
    assert!(awake::claim(dynamo, table, awake::SCAN, "b", now + 30_000, now + 6).await.unwrap());
    assert_eq!(awake::hold(dynamo, table, awake::SCAN, "a", now + 30_000).await.unwrap(), Held::Lost);
}

/// The queued invocations, taken off the queue.
fn drain(
    queue: &mut tokio::sync::mpsc::UnboundedReceiver<event_store_emulator::invoke::Queued>,
) -> Vec<(serde_json::Value, u32)> {
    std::iter::from_fn(|| queue.try_recv().ok()).collect()
}
