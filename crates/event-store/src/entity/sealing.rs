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
use crate::privacy::keys::Keys;
use crate::privacy::{Opened, Sealer, Subjects};

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

    /// Seals the data of `stream`'s new events, and checks the append again (sealed data is another size).
    pub(super) async fn seal_events(
        &self,
        stream: &str,
        events: &mut [StoredEventItem],
        limits: Limits,
    ) -> Result<(), EntityError> {
        let Some(sealer) = self.sealer(stream).await? else { return Ok(()) };
        for event in events.iter_mut() {
            event.sealed = Some(sealer.seal_entity_data(stream, &event.id, event.data.as_bytes())?);
            event.data = "null".to_owned();
            event.subject = Some(sealer.subject().to_owned());
        }
        check(events, limits)?;
        Ok(())
    }

    /// A snapshot's state as stored: sealed when the stream is a subject.
    pub(super) async fn seal_state(&self, stream: &str, state: String) -> Result<StoredState, EntityError> {
        let Some(sealer) = self.sealer(stream).await? else {
            return Ok(StoredState { state, subject: None, sealed: None });
        };
        let sealed = sealer.seal_snapshot_state(stream, state.as_bytes())?;
        Ok(StoredState { state: "null".into(), subject: Some(sealer.subject().to_owned()), sealed: Some(sealed) })
    }

    /// The sealer of `stream`'s new data, if the stream is a subject.
    async fn sealer(&self, stream: &str) -> Result<Option<Sealer>, Error> {
        match &self.subjects {
            Some(subjects) => subjects.stream_sealer(stream).await,
            None => Ok(None),
        }
    }

    /// The keys to open `what` with, or why there are none here.
    fn keys(&self, what: &str) -> Result<&Keys, Error> {
        self.keys.as_deref().ok_or_else(|| {
            Error::Config(format!("{what} is sealed under its subject's key, and this function has no KEY_TABLE"))
        })
    }

    /// Opens a sealed event's data (its sealed block put back from S3 already), or marks it forgotten.
    pub(super) async fn open_event(&self, event: &mut RecordedEvent) -> Result<(), Error> {
        let (Some(sealed), Some(subject)) = (event.sealed.take(), event.subject.clone()) else { return Ok(()) };
        let keys = self.keys(&format!("{} event {}", event.stream, event.version))?;
        match keys.open_entity_data(&event.stream, &event.id, &subject, &sealed).await? {
            Opened::Data(data) => event.data = crate::offload::parse(&data),
            Opened::Forgotten(marker) => {
                event.data = serde_json::Value::Null;
                event.forgotten = Some(marker);
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
        let keys = self.keys(&format!("the snapshot of {}", item.stream))?;
        let state = match keys.open_snapshot_state(&item.stream, subject, sealed).await? {
            Opened::Data(state) => crate::offload::parse(&state),
            Opened::Forgotten(marker) => serde_json::json!({ "forgotten": marker }),
        };
        Ok(Snapshot { version: item.version, state })
    }
}
