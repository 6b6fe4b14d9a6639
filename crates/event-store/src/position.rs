//! Where a reader of the complete log stands: every event before a slot,
//! and in it up to a sort key, delivered; the sequence number the next
//! delivered record gets. Playback runs, subscription partitions and the
//! lease items that hold them all keep one, so the concept sits below them;
//! with it, its stored form (one map attribute of the item that holds it).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::event_item::sort_key_floor;
use crate::time::slot_of;

/// Every event before `slot`, and in `slot` up to and including sort key
/// `after`, is on the stream; the next record gets `seq`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub slot: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    pub seq: u64,
    /// Records put so far by this playback.
    #[serde(default)]
    pub events: u64,
    #[serde(default)]
    pub done: bool,
    /// A subscription's delivery to a Kinesis target was cut short after
    /// storing some events past this position, with puts from this time
    /// (ms) on: the next delivery reads them back and puts only the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ahead_since: Option<i64>,
}

impl Checkpoint {
    /// The position of a run about to read `slot` from its start.
    pub fn at_slot(slot: i64) -> Self {
        Self { slot, ..Self::default() }
    }

    /// The position before the first event that arrived at or after `ms`: in
    /// its slot, after the sort-key floor of `ms` (every real key is longer).
    pub(crate) fn starting_at(ms: i64, unit: u64) -> Self {
        Self { slot: slot_of(ms, unit), after: Some(sort_key_floor(ms)), ..Self::default() }
    }

    /// The part of the log just before this position a run reads first, to
    /// know the envelope ids already delivered (`log::copies::RecentIds`): sort
    /// keys from `lookback_ms` before the position up to it (both inclusive,
    /// for a `BETWEEN`), and the slot that range starts in's first ms.
    pub(crate) fn lookback(&self, window_start: i64, lookback_ms: u64) -> Lookback {
        let (to_key, to_ms) = match &self.after {
            Some(key) => (key.clone(), key.get(..13).and_then(|ms| ms.parse().ok()).unwrap_or(self.slot)),
            // Before this slot (or the window's start): everything earlier, nothing of it.
            None => {
                let ms = self.slot.max(window_start);
                (sort_key_floor(ms), ms)
            }
        };
        let from_ms = (to_ms - lookback_ms as i64).max(0);
        Lookback { from_ms, from_key: sort_key_floor(from_ms), to_key }
    }

    /// True when this position is further into the window than `other`.
    #[cfg(test)]
    pub(crate) fn is_past(&self, other: &Checkpoint) -> bool {
        (self.slot, &self.after) > (other.slot, &other.after)
    }
}

/// A range of the log read before a run starts (see [`Checkpoint::lookback`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookback {
    pub from_ms: i64,
    pub from_key: String,
    pub to_key: String,
}

/// An event's place in the event table (and so in the log): its slot and
/// sort key. Positions order as the log does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Position {
    pub slot: i64,
    pub sort_key: String,
}

/// The checkpoint's fields live in one map attribute (its `slot` would clash with the key's).
pub const CHECKPOINT: &str = "checkpoint";

pub(crate) fn checkpoint_value(checkpoint: &Checkpoint) -> Result<AttributeValue> {
    serde_dynamo::to_item::<_, HashMap<String, AttributeValue>>(checkpoint)
        .map(AttributeValue::M)
        .map_err(|e| Error::encode("checkpoint", e))
}

/// The checkpoint stored in an item, if any.
pub(crate) fn checkpoint_of(item: &HashMap<String, AttributeValue>) -> Result<Option<Checkpoint>> {
    item.get(CHECKPOINT)
        .and_then(|value| value.as_m().ok())
        .map(|fields| serde_dynamo::from_item(fields.clone()).map_err(|e| Error::Malformed(format!("checkpoint: {e}"))))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_compare_by_slot_then_sort_key() {
        let at = |slot, after: Option<&str>| Checkpoint { slot, after: after.map(str::to_owned), ..Default::default() };
        assert!(at(2000, None).is_past(&at(1000, Some("z"))));
        assert!(at(1000, Some("b")).is_past(&at(1000, Some("a"))));
        assert!(at(1000, Some("a")).is_past(&at(1000, None)), "inside a slot is past its start");
        assert!(!at(1000, None).is_past(&at(1000, None)));
    }

    #[test]
    fn the_lookback_ends_at_the_position_and_reaches_back_the_dedupe_window() {
        use crate::event_item::sort_key;
        let resumed = Checkpoint { slot: 5_000, after: Some(sort_key(5_400, "s:7")), ..Checkpoint::default() };
        let range = resumed.lookback(1_000, 2_000);
        assert_eq!(range.from_ms, 3_400);
        assert!(range.from_key <= sort_key(3_400, "s:1") && range.from_key > sort_key(3_399, "s:9"));
        assert_eq!(range.to_key, sort_key(5_400, "s:7"), "up to the last event delivered, included");
        let fresh = Checkpoint::at_slot(5_000).lookback(5_250, 2_000);
        assert_eq!(fresh.from_ms, 3_250);
        assert!(fresh.to_key < sort_key(5_250, "s:1") && fresh.to_key > sort_key(5_249, "s:9"), "before the window");
    }
}
