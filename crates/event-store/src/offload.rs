//! Large payloads (`docs/storage.md#large-payloads`): an event bigger than
//! `INLINE_MAX_BYTES` is stored once in S3 under the SHA-256 of its content,
//! and the log (and the entity table) keeps a reference in its place, so no
//! item, chunk or Kinesis record ever carries it. Every reader puts it back
//! and checks it against the hash.
//!
//! Where the reference sits in a log record (an envelope's JSON):
//! - a posted or pixel event: `body_ref` in place of `body`, or `sealed_ref`
//!   in place of `sealed` when its subject's parts are sealed ([`crate::privacy`]);
//! - an entity event (partition key `streams/…`): `body.data_ref` in place of
//!   `body.data`. Only entity records are read there: the body of an ingest
//!   event is the client's, and a client must not make readers fetch objects.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::archive::object::Bucket;
use crate::error::{Error, Result};

pub use crate::config::{DEFAULT_INLINE_MAX_BYTES, INLINE_MAX_BYTES_LIMIT, MAX_LARGE_EVENT_BYTES};

/// Offloaded payloads live under this prefix of the store's bucket.
pub const KEY_PREFIX: &str = "payloads/sha256/";

/// Where an offloaded payload is, and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadRef {
    pub bucket: String,
    pub key: String,
    /// SHA-256 of the content, hex.
    pub sha256: String,
    pub bytes: usize,
}

impl OffloadRef {
    /// The reference of `content` stored in `bucket`: its key is its hash, so
    /// the same content is one object however often it is sent.
    pub fn of(bucket: &str, content: &[u8]) -> Self {
        let sha256 = hex::encode(Sha256::digest(content));
        Self { bucket: bucket.to_owned(), key: format!("{KEY_PREFIX}{sha256}"), sha256, bytes: content.len() }
    }

    /// `s3://bucket/key`.
    pub fn location(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.key)
    }

    /// Fails unless `content` is what this reference names.
    pub(crate) fn check(&self, content: &[u8]) -> Result<()> {
        let sha256 = hex::encode(Sha256::digest(content));
        if content.len() != self.bytes || sha256 != self.sha256 {
            return Err(Error::Payload(format!(
                "{} holds {} bytes hashing to {sha256}; the log names {} bytes hashing to {}",
                self.location(),
                content.len(),
                self.bytes,
                self.sha256
            )));
        }
        Ok(())
    }
}

/// The reference a log record carries, if any (`entity`: the record's
/// partition key is an entity stream's). Cheap for the records without one.
pub(crate) fn reference(record: &[u8], entity: bool) -> Option<OffloadRef> {
    memchr::memmem::find(record, b"_ref\"")?;
    let value: Value = serde_json::from_slice(record).ok()?;
    let found = if entity {
        value.get("body")?.get("data_ref")?
    } else {
        value.get("body_ref").or_else(|| value.get("sealed_ref"))?
    };
    serde_json::from_value(found.clone()).ok()
}

/// The log record with its payload (`content`, checked by the caller) put
/// back where the reference was.
pub(crate) fn splice(record: &[u8], entity: bool, content: &[u8]) -> Result<Vec<u8>> {
    let malformed = |what: &str| Error::Payload(format!("a record with an offloaded payload: {what}"));
    let mut value: Value = serde_json::from_slice(record).map_err(|e| malformed(&e.to_string()))?;
    let parent = if entity { value.get_mut("body").ok_or_else(|| malformed("no body"))? } else { &mut value };
    let object = parent.as_object_mut().ok_or_else(|| malformed("not an object"))?;
    let (field, reference) = match (entity, object.contains_key("sealed_ref")) {
        // An entity event with a subject has its sealed block offloaded, not its data.
        (true, _) if object.contains_key("subject") => ("sealed", "data_ref"),
        (true, _) => ("data", "data_ref"),
        (false, true) => ("sealed", "sealed_ref"),
        (false, false) => ("body", "body_ref"),
    };
    object.remove(reference);
    object.insert(field.to_owned(), parse(content));
    serde_json::to_vec(&value).map_err(|e| Error::encode("record", e))
}

/// Content as the JSON it was sent as; anything else as a string (entity
/// data is stored as JSON text, and reads show what does not parse as text).
pub(crate) fn parse(content: &[u8]) -> Value {
    serde_json::from_slice(content).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(content).into_owned()))
}

/// Offloads payloads into the store's bucket (`ARCHIVE_BUCKET`).
#[derive(Debug, Clone)]
pub struct Offloads {
    pub bucket: Bucket,
    /// Larger events are offloaded.
    pub inline_max: usize,
}

impl Offloads {
    /// Stores `content` under its hash, once: the same content sent again
    /// is not written again (no new version in the versioned bucket).
    pub(crate) async fn store(&self, content: Vec<u8>) -> Result<OffloadRef> {
        let reference = OffloadRef::of(&self.bucket.name, &content);
        self.bucket.put_new(&reference.key, content, "application/json").await?;
        Ok(reference)
    }
}

/// The payload `reference` names, from `bucket` (the reader's own: a
/// reference picks no bucket and no key, only a hash under [`KEY_PREFIX`]),
/// checked against its hash. A missing or altered object is
/// [`Error::Payload`] (the event cannot be read); a failed request is an S3
/// error (try again).
pub(crate) async fn fetch(bucket: &Bucket, reference: &OffloadRef) -> Result<Vec<u8>> {
    let hash = &reference.sha256;
    if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Payload(format!("a payload reference with no SHA-256: {hash:?}")));
    }
    let key = format!("{KEY_PREFIX}{hash}");
    let content = bucket
        .get_if_there(&key)
        .await?
        .ok_or_else(|| Error::Payload(format!("s3://{}/{key} is missing", bucket.name)))?;
    reference.check(&content)?;
    Ok(content.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(body_or_ref: Value) -> Vec<u8> {
        let mut envelope =
            serde_json::json!({ "id": "a", "received_at": "2026-11-27T00:00:00.000Z", "path": "/events" });
        envelope.as_object_mut().unwrap().extend(body_or_ref.as_object().unwrap().clone());
        serde_json::to_vec(&envelope).unwrap()
    }

    #[test]
    fn a_reference_is_named_by_the_contents_hash() {
        let one = OffloadRef::of("b", b"{\"big\":1}");
        assert_eq!(one, OffloadRef::of("b", b"{\"big\":1}"));
        assert_ne!(one.key, OffloadRef::of("b", b"{\"big\":2}").key);
        assert!(one.key.starts_with(KEY_PREFIX) && one.key.ends_with(&one.sha256));
        assert_eq!(one.location(), format!("s3://b/{}", one.key));
        assert!(one.check(b"{\"big\":1}").is_ok());
        assert!(matches!(one.check(b"{\"big\":2}"), Err(Error::Payload(m)) if m.contains("hashing to")));
    }

    #[test]
    fn an_ingest_reference_is_spliced_back_in_place_of_the_body() {
        let content = br#"{"page":"/a","n":[1,2]}"#;
        let named = OffloadRef::of("b", content);
        let record = envelope(serde_json::json!({ "body_ref": named }));
        assert_eq!(reference(&record, false), Some(named));
        let spliced: Value = serde_json::from_slice(&splice(&record, false, content).unwrap()).unwrap();
        assert_eq!(spliced["body"], serde_json::json!({"page": "/a", "n": [1, 2]}));
        assert!(spliced.get("body_ref").is_none());
        assert_eq!(spliced["id"], "a");
    }

    #[test]
    fn an_entity_reference_is_read_only_in_entity_records() {
        let named = OffloadRef::of("b", b"\"text\"");
        let record = envelope(serde_json::json!({ "body": { "type": "Big", "data": null, "data_ref": named } }));
        assert_eq!(reference(&record, true), Some(named));
        // A client's posted body that looks like one is just its body.
        assert_eq!(reference(&record, false), None);
        let spliced: Value = serde_json::from_slice(&splice(&record, true, b"\"text\"").unwrap()).unwrap();
        assert_eq!(spliced["body"], serde_json::json!({ "type": "Big", "data": "text" }));
        // Records without one are not parsed at all, and a body that is not an object is no reference.
        assert_eq!(reference(&envelope(serde_json::json!({ "body": "x" })), true), None);
        assert_eq!(reference(br#"{"body_ref": 3}"#, false), None);
    }
}
