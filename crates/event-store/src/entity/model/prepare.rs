//! What one append may hold, and the check that turns a client's events into what is stored.

use std::collections::HashSet;

use super::{
    Invalid, NewEvent, StoredEventItem, MAX_APPEND_BYTES, MAX_EVENTS_PER_APPEND, MAX_EVENT_BYTES, MAX_TYPE_BYTES,
};

/// What one append may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest event.
    pub event: usize,
    /// Events larger than this have their data offloaded (when there is a bucket for it).
    pub offload_over: Option<usize>,
}

impl Limits {
    /// Without a bucket: every event is stored in its batch item.
    pub const INLINE: Limits = Limits { event: MAX_EVENT_BYTES, offload_over: None };

    /// Whether an event of `size` bytes has its data offloaded.
    pub(crate) fn offloads(&self, size: usize) -> bool {
        self.offload_over.is_some_and(|inline| size > inline)
    }
}

/// What a `data_ref` takes in a batch item, at most (bucket name and key, hash, size).
const REF_BYTES: usize = 512;
/// The largest entity event kept inline when data can be offloaded: an
/// offloaded one keeps its id, type and metadata within [`MAX_EVENT_BYTES`].
pub const MAX_INLINE_EVENT: usize = MAX_EVENT_BYTES - REF_BYTES;

/// Checks an append and turns it into what is stored; events without an id get a random one.
pub fn prepare(events: Vec<NewEvent>, limits: Limits) -> Result<Vec<StoredEventItem>, Invalid> {
    if events.is_empty() {
        return Err(Invalid::BadRequest("no events to append".into()));
    }
    if events.len() > MAX_EVENTS_PER_APPEND {
        return Err(Invalid::TooLarge(format!("{} events; at most {MAX_EVENTS_PER_APPEND} per append", events.len())));
    }
    let mut ids = HashSet::new();
    let mut stored = Vec::with_capacity(events.len());
    for (i, event) in events.into_iter().enumerate() {
        if event.event_type.is_empty() || event.event_type.len() > MAX_TYPE_BYTES {
            return Err(Invalid::BadRequest(format!("event {i}: type is 1 to {MAX_TYPE_BYTES} bytes")));
        }
        if event.schema_version == Some(0) {
            return Err(Invalid::BadRequest(format!("event {i}: schema_version is 1 or more")));
        }
        let id = event.id.unwrap_or_else(uuid::Uuid::new_v4).to_string();
        if !ids.insert(id.clone()) {
            return Err(Invalid::BadRequest(format!("event {i}: id {id} appears twice")));
        }
        stored.push(StoredEventItem {
            id,
            event_type: event.event_type,
            data: event.data.to_string(),
            metadata: event.metadata.map(|m| m.to_string()),
            data_ref: None,
            subject: None,
            sealed: None,
            schema_version: event.schema_version.filter(|v| *v != 1),
            trace: event.trace,
        });
    }
    check(&stored, limits)?;
    Ok(stored)
}

/// Checks what an append stores against `limits` (again once its data is sealed: sealed data is
/// another size).
pub(crate) fn check(stored: &[StoredEventItem], limits: Limits) -> Result<(), Invalid> {
    let mut total = 0;
    for (i, item) in stored.iter().enumerate() {
        let size = item.size();
        if size > limits.event {
            return Err(Invalid::TooLarge(format!("event {i} is {size} bytes; the limit is {}", limits.event)));
        }
        // An offloaded event keeps its id, type and metadata in the item, and a reference for its data.
        let inline = if limits.offloads(size) { size - item.payload_len() + REF_BYTES } else { size };
        if inline > MAX_EVENT_BYTES {
            return Err(Invalid::TooLarge(format!(
                "event {i}: its id, type and metadata are {inline} bytes; the limit is {MAX_EVENT_BYTES}"
            )));
        }
        total += inline;
    }
    if total > MAX_APPEND_BYTES {
        return Err(Invalid::TooLarge(format!(
            "the events are {total} bytes together; the limit is {MAX_APPEND_BYTES}"
        )));
    }
    Ok(())
}
