//! Entity streams as a backend for [cqrs-es](https://docs.rs/cqrs-es), the
//! most used Rust CQRS/event-sourcing framework: [`EntityRepository`]
//! implements its `PersistedEventRepository`, so a `CqrsFramework` built on
//! `PersistedEventStore` (event store, snapshot or aggregate store mode)
//! keeps its aggregates here, and their events reach the global log through
//! the relay like any other append.
//!
//! The mapping (the one `dynamo-es` uses where it has one):
//! - aggregate `TYPE` and id → stream `<TYPE>:<id>` (both must fit the stream
//!   name rules: 1–248 bytes for a new stream, of letters, digits and `-_.:@+=~`);
//! - cqrs-es sequence `n` (from 1) → version `n - 1` (from 0); a commit of
//!   events from sequence `n` is an append expecting version `n - 2` (no
//!   stream when `n = 1`), so a concurrent commit fails with cqrs-es's
//!   `OptimisticLockError` (the framework's `AggregateConflict`);
//! - event type → `type`, payload → `data`, and `metadata` =
//!   `{"event_version": ..., "metadata": {...}}` (cqrs-es's upcasters need the
//!   version back);
//! - a snapshot update is stored in the same transaction as its events
//!   ([`EntityStore::append_with_snapshot`]), state
//!   `{"aggregate": ..., "snapshot": <cqrs-es snapshot counter>}`. As in
//!   `dynamo-es`, the snapshot is labelled with the commit's last sequence:
//!   cqrs-es hands the repository no other.

use cqrs_es::persist::{
    PersistedEventRepository, PersistenceError, ReplayFeed, ReplayStream, SerializedEvent, SerializedSnapshot,
};
use cqrs_es::Aggregate;
use serde_json::{json, Value};

use super::{Direction, EntityError, EntityStore, Expected, Invalid, NewEvent, RecordedEvent};

/// Events per read request, and the queue of a replay stream.
const PAGE: usize = 1000;

/// A cqrs-es event repository on the entity table.
#[derive(Clone)]
pub struct EntityRepository {
    store: EntityStore,
}

impl EntityRepository {
    pub fn new(store: EntityStore) -> Self {
        Self { store }
    }

    /// The stream that holds an aggregate's events.
    pub fn stream_name(aggregate_type: &str, aggregate_id: &str) -> String {
        format!("{aggregate_type}:{aggregate_id}")
    }
}

/// cqrs-es sequences count from 1, versions from 0.
fn version_of(sequence: usize) -> u64 {
    sequence.saturating_sub(1) as u64
}

fn sequence_of(version: u64) -> usize {
    usize::try_from(version).map_or(usize::MAX, |v| v.saturating_add(1))
}

/// A conflict is cqrs-es's optimistic lock error; the store's failures are
/// connection errors (the framework reports them as such); the rest unknown.
fn persistence_error(err: EntityError) -> PersistenceError {
    match err {
        EntityError::Conflict { .. } | EntityError::NotFound => PersistenceError::OptimisticLockError,
        EntityError::Store(err) => PersistenceError::ConnectionError(Box::new(err)),
        other => PersistenceError::UnknownError(Box::new(other)),
    }
}

/// The event as the store keeps it.
fn new_event(event: &SerializedEvent) -> NewEvent {
    NewEvent {
        id: None,
        event_type: event.event_type.clone(),
        data: event.payload.clone(),
        metadata: Some(json!({"event_version": event.event_version, "metadata": event.metadata})),
        schema_version: None,
        trace: None,
    }
}

/// The event as cqrs-es reads it. Events appended by other clients (over
/// HTTP, say) have no cqrs-es event version: their schema version stands for
/// it when they carry one (`2`, which cqrs-es reads as 2.0.0), else it reads
/// as ""; their metadata as is.
fn serialized(aggregate_type: &str, aggregate_id: &str, event: RecordedEvent) -> SerializedEvent {
    let schema = event.schema_version.map(|v| v.to_string()).unwrap_or_default();
    let (event_version, metadata) = match event.metadata {
        Some(Value::Object(mut wrapper)) if wrapper.contains_key("event_version") => {
            let version = wrapper.remove("event_version").and_then(|v| v.as_str().map(str::to_owned));
            (version.unwrap_or_default(), wrapper.remove("metadata").unwrap_or_else(|| json!({})))
        }
        Some(other) => (schema, other),
        None => (schema, json!({})),
    };
    SerializedEvent {
        aggregate_id: aggregate_id.to_owned(),
        sequence: sequence_of(event.version),
        aggregate_type: aggregate_type.to_owned(),
        event_type: event.event_type,
        event_version,
        payload: event.data,
        metadata,
    }
}

impl EntityRepository {
    /// Every event of a stream from `from` on that its metadata shows, in
    /// order (none for an unknown stream). With `unbroken`, an aggregate's
    /// load: refused when the metadata hides events from `from` on, since an
    /// aggregate folded over a hole would be wrong, and cqrs-es would take a
    /// stream that shows nothing for a new one and never commit to it again.
    async fn events_from(&self, stream: &str, from: u64, unbroken: bool) -> Result<Vec<RecordedEvent>, EntityError> {
        let mut events = Vec::new();
        let mut next = Some(from);
        while let Some(at) = next {
            let page = match self.store.read(stream, Some(at), PAGE, Direction::Forward).await {
                Ok(page) => page,
                Err(EntityError::NotFound) => return Ok(events),
                Err(err) => return Err(err),
            };
            let starts = events.first().or(page.events.first()).map(|e| e.version);
            if unbroken && page.version >= from && starts != Some(from) {
                return Err(Invalid::BadRequest(format!(
                    "{stream}: its metadata (max_age, max_count, truncate_before) hides version {from}: \
                     an aggregate loads from a snapshot at or after the cut"
                ))
                .into());
            }
            next = page.next;
            events.extend(page.events);
        }
        Ok(events)
    }

    async fn serialized_events<A: Aggregate>(
        &self,
        aggregate_id: &str,
        from: u64,
    ) -> Result<Vec<SerializedEvent>, PersistenceError> {
        let stream = Self::stream_name(A::TYPE, aggregate_id);
        let events = self.events_from(&stream, from, true).await.map_err(persistence_error)?;
        Ok(events.into_iter().map(|e| serialized(A::TYPE, aggregate_id, e)).collect())
    }

    /// A stream of these aggregates' events, fed by a task of its own.
    fn replay(&self, aggregate_type: &'static str, ids: Vec<String>) -> ReplayStream {
        let (feed, stream) = ReplayStream::new(PAGE);
        let repository = self.clone();
        tokio::spawn(async move { repository.feed(aggregate_type, ids, feed).await });
        stream
    }

    /// Feeds the events of these aggregates, one after the other, each in order.
    async fn feed(&self, aggregate_type: &'static str, ids: Vec<String>, mut feed: ReplayFeed) {
        for id in ids {
            // A replay for queries takes what the streams show.
            let result = self.events_from(&Self::stream_name(aggregate_type, &id), 0, false).await;
            let events = match result {
                Ok(events) => events,
                Err(err) => {
                    // The receiver may be gone; nothing more to tell then.
                    let _ = feed.push(Err(persistence_error(err))).await;
                    return;
                }
            };
            for event in events {
                if feed.push(Ok(serialized(aggregate_type, &id, event))).await.is_err() {
                    return;
                }
            }
        }
    }
}

impl PersistedEventRepository for EntityRepository {
    async fn get_events<A: Aggregate>(&self, aggregate_id: &str) -> Result<Vec<SerializedEvent>, PersistenceError> {
        self.serialized_events::<A>(aggregate_id, 0).await
    }

    /// The events after `last_sequence` (versions from `last_sequence` on).
    async fn get_last_events<A: Aggregate>(
        &self,
        aggregate_id: &str,
        last_sequence: usize,
    ) -> Result<Vec<SerializedEvent>, PersistenceError> {
        self.serialized_events::<A>(aggregate_id, last_sequence as u64).await
    }

    async fn get_snapshot<A: Aggregate>(
        &self,
        aggregate_id: &str,
    ) -> Result<Option<SerializedSnapshot>, PersistenceError> {
        let stream = Self::stream_name(A::TYPE, aggregate_id);
        let Some(snapshot) = self.store.latest_snapshot(&stream).await.map_err(persistence_error)? else {
            return Ok(None);
        };
        // A snapshot saved by another client (not in this shape) is no aggregate: load from the events.
        let (Some(aggregate), Some(counter)) = (snapshot.state.get("aggregate"), snapshot.state.get("snapshot")) else {
            return Ok(None);
        };
        Ok(Some(SerializedSnapshot {
            aggregate_id: aggregate_id.to_owned(),
            aggregate: aggregate.clone(),
            current_sequence: sequence_of(snapshot.version),
            current_snapshot: counter.as_u64().map_or(0, |c| c as usize),
        }))
    }

    async fn persist<A: Aggregate>(
        &self,
        events: &[SerializedEvent],
        snapshot_update: Option<(String, Value, usize)>,
    ) -> Result<(), PersistenceError> {
        let Some(first) = events.first() else {
            // cqrs-es asks for a snapshot only along with events; nothing to store.
            return Ok(());
        };
        let stream = Self::stream_name(A::TYPE, &first.aggregate_id);
        let expected = match first.sequence {
            0 => {
                let message = format!("{stream}: cqrs-es sequences start at 1");
                return Err(PersistenceError::UnknownError(message.into()));
            }
            1 => Expected::NoStream,
            sequence => Expected::Version(version_of(sequence) - 1),
        };
        let new_events = events.iter().map(new_event).collect();
        let appended = match snapshot_update {
            None => self.store.append(&stream, expected, new_events).await,
            Some((_, aggregate, counter)) => {
                let state = json!({"aggregate": aggregate, "snapshot": counter});
                self.store.append_with_snapshot(&stream, expected, new_events, &state).await
            }
        };
        appended.map(|_| ()).map_err(persistence_error)
    }

    async fn stream_events<A: Aggregate>(&self, aggregate_id: &str) -> Result<ReplayStream, PersistenceError> {
        Ok(self.replay(A::TYPE, vec![aggregate_id.to_owned()]))
    }

    /// Every aggregate of the type, one after the other: finds them with
    /// [`EntityStore::stream_names`] (a `Scan`), as `dynamo-es` scans its table.
    async fn stream_all_events<A: Aggregate>(&self) -> Result<ReplayStream, PersistenceError> {
        let prefix = Self::stream_name(A::TYPE, "");
        let names = self.store.stream_names(&prefix).await.map_err(persistence_error)?;
        let ids = names.into_iter().filter_map(|name| name.strip_prefix(&prefix).map(str::to_owned)).collect();
        Ok(self.replay(A::TYPE, ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(version: u64, metadata: Option<Value>) -> RecordedEvent {
        RecordedEvent {
            stream: "account:a1".into(),
            version,
            id: "id".into(),
            event_type: "Deposited".into(),
            data: json!({"amount": 5}),
            metadata,
            time: "2026-11-22T00:00:00.000Z".into(),
            data_ref: None,
            subject: None,
            sealed: None,
            forgotten: None,
            schema_version: None,
            trace: None,
        }
    }

    #[test]
    fn an_event_goes_in_and_comes_back_as_cqrs_es_wrote_it() {
        let event = SerializedEvent {
            aggregate_id: "a1".into(),
            sequence: 3,
            aggregate_type: "account".into(),
            event_type: "Deposited".into(),
            event_version: "1.0".into(),
            payload: json!({"amount": 5}),
            metadata: json!({"user": "ann"}),
        };
        let stored = new_event(&event);
        assert_eq!(stored.event_type, "Deposited");
        let back = serialized("account", "a1", recorded(2, stored.metadata));
        assert_eq!(back, event);
    }

    #[test]
    fn events_other_clients_appended_read_with_their_schema_version_or_none() {
        let back = serialized("account", "a1", recorded(0, Some(json!({"run": 7}))));
        assert_eq!((back.sequence, back.event_version.as_str(), back.metadata), (1, "", json!({"run": 7})));
        let back = serialized("account", "a1", recorded(4, None));
        assert_eq!((back.sequence, back.metadata), (5, json!({})));
        let schema_2 = RecordedEvent { schema_version: Some(2), ..recorded(1, None) };
        assert_eq!(serialized("account", "a1", schema_2).event_version, "2", "its schema version stands for it");
    }

    #[test]
    fn conflicts_are_cqrs_es_optimistic_lock_errors() {
        assert!(matches!(
            persistence_error(EntityError::Conflict { current: 4 }),
            PersistenceError::OptimisticLockError
        ));
        assert!(matches!(persistence_error(EntityError::Deleted { current: 4 }), PersistenceError::UnknownError(_)));
    }

    #[test]
    fn sequences_count_from_one_versions_from_zero() {
        assert_eq!((version_of(1), version_of(5), sequence_of(0), sequence_of(4)), (0, 4, 1, 5));
    }
}
