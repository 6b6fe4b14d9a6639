//! One scan page, planned without I/O: which buffer items become events,
//! which go to quarantine and which slots need an index entry
//! ([`PagePlan::new`]); once the event-table writes are back, which buffer
//! items may be deleted ([`PagePlan::settle`]); once the deletes are back,
//! what the page moved and what it tells the watermark ([`PagePlan::outcome`]).

use std::collections::{BTreeSet, HashMap, HashSet};

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use tracing::{error, warn};

use crate::bookkeeping::slot_index::index_item;
use crate::buffer_item::{self, BufferItem};
use crate::dynamo::keyed_puts;
use crate::event_item::{quarantine_item, EventItem};

/// Where one event-table write of a page goes. Typed, so that an index
/// entry is never mistaken for an event when its write comes back failed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableKey {
    Event {
        slot: i64,
        sort_key: String,
    },
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
    /// Arrival and slot of each buffer id that became an event.
    arrivals: HashMap<String, (i64, i64)>,
    /// Buffer ids whose write could not even be built: they stay.
    unbuilt: Vec<String>,
    /// Items left in place that no id names (no string id, or too large even for quarantine).
    stuck: usize,
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
}

impl PagePlan {
    /// Plans the page `items`; slots in `indexed` already have their index
    /// entry from an earlier page of this run (one index write per slot per run).
    pub fn new(items: Vec<HashMap<String, AttributeValue>>, moving: Moving, indexed: &BTreeSet<i64>) -> Self {
        let mut plan = PagePlan::default();
        let mut writes = Vec::new();
        for attributes in items {
            let Some(id) = attributes.get(buffer_item::HASH_KEY).and_then(|v| v.as_s().ok()).cloned() else {
                warn!("buffer item without a string id: left in place");
                plan.stuck += 1;
                continue;
            };
            let event = BufferItem::from_item(attributes.clone()).and_then(|b| {
                let event = EventItem::from_buffer(&b, moving.time_unit_ms)?;
                Ok(event.with_retention(moving.retention_days).moved(moving.now_ms))
            });
            match event {
                Ok(event) => {
                    plan.arrivals.insert(id.clone(), (event.arrival, event.slot));
                    let key = TableKey::Event { slot: event.slot, sort_key: event.sort_key.clone() };
                    writes.push((key, id, event.to_item()));
                }
                Err(err) => match quarantine_item(&id, &err.to_string(), attributes, moving.now_ms) {
                    Some(item) => {
                        warn!(id, reason = %err, "buffer item quarantined");
                        plan.quarantined += 1;
                        writes.push((TableKey::Quarantine(id.clone()), id, item));
                    }
                    None => {
                        error!(id, reason = %err, "buffer item can be neither moved nor quarantined: left in place");
                        plan.stuck += 1;
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
            .filter_map(|key| match key {
                TableKey::Event { slot, .. } if *slot >= 0 && !indexed.contains(slot) => Some(*slot),
                _ => None,
            })
            .collect();
        for &slot in &plan.index_slots {
            if let Ok(put) = PutRequest::builder().set_item(Some(index_item(slot))).build() {
                plan.writes.push((TableKey::SlotIndex(slot), WriteRequest::builder().put_request(put).build()));
            }
        }
        plan
    }

    /// Given the event-table writes that failed, splits the page's buffer
    /// ids into those to delete and those to leave
    /// (`docs/design.md#2-delete-after-durable-copy`).
    pub fn settle(&mut self, not_written: &[TableKey]) -> Settled {
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
            match key {
                TableKey::Event { slot, .. } if settled.unindexed.contains(&slot) => settled.left.extend(ids),
                _ => settled.delete.extend(ids),
            }
        }
        settled
    }

    /// What the page did, given the deletes that failed; `watermark` (when
    /// known) makes moved events behind it late.
    pub fn outcome(&self, settled: Settled, not_deleted: &[String], watermark: Option<i64>) -> PageOutcome {
        let mut left = settled.left;
        let failed_deletes: HashSet<&String> = not_deleted.iter().collect();
        let moved: Vec<&String> = settled.delete.iter().filter(|id| !failed_deletes.contains(id)).collect();
        left.extend(not_deleted.iter().cloned());
        let late: Vec<i64> = match watermark {
            // Late: moved (so counted once) into a slot the watermark had already passed.
            Some(watermark) => moved
                .iter()
                .filter_map(|id| self.arrivals.get(*id))
                .filter(|(arrival, _)| *arrival < watermark)
                .map(|(_, slot)| *slot)
                .collect(),
            None => Vec::new(),
        };
        PageOutcome {
            moved: moved.len(),
            failed: self.stuck + left.len(),
            quarantined: self.quarantined,
            late: late.len(),
            first_late_slot: late.iter().min().copied(),
            oldest_left: left.iter().filter_map(|id| self.arrivals.get(id)).map(|(arrival, _)| *arrival).min(),
        }
    }
}

/// The buffer deletes of `ids`, each tagged with its id.
pub fn buffer_deletes(ids: &[String]) -> Vec<(String, WriteRequest)> {
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
        }
        .to_item()
    }

    fn moving() -> Moving {
        Moving { time_unit_ms: 1000, retention_days: None, now_ms: T + 10_000 }
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
        assert_eq!((plan.quarantined, plan.stuck), (1, 1));
    }

    #[test]
    fn what_is_not_written_or_not_indexed_stays_and_holds_the_watermark_back() {
        let items =
            vec![buffered("a", T + 10, T + 20), buffered("b", T + 1_500, T + 1_510), buffered("c", T + 20, T + 30)];
        let mut plan = PagePlan::new(items, moving(), &BTreeSet::new());
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
