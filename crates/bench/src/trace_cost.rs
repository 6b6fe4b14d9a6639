//! What the W3C trace context costs where it is stored (results.json's `trace`, bench/trace.md):
//! the bytes an event's `trace` adds once packed as the pump and the scan store it (zstd chunks),
//! and the write units that makes, for a chunk of one event and of a busy slot's hundred.
//! Computed from the store's own packing, not timed.

use anyhow::Result;
use serde_json::{json, Value};

use crate::tracking::payload;

/// Events per run, and the tracker-like envelope size they are made at.
const EVENTS: usize = 2_000;
const ENVELOPE_BYTES: usize = 600;

/// The figures as JSON, and bench/trace.md's body.
pub(crate) fn run() -> Result<(Value, String)> {
    let mut rng = fastrand::Rng::with_seed(7);
    let hex = |rng: &mut fastrand::Rng, len: usize| (0..len).map(|_| rng.digit(16)).collect::<String>();
    let plain: Vec<Vec<u8>> = (0..EVENTS).map(|i| payload(i, ENVELOPE_BYTES)).collect();
    let traced: Vec<Vec<u8>> = plain
        .iter()
        .map(|data| -> Result<Vec<u8>> {
            let mut envelope: Value = serde_json::from_slice(data)?;
            // Each event its own trace and span (the worst case: nothing repeats for zstd to share).
            let traceparent = format!("00-{}-{}-01", hex(&mut rng, 32), hex(&mut rng, 16));
            envelope["trace"] = json!({"traceparent": traceparent});
            Ok(serde_json::to_vec(&envelope)?)
        })
        .collect::<Result<_>>()?;
    let mut figures = serde_json::Map::new();
    let mut md = String::from(
        "\n| events a chunk | packed bytes an event, without | with `traceparent` | added | write units an event added (pump put, scan delete and put) |\n|---|---|---|---|---|\n",
    );
    for per_chunk in [1, 100] {
        let (without, with) = (packed_bytes(&plain, per_chunk)?, packed_bytes(&traced, per_chunk)?);
        let added = with - without;
        // Write units are billed per started KB of an item; spread over a chunk's events (or, for
        // single-event items, as the chance of crossing a KB), an added byte costs 1/1024 of a unit
        // on each of the three writes an event's chunk takes.
        let units = 3.0 * added / 1024.0;
        figures.insert(
            format!("chunk_of_{per_chunk}"),
            json!({"bytes_without": round(without), "bytes_with": round(with), "bytes_added": round(added),
                   "write_units_added": round_units(units)}),
        );
        md.push_str(&format!("| {per_chunk} | {:.0} | {:.0} | {:.0} | {:.3} |\n", without, with, added, units));
    }
    let raw = traced.iter().map(Vec::len).sum::<usize>() as f64 / EVENTS as f64
        - plain.iter().map(Vec::len).sum::<usize>() as f64 / EVENTS as f64;
    figures.insert("raw_bytes_added".into(), json!(round(raw)));
    md.push_str(&format!(
        "\n{EVENTS} tracker-like envelopes of {ENVELOPE_BYTES} bytes, each with its own random trace (nothing for zstd to share); \
         as sent, the `trace` field adds {raw:.0} bytes an event.\n"
    ));
    Ok((Value::Object(figures), md))
}

/// Bytes per event of `events` packed into chunks of `per_chunk`, as the pump and the scan pack them.
fn packed_bytes(events: &[Vec<u8>], per_chunk: usize) -> Result<f64> {
    let mut total = 0;
    for (c, chunk) in events.chunks(per_chunk).enumerate() {
        let chunk: Vec<event_store::chunk::ChunkEvent> = chunk
            .iter()
            .enumerate()
            .map(|(i, data)| event_store::chunk::ChunkEvent {
                event_id: format!(
                    "shardId-000000000000:4965678744183748973618357462398531628937367285{:010}",
                    c * per_chunk + i
                ),
                arrival: 1_795_240_724_000 + (c * per_chunk + i) as i64,
                partition_key: format!("user-{}", i % 50),
                data: data.clone(),
            })
            .collect();
        total += event_store::chunk::pack(&chunk)?.len();
    }
    Ok(total as f64 / events.len() as f64)
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round_units(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}
