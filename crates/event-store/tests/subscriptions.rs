//! Subscriptions against a real emulator (moto_server): the event table
//! filled through pump and scan, runners started by ticks and run
//! in-process, Kinesis targets on the emulator, Lambda targets on a local
//! stand-in of the `Invoke` API (`event_store_emulator::lambda_target`).
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;
/// The example a user copies (`examples/todos`): a projection in their own code.
#[path = "../../../examples/todos/src/todos.rs"]
mod todos;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use common::{buffer_through_pump, TestEnv};
use event_store::batch::Backoff;
use event_store::bookkeeping::slot_index::read_index;
use event_store::bookkeeping::Family;
use event_store::config::{ScanConfig, SubscriptionConfig};
use event_store::log::copies::RecentIds;
use event_store::log::reader::Reader;
use event_store::log::tiers::Tiers;
use event_store::log::Window;
use event_store::playback::Playback;
use event_store::position::Checkpoint;
use event_store::subscription::{PartitionTask, RunStatus, RunSummary, Subscriptions};
use event_store::time::{format_ms, now_ms};
use event_store::Error;
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::lambda_target::{Answer, LambdaTarget};
use event_store_emulator::runs::{self, deadline_in, run_scan, run_subscriptions};
use serde_json::{json, Value};

/// Weeks before any run of these tests: complete as soon as a scan pass ends.
const T0: i64 = 1_790_000_000_000;
const CONSUMER: &str = "consumer";

/// `n` events for `keys` partition keys (`user-<i % keys>`), arriving from `from` over `spread_ms`,
/// moved into the event table by pump and a scan pass.
async fn stored_events(env: &TestEnv, range: std::ops::Range<i64>, keys: i64, from: i64, spread_ms: i64) {
    let n = range.end - range.start;
    let records: Vec<_> = range
        .clone()
        .map(|i| {
            let at = from + (i - range.start) * spread_ms / n.max(1);
            (format!("user-{}", i % keys), json!({"n": i, "pad": "x".repeat(50)}).to_string().into_bytes(), at)
        })
        .collect();
    buffer_through_pump(env, &records).await;
    scan_pass(env).await;
}

async fn scan_pass(env: &TestEnv) {
    let config = ScanConfig { segments: 2, ..runs::scan_config(&env.names) };
    let runs =
        run_scan(env.dynamo.clone(), env.kinesis.clone(), config, json!({}), deadline_in(Duration::from_secs(900)));
    for result in runs.await {
        result.unwrap();
    }
}

/// A Lambda client whose requests go to `target`.
fn lambda_client(env: &TestEnv, target: &LambdaTarget) -> aws_sdk_lambda::Client {
    aws_sdk_lambda::Client::from_conf(
        aws_sdk_lambda::config::Builder::from(&env.sdk).endpoint_url(&target.endpoint).build(),
    )
}

fn quick() -> Backoff {
    Backoff { base: Duration::from_millis(5), cap: Duration::from_millis(50), max_attempts: 4 }
}

fn subscriptions(env: &TestEnv, target: &LambdaTarget, config: SubscriptionConfig) -> Subscriptions {
    let (invoker, _) = LocalInvoker::channel();
    Subscriptions::new(env.dynamo.clone(), env.kinesis.clone(), lambda_client(env, target), config, Arc::new(invoker))
        .with_backoff(quick())
}

/// One invocation with every runner and continuation it starts; their answers.
///
/// The runners' Kinesis requests reach the emulator one at a time: moto's
/// `put_record` numbers a record from the shard's highest sequence number
/// without a lock ("not safe for concurrency", its source says), so two
/// runners putting at once onto one shard overwrite each other's records
/// (seen: a whole slot's events missing from the target stream while every
/// put was answered as stored). Kinesis never does that.
async fn invoke(env: &TestEnv, target: &LambdaTarget, config: SubscriptionConfig, payload: Value) -> Vec<Value> {
    let serial = event_store_fault_proxy::FaultProxy::start_one_at_a_time(&env.kinesis_endpoint).await.unwrap();
    let kinesis = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(&env.sdk)
            .endpoint_url(&serial.endpoint)
            .interceptor(env.counter.clone())
            .build(),
    );
    let (dynamo, lambda) = (env.dynamo.clone(), lambda_client(env, target));
    let make = move |invoker| Subscriptions::new(dynamo, kinesis, lambda, config, invoker).with_backoff(quick());
    let answers = run_subscriptions(make, payload, deadline_in(Duration::from_secs(900))).await;
    drop(serial);
    answers.into_iter().map(|a| a.unwrap()).collect()
}

/// A tick and the runs it starts: their summaries.
async fn tick(env: &TestEnv, target: &LambdaTarget, config: SubscriptionConfig) -> Vec<RunSummary> {
    let answers = invoke(env, target, config, json!({"source": "aws.events"})).await;
    answers.into_iter().filter(|a| a.get("status").is_some()).map(|a| serde_json::from_value(a).unwrap()).collect()
}

async fn manage(env: &TestEnv, target: &LambdaTarget, action: Value) -> event_store::Result<Value> {
    subscriptions(env, target, runs::subscription_config(&env.names)).handle(action, far()).await?.to_json()
}

fn far() -> SystemTime {
    SystemTime::now() + Duration::from_secs(900)
}

/// The `n`s of delivered events (JSON as delivered) per partition key, in delivery order.
fn by_key(events: &[Value]) -> HashMap<String, Vec<i64>> {
    let mut out: HashMap<String, Vec<i64>> = HashMap::new();
    for event in events {
        out.entry(event["partition_key"].as_str().unwrap().to_owned())
            .or_default()
            .push(event["data"]["n"].as_i64().unwrap());
    }
    out
}

/// Every `n` in `range` delivered, each key's events in order on first delivery; returns the duplicates.
fn assert_all_in_key_order(events: &[Value], range: std::ops::Range<i64>, keys: i64) -> usize {
    let mut duplicates = 0;
    for (key, ns) in by_key(events) {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        let mut seen = HashSet::new();
        let first: Vec<i64> = ns.iter().copied().filter(|n| seen.insert(*n)).collect();
        duplicates += ns.len() - first.len();
        let expected: Vec<i64> = range.clone().filter(|i| i % keys == user).collect();
        assert_eq!(first, expected, "{key}: every event, in order on first delivery");
    }
    let keys_seen = by_key(events).len() as i64;
    assert_eq!(keys_seen, keys.min(range.end - range.start), "every key delivered");
    duplicates
}

/// A reader of every key of the event table within `window` (one-second slots, no dedupe window).
fn every_key<'a>(env: &'a TestEnv, table: &'a str, window: &'a Window, tiers: &'a Tiers) -> Reader<'a> {
    Reader {
        dynamo: &env.dynamo,
        table,
        time_unit_ms: 1000,
        page_items: None,
        dedupe_window_ms: 0,
        window,
        keys: event_store::slices::KeyRange::ALL,
        tiers,
    }
}

/// The events on a Kinesis target (aggregated records unpacked).
async fn on_stream(env: &TestEnv, stream: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (_, record) in env.read_stream(stream).await {
        let key = record.partition_key().unwrap();
        for (_, data) in event_store::aggregation::deaggregate(key, record.data().as_ref()).unwrap() {
            out.push(serde_json::from_slice(&data).unwrap());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_events_over_8_partitions_reach_a_kinesis_and_a_lambda_target_once_in_key_order() {
    let env = TestEnv::start(2).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..10_000, 50, T0, 20_000).await;
    let stream = env.names.subscription_stream.clone();
    for (name, target_spec) in [("to-stream", json!({"kinesis": stream})), ("to-function", json!({"lambda": CONSUMER}))]
    {
        let created = manage(&env, &target, json!({
            "action": "create", "name": name, "start": format_ms(T0 - 60_000), "target": target_spec, "partitions": 8
        }))
        .await
        .unwrap();
        assert_eq!(created["created"]["partitions"], 8);
    }
    env.counter.reset();
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!(runs.len(), 16, "a runner per partition of each subscription");
    assert!(runs.iter().all(|r| r.status == RunStatus::CaughtUp), "{runs:?}");
    assert_eq!(runs.iter().map(|r| r.delivered).sum::<usize>(), 20_000);
    common::assert_only_declared_actions(&env.counter, event_store::subscription::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "SubscriptionsFunction");

    let streamed = on_stream(&env, &stream).await;
    assert_eq!(assert_all_in_key_order(&streamed, 0..10_000, 50), 0, "no duplicates without a fault");
    let invoked = target.taken();
    assert_eq!(assert_all_in_key_order(&invoked, 0..10_000, 50), 0, "no duplicates without a fault");
    // Each event carries its subscription, partition and position; positions grow within a partition.
    let mut last: HashMap<u64, (i64, String)> = HashMap::new();
    for event in &invoked {
        assert_eq!(event["subscription"], "to-function");
        let position =
            (event["position"]["slot"].as_i64().unwrap(), event["position"]["sort_key"].as_str().unwrap().to_owned());
        let partition = event["partition"].as_u64().unwrap();
        assert!(last.get(&partition).is_none_or(|before| *before < position), "positions grow within a partition");
        last.insert(partition, position);
    }
    assert_eq!(last.len(), 8);
    assert!(
        target.received().iter().all(|r| r.payload["events"].as_array().unwrap().len() <= 100),
        "batches of at most 100"
    );

    // Caught up: lag 0 everywhere; another tick delivers nothing again.
    let listed = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    for sub in listed["subscriptions"].as_array().unwrap() {
        assert_eq!(sub["lag_ms"], 0, "{sub}");
    }
    let again = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!(again.iter().map(|r| r.delivered).sum::<usize>(), 0);
}

/// A log cut into 64 slices (`SLICES`): the 64 partitions of a subscription
/// each query only their slice (none reads an event of another partition),
/// deliver every event once, each key in order; a reader of every key gets
/// the slices merged back into log order.
#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_partitions_of_a_sliced_log_read_only_their_slices_and_deliver_each_event_once_in_key_order() {
    let env = TestEnv::start(2).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let (n, keys) = (20_000, 500);
    let records: Vec<_> = (0..n)
        .map(|i| (format!("user-{}", i % keys), json!({"n": i}).to_string().into_bytes(), T0 + i * 10_000 / n))
        .collect();
    buffer_through_pump(&env, &records).await;
    let config = ScanConfig { segments: 2, slices: 64, ..runs::scan_config(&env.names) };
    for run in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), config, json!({}), deadline_in(Duration::from_secs(900)))
            .await
    {
        run.unwrap();
    }
    let table = env.names.event_table.as_str();
    let (slots, _) = read_index(&env.dynamo, table, T0, T0 + 11_000).await.unwrap();
    assert!(slots.len() >= 10 && slots.iter().all(|s| (s.subkeys, s.sliced) == (0, 1 << 6)), "{slots:?}");

    manage(
        &env,
        &target,
        json!({
            "action": "create", "name": "sliced", "start": format_ms(T0 - 60_000), "target": {"lambda": CONSUMER},
            "partitions": 64, "batch_size": 500
        }),
    )
    .await
    .unwrap();
    // 64 runners at once would open more connections to moto than it accepts in time beside another
    // test (seen: connect timeouts): their DynamoDB requests reach it one at a time.
    let endpoint = env.sdk.endpoint_url().unwrap().to_owned();
    let serial = event_store_fault_proxy::FaultProxy::start_one_at_a_time(&endpoint).await.unwrap();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk).endpoint_url(&serial.endpoint).build(),
    );
    let (kinesis, lambda) = (env.kinesis.clone(), lambda_client(&env, &target));
    let config = runs::subscription_config(&env.names);
    let make = move |invoker| Subscriptions::new(dynamo, kinesis, lambda, config, invoker).with_backoff(quick());
    let answers = run_subscriptions(make, json!({"source": "aws.events"}), deadline_in(Duration::from_secs(900))).await;
    drop(serial);
    let runs: Vec<RunSummary> = answers
        .into_iter()
        .map(|a| a.unwrap())
        .filter(|a| a.get("status").is_some())
        .map(|a| serde_json::from_value(a).unwrap())
        .collect();
    assert_eq!(runs.len(), 64);
    assert!(runs.iter().all(|r| r.status == RunStatus::CaughtUp), "{runs:?}");
    assert_eq!(runs.iter().map(|r| r.delivered).sum::<usize>(), n as usize);
    assert_eq!(runs.iter().map(|r| r.other_partitions).sum::<usize>(), 0, "no partition read another's events");
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..n, keys), 0, "no duplicates without a fault");

    // Every key: the slices merged back into log order.
    let window = Window { start: T0, end: T0 + 11_000 };
    let tiers = Tiers::new(None);
    let reader = every_key(&env, table, &window, &tiers);
    let mut read = Vec::new();
    let keep = |event: &event_store::event_item::EventItem, _: Option<Value>, _: &[u8]| {
        read.push(event.sort_key.clone());
        std::ops::ControlFlow::Continue(())
    };
    reader.each_event(slots, Checkpoint::at_slot(T0), &mut RecentIds::new(0), keep).await.unwrap();
    assert_eq!(read.len(), n as usize);
    assert!(read.windows(2).all(|w| w[0] < w[1]), "in log order, each once");
}

/// Events `range` of 300 keys over the last second (after every watermark
/// so far: none is late), pumped and moved (16 slices).
async fn sliced_batch(env: &TestEnv, range: std::ops::Range<i64>) {
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let from = now_ms() - 1_000;
    let records: Vec<_> = range
        .clone()
        .map(|i| (format!("user-{}", i % 300), json!({"n": i}).to_string().into_bytes(), from + (i - range.start) / 3))
        .collect();
    buffer_through_pump(env, &records).await;
    let config = ScanConfig { segments: 2, slices: 16, ..runs::scan_config(&env.names) };
    for run in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), config, json!({}), deadline_in(Duration::from_secs(900)))
            .await
    {
        run.unwrap();
    }
}

/// Rescaling a live subscription from 4 partitions to 16 and back to 8, with
/// partitions standing at different places when it is asked and keys whose
/// events straddle each change: every event once, each key in order, and
/// each key's sequence numbers growing across the changes (the consumer's
/// rule drops nothing real).
#[tokio::test(flavor = "multi_thread")]
async fn a_subscription_rescaled_up_and_down_delivers_each_event_once_in_key_order() {
    let env = TestEnv::start(2).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let config = || runs::subscription_config(&env.names);
    sliced_batch(&env, 0..3_000).await;
    let name = "rescaled";
    manage(&env, &target, json!({
        "action": "create", "name": name, "start": format_ms(T0 - 60_000), "target": {"lambda": CONSUMER}, "partitions": 4
    }))
    .await
    .unwrap();
    assert_eq!(tick(&env, &target, config()).await.iter().map(|r| r.delivered).sum::<usize>(), 3_000);
    let mut next = 3_000;
    for (to, from_partitions) in [(16u32, 4u32), (8, 16)] {
        // More events; only partition 0 delivers them before the rescale is asked (the others lag).
        sliced_batch(&env, next..next + 3_000).await;
        next += 3_000;
        let ahead = invoke(&env, &target, config(), json!({"run": PartitionTask::first(name, 0)})).await;
        assert_eq!(ahead.len(), 1, "{ahead:?}");
        let asked = manage(&env, &target, json!({"action": "rescale", "name": name, "partitions": to})).await.unwrap();
        assert_eq!(asked["partitions"], to);
        // Events that come while it is under way.
        sliced_batch(&env, next..next + 3_000).await;
        next += 3_000;
        // Ticks until the new count is in place: the old partitions deliver up to the common position (a
        // slot past partition 0's), which needs the watermark past it: a scan pass a second later.
        let mut rounds = 0;
        loop {
            let runs = tick(&env, &target, config()).await;
            let sub = event_store::readers::subscriptions::get(&env.dynamo, &env.names.event_table, name)
                .await
                .unwrap()
                .unwrap();
            if sub.rescale.is_none() {
                assert_eq!(sub.partitions, to);
                break;
            }
            assert!(runs.iter().all(|r| r.partition < from_partitions), "only the old partitions run: {runs:?}");
            rounds += 1;
            assert!(rounds < 6, "the rescale does not finish: {sub:?}");
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            scan_pass(&env).await;
        }
        let runs = tick(&env, &target, config()).await;
        assert_eq!(runs.len(), to as usize, "a runner per new partition: {runs:?}");
        assert_eq!(runs.iter().map(|r| r.other_partitions).sum::<usize>(), 0, "each reads only its slices");
    }
    let delivered = target.taken();
    assert_eq!(assert_all_in_key_order(&delivered, 0..next, 300), 0, "no event twice");
    let mut seqs: HashMap<String, i64> = HashMap::new();
    for event in &delivered {
        let (key, seq) = (event["partition_key"].as_str().unwrap().to_owned(), event["playback_seq"].as_i64().unwrap());
        let before = seqs.insert(key.clone(), seq);
        assert!(before.is_none_or(|b| b < seq), "{key}: sequence numbers grow across rescales ({before:?}, {seq})");
    }
    let listed = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    assert_eq!(listed["subscriptions"][0]["partitions"].as_array().unwrap().len(), 8);
    assert_eq!(listed["subscriptions"][0]["epoch"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_mid_delivery_repeats_only_the_batch_in_flight() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..1_000, 10, T0, 5_000).await;
    manage(
        &env,
        &target,
        json!({"action": "create", "name": "c", "start": format_ms(T0), "target": {"lambda": CONSUMER}}),
    )
    .await
    .unwrap();
    // The fourth batch takes the consumer a while; the runner dies (its task is dropped) meanwhile.
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    target.consume_with(move |_| match counted.fetch_add(1, Ordering::SeqCst) {
        3 => Answer::Slow(Duration::from_secs(2), Box::new(Answer::Ok(Value::Null))),
        _ => Answer::Ok(Value::Null),
    });
    let config =
        SubscriptionConfig { deadline_margin: Duration::from_millis(100), ..runs::subscription_config(&env.names) };
    let subs = subscriptions(&env, &target, config);
    let crashed = tokio::spawn(async move {
        subs.run_partition(PartitionTask::first("c", 0), SystemTime::now() + Duration::from_secs(2)).await
    });
    let waiting = std::time::Instant::now();
    while calls.load(Ordering::SeqCst) < 4 {
        assert!(waiting.elapsed() < Duration::from_secs(20), "the fourth batch never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    crashed.abort();
    // Its lease (deadline + 1 s slack) expires; the next tick's runner takes over from the checkpoint.
    tokio::time::sleep(Duration::from_secs(4)).await;
    target.consume_with(|_| Answer::Ok(Value::Null));
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!(runs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![RunStatus::CaughtUp]);
    let duplicates = assert_all_in_key_order(&target.taken(), 0..1_000, 10);
    assert_eq!(duplicates, 100, "exactly the batch in flight, once more");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_subscription_from_two_days_ago_catches_up_then_follows_new_events() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let two_days_ago = now_ms() - 2 * 86_400_000;
    // Older than any stream's default retention: only the event table has them.
    stored_events(&env, 0..600, 7, two_days_ago + 60_000, 86_400_000).await;
    let created = manage(&env, &target, json!({
        "action": "create", "name": "history", "start": format_ms(two_days_ago), "target": {"lambda": CONSUMER}, "partitions": 2
    }))
    .await
    .unwrap();
    assert_eq!(created["created"]["start_ms"], two_days_ago);
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!(runs.iter().map(|r| r.delivered).sum::<usize>(), 600);
    // The stack is upgraded from the version that kept every bookkeeping item in slot -2, where a
    // runner of that version still holds partition 1: partition 0 moves and goes on, partition 1 waits.
    common::as_the_version_before(&env, Family::Subscriptions).await;
    common::an_old_lease(&env, "subpart#history#0001", now_ms() + 60_000).await;
    // New events, complete after the next pass, are followed.
    stored_events(&env, 600..700, 7, now_ms() - 2_000, 1_000).await;
    let ours = |sort_key: &str| {
        let key = event_store::bookkeeping::key_in(Family::Subscriptions, sort_key.into());
        env.dynamo.get_item().table_name(&env.names.event_table).set_key(Some(key)).send()
    };
    env.counter.reset();
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    common::assert_allowed_by_the_template(&env.counter, "SubscriptionsFunction");
    assert_eq!(runs.iter().map(|r| r.partition).collect::<Vec<_>>(), [0], "not partition 1 while the old runner may");
    assert!(ours("sub#history").await.unwrap().item().is_some(), "its definition moved");
    let moved = event_store::readers::subscriptions::partition_item_key("history", 1);
    let partition_1 = env.dynamo.get_item().table_name(&env.names.event_table).set_key(Some(moved));
    assert!(partition_1.send().await.unwrap().item().is_none(), "partition 1 did not");
    let first = runs[0].delivered;
    common::an_old_lease(&env, "subpart#history#0001", now_ms() - 1).await;
    env.counter.reset();
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    common::assert_allowed_by_the_template(&env.counter, "SubscriptionsFunction");
    let rest: usize = runs.iter().map(|r| r.delivered).sum();
    assert_eq!(first + rest, 100, "from the checkpoints they moved with: {first} + {rest}");
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..700, 7), 0);
    // Deleted, it stays deleted: its old items in slot -2 are never moved again.
    manage(&env, &target, json!({"action": "delete", "name": "history"})).await.unwrap();
    assert!(ours("sub#history").await.unwrap().item().is_none());
    assert!(tick(&env, &target, runs::subscription_config(&env.names)).await.is_empty());
    assert!(ours("sub#history").await.unwrap().item().is_none(), "not brought back");
}

/// A runner follows the complete log while it brings events and ends once none
/// came for `follow`; one the tick starts when nothing came ends after its
/// first look (at idle a tick's runner costs a request or two, not a Lambda
/// following for most of the minute). Near its deadline, with events lately,
/// it hands the partition straight to a successor (no wait for the next
/// tick, which would add up to a tick's interval to the next delivery).
#[tokio::test(flavor = "multi_thread")]
async fn a_runner_follows_while_events_come_an_idle_one_ends_at_once_and_a_busy_one_hands_over() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let start = now_ms() - 60_000;
    manage(&env, &target, json!({
        "action": "create", "name": "busy", "start": format_ms(start), "target": {"lambda": CONSUMER}, "partitions": 1
    }))
    .await
    .unwrap();
    let follow = Duration::from_secs(5);
    let config =
        SubscriptionConfig { follow, poll: Duration::from_millis(100), ..runs::subscription_config(&env.names) };
    // No slot completed since the start: the tick's runner looks once and ends.
    let looked = Instant::now();
    let runs = tick(&env, &target, config.clone()).await;
    assert_eq!(runs.iter().map(|r| (r.status, r.delivered)).collect::<Vec<_>>(), vec![(RunStatus::CaughtUp, 0)]);
    assert!(looked.elapsed() < follow, "an idle runner does not follow: {:?}", looked.elapsed());

    // Events: the runner delivers them, then follows, delivering what the next pass completes
    // within `follow` of them, and ends `follow` after the last.
    stored_events(&env, 0..50, 5, now_ms() - 2_000, 1_000).await;
    let later = async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        stored_events(&env, 50..80, 5, now_ms() - 1_000, 500).await;
        Instant::now()
    };
    let ((runs, ended), last) =
        tokio::join!(async { (tick(&env, &target, config.clone()).await, Instant::now()) }, later);
    assert_eq!(runs.iter().map(|r| (r.status, r.delivered)).collect::<Vec<_>>(), vec![(RunStatus::CaughtUp, 80)]);
    assert!(ended >= last + follow - Duration::from_millis(500), "it followed {follow:?} past the last events");
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..80, 5), 0);

    // Near its deadline (a margin that leaves it five seconds), with events lately: a successor
    // goes on under the lease, follows (it was handed the partition because events came), and
    // ends `follow` later with nothing new.
    stored_events(&env, 80..100, 5, now_ms() - 1_000, 500).await;
    let short = SubscriptionConfig { deadline_margin: Duration::from_secs(895), ..config };
    let runs = tick(&env, &target, short).await;
    let statuses: Vec<(RunStatus, usize)> = runs.iter().map(|r| (r.status, r.delivered)).collect();
    assert_eq!(statuses, vec![(RunStatus::Continued, 20), (RunStatus::CaughtUp, 0)], "hand-over near the deadline");
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..100, 5), 0);

    // A successor handed the lease of a subscription paused meanwhile gives the lease up, so a
    // resume is not kept waiting for it to expire (minutes).
    let table = &env.names.event_table;
    let sub = event_store::readers::subscriptions::get(&env.dynamo, table, "busy").await.unwrap().unwrap();
    let far_ms = now_ms() + 600_000;
    let held =
        event_store::readers::subscriptions::take(&env.dynamo, table, (&sub, 0), ("handed", None), far_ms, now_ms())
            .await;
    assert!(
        matches!(
            held.unwrap(),
            event_store::readers::subscriptions::Take::Lease(event_store::bookkeeping::lease::Taken::Held(_))
        ),
        "the predecessor's hand-over"
    );
    manage(&env, &target, json!({"action": "pause", "name": "busy"})).await.unwrap();
    let subs = subscriptions(&env, &target, runs::subscription_config(&env.names));
    let handed = PartitionTask { lease: Some("handed".into()), hop: 1, ..PartitionTask::first("busy", 0) };
    assert_eq!(subs.run_partition(handed, far()).await.unwrap().status, RunStatus::Paused);
    manage(&env, &target, json!({"action": "resume", "name": "busy"})).await.unwrap();
    let resumed = subs.run_partition(PartitionTask::first("busy", 0), far()).await.unwrap();
    assert_eq!(resumed.status, RunStatus::CaughtUp, "not busy until the handed lease expires: {resumed:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_runners_for_one_partition_at_once_exactly_one_delivers() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..300, 5, T0, 3_000).await;
    manage(
        &env,
        &target,
        json!({"action": "create", "name": "one", "start": format_ms(T0), "target": {"lambda": CONSUMER}}),
    )
    .await
    .unwrap();
    target.consume_with(|_| Answer::Slow(Duration::from_millis(300), Box::new(Answer::Ok(Value::Null))));
    // The second runner starts once the first holds the partition (its first batch is at the consumer).
    // Not both at the same instant: moto does not apply two conditional writes to one item atomically,
    // as DynamoDB does, so two simultaneous takes could both succeed there.
    let subs = Arc::new(subscriptions(&env, &target, runs::subscription_config(&env.names)));
    let first = subs.clone();
    let a = tokio::spawn(async move { first.run_partition(PartitionTask::first("one", 0), far()).await });
    let waiting = std::time::Instant::now();
    while target.received().is_empty() {
        assert!(waiting.elapsed() < Duration::from_secs(20), "the first runner never delivered");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let b = subs.run_partition(PartitionTask::first("one", 0), far()).await.unwrap();
    let a = a.await.unwrap().unwrap();
    assert_eq!((b.status, b.delivered), (RunStatus::Busy, 0), "{b:?}");
    assert!(b.busy_until.is_some());
    assert_eq!((a.status, a.delivered), (RunStatus::CaughtUp, 300));
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..300, 5), 0, "each event once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runner_paused_past_its_lease_cannot_move_the_checkpoint_afterwards() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..300, 5, T0, 3_000).await;
    manage(
        &env,
        &target,
        json!({"action": "create", "name": "fenced", "start": format_ms(T0), "target": {"lambda": CONSUMER}}),
    )
    .await
    .unwrap();
    // The first runner's first batch hangs past its lease (deadline + 1 s slack).
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    target.consume_with(move |_| match counted.fetch_add(1, Ordering::SeqCst) {
        0 => Answer::Slow(Duration::from_secs(5), Box::new(Answer::Ok(Value::Null))),
        _ => Answer::Ok(Value::Null),
    });
    let config =
        SubscriptionConfig { deadline_margin: Duration::from_millis(100), ..runs::subscription_config(&env.names) };
    let slow = subscriptions(&env, &target, config.clone());
    let paused = tokio::spawn(async move {
        slow.run_partition(PartitionTask::first("fenced", 0), SystemTime::now() + Duration::from_secs(1)).await
    });
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let taken_over =
        subscriptions(&env, &target, config).run_partition(PartitionTask::first("fenced", 0), far()).await.unwrap();
    assert_eq!((taken_over.status, taken_over.delivered), (RunStatus::CaughtUp, 300), "the second runner took over");
    let before = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    let late = paused.await.unwrap();
    assert!(matches!(late, Err(Error::LeaseLost(_))), "{late:?}");
    let after = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    assert_eq!(before, after, "the paused runner's write did not land");
    assert_eq!(after["subscriptions"][0]["partitions"][0]["lag_ms"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_poison_event_is_parked_the_partition_goes_on_or_stops_and_a_redrive_delivers_it() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..200, 4, T0, 2_000).await;
    for (name, on_poison) in [("goes-on", "park"), ("stops", "stop")] {
        manage(&env, &target, json!({
            "action": "create", "name": name, "start": format_ms(T0), "target": {"lambda": CONSUMER}, "on_poison": on_poison
        }))
        .await
        .unwrap();
    }
    let poison = |payload: &Value| payload["events"].as_array().unwrap().iter().any(|e| e["data"]["n"] == 37);
    target.consume_with(move |payload| match poison(payload) {
        true => Answer::FunctionError("cannot handle n = 37".into()),
        false => Answer::Ok(Value::Null),
    });
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    let status_of = |name: &str| runs.iter().find(|r| r.subscription == name).unwrap().clone();
    let goes_on = status_of("goes-on");
    assert_eq!((goes_on.status, goes_on.delivered, goes_on.parked), (RunStatus::CaughtUp, 199, 1));
    let stops = status_of("stops");
    assert_eq!((stops.status, stops.parked), (RunStatus::Stopped, 1));
    assert!(stops.error.as_deref().unwrap().contains("n = 37"), "{stops:?}");

    let parked = manage(&env, &target, json!({"action": "parked", "name": "goes-on"})).await.unwrap();
    let parked = parked["parked"].as_array().unwrap().clone();
    assert_eq!(parked.len(), 1);
    assert!(parked[0]["error"].as_str().unwrap().contains("n = 37"));
    let delivered_n = |name: &str| -> Vec<i64> {
        target.taken().iter().filter(|e| e["subscription"] == name).map(|e| e["data"]["n"].as_i64().unwrap()).collect()
    };
    assert!(!delivered_n("goes-on").contains(&37));
    assert_eq!(delivered_n("goes-on").len(), 199);
    assert!(delivered_n("stops").iter().all(|n| *n < 37 || n % 4 != 37 % 4), "nothing of key 37's partition after it");

    // Stopped: the next tick leaves it; list shows why.
    assert!(tick(&env, &target, runs::subscription_config(&env.names)).await.iter().all(|r| r.subscription != "stops"));
    let listed = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    let stopped = listed["subscriptions"].as_array().unwrap().iter().find(|s| s["name"] == "stops").unwrap().clone();
    assert!(stopped["partitions"][0]["stopped"].as_str().unwrap().contains("n = 37"));

    // Meanwhile the stack is upgraded from the version that kept every bookkeeping item in slot -2:
    // re-drive and resume find what that version left there, and move it.
    common::as_the_version_before(&env, Family::Subscriptions).await;

    // The consumer is fixed: re-drive delivers the parked event; resume goes on.
    target.consume_with(|_| Answer::Ok(Value::Null));
    let redriven = manage(&env, &target, json!({"action": "redrive", "name": "goes-on"})).await.unwrap();
    assert_eq!(redriven["redriven"].as_array().unwrap().len(), 1, "{redriven}");
    assert!(delivered_n("goes-on").contains(&37));
    let empty = manage(&env, &target, json!({"action": "parked", "name": "goes-on"})).await.unwrap();
    assert_eq!(empty["parked"], json!([]));
    manage(&env, &target, json!({"action": "resume", "name": "stops"})).await.unwrap();
    tick(&env, &target, runs::subscription_config(&env.names)).await;
    let mut stops_n = delivered_n("stops");
    stops_n.sort();
    assert_eq!(stops_n, (0..200).filter(|n| *n != 37).collect::<Vec<_>>(), "everything but the parked one");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unavailable_target_holds_the_partition_and_nothing_is_skipped() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..300, 5, T0, 3_000).await;
    manage(
        &env,
        &target,
        json!({"action": "create", "name": "t", "start": format_ms(T0), "target": {"lambda": CONSUMER}}),
    )
    .await
    .unwrap();
    let gone_stream = "event-store-test-sub-gone";
    env.kinesis.create_stream().stream_name(gone_stream).shard_count(1).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    manage(
        &env,
        &target,
        json!({"action": "create", "name": "k", "start": format_ms(T0), "target": {"kinesis": gone_stream}}),
    )
    .await
    .unwrap();
    env.kinesis.delete_stream().stream_name(gone_stream).send().await.unwrap();
    target.consume_with(|_| Answer::Throttled);
    // Pages of 10 events: the reader is many pages ahead when the run stops, and must stop too.
    let small_pages = SubscriptionConfig { page_items: Some(10), ..runs::subscription_config(&env.names) };
    let runs = tokio::time::timeout(Duration::from_secs(120), tick(&env, &target, small_pages))
        .await
        .expect("a run that stops early does not wait for its reader");
    assert!(runs.iter().all(|r| r.status == RunStatus::Unavailable && r.delivered == 0), "{runs:?}");
    let listed = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    for sub in listed["subscriptions"].as_array().unwrap() {
        assert!(sub["lag_ms"].as_i64().unwrap() > 0, "the lag shows it: {sub}");
    }
    // Back: delivery goes on from the checkpoint; nothing was skipped.
    target.consume_with(|_| Answer::Ok(Value::Null));
    env.kinesis.create_stream().stream_name(gone_stream).shard_count(1).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert!(runs.iter().all(|r| r.status == RunStatus::CaughtUp), "{runs:?}");
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..300, 5), 0);
    assert_eq!(assert_all_in_key_order(&on_stream(&env, gone_stream).await, 0..300, 5), 0);
}

/// A partition whose target was unavailable keeps its lease for the backoff:
/// the ticks the awake scan starts twice a second while events come do not
/// retry the target at that pace; after the backoff the next tick does.
#[tokio::test(flavor = "multi_thread")]
async fn a_partition_whose_target_was_unavailable_is_left_alone_for_the_backoff() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..50, 5, T0, 1_000).await;
    let create = json!({"action": "create", "name": "later", "start": format_ms(T0), "target": {"lambda": CONSUMER}});
    manage(&env, &target, create).await.unwrap();
    let backoff = Duration::from_secs(3);
    let config = SubscriptionConfig { unavailable_backoff: backoff, ..runs::subscription_config(&env.names) };
    target.consume_with(|_| Answer::Throttled);
    let runs = tick(&env, &target, config.clone()).await;
    // The lease is kept until at most the backoff from now (the run ended before the tick returned).
    let refused = Instant::now();
    assert_eq!(runs.iter().map(|r| r.status).collect::<Vec<_>>(), vec![RunStatus::Unavailable]);
    target.consume_with(|_| Answer::Ok(Value::Null));
    let runs = tick(&env, &target, config.clone()).await;
    assert!(runs.is_empty() || refused.elapsed() >= backoff, "no runner within the backoff: {runs:?}");
    tokio::time::sleep(backoff.saturating_sub(refused.elapsed()) + Duration::from_millis(500)).await;
    let runs = tick(&env, &target, config).await;
    assert_eq!(runs.iter().map(|r| (r.status, r.delivered)).collect::<Vec<_>>(), vec![(RunStatus::CaughtUp, 50)]);
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..50, 5), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn what_an_earlier_subscription_of_the_name_left_is_not_taken_and_unreadable_events_are_parked() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    // One record a batch: each event a chunk of its own, so one unreadable chunk is one event.
    let records: Vec<_> = (0..100)
        .map(|i| {
            (format!("user-{}", i % 5), json!({"n": i, "pad": "x".repeat(50)}).to_string().into_bytes(), T0 + i * 10)
        })
        .collect();
    common::buffer_one_by_one(&env, &records).await;
    scan_pass(&env).await;
    let create = json!({"action": "create", "name": "again", "start": format_ms(T0), "target": {"lambda": CONSUMER}});
    manage(&env, &target, create.clone()).await.unwrap();
    assert_eq!(tick(&env, &target, runs::subscription_config(&env.names)).await[0].delivered, 100);
    // Only the definition goes (a delete cut short, or a runner that recreated its partition item after it).
    env.dynamo
        .delete_item()
        .table_name(&env.names.event_table)
        .set_key(Some(event_store::bookkeeping::key_in(Family::Subscriptions, "sub#again".into())))
        .send()
        .await
        .unwrap();
    // One chunk of the table can no longer be decoded (an encoding nobody knows).
    let mut items = env.scan_table(&env.names.event_table).await;
    items.retain(|i| {
        !i["slot"].as_n().unwrap().starts_with('-')
            && event_store::chunk::decode_item(T0, i).events.unwrap()[0].partition_key == "user-3"
    });
    let mut broken = items.swap_remove(0);
    broken.insert("data".into(), aws_sdk_dynamodb::types::AttributeValue::B(b"damaged".to_vec().into()));
    let broken_id = format!("chunk {}", broken["sort_key"].as_s().unwrap());
    env.dynamo.put_item().table_name(&env.names.event_table).set_item(Some(broken)).send().await.unwrap();
    // The same name again, from the same start: all of it again, from its own start.
    manage(&env, &target, create).await.unwrap();
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!((runs[0].delivered, runs[0].parked, runs[0].unreadable), (99, 1, 1), "{runs:?}");
    let parked = manage(&env, &target, json!({"action": "parked", "name": "again"})).await.unwrap();
    assert_eq!(parked["parked"][0]["event_id"], broken_id.as_str());
    assert!(parked["parked"][0]["error"].as_str().unwrap().starts_with("unreadable"), "{parked}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_partition_stopped_on_poison_has_parked_every_unreadable_event_it_passed() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let records: Vec<_> =
        (0..20).map(|i| ("user-1".to_owned(), json!({"n": i}).to_string().into_bytes(), T0 + i * 10)).collect();
    common::buffer_one_by_one(&env, &records).await;
    scan_pass(&env).await;
    // n = 5 can no longer be decoded; n = 15 is refused by the consumer.
    let mut items = env.scan_table(&env.names.event_table).await;
    items.retain(|i| {
        !i["slot"].as_n().unwrap().starts_with('-')
            && event_store::chunk::decode_item(T0, i).events.unwrap()[0].bytes().unwrap() == br#"{"n":5}"#
    });
    let mut broken = items.swap_remove(0);
    broken.insert("data".into(), aws_sdk_dynamodb::types::AttributeValue::B(b"damaged".to_vec().into()));
    env.dynamo.put_item().table_name(&env.names.event_table).set_item(Some(broken)).send().await.unwrap();
    target.consume_with(|payload| match payload["events"].as_array().unwrap().iter().any(|e| e["data"]["n"] == 15) {
        true => Answer::FunctionError("cannot handle n = 15".into()),
        false => Answer::Ok(Value::Null),
    });
    let create = json!({"action": "create", "name": "halts", "start": format_ms(T0), "target": {"lambda": CONSUMER},
        "on_poison": "stop", "partitions": 1});
    manage(&env, &target, create).await.unwrap();
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!(runs[0].status, RunStatus::Stopped, "{runs:?}");
    let parked = manage(&env, &target, json!({"action": "parked", "name": "halts"})).await.unwrap();
    let errors: Vec<&str> = parked["parked"].as_array().unwrap().iter().map(|p| p["error"].as_str().unwrap()).collect();
    assert_eq!(errors.len(), 2, "the unreadable event and the poison: {parked}");
    assert!(errors.iter().any(|e| e.starts_with("unreadable")) && errors.iter().any(|e| e.contains("n = 15")));
    // Resumed with the consumer fixed: everything else is delivered, nothing twice.
    target.consume_with(|_| Answer::Ok(Value::Null));
    manage(&env, &target, json!({"action": "resume", "name": "halts"})).await.unwrap();
    tick(&env, &target, runs::subscription_config(&env.names)).await;
    let delivered: Vec<i64> = target.taken().iter().map(|e| e["data"]["n"].as_i64().unwrap()).collect();
    assert_eq!(delivered, (0..20).filter(|n| *n != 5 && *n != 15).collect::<Vec<_>>());

    // An item a newer version wrote (a chunk encoding this code does not know) is no damage: every
    // reader stops at it, none skips or parks it. The subscription delivers what comes before it and
    // waits there, status says why, and once the item reads (the upgrade) it goes on from there.
    // Past where the subscription stands (the complete end it caught up with), and complete once a pass ends.
    let base = now_ms() + 100;
    let records: Vec<_> =
        (20..30).map(|i| ("user-1".to_owned(), json!({"n": i}).to_string().into_bytes(), base + i * 10)).collect();
    common::buffer_one_by_one(&env, &records).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    scan_pass(&env).await;
    let mut items = env.scan_table(&env.names.event_table).await;
    items.retain(|i| {
        !i["slot"].as_n().unwrap().starts_with('-')
            && event_store::chunk::decode_item(base, i).events.is_ok_and(|e| e[0].bytes().unwrap() == br#"{"n":25}"#)
    });
    let original = items.swap_remove(0);
    let mut newer = original.clone();
    newer.insert("encoding".into(), aws_sdk_dynamodb::types::AttributeValue::S("chunk2".into()));
    env.dynamo.put_item().table_name(&env.names.event_table).set_item(Some(newer)).send().await.unwrap();
    // A subscription of four partitions too: the item's events are unknown, so each of them waits on it.
    let wide = json!({"action": "create", "name": "wide", "start": format_ms(base), "partitions": 4,
        "target": {"kinesis": env.names.playback_stream}});
    manage(&env, &target, wide).await.unwrap();
    let config = runs::subscription_config(&env.names);
    let make = {
        let (env, target) = (&env, &target);
        move |invoker| {
            Subscriptions::new(env.dynamo.clone(), env.kinesis.clone(), lambda_client(env, target), config, invoker)
                .with_backoff(quick())
        }
    };
    let answers = run_subscriptions(make, json!({"source": "aws.events"}), deadline_in(Duration::from_secs(300))).await;
    let failed: Vec<String> = answers.iter().filter_map(|a| a.as_ref().err()).map(ToString::to_string).collect();
    assert!(failed.len() == 5 && failed.iter().all(|f| f.contains("written by a newer version")), "{answers:?}");
    let delivered: Vec<i64> = target.taken().iter().map(|e| e["data"]["n"].as_i64().unwrap()).collect();
    assert_eq!(delivered[18..], [20, 21, 22, 23, 24], "up to the newer item, nothing past it");
    let table = env.names.event_table.as_str();
    let statuses = event_store::readers::subscriptions::status::statuses(&env.dynamo, table, None, 1000).await.unwrap();
    let partitions: Vec<_> = statuses.iter().flat_map(|s| s.partitions.iter()).collect();
    assert_eq!(partitions.len(), 5);
    for partition in partitions {
        let waiting = partition.waiting.clone().unwrap_or_default();
        assert!(waiting.contains("written by a newer version") && waiting.contains("chunk2"), "{statuses:?}");
    }
    // A playback of the window stops there too, and so does a reader that follows the log (tail, the page).
    let (start, end) = (format_ms(base), format_ms(base + 1000));
    let played = runs::run_playback(
        |invoker| Playback::new(env.dynamo.clone(), env.kinesis.clone(), runs::playback_config(&env.names), invoker),
        json!({"start": start, "end": end}),
        deadline_in(Duration::from_secs(300)),
    )
    .await;
    assert!(played.iter().any(|r| r.as_ref().is_err_and(|e| e.is_newer() && !e.is_unreadable())), "{played:?}");
    let window = Window { start: base, end: base + 1000 };
    let (slots, _) = read_index(&env.dynamo, table, base - 1000, base + 1000).await.unwrap();
    let tiers = Tiers::new(None);
    let reader = every_key(&env, table, &window, &tiers);
    let mut followed = Vec::new();
    let keep = |_: &event_store::event_item::EventItem, json: Option<Value>, _: &[u8]| {
        followed.push(json.unwrap()["n"].as_i64().unwrap());
        std::ops::ControlFlow::Continue(())
    };
    let stopped = reader.each_event(slots, Checkpoint::at_slot(base - 1000), &mut RecentIds::new(0), keep).await;
    assert!(stopped.is_err_and(|e| e.is_newer()));
    assert_eq!(followed.last(), Some(&24), "{followed:?}");
    // Upgraded (the item reads again): the partition goes on from where it waited, and no longer waits.
    env.dynamo.put_item().table_name(table).set_item(Some(original)).send().await.unwrap();
    tick(&env, &target, runs::subscription_config(&env.names)).await;
    let delivered: Vec<i64> = target.taken().iter().map(|e| e["data"]["n"].as_i64().unwrap()).collect();
    assert_eq!(delivered[18..], (20..30).collect::<Vec<_>>());
    let statuses = event_store::readers::subscriptions::status::statuses(&env.dynamo, table, None, 1000).await.unwrap();
    assert!(statuses.iter().flat_map(|s| s.partitions.iter()).all(|p| p.waiting.is_none()), "{statuses:?}");
    let wide: Vec<i64> = on_stream(&env, &env.names.playback_stream)
        .await
        .iter()
        .filter(|e| e["subscription"] == "wide")
        .map(|e| e["data"]["n"].as_i64().unwrap())
        .collect();
    let mut wide_sorted = wide.clone();
    wide_sorted.sort();
    assert_eq!(wide_sorted, (20..30).collect::<Vec<_>>(), "each event once, none skipped: {wide:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reset_never_reuses_a_sequence_number_a_delivery_without_its_save_used() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..30, 3, T0, 300).await;
    let create = json!({"action": "create", "name": "r", "start": format_ms(T0), "target": {"lambda": CONSUMER},
        "partitions": 1, "batch_size": 10});
    manage(&env, &target, create).await.unwrap();
    assert_eq!(tick(&env, &target, runs::subscription_config(&env.names)).await[0].delivered, 30);
    let seqs = |events: &[Value]| -> Vec<u64> { events.iter().map(|e| e["playback_seq"].as_u64().unwrap()).collect() };
    let first = seqs(&target.taken());
    assert_eq!(first, (0..30).collect::<Vec<u64>>());
    // The last batch (20..29) was delivered, but its runner's save never landed (a crash, or the
    // reset below took the lease away just before it): the stored count says 20.
    env.dynamo
        .update_item()
        .table_name(&env.names.event_table)
        .set_key(Some(event_store::readers::subscriptions::partition_item_key("r", 0)))
        .update_expression("SET #c.#seq = :seq")
        .expression_attribute_names("#c", "checkpoint")
        .expression_attribute_names("#seq", "seq")
        .expression_attribute_values(":seq", aws_sdk_dynamodb::types::AttributeValue::N("20".into()))
        .send()
        .await
        .unwrap();
    manage(&env, &target, json!({"action": "reset", "name": "r", "to": format_ms(T0)})).await.unwrap();
    assert_eq!(tick(&env, &target, runs::subscription_config(&env.names)).await[0].delivered, 30);
    let again = seqs(&target.taken()[30..]);
    assert!(again.iter().all(|seq| *seq >= 30), "a number names one event, whatever a reset does: {again:?}");
    assert!(again.windows(2).all(|w| w[1] == w[0] + 1), "and they go on without a gap after the reset: {again:?}");
}

/// Runs `tests/consumer.py` (a consumer written from the rule in docs/subscriptions.md, in
/// Python with AWS's deaggregator) over a Kinesis target: the `n` of each
/// event it processed, per partition key, in the order it processed them.
fn python_consumer(env: &TestEnv, stream: &str, rule: &str) -> HashMap<String, Vec<i64>> {
    let root = common::repo_root();
    let python = root.join(".venv/bin/python");
    assert!(python.exists(), "{} missing: run `make tools` (boto3, aws-kinesis-agg)", python.display());
    let out = std::process::Command::new(python)
        .arg(root.join("tests/consumer.py"))
        .args(["--endpoint", &env.kinesis_endpoint, "--stream", stream, "--rule", rule])
        .output()
        .unwrap();
    assert!(out.status.success(), "consumer.py: {}", String::from_utf8_lossy(&out.stderr));
    let processed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
    for event in processed {
        let key = event["partition_key"].as_str().unwrap().to_owned();
        by_key.entry(key).or_default().push(event["data"]["n"].as_i64().unwrap());
    }
    by_key
}

/// Issue 27, item 8: one partition spread over a 4-shard Kinesis target; a
/// delivery cut short by one key's refusing shard, then a lost save (the
/// batch in flight again). What was stored ahead is read back, not put
/// again; a consumer that follows the documented rule gets every event once,
/// in key order, however it orders the shards; the old per-partition rule loses events.
#[tokio::test(flavor = "multi_thread")]
async fn a_consumer_following_the_readme_rule_gets_every_event_once_from_a_sharded_target() {
    use event_store_fault_proxy::{Config, Fault};
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..400, 8, T0, 4_000).await;
    let stream = "event-store-test-sub-sharded";
    env.kinesis.create_stream().stream_name(stream).shard_count(4).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let create = json!({"action": "create", "name": "c", "start": format_ms(T0), "target": {"kinesis": stream},
        "partitions": 1, "batch_size": 100});
    manage(&env, &target, create).await.unwrap();
    let none: &'static [Fault] = &[];
    let (faulty, proxy) = common::through_faults(&env, Config { seed: 3, rate: 0.0, only: Some(none) }).await;
    let (invoker, _) = LocalInvoker::channel();
    let config = runs::subscription_config(&env.names);
    let subs = Subscriptions::new(env.dynamo.clone(), faulty, lambda_client(&env, &target), config, Arc::new(invoker))
        .with_backoff(quick());
    let run = || subs.run_partition(PartitionTask::first("c", 0), far());
    let partition_key = || event_store::readers::subscriptions::partition_item_key("c", 0);

    // user-5's shard refuses: the first batch is cut short, most of it stored.
    proxy.refuse_partition_key("user-5");
    assert_eq!(run().await.unwrap().status, RunStatus::Unavailable);
    let stored_first = on_stream(&env, stream).await.len();
    assert!(stored_first > 0 && stored_first < 100, "stored ahead of the failure: {stored_first}");
    proxy.accept_partition_key("user-5");
    assert_eq!(run().await.unwrap().status, RunStatus::CaughtUp);
    assert_eq!(on_stream(&env, stream).await.len(), 400, "what was stored ahead was not put again");

    // A lost save: the checkpoint goes back to where the first run left it (without its note
    // of what it stored ahead, as a crash in the middle of a put leaves it): delivered again.
    env.dynamo
        .update_item()
        .table_name(&env.names.event_table)
        .set_key(Some(partition_key()))
        .update_expression("SET #c.#seq = :seq, #c.#slot = :slot, #c.#after = :after REMOVE #c.ahead_since")
        .expression_attribute_names("#c", "checkpoint")
        .expression_attribute_names("#seq", "seq")
        .expression_attribute_names("#slot", "slot")
        .expression_attribute_names("#after", "after")
        .expression_attribute_values(":seq", aws_sdk_dynamodb::types::AttributeValue::N("0".into()))
        .expression_attribute_values(":slot", aws_sdk_dynamodb::types::AttributeValue::N(T0.to_string()))
        .expression_attribute_values(
            ":after",
            aws_sdk_dynamodb::types::AttributeValue::S(event_store::event_item::sort_key_floor(T0)),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(run().await.unwrap().status, RunStatus::CaughtUp);
    let on_target = on_stream(&env, stream).await;
    assert_eq!(on_target.len(), 800, "everything delivered twice, under the same numbers");

    let processed = python_consumer(&env, stream, "key-seq");
    for (key, ns) in &processed {
        let user: i64 = key.trim_start_matches("user-").parse().unwrap();
        assert_eq!(*ns, (0..400).filter(|n| n % 8 == user).collect::<Vec<_>>(), "{key}: each event once, in order");
    }
    assert_eq!(processed.len(), 8);
    let old_rule: usize = python_consumer(&env, stream, "partition-position").values().map(Vec::len).sum();
    assert!(old_rule < 400, "the per-partition rule drops real events from a lagging shard: {old_rule} of 400");
}

/// Issue 27, item 15: a runner delivers up to the watermark itself, not to
/// the start of the watermark's slot: a slot's length less latency.
#[tokio::test(flavor = "multi_thread")]
async fn a_runner_delivers_up_to_the_watermark_inside_its_slot() {
    use event_store::bookkeeping::watermark;
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..200, 4, T0, 2_000).await;
    manage(
        &env,
        &target,
        json!({"action": "create", "name": "w", "start": format_ms(T0), "target": {"lambda": CONSUMER}}),
    )
    .await
    .unwrap();
    // A newer set of segments' watermark, halfway through the second slot.
    let (dynamo, table) = (&env.dynamo, env.names.event_table.as_str());
    let set_watermark = |time: i64| async move {
        for segment in 0..8 {
            watermark::advance(dynamo, table, segment, 8, time, now_ms()).await.unwrap();
        }
        assert_eq!(watermark::read(dynamo, table).await.unwrap().time, Some(time));
    };
    set_watermark(T0 + 1_500).await;
    tick(&env, &target, runs::subscription_config(&env.names)).await;
    let mut delivered: Vec<i64> = target.taken().iter().map(|e| e["data"]["n"].as_i64().unwrap()).collect();
    delivered.sort();
    assert_eq!(delivered, (0..150).collect::<Vec<_>>(), "every event that arrived before the watermark");
    set_watermark(T0 + 2_500).await;
    tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!(assert_all_in_key_order(&target.taken(), 0..200, 4), 0, "the rest, none twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_create_nothing_and_pause_reset_and_delete_do_what_they_say() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    stored_events(&env, 0..100, 5, T0, 1_000).await;
    let ok = json!({"action": "create", "name": "a", "start": format_ms(T0), "target": {"lambda": CONSUMER}});
    manage(&env, &target, ok.clone()).await.unwrap();
    // The SDK's retry of a create whose put was applied and then answered with an error
    // puts the same definition (same id) again: done, not "exists already".
    let stored =
        event_store::readers::subscriptions::get(&env.dynamo, &env.names.event_table, "a").await.unwrap().unwrap();
    event_store::readers::subscriptions::create(&env.dynamo, &env.names.event_table, &stored).await.unwrap();
    let bad = [
        (ok.clone(), "exists already"),
        (json!({"action": "create", "name": "b c", "target": {"lambda": CONSUMER}}), "name"),
        (
            json!({"action": "create", "name": "b", "start": format_ms(now_ms() + 3_600_000), "target": {"lambda": CONSUMER}}),
            "future",
        ),
        (json!({"action": "create", "name": "b", "target": {"lambda": "nobody"}}), "nobody"),
        (json!({"action": "create", "name": "b", "target": {"kinesis": "no-such-stream"}}), "no-such-stream"),
        (json!({"action": "create", "name": "b", "target": {"sqs": "q"}}), "unknown variant"),
        (
            json!({"action": "create", "name": "b", "target": {"lambda": CONSUMER}, "filter": [{"field": "x", "equals": 1}]}),
            "pointer",
        ),
        (
            json!({"action": "create", "name": "b", "target": {"lambda": CONSUMER}, "filter": "/x=1"}),
            "expected a sequence",
        ),
        (json!({"action": "create", "name": "b", "target": {"lambda": CONSUMER}, "partitions": 1025}), "partitions"),
        (json!({"action": "rescale", "name": "a", "partitions": 0}), "partitions"),
        (json!({"action": "rescale", "name": "a", "partitions": 1025}), "partitions"),
        (json!({"action": "rescale", "name": "nope", "partitions": 2}), "no subscription"),
        (json!({"action": "create", "name": "b", "target": {"lambda": CONSUMER}, "partitions": 0}), "partitions"),
        (json!({"action": "pause", "name": "nope"}), "no subscription"),
        (json!({"action": "reset", "name": "a", "to": format_ms(now_ms() + 3_600_000)}), "future"),
    ];
    for (request, word) in bad {
        let err = manage(&env, &target, request.clone()).await.expect_err(&request.to_string());
        assert!(matches!(&err, Error::BadInput(m) if m.contains(word)), "{request}: {err}");
    }
    let listed = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    assert_eq!(listed["subscriptions"].as_array().unwrap().len(), 1, "only the good one");

    // Paused: the tick starts nothing. Resumed: everything.
    manage(&env, &target, json!({"action": "pause", "name": "a"})).await.unwrap();
    assert!(tick(&env, &target, runs::subscription_config(&env.names)).await.is_empty());
    manage(&env, &target, json!({"action": "resume", "name": "a"})).await.unwrap();
    assert_eq!(tick(&env, &target, runs::subscription_config(&env.names)).await[0].delivered, 100);
    // Reset to the middle: delivered again from there.
    let middle = T0 + 500;
    manage(&env, &target, json!({"action": "reset", "name": "a", "to": format_ms(middle)})).await.unwrap();
    let again = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert_eq!(again[0].delivered, 50, "{again:?}");
    // Deleted: gone with its checkpoints.
    manage(&env, &target, json!({"action": "delete", "name": "a"})).await.unwrap();
    let listed = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    assert_eq!(listed["subscriptions"], json!([]));
    let gone = subscriptions(&env, &target, runs::subscription_config(&env.names))
        .run_partition(PartitionTask::first("a", 0), far())
        .await
        .unwrap();
    assert_eq!(gone.status, RunStatus::Gone);
}

/// `n` posted events of `types` types and `keys` visitors (`{"type": "t<i % types>", "n": i}`
/// in an envelope of their own), arriving from `from` over `spread_ms`, moved into the event table.
async fn posted_events(env: &TestEnv, n: i64, (types, keys): (i64, i64), from: i64, spread_ms: i64) {
    let records: Vec<_> = (0..n)
        .map(|i| {
            let envelope = json!({"id": format!("posted-{i}"), "received_at": format_ms(from), "method": "POST",
                "path": "/events", "query": {}, "headers": {}, "body": {"type": format!("t{}", i % types), "n": i}});
            (format!("visitor-{}", i % keys), envelope.to_string().into_bytes(), from + i * spread_ms / n)
        })
        .collect();
    buffer_through_pump(env, &records).await;
    scan_pass(env).await;
}

/// Every item of a projection's view, by key (the management action's pages, followed to the end).
async fn view_items(env: &TestEnv, target: &LambdaTarget, name: &str) -> HashMap<String, Value> {
    let (mut items, mut after) = (HashMap::new(), None::<String>);
    loop {
        let mut query = json!({"action": "view", "name": name, "limit": 1000});
        if let Some(after) = &after {
            query["after"] = json!(after);
        }
        let page = manage(env, target, query).await.unwrap();
        for item in page["items"].as_array().unwrap() {
            items.insert(item["key"].as_str().unwrap().to_owned(), item.clone());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return items,
        }
    }
}

/// Issue 47: a `count` projection kept through DynamoDB faults (10 %, applied-then-500
/// writes among them), a runner killed mid-batch and a lost checkpoint (everything
/// delivered again) ends with counts equal to the events sent, exactly.
#[tokio::test(flavor = "multi_thread")]
async fn a_count_projection_counts_every_event_exactly_once_through_faults_a_kill_and_a_redelivery() {
    use event_store_fault_proxy::{Config, FaultProxy};
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let (n, types) = (1_200, 150);
    posted_events(&env, n, (types, 40), T0, 3_000).await;
    let create = json!({"action": "create_projection", "name": "types", "kind": "count", "by": "type",
        "partitions": 4, "start": format_ms(T0 - 60_000)});
    let created = manage(&env, &target, create).await.unwrap();
    assert_eq!(created["subscription"], "view.types.v1");

    // Partition 0 killed once its view has taken a transaction, before its checkpoint is saved:
    // its lease lapses as a crashed runner's does.
    let subs = Arc::new(subscriptions(&env, &target, runs::subscription_config(&env.names)));
    let running = tokio::spawn({
        let subs = subs.clone();
        async move { subs.run_partition(PartitionTask::first("view.types.v1", 0), far()).await }
    });
    // Events each partition's view has applied, as the view's answers say.
    let applied_by = || async {
        let answer = manage(&env, &target, json!({"action": "view", "name": "types", "limit": 1})).await.unwrap();
        let partitions = answer["position"]["partitions"].as_array().unwrap().clone();
        partitions.iter().map(|p| p["events"].as_u64().unwrap()).collect::<Vec<u64>>()
    };
    let first = loop {
        let first = applied_by().await[0];
        if first > 0 || running.is_finished() {
            break first;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    running.abort();
    let killed_mid_batch = first > 0 && running.await.is_err_and(|e| e.is_cancelled());
    let partition_key = event_store::readers::subscriptions::partition_item_key("view.types.v1", 0);
    let expire = |key: HashMap<String, aws_sdk_dynamodb::types::AttributeValue>| {
        env.dynamo
            .update_item()
            .table_name(&env.names.event_table)
            .set_key(Some(key))
            .update_expression("SET lease_until = :zero")
            .expression_attribute_values(":zero", aws_sdk_dynamodb::types::AttributeValue::N("0".into()))
            .send()
    };
    expire(partition_key.clone()).await.unwrap();

    // Every runner through faults, in front of a moto that takes a transaction alone (as DynamoDB isolates one).
    let alone = FaultProxy::start_transactions_alone(&env.dynamo_endpoint()).await.unwrap();
    let faults = FaultProxy::start(&alone.endpoint, Config { seed: 47, rate: 0.1, only: None }).await.unwrap();
    let faulty = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk).endpoint_url(&faults.endpoint).build(),
    );
    let config = runs::subscription_config(&env.names);
    let through_faults = |lambda: aws_sdk_lambda::Client| {
        let (faulty, kinesis, config) = (faulty.clone(), env.kinesis.clone(), config.clone());
        move |invoker| Subscriptions::new(faulty, kinesis, lambda, config, invoker).with_backoff(quick())
    };
    let applied = || async { applied_by().await.iter().sum::<u64>() };
    for _ in 0..20 {
        let make = through_faults(lambda_client(&env, &target));
        run_subscriptions(make, json!({"source": "aws.events"}), deadline_in(Duration::from_secs(900))).await;
        if applied().await == n as u64 {
            break;
        }
        // A run the faults ended (unavailable) keeps its lease for the backoff: the next tick goes on.
        for partition in 0..4 {
            expire(event_store::readers::subscriptions::partition_item_key("view.types.v1", partition)).await.unwrap();
        }
    }
    assert_eq!(applied().await, n as u64, "every event applied once");
    let transactions_applied_then_failed =
        faults.applied_then_failed().iter().filter(|a| a.operation.ends_with("TransactWriteItems")).count();

    // A lost checkpoint: partition 1 delivers everything again; its view skips what it has.
    env.dynamo
        .update_item()
        .table_name(&env.names.event_table)
        .set_key(Some(event_store::readers::subscriptions::partition_item_key("view.types.v1", 1)))
        .update_expression("SET #c.#slot = :slot, #c.#after = :after")
        .expression_attribute_names("#c", "checkpoint")
        .expression_attribute_names("#slot", "slot")
        .expression_attribute_names("#after", "after")
        .expression_attribute_values(":slot", aws_sdk_dynamodb::types::AttributeValue::N((T0 - 60_000).to_string()))
        .expression_attribute_values(
            ":after",
            aws_sdk_dynamodb::types::AttributeValue::S(event_store::event_item::sort_key_floor(T0 - 60_000)),
        )
        .send()
        .await
        .unwrap();
    let again = subs.run_partition(PartitionTask::first("view.types.v1", 1), far()).await.unwrap();
    assert!(again.delivered > 0, "partition 1 delivered its events again: {again:?}");
    assert_eq!(applied().await, n as u64, "and its view took none of them twice");

    let items = view_items(&env, &target, "types").await;
    assert_eq!(items.len() as i64, 3 * types, "a minute, an hour and a day per type (one minute: 3 s of events)");
    for (key, item) in &items {
        assert_eq!(item["count"], n / types, "{key}: every event of its type, once");
    }
    let one = manage(&env, &target, json!({"action": "view", "name": "types", "key": items.keys().next().unwrap()}));
    let one = one.await.unwrap();
    assert_eq!(one["item"]["count"], n / types);
    assert!(one["position"]["through"].as_str().is_some(), "every answer carries the position it reflects");
    println!(
        "killed mid-batch: {killed_mid_batch}; faults: {:?}; transactions applied then failed: {transactions_applied_then_failed}",
        faults.counts()
    );
    assert!(killed_mid_batch, "the kill came after the view's first transaction, before the run ended");
    assert!(!faults.applied_then_failed().is_empty(), "some writes were applied, then answered 500");
}

/// Issue 47: a `state` view of entity streams (as the relay puts their events in the log):
/// each stream's events merged in version order (RFC 7386), other events left out.
#[tokio::test(flavor = "multi_thread")]
async fn a_state_view_merges_each_streams_events_in_version_order() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let mut records = Vec::new();
    for i in 0..30i64 {
        let stream = format!("todo-{}", i % 3);
        let data = match i / 3 {
            0 => json!({"title": format!("task {}", i % 3), "done": false, "note": "x"}),
            9 => json!({"done": true, "note": null}),
            v => json!({"edits": v}),
        };
        records.push(relayed(&stream, (i / 3) as u64, ("changed", data), T0 + i * 50));
    }
    records.push(relayed("note-1", 0, ("changed", json!({"title": "not a todo"})), T0 + 10));
    records.push(("visitor-1".into(), json!({"id": "hit-1", "path": "/track.gif"}).to_string().into_bytes(), T0 + 20));
    buffer_through_pump(&env, &records).await;
    scan_pass(&env).await;
    let create = json!({"action": "create_projection", "name": "todos", "kind": "state", "category": ["todo"],
        "partitions": 2, "start": format_ms(T0 - 60_000)});
    manage(&env, &target, create).await.unwrap();
    env.counter.reset();
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert!(runs.iter().all(|r| r.status == RunStatus::CaughtUp), "{runs:?}");
    let items = view_items(&env, &target, "todos").await;
    // What the runners and the queries asked of the views table, the template allows.
    common::assert_only_declared_actions(&env.counter, event_store::subscription::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "SubscriptionsFunction");
    let keys: std::collections::BTreeSet<&str> = items.keys().map(String::as_str).collect();
    assert_eq!(keys, ["todo-0", "todo-1", "todo-2"].into_iter().collect());
    for i in 0..3 {
        let item = &items[&format!("todo-{i}")];
        assert_eq!(item["state"], json!({"title": format!("task {i}"), "done": true, "edits": 8}));
        assert_eq!(item["stream_version"], 9);
    }
    let refused = manage(&env, &target, json!({"action": "rescale", "name": "view.todos.v1", "partitions": 4})).await;
    assert!(
        refused.unwrap_err().to_string().contains("projection"),
        "a projection's subscription is not rescaled alone"
    );
    let deleted = manage(&env, &target, json!({"action": "delete_projection", "name": "todos"})).await.unwrap();
    assert!(deleted["items"].as_u64().unwrap() >= 3);
    let left = env.scan_table(&env.names.view_table).await;
    assert!(left.is_empty(), "nothing of the view is left: {left:?}");
}

/// The Todo example, fixed to take `TodoArchived` (which the first version refused).
struct Archiving;

impl event_store::views::Projection for Archiving {
    fn key(&self, event: &event_store::views::ViewEvent) -> Option<String> {
        event_store::views::Projection::key(&todos::Todos, event)
    }

    fn apply(
        &self,
        state: Option<&Value>,
        event: &event_store::views::ViewEvent,
    ) -> Result<event_store::views::Change, String> {
        match (event.entity().map(|e| e.event_type), state) {
            (Some("TodoArchived"), Some(state)) => {
                let mut archived = state.clone();
                archived["archived"] = json!(true);
                Ok(event_store::views::Change::Put(archived))
            }
            _ => event_store::views::Projection::apply(&todos::Todos, state, event),
        }
    }
}

/// An entity event as the relay puts it in the log (`entity::relay`'s envelope).
fn relayed(stream: &str, version: u64, (kind, data): (&str, Value), at: i64) -> (String, Vec<u8>, i64) {
    let body = json!({"stream": stream, "EntityId": stream, "version": version, "id": format!("e{version}"),
        "type": kind, "data": data, "time": format_ms(at)});
    let envelope = json!({"id": format!("{stream}/{version}"), "received_at": format_ms(at), "method": "POST",
        "path": format!("/streams/{stream}"), "query": {}, "headers": {}, "body": body});
    (format!("streams/{stream}"), envelope.to_string().into_bytes(), at)
}

/// Issue 47: a projection in the user's code (`examples/todos`, the seed article's Todo list)
/// behind the Lambda `Invoke` API, applying each batch with `views::lambda::handle`: the
/// store's runner, batching and parking, the function's own transaction and position.
#[tokio::test(flavor = "multi_thread")]
async fn the_todo_example_keeps_the_seed_articles_read_model_from_a_function() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    let (dynamo, table) = (env.dynamo.clone(), env.names.view_table.clone());
    target.consume_with(move |payload| {
        let batch: event_store::views::lambda::ViewBatch = serde_json::from_value(payload.clone()).unwrap();
        let applied = event_store::views::lambda::handle(&dynamo, &table, &todos::Todos, batch);
        Answer::Ok(tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(applied)))
    });
    let title = |t: &str| json!({"title": t});
    let records = vec![
        relayed("todo-1", 0, ("TodoCreated", title("milk")), T0),
        relayed("todo-2", 0, ("TodoCreated", title("bread")), T0 + 10),
        relayed("todo-1", 1, ("TodoUpdated", title("oat milk")), T0 + 20),
        relayed("todo-3", 0, ("TodoCreated", title("eggs")), T0 + 30),
        relayed("todo-2", 1, ("StreamDeleted", json!({})), T0 + 40),
        relayed("todo-3", 1, ("TodoArchived", json!({})), T0 + 50),
        relayed("todo-1", 2, ("TodoCompleted", json!({})), T0 + 60),
        relayed("todo-3", 2, ("TodoCompleted", json!({})), T0 + 70),
    ];
    buffer_through_pump(&env, &records).await;
    scan_pass(&env).await;
    let create = json!({"action": "create_projection", "name": "todos", "kind": "function", "function": CONSUMER,
        "category": ["todo"], "partitions": 2, "start": format_ms(T0 - 60_000)});
    manage(&env, &target, create).await.unwrap();
    let runs = tick(&env, &target, runs::subscription_config(&env.names)).await;
    assert!(runs.iter().all(|r| r.status == RunStatus::CaughtUp), "{runs:?}");
    assert_eq!(runs.iter().map(|r| r.parked).sum::<usize>(), 1, "the unknown event, parked: {runs:?}");

    let items = view_items(&env, &target, "todos").await;
    assert_eq!(items["todo-1"]["state"], json!({"title": "oat milk", "completed": true}));
    assert!(!items.contains_key("todo-2"), "a deleted todo leaves the list");
    assert_eq!(items["todo-3"]["state"], json!({"title": "eggs", "completed": true}), "past the parked event");
    assert_eq!(items["todo-1"]["stream_version"], 2);
    let parked = manage(&env, &target, json!({"action": "parked", "name": "view.todos.v1"})).await.unwrap();
    assert_eq!(parked["parked"].as_array().map(Vec::len), Some(1), "{parked}");
    assert!(parked["parked"][0]["error"].as_str().unwrap().contains("TodoArchived"), "{parked}");
    // The function fixed (it now takes TodoArchived), the parked event is redriven: applied once,
    // out of the log's order, onto the state the later events left.
    let (dynamo, table) = (env.dynamo.clone(), env.names.view_table.clone());
    target.consume_with(move |payload| {
        let batch: event_store::views::lambda::ViewBatch = serde_json::from_value(payload.clone()).unwrap();
        let applied = event_store::views::lambda::handle(&dynamo, &table, &Archiving, batch);
        Answer::Ok(tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(applied)))
    });
    let redriven = manage(&env, &target, json!({"action": "redrive", "name": "view.todos.v1"})).await.unwrap();
    assert_eq!(redriven["redriven"].as_array().map(Vec::len), Some(1), "{redriven}");
    let items = view_items(&env, &target, "todos").await;
    assert_eq!(items["todo-3"]["state"], json!({"title": "eggs", "completed": true, "archived": true}));
    let left = manage(&env, &target, json!({"action": "parked", "name": "view.todos.v1"})).await.unwrap();
    assert_eq!(left["parked"], json!([]), "unparked once taken");
    // Delivered again (a lost checkpoint): the function's view skips what it has.
    let batches = target.received().len();
    let again = subscriptions(&env, &target, runs::subscription_config(&env.names));
    for partition in 0..2 {
        env.dynamo
            .update_item()
            .table_name(&env.names.event_table)
            .set_key(Some(event_store::readers::subscriptions::partition_item_key("view.todos.v1", partition)))
            .update_expression("SET #c.#slot = :slot REMOVE #c.#after")
            .expression_attribute_names("#c", "checkpoint")
            .expression_attribute_names("#slot", "slot")
            .expression_attribute_names("#after", "after")
            .expression_attribute_values(":slot", aws_sdk_dynamodb::types::AttributeValue::N((T0 - 60_000).to_string()))
            .send()
            .await
            .unwrap();
        again.run_partition(PartitionTask::first("view.todos.v1", partition), far()).await.unwrap();
    }
    assert!(target.received().len() > batches, "delivered again");
    assert_eq!(view_items(&env, &target, "todos").await, items, "nothing applied twice");

    // The same view over HTTP, as the streams function serves it beside /streams.
    let api = event_store::views::http::ViewsApi::new(env.dynamo.clone(), env.names.view_table.clone());
    let get = |target: &str| {
        use lambda_http::RequestExt;
        let query: lambda_http::aws_lambda_events::query_map::QueryMap =
            target.split_once('?').map_or("", |(_, q)| q).parse().unwrap_or_default();
        let request = lambda_http::http::Request::builder().method("GET").uri(target);
        let request = request.body(lambda_http::Body::Empty).unwrap().with_query_string_parameters(query);
        let api = &api;
        async move {
            let response = api.handle(&request).await;
            (response.status().as_u16(), serde_json::from_slice::<Value>(response.body().as_ref()).unwrap())
        }
    };
    let (status, one) = get("/views/todos/todo-1").await;
    assert_eq!((status, &one["item"]["state"]), (200, &json!({"title": "oat milk", "completed": true})), "{one}");
    let applied: u64 =
        one["position"]["partitions"].as_array().unwrap().iter().map(|p| p["events"].as_u64().unwrap()).sum();
    assert_eq!(applied, 8, "every event, once (the eighth by the redrive): {one}");
    assert_eq!(get("/views/todos/todo-1?at_least_version=2").await.0, 200, "the version the last append answered");
    let started = Instant::now();
    let (status, behind) = get("/views/todos/todo-1?at_least_version=3").await;
    assert_eq!((status, &behind["stream_version"]), (503, &json!(2)), "{behind}");
    assert!(started.elapsed() >= Duration::from_secs(4), "it waited for the version before answering");
    let (status, page) = get("/views/todos?prefix=todo-&limit=1").await;
    assert_eq!(
        (status, page["items"][0]["key"].as_str(), page["next"].as_str()),
        (200, Some("todo-1"), Some("todo-1"))
    );
    let (_, rest) = get("/views/todos?prefix=todo-&after=todo-1").await;
    let keys: Vec<&str> = rest["items"].as_array().unwrap().iter().map(|i| i["key"].as_str().unwrap()).collect();
    assert_eq!((keys, rest.get("next")), (vec!["todo-3"], None), "{rest}");
    assert_eq!(get("/views/todos/todo-2").await.0, 404, "a deleted todo");
    assert_eq!(get("/views/nope").await.0, 404);
    assert_eq!(get("/views/todos?limit=x").await.0, 400);
}

/// Issue 47: a rebuild under live appends. Version 2 (a changed definition: more partitions) is
/// built beside version 1 while events keep coming; queries answer version 1, whole, until the
/// tick that finds version 2 caught up switches to it; then version 1 is gone and the view is the
/// fold of the whole log. A second rebuild is cancelled and leaves nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_rebuild_under_live_appends_switches_once_caught_up_and_queries_never_see_it_half_built() {
    let env = TestEnv::start(1).await;
    let target = LambdaTarget::start(&[CONSUMER]).await.unwrap();
    // Runners of both versions add to the same counters at once: moto takes a transaction alone, as DynamoDB isolates one.
    let alone = event_store_fault_proxy::FaultProxy::start_transactions_alone(&env.dynamo_endpoint()).await.unwrap();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk)
            .endpoint_url(&alone.endpoint)
            .interceptor(env.counter.clone())
            .build(),
    );
    // Its queries too: moto lets a read see a transaction half applied (DynamoDB never does).
    let manage = |_: &TestEnv, target: &LambdaTarget, action: Value| {
        let (invoker, _) = LocalInvoker::channel();
        let (config, lambda) = (runs::subscription_config(&env.names), lambda_client(&env, target));
        let subs = Subscriptions::new(dynamo.clone(), env.kinesis.clone(), lambda, config, Arc::new(invoker));
        async move { subs.handle(action, far()).await?.to_json() }
    };
    let run_tick = || {
        let (dynamo, kinesis, config) = (dynamo.clone(), env.kinesis.clone(), runs::subscription_config(&env.names));
        let lambda = lambda_client(&env, &target);
        let make = move |invoker| Subscriptions::new(dynamo, kinesis, lambda, config, invoker).with_backoff(quick());
        run_subscriptions(make, json!({"source": "aws.events"}), deadline_in(Duration::from_secs(900)))
    };
    let types = 30;
    posted_events(&env, 600, (types, 40), T0, 3_000).await;
    let create = json!({"action": "create_projection", "name": "live", "kind": "count", "by": "type",
        "partitions": 2, "start": format_ms(T0 - 60_000)});
    manage(&env, &target, create).await.unwrap();
    run_tick().await;
    // The events a day view counts, in all.
    let total = |answer: &Value| -> i64 {
        answer["items"].as_array().unwrap().iter().map(|i| i["count"].as_i64().unwrap()).sum()
    };
    let page = json!({"action": "view", "name": "live", "prefix": "day/", "limit": 1000});
    let before = manage(&env, &target, page.clone()).await.unwrap();
    assert_eq!((before["version"].as_u64(), total(&before)), (Some(1), 600));
    assert_eq!(before["items"].as_array().map(Vec::len), Some(types as usize), "a day per type");

    let rebuild = json!({"action": "rebuild_projection", "name": "live",
        "definition": {"kind": "count", "by": "type", "partitions": 4}});
    let started = manage(&env, &target, rebuild.clone()).await.unwrap();
    assert_eq!(started["version"], 2, "{started}");
    assert!(manage(&env, &target, rebuild).await.is_err(), "one rebuild at a time");
    // Live appends while version 2 is built: events arriving now, after version 1's position.
    let now = now_ms();
    let more: Vec<_> = (600..900)
        .map(|i| {
            let envelope = json!({"id": format!("posted-{i}"), "received_at": format_ms(now), "method": "POST",
                "path": "/events", "query": {}, "headers": {}, "body": {"type": format!("t{}", i % types), "n": i}});
            (format!("visitor-{}", i % 40), envelope.to_string().into_bytes(), now + (i - 600) * 5)
        })
        .collect();
    buffer_through_pump(&env, &more).await;
    tokio::time::sleep(Duration::from_millis(2_600)).await; // past their slots, so the pass completes them
    scan_pass(&env).await;
    let building = tokio::spawn(run_tick());
    let mut looked = 0;
    while !building.is_finished() {
        let answer = manage(&env, &target, page.clone()).await.unwrap();
        assert_eq!(answer["version"], 1, "the serving version until the switch");
        assert!(total(&answer) >= 600, "never a half-built view: {answer}");
        looked += 1;
    }
    building.await.unwrap();
    let caught_up = manage(&env, &target, page.clone()).await.unwrap();
    assert_eq!((caught_up["version"].as_u64(), total(&caught_up)), (Some(1), 900), "version 1 is live too");

    // The next tick finds version 2 caught up: one write switches the queries, version 1 goes.
    let ticked: Vec<Value> = run_tick().await.into_iter().map(|a| a.unwrap()).collect();
    assert!(ticked.iter().any(|a| a["switched"] == json!(["live"])), "{ticked:?}");
    let after = manage(&env, &target, page.clone()).await.unwrap();
    assert_eq!((after["version"].as_u64(), total(&after)), (Some(2), 900), "the whole log");
    let counted = |answer: &Value| -> Vec<(String, i64)> {
        let items = answer["items"].as_array().unwrap().iter();
        items.map(|i| (i["key"].as_str().unwrap().to_owned(), i["count"].as_i64().unwrap())).collect()
    };
    assert!(counted(&after) == counted(&caught_up), "the same counts, built again");
    assert_eq!(after["position"]["partitions"].as_array().map(Vec::len), Some(4), "version 2's partitions");
    let old: Vec<_> = env
        .scan_table(&env.names.view_table)
        .await
        .into_iter()
        .filter(|item| item["view"].as_s().unwrap().starts_with("live#v1#"))
        .collect();
    assert!(old.is_empty(), "version 1's items are deleted: {}", old.len());
    let listed = manage(&env, &target, json!({"action": "list"})).await.unwrap();
    let subs: Vec<&str> =
        listed["subscriptions"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(subs, ["view.live.v2"]);

    // A rebuild cancelled: version 3's subscription and items go; version 2 serves on.
    let third = json!({"action": "rebuild_projection", "name": "live"});
    assert_eq!(manage(&env, &target, third).await.unwrap()["version"], 3);
    run_tick().await;
    let cancelled = manage(&env, &target, json!({"action": "cancel_rebuild", "name": "live"})).await.unwrap();
    assert!(cancelled["items"].as_u64().unwrap() > 0, "{cancelled}");
    let left = env.scan_table(&env.names.view_table).await;
    assert!(!left.iter().any(|item| item["view"].as_s().unwrap().starts_with("live#v3#")));
    assert_eq!(manage(&env, &target, page).await.unwrap()["version"], 2);
    println!("queries while version 2 was built: {looked}");
}
