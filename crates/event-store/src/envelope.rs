//! The event envelope: what `load` makes of an HTTP request and puts on the
//! event stream as JSON. Pure: built from plain values, no HTTP types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::IpMode;
use crate::crypto::Sealed;
use crate::error::{Error, Result};
use crate::offload::OffloadRef;
use crate::trace::TraceContext;

/// Query parameter or body field naming the entity an event belongs to; it
/// becomes the Kinesis partition key, so one entity's events stay in order.
pub const ENTITY_ID: &str = "EntityId";
/// Query parameter or body field with the client's own id of an event: a
/// retry with the same id (and `EntityId`) is one event in the log.
pub const EVENT_ID: &str = "EventId";
/// A client's event id: 1 to 64 of `A-Z a-z 0-9 . _ : -` (a UUID, a ULID, a
/// nanoid), so it can never reach into the entity streams' key namespace.
pub const MAX_EVENT_ID_CHARS: usize = 64;
/// The pump keeps a marker of each client event it buffered in the entity
/// table, under the partition `ids/<envelope id>`.
pub const CLIENT_ID_MARKER_PREFIX: &str = "ids/";
/// Kinesis partition keys are 1 to 256 characters.
pub const MAX_PARTITION_KEY_CHARS: usize = 256;
/// Entity events' partition keys start with this, and ingest refuses an
/// `EntityId` that does: an anonymous hit can never pass for an entity
/// event, and `partition_key = streams/<name>` selects exactly one stream.
/// Stream names hold no `/`, so the key names one stream.
pub const ENTITY_KEY_PREFIX: &str = "streams/";

/// The type of the event `DELETE` appends.
pub const STREAM_DELETED: &str = "StreamDeleted";

/// The partition key of entity stream `stream`'s events in the log. Names
/// are at most 248 bytes, so the key fits Kinesis' 256; a longer name (from
/// before that limit) is cut and completed with a hash of the whole.
pub fn entity_key(stream: &str) -> String {
    let key = format!("{ENTITY_KEY_PREFIX}{stream}");
    if key.len() <= MAX_PARTITION_KEY_CHARS {
        return key;
    }
    let digest = hex::encode(&Sha256::digest(stream.as_bytes())[..8]);
    format!("{}#{digest}", &key[..MAX_PARTITION_KEY_CHARS - 17])
}

/// The entity stream a partition key is in the namespace of, if any.
pub fn entity_stream(partition_key: &str) -> Option<&str> {
    partition_key.strip_prefix(ENTITY_KEY_PREFIX)
}

/// The envelope id of an entity event in the log: unique per (stream, version).
pub fn entity_event_id(stream: &str, version: u64) -> String {
    format!("{stream}/{version}")
}

/// The stream and version an entity event's record carries (its envelope
/// id is `<stream>/<version>`; the stream's own name, even where a long
/// name's partition key is cut), or `None` for anything else.
pub(crate) fn entity_event(data: &[u8]) -> Option<(String, u64)> {
    #[derive(Deserialize)]
    struct Id<'a> {
        #[serde(borrow)]
        id: std::borrow::Cow<'a, str>,
    }
    let id: Id = serde_json::from_slice(data).ok()?;
    let (stream, version) = id.id.rsplit_once('/')?;
    Some((stream.to_owned(), version.parse().ok()?))
}

/// The client's event id from the query (a pixel) or the posted event,
/// checked; `None` when it sent none.
pub(crate) fn client_event_id(query: &BTreeMap<String, Vec<String>>, body: Option<&Value>) -> Result<Option<String>> {
    let from_query = query.get(EVENT_ID).and_then(|v| v.first()).map(|s| Value::String(s.clone()));
    let Some(value) = from_query.or_else(|| body?.get(EVENT_ID).cloned()) else { return Ok(None) };
    let valid = |id: &str| {
        (1..=MAX_EVENT_ID_CHARS).contains(&id.len())
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    };
    match value {
        Value::String(id) if valid(&id) => Ok(Some(id)),
        _ => Err(Error::BadInput(format!(
            "{EVENT_ID} must be a string of 1 to {MAX_EVENT_ID_CHARS} letters, digits, '.', '_', ':' or '-'"
        ))),
    }
}

/// The envelope id of a client's event: the same for every retry of it
/// (a UUID made from its partition key and id), so readers and the pump
/// know a copy, and different for the same id under another `EntityId`.
pub(crate) fn client_envelope_id(partition_key: &str, event_id: &str) -> String {
    let digest = Sha256::new().chain_update(partition_key).chain_update([0]).chain_update(event_id).finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes).into_uuid().to_string()
}

/// The pump's record that a client's event is buffered: its partition in
/// the entity table (stream names hold no `/`, so it is no stream's).
pub(crate) fn client_id_marker(envelope_id: &str) -> String {
    format!("{CLIENT_ID_MARKER_PREFIX}{envelope_id}")
}

/// The envelope id of a record that carries a client's event id, if it does.
pub(crate) fn client_event(data: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Ids {
        id: String,
        #[serde(default)]
        event_id: Option<serde::de::IgnoredAny>,
    }
    let ids: Ids = serde_json::from_slice(data).ok()?;
    ids.event_id.map(|_| ids.id)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope {
    /// Random v4 UUID given at receipt, or, for an event the client gave an
    /// `EventId`, one made from it ([`client_envelope_id`]).
    pub id: String,
    /// The client's `EventId`, when it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Receive time, ISO 8601 with milliseconds, UTC.
    pub received_at: String,
    pub method: String,
    pub path: String,
    /// Query parameters; a repeated key keeps all its values, in order.
    pub query: BTreeMap<String, Vec<String>>,
    pub headers: Headers,
    /// The client's address, as `IP_MODE` says (absent with `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_ip: Option<String>,
    /// The posted event (JSON), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
    /// In place of `body`, when it was larger than `INLINE_MAX_BYTES`: where
    /// it is stored ([`crate::offload`]); readers put it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_ref: Option<OffloadRef>,
    /// The event's data subject, as a keyed hash ([`crate::privacy`]); only
    /// for events that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// For an event with a subject: its `query`, `headers`, `source_ip` and
    /// `body`, sealed under the subject's key (those fields are then empty).
    /// Readers open it; once the subject is forgotten they show `forgotten`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<Sealed>,
    /// In place of `sealed`, when that was larger than `INLINE_MAX_BYTES`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed_ref: Option<OffloadRef>,
    /// The W3C trace context the client sent with the event ([`crate::trace`]), in the clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceContext>,
}

/// The request headers worth keeping for analytics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub referer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accept_language: Option<String>,
}

impl Envelope {
    /// The Kinesis partition key: `EntityId` from the query, else from the
    /// body, else the client's `EventId` (every retry on one shard, so the
    /// pump meets them in order), else the envelope's random id (spreads
    /// anonymous hits evenly).
    pub(crate) fn partition_key(&self) -> Result<String> {
        let from_query = self.query.get(ENTITY_ID).and_then(|v| v.first()).cloned();
        let from_body = self.body.as_ref().and_then(|b| b.get(ENTITY_ID)).and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        });
        match from_query.or(from_body) {
            None => Ok(self.event_id.clone().unwrap_or_else(|| self.id.clone())),
            Some(key) if key.starts_with(ENTITY_KEY_PREFIX) => Err(Error::BadInput(format!(
                "{ENTITY_ID} may not start with {ENTITY_KEY_PREFIX:?}: those keys are the entity streams'"
            ))),
            Some(key) if (1..=MAX_PARTITION_KEY_CHARS).contains(&key.chars().count()) => Ok(key),
            Some(_) => Err(Error::BadInput(format!("{ENTITY_ID} must be 1 to {MAX_PARTITION_KEY_CHARS} characters"))),
        }
    }
}

/// The client address as `IP_MODE` wants it stored.
pub(crate) fn client_ip(ip: Option<&str>, mode: &IpMode) -> Option<String> {
    let ip = ip?.trim();
    if ip.is_empty() {
        return None;
    }
    match mode {
        IpMode::Full => Some(ip.to_owned()),
        IpMode::None => None,
        IpMode::Hash { salt } => {
            let mut hasher = Sha256::new();
            hasher.update(salt.as_bytes());
            hasher.update(ip.as_bytes());
            Some(hex::encode(hasher.finalize()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(query: &[(&str, &str)], body: Option<Value>) -> Envelope {
        let mut q: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in query {
            q.entry(k.to_string()).or_default().push(v.to_string());
        }
        Envelope {
            id: "id-1".into(),
            event_id: None,
            received_at: "2026-11-21T05:58:44.123Z".into(),
            method: "GET".into(),
            path: "/track.gif".into(),
            query: q,
            headers: Headers::default(),
            source_ip: None,
            body,
            body_ref: None,
            subject: None,
            sealed: None,
            sealed_ref: None,
            trace: None,
        }
    }

    #[test]
    fn partition_key_prefers_query_then_body_then_random_id() {
        let both = envelope(&[("EntityId", "q")], Some(serde_json::json!({"EntityId": "b"})));
        assert_eq!(both.partition_key().unwrap(), "q");
        let body = envelope(&[], Some(serde_json::json!({"EntityId": 42})));
        assert_eq!(body.partition_key().unwrap(), "42");
        assert_eq!(envelope(&[("page", "x")], None).partition_key().unwrap(), "id-1");
        let long = "x".repeat(257);
        assert!(envelope(&[("EntityId", &long)], None).partition_key().is_err());
        // The entity streams' namespace is not for anonymous callers, from the query or the body.
        assert!(envelope(&[("EntityId", "streams/todo-1")], None).partition_key().is_err());
        let body = Some(serde_json::json!({"EntityId": "streams/todo-1"}));
        assert!(matches!(envelope(&[], body).partition_key(), Err(Error::BadInput(_))));
        assert_eq!(envelope(&[("EntityId", "streams")], None).partition_key().unwrap(), "streams");
    }

    #[test]
    fn entity_events_have_keys_of_their_own_that_name_the_stream() {
        assert_eq!(entity_key("todo-1"), "streams/todo-1");
        assert_eq!(entity_stream("streams/todo-1"), Some("todo-1"));
        assert_eq!(entity_stream("todo-1"), None);
        assert_eq!(entity_key(&"a".repeat(248)).len(), 256);
        let old = entity_key(&"a".repeat(256));
        assert_eq!(old.len(), 256, "a name from before the 248-byte limit still makes a valid key");
        assert_ne!(old, entity_key(&format!("{}b", "a".repeat(255))));
        let data = serde_json::json!({"id": entity_event_id("order:7", 42), "method": "POST"}).to_string();
        assert_eq!(entity_event(data.as_bytes()), Some(("order:7".to_owned(), 42)));
        assert_eq!(entity_event(br#"{"id": "no-version"}"#), None);
        assert_eq!(entity_event(b"not json"), None);
    }

    #[test]
    fn a_client_event_id_is_checked_and_names_one_event_per_key() {
        let query = |id: &str| BTreeMap::from([(EVENT_ID.to_owned(), vec![id.to_owned()])]);
        let ulid = "01JD3Z8X7Q2V9K4M6N8P0R2T4W";
        assert_eq!(client_event_id(&query(ulid), None).unwrap().as_deref(), Some(ulid));
        let body = serde_json::json!({"EventId": "a1:b_c.d-e"});
        assert_eq!(client_event_id(&BTreeMap::new(), Some(&body)).unwrap().as_deref(), Some("a1:b_c.d-e"));
        assert_eq!(client_event_id(&BTreeMap::new(), Some(&serde_json::json!({"n": 1}))).unwrap(), None);
        for bad in ["", "a/b", "streams/x", "sp ace", &"x".repeat(65)] {
            assert!(client_event_id(&query(bad), None).is_err(), "{bad:?}");
        }
        assert!(client_event_id(&BTreeMap::new(), Some(&serde_json::json!({"EventId": 7}))).is_err());
        let id = client_envelope_id("order-1", "e1");
        assert_eq!(id, client_envelope_id("order-1", "e1"), "every retry gets the same id");
        assert_ne!(id, client_envelope_id("order-2", "e1"), "the id is the client's per key");
        assert_ne!(client_envelope_id("ab", "c"), client_envelope_id("a", "bc"));
        assert_eq!(uuid::Uuid::parse_str(&id).unwrap().get_version_num(), 8);
        // Without an EntityId the client's id is the key: its retries share a shard.
        let mut e = envelope(&[("EventId", "e1")], None);
        e.event_id = Some("e1".into());
        assert_eq!(e.partition_key().unwrap(), "e1");
        let data = serde_json::to_vec(&e).unwrap();
        assert_eq!(client_event(&data).as_deref(), Some("id-1"));
        e.event_id = None;
        assert_eq!(client_event(&serde_json::to_vec(&e).unwrap()), None);
    }

    #[test]
    fn repeated_query_keys_survive_serialization() {
        let e = envelope(&[("tag", "a"), ("tag", "b")], None);
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["query"]["tag"], serde_json::json!(["a", "b"]));
        assert!(json.get("body").is_none() && json.get("source_ip").is_none() && json.get("event_id").is_none());
    }

    #[test]
    fn ip_modes() {
        assert_eq!(client_ip(Some("203.0.113.9"), &IpMode::Full).as_deref(), Some("203.0.113.9"));
        assert_eq!(client_ip(Some("203.0.113.9"), &IpMode::None), None);
        let a = client_ip(Some("203.0.113.9"), &IpMode::Hash { salt: "s1".into() }).unwrap();
        let b = client_ip(Some("203.0.113.9"), &IpMode::Hash { salt: "s2".into() }).unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(!a.contains("203"));
    }
}
