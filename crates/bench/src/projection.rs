//! Projections' figures (results.json's `projection`, bench/projection.md), on a moto of their
//! own behind the fault proxy's transactions-alone lane (DynamoDB isolates a transaction; moto,
//! answering on many threads, does not), with a Lambda target on 127.0.0.1 that takes every
//! batch and writes nothing.
//!
//! [`EVENTS`] tracking events of [`VISITORS`] visitors (the log's keys), each on one of
//! [`PAGES`] pages and of one of [`TYPES`] types, a week old, pumped and sealed once; then, each
//! through the subscriptions function's tick as deployed:
//! 1. a subscription delivering them to the Lambda target: events/s;
//! 2. a `count` projection by page (a minute, an hour and a day per page: 1,500 counters and
//!    more): events/s, its ratio to (1) (`ratio_to_subscription`, target >= 0.7), the
//!    transactional item writes per projected event, and the counts checked against what was sent;
//! 3. the same by type (30 counters): how the figures move with the counters a batch touches;
//! 4. a projection whose function writes nothing, from the hot table; then the events archived
//!    (the hot copies gone) and the projection rebuilt, version 2 reading the archive: the
//!    rebuild's read side from each tier (`rebuild_read_ratio_archive_to_hot`, target >= 1.0).
//!    Version 1's caught-up runs are ticked beside version 2's, as deployed: against the archive.
//!
//! moto reports no capacity for `TransactWriteItems`: the units are counted from the requests
//! (two write units per transactional write of an item under 1 KB; the largest item the view
//! holds is measured, and must be). The emulator's transaction cost is its own (the local
//! moto_server copies the items a transaction names, not their tables: crates/emulator/moto_server.py).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use event_store::archive::object::Bucket;
use event_store::archiver::Archiver;
use event_store::config::{ArchiveConfig, SubscriptionConfig};
use event_store::subscription::{RunStatus, RunSummary, Subscriptions};
use event_store::time::{format_ms, now_ms};
use event_store_emulator::lambda_target::LambdaTarget;
use event_store_emulator::resources::{create_bucket, create_streams, create_tables, Names};
use event_store_emulator::runs::{self, deadline_in, run_subscriptions};
use event_store_emulator::{moto_server, Emulator};
use event_store_fault_proxy::FaultProxy;
use serde_json::{json, Value};

use crate::archive::pump_and_scan;
use crate::measure::{per_second, STREAM_SHARDS};
use crate::tracking::payload;

const EVENTS: usize = 20_000;
const PAGES: usize = 500;
const VISITORS: usize = 500;
const TYPES: [&str; 10] =
    ["pageview", "click", "scroll", "signup", "login", "search", "add_to_cart", "checkout", "share", "download"];
const PARTITIONS: u32 = 4;
const SIZE: usize = 1024;
const CONSUMER: &str = "bench-consumer";
/// Runs of each measurement: the best is kept, as for the other stages.
const ROUNDS: usize = 2;
/// Ticks one measurement may take before the section gives up.
const TICKS: usize = 20;

/// The section: its JSON for results.json, and its markdown.
pub(crate) async fn run(root: &Path, sdk: &aws_config::SdkConfig) -> Result<(Value, String)> {
    let emulator = Emulator::start_on_free_port(&moto_server(root))?;
    let alone = FaultProxy::start_transactions_alone(&emulator.endpoint).await?;
    let sdk = sdk.to_builder().endpoint_url(&emulator.endpoint).build();
    let requests = ViewRequests::default();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .endpoint_url(&alone.endpoint)
            .interceptor(requests.clone())
            .build(),
    );
    let kinesis = aws_sdk_kinesis::Client::new(&sdk);
    let names = Names::for_stack("bench-projection");
    create_tables(&dynamo, &names).await?;
    create_streams(&kinesis, &names, STREAM_SHARDS).await?;
    let bucket = Bucket::new(&sdk, names.archive_bucket.clone());
    create_bucket(&bucket.s3, &bucket.name).await?;
    let t0 = (now_ms() - 7 * 86_400_000) / 60_000 * 60_000;
    pump_and_scan(&dynamo, &kinesis, &names, (t0, EVENTS), &hit).await?;

    let target = LambdaTarget::start(&[CONSUMER]).await?;
    let lambda = aws_sdk_lambda::Client::from_conf(
        aws_sdk_lambda::config::Builder::from(&sdk).endpoint_url(&target.endpoint).build(),
    );
    let config = SubscriptionConfig {
        archive_bucket: Some(bucket.name.clone()),
        deadline_margin: Duration::from_secs(30),
        ..runs::subscription_config(&names)
    };
    let stack = Stack { dynamo: dynamo.clone(), kinesis, lambda, config, bucket: bucket.clone() };
    let start = format_ms(t0 - 60_000);

    println!(
        "   a subscription delivering {EVENTS} events to a Lambda target ({PARTITIONS} partitions), {ROUNDS} times"
    );
    let mut subscription = 0.0f64;
    for round in 0..ROUNDS {
        let name = format!("baseline-{round}");
        let create = json!({"action": "create", "name": name, "start": start, "target": {"lambda": CONSUMER},
            "partitions": PARTITIONS, "batch_size": 500});
        stack.manage(create).await?;
        subscription = subscription.max(stack.until_caught_up(&name).await?);
        stack.manage(json!({"action": "delete", "name": name})).await?;
    }

    println!("   count projections by page and by type over the same events, {ROUNDS} times each");
    let mut counts = Vec::new();
    for (by, values) in [("page", PAGES), ("type", TYPES.len())] {
        let (mut events_per_second, mut transact_writes, mut transactions, mut largest) = (0.0f64, 0, 0, 0);
        for round in 0..ROUNDS {
            let name = format!("{by}-{round}");
            requests.reset();
            let create = json!({"action": "create_projection", "name": name, "kind": "count", "by": by,
                "partitions": PARTITIONS, "start": start});
            stack.manage(create).await?;
            events_per_second = events_per_second.max(stack.until_caught_up(&format!("view.{name}.v1")).await?);
            (transact_writes, transactions) = requests.counts();
            let counted = stack.counted(&name).await?;
            ensure!(
                counted == (values, EVENTS as i64),
                "{by}: counted {counted:?} (values, events), not ({values}, {EVENTS})"
            );
            largest = largest_item(&dynamo, &names.view_table).await?;
            ensure!(largest < 1024, "a view item of {largest} bytes: more than one write unit a write");
            stack.manage(json!({"action": "delete_projection", "name": name})).await?;
        }
        let per_event = |n: u64| n as f64 / EVENTS as f64;
        counts.push(json!({
            "by": by, "values": values, "events_per_second": events_per_second,
            "ratio_to_subscription": events_per_second / subscription,
            "transactions_per_event": per_event(transactions),
            "transactional_writes_per_event": per_event(transact_writes),
            "write_units_per_event": 2.0 * per_event(transact_writes),
            "largest_view_item_bytes": largest,
        }));
    }

    println!("   a projection whose function writes nothing, from the hot table, then rebuilt from the archive");
    let create = json!({"action": "create_projection", "name": "noop", "kind": "function", "function": CONSUMER,
        "partitions": PARTITIONS, "start": start});
    stack.manage(create).await?;
    let hot = stack.until_caught_up("view.noop.v1").await?;
    let mut archive = ArchiveConfig::for_names(names.event_table.clone(), bucket.name.clone())?;
    archive.hot_retention = Duration::from_millis(1);
    let archiver = Archiver { dynamo: dynamo.clone(), bucket, config: archive };
    let archived = archiver.run(now_ms(), Instant::now() + Duration::from_secs(900)).await?;
    let all_cold = archived.events == EVENTS as u64 && archived.kept == 0 && archived.quarantined == 0;
    ensure!(all_cold && !archived.more, "archived {archived:?}: not every event, or some kept hot");
    stack.manage(json!({"action": "rebuild_projection", "name": "noop"})).await?;
    let cold = stack.until_caught_up("view.noop.v2").await?;

    let figures = json!({
        "events": EVENTS, "visitors": VISITORS, "partitions": PARTITIONS, "payload_bytes": SIZE,
        "subscription_events_per_second": subscription,
        // The headline: by page, the counters of the 500 keys.
        "ratio_to_subscription": counts[0]["ratio_to_subscription"],
        "write_units_per_event": counts[0]["write_units_per_event"],
        "count": counts,
        "rebuild_hot_events_per_second": hot,
        "rebuild_archive_events_per_second": cold,
        "rebuild_read_ratio_archive_to_hot": cold / hot,
    });
    let md = markdown(&figures);
    print!("{md}");
    Ok((figures, md))
}

/// Hit `i`: the bench's tracking event on page `/page-<i mod PAGES>`, of a type, by visitor `i mod VISITORS`.
fn hit(i: usize) -> (String, Vec<u8>) {
    let mut event: Value = serde_json::from_slice(&payload(i, SIZE)).unwrap_or_default();
    let visitor = format!("visitor-{}", i % VISITORS);
    event["query"]["page"] = json!([format!("/page-{}", i % PAGES)]);
    event["query"]["EntityId"] = json!([visitor]);
    event["body"] = json!({"type": TYPES[i / 7 % TYPES.len()]});
    (visitor, serde_json::to_vec(&event).unwrap_or_default())
}

/// The subscriptions function of the bench's stack, as the tests run it in-process.
struct Stack {
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    lambda: aws_sdk_lambda::Client,
    config: SubscriptionConfig,
    bucket: Bucket,
}

impl Stack {
    fn subscriptions(&self, invoker: Arc<dyn event_store::invoke::Invoker>) -> Subscriptions {
        let (dynamo, kinesis, lambda) = (self.dynamo.clone(), self.kinesis.clone(), self.lambda.clone());
        Subscriptions::new(dynamo, kinesis, lambda, self.config.clone(), invoker)
            .with_archive(Some(self.bucket.clone()))
    }

    /// One action, answered.
    async fn manage(&self, action: Value) -> Result<Value> {
        let what = action["action"].clone();
        let answers = run_subscriptions(|invoker| self.subscriptions(invoker), action, deadline_in(far())).await;
        answers.into_iter().next().context("no answer")?.with_context(|| format!("{what}"))
    }

    /// Ticks until every partition of `subscription` has caught up with the log, having delivered
    /// every event: events/s from the first tick to the last run's end.
    async fn until_caught_up(&self, subscription: &str) -> Result<f64> {
        let started = Instant::now();
        let (mut delivered, mut caught_up) = (0, vec![false; PARTITIONS as usize]);
        for _ in 0..TICKS {
            let tick = json!({"source": "aws.events"});
            for answer in run_subscriptions(|invoker| self.subscriptions(invoker), tick, deadline_in(far())).await {
                let Ok(run) = serde_json::from_value::<RunSummary>(answer?) else { continue };
                if run.subscription == subscription {
                    delivered += run.delivered;
                    ensure!(run.parked == 0 && run.error.is_none(), "{run:?}");
                    caught_up[run.partition as usize] = run.status == RunStatus::CaughtUp;
                }
            }
            if caught_up.iter().all(|c| *c) && delivered >= EVENTS {
                ensure!(delivered == EVENTS, "{subscription}: delivered {delivered} of {EVENTS}");
                return Ok(per_second(EVENTS, started.elapsed()));
            }
        }
        anyhow::bail!("{subscription}: {delivered} of {EVENTS} delivered after {TICKS} ticks")
    }

    /// (pages, events) a count view by page holds in its `day/` keys.
    async fn counted(&self, projection: &str) -> Result<(usize, i64)> {
        let (mut pages, mut events, mut after) = (0, 0, None::<String>);
        loop {
            let query = json!({"action": "view", "name": projection, "prefix": "day/", "limit": 1000, "after": after});
            let answer = self.manage(query).await?;
            for item in answer["items"].as_array().into_iter().flatten() {
                pages += 1;
                events += item["count"].as_i64().unwrap_or(0);
            }
            match answer["next"].as_str() {
                Some(next) => after = Some(next.to_owned()),
                None => return Ok((pages, events)),
            }
        }
    }
}

fn far() -> Duration {
    Duration::from_secs(900)
}

/// The largest item of `table`, in bytes as DynamoDB sizes it.
async fn largest_item(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<usize> {
    let mut pages = dynamo.scan().table_name(table).into_paginator().items().send();
    let mut largest = 0;
    while let Some(item) = pages.next().await {
        largest = largest.max(event_store::event_item::item_size(&item?));
    }
    Ok(largest)
}

/// Counts what the view's writes cost: items written in `TransactWriteItems` requests, and
/// the requests (every one sent, retries included).
#[derive(Debug, Clone, Default)]
struct ViewRequests(Arc<Mutex<(u64, u64)>>);

impl ViewRequests {
    fn counts(&self) -> (u64, u64) {
        self.0.lock().map(|c| *c).unwrap_or_default()
    }

    fn reset(&self) {
        if let Ok(mut counts) = self.0.lock() {
            *counts = (0, 0);
        }
    }
}

impl Intercept for ViewRequests {
    fn name(&self) -> &'static str {
        "ViewRequests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let operation = request.headers().get("x-amz-target").unwrap_or_default();
        let body = || request.body().bytes().and_then(|b| serde_json::from_slice::<Value>(b).ok()).unwrap_or_default();
        if !operation.ends_with(".TransactWriteItems") {
            return Ok(());
        }
        let writes = body()["TransactItems"].as_array().map_or(0, Vec::len);
        if let Ok(mut counts) = self.0.lock() {
            counts.0 += writes as u64;
            counts.1 += 1;
        }
        Ok(())
    }
}

/// bench/projection.md.
fn markdown(f: &Value) -> String {
    let number = |v: &Value| v.as_f64().unwrap_or(0.0);
    let met = |v: &Value, at_least: f64| if number(v) >= at_least { "met" } else { "NOT met" };
    let mut md = format!(
        "\n{events} tracking events of about {bytes} B from {visitors} visitors (the log's keys), {partitions} partitions, \
         each run through the subscriptions function's tick on moto (transactions serialized, as DynamoDB isolates them).\n\n\
         | | events/s | ratio to the subscription | transactions per event | transactional writes per event | write units per event |\n\
         |---|---:|---:|---:|---:|---:|\n\
         | a subscription delivering them to a Lambda that takes each batch | {sub:.0} | 1 | | | |\n",
        events = f["events"],
        bytes = f["payload_bytes"],
        visitors = f["visitors"],
        partitions = f["partitions"],
        sub = number(&f["subscription_events_per_second"]),
    );
    for count in f["count"].as_array().into_iter().flatten() {
        md.push_str(&format!(
            "| a `count` projection by {by} ({values} values: a minute, an hour and a day each) | {eps:.0} | {ratio:.2} | {tx:.4} | {writes:.3} | {units:.3} |\n",
            by = count["by"].as_str().unwrap_or_default(),
            values = count["values"],
            eps = number(&count["events_per_second"]),
            ratio = number(&count["ratio_to_subscription"]),
            tx = number(&count["transactions_per_event"]),
            writes = number(&count["transactional_writes_per_event"]),
            units = number(&count["write_units_per_event"]),
        ));
    }
    md.push_str(&format!(
        "\n`ratio_to_subscription` (by page, target >= 0.7): {ratio:.2}, {ratio_met}. \
         Write units: two per transactional write of an item under 1 KB (the largest view item: {largest} B).\n\n\
         | the rebuild's read side (a function that writes nothing) | events/s |\n|---|---:|\n\
         | version 1 from the hot table | {hot:.0} |\n\
         | version 2 rebuilt from the archive (hot copies gone) | {cold:.0} |\n\
         | `rebuild_read_ratio_archive_to_hot` (target >= 1.0: {rebuild_met}) | {rebuild:.2} |\n",
        ratio = number(&f["ratio_to_subscription"]),
        ratio_met = met(&f["ratio_to_subscription"], 0.7),
        largest = f["count"][0]["largest_view_item_bytes"],
        hot = number(&f["rebuild_hot_events_per_second"]),
        cold = number(&f["rebuild_archive_events_per_second"]),
        rebuild = number(&f["rebuild_read_ratio_archive_to_hot"]),
        rebuild_met = met(&f["rebuild_read_ratio_archive_to_hot"], 1.0),
    ));
    md
}
