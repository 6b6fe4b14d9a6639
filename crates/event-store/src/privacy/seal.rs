//! Which parts of a log record are sealed, and what a reader makes of them
//! (`docs/privacy.md#what-is-sealed`). Pure: keys come from the caller.
//!
//! An ingested event keeps in the clear what order, routing, filtering and
//! integrity need: `id`, `event_id`, `received_at`, `method`, `path`,
//! `subject` (the keyed hash), and the client's W3C trace context (`trace`,
//! which a consumer needs unopened). Its `query`, `headers`, `source_ip` and `body`
//! are sealed together into `sealed`, bound to the event's id and subject (a
//! sealed block copied into another event does not open there).
//!
//! A reader with the key puts them back as they were sent; once the subject
//! is forgotten it gets the clear fields and `"forgotten": {"at", "generation"}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::keys::Key;
use crate::crypto::{self, Sealed};
use crate::envelope::{Envelope, Headers};
use crate::error::{Error, Result};

/// The personal parts of an ingested event.
#[derive(Serialize, Deserialize)]
struct Personal {
    query: BTreeMap<String, Vec<String>>,
    headers: Headers,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source_ip: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body: Option<Value>,
}

/// What a sealed block of an ingested event is bound to (and how its plaintext is encoded).
fn aad(envelope_id: &str, subject: &str, encoding: Option<&str>) -> Vec<u8> {
    format!("es1|{envelope_id}|{subject}|{}", encoding.unwrap_or("")).into_bytes()
}

/// What an entity event's sealed data is bound to: its stream, its id and its subject.
pub(super) fn entity_place(stream: &str, event_id: &str, subject: &str) -> String {
    format!("es1|entity|{stream}|{event_id}|{subject}")
}

/// What a stream's sealed snapshot is bound to.
pub(super) fn snapshot_place(stream: &str, subject: &str) -> String {
    format!("es1|snapshot|{stream}|{subject}")
}

/// Seals `plaintext` (compressed first where that saves) under `key`, bound to `place`.
pub(super) fn seal_bytes(plaintext: &[u8], generation: u64, key: &[u8; 32], place: &str) -> Result<Sealed> {
    let (plaintext, encoding) = crate::encoding::encode_alone(plaintext);
    let aad = format!("{place}|{}", encoding.as_deref().unwrap_or(""));
    let mut sealed = crypto::seal(key, generation, aad.as_bytes(), &plaintext)?;
    sealed.z = encoding;
    Ok(sealed)
}

/// Opens what [`seal_bytes`] sealed for `place`.
pub(super) fn open_bytes(sealed: &Sealed, key: &[u8; 32], place: &str) -> Result<Vec<u8>> {
    let encoding = sealed.z.as_deref();
    let aad = format!("{place}|{}", encoding.unwrap_or(""));
    decompress(crypto::open(key, aad.as_bytes(), sealed)?, encoding)
}

fn decompress(plaintext: Vec<u8>, encoding: Option<&str>) -> Result<Vec<u8>> {
    match encoding {
        None => Ok(plaintext),
        encoding => crate::encoding::decode_up_to(&plaintext, encoding, MAX_PLAINTEXT_BYTES).map_err(|e| match e {
            // A dictionary or encoding of a newer version: stop, not unreadable.
            Error::Newer(_) => e,
            e => Error::Payload(format!("sealed parts that do not decompress: {e}")),
        }),
    }
}

/// The `forgotten` marker of a generation destroyed at `at`.
pub(crate) fn forgotten(at: &str, generation: u64) -> Value {
    json!({ "at": at, "generation": generation })
}

/// The most a sealed block's plaintext may inflate to: the largest event and then some.
const MAX_PLAINTEXT_BYTES: usize = crate::offload::MAX_LARGE_EVENT_BYTES + 64 * 1024;

/// Seals `envelope`'s personal parts under generation `generation` of its
/// subject's key (`subject`: the keyed hash); they are emptied in the clear.
pub(super) fn seal_envelope(envelope: &mut Envelope, subject: String, generation: u64, key: &[u8; 32]) -> Result<()> {
    let personal = Personal {
        query: std::mem::take(&mut envelope.query),
        headers: std::mem::take(&mut envelope.headers),
        source_ip: envelope.source_ip.take(),
        body: envelope.body.take(),
    };
    let plaintext = serde_json::to_vec(&personal).map_err(|e| Error::encode("personal parts", e))?;
    // Compressed first, where that saves: the chunk's own compression cannot shrink ciphertext.
    let (plaintext, encoding) = crate::encoding::encode_alone(&plaintext);
    let mut sealed = crypto::seal(key, generation, &aad(&envelope.id, &subject, encoding.as_deref()), &plaintext)?;
    sealed.z = encoding;
    envelope.sealed = Some(sealed);
    envelope.subject = Some(subject);
    Ok(())
}

/// A log record whose personal parts are sealed: an ingested event's
/// (`sealed` beside the envelope's clear fields), or an entity event's
/// (`body.sealed` in place of `body.data`).
#[derive(Debug)]
pub(super) struct SealedRecord {
    record: serde_json::Map<String, Value>,
    pub(super) subject: String,
    pub(super) sealed: Sealed,
    entity: bool,
}

impl SealedRecord {
    /// The record's sealed block, if it has one (an offloaded one already
    /// spliced back; `entity`: the record's partition key is an entity
    /// stream's). Records without one are not parsed.
    pub(super) fn find(record: &[u8], entity: bool) -> Result<Option<Self>> {
        if memchr::memmem::find(record, b"\"sealed\":").is_none() {
            return Ok(None);
        }
        let malformed = |what: &str| Error::Payload(format!("a sealed record {what}"));
        let Ok(Value::Object(mut record)) = serde_json::from_slice(record) else { return Ok(None) };
        let holder = if entity { record.get_mut("body").and_then(Value::as_object_mut) } else { Some(&mut record) };
        let Some(holder) = holder else { return Ok(None) };
        let Some(sealed) = holder.remove("sealed") else { return Ok(None) };
        let sealed: Sealed =
            serde_json::from_value(sealed).map_err(|e| malformed(&format!("that does not parse: {e}")))?;
        let subject = match holder.get("subject") {
            Some(Value::String(subject)) => subject.clone(),
            _ => return Err(malformed("with no subject")),
        };
        Ok(Some(Self { record, subject, sealed, entity }))
    }

    /// The record as its consumers get it: opened with `key`, or with the
    /// `forgotten` marker when the key is gone. Fails ([unreadable](Error::is_unreadable))
    /// when the block does not open: altered, or moved from another event.
    pub(super) fn open(mut self, key: &Key) -> Result<Vec<u8>> {
        if self.entity {
            let body = self.record.get_mut("body").and_then(Value::as_object_mut);
            let body = body.ok_or_else(|| Error::Payload("a sealed entity record with no body".into()))?;
            let text = |name: &str| body.get(name).and_then(Value::as_str).unwrap_or_default().to_owned();
            let place = entity_place(&text("stream"), &text("id"), &self.subject);
            let (field, value) = match key {
                Key::Active(key) => ("data", crate::offload::parse(&open_bytes(&self.sealed, key, &place)?)),
                Key::Forgotten { at } => ("forgotten", forgotten(at, self.sealed.g)),
            };
            body.insert(field.to_owned(), value);
            return serde_json::to_vec(&self.record).map_err(|e| Error::encode("record", e));
        }
        match key {
            Key::Active(key) => {
                let id = self.record.get("id").and_then(Value::as_str).unwrap_or_default();
                let encoding = self.sealed.z.as_deref();
                let plaintext = crypto::open(key, &aad(id, &self.subject, encoding), &self.sealed)?;
                let plaintext = decompress(plaintext, encoding)?;
                let personal: Personal = serde_json::from_slice(&plaintext)
                    .map_err(|e| Error::Payload(format!("a sealed record's parts do not parse: {e}")))?;
                let encode = |e| Error::encode("personal parts", e);
                self.record.insert("query".into(), serde_json::to_value(&personal.query).map_err(encode)?);
                self.record.insert("headers".into(), serde_json::to_value(&personal.headers).map_err(encode)?);
                if let Some(ip) = personal.source_ip {
                    self.record.insert("source_ip".into(), Value::String(ip));
                }
                if let Some(body) = personal.body {
                    self.record.insert("body".into(), body);
                }
            }
            Key::Forgotten { at } => {
                self.record.insert("forgotten".into(), forgotten(at, self.sealed.g));
            }
        }
        serde_json::to_vec(&self.record).map_err(|e| Error::encode("record", e))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn envelope() -> Envelope {
        Envelope {
            id: "e-1".into(),
            event_id: None,
            received_at: "2026-11-27T00:00:00.000Z".into(),
            method: "GET".into(),
            path: "/track.gif".into(),
            query: BTreeMap::from([("EntityId".to_owned(), vec!["alice".to_owned()])]),
            headers: Headers { referer: Some("https://example.com/alice".into()), ..Headers::default() },
            source_ip: Some("203.0.113.9".into()),
            body: Some(json!({"page": "/private"})),
            body_ref: None,
            subject: None,
            sealed: None,
            sealed_ref: None,
            trace: None,
        }
    }

    #[test]
    fn personal_parts_are_sealed_and_put_back_as_sent() {
        let key = Arc::new([9u8; 32]);
        let plain = serde_json::to_value(envelope()).unwrap();
        let mut sealed = envelope();
        seal_envelope(&mut sealed, "h".repeat(64), 2, &key).unwrap();
        let record = serde_json::to_vec(&sealed).unwrap();
        for secret in ["alice", "203.0.113", "private"] {
            assert!(!String::from_utf8_lossy(&record).contains(secret), "{secret} in the clear");
        }
        let found = SealedRecord::find(&record, false).unwrap().unwrap();
        assert_eq!((found.subject.as_str(), found.sealed.g), ("h".repeat(64).as_str(), 2));
        let opened: Value = serde_json::from_slice(&found.open(&Key::Active(key.clone())).unwrap()).unwrap();
        let mut expected = plain.as_object().unwrap().clone();
        expected.insert("subject".into(), json!("h".repeat(64)));
        assert_eq!(opened, Value::Object(expected));

        let forgotten =
            SealedRecord::find(&record, false).unwrap().unwrap().open(&Key::Forgotten { at: "T".into() }).unwrap();
        let forgotten: Value = serde_json::from_slice(&forgotten).unwrap();
        assert_eq!(forgotten["forgotten"], json!({"at": "T", "generation": 2}));
        assert_eq!((forgotten["id"].as_str(), forgotten["path"].as_str()), (Some("e-1"), Some("/track.gif")));
        assert!(forgotten.get("body").is_none() && forgotten.get("sealed").is_none());

        // Moved into another event, it does not open: unreadable, not a key problem.
        let mut moved: Value = serde_json::from_slice(&record).unwrap();
        moved["id"] = json!("e-2");
        let moved = SealedRecord::find(&serde_json::to_vec(&moved).unwrap(), false).unwrap().unwrap();
        assert!(moved.open(&Key::Active(key.clone())).unwrap_err().is_unreadable());
        // A newer version's block (its version, or a dictionary this code lacks): stop, not unreadable.
        let mut newer: Value = serde_json::from_slice(&record).unwrap();
        newer["sealed"]["v"] = json!(2);
        let newer = SealedRecord::find(&serde_json::to_vec(&newer).unwrap(), false).unwrap().unwrap();
        let err = newer.open(&Key::Active(key.clone())).unwrap_err();
        assert!(err.is_newer() && !err.is_unreadable(), "{err}");
        let mut sealed = crypto::seal(&key, 1, b"here|zstd-d9", b"compressed with a dictionary to come").unwrap();
        sealed.z = Some("zstd-d9".into());
        let err = open_bytes(&sealed, &key, "here").unwrap_err();
        assert!(err.is_newer() && !err.is_unreadable(), "{err}");
        sealed.z = Some("zstd-d8".into());
        assert!(
            open_bytes(&sealed, &key, "here").unwrap_err().is_unreadable(),
            "z altered: its AAD no longer opens it"
        );
        // Incomplete records are not touched; a client body holding "sealed" is not a sealed record.
        assert!(SealedRecord::find(&serde_json::to_vec(&envelope()).unwrap(), false).unwrap().is_none());
        let client = json!({"id": "x", "body": {"sealed": {"v": 1}}});
        assert!(SealedRecord::find(&serde_json::to_vec(&client).unwrap(), false).unwrap().is_none());
    }
}
