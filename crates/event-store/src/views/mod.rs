//! Read models kept from the log (projections). A projection follows the
//! sealed log as a subscription does (it is one, whose target is its view)
//! and folds each partition's events into items of the views table. Each
//! batch's items and the partition's position are written in one
//! `TransactWriteItems` conditioned on the position it read ([`table`]), so
//! a retry, a crash or a second delivery never applies an event twice or
//! skips one.
//!
//! Here: what a projection is to the store (the [`Projection`] trait, the
//! event it sees, what it changes), which view a version writes
//! ([`ViewRef`]) and the views table's keys. Built-in projections are in
//! [`builtin`], the pure planning of a batch's transactions in `fold`.

pub mod builtin;
pub(crate) mod fold;
pub mod http;
pub mod lambda;
pub mod query;
pub mod registry;
pub mod table;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::envelope::{entity_stream, ENTITY_ID};
use crate::position::Position;
use crate::slices::{key_hash, part_of};

/// The views table's hash key: which projection, version and bucket (see [`ViewRef::bucket_key`]).
pub const HASH_KEY: &str = "view";
/// The views table's range key: the view's own key (a stream name, a counter's key).
pub const RANGE_KEY: &str = "key";

/// An event as a projection sees it: the record a subscription delivers
/// (the envelope, opened), where it is in the log, and whether it is a
/// parked event delivered again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewEvent {
    pub position: Position,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redriven: bool,
    pub event_id: String,
    /// Arrival (ms).
    pub event_ms: i64,
    pub partition_key: String,
    /// The envelope (`body`, `query`, `headers`, …), when the event is JSON.
    #[serde(default)]
    pub data: Option<Value>,
}

/// An entity stream's event, as the relay put it in the log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EntityEvent<'a> {
    pub stream: &'a str,
    pub version: u64,
    pub event_type: &'a str,
    pub data: &'a Value,
    /// In place of `data` once the stream's subject is forgotten: when, and the key's generation.
    pub forgotten: Option<&'a Value>,
}

/// The one field of a view item's state once its subject is forgotten (`forget`), with when.
pub const FORGOTTEN: &str = "$forgotten";

/// Events a partition of a built-in projection folds at once (a function's gets a
/// subscription's 500, a Lambda's batch). Folded in this process, a batch is bounded by the
/// runner's memory and cut at 6 MB; the larger it is, the more of a counter's adds share one
/// write and the fewer transactions (each a position write) a partition makes.
pub const BUILTIN_BATCH: usize = 5_000;

/// The forgotten marker a state holds instead of the subject's data, if it does.
pub fn forgotten(state: &Value) -> Option<&Value> {
    state.get(FORGOTTEN)
}

impl ViewEvent {
    /// The posted JSON or the entity event's fields (`stream`, `version`, `type`, `data`, …).
    pub fn body(&self) -> Option<&Value> {
        self.data.as_ref()?.get("body").filter(|b| !b.is_null())
    }

    /// The entity event this is, when it is one.
    pub fn entity(&self) -> Option<EntityEvent<'_>> {
        entity_stream(&self.partition_key)?;
        let body = self.body()?;
        Some(EntityEvent {
            stream: body.get(ENTITY_ID).or_else(|| body.get("stream"))?.as_str()?,
            version: body.get("version")?.as_u64()?,
            event_type: body.get("type").and_then(Value::as_str).unwrap_or_default(),
            data: body.get("data").unwrap_or(&Value::Null),
            forgotten: body.get("forgotten").filter(|f| !f.is_null()),
        })
    }

    /// An entity event's `type`, or a posted event's `type` field.
    pub fn event_type(&self) -> Option<&str> {
        self.body()?.get("type")?.as_str()
    }

    /// A top-level field of the envelope (`path`, `subject`, …).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.data.as_ref()?.get(name)?.as_str()
    }
}

/// What a projection does to one view item.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The item's new state.
    Put(Value),
    /// The item goes.
    Delete,
    /// Nothing changes.
    Keep,
}

/// A read model kept from the log. The store reads the item an event's
/// [`key`](Projection::key) names, calls [`apply`](Projection::apply) in log
/// order (per key, the order its events were appended), and writes the
/// results with the position, once; [`tallies`](Projection::tallies) add to
/// counters without reading them (they commute, so any partition may add
/// to any counter). Keep both pure: the store may call them again for an
/// event whose transaction it retries. A key's state events should all have
/// one partition key (an entity stream's, a visitor's): then one partition
/// owns the item, and writes never contend.
pub trait Projection: Send + Sync {
    /// The item `event` changes, if any.
    fn key(&self, event: &ViewEvent) -> Option<String>;

    /// The item's next state after `event`, from its state now (`None`: no
    /// item). An `Err` is the event's fault: after retries it is parked, as
    /// a subscription parks what its target refuses.
    fn apply(&self, state: Option<&Value>, event: &ViewEvent) -> std::result::Result<Change, String>;

    /// Counters `event` adds to, by key, and how much.
    fn tallies(&self, _event: &ViewEvent) -> Vec<(String, i64)> {
        Vec::new()
    }
}

/// One version of a projection's view: where its items and positions live.
/// The items are spread over `buckets` hash keys (a key's bucket is its
/// hash's part), so no projection is one hot partition of the table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewRef {
    pub projection: String,
    pub version: u32,
    pub buckets: u32,
    /// Made with the version: part of every key of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

impl ViewRef {
    /// The bucket `key` is in.
    pub(crate) fn bucket(&self, key: &str) -> u32 {
        part_of(key_hash(key), self.buckets.max(1))
    }

    /// The hash key of bucket `bucket` of this view.
    pub(crate) fn bucket_key(&self, bucket: u32) -> String {
        format!("{}#b{bucket}", self.prefix())
    }

    /// The hash key of the item `key`.
    pub(crate) fn item_key(&self, key: &str) -> String {
        self.bucket_key(self.bucket(key))
    }

    /// The hash key of a partition's position: one item each, so positions
    /// of many partitions written at once are not one hot key.
    pub(crate) fn position_key(&self, partition: u32) -> String {
        format!("{}#p{partition}", self.prefix())
    }

    /// The hash key of the markers of events a redrive applied in a partition (out of the log's order).
    pub(crate) fn redriven_key(&self, partition: u32) -> String {
        format!("{}#r{partition}", self.prefix())
    }

    /// What every key of this version starts with: the projection, the version and its instance
    /// (made when the version was, so a version number given again never meets an old one's items).
    fn prefix(&self) -> String {
        match &self.instance {
            Some(instance) => format!("{}#v{}.{instance}", self.projection, self.version),
            None => format!("{}#v{}", self.projection, self.version),
        }
    }
}

/// The range key of a partition's position item.
pub const POSITION_ITEM: &str = "position";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn event(partition_key: &str, ms: i64, data: Value) -> ViewEvent {
        ViewEvent {
            position: Position { slot: ms - ms % 1000, sort_key: format!("{ms:013}#s#{partition_key}") },
            redriven: false,
            event_id: format!("e{ms}"),
            event_ms: ms,
            partition_key: partition_key.into(),
            data: Some(data),
        }
    }

    #[test]
    fn entity_events_are_read_from_the_relayed_envelope() {
        let relayed = event(
            "streams/todo-1",
            5,
            json!({"id": "todo-1/3", "path": "/streams/todo-1", "body": {"stream": "todo-1", "EntityId": "todo-1", "version": 3, "type": "done", "data": {"done": true}}}),
        );
        let entity = relayed.entity().unwrap();
        assert_eq!((entity.stream, entity.version, entity.event_type), ("todo-1", 3, "done"));
        assert_eq!(entity.data, &json!({"done": true}));
        let posted =
            event("v-9", 6, json!({"path": "/events", "body": {"type": "signup", "stream": "x", "version": 1}}));
        assert!(posted.entity().is_none(), "only the entity streams' keys are entity events");
        assert_eq!(posted.event_type(), Some("signup"));
    }

    #[test]
    fn views_spread_items_over_their_buckets_and_keep_positions_apart() {
        let view = ViewRef { projection: "pages".into(), version: 2, buckets: 8, instance: None };
        let buckets: std::collections::BTreeSet<u32> = (0..200).map(|i| view.bucket(&format!("k{i}"))).collect();
        assert_eq!(buckets.len(), 8, "200 keys reach every bucket");
        assert!(view.item_key("k1").starts_with("pages#v2#b"));
        assert_eq!(view.position_key(3), "pages#v2#p3");
        let made = ViewRef { instance: Some("1a2b".into()), ..view.clone() };
        assert_eq!(
            (made.position_key(3), made.redriven_key(0)),
            ("pages#v2.1a2b#p3".into(), "pages#v2.1a2b#r0".into())
        );
        assert!(made.item_key("k1").starts_with("pages#v2.1a2b#b"), "an instance's keys are its own");
        let one = ViewRef { buckets: 0, ..view };
        assert_eq!(one.bucket("anything"), 0, "no buckets is one");
    }
}
