//! A page's events cut by slice (`SLICES` > 1), without I/O: every event of
//! the page goes to the group of its slot and slice, whichever buffer item
//! (and shard) it came from, and each group is packed into chunks stored
//! under the slice's own key ([`crate::slices`]).
//!
//! Pooling the page, not each buffer item, keeps chunks large: a pump batch
//! cut into 256 slices alone would make chunks of two events each, and a
//! chunk pays at least one write unit. A chunk's write stands for every
//! buffer item with an event in it, so each of them leaves the buffer only
//! once all its chunks are written. A page that runs again cuts its events
//! elsewhere: the chunks it writes then are copies under other keys, which
//! readers drop ([`crate::chunk::SlotMerge`]).

use std::collections::BTreeMap;

use crate::chunk::{pack_to_fit, ChunkEvent, ChunkItem, Place, MAX_CHUNK_BYTES};
use crate::error::Error;
use crate::slices::{key_hash, part_of};
use crate::time::slot_of;

/// An event, and the buffer ids that hold it.
type Held = (ChunkEvent, Vec<String>);
/// A chunk, and the buffer ids behind it.
pub(crate) type Behind = (ChunkItem, Vec<String>);
/// A buffer id, and why an event of it could not be packed.
pub(crate) type Unpacked = (String, Error);

/// The page's events by (slot, slice), each with the buffer ids that hold it.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    time_unit_ms: u64,
    slices: u32,
    groups: BTreeMap<(i64, u32), Vec<Held>>,
}

impl Pool {
    pub(crate) fn new(time_unit_ms: u64, slices: u32) -> Self {
        Self { time_unit_ms, slices, groups: BTreeMap::new() }
    }

    /// Adds the events of buffer item `id`.
    pub(crate) fn add(&mut self, id: &str, events: Vec<ChunkEvent>) {
        for event in events {
            let slot = slot_of(event.arrival, self.time_unit_ms);
            let slice = part_of(key_hash(&event.partition_key), self.slices);
            self.groups.entry((slot, slice)).or_default().push((event, vec![id.to_owned()]));
        }
    }

    /// The chunks of the page, each with the buffer ids behind it, and the
    /// ids of events that could not be packed (they stay in the buffer).
    /// An event in two buffer items (a copy) is packed once, behind both.
    pub(crate) fn chunks(self, moved_at: i64, retention_days: Option<u32>) -> (Vec<Behind>, Vec<Unpacked>) {
        let (mut chunks, mut failed) = (Vec::new(), Vec::new());
        for ((slot, slice), mut events) in self.groups {
            events.sort_by_cached_key(|(e, _)| e.sort_key());
            events.dedup_by(|later, kept| {
                let same = later.0.sort_key() == kept.0.sort_key();
                if same {
                    kept.1.append(&mut later.1);
                }
                same
            });
            let (events, mut ids): (Vec<ChunkEvent>, Vec<Vec<String>>) = events.into_iter().unzip();
            ids.reverse();
            let place = Place::Slice { slices: self.slices, slice };
            for packed in pack_to_fit(events, MAX_CHUNK_BYTES) {
                match packed {
                    Ok(packed) => {
                        let mut behind: Vec<String> =
                            (0..packed.events.len()).filter_map(|_| ids.pop()).flatten().collect();
                        behind.sort();
                        behind.dedup();
                        match ChunkItem::new(slot, &packed, place, moved_at, retention_days).filter(ChunkItem::fits) {
                            Some(item) => chunks.push((item, behind)),
                            None => failed.extend(behind.into_iter().map(|id| (id, too_large(&packed)))),
                        }
                    }
                    Err((event, err)) => failed.extend(
                        ids.pop()
                            .unwrap_or_default()
                            .into_iter()
                            .map(|id| (id, Error::Malformed(format!("event {}: {err}", event.event_id)))),
                    ),
                }
            }
        }
        (chunks, failed)
    }
}

fn too_large(packed: &crate::chunk::Packed) -> Error {
    Error::Malformed(format!("a chunk of {} events over the item limit", packed.events.len()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::unpack;

    const T: i64 = 1_795_327_124_000;

    fn event(shard: u32, n: i64, key: &str) -> ChunkEvent {
        ChunkEvent {
            event_id: format!("shardId-00000000000{shard}:{n:020}"),
            arrival: T + n,
            partition_key: key.into(),
            data: format!(r#"{{"n":{n},"key":"{key}"}}"#).into_bytes(),
        }
    }

    #[test]
    fn a_pages_events_are_pooled_by_slot_and_slice_each_chunk_one_slice_in_order() {
        let mut pool = Pool::new(1000, 4);
        // Two shards' buffer items, keys spread over every slice, two slots; "b" holds a copy of one of "a"'s events.
        let a: Vec<ChunkEvent> = (0..400).map(|n| event(1, n * 3, &format!("k{}", n % 50))).collect();
        let b: Vec<ChunkEvent> = (0..400).map(|n| event(2, n * 3 + 1, &format!("k{}", n % 50))).collect();
        let copy = a[7].clone();
        pool.add("a", a.clone());
        pool.add("b", b.into_iter().chain([copy.clone()]).collect());
        let (chunks, failed) = pool.chunks(T + 5_000, None);
        assert!(failed.is_empty());
        let mut seen = 0;
        for (chunk, behind) in &chunks {
            let events = unpack(&chunk.bytes).unwrap();
            let slot = slot_of(events[0].arrival, 1000);
            let slice = part_of(key_hash(&events[0].partition_key), 4);
            assert_eq!(chunk.storage_slot, crate::slices::storage_key(slot, 4, slice));
            assert!(events.iter().all(|e| part_of(key_hash(&e.partition_key), 4) == slice));
            assert!(events.iter().all(|e| slot_of(e.arrival, 1000) == slot));
            assert!(events.windows(2).all(|w| w[0].sort_key() < w[1].sort_key()), "in order, the copy once");
            assert_eq!(behind, &vec!["a".to_string(), "b".to_string()], "both shards in each chunk");
            seen += events.len();
        }
        assert_eq!(seen, 800, "every event once");
        assert_eq!(chunks.len(), 8, "one chunk per slot and slice: {}", chunks.len());
    }
}
