//! Where a playback stands, saved under its id in the bookkeeping partition
//! (`playback#<id>`) after every put, so the same request again, or the
//! continuation handed over near the deadline, starts from it.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use serde::{Deserialize, Serialize};

use crate::bookkeeping;
use crate::error::{Error, Result};
use crate::event_item::sort_key_floor;

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
}

impl Checkpoint {
    /// The position of a run about to read `slot` from its start.
    pub fn at_slot(slot: i64) -> Self {
        Self { slot, ..Self::default() }
    }

    /// The part of the log just before this position a run reads first, to
    /// know the envelope ids already delivered (`dedupe::RecentIds`): sort
    /// keys from `lookback_ms` before the position up to it (both inclusive,
    /// for a `BETWEEN`), and the slot that range starts in's first ms.
    pub fn lookback(&self, window_start: i64, lookback_ms: u64) -> Lookback {
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
    pub fn is_past(&self, other: &Checkpoint) -> bool {
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

/// The checkpoint's fields live in one map attribute (its `slot` would clash with the key's).
const CHECKPOINT: &str = "checkpoint";

fn key(id: &str) -> HashMap<String, AttributeValue> {
    bookkeeping::key(format!("playback#{id}"))
}

pub async fn save(dynamo: &aws_sdk_dynamodb::Client, table: &str, id: &str, checkpoint: &Checkpoint) -> Result<()> {
    let fields = serde_dynamo::to_item::<_, HashMap<String, AttributeValue>>(checkpoint)
        .map_err(|e| Error::encode("checkpoint", e))?;
    let mut item = key(id);
    item.insert(CHECKPOINT.to_owned(), AttributeValue::M(fields));
    dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("PutItem", e))?;
    Ok(())
}

pub async fn load(dynamo: &aws_sdk_dynamodb::Client, table: &str, id: &str) -> Result<Option<Checkpoint>> {
    let out = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key(id)))
        .consistent_read(true)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    out.item()
        .and_then(|item| item.get(CHECKPOINT))
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
