//! The emulator's raw capacity for exactly the work each stage does: the same
//! items and records, built beforehand, sent in tight loops with
//! `CONCURRENCY` requests in flight and nothing else in between. A stage's
//! ratio to this is how much of the emulator it uses; below 1, the rest is
//! our code (CPU, or requests waiting on each other).

use std::collections::HashMap;
use std::time::Instant;

use anyhow::{Context, Result};
use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use event_store::batch::{DYNAMO_BATCH_ITEMS, KINESIS_BATCH_RECORDS};
use event_store::bookkeeping::slot_index::index_item;
use event_store::buffer_item::{self, BufferItem};
use event_store::chunk::decode_item;
use event_store::dynamo::send_batch_write;
use event_store::event_item;
use event_store::kinesis::{send_put_records, OutgoingRecord, RecordResult};
use event_store::log::PlayedEvent;
use event_store::scan::plan::{event_chunks, Moving};
use futures::StreamExt;

use crate::measure::CONCURRENCY;

type Item = HashMap<String, AttributeValue>;

/// `BatchWriteItem` of `requests` to `table`, full requests, `CONCURRENCY` in flight, no retries.
async fn batch_write(dynamo: &aws_sdk_dynamodb::Client, table: &str, requests: Vec<WriteRequest>) -> Result<()> {
    let chunks: Vec<Vec<WriteRequest>> = requests.chunks(DYNAMO_BATCH_ITEMS).map(<[WriteRequest]>::to_vec).collect();
    let results: Vec<_> = futures::stream::iter(chunks)
        .map(|chunk| send_batch_write(dynamo, table, chunk))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for result in results {
        anyhow::ensure!(result.context("raw BatchWriteItem")?.is_empty(), "unprocessed items in a raw loop");
    }
    Ok(())
}

pub async fn put_items(dynamo: &aws_sdk_dynamodb::Client, table: &str, items: Vec<Item>) -> Result<()> {
    let requests = items
        .into_iter()
        .filter_map(|item| {
            let put = PutRequest::builder().set_item(Some(item)).build().ok()?;
            Some(WriteRequest::builder().put_request(put).build())
        })
        .collect();
    batch_write(dynamo, table, requests).await
}

/// Every item of `table`, `segments` parallel scans of consistent pages.
async fn scan_all(dynamo: &aws_sdk_dynamodb::Client, table: &str, segments: i32) -> Result<Vec<Item>> {
    let runs = (0..segments).map(|segment| async move {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let page = dynamo
                .scan()
                .table_name(table)
                .segment(segment)
                .total_segments(segments)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .context("raw Scan")?;
            items.extend(page.items().iter().cloned());
            start = page.last_evaluated_key().cloned();
            if start.is_none() {
                return anyhow::Ok(items);
            }
        }
    });
    Ok(futures::future::try_join_all(runs).await?.into_iter().flatten().collect())
}

/// The scan's work, raw: read the buffer, put the events and their slots'
/// index entries, delete the buffer items. Returns events/s.
pub async fn scan(dynamo: &aws_sdk_dynamodb::Client, buffer: &str, events: &str, now: i64) -> Result<f64> {
    let started = Instant::now();
    let items = scan_all(dynamo, buffer, 4).await?;
    let mut puts = Vec::new();
    let mut slots = std::collections::BTreeSet::new();
    let mut deletes = Vec::new();
    let moving = Moving { time_unit_ms: 1000, retention_days: None, now_ms: now, slot_subkeys: 1, slices: 1 };
    let mut moved = 0;
    for attributes in &items {
        let buffered = BufferItem::from_item(attributes.clone())?;
        let (chunks, places) = event_chunks(&buffered, moving)?;
        moved += places.len();
        for chunk in chunks {
            slots.insert(chunk.storage_slot);
            puts.push(chunk.to_item());
        }
        let delete = DeleteRequest::builder().set_key(Some(BufferItem::key_of(&buffered.id))).build()?;
        deletes.push(WriteRequest::builder().delete_request(delete).build());
    }
    puts.extend(slots.into_iter().map(|slot| index_item(slot, 1)));
    put_items(dynamo, events, puts).await?;
    batch_write(dynamo, buffer, deletes).await?;
    anyhow::ensure!(!items.is_empty() && items.iter().all(|i| i.contains_key(buffer_item::HASH_KEY)));
    Ok(moved as f64 / started.elapsed().as_secs_f64().max(1e-9))
}

/// Every event of `slot`, its pages one after the other.
async fn query_slot(dynamo: &aws_sdk_dynamodb::Client, table: &str, slot: i64) -> Result<Vec<Item>> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let page = dynamo
            .query()
            .table_name(table)
            .consistent_read(true)
            .key_condition_expression("#slot = :slot")
            .expression_attribute_names("#slot", event_item::HASH_KEY)
            .expression_attribute_values(":slot", AttributeValue::N(slot.to_string()))
            .set_exclusive_start_key(start)
            .send()
            .await
            .context("raw Query")?;
        items.extend(page.items().iter().cloned());
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            return Ok(items);
        }
    }
}

/// Playback's work, raw: query every slot (`CONCURRENCY` slots at once),
/// make the played records, put them. Returns events/s.
pub async fn playback(
    dynamo: &aws_sdk_dynamodb::Client,
    kinesis: &aws_sdk_kinesis::Client,
    table: &str,
    stream: &str,
    slots: Vec<i64>,
) -> Result<f64> {
    let started = Instant::now();
    let pages: Vec<Result<Vec<Item>>> =
        futures::stream::iter(slots).map(|slot| query_slot(dynamo, table, slot)).buffered(CONCURRENCY).collect().await;
    let mut records = Vec::new();
    let decoded =
        pages.into_iter().collect::<Result<Vec<_>>>()?.into_iter().flatten().map(|item| decode_item(0, &item));
    for event in decoded.map(|d| d.events).collect::<event_store::Result<Vec<_>>>()?.into_iter().flatten() {
        let bytes = event.bytes()?;
        let json = serde_json::from_slice(&bytes).ok();
        let data = serde_json::to_vec(&PlayedEvent::new(&event, json, &bytes, records.len() as u64))?;
        records.push(OutgoingRecord { partition_key: event.partition_key, data });
    }
    let count = records.len();
    let results: Vec<_> = futures::stream::iter(records.chunks(KINESIS_BATCH_RECORDS))
        .map(|batch| send_put_records(kinesis, stream, batch))
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    for result in results {
        anyhow::ensure!(
            result.context("raw PutRecords")?.iter().all(RecordResult::is_stored),
            "failed records in a raw loop"
        );
    }
    Ok(count as f64 / started.elapsed().as_secs_f64().max(1e-9))
}
