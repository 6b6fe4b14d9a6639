//! Upcasting: events stored under an older schema of their data read as the
//! current one. An event carries its schema version (`schema_version`, 1 when
//! absent; `version` is its place in the stream). [`Upcasters`] holds, per
//! event type and schema version, a pure function from that version's data to
//! the next one's, and a store given them ([`EntityStore::with_upcasters`])
//! applies them in turn on every read, as Marten and cqrs-es do, and writes
//! new events of a type at the version its steps reach. What is stored never
//! changes: the HTTP API (a store without upcasters) and the log carry events
//! as stored, with their schema version.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::model::{NewEvent, RecordedEvent};
use super::EntityStore;
use crate::error::Error;

/// One step: the data of one schema version, as the next version's (or why it cannot be).
pub type Step = dyn Fn(Value) -> Result<Value, String> + Send + Sync;

/// The registered steps, by event type and the schema version they start from.
#[derive(Clone, Default)]
pub struct Upcasters {
    steps: HashMap<(String, u32), Arc<Step>>,
}

impl std::fmt::Debug for Upcasters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.steps.keys()).finish()
    }
}

impl Upcasters {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the step that turns `event_type`'s data at schema version `from` into version `from + 1`.
    pub fn register(
        mut self,
        event_type: impl Into<String>,
        from: u32,
        step: impl Fn(Value) -> Result<Value, String> + Send + Sync + 'static,
    ) -> Self {
        self.steps.insert((event_type.into(), from), Arc::new(step));
        self
    }

    /// The schema version `event_type`'s steps reach: what its new events are written at.
    fn current(&self, event_type: &str) -> Option<u32> {
        self.steps.keys().filter(|(t, _)| t == event_type).map(|(_, from)| from.saturating_add(1)).max()
    }

    /// `event` at the latest schema its steps reach. Data not opened (sealed, offloaded) or
    /// forgotten is left as it is.
    pub fn upcast(&self, event: &mut RecordedEvent) -> Result<(), Error> {
        if event.forgotten.is_some() || event.sealed.is_some() || event.data_ref.is_some() {
            return Ok(());
        }
        loop {
            let from = event.schema_version.unwrap_or(1);
            let (Some(step), Some(next)) = (self.steps.get(&(event.event_type.clone(), from)), from.checked_add(1))
            else {
                return Ok(());
            };
            let data = std::mem::take(&mut event.data);
            event.data = step(data).map_err(|e| {
                let (stream, version, kind) = (&event.stream, event.version, &event.event_type);
                Error::Malformed(format!("{stream} version {version}: upcasting {kind} from schema {from}: {e}"))
            })?;
            event.schema_version = Some(next);
        }
    }
}

impl EntityStore {
    /// The same store, reading every event through `upcasters`.
    pub fn with_upcasters(mut self, upcasters: Upcasters) -> Self {
        self.upcasters = Some(Arc::new(upcasters));
        self
    }

    /// New events that do not say their schema version are at their type's current one: written
    /// by this code, they have the shape its steps lead to, and must not be upcast again.
    pub(super) fn stamp(&self, events: &mut [NewEvent]) {
        let Some(upcasters) = &self.upcasters else { return };
        for event in events.iter_mut().filter(|e| e.schema_version.is_none()) {
            event.schema_version = upcasters.current(&event.event_type);
        }
    }

    /// `event` as this store's upcasters read it (as stored when it has none).
    pub(super) fn upcast(&self, event: &mut RecordedEvent) -> Result<(), Error> {
        self.upcasters.as_ref().map_or(Ok(()), |u| u.upcast(event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(event_type: &str, schema_version: Option<u32>, data: Value) -> RecordedEvent {
        serde_json::from_value(json!({"stream": "todo-1", "version": 3, "id": "i", "type": event_type,
            "data": data, "time": "2026-11-29T00:00:00.000Z", "schema_version": schema_version}))
        .unwrap()
    }

    #[test]
    fn each_step_from_the_stored_version_on_applies_in_turn() {
        let upcasters = Upcasters::new()
            .register("TodoCreated", 1, |mut d| {
                d["title"] = d["text"].take();
                Ok(d)
            })
            .register("TodoCreated", 2, |d| Ok(json!({"title": d["title"], "done": false})))
            .register("TodoRenamed", 1, |_| Err("not a rename any more".into()));
        let mut old = event("TodoCreated", None, json!({"text": "milk"}));
        upcasters.upcast(&mut old).unwrap();
        assert_eq!((old.data, old.schema_version), (json!({"title": "milk", "done": false}), Some(3)));
        let mut middle = event("TodoCreated", Some(2), json!({"title": "eggs"}));
        upcasters.upcast(&mut middle).unwrap();
        assert_eq!((middle.data, middle.schema_version), (json!({"title": "eggs", "done": false}), Some(3)));
        let mut current = event("TodoCreated", Some(3), json!({"title": "x", "done": true}));
        upcasters.upcast(&mut current).unwrap();
        assert_eq!((current.data, current.schema_version), (json!({"title": "x", "done": true}), Some(3)));
        let mut other = event("TodoDone", None, json!({}));
        upcasters.upcast(&mut other).unwrap();
        assert_eq!(other.schema_version, None, "no step for its type: as stored");
        let failed = upcasters.upcast(&mut event("TodoRenamed", None, json!({}))).unwrap_err().to_string();
        assert!(failed.contains("todo-1 version 3: upcasting TodoRenamed from schema 1"), "{failed}");
        assert_eq!((upcasters.current("TodoCreated"), upcasters.current("TodoDone")), (Some(3), None));
        let mut forgotten = event("TodoCreated", None, Value::Null);
        forgotten.forgotten = Some(json!({"at": "x"}));
        upcasters.upcast(&mut forgotten).unwrap();
        assert_eq!(forgotten.schema_version, None, "a forgotten event's data is gone: nothing to upcast");
    }
}
