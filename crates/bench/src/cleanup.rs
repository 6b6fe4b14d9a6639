//! Stream metadata's cleanup (issue 48): what removing truncated events from
//! the entity table costs, measured through the relay as the table's stream
//! drives it (the deployed path), on streams of one-event and ten-event
//! appends of ~1 KB events. Write units are counted from the removed items'
//! sizes (a delete costs the deleted item's size in started KB), read off the
//! table before the cleanup, not from what the code under test reports.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use aws_sdk_dynamodb::types::AttributeValue;
use event_store::config::PumpConfig;
use event_store::config::RelayConfig;
use event_store::entity::relay::Relay;
use event_store::entity::{EntityStore, Expected, NewEvent, StreamMetadata};
use event_store::event_item::item_size;
use event_store::pump::Pump;
use event_store_emulator::event_source::kinesis_event;
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_streams, read_stream, Names};
use event_store_emulator::table_stream::{deliver_all, TableStreamReader};
use serde::Serialize;
use serde_json::json;

/// Streams of each shape (one-event appends, ten-event appends).
const STREAMS_EACH: usize = 2;
const APPENDS: u64 = 30;
/// What `max_count` keeps.
pub const KEEP: u64 = 10;
const STEADY_APPENDS: u64 = 10;

#[derive(Debug, Serialize)]
pub struct CleanupFigures {
    pub streams: usize,
    pub events_removed: u64,
    pub batches_removed: u64,
    pub write_units_per_event_removed: f64,
    /// For one-event appends of ~1 KB, and for ten-event ones.
    pub write_units_per_event_removed_single: f64,
    pub write_units_per_event_removed_batched: f64,
    pub dynamodb_requests_per_batch_removed: f64,
    /// An append at a time to a stream at its `max_count`: the relay's DynamoDB
    /// requests beyond those of the same append to a stream without metadata.
    pub steady_extra_dynamodb_requests_per_append: f64,
}

/// A stream's batch items now: first version → (events, write units to delete it).
async fn batches(dynamo: &aws_sdk_dynamodb::Client, table: &str, stream: &str) -> Result<HashMap<u64, (u64, u64)>> {
    let mut found = HashMap::new();
    let mut start = None;
    loop {
        let out = dynamo
            .query()
            .table_name(table)
            .key_condition_expression("#s = :s AND begins_with(#i, :e)")
            .expression_attribute_names("#s", "stream")
            .expression_attribute_names("#i", "item")
            .expression_attribute_values(":s", AttributeValue::S(stream.into()))
            .expression_attribute_values(":e", AttributeValue::S("e".into()))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .context("reading the batches")?;
        for item in out.items() {
            let first: u64 = item["first"].as_n().map_err(|_| anyhow::anyhow!("no first"))?.parse()?;
            let events: Vec<serde_json::Value> =
                serde_json::from_str(item["events"].as_s().map_err(|_| anyhow::anyhow!("no events"))?)?;
            found.insert(first, (events.len() as u64, item_size(item).div_ceil(1024) as u64));
        }
        start = out.last_evaluated_key().cloned();
        if start.is_none() {
            return Ok(found);
        }
    }
}

/// The pump, as the event stream's source mapping runs it, over everything on the stream.
async fn pump_all(dynamo: &aws_sdk_dynamodb::Client, kinesis: &aws_sdk_kinesis::Client, names: &Names) -> Result<()> {
    let config = PumpConfig {
        entity_table: Some(names.entity_table.clone()),
        ..PumpConfig::new(names.buffer_table.clone(), names.event_table.clone())
    };
    let pump = Pump::new(dynamo.clone(), kinesis.clone(), config);
    let summary = kinesis.describe_stream_summary().stream_name(&names.event_stream).send().await?;
    let arn = summary.stream_description_summary().map(|s| s.stream_arn().to_owned()).context("no stream ARN")?;
    let mut by_shard: Vec<(String, Vec<aws_sdk_kinesis::types::Record>)> = Vec::new();
    for (shard, record) in read_stream(kinesis, &names.event_stream).await? {
        match by_shard.iter_mut().find(|(s, _)| *s == shard) {
            Some((_, records)) => records.push(record),
            None => by_shard.push((shard, vec![record])),
        }
    }
    for (shard, records) in &by_shard {
        let event = kinesis_event(&arn, shard, "us-east-1", records);
        ensure!(pump.handle(event).await.batch_item_failures.is_empty(), "the pump failed");
    }
    Ok(())
}

pub async fn run(
    sdk: &aws_config::SdkConfig,
    dynamo: &aws_sdk_dynamodb::Client,
    counter: &RequestCounter,
    names: &Names,
) -> Result<CleanupFigures> {
    let kinesis = aws_sdk_kinesis::Client::new(sdk);
    create_streams(&kinesis, names, 1).await?;
    let store = EntityStore::new(dynamo.clone(), names.entity_table.clone());
    let data = json!({"pad": "x".repeat(1000)});
    let shapes: Vec<(String, usize)> =
        (0..STREAMS_EACH).flat_map(|k| [(format!("one-{k}"), 1), (format!("ten-{k}"), 10)]).collect();
    for (stream, per_append) in &shapes {
        let mut expected = Expected::NoStream;
        for _ in 0..APPENDS {
            let events = (0..*per_append).map(|_| NewEvent::new("Posted", data.clone())).collect();
            expected = Expected::Version(store.append(stream, expected, events).await?.last);
        }
    }
    let config = RelayConfig {
        event_stream: names.event_stream.clone(),
        entity_table: names.entity_table.clone(),
        dead_letter_queue: None,
        hold_after: Duration::from_secs(300),
    };
    let relay = Relay::new(kinesis.clone(), dynamo.clone(), aws_sdk_sqs::Client::new(sdk), config);
    // The local stream reader checks each insert against the table (moto's phantom records): its
    // requests are the emulator's, not the relay's, so it reads through a client not counted.
    let uncounted = aws_sdk_dynamodb::Client::new(sdk);
    let streams_client = aws_sdk_dynamodbstreams::Client::new(sdk);
    let mut reader = TableStreamReader::open(&uncounted, streams_client, &names.entity_table, "us-east-1").await?;
    let mut pending = VecDeque::new();
    // Everything relayed and buffered first: the cleanup never removes what the log does not hold yet.
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await?;
    pump_all(&uncounted, &kinesis, names).await?;
    let mut before = HashMap::new();
    for (stream, _) in &shapes {
        before.insert(stream.clone(), batches(dynamo, &names.entity_table, stream).await?);
        let keep = StreamMetadata { max_count: Some(KEEP), ..Default::default() };
        store.set_metadata(stream, Some(0), &keep).await?;
    }
    counter.reset();
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await?;
    let requests = counter.service_total("DynamoDB");

    let (mut single, mut batched) = ((0u64, 0u64), (0u64, 0u64));
    let mut removed_batches = 0;
    for (stream, per_append) in &shapes {
        let after = batches(dynamo, &names.entity_table, stream).await?;
        let kept_events: u64 = after.values().map(|(events, _)| events).sum();
        ensure!((KEEP..KEEP + *per_append as u64).contains(&kept_events), "{stream}: {kept_events} events kept");
        let tally = if *per_append == 1 { &mut single } else { &mut batched };
        for (first, (events, units)) in &before[stream] {
            if !after.contains_key(first) {
                removed_batches += 1;
                tally.0 += events;
                tally.1 += units;
            }
        }
    }
    // Steady state: one more append at a time to a stream at its max_count, relayed and buffered
    // before the next, against the same on a stream without metadata: what the cleanup adds.
    let mut extra = 0i64;
    for (stream, sign) in [("one-0", 1i64), ("plain", -1)] {
        let mut expected = store.tip(stream).await?.map_or(Expected::NoStream, |t| Expected::Version(t.version));
        for _ in 0..STEADY_APPENDS {
            let event = NewEvent::new("Posted", data.clone());
            expected = Expected::Version(store.append(stream, expected, vec![event]).await?.last);
            counter.reset();
            deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await?;
            extra += sign * counter.service_total("DynamoDB") as i64;
            pump_all(&uncounted, &kinesis, names).await?;
        }
    }
    let steady_kept = batches(dynamo, &names.entity_table, "one-0").await?.len() as u64;
    ensure!(steady_kept <= KEEP + 1, "steady state: {steady_kept} batches kept of one-0");

    let events_removed = single.0 + batched.0;
    ensure!(events_removed > 0, "the cleanup removed nothing");
    let per_event = |(events, units): (u64, u64)| units as f64 / events.max(1) as f64;
    Ok(CleanupFigures {
        streams: shapes.len(),
        events_removed,
        batches_removed: removed_batches,
        write_units_per_event_removed: per_event((events_removed, single.1 + batched.1)),
        write_units_per_event_removed_single: per_event(single),
        write_units_per_event_removed_batched: per_event(batched),
        dynamodb_requests_per_batch_removed: requests as f64 / removed_batches.max(1) as f64,
        steady_extra_dynamodb_requests_per_append: extra as f64 / STEADY_APPENDS as f64,
    })
}
