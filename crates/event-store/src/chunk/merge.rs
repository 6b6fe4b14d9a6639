//! Reading a slot back: its chunks, from one or more sub-keys, merged into
//! its events in sort-key order, each once.

use super::first_key_of;
use crate::event_item::EventItem;

/// Merges the chunks of one slot, read key-ordered from one or more
/// sub-keys, into its events in sort-key order, each once, within
/// `(after, to]`.
///
/// Each source (a sub-key's query) returns chunks in the order of their
/// first event. Once a source's page ends at a chunk starting at key `f`,
/// nothing it returns later starts before `f`; so every event at or before
/// the lowest such `f` over the sources still being read is final and can be
/// handed out. Events at or before the last one handed out are copies
/// (equal sort keys) or outside the range, and are dropped.
#[derive(Debug)]
pub struct SlotMerge {
    /// Per source: the first key of the last chunk read, or `None` once it is exhausted.
    frontiers: Vec<Option<String>>,
    pending: Vec<EventItem>,
    /// Events at or before this key are dropped (the last handed out, or where reading resumes).
    after: Option<String>,
    /// Events after this key are outside the range.
    to: String,
    /// Copies dropped so far (an event read twice, from chunks cut differently).
    pub copies: usize,
}

impl SlotMerge {
    /// A merge over `sources` sources, handing out events in `(after, to]`.
    pub(crate) fn new(sources: usize, after: Option<String>, to: String) -> Self {
        Self { frontiers: vec![Some(String::new()); sources], pending: Vec::new(), after, to, copies: 0 }
    }

    /// Adds a page of source `source`: its items' events, and whether the source has more.
    pub(crate) fn add(&mut self, source: usize, events: Vec<EventItem>, last_item_key: Option<&str>, more: bool) {
        self.pending.extend(events);
        self.frontiers[source] = more.then(|| last_item_key.map(|k| first_key_of(k).to_owned()).unwrap_or_default());
    }

    /// The source to read next: the one whose frontier is lowest, if any is still being read.
    pub(crate) fn next_source(&self) -> Option<usize> {
        self.frontiers.iter().enumerate().filter_map(|(i, f)| f.as_ref().map(|f| (f, i))).min().map(|(_, i)| i)
    }

    pub(crate) fn is_done(&self) -> bool {
        self.frontiers.iter().all(Option::is_none)
    }

    /// The events that are now final, in order, copies dropped.
    pub(crate) fn ready(&mut self) -> Vec<EventItem> {
        let bound = self.frontiers.iter().flatten().min().cloned();
        self.pending.sort_by(|a, b| a.sort_key.cmp(&b.sort_key));
        let split = match &bound {
            Some(bound) => self.pending.partition_point(|e| e.sort_key <= *bound),
            None => self.pending.len(),
        };
        let mut out = Vec::with_capacity(split);
        for event in self.pending.drain(..split) {
            if let Some(after) = &self.after {
                if event.sort_key <= *after {
                    // Equal: the same event again, from a chunk cut at other boundaries.
                    if event.sort_key == *after {
                        self.copies += 1;
                    }
                    continue;
                }
            }
            if event.sort_key > self.to {
                continue;
            }
            self.after = Some(event.sort_key.clone());
            out.push(event);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::chunk_key;
    use crate::chunk::tests::event;

    fn items(ns: &[i64]) -> Vec<EventItem> {
        ns.iter().map(|&n| event(n).into_event_item(0)).collect()
    }

    fn keys(events: &[EventItem]) -> Vec<i64> {
        events.iter().map(|e| e.arrival - 1_795_240_724_000).collect()
    }

    #[test]
    fn a_merge_hands_out_each_event_once_in_order_only_when_final() {
        // Two sources; source 0 pages: chunk [1,4,7] then chunk [2,8]; source 1: chunk [3,5,6] then [7,9] (7 again).
        let top = event(1000).sort_key();
        let mut merge = SlotMerge::new(2, None, top);
        let key = |a: i64, b: i64| chunk_key(&event(a).sort_key(), &event(b).sort_key());
        merge.add(0, items(&[1, 4, 7]), Some(&key(1, 7)), true);
        merge.add(1, items(&[3, 5, 6]), Some(&key(3, 6)), true);
        assert_eq!(keys(&merge.ready()), vec![1], "source 0 may still hold anything from 1 on");
        assert_eq!(merge.next_source(), Some(0));
        merge.add(0, items(&[2, 8]), Some(&key(2, 8)), false);
        assert_eq!(keys(&merge.ready()), vec![2, 3]);
        assert_eq!(merge.next_source(), Some(1));
        merge.add(1, items(&[7, 9]), Some(&key(7, 9)), false);
        assert!(merge.is_done());
        assert_eq!(keys(&merge.ready()), vec![4, 5, 6, 7, 8, 9]);
        assert_eq!(merge.copies, 1, "7 was in two chunks");
    }

    #[test]
    fn a_merge_keeps_to_its_range() {
        let mut merge = SlotMerge::new(1, Some(event(3).sort_key()), event(6).sort_key());
        merge.add(0, items(&[1, 2, 3, 4, 5, 6, 7]), None, false);
        assert_eq!(keys(&merge.ready()), vec![4, 5, 6]);
    }
}
