//! One scan page, planned without I/O: which buffer items become event-table
//! chunks (a buffer chunk of one slot is copied as it is; one that spans
//! slots, or an item of the format before chunks, is packed again by slot),
//! which go to quarantine and which slots need an index entry
//! ([`PagePlan::new`]); once the event-table writes are back, which buffer
//! items may be deleted ([`PagePlan::settle`]); once the deletes are back,
//! what the page moved and what it tells the watermark ([`PagePlan::outcome`]).
//! With slices, the page's events are pooled by slot and slice instead
//! ([`super::slicing`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use tracing::{error, warn};

use super::slicing::Pool;
use crate::bookkeeping::ingest::minute_of;
use crate::bookkeeping::slot_index::{index_item, sliced_index_item};
use crate::bookkeeping::watermark::UNKNOWN_ARRIVAL;
use crate::buffer_item::{self, BufferItem};
use crate::chunk::{pack_to_fit, ChunkEvent, ChunkItem, Packed, Place, MAX_CHUNK_BYTES};
use crate::dynamo::keyed_puts;
use crate::error::{Error, Result};
use crate::event_item::quarantine_item;
use crate::time::slot_of;

/// Where one event-table write of a page goes. Typed, so that an index
/// entry is never mistaken for an event when its write comes back failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableKey {
    /// A chunk of `slot`, stored under the hash key `storage`.
    Event { slot: i64, storage: i64, sort_key: String },
    /// The quarantine partition, keyed by buffer id.
    Quarantine(String),
    /// The slot index entry of a slot.
    SlotIndex(i64),
}

/// How events are made from buffer items.
#[derive(Debug, Clone, Copy)]
pub struct Moving {
    pub time_unit_ms: u64,
    pub retention_days: Option<u32>,
    pub now_ms: i64,
    /// Sub-keys each slot's chunks are spread over.
    pub slot_subkeys: u32,
    /// Slices each slot is cut into (`SLICES`; 1: not cut, chunks spread over sub-keys).
    pub slices: u32,
}

/// The arrival and slot of each event of a buffer item.
pub type Places = Vec<(i64, i64)>;

/// The event-table chunks of a buffer item, and the arrival and slot of each of its events.
pub fn event_chunks(buffer: &BufferItem, moving: Moving) -> Result<(Vec<ChunkItem>, Places)> {
    let events = buffer.events()?;
    let unit = moving.time_unit_ms;
    let places: Vec<(i64, i64)> = events.iter().map(|e| (e.arrival, slot_of(e.arrival, unit))).collect();
    let mut by_slot: std::collections::BTreeMap<i64, Vec<crate::chunk::ChunkEvent>> = Default::default();
    for event in events {
        by_slot.entry(slot_of(event.arrival, unit)).or_default().push(event);
    }
    let mut chunks = Vec::new();
    let whole = buffer.is_chunk() && by_slot.len() == 1;
    for (slot, mut events) in by_slot {
        let packed = if whole {
            // The pump's chunk is of one slot: its bytes are moved as they are.
            vec![Packed { events, bytes: buffer.data.clone() }]
        } else {
            events.sort_by_key(|e| e.sort_key());
            pack_to_fit(events, MAX_CHUNK_BYTES)
                .into_iter()
                .map(|p| p.map_err(|(event, err)| Error::Malformed(format!("event {}: {err}", event.event_id))))
                .collect::<Result<Vec<_>>>()?
        };
        for packed in packed {
            let place = Place::SubKeys(moving.slot_subkeys);
            let item = ChunkItem::new(slot, &packed, place, moving.now_ms, moving.retention_days)
                .ok_or_else(|| Error::Malformed(format!("buffer item {} holds no events", buffer.id)))?;
            if !item.fits() {
                return Err(Error::Malformed(format!(
                    "chunk of {} events is {} bytes, over the 400 KB item limit",
                    item.count,
                    item.size()
                )));
            }
            chunks.push(item);
        }
    }
    Ok((chunks, places))
}

/// What a buffer item makes: its chunks (by slot) when slots are not cut
/// into slices, else its events for the page's [`Pool`]; and the arrival and
/// slot of each of its events.
type Made = (Vec<ChunkItem>, Vec<ChunkEvent>, Places);

fn made(buffer: &BufferItem, moving: Moving) -> Result<Made> {
    if moving.slices > 1 {
        let events = buffer.events()?;
        let places = events.iter().map(|e| (e.arrival, slot_of(e.arrival, moving.time_unit_ms))).collect();
        return Ok((Vec::new(), events, places));
    }
    let (chunks, places) = event_chunks(buffer, moving)?;
    Ok((chunks, Vec::new(), places))
}

fn event_key(chunk: &ChunkItem) -> TableKey {
    TableKey::Event { slot: chunk.slot, storage: chunk.storage_slot, sort_key: chunk.sort_key.clone() }
}

/// One page's writes and what they stand for.
#[derive(Debug, Default)]
pub struct PagePlan {
    /// Event-table writes, one per key: events, quarantine items, index entries.
    pub writes: Vec<(TableKey, WriteRequest)>,
    /// The buffer ids behind each event or quarantine write.
    sources: HashMap<TableKey, Vec<String>>,
    /// Slots whose index entry this page writes.
    index_slots: BTreeSet<i64>,
    /// Arrival and slot of each event of each buffer id that became chunks.
    arrivals: HashMap<String, Vec<(i64, i64)>>,
    /// Buffer ids whose write could not even be built: they stay.
    unbuilt: Vec<String>,
    /// Items left in place that can neither move nor be quarantined (no
    /// string id, or too large even for quarantine): what names them, and
    /// their arrival (`None` when unreadable).
    stuck: Vec<(String, Option<i64>)>,
    quarantined: usize,
}

/// After the event-table writes: what may leave the buffer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Buffer ids now durably in the event table and its index: to delete.
    pub delete: Vec<String>,
    /// Buffer ids that stay for the next pass.
    pub left: Vec<String>,
    /// Slots whose index entry is written.
    pub indexed: BTreeSet<i64>,
    /// Slots whose index entry failed: their events stay in the buffer.
    pub unindexed: BTreeSet<i64>,
}

/// What one page did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PageOutcome {
    /// Items now in the event table and gone from the buffer.
    pub moved: usize,
    /// Items left in the buffer for the next pass.
    pub failed: usize,
    pub quarantined: usize,
    /// Moved events whose arrival was behind the watermark, and the first of their slots.
    pub late: usize,
    pub first_late_slot: Option<i64>,
    /// Oldest arrival among the items the page had to leave in the buffer (holds the watermark back).
    pub oldest_left: Option<i64>,
    /// Items that can neither move nor be quarantined, by what names them: they hold the
    /// watermark at their arrival (where they have none, where it is) until someone removes them.
    pub stuck: Vec<String>,
    /// Moved events by the minute of their arrival (the ingest count status draws).
    pub per_minute: BTreeMap<i64, u64>,
}

impl PagePlan {
    /// Plans the page `items`; slots in `indexed` already have their index
    /// entry from an earlier page of this run (one index write per slot per run).
    pub(crate) fn new(items: Vec<HashMap<String, AttributeValue>>, moving: Moving, indexed: &BTreeSet<i64>) -> Self {
        let mut plan = PagePlan::default();
        let mut writes = Vec::new();
        let mut pool = Pool::new(moving.time_unit_ms, moving.slices);
        // Pooled items' attributes, to quarantine one whose event cannot be packed.
        let mut pooled = HashMap::new();
        for attributes in items {
            let arrival = attributes.get("arrival").and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
            let Some(id) = attributes.get(buffer_item::HASH_KEY).and_then(|v| v.as_s().ok()).cloned() else {
                let mut names: Vec<&String> = attributes.keys().collect();
                names.sort();
                let name = format!("buffer item without a string id (attributes {names:?})");
                error!(
                    item = name,
                    "buffer item can be neither moved nor quarantined: left in place, holding the watermark"
                );
                plan.stuck.push((name, arrival));
                continue;
            };
            match BufferItem::from_item(attributes.clone()).and_then(|b| made(&b, moving)) {
                Ok((chunks, events, places)) => {
                    plan.arrivals.insert(id.clone(), places);
                    for chunk in chunks {
                        writes.push((event_key(&chunk), id.clone(), chunk.to_item()));
                    }
                    if !events.is_empty() {
                        pool.add(&id, events);
                        pooled.insert(id.clone(), attributes);
                    }
                }
                // A newer version's item: not this code's to judge. It waits, holding the watermark, for the upgrade.
                Err(err) if err.is_newer() => {
                    error!(id, reason = %err, "buffer item left in place, holding the watermark");
                    plan.stuck.push((format!("{id} ({err})"), arrival));
                }
                Err(err) => plan.quarantine((id, arrival), Some(attributes), &err, moving.now_ms, &mut writes),
            }
        }
        let (chunks, unpacked) = pool.chunks(moving.now_ms, moving.retention_days);
        for (chunk, behind) in chunks {
            let (key, item) = (event_key(&chunk), chunk.to_item());
            writes.extend(behind.into_iter().map(|id| (key.clone(), id, item.clone())));
        }
        // A pooled item with an event that cannot be packed is quarantined whole, as an item that
        // cannot be moved is (its other events still move: the quarantine keeps it for a look).
        let mut seen = HashSet::new();
        for (id, err) in unpacked.into_iter().filter(|(id, _)| seen.insert(id.clone())) {
            let arrival = plan.arrivals.get(&id).and_then(|places| places.iter().map(|(a, _)| *a).min());
            let attributes = pooled.remove(&id);
            plan.quarantine((id, arrival), attributes, &err, moving.now_ms, &mut writes);
        }
        // One put per key (a page may name an event twice), with every buffer id behind it.
        let puts = keyed_puts(writes);
        plan.unbuilt = puts.failed;
        plan.writes = puts.requests;
        plan.sources = puts.sources;
        // With the events, one index entry per non-empty slot of the page: readers find a
        // slot only through the index, so its events leave the buffer only once both are written.
        plan.index_slots = plan
            .sources
            .keys()
            .filter_map(|key| plan.slot_of(key))
            .filter(|slot| *slot >= 0 && !indexed.contains(slot))
            .collect();
        for &slot in &plan.index_slots {
            let entry = match moving.slices {
                0 | 1 => index_item(slot, moving.slot_subkeys),
                slices => sliced_index_item(slot, slices),
            };
            if let Ok(put) = PutRequest::builder().set_item(Some(entry)).build() {
                plan.writes.push((TableKey::SlotIndex(slot), WriteRequest::builder().put_request(put).build()));
            }
        }
        plan
    }

    /// Quarantines the buffer item `id` (its `attributes`) for `err`; one that
    /// cannot be (too large even there) stays in place, holding the watermark at `arrival`.
    fn quarantine(
        &mut self,
        (id, arrival): (String, Option<i64>),
        attributes: Option<HashMap<String, AttributeValue>>,
        err: &Error,
        now_ms: i64,
        writes: &mut Vec<(TableKey, String, HashMap<String, AttributeValue>)>,
    ) {
        match attributes.and_then(|attributes| quarantine_item(&id, &err.to_string(), attributes, now_ms)) {
            Some(item) => {
                warn!(id, reason = %err, "buffer item quarantined");
                self.quarantined += 1;
                writes.push((TableKey::Quarantine(id.clone()), id, item));
            }
            None => {
                error!(id, reason = %err, "buffer item can be neither moved nor quarantined: left in place, holding the watermark");
                self.stuck.push((id, arrival));
            }
        }
    }

    /// The slot a chunk's write belongs to.
    fn slot_of(&self, key: &TableKey) -> Option<i64> {
        match key {
            TableKey::Event { slot, .. } => Some(*slot),
            _ => None,
        }
    }

    /// Given the event-table writes that failed, splits the page's buffer
    /// ids into those to delete and those to leave
    /// (`docs/design.md#2-delete-after-durable-copy`).
    pub(crate) fn settle(&mut self, not_written: &[TableKey]) -> Settled {
        let mut settled = Settled { left: std::mem::take(&mut self.unbuilt), ..Settled::default() };
        let mut sources = std::mem::take(&mut self.sources);
        for key in not_written {
            match key {
                TableKey::SlotIndex(slot) => {
                    settled.unindexed.insert(*slot);
                }
                key => settled.left.extend(sources.remove(key).unwrap_or_default()),
            }
        }
        settled.indexed = self.index_slots.difference(&settled.unindexed).copied().collect();
        for (key, ids) in sources {
            match self.slot_of(&key) {
                Some(slot) if settled.unindexed.contains(&slot) => settled.left.extend(ids),
                _ => settled.delete.extend(ids),
            }
        }
        // A buffer item cut into several chunks leaves only once every one of them is written.
        let left: HashSet<String> = settled.left.iter().cloned().collect();
        let mut seen = HashSet::new();
        settled.delete.retain(|id| !left.contains(id) && seen.insert(id.clone()));
        let mut seen = HashSet::new();
        settled.left.retain(|id| seen.insert(id.clone()));
        settled
    }

    /// The slots this page writes events into that `watermark` has already
    /// passed (they get a late marker first: [`crate::bookkeeping::late_slots`]).
    pub(crate) fn late_slots(&self, watermark: Option<i64>) -> BTreeSet<i64> {
        let Some(watermark) = watermark else { return BTreeSet::new() };
        self.arrivals.values().flatten().filter(|(arrival, _)| *arrival < watermark).map(|(_, slot)| *slot).collect()
    }

    /// What the page did, given the deletes that failed; `watermark` (when
    /// known) makes moved events behind it late.
    pub(crate) fn outcome(&self, settled: Settled, not_deleted: &[String], watermark: Option<i64>) -> PageOutcome {
        let mut left = settled.left;
        let failed_deletes: HashSet<&String> = not_deleted.iter().collect();
        let moved: Vec<&String> = settled.delete.iter().filter(|id| !failed_deletes.contains(id)).collect();
        left.extend(not_deleted.iter().cloned());
        let late: Vec<i64> = match watermark {
            // Late: moved (so counted once) into a slot the watermark had already passed.
            Some(watermark) => moved
                .iter()
                .filter_map(|id| self.arrivals.get(*id))
                .flatten()
                .filter(|(arrival, _)| *arrival < watermark)
                .map(|(_, slot)| *slot)
                .collect(),
            None => Vec::new(),
        };
        let mut per_minute = BTreeMap::new();
        for (arrival, _) in moved.iter().filter_map(|id| self.arrivals.get(*id)).flatten() {
            *per_minute.entry(minute_of(*arrival)).or_insert(0) += 1;
        }
        let events_of = |id: &String| self.arrivals.get(id).map_or(1, Vec::len);
        PageOutcome {
            moved: moved.iter().map(|id| events_of(id)).sum(),
            failed: self.stuck.len() + left.iter().map(events_of).sum::<usize>(),
            quarantined: self.quarantined,
            late: late.len(),
            first_late_slot: late.iter().min().copied(),
            // A stuck item without a readable arrival holds the watermark where it is (it only moves forward).
            oldest_left: left
                .iter()
                .filter_map(|id| self.arrivals.get(id))
                .flatten()
                .map(|(arrival, _)| *arrival)
                .chain(self.stuck.iter().map(|(_, arrival)| arrival.unwrap_or(UNKNOWN_ARRIVAL)))
                .min(),
            stuck: self.stuck.iter().map(|(name, _)| name.clone()).collect(),
            per_minute,
        }
    }
}

/// The buffer deletes of `ids`, each tagged with its id.
pub(crate) fn buffer_deletes(ids: &[String]) -> Vec<(String, WriteRequest)> {
    ids.iter()
        .filter_map(|id| {
            let delete = DeleteRequest::builder().set_key(Some(BufferItem::key_of(id))).build().ok()?;
            Some((id.clone(), WriteRequest::builder().delete_request(delete).build()))
        })
        .collect()
}

#[cfg(test)]
mod tests;
