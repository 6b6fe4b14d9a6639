//! Packed storage: one item holds many events of one shard and one slot,
//! compressed together.
//!
//! DynamoDB bills a write per started KB of item, and every event is written
//! three times (buffer put, buffer delete, event put). One item per event
//! pays at least 3 write units, however small the event. A chunk of
//! hundreds of similar events compresses several times better than each
//! event alone (zstd finds the repeated JSON across events), and its write
//! units are shared by all of them.
//!
//! A chunk's bytes are columns (event ids, arrival deltas, partition keys,
//! data), serialized with postcard and compressed with zstd; the `encoding`
//! attribute names the format ([`CHUNK`]), so a new format can come with a
//! new name while old items keep reading.
//!
//! Keys: a chunk in the event table is keyed by `<its first event's sort key>~<its last event's sort key>`.
//! - Its key sorts by its first event, so reading a slot's chunks in key
//!   order and merging them gives the events in order ([`SlotMerge`]).
//! - Chunks that hold the same events cut at other boundaries (a batch
//!   delivered again in other pieces) have other keys: neither overwrites the
//!   other (which could lose the events only one of them holds); readers
//!   drop the second copy of an event, whose sort key is the same.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::event_item::{self, item_size, EventItem, MAX_ITEM_BYTES};

mod merge;

pub use merge::SlotMerge;

/// The `encoding` of a chunk: postcard columns, zstd-compressed (version 1).
pub const CHUNK: &str = "chunk1";
/// zstd level for chunks: chunks are written once and read rarely, and on
/// JSON a higher level gains 10-15 % over level 3 at a CPU cost the pump can afford.
const LEVEL: i32 = 9;
/// Compressed bytes one chunk item may hold: under DynamoDB's 400 KB with room
/// for the item's other attributes, and small enough that a 1 MB query page
/// holds several.
pub const MAX_CHUNK_BYTES: usize = 300_000;
/// Compressed bytes a chunk of ONE event may hold: what an item takes with
/// room (1 KB) for the other attributes of its buffer and event items.
pub const MAX_LONE_EVENT_BYTES: usize = MAX_ITEM_BYTES - 1024;
/// Largest decoded chunk accepted: a stored frame claiming more is refused
/// rather than inflated (the pump never packs more than this).
pub const MAX_CHUNK_RAW_BYTES: usize = 16 * 1024 * 1024;
/// Separates a chunk key's first and last event keys. Above `#` and the
/// digits, so a chunk sorts after a single-event item of its first event.
pub const SEPARATOR: char = '~';

/// One event in a chunk: its identity, arrival, Kinesis partition key and bytes as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkEvent {
    /// Kinesis event id, `shardId-…:<sequence number>`.
    pub event_id: String,
    /// Arrival time (ms), made non-decreasing along its shard by the pump.
    pub arrival: i64,
    pub partition_key: String,
    pub data: Vec<u8>,
}

impl ChunkEvent {
    /// The event's sort key in the event table (arrival, shard, sequence).
    pub(crate) fn sort_key(&self) -> String {
        event_item::sort_key(self.arrival, &self.event_id)
    }

    /// Raw bytes this event adds to a chunk before compression (for size bounds).
    pub(crate) fn raw_len(&self) -> usize {
        self.event_id.len() + self.partition_key.len() + self.data.len() + 16
    }

    /// The event as the readers' event type (`slot` is the slot, not a sub-key).
    pub(crate) fn into_event_item(self, slot: i64) -> EventItem {
        EventItem {
            slot,
            sort_key: self.sort_key(),
            event_id: self.event_id,
            arrival: self.arrival,
            partition_key: self.partition_key,
            data: Some(self.data),
            encoding: None,
            payload: None,
            expires_at: None,
            moved_at: None,
        }
    }
}

/// The serialized columns. Columns rather than rows: ids, arrival deltas
/// and keys of neighbouring events are alike and compress to a few bytes.
#[derive(Serialize, Deserialize)]
struct Columns {
    event_ids: Vec<String>,
    /// The first arrival, then the difference to the one before.
    arrival_deltas: Vec<i64>,
    partition_keys: Vec<String>,
    data: Vec<serde_bytes::ByteBuf>,
}

/// The stored bytes of a chunk of `events` (in the order given).
pub fn pack(events: &[ChunkEvent]) -> Result<Vec<u8>> {
    let mut previous = 0;
    let columns = Columns {
        event_ids: events.iter().map(|e| e.event_id.clone()).collect(),
        arrival_deltas: events
            .iter()
            .map(|e| {
                let delta = e.arrival - previous;
                previous = e.arrival;
                delta
            })
            .collect(),
        partition_keys: events.iter().map(|e| e.partition_key.clone()).collect(),
        data: events.iter().map(|e| serde_bytes::ByteBuf::from(e.data.clone())).collect(),
    };
    let raw = postcard::to_allocvec(&columns).map_err(|e| Error::encode("chunk", e))?;
    zstd::bulk::compress(&raw, LEVEL).map_err(|e| Error::encode("chunk", e))
}

/// The events of a chunk's stored bytes.
pub(crate) fn unpack(stored: &[u8]) -> Result<Vec<ChunkEvent>> {
    let raw = zstd::bulk::decompress(stored, MAX_CHUNK_RAW_BYTES)
        .map_err(|e| Error::Malformed(format!("chunk that does not decode: {e}")))?;
    let columns: Columns =
        postcard::from_bytes(&raw).map_err(|e| Error::Malformed(format!("chunk that does not parse: {e}")))?;
    let n = columns.event_ids.len();
    if columns.arrival_deltas.len() != n || columns.partition_keys.len() != n || columns.data.len() != n {
        return Err(Error::Malformed("chunk whose columns differ in length".into()));
    }
    let mut arrival = 0i64;
    let events = columns
        .event_ids
        .into_iter()
        .zip(columns.arrival_deltas)
        .zip(columns.partition_keys.into_iter().zip(columns.data))
        .map(|((event_id, delta), (partition_key, data))| {
            arrival = arrival.saturating_add(delta);
            ChunkEvent { event_id, arrival, partition_key, data: data.into_vec() }
        })
        .collect();
    Ok(events)
}

/// A group of events packed into one item's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    pub events: Vec<ChunkEvent>,
    pub bytes: Vec<u8>,
}

/// Packs `events` (one shard's, in order) into as few chunks as fit: each
/// at most `max_bytes` compressed and [`MAX_CHUNK_RAW_BYTES`] decoded, the
/// events kept in order across them. An event that does not fit even alone
/// comes back as an error with the event, for its caller to quarantine.
pub(crate) fn pack_to_fit(
    events: Vec<ChunkEvent>,
    max_bytes: usize,
) -> Vec<std::result::Result<Packed, (ChunkEvent, Error)>> {
    let mut out = Vec::new();
    // First by decoded size, then each group by compressed size.
    let mut group = Vec::new();
    let mut raw = 0;
    for event in events {
        if !group.is_empty() && raw + event.raw_len() > MAX_CHUNK_RAW_BYTES {
            pack_group(std::mem::take(&mut group), max_bytes, &mut out);
            raw = 0;
        }
        raw += event.raw_len();
        group.push(event);
    }
    if !group.is_empty() {
        pack_group(group, max_bytes, &mut out);
    }
    out
}

fn pack_group(
    events: Vec<ChunkEvent>,
    max_bytes: usize,
    out: &mut Vec<std::result::Result<Packed, (ChunkEvent, Error)>>,
) {
    let packed = pack(&events);
    let limit = if events.len() == 1 { max_bytes.max(MAX_LONE_EVENT_BYTES) } else { max_bytes };
    match packed {
        Ok(bytes) if bytes.len() <= limit => out.push(Ok(Packed { events, bytes })),
        Ok(bytes) if events.len() > 1 => {
            // Too large: cut into as many pieces as the overshoot asks for (with a margin), each packed again.
            let pieces = (bytes.len() * 10 / (max_bytes * 9) + 1).clamp(2, events.len());
            let per_piece = events.len().div_ceil(pieces);
            let mut rest = events;
            while !rest.is_empty() {
                let tail = rest.split_off(per_piece.min(rest.len()));
                pack_group(rest, max_bytes, out);
                rest = tail;
            }
        }
        Ok(bytes) => {
            let size = bytes.len();
            let event = events.into_iter().next().expect("one event");
            out.push(Err((
                event,
                Error::Malformed(format!("an event of {size} bytes compressed is too large for a DynamoDB item")),
            )))
        }
        Err(err) => {
            for event in events {
                out.push(Err((event, Error::Malformed(err.to_string()))));
            }
        }
    }
}

/// The event-table sort key of a chunk whose events' sort keys run from `first` to `last`.
pub(crate) fn chunk_key(first: &str, last: &str) -> String {
    format!("{first}{SEPARATOR}{last}")
}

/// The key of a chunk pooled from several buffer items (slices): its ends,
/// then a hash of all its events' keys, so that two chunks with the same
/// ends and other events between them (cut from other pages) never
/// overwrite each other. It sorts as its first event, like every chunk key.
pub(crate) fn pooled_chunk_key(first: &str, last: &str, events: &[ChunkEvent]) -> String {
    let mut hash = Sha256::new();
    for event in events {
        hash.update(event.sort_key().as_bytes());
        hash.update([0]);
    }
    format!("{}{SEPARATOR}{}", chunk_key(first, last), hex::encode(&hash.finalize()[..8]))
}

/// The sort key of a chunk's first event (the key itself for a single-event item).
pub(crate) fn first_key_of(sort_key: &str) -> &str {
    sort_key.split_once(SEPARATOR).map_or(sort_key, |(first, _)| first)
}

/// The hash key under which a chunk with `sort_key` is stored: its slot plus
/// a sub-key in `0..subkeys` drawn from the key, so the same chunk always
/// lands on the same item while a slot's chunks spread over `subkeys`
/// partitions (each takes at most 1,000 write units a second).
pub(crate) fn storage_slot(slot: i64, sort_key: &str, subkeys: u32) -> i64 {
    if subkeys <= 1 {
        return slot;
    }
    let digest = Sha256::digest(sort_key.as_bytes());
    let n = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
    slot + i64::from(n % subkeys)
}

/// Where a slot's chunk is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Under one of the slot's `K` sub-keys, drawn from the chunk's key (every key's events anywhere).
    SubKeys(u32),
    /// Under its slice's own key: every event of the chunk is of that slice ([`crate::slices`]).
    Slice { slices: u32, slice: u32 },
}

/// Names of the attributes of a chunk item that are not the key.
pub const LAST: &str = "last";
const COUNT: &str = "count";

/// A chunk as an event-table item: the slot (plus its sub-key), the key, the
/// last event's sort key (readers resuming inside a slot filter on it), the
/// number of events, the bytes and their encoding, when it was moved and
/// (with a retention) when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkItem {
    /// The slot of its events.
    pub slot: i64,
    /// The slot, plus the sub-key ([`storage_slot`]), or its slice's key.
    pub storage_slot: i64,
    pub sort_key: String,
    pub last: String,
    pub count: usize,
    pub bytes: Vec<u8>,
    pub moved_at: i64,
    pub expires_at: Option<i64>,
}

impl ChunkItem {
    /// The item of `packed` (events of `slot`, sorted), stored at `place`.
    pub(crate) fn new(
        slot: i64,
        packed: &Packed,
        place: Place,
        moved_at: i64,
        retention_days: Option<u32>,
    ) -> Option<Self> {
        let first = packed.events.iter().map(ChunkEvent::sort_key).min()?;
        let last = packed.events.iter().map(ChunkEvent::sort_key).max()?;
        let first_arrival = packed.events.iter().map(|e| e.arrival).min()?;
        let sort_key = match place {
            // One shard's run: the same first and last event mean the same events.
            Place::SubKeys(_) => chunk_key(&first, &last),
            // Pooled from several shards: the same ends may hold other events between them.
            Place::Slice { .. } => pooled_chunk_key(&first, &last, &packed.events),
        };
        Some(Self {
            slot,
            storage_slot: match place {
                Place::SubKeys(subkeys) => storage_slot(slot, &sort_key, subkeys),
                Place::Slice { slices, slice } => crate::slices::storage_key(slot, slices, slice),
            },
            sort_key,
            last,
            count: packed.events.len(),
            bytes: packed.bytes.clone(),
            moved_at,
            expires_at: retention_days.map(|d| first_arrival.div_euclid(1000) + i64::from(d) * 86_400),
        })
    }

    pub fn to_item(&self) -> HashMap<String, AttributeValue> {
        let mut item = HashMap::from([
            (event_item::HASH_KEY.to_owned(), AttributeValue::N(self.storage_slot.to_string())),
            (event_item::RANGE_KEY.to_owned(), AttributeValue::S(self.sort_key.clone())),
            (LAST.to_owned(), AttributeValue::S(self.last.clone())),
            (COUNT.to_owned(), AttributeValue::N(self.count.to_string())),
            ("data".to_owned(), AttributeValue::B(self.bytes.clone().into())),
            ("encoding".to_owned(), AttributeValue::S(CHUNK.to_owned())),
            ("moved_at".to_owned(), AttributeValue::N(self.moved_at.to_string())),
        ]);
        if let Some(at) = self.expires_at {
            item.insert("expires_at".to_owned(), AttributeValue::N(at.to_string()));
        }
        item
    }

    /// Its size as DynamoDB counts it.
    pub(crate) fn size(&self) -> usize {
        item_size(&self.to_item())
    }

    pub(crate) fn fits(&self) -> bool {
        self.size() <= MAX_ITEM_BYTES
    }
}

/// What an event-table item of a slot holds, decoded: its events, or why it cannot be read.
#[derive(Debug)]
pub struct Decoded {
    /// The item's sort key (a chunk's, or a single event's).
    pub sort_key: String,
    pub events: std::result::Result<Vec<EventItem>, Error>,
}

/// Decodes one item of `slot` (a chunk, or an event item as written before chunks).
pub fn decode_item(slot: i64, item: &HashMap<String, AttributeValue>) -> Decoded {
    let sort_key = item.get(event_item::RANGE_KEY).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
    let encoding = item.get("encoding").and_then(|v| v.as_s().ok()).map(String::as_str);
    let events = if encoding != Some(CHUNK) && !crate::encoding::known(encoding) {
        // A chunk (or an event) of a format this code does not know: stop, do not skip.
        Err(Error::Newer(format!("item {sort_key} of encoding {:?}", encoding.unwrap_or_default())))
    } else if encoding == Some(CHUNK) {
        match item.get("data").and_then(|v| v.as_b().ok()) {
            Some(data) => {
                unpack(data.as_ref()).map(|events| events.into_iter().map(|e| e.into_event_item(slot)).collect())
            }
            None => Err(Error::Malformed(format!("chunk {sort_key} has no data"))),
        }
    } else {
        EventItem::from_item(item.clone()).map(|mut event| {
            event.slot = slot;
            vec![event]
        })
    };
    Decoded { sort_key, events }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event of a run numbered `n` (shared with the merge's tests).
    pub(super) fn event(n: i64) -> ChunkEvent {
        ChunkEvent {
            event_id: format!("shardId-000000000001:4959{n:052}"),
            arrival: 1_795_240_724_000 + n,
            partition_key: format!("user-{}", n % 7),
            data: format!(r#"{{"n":{n},"path":"/track.gif","ua":"Mozilla/5.0 (X11; Linux x86_64)"}}"#).into_bytes(),
        }
    }

    #[test]
    fn a_chunk_comes_back_exactly_and_smaller() {
        let events: Vec<ChunkEvent> = (0..300).map(event).collect();
        let raw: usize = events.iter().map(|e| e.data.len()).sum();
        let bytes = pack(&events).unwrap();
        assert!(bytes.len() * 5 < raw, "{} of {raw}", bytes.len());
        assert_eq!(unpack(&bytes).unwrap(), events);
        assert!(matches!(unpack(b"not zstd"), Err(Error::Malformed(_))));
        let not_columns = zstd::bulk::compress(b"\x05abc", 3).unwrap();
        assert!(matches!(unpack(&not_columns), Err(Error::Malformed(_))));
        let bomb = zstd::bulk::compress(&vec![0u8; MAX_CHUNK_RAW_BYTES + 1], 3).unwrap();
        assert!(matches!(unpack(&bomb), Err(Error::Malformed(_))));
    }

    #[test]
    fn large_batches_are_cut_into_chunks_that_fit_in_order_and_a_lone_giant_is_refused() {
        let mut rng = fastrand::Rng::with_seed(3);
        let events: Vec<ChunkEvent> =
            (0..200).map(|n| ChunkEvent { data: (0..2_000).map(|_| rng.u8(..)).collect(), ..event(n) }).collect();
        let packed = pack_to_fit(events.clone(), 100_000);
        let chunks: Vec<Packed> = packed.into_iter().map(|p| p.unwrap()).collect();
        assert!(chunks.len() >= 4, "400 KB of noise in 100 KB chunks: {}", chunks.len());
        assert!(chunks.iter().all(|c| c.bytes.len() <= 100_000));
        let back: Vec<ChunkEvent> = chunks.iter().flat_map(|c| unpack(&c.bytes).unwrap()).collect();
        assert_eq!(back, events);

        let giant = ChunkEvent { data: (0..MAX_LONE_EVENT_BYTES + 1).map(|_| rng.u8(..)).collect(), ..event(1) };
        let out = pack_to_fit(vec![event(0), giant.clone(), event(2)], 20_000);
        assert_eq!(out.len(), 3);
        assert!(matches!(&out[1], Err((e, Error::Malformed(_))) if *e == giant));
        assert!(out[0].is_ok() && out[2].is_ok());
        let large = ChunkEvent { data: vec![b'x'; 350_000], ..event(1) };
        assert!(pack_to_fit(vec![large], 20_000)[0].is_ok(), "one event may use the whole item");
    }

    #[test]
    fn chunk_keys_sort_by_first_event_and_differ_by_boundaries() {
        let (a, b, c) = (event(1).sort_key(), event(5).sort_key(), event(9).sort_key());
        assert!(chunk_key(&a, &b) < chunk_key(&a, &c), "same start, other end: two items");
        assert!(chunk_key(&a, &c) < chunk_key(&b, &c));
        assert!(a < chunk_key(&a, &a), "after a single-event item of its first event");
        assert!(chunk_key(&a, &c) < b, "before any later event's item");
        assert_eq!(first_key_of(&chunk_key(&a, &c)), a);
        assert_eq!(first_key_of(&a), a);
        assert_eq!(storage_slot(5_000, &a, 1), 5_000);
        let spread: std::collections::BTreeSet<i64> =
            (0..200).map(|n| storage_slot(5_000, &chunk_key(&event(n).sort_key(), &c), 8)).collect();
        assert_eq!(spread, (5_000..5_008).collect(), "every sub-key used, none outside");
        assert_eq!(storage_slot(5_000, &a, 8), storage_slot(5_000, &a, 8), "the same chunk, the same item");
    }

    #[test]
    fn pooled_chunks_with_the_same_ends_and_other_events_between_have_other_keys() {
        let (all, ends) = ((0..3).map(event).collect::<Vec<_>>(), vec![event(0), event(2)]);
        let key = |events: &[ChunkEvent]| pooled_chunk_key(&event(0).sort_key(), &event(2).sort_key(), events);
        assert_ne!(key(&all), key(&ends), "one must not overwrite the other");
        assert_eq!(key(&all), key(&all));
        assert_eq!(first_key_of(&key(&all)), event(0).sort_key());
        assert!(chunk_key(&event(0).sort_key(), &event(2).sort_key()) < key(&all) && key(&all) < event(1).sort_key());
        let packed = Packed { bytes: pack(&all).unwrap(), events: all };
        let item = ChunkItem::new(1_795_240_724_000, &packed, Place::Slice { slices: 4, slice: 1 }, 7, None).unwrap();
        assert_eq!(item.sort_key, key(&packed.events));
    }

    #[test]
    fn chunk_items_round_trip_through_decode() {
        let packed = pack_to_fit((10..20).map(event).collect(), MAX_CHUNK_BYTES).remove(0).unwrap();
        let item = ChunkItem::new(1_795_240_724_000, &packed, Place::SubKeys(1), 7, Some(30)).unwrap();
        assert!(item.fits());
        assert_eq!(item.sort_key, chunk_key(&event(10).sort_key(), &event(19).sort_key()));
        assert_eq!(item.expires_at, Some(1_795_240_724 + 30 * 86_400));
        let decoded = decode_item(1_795_240_724_000, &item.to_item());
        let events = decoded.events.unwrap();
        assert_eq!(events.len(), 10);
        assert_eq!(events[3].bytes().unwrap(), event(13).data);
        assert_eq!(events[3].sort_key, event(13).sort_key());
        let mut broken = item.to_item();
        broken.insert("data".into(), AttributeValue::B(b"junk".to_vec().into()));
        assert!(decode_item(0, &broken).events.is_err());
    }
}
