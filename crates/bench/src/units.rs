//! Capacity units, stored bytes and packing speed per event (results.json's `capacity`): what stages cost.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;

use crate::tracking::payload;

/// Capacity units per event through pump, scan and playback, as dynalite reports them.
#[derive(Debug, Serialize, Default)]
pub(crate) struct Capacity {
    pub(crate) events: usize,
    /// By operation, e.g. `DynamoDB.BatchWriteItem` (pump and scan writes).
    pub(crate) units_per_event: BTreeMap<String, f64>,
    pub(crate) write_units_per_event: f64,
    pub(crate) read_units_per_event: f64,
    /// The same events' write units computed from item sizes, data stored as sent (no compression).
    pub(crate) uncompressed_write_units_per_event: f64,
    pub(crate) usd_per_million_events: f64,
    /// Event-table bytes per event (items as DynamoDB sizes them, bookkeeping left out).
    pub(crate) stored_bytes_per_event: f64,
    /// The events' JSON as sent, bytes per event.
    pub(crate) raw_bytes_per_event: f64,
    /// The pump's packing (postcard + zstd) on one core of this machine, MB of raw events a second.
    pub(crate) pack_mb_per_second: f64,
}

/// Bytes of the event table's event items (slots from 0; bookkeeping and quarantine are negative).
pub(crate) async fn stored_bytes(client: &aws_sdk_dynamodb::Client, table: &str) -> Result<usize> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let mut pages = client
        .scan()
        .table_name(table)
        .filter_expression("#slot >= :zero")
        .expression_attribute_names("#slot", "slot")
        .expression_attribute_values(":zero", AttributeValue::N("0".into()))
        .into_paginator()
        .send();
    let mut bytes = 0;
    while let Some(page) = pages.next().await {
        bytes += page?.items().iter().map(event_store::event_item::item_size).sum::<usize>();
    }
    Ok(bytes)
}

/// The pump's packing of its batches' events, timed on one core.
pub(crate) fn pack_mb_per_second(batches: &[Vec<event_store::chunk::ChunkEvent>]) -> Result<f64> {
    let started = Instant::now();
    for events in batches {
        event_store::chunk::pack(events)?;
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    let raw: usize = batches.iter().flatten().map(|e| e.data.len()).sum();
    Ok(raw as f64 / 1e6 / elapsed)
}

/// Write units per event (buffer put + buffer delete + event put) computed
/// from item sizes as DynamoDB bills them (per started KB) had the data been
/// stored as sent: the "before" of compression.
pub(crate) fn uncompressed_write_units(events: usize, size: usize, t0: i64) -> Result<f64> {
    use event_store::buffer_item::{buffer_key, BufferItem};
    use event_store::event_item::item_size;
    let kb = |bytes: usize| bytes.div_ceil(1024) as f64;
    let mut total = 0.0;
    for i in 0..events {
        let event_id = format!("shardId-000000000000:4959{:052}", i + 1);
        let arrival = t0 + i as i64;
        let buffered = BufferItem {
            id: buffer_key("arn:aws:kinesis:us-east-1:123456789012:stream/bench", &event_id),
            event_id,
            arrival,
            partition_key: format!("user-{}", i % 50),
            data: payload(i, size),
            encoding: None,
            buffered_at: Some(arrival),
            count: None,
        };
        let event = buffered.to_event_item(1000)?.moved(arrival);
        total += 2.0 * kb(item_size(&buffered.to_item())) + kb(item_size(&event.to_item()));
    }
    Ok(total / events as f64)
}
