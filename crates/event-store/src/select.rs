//! What a reader keeps by what an event carries in the clear: its Kinesis
//! partition key (an entity stream's name), and the plain fields of its
//! record (`method`; an entity event's or a plain posted event's `type`).
//! An event these exclude is passed over before it is opened: no subject's
//! key is fetched for it and no offloaded payload. Pure: no I/O.
//!
//! What only a sealed or offloaded part holds (a posted event's `type` under
//! its subject's key, or in S3) is decided once the event is opened
//! ([`Select::keeps_opened`]), as the JSON-pointer filters are.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::envelope::entity_stream;
use crate::error::{Error, Result};
use crate::event_item::EventItem;

/// Where an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A hit of the pixel (`GET` or `POST` of `…/track.gif`: `sendBeacon` posts).
    Pixel,
    /// A posted JSON event (`…/events`).
    Post,
    /// An append to an entity stream.
    Stream,
}

impl std::str::FromStr for Source {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        serde_json::from_value(Value::String(text.to_owned()))
            .map_err(|_| Error::BadInput(format!("a source is pixel, post or stream, not {text:?}")))
    }
}

/// Events kept by fields in the clear; every list that is set must match (empty: any).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Select {
    /// Event types: an entity event's `type`, or a posted event's `type` field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// Entity-stream categories: a stream's name up to its first `-` (`todo-42` is of `todo`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    /// Entity streams whose name starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<Source>,
}

/// A stream's category: its name up to the first `-` (the whole name without one).
pub fn category(stream: &str) -> &str {
    stream.split_once('-').map_or(stream, |(category, _)| category)
}

impl Select {
    pub fn is_empty(&self) -> bool {
        self == &Select::default()
    }

    /// Empty names are refused (they would match nothing, or everything), and
    /// a category with a `-` (a category ends at a name's first `-`).
    pub fn check(&self) -> Result<()> {
        let empty = self.types.iter().chain(&self.categories).chain(&self.stream_prefix).any(|s| s.is_empty());
        if empty {
            return Err(Error::BadInput("a type, category or stream prefix to select is empty".into()));
        }
        if let Some(category) = self.categories.iter().find(|c| c.contains('-')) {
            return Err(Error::BadInput(format!(
                "category {category:?}: a category is a stream name's part before its first '-'"
            )));
        }
        Ok(())
    }

    /// Whether an event with `partition_key` and the record `record` (as
    /// stored: sealed parts still sealed) is kept: `None` when only its
    /// opened record can say (a `type` asked for, in a sealed or offloaded body).
    pub fn keeps(&self, partition_key: &str, record: Option<&Value>) -> Option<bool> {
        if self.is_empty() {
            return Some(true);
        }
        let stream = stream_of(partition_key, record);
        // The route load took, by the path's last segment (as `load` routes it; both stored in the clear).
        let path = record.and_then(|r| r.get("path")).and_then(Value::as_str);
        let source = match (&stream, path) {
            (Some(_), _) => Some(Source::Stream),
            (None, Some(path)) if path.rsplit('/').next() == Some("track.gif") => Some(Source::Pixel),
            (None, Some(_)) => Some(Source::Post),
            (None, None) => None,
        };
        let stream = stream.as_deref();
        if !self.sources.is_empty() && !source.is_some_and(|s| self.sources.contains(&s)) {
            return Some(false);
        }
        if !self.categories.is_empty() && !stream.is_some_and(|s| self.categories.iter().any(|c| c == category(s))) {
            return Some(false);
        }
        if let Some(prefix) = &self.stream_prefix {
            if !stream.is_some_and(|s| s.starts_with(prefix.as_str())) {
                return Some(false);
            }
        }
        if self.types.is_empty() {
            return Some(true);
        }
        if source == Some(Source::Pixel) {
            return Some(false); // A pixel hit has no body, so no type (sealed or not).
        }
        let body = record.and_then(|r| r.get("body")).filter(|b| !b.is_null());
        match body.and_then(|b| b.get("type")).and_then(Value::as_str) {
            Some(kind) => Some(self.types.iter().any(|t| t == kind)),
            // Sealed, or offloaded: the opened record says.
            None if record
                .is_some_and(|r| !is_null(r, "sealed") || !is_null(r, "sealed_ref") || !is_null(r, "body_ref")) =>
            {
                None
            }
            None => Some(false),
        }
    }

    /// Whether an opened event is kept.
    pub(crate) fn keeps_opened(&self, partition_key: &str, opened: Option<&Value>) -> bool {
        self.keeps(partition_key, opened).unwrap_or(false)
    }
}

/// A page's events as a reader of some keys, with a selection, takes them
/// before opening any.
#[derive(Debug, Default)]
pub struct Passed {
    /// To open: the reader's keys, not excluded by fields in the clear.
    pub kept: Vec<EventItem>,
    /// Of keys another reader is responsible for.
    pub other_keys: usize,
    /// Excluded by the selection.
    pub excluded: usize,
}

/// Passes over the events of keys `mine` does not hold and those `select`
/// excludes by fields in the clear, unopened. An item in its place (one that
/// does not decode: no key) is kept by every reader, and so is an event whose
/// bytes do not decode: opening it parks or counts it where it stands, never
/// skips it silently.
pub(crate) fn pass_over(events: Vec<EventItem>, mine: impl Fn(&str) -> bool, select: &Select) -> Passed {
    let mut passed = Passed::default();
    for event in events {
        if !(event.in_its_place() || mine(&event.partition_key)) {
            passed.other_keys += 1;
            continue;
        }
        let excluded = !select.is_empty()
            && !event.in_its_place()
            && event.bytes().is_ok_and(|bytes| {
                let record = serde_json::from_slice::<Value>(&bytes).ok();
                select.keeps(&event.partition_key, record.as_ref()) == Some(false)
            });
        if excluded {
            passed.excluded += 1;
        } else {
            passed.kept.push(event);
        }
    }
    passed
}

/// The entity stream an event is of: from its key, or, where a long name's
/// key is cut (`…#<digest>`), from the record's `body.stream` (in the clear).
fn stream_of(partition_key: &str, record: Option<&Value>) -> Option<String> {
    let cut = entity_stream(partition_key)?;
    let whole = record.and_then(|r| r.pointer("/body/stream")).and_then(Value::as_str);
    Some(match whole {
        Some(name) if name.starts_with(cut.split('#').next().unwrap_or(cut)) => name.to_owned(),
        _ => cut.to_owned(),
    })
}

fn is_null(record: &Value, field: &str) -> bool {
    record.get(field).is_none_or(Value::is_null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entity(kind: &str) -> Value {
        json!({"id": "todo-1/3", "method": "POST", "path": "/streams/todo-1", "body": {"type": kind, "data": "c2VhbGVk"}})
    }

    #[test]
    fn entity_events_are_selected_by_category_prefix_type_and_source_in_the_clear() {
        let todos = Select { categories: vec!["todo".into()], ..Default::default() };
        assert_eq!(todos.keeps("streams/todo-1", Some(&entity("added"))), Some(true));
        assert_eq!(todos.keeps("streams/todoist-1", Some(&entity("added"))), Some(false), "a category is whole");
        assert_eq!(todos.keeps("streams/order-9", Some(&entity("added"))), Some(false));
        assert_eq!(todos.keeps("user-7", Some(&json!({"method": "GET"}))), Some(false), "not a stream");
        let prefix = Select { stream_prefix: Some("todo-1".into()), ..Default::default() };
        assert_eq!(prefix.keeps("streams/todo-12", Some(&entity("added"))), Some(true));
        assert_eq!(prefix.keeps("streams/todo-2", Some(&entity("added"))), Some(false));
        let added = Select { types: vec!["added".into()], ..Default::default() };
        assert_eq!(added.keeps("streams/todo-1", Some(&entity("added"))), Some(true));
        assert_eq!(added.keeps("streams/todo-1", Some(&entity("done"))), Some(false));
        let streams = Select { sources: vec![Source::Stream], ..Default::default() };
        assert_eq!(streams.keeps("streams/todo-1", None), Some(true), "the key alone says");
        assert!(Select::default().is_empty() && Select::default().keeps("k", None) == Some(true));
    }

    #[test]
    fn http_events_by_source_and_a_sealed_posts_type_waits_for_the_opened_record() {
        let pixels = Select { sources: vec![Source::Pixel], ..Default::default() };
        assert_eq!(pixels.keeps("u-1", Some(&json!({"method": "GET", "path": "/track.gif"}))), Some(true));
        let beacon = json!({"method": "POST", "path": "/Prod/track.gif"});
        assert_eq!(pixels.keeps("u-1", Some(&beacon)), Some(true), "a sendBeacon post is a pixel hit");
        let post = json!({"method": "POST", "path": "/events", "body": {"type": "x"}});
        assert_eq!(pixels.keeps("u-1", Some(&post)), Some(false));
        let clicks = Select { types: vec!["click".into()], ..Default::default() };
        let click = json!({"method": "POST", "path": "/events", "body": {"type": "click"}});
        assert_eq!(clicks.keeps("u-1", Some(&click)), Some(true));
        let sealed_pixel = json!({"method": "GET", "path": "/track.gif", "sealed": {"key": "k"}});
        assert_eq!(clicks.keeps("u-1", Some(&sealed_pixel)), Some(false), "a pixel has no type: never opened for it");
        let sealed = json!({"method": "POST", "path": "/events", "body": null, "sealed": {"key": "k", "data": "…"}});
        assert_eq!(clicks.keeps("u-1", Some(&sealed)), None, "sealed: decided once opened");
        let opened = json!({"method": "POST", "path": "/events", "body": {"type": "click"}});
        assert!(clicks.keeps_opened("u-1", Some(&opened)));
        assert!(!clicks.keeps_opened("u-1", Some(&sealed)), "still sealed when opened (forgotten): not a match");
        assert_eq!("stream".parse::<Source>().unwrap(), Source::Stream);
        assert!("kafka".parse::<Source>().is_err());
        assert!(Select { types: vec![String::new()], ..Default::default() }.check().is_err());
        assert!(Select { categories: vec!["todo-1".into()], ..Default::default() }.check().is_err());
    }

    #[test]
    fn a_reader_opens_only_its_keys_selected_events_and_whatever_does_not_decode() {
        let item = |key: &str, data: Vec<u8>, encoding: Option<&str>| EventItem {
            slot: 0,
            sort_key: String::new(),
            event_id: String::new(),
            arrival: 0,
            partition_key: key.into(),
            data: Some(data),
            encoding: encoding.map(str::to_owned),
            payload: None,
            expires_at: None,
            moved_at: None,
        };
        let event = |key: &str, record: &Value| item(key, serde_json::to_vec(record).unwrap(), None);
        let undecodable = item("streams/order-3", vec![0xff, 0], Some("zstd"));
        let in_place = item("", vec![], None);
        let events = vec![
            event("streams/todo-1", &entity("added")),
            event("streams/order-1", &entity("added")),
            event("streams/todo-2", &entity("added")),
            undecodable,
            in_place,
        ];
        let todos = Select { categories: vec!["todo".into()], ..Default::default() };
        let passed = pass_over(events, |key| key != "streams/todo-2", &todos);
        let kept: Vec<&str> = passed.kept.iter().map(|e| e.partition_key.as_str()).collect();
        assert_eq!(kept, ["streams/todo-1", "streams/order-3", ""], "an undecodable event is opened (and parked)");
        assert_eq!((passed.other_keys, passed.excluded), (1, 1));
    }

    #[test]
    fn a_long_streams_cut_key_is_matched_by_the_name_its_record_carries() {
        let name = format!("todo{}", "x".repeat(300));
        let key = crate::envelope::entity_key(&name);
        assert!(key.len() <= 256 && key.contains('#'));
        let record =
            json!({"method": "POST", "path": format!("/streams/{name}"), "body": {"stream": name, "type": "a"}});
        let prefix = Select { stream_prefix: Some(format!("todo{}", "x".repeat(280))), ..Default::default() };
        assert_eq!(prefix.keeps(&key, Some(&record)), Some(true));
        let todos = Select { categories: vec![name.clone()], ..Default::default() };
        assert_eq!(todos.keeps(&key, Some(&record)), Some(true), "a name without '-' is its own category");
    }
}
