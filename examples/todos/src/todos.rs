//! The seed article's Todo list as a read model: each `todo-*` stream's
//! latest state, the way its IndexerService keeps it.

use event_store::views::{forgotten, Change, Projection, ViewEvent, FORGOTTEN};
use serde_json::{json, Value};

pub struct Todos;

impl Projection for Todos {
    fn key(&self, event: &ViewEvent) -> Option<String> {
        event.entity().map(|todo| todo.stream.to_owned())
    }

    fn apply(&self, state: Option<&Value>, event: &ViewEvent) -> Result<Change, String> {
        let Some(todo) = event.entity() else { return Ok(Change::Keep) };
        // A forgotten subject's todo: its marker, kept (`forget` puts it there too).
        if state.is_some_and(|s| forgotten(s).is_some()) {
            return Ok(Change::Keep);
        }
        if let Some(marker) = todo.forgotten {
            return Ok(Change::Put(json!({ FORGOTTEN: marker })));
        }
        let title = &todo.data["title"];
        Ok(match (todo.event_type, state) {
            ("TodoCreated", _) => Change::Put(json!({ "title": title, "completed": false })),
            ("TodoUpdated", Some(state)) => Change::Put(json!({ "title": title, "completed": state["completed"] })),
            ("TodoCompleted", Some(state)) => Change::Put(json!({ "title": state["title"], "completed": true })),
            ("StreamDeleted", _) => Change::Delete,
            (other, _) => return Err(format!("{other} on todo {} at version {}", todo.stream, todo.version)),
        })
    }
}
