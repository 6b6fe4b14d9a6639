//! Entity streams, the pure part: names, the events a client appends, the
//! expected version, and the kinds of item a stream is stored as.
//!
//! One partition key per stream (`stream`), three kinds of sort key (`item`)
//! for its events, and bookkeeping below them (`_…`: request records here,
//! the relay's and the pump's positions in [`crate::bookkeeping::entity_positions`]):
//! - `e<first version, 12 digits>`: a **batch**, the events of one append (1 to
//!   100), so an append is atomic by construction and costs one item, not one per event;
//! - `snapshot`: the latest snapshot (a state folded up to a version);
//! - `tip`: the stream's current version (what appends are conditional on),
//!   whether it was deleted, and the last append's request key.
//!
//! The sort keys sort `_…` < `e…` < `snapshot` < `tip`, so one backward
//! `Query` from `e…` up returns the tip, the snapshot and the latest batches:
//! loading an entity whose snapshot is recent is one request.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::crypto::Sealed;
use crate::offload::OffloadRef;
use crate::time::format_ms;
use crate::trace::TraceContext;

/// The entity table's key attributes: the stream name, and `e<version>`,
/// `snapshot`, `tip` or a bookkeeping item (`_…`).
pub use crate::bookkeeping::entity_positions::{HASH_KEY, RANGE_KEY};
/// Sort key of the tip item.
pub const TIP: &str = "tip";
/// Sort key of the snapshot item.
pub const SNAPSHOT: &str = "snapshot";
/// Events in one append (one request, one batch item).
pub const MAX_EVENTS_PER_APPEND: usize = 100;
/// One event (type, data, metadata and id as stored): 64 KiB.
pub const MAX_EVENT_BYTES: usize = 64 * 1024;
/// All events of one append: a batch item must stay under DynamoDB's 400 KB,
/// and the relay's Kinesis records under 1 MiB each.
pub const MAX_APPEND_BYTES: usize = 300 * 1024;
/// A snapshot's state, for the same reason.
pub const MAX_SNAPSHOT_BYTES: usize = 300 * 1024;
/// Stream names: 1 to 256 bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// A stream created from now on: 1 to 248 bytes, so that `streams/<name>`
/// is a Kinesis partition key (at most 256), the key of its events in the
/// log. Older streams keep their longer names (`envelope::entity_key`).
pub const MAX_NEW_NAME_BYTES: usize = 248;
/// Event types: 1 to 256 bytes.
pub const MAX_TYPE_BYTES: usize = 256;
/// Versions are written with this many digits (sort keys must sort as numbers).
const VERSION_DIGITS: usize = 12;
/// The highest version a stream may reach.
pub const MAX_VERSION: u64 = 999_999_999_999;
pub use crate::envelope::STREAM_DELETED;
pub(crate) use prepare::check;
pub use prepare::{prepare, Limits, MAX_INLINE_EVENT};

mod prepare;

/// Why a request cannot be acted on; the message is safe to show the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    TooLarge(String),
}

/// Characters allowed in a stream name besides ASCII letters and digits.
/// No `/`, `?`, `#`, `%` or space: a name is one URL path segment as it is.
pub const NAME_PUNCTUATION: &str = "-_.:@+=~";

/// Checks a stream name: 1 to 256 bytes of `[A-Za-z0-9]` and [`NAME_PUNCTUATION`].
pub fn check_name(name: &str) -> Result<(), Invalid> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(Invalid::BadRequest(format!("a stream name is 1 to {MAX_NAME_BYTES} bytes")));
    }
    if let Some(c) = name.chars().find(|c| !c.is_ascii_alphanumeric() && !NAME_PUNCTUATION.contains(*c)) {
        return Err(Invalid::BadRequest(format!(
            "stream names use letters, digits and {NAME_PUNCTUATION:?}; {c:?} is not allowed"
        )));
    }
    Ok(())
}

/// What the writer believes about the stream, checked atomically by the append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// Append at the end, whatever the version (still a conditional write,
    /// on the version just read, retried on a race).
    Any,
    /// The stream must not exist yet (`If-None-Match: *`).
    NoStream,
    /// The stream's current version must be exactly this (`If-Match`).
    Version(u64),
}

impl Expected {
    /// The version the first appended event gets if the expectation holds.
    pub(crate) fn first_version(self) -> Option<u64> {
        match self {
            Expected::Any => None,
            Expected::NoStream => Some(0),
            // Past any stream's versions: refused as such, not wrapped around.
            Expected::Version(v) => Some(v.saturating_add(1)),
        }
    }
}

/// One event a client appends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewEvent {
    /// Client-chosen UUID: sending the same request again is then idempotent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<uuid::Uuid>,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The version of `data`'s shape (1 when absent), which upcasters go by (`entity::upcast`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
    /// The request's W3C trace context (its `traceparent` header), not a field of the JSON.
    #[serde(skip)]
    pub trace: Option<TraceContext>,
}

impl NewEvent {
    pub fn new(event_type: impl Into<String>, data: Value) -> Self {
        Self { id: None, event_type: event_type.into(), data, metadata: None, schema_version: None, trace: None }
    }
}

/// Parses a request body: one event object or an array of 1 to 100.
pub(crate) fn parse_events(body: &[u8]) -> Result<Vec<NewEvent>, Invalid> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| Invalid::BadRequest(format!("malformed JSON at line {} column {}", e.line(), e.column())))?;
    let items = match value {
        Value::Array(items) => items,
        object @ Value::Object(_) => vec![object],
        _ => return Err(Invalid::BadRequest("expected an event object or an array of events".into())),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value::<NewEvent>(item).map_err(|e| Invalid::BadRequest(format!("event {i}: {e}")))
        })
        .collect()
}

/// An event as stored in a batch item (data and metadata as JSON text, so any
/// JSON, numbers included, comes back exactly as sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredEventItem {
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
    /// In place of `data` (then `null`), when the event was larger than
    /// `INLINE_MAX_BYTES`: where the data is stored ([`crate::offload`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_ref: Option<OffloadRef>,
    /// The stream's data subject, as a keyed hash, when its data is sealed ([`crate::privacy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// In place of `data` (then `null`): the data sealed under the subject's key. An offloaded
    /// sealed event has its sealed block in S3 (`data_ref`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Sealed>,
    /// Its data's schema version when not 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
    /// The W3C trace context of the request that appended it, in the clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

impl StoredEventItem {
    /// Its size as the limits count it.
    pub(crate) fn size(&self) -> usize {
        self.id.len()
            + self.event_type.len()
            + self.payload_len()
            + self.metadata.as_ref().map_or(0, String::len)
            + self.trace.as_ref().map_or(0, TraceContext::size)
    }

    /// What offloading moves to S3: its data, or its sealed block.
    pub(crate) fn payload_len(&self) -> usize {
        self.data.len() + self.sealed.as_ref().map_or(0, |s| s.c.len() + s.n.len() + 16)
    }
}

/// The key of a request for idempotency: a hash of its event ids, in order.
pub(crate) fn request_key(events: &[StoredEventItem]) -> String {
    let mut hasher = Sha256::new();
    for event in events {
        hasher.update(event.id.as_bytes());
        hasher.update([0]);
    }
    hex::encode(&hasher.finalize()[..16])
}

/// Sort keys of a stream's bookkeeping items start with this: below every
/// batch key (`e…`), so reads of its events never meet them.
pub const BOOKKEEPING_PREFIX: char = '_';

/// Sort key of the record of an applied request (`_req#<request key>`): a
/// retry of that request, whatever was appended since, answers the original
/// versions and writes nothing (KurrentDB's idempotence by event ids).
pub(crate) fn request_item_key(request: &str) -> String {
    format!("{BOOKKEEPING_PREFIX}req#{request}")
}

/// The record of an applied request: where its events went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestItem {
    pub stream: String,
    pub item: String,
    pub first: u64,
    pub last: u64,
    pub at: i64,
    /// For an append across streams (recorded in its first stream): JSON text of
    /// every stream's `[{"stream", "first", "last"}]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across: Option<String>,
}

/// The id of the event `DELETE` appends: fixed per stream, so a retried
/// `DELETE` is recognized as the same request.
pub(crate) fn deleted_event(stream: &str) -> StoredEventItem {
    let digest = Sha256::digest(format!("{stream}\0{STREAM_DELETED}").as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    let id = uuid::Builder::from_random_bytes(bytes).into_uuid();
    StoredEventItem {
        id: id.to_string(),
        event_type: STREAM_DELETED.into(),
        data: "{}".into(),
        metadata: None,
        data_ref: None,
        subject: None,
        sealed: None,
        schema_version: None,
        trace: None,
    }
}

/// Sort key of the batch whose first event has `version`.
pub fn batch_key(version: u64) -> String {
    format!("e{version:0width$}", width = VERSION_DIGITS)
}

/// The version a batch sort key starts at (`None` for the tip and the snapshot).
pub(crate) fn batch_version(key: &str) -> Option<u64> {
    key.strip_prefix('e')?.parse().ok()
}

/// The tip: the item every append is conditional on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tip {
    pub stream: String,
    pub item: String,
    /// The version of the last event (events count from 0).
    pub version: u64,
    /// Absent until `DELETE` (appends are conditional on its absence).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// [`request_key`] of the last append, with where it started.
    #[serde(default)]
    pub last_request: Option<String>,
    #[serde(default)]
    pub last_first: Option<u64>,
    pub updated_at: i64,
    /// The version of its metadata (`entity::metadata`), absent until first set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_version: Option<u64>,
    /// What of its history reads still show (JSON text of a `Retention`), absent: all of it.
    /// A leaf attribute, so the relay's event filter can select the tips that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<String>,
    /// Where the relay's next cleanup step starts: versions below it have left the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trimmed: Option<u64>,
}

/// The events of one append.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub stream: String,
    pub item: String,
    /// Version of the first event; the others follow without gaps.
    pub first: u64,
    /// Milliseconds since the epoch: when the append was made.
    pub at: i64,
    /// The events, as one JSON array in one string attribute: a DynamoDB list of
    /// maps would count every field name of every event against the item's
    /// size, and is far slower to decode.
    #[serde(with = "json_text")]
    pub events: Vec<StoredEventItem>,
}

/// A value stored as its JSON text.
mod json_text {
    use serde::de::{DeserializeOwned, Error as _};
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<T: Serialize, S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
        let text = serde_json::to_string(value).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(&text)
    }

    pub(crate) fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(deserializer: D) -> Result<T, D::Error> {
        let text = String::deserialize(deserializer)?;
        serde_json::from_str(&text).map_err(D::Error::custom)
    }
}

impl Batch {
    pub(crate) fn last(&self) -> u64 {
        self.first + self.events.len() as u64 - 1
    }

    /// The batch's events with their versions, as readers see them.
    pub(crate) fn read(&self) -> impl Iterator<Item = RecordedEvent> + '_ {
        self.events
            .iter()
            .enumerate()
            .map(|(i, e)| RecordedEvent::from_stored(&self.stream, self.first + i as u64, self.at, e))
    }

    /// True when this batch holds exactly these events (by id): the same request.
    pub(crate) fn holds(&self, events: &[StoredEventItem]) -> bool {
        self.events.len() == events.len() && self.events.iter().zip(events).all(|(a, b)| a.id == b.id)
    }
}

/// The latest snapshot of a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotItem {
    pub stream: String,
    pub item: String,
    /// The version the state was folded up to (included).
    pub version: u64,
    /// The state, JSON text (`null` when sealed).
    pub state: String,
    pub at: i64,
    /// The state sealed under the stream's subject's key, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Sealed>,
}

/// An event read back from a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEvent {
    pub stream: String,
    pub version: u64,
    pub id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub data: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// When it was appended (RFC 3339, ms).
    pub time: String,
    /// Where `data` is stored, when it was offloaded (`data` is then `null`
    /// until a reader puts it back; the log carries the reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_ref: Option<OffloadRef>,
    /// The stream's data subject (a keyed hash), when its data is sealed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The data, sealed (`data` is `null` until a reader opens it; the log carries it sealed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Sealed>,
    /// In place of `data` once the subject is forgotten: when, and the key's generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forgotten: Option<Value>,
    /// Its data's schema version when not 1 (as stored, or as upcast).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<u32>,
    /// The W3C trace context of the request that appended it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

impl RecordedEvent {
    fn from_stored(stream: &str, version: u64, at: i64, e: &StoredEventItem) -> Self {
        // Stored by this code from parsed JSON: it parses back. Anything else shows as a string, not a failure.
        let parse = |text: &str| serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()));
        RecordedEvent {
            stream: stream.to_owned(),
            version,
            id: e.id.clone(),
            event_type: e.event_type.clone(),
            data: parse(&e.data),
            metadata: e.metadata.as_deref().map(parse),
            time: format_ms(at),
            data_ref: e.data_ref.clone(),
            subject: e.subject.clone(),
            sealed: e.sealed.clone(),
            forgotten: None,
            schema_version: e.schema_version,
            trace: e.trace.clone(),
        }
    }
}

/// The item kinds of a stream, decoded from whatever a query returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamItem {
    Tip(Tip),
    Snapshot(SnapshotItem),
    Batch(Batch),
    /// A stream's bookkeeping (`_relay`, `_log`: [`crate::bookkeeping::entity_positions`]; `_req#…`:
    /// [`RequestItem`]), not part of its events.
    Bookkeeping,
}

impl StreamItem {
    pub(crate) fn decode(item: HashMap<String, AttributeValue>) -> Result<Self, crate::Error> {
        let key = match item.get(RANGE_KEY) {
            Some(AttributeValue::S(key)) => key.clone(),
            _ => return Err(crate::Error::Malformed("entity item without a sort key".into())),
        };
        let malformed = |e: serde_dynamo::Error| crate::Error::Malformed(format!("entity item {key}: {e}"));
        Ok(match key.as_str() {
            TIP => StreamItem::Tip(serde_dynamo::from_item(item).map_err(malformed)?),
            SNAPSHOT => StreamItem::Snapshot(serde_dynamo::from_item(item).map_err(malformed)?),
            _ if key.starts_with(BOOKKEEPING_PREFIX) => StreamItem::Bookkeeping,
            _ => StreamItem::Batch(serde_dynamo::from_item(item).map_err(malformed)?),
        })
    }
}

#[cfg(test)]
mod tests;
