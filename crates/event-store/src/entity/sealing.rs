//! Entity streams' sealed data (`docs/privacy.md#entity-streams`): a stream
//! that is a data subject (`STREAM_SUBJECTS`) has each event's `data`, and
//! its snapshot's state, sealed under the subject's key before the append's
//! transaction writes it; reads open them, or show `forgotten`. Ids, types,
//! metadata, versions and the stream's name stay in the clear (they are keys
//! and routing; put nothing personal in them).

use std::sync::Arc;

use super::model::{check, Limits, SnapshotItem, StoredEventItem};
use super::snapshot::Snapshot;
use super::{EntityError, EntityStore, RecordedEvent};
use crate::crypto::Sealed;
use crate::error::Error;
use crate::privacy::keys::{Key, Keys};
use crate::privacy::seal::{entity_place, forgotten, open_bytes, seal_bytes, snapshot_place};
use crate::privacy::Subjects;

/// A snapshot's state as an append stores it: in the clear, or sealed.
#[derive(Debug, Clone)]
pub(super) struct StoredState {
    pub state: String,
    pub subject: Option<String>,
    pub sealed: Option<Sealed>,
}

impl EntityStore {
    /// Seals the data of subjects' streams (`subjects.streams`), and opens
    /// sealed events with its keys.
    pub fn with_subjects(mut self, subjects: Option<Subjects>) -> Self {
        self.keys = subjects.as_ref().map(|s| s.keys.clone()).or(self.keys);
        self.subjects = subjects;
        self
    }

    /// Opens sealed events with `keys` (a reader that never appends).
    pub fn with_keys(mut self, keys: Option<Arc<Keys>>) -> Self {
        self.keys = keys;
        self
    }

    /// The subject's hash and key to seal `stream`'s new data under, if the stream is a subject.
    async fn sealing(&self, stream: &str) -> Result<Option<(String, u64, Arc<[u8; 32]>)>, Error> {
        let Some(subjects) = &self.subjects else { return Ok(None) };
        let Some(id) = subjects.streams.subject(stream) else { return Ok(None) };
        let subject = subjects.hash(id);
        let (generation, key) = subjects.keys.sealing_key(&subject).await?;
        Ok(Some((subject, generation, key)))
    }

    /// Seals the data of `stream`'s new events, and checks the append again (sealed data is another size).
    pub(super) async fn seal_events(
        &self,
        stream: &str,
        events: &mut [StoredEventItem],
        limits: Limits,
    ) -> Result<(), EntityError> {
        let Some((subject, generation, key)) = self.sealing(stream).await? else { return Ok(()) };
        for event in events.iter_mut() {
            let place = entity_place(stream, &event.id, &subject);
            event.sealed = Some(seal_bytes(event.data.as_bytes(), generation, &key, &place)?);
            event.data = "null".to_owned();
            event.subject = Some(subject.clone());
        }
        check(events, limits)?;
        Ok(())
    }

    /// A snapshot's state as stored: sealed when the stream is a subject.
    pub(super) async fn seal_state(&self, stream: &str, state: String) -> Result<StoredState, EntityError> {
        let Some((subject, generation, key)) = self.sealing(stream).await? else {
            return Ok(StoredState { state, subject: None, sealed: None });
        };
        let sealed = seal_bytes(state.as_bytes(), generation, &key, &snapshot_place(stream, &subject))?;
        Ok(StoredState { state: "null".into(), subject: Some(subject), sealed: Some(sealed) })
    }

    /// The key of generation `generation` of `subject`, or why there is none here.
    async fn key(&self, subject: &str, generation: u64, what: &str) -> Result<Key, Error> {
        let keys = self.keys.as_ref().ok_or_else(|| {
            Error::Config(format!("{what} is sealed under its subject's key, and this function has no KEY_TABLE"))
        })?;
        keys.key(subject, generation).await
    }

    /// Opens a sealed event's data (its sealed block put back from S3 already), or marks it forgotten.
    pub(super) async fn open_event(&self, event: &mut RecordedEvent) -> Result<(), Error> {
        let (Some(sealed), Some(subject)) = (event.sealed.take(), event.subject.clone()) else { return Ok(()) };
        let what = format!("{} event {}", event.stream, event.version);
        match self.key(&subject, sealed.g, &what).await? {
            Key::Active(key) => {
                let place = entity_place(&event.stream, &event.id, &subject);
                event.data = crate::payload::parse(&open_bytes(&sealed, &key, &place)?);
            }
            Key::Forgotten { at } => {
                event.data = serde_json::Value::Null;
                event.forgotten = Some(forgotten(&at, sealed.g));
            }
        }
        Ok(())
    }

    /// A stored snapshot as its reader gets it: once its subject is
    /// forgotten, its state is `{"forgotten": {...}}` (its version stays).
    pub(super) async fn open_snapshot(&self, item: SnapshotItem) -> Result<Snapshot, Error> {
        let (Some(sealed), Some(subject)) = (item.sealed.as_ref(), item.subject.as_deref()) else {
            return Ok(Snapshot::from(item));
        };
        match self.key(subject, sealed.g, &format!("the snapshot of {}", item.stream)).await? {
            Key::Active(key) => {
                let state = open_bytes(sealed, &key, &snapshot_place(&item.stream, subject))?;
                Ok(Snapshot { version: item.version, state: crate::payload::parse(&state) })
            }
            Key::Forgotten { at } => {
                let state = serde_json::json!({ "forgotten": forgotten(&at, sealed.g) });
                Ok(Snapshot { version: item.version, state })
            }
        }
    }
}
