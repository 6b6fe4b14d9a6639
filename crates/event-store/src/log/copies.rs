//! Dropping the second copy of an accepted event at read time.
//!
//! `load` gives every accepted event an envelope id. When Kinesis applies a
//! `PutRecord` but answers with a 5xx or the connection drops, the SDK sends
//! it again, and the event is in the stream, and then in the event table,
//! twice: two records of the same partition key, the second arriving within
//! load's timeout of the first. Readers of the log remember the envelope ids
//! of the last `DEDUPE_WINDOW_MS` of arrival time and skip a copy. Pure.

use std::collections::{HashSet, VecDeque};

use serde_json::Value;

/// The envelope id of an event that `load` made (a JSON object with `id`,
/// `received_at` and `method`); events from other producers have none and
/// are never dropped.
pub(crate) fn envelope_id(event: &Value) -> Option<&str> {
    let object = event.as_object()?;
    if !(object.contains_key("received_at") && object.contains_key("method")) {
        return None;
    }
    object.get("id")?.as_str()
}

/// The envelope ids seen in the last `window_ms` of arrival time.
#[derive(Debug, Clone)]
pub struct RecentIds {
    window_ms: i64,
    seen: HashSet<String>,
    by_arrival: VecDeque<(i64, String)>,
}

impl RecentIds {
    pub fn new(window_ms: u64) -> Self {
        Self { window_ms: window_ms as i64, seen: HashSet::new(), by_arrival: VecDeque::new() }
    }

    /// Remembers `id` (arrived at `arrival`, in arrival order); false when it
    /// is a copy of an event seen within the window.
    pub(crate) fn first_sight(&mut self, id: &str, arrival: i64) -> bool {
        while let Some((at, _)) = self.by_arrival.front() {
            if *at >= arrival - self.window_ms {
                break;
            }
            if let Some((_, old)) = self.by_arrival.pop_front() {
                self.seen.remove(&old);
            }
        }
        if self.seen.contains(id) {
            return false;
        }
        self.seen.insert(id.to_owned());
        self.by_arrival.push_back((arrival, id.to_owned()));
        true
    }

    /// True when `event` (its JSON, if any) is a copy of an accepted event
    /// seen within the window; otherwise it is remembered (see [`Self::first_sight`]).
    pub(crate) fn is_copy(&mut self, event: Option<&Value>, arrival: i64) -> bool {
        event.and_then(envelope_id).is_some_and(|id| !self.first_sight(id, arrival))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.seen.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_within_the_window_is_dropped_and_memory_stays_bounded() {
        let mut ids = RecentIds::new(10_000);
        assert!(ids.first_sight("a", 1_000));
        assert!(ids.first_sight("b", 2_000));
        assert!(!ids.first_sight("a", 9_000), "the SDK's retry of an applied put");
        assert!(ids.first_sight("c", 12_500));
        assert_eq!(ids.len(), 1, "a and b are forgotten once out of the window");
        assert!(ids.first_sight("a", 12_600), "beyond the window it is an event of its own");
    }

    #[test]
    fn only_loads_envelopes_have_an_id_to_drop_by() {
        let envelope = serde_json::json!({"id": "e1", "received_at": "2026-11-22T00:00:00.000Z", "method": "GET"});
        assert_eq!(envelope_id(&envelope), Some("e1"));
        assert_eq!(envelope_id(&serde_json::json!({"id": "order-7", "total": 3})), None, "someone else's id field");
        assert_eq!(envelope_id(&serde_json::json!([1])), None);
    }
}
