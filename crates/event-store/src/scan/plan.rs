//! One scan page, planned without I/O: which buffer items become event-table
//! chunks (a buffer chunk of one slot is copied as it is; one that spans
//! slots, or an item of the format before chunks, is packed again by slot),
//! which go to quarantine and which slots need an index entry
//! ([`PagePlan::new`]); once the event-table writes are back, which buffer
//! items may be deleted ([`PagePlan::settle`]); once the deletes are back,
//! what the page moved and what it tells the watermark ([`PagePlan::outcome`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use tracing::{error, warn};

use crate::bookkeeping::ingest::minute_of;
use crate::bookkeeping::slot_index::index_item;
use crate::bookkeeping::watermark::UNKNOWN_ARRIVAL;
use crate::buffer_item::{self, BufferItem};
use crate::chunk::{pack_to_fit, ChunkItem, Packed, MAX_CHUNK_BYTES};
use crate::dynamo::keyed_puts;
use crate::error::{Error, Result};
use crate::event_item::quarantine_item;
use crate::time::slot_of;

/// Where one event-table write of a page goes. Typed, so that an index
/// entry is never mistaken for an event when its write comes back failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableKey {
    /// A chunk: `slot` is where it is stored (the slot plus its sub-key).
    Event { slot: i64, sort_key: String },
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
            let item = ChunkItem::new(slot, &packed, moving.slot_subkeys, moving.now_ms, moving.retention_days)
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
    time_unit_ms: u64,
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
        let mut plan = PagePlan { time_unit_ms: moving.time_unit_ms, ..PagePlan::default() };
        let mut writes = Vec::new();
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
            match BufferItem::from_item(attributes.clone()).and_then(|b| event_chunks(&b, moving)) {
                Ok((chunks, places)) => {
                    plan.arrivals.insert(id.clone(), places);
                    for chunk in chunks {
                        let key = TableKey::Event { slot: chunk.storage_slot, sort_key: chunk.sort_key.clone() };
                        writes.push((key, id.clone(), chunk.to_item()));
                    }
                }
                // A newer version's item: not this code's to judge. It waits, holding the watermark, for the upgrade.
                Err(err) if err.is_newer() => {
                    error!(id, reason = %err, "buffer item left in place, holding the watermark");
                    plan.stuck.push((format!("{id} ({err})"), arrival));
                }
                Err(err) => match quarantine_item(&id, &err.to_string(), attributes, moving.now_ms) {
                    Some(item) => {
                        warn!(id, reason = %err, "buffer item quarantined");
                        plan.quarantined += 1;
                        writes.push((TableKey::Quarantine(id.clone()), id, item));
                    }
                    None => {
                        error!(id, reason = %err, "buffer item can be neither moved nor quarantined: left in place, holding the watermark");
                        plan.stuck.push((id, arrival));
                    }
                },
            }
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
            if let Ok(put) = PutRequest::builder().set_item(Some(index_item(slot, moving.slot_subkeys))).build() {
                plan.writes.push((TableKey::SlotIndex(slot), WriteRequest::builder().put_request(put).build()));
            }
        }
        plan
    }

    /// The slot a chunk's write belongs to (its stored hash key is the slot plus a sub-key).
    fn slot_of(&self, key: &TableKey) -> Option<i64> {
        match key {
            TableKey::Event { slot, .. } => Some(slot_of(*slot, self.time_unit_ms.max(1))),
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
mod tests {
    use super::*;

    const T: i64 = 1_795_327_124_000;

    fn buffered(id: &str, arrival: i64, buffered_at: i64) -> HashMap<String, AttributeValue> {
        let (data, encoding) = crate::encoding::encode(br#"{"n":1}"#);
        BufferItem {
            id: id.into(),
            event_id: format!("shardId-000000000000:{arrival}"),
            arrival,
            partition_key: "pk".into(),
            data,
            encoding,
            buffered_at: Some(buffered_at),
            count: None,
        }
        .to_item()
    }

    fn moving() -> Moving {
        Moving { time_unit_ms: 1000, retention_days: None, now_ms: T + 10_000, slot_subkeys: 1 }
    }

    fn keys(plan: &PagePlan) -> Vec<TableKey> {
        let mut keys: Vec<TableKey> = plan.writes.iter().map(|(k, _)| k.clone()).collect();
        keys.sort();
        keys
    }

    #[test]
    fn a_page_plans_its_events_quarantine_and_one_index_entry_per_new_slot() {
        let broken = HashMap::from([("id".to_string(), AttributeValue::S("broken".into()))]);
        let no_id = HashMap::from([("other".to_string(), AttributeValue::S("x".into()))]);
        let items = vec![buffered("a", T + 10, T + 50), buffered("b", T + 1_500, T + 1_600), broken, no_id];
        let already = BTreeSet::from([T + 1_000]);
        let plan = PagePlan::new(items, moving(), &already);
        let keys = keys(&plan);
        assert_eq!(keys.iter().filter(|k| matches!(k, TableKey::Event { .. })).count(), 2);
        assert!(keys.contains(&TableKey::Quarantine("broken".into())));
        assert!(keys.contains(&TableKey::SlotIndex(T)), "a new slot gets its index entry");
        assert!(!keys.contains(&TableKey::SlotIndex(T + 1_000)), "an indexed slot does not, again");
        assert_eq!((plan.quarantined, plan.stuck.len()), (1, 1));
    }

    #[test]
    fn an_item_that_can_neither_move_nor_be_quarantined_holds_the_watermark_and_is_named() {
        // Too large for the quarantine item (which adds the reason), and no events in it to move.
        let huge = HashMap::from([
            ("id".to_string(), AttributeValue::S("huge".into())),
            ("arrival".to_string(), AttributeValue::N((T + 40).to_string())),
            ("data".to_string(), AttributeValue::S("x".repeat(400_000))),
        ]);
        let no_id = HashMap::from([("other".to_string(), AttributeValue::S("x".into()))]);
        let mut plan = PagePlan::new(vec![buffered("a", T + 10, T + 90), huge], moving(), &BTreeSet::new());
        let settled = plan.settle(&[]);
        let outcome = plan.outcome(settled, &[], None);
        assert_eq!(outcome.moved, 1);
        assert_eq!(outcome.oldest_left, Some(T + 40), "the stuck item's arrival holds the watermark");
        assert_eq!(outcome.stuck, vec!["huge".to_string()]);
        let mut plan = PagePlan::new(vec![no_id], moving(), &BTreeSet::new());
        let settled = plan.settle(&[]);
        let outcome = plan.outcome(settled, &[], None);
        assert_eq!(outcome.oldest_left, Some(UNKNOWN_ARRIVAL), "no arrival to go by: held where it is");
        let mut pass = crate::bookkeeping::watermark::Pass::started_at(T + 60_000, None, T + 59_000);
        pass.saw(outcome.oldest_left);
        assert_eq!(pass.watermark(0), None, "the pass moves no watermark");
        assert!(outcome.stuck[0].contains("without a string id") && outcome.stuck[0].contains("other"));
    }

    #[test]
    fn a_newer_versions_buffer_item_is_not_quarantined_but_waits_holding_the_watermark() {
        let mut newer = buffered("newer", T + 40, T + 90);
        newer.insert("encoding".into(), AttributeValue::S("chunk2".into()));
        let mut plan = PagePlan::new(vec![buffered("a", T + 10, T + 90), newer], moving(), &BTreeSet::new());
        assert_eq!(plan.quarantined, 0);
        let settled = plan.settle(&[]);
        let outcome = plan.outcome(settled, &[], None);
        assert_eq!((outcome.moved, outcome.oldest_left), (1, Some(T + 40)));
        assert!(outcome.stuck[0].starts_with("newer (written by a newer version"), "{:?}", outcome.stuck);
    }

    #[test]
    fn what_is_not_written_or_not_indexed_stays_and_holds_the_watermark_back() {
        let items =
            vec![buffered("a", T + 10, T + 20), buffered("b", T + 1_500, T + 1_510), buffered("c", T + 20, T + 30)];
        let mut plan = PagePlan::new(items, moving(), &BTreeSet::new());
        // Marked before anything is written: a and c arrived behind a watermark at T+25, b did not.
        assert_eq!(plan.late_slots(Some(T + 25)), BTreeSet::from([T]));
        assert_eq!(plan.late_slots(Some(T + 1_501)), BTreeSet::from([T, T + 1_000]));
        assert!(plan.late_slots(None).is_empty(), "no watermark yet: nothing is late");
        let c = plan.sources.iter().find(|(_, ids)| **ids == ["c".to_string()]).map(|(k, _)| k.clone()).unwrap();
        // c's put failed; slot T+1000's index entry failed, so b stays too.
        let settled = plan.settle(&[c, TableKey::SlotIndex(T + 1_000)]);
        assert_eq!(settled.delete, vec!["a".to_string()]);
        let mut left = settled.left.clone();
        left.sort();
        assert_eq!(left, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(settled.indexed, BTreeSet::from([T]));
        assert_eq!(settled.unindexed, BTreeSet::from([T + 1_000]));

        let outcome = plan.outcome(settled, &[], Some(T + 15));
        assert_eq!((outcome.moved, outcome.failed, outcome.late), (1, 2, 1), "a moved behind the watermark");
        assert_eq!(outcome.first_late_slot, Some(T));
        assert_eq!(outcome.oldest_left, Some(T + 20));
        assert_eq!(outcome.per_minute, BTreeMap::from([(minute_of(T + 10), 1)]), "only what moved is counted");
    }

    /// A buffer chunk of `arrivals` (one shard's events), as the pump writes it.
    fn chunk(arrivals: &[i64]) -> BufferItem {
        let events: Vec<crate::chunk::ChunkEvent> = arrivals
            .iter()
            .map(|&a| crate::chunk::ChunkEvent {
                event_id: format!("shardId-000000000000:{a}"),
                arrival: a,
                partition_key: "pk".into(),
                data: br#"{"n":1}"#.to_vec(),
            })
            .collect();
        let packed = crate::chunk::Packed { bytes: crate::chunk::pack(&events).unwrap(), events };
        BufferItem::chunk("arn", &packed, T).unwrap()
    }

    #[test]
    fn a_chunk_of_one_slot_moves_as_it_is_and_one_across_slots_is_cut_and_leaves_only_whole() {
        let one = chunk(&[T + 1, T + 2, T + 3]);
        let (chunks, places) = event_chunks(&one, moving()).unwrap();
        assert_eq!((chunks.len(), places.len()), (1, 3));
        assert_eq!(chunks[0].bytes, one.data, "the pump's bytes, not packed again");
        assert_eq!(chunks[0].storage_slot, T);

        let across = chunk(&[T + 998, T + 999, T + 1_000, T + 1_001]);
        let eight = Moving { slot_subkeys: 8, ..moving() };
        let (chunks, _) = event_chunks(&across, eight).unwrap();
        let slots: Vec<i64> = chunks.iter().map(|c| c.storage_slot / 1000 * 1000).collect();
        assert_eq!(slots, vec![T, T + 1_000]);
        assert!(chunks.iter().all(|c| c.count == 2 && c.storage_slot % 1000 < 8));

        let mut plan = PagePlan::new(vec![across.to_item()], eight, &BTreeSet::new());
        let keys = keys(&plan);
        assert!(keys.contains(&TableKey::SlotIndex(T)) && keys.contains(&TableKey::SlotIndex(T + 1_000)));
        let index: Vec<String> = plan
            .writes
            .iter()
            .filter(|(k, _)| matches!(k, TableKey::SlotIndex(_)))
            .map(|(_, w)| w.put_request().unwrap().item()["sort_key"].as_s().unwrap().clone())
            .collect();
        assert!(index.iter().all(|k| k.ends_with("#8")), "{index:?}");
        let second =
            keys.iter().find(|k| matches!(k, TableKey::Event { slot, .. } if *slot >= T + 1_000)).unwrap().clone();
        let settled = plan.settle(&[second]);
        assert!(settled.delete.is_empty(), "half written: the buffer chunk stays");
        assert_eq!(settled.left, vec![across.id.clone()]);
        let outcome = plan.outcome(settled, &[], None);
        assert_eq!((outcome.moved, outcome.failed, outcome.oldest_left), (0, 4, Some(T + 998)));
    }

    #[test]
    fn a_failed_delete_leaves_the_item_counted_as_failed_not_moved() {
        let mut plan = PagePlan::new(vec![buffered("a", T + 10, T + 20)], moving(), &BTreeSet::new());
        let settled = plan.settle(&[]);
        assert_eq!(settled.delete, vec!["a".to_string()]);
        let outcome = plan.outcome(settled, &["a".to_string()], None);
        assert_eq!((outcome.moved, outcome.failed, outcome.late), (0, 1, 0));
        assert_eq!(outcome.oldest_left, Some(T + 10));
        assert_eq!(buffer_deletes(&["a".to_string()]).len(), 1);
    }
}
