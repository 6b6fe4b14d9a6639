//! The one door to sealing and opening: writers get a [`Sealer`] for a
//! subject (its hash, and the generation and key it seals under, none of
//! them handed out), readers open what they read through [`Keys`]. Key bytes
//! never leave `privacy/`.

use std::sync::Arc;

use serde_json::Value;

use super::keys::{Key, Keys};
use super::seal::{entity_place, forgotten, open_bytes, seal_bytes, seal_envelope, snapshot_place, SealedRecord};
use super::Subjects;
use crate::crypto::Sealed;
use crate::envelope::Envelope;
use crate::error::{Error, Result};

/// A subject's current key, ready to seal with.
pub struct Sealer {
    subject: String,
    generation: u64,
    key: Arc<[u8; 32]>,
}

impl Sealer {
    /// The subject as the log keeps it: its keyed hash.
    pub(crate) fn subject(&self) -> &str {
        &self.subject
    }

    /// Seals an ingested event's personal parts (they are emptied in the clear).
    pub(crate) fn seal_envelope(&self, envelope: &mut Envelope) -> Result<()> {
        seal_envelope(envelope, self.subject.clone(), self.generation, &self.key)
    }

    /// Seals an entity event's data, bound to its stream and id.
    pub(crate) fn seal_entity_data(&self, stream: &str, event_id: &str, data: &[u8]) -> Result<Sealed> {
        seal_bytes(data, self.generation, &self.key, &entity_place(stream, event_id, &self.subject))
    }

    /// Seals a stream's snapshot state, bound to the stream.
    pub(crate) fn seal_snapshot_state(&self, stream: &str, state: &[u8]) -> Result<Sealed> {
        seal_bytes(state, self.generation, &self.key, &snapshot_place(stream, &self.subject))
    }
}

impl Subjects {
    /// The sealer of the subject `id` (hashed here): its current key, made when it has none.
    pub(crate) async fn sealer(&self, id: &str) -> Result<Sealer> {
        self.sealer_of(self.hash(id)).await
    }

    /// The sealer of `stream`'s data, if the stream is a subject
    /// (`STREAM_SUBJECTS`): under the stream's own hash, since its name stays
    /// in the clear beside it ([`crate::crypto::stream_subject_hash`]).
    pub(crate) async fn stream_sealer(&self, stream: &str) -> Result<Option<Sealer>> {
        match self.streams.subject(stream) {
            Some(name) => self.sealer_of(self.stream_hash(name)).await.map(Some),
            None => Ok(None),
        }
    }

    async fn sealer_of(&self, subject: String) -> Result<Sealer> {
        let (generation, key) = self.keys.sealing_key(&subject).await?;
        Ok(Sealer { subject, generation, key })
    }

    /// Fetches (or makes) the subject `id`'s key into the cache, so that sealing finds it there.
    pub async fn warm(&self, id: &str) -> Result<()> {
        self.keys.sealing_key(&self.hash(id)).await.map(drop)
    }
}

/// Sealed data as its reader gets it.
#[derive(Debug, Clone, PartialEq)]
pub enum Opened {
    /// The plaintext.
    Data(Vec<u8>),
    /// The subject was forgotten: the `forgotten` marker (`{"at", "generation"}`).
    Forgotten(Value),
}

impl Keys {
    /// The generation `subject`'s new events are sealed under (made when it has none).
    pub async fn sealing_generation(&self, subject: &str) -> Result<u64> {
        self.sealing_key(subject).await.map(|(generation, _)| generation)
    }

    async fn opened(&self, subject: &str, sealed: &Sealed, place: &str) -> Result<Opened> {
        match self.key(subject, sealed.g).await? {
            Key::Active(key) => open_bytes(sealed, &key, place).map(Opened::Data),
            Key::Forgotten { at } => Ok(Opened::Forgotten(forgotten(&at, sealed.g))),
        }
    }

    /// An entity event's sealed data, opened (or forgotten).
    pub(crate) async fn open_entity_data(
        &self,
        stream: &str,
        event_id: &str,
        subject: &str,
        sealed: &Sealed,
    ) -> Result<Opened> {
        self.opened(subject, sealed, &entity_place(stream, event_id, subject)).await
    }

    /// A stream's sealed snapshot state, opened (or forgotten).
    pub(crate) async fn open_snapshot_state(&self, stream: &str, subject: &str, sealed: &Sealed) -> Result<Opened> {
        self.opened(subject, sealed, &snapshot_place(stream, subject)).await
    }
}

/// A log record (`entity`: an entity stream's) as its consumers get it: its
/// sealed parts opened with `keys`, or the `forgotten` marker; unchanged when
/// nothing in it is sealed. A sealed record and no keys is a configuration
/// error (`event_id` names it), not an event handed out sealed.
pub async fn open_record(keys: Option<&Keys>, bytes: Vec<u8>, entity: bool, event_id: &str) -> Result<Vec<u8>> {
    let Some(sealed) = SealedRecord::find(&bytes, entity)? else { return Ok(bytes) };
    let Some(keys) = keys else {
        return Err(Error::Config(format!(
            "event {event_id} is sealed under its subject's key, and this reader has no KEY_TABLE"
        )));
    };
    let key = keys.key(&sealed.subject, sealed.sealed.g).await?;
    sealed.open(&key)
}
