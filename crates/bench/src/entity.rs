//! Entity streams (issue 15): requests per append and per load, appends/s
//! across 100 streams against the raw `TransactWriteItems` loop of the same
//! shape in the same run, and one hot stream under 8 concurrent writers.
//! On moto (dynalite has no transactions); moto copies a table for every
//! transaction (with its stream records), so the raw loop and the store write
//! to two tables of equal size and the same stream, in alternating rounds.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, Put, ScalarAttributeType,
    StreamSpecification, StreamViewType, TransactWriteItem, Update,
};
use event_store::entity::{Condition, EntityError, EntityStore, Expected, NewEvent, StreamAppend};
use event_store_emulator::request_counter::RequestCounter;

use crate::cleanup::KEEP;
use event_store_emulator::resources::{create_tables, Names};
use futures::StreamExt;
use serde::Serialize;
use serde_json::json;

const STREAMS: usize = 100;
/// Appends per stream. moto copies every table (with its stream records) for each transaction and its
/// memory grows with the square of the appends: 10 rounds reached 17 GB in ten minutes on 2026-11-27.
const ROUNDS: usize = 3;
const CONCURRENCY: usize = 8;
const HOT_WRITERS: usize = 8;
const HOT_APPENDS_EACH: usize = 10;
/// The data of each appended event: about 1 KB.
const EVENT_BYTES: usize = 1000;

#[derive(Debug, Serialize)]
pub struct EntityFigures {
    pub streams: usize,
    pub appends: usize,
    pub dynamodb_requests_per_append: f64,
    pub dynamodb_requests_per_fresh_load: f64,
    pub appends_per_second: f64,
    pub raw_transactions_per_second: f64,
    pub ratio_to_raw: f64,
    pub hot_writers: usize,
    pub hot_appends: usize,
    pub hot_conflicts: usize,
    pub hot_appends_per_second: f64,
    /// Appends across two streams with a condition on a third, each with client ids.
    pub appends_across: usize,
    pub dynamodb_requests_per_append_across: f64,
    /// Stream metadata's cleanup (`max_count`), through the relay.
    pub cleanup: crate::cleanup::CleanupFigures,
}

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

async fn create_raw_table(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<()> {
    // The same stream as the entity table: moto keeps a table's stream records
    // in the table and copies them for every transaction, so a raw table
    // without one would be measured against a cheaper emulator, not a cheaper loop.
    let stream =
        StreamSpecification::builder().stream_enabled(true).stream_view_type(StreamViewType::NewImage).build()?;
    let mut request =
        dynamo.create_table().table_name(table).billing_mode(BillingMode::PayPerRequest).stream_specification(stream);
    for (name, kind) in [("stream", KeyType::Hash), ("item", KeyType::Range)] {
        request = request
            .key_schema(KeySchemaElement::builder().attribute_name(name).key_type(kind).build()?)
            .attribute_definitions(
                AttributeDefinition::builder().attribute_name(name).attribute_type(ScalarAttributeType::S).build()?,
            );
    }
    request.send().await.context("creating the raw table")?;
    Ok(())
}

/// The raw loop's append: the same two writes, built by hand, nothing checked or parsed.
async fn raw_append(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    stream: &str,
    version: u64,
    data: &str,
) -> Result<()> {
    let mut tip = Update::builder()
        .table_name(table)
        .key("stream", s(stream))
        .key("item", s("tip"))
        .update_expression("SET #version = :v")
        .expression_attribute_names("#version", "version")
        .expression_attribute_values(":v", n(version));
    tip = if version == 0 {
        tip.condition_expression("attribute_not_exists(#version)")
    } else {
        tip.condition_expression("#version = :prev").expression_attribute_values(":prev", n(version - 1))
    };
    let item = HashMap::from([
        ("stream".to_owned(), s(stream)),
        ("item".to_owned(), s(format!("e{version:012}"))),
        ("events".to_owned(), s(data)),
    ]);
    let put = Put::builder()
        .table_name(table)
        .set_item(Some(item))
        .condition_expression("attribute_not_exists(#item)")
        .expression_attribute_names("#item", "item");
    dynamo
        .transact_write_items()
        .transact_items(TransactWriteItem::builder().update(tip.build()?).build())
        .transact_items(TransactWriteItem::builder().put(put.build()?).build())
        .send()
        .await
        .context("raw TransactWriteItems")?;
    Ok(())
}

pub async fn run(sdk: &aws_config::SdkConfig, endpoint: &str) -> Result<EntityFigures> {
    // moto applies concurrent transactions without a lock (a failed or raced
    // one restores a copy of the table over the other's writes): every
    // request of this stage, raw loop and store alike, goes to it one at a time.
    let serial = event_store_fault_proxy::FaultProxy::start_one_at_a_time(endpoint).await?;
    let counter = RequestCounter::default();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk)
            .endpoint_url(&serial.endpoint)
            .interceptor(counter.clone())
            .build(),
    );
    let names = Names::for_stack("bench-entity");
    create_tables(&dynamo, &names).await?;
    let raw_table = "bench-entity-raw";
    create_raw_table(&dynamo, raw_table).await?;
    let store = EntityStore::new(dynamo.clone(), names.entity_table.clone());
    let data = json!({"pad": "x".repeat(EVENT_BYTES)});

    let (raw_time, store_time, requests) = appends_across_streams(&dynamo, raw_table, &store, &counter, &data).await?;
    let appends = STREAMS * ROUNDS;
    let load_requests = fresh_load(&store, &counter, &data).await?;
    let (hot_time, hot_conflicts) = hot_stream(&dynamo, &names, &data).await?;
    let hot_appends = HOT_WRITERS * HOT_APPENDS_EACH;
    let (appends_across, across_requests) = appends_across(&store, &counter, &data).await?;
    let serial_sdk = sdk.to_builder().endpoint_url(&serial.endpoint).build();
    let cleanup = crate::cleanup::run(&serial_sdk, &dynamo, &counter, &names).await?;

    let rate = |count: usize, time: Duration| count as f64 / time.as_secs_f64().max(1e-9);
    let appends_per_second = rate(appends, store_time);
    let raw_transactions_per_second = rate(appends, raw_time);
    Ok(EntityFigures {
        streams: STREAMS,
        appends,
        dynamodb_requests_per_append: requests as f64 / appends as f64,
        dynamodb_requests_per_fresh_load: load_requests as f64,
        appends_per_second,
        raw_transactions_per_second,
        ratio_to_raw: appends_per_second / raw_transactions_per_second,
        hot_writers: HOT_WRITERS,
        hot_appends,
        hot_conflicts,
        hot_appends_per_second: rate(hot_appends, hot_time),
        appends_across,
        dynamodb_requests_per_append_across: across_requests as f64 / appends_across as f64,
        cleanup,
    })
}

/// `ROUNDS` appends to each of `STREAMS` streams, the raw loop's and the
/// store's in alternating rounds: the time each took, and the store's
/// DynamoDB requests.
async fn appends_across_streams(
    dynamo: &aws_sdk_dynamodb::Client,
    raw_table: &str,
    store: &EntityStore,
    counter: &RequestCounter,
    data: &serde_json::Value,
) -> Result<(Duration, Duration, u64)> {
    let raw_data = serde_json::to_string(&vec![json!({"id": uuid(), "type": "Moved", "data": data.to_string()})])?;
    let (mut raw_time, mut store_time, mut requests) = (Duration::ZERO, Duration::ZERO, 0);
    for round in 0..ROUNDS as u64 {
        let started = Instant::now();
        let results: Vec<Result<()>> = futures::stream::iter(0..STREAMS)
            .map(|k| {
                let raw_data = &raw_data;
                async move { raw_append(dynamo, raw_table, &format!("s-{k}"), round, raw_data).await }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        raw_time += started.elapsed();
        results.into_iter().collect::<Result<Vec<_>>>()?;

        counter.reset();
        let started = Instant::now();
        let results: Vec<Result<(), EntityError>> = futures::stream::iter(0..STREAMS)
            .map(|k| async move {
                let expected = if round == 0 { Expected::NoStream } else { Expected::Version(round - 1) };
                store.append(&format!("s-{k}"), expected, vec![NewEvent::new("Moved", data.clone())]).await.map(|_| ())
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        store_time += started.elapsed();
        requests += counter.service_total("DynamoDB");
        results.into_iter().collect::<Result<Vec<_>, _>>()?;
    }
    Ok((raw_time, store_time, requests))
}

/// A fresh snapshot, then three appends: the DynamoDB requests of loading
/// the entity (one).
async fn fresh_load(store: &EntityStore, counter: &RequestCounter, data: &serde_json::Value) -> Result<u64> {
    // A fresh snapshot: the load is one request.
    store.save_snapshot("s-0", ROUNDS as u64 - 1, &json!({"moved": ROUNDS})).await?;
    for v in ROUNDS as u64..ROUNDS as u64 + 3 {
        store.append("s-0", Expected::Version(v - 1), vec![NewEvent::new("Moved", data.clone())]).await?;
    }
    counter.reset();
    let state = store.state("s-0").await?;
    let load_requests = counter.service_total("DynamoDB");
    anyhow::ensure!(state.events.len() == 3 && state.snapshot.is_some(), "the state after the snapshot");
    Ok(load_requests)
}

/// One hot stream, 8 writers with If-Match, no update lost: the time they
/// took and the conflicts (409) they met.
async fn hot_stream(
    dynamo: &aws_sdk_dynamodb::Client,
    names: &Names,
    data: &serde_json::Value,
) -> Result<(Duration, usize)> {
    let hot = Arc::new(EntityStore::new(dynamo.clone(), names.entity_table.clone()));
    hot.append("hot", Expected::NoStream, vec![NewEvent::new("Opened", json!({}))]).await?;
    let started = Instant::now();
    let writers = (0..HOT_WRITERS).map(|w| {
        let (hot, data) = (hot.clone(), data.clone());
        tokio::spawn(async move {
            let mut conflicts = 0;
            for _ in 0..HOT_APPENDS_EACH {
                loop {
                    let version = hot.tip("hot").await?.map(|t| t.version).context("the hot stream")?;
                    let event = NewEvent::new("Added", json!({"writer": w, "data": data}));
                    match hot.append("hot", Expected::Version(version), vec![event]).await {
                        Ok(_) => break,
                        Err(EntityError::Conflict { .. }) => conflicts += 1,
                        Err(other) => return Err(anyhow::Error::new(other)),
                    }
                }
            }
            Ok::<usize, anyhow::Error>(conflicts)
        })
    });
    let mut hot_conflicts = 0;
    for writer in writers.collect::<Vec<_>>() {
        hot_conflicts += writer.await??;
    }
    let hot_time = started.elapsed();
    let hot_appends = HOT_WRITERS * HOT_APPENDS_EACH;
    let final_version = hot.tip("hot").await?.map(|t| t.version).unwrap_or_default();
    anyhow::ensure!(final_version == hot_appends as u64, "no lost update on the hot stream: at {final_version}");
    Ok((hot_time, hot_conflicts))
}

/// Appends across two streams, each on the version the last answer gave,
/// with a condition on a third stream's version and client ids (so each is
/// recorded for a retry): the DynamoDB requests they took.
async fn appends_across(
    store: &EntityStore,
    counter: &RequestCounter,
    data: &serde_json::Value,
) -> Result<(usize, u64)> {
    const APPENDS: usize = 20;
    store.append("rules", Expected::NoStream, vec![NewEvent::new("Set", json!({}))]).await?;
    let (mut a, mut b) = (Expected::NoStream, Expected::NoStream);
    counter.reset();
    for _ in 0..APPENDS {
        let event = |kind: &str| NewEvent { id: Some(uuid::Uuid::new_v4()), ..NewEvent::new(kind, data.clone()) };
        let appends = vec![
            StreamAppend { stream: "from".into(), expected: a, events: vec![event("Debited")] },
            StreamAppend { stream: "to".into(), expected: b, events: vec![event("Credited")] },
        ];
        let done = store.append_across(appends, vec![("rules".into(), Condition::Version(0))]).await?;
        (a, b) = (Expected::Version(done[0].last), Expected::Version(done[1].last));
    }
    Ok((APPENDS, counter.service_total("DynamoDB")))
}

fn uuid() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// The figures as the markdown section of `bench/results.md` (and `bench/entity.md`).
pub fn markdown(f: &EntityFigures, date: &str, machine: &str) -> String {
    format!(
        "## Entity streams ({date}, {machine}, moto)\n\n\
         | figure | measured | target |\n|---|---|---|\n\
         | DynamoDB requests per append of one event | {:.2} | <= 2 |\n\
         | DynamoDB requests to load an entity with a fresh snapshot | {:.0} | 1 |\n\
         | appends/s across {} streams ({} appends of ~1 KB, {} at a time; moto fed one request at a time) vs the raw `TransactWriteItems` loop of the same shape | {:.0} vs {:.0} = {:.2} | >= 0.8 |\n\
         | one hot stream, {} writers with If-Match ({} appends) | {:.0} appends/s, {} conflicts (409) | reported |\n\
         | DynamoDB requests per append across two streams (one event each, client ids) with a condition on a third | {:.2} | 1 |\n\
         | stream metadata's cleanup through the relay ({} streams, `max_count` {KEEP}: {} events in {} batches removed): write units per event removed, all / one-event appends of ~1 KB / ten-event appends | {:.2} / {:.2} / {:.2} | reported |\n\
         | ... DynamoDB requests per batch removed (the relay's reads of positions, the `Query` pages, `BatchWriteItem`s, the tip's `trimmed`) | {:.2} | reported |\n\
         | ... in steady state (one append at a time to a stream at its `max_count`): the relay's DynamoDB requests per append beyond a stream without metadata | {:.1} | reported |\n",
        f.dynamodb_requests_per_append,
        f.dynamodb_requests_per_fresh_load,
        f.streams,
        f.appends,
        CONCURRENCY,
        f.appends_per_second,
        f.raw_transactions_per_second,
        f.ratio_to_raw,
        f.hot_writers,
        f.hot_appends,
        f.hot_appends_per_second,
        f.hot_conflicts,
        f.dynamodb_requests_per_append_across,
        f.cleanup.streams,
        f.cleanup.events_removed,
        f.cleanup.batches_removed,
        f.cleanup.write_units_per_event_removed,
        f.cleanup.write_units_per_event_removed_single,
        f.cleanup.write_units_per_event_removed_batched,
        f.cleanup.dynamodb_requests_per_batch_removed,
        f.cleanup.steady_extra_dynamodb_requests_per_append,
    )
}
