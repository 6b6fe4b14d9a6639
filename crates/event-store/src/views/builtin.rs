//! The projections the store runs without user code, configured by JSON:
//! `state` (each entity stream's state) and `count` (events per key per
//! minute, hour and day). Pure.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::Digest;

use super::{forgotten, Change, Projection, ViewEvent, FORGOTTEN};
use crate::envelope::STREAM_DELETED;
use crate::hit::Hit;

/// How a `state` view folds a stream's events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fold {
    /// Each event's `data` is a JSON merge patch (RFC 7386) of the state:
    /// its fields replace the state's, a `null` removes one.
    #[default]
    Merge,
    /// Each event's `data` is the whole state.
    Replace,
}

/// What a `count` view counts by (the key's last part).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum By {
    /// The page's path, without its query: a posted event's `page` or `path`
    /// field (the pixel's parameter), else the path of the `Referer` header
    /// (for the pixel, the page that embeds it) ([`Hit::page_path`]).
    Page,
    /// The referrer's host: a posted event's (or the pixel's query's)
    /// `referrer`, a host or a URL ([`Hit::referrer_host`]).
    ReferrerHost,
    /// The event's type: an entity event's `type`, a posted event's `type`
    /// field, the pixel's `type` parameter ([`Hit::event_type`]).
    Type,
    /// The entity: an entity event's stream, else the event's subject as its
    /// keyed hash (never a subject's clear id); events with neither are not counted.
    Entity,
}

/// A built-in projection's definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Builtin {
    /// Per entity stream (the key is its name): its state, folded from its events' `data`; a
    /// deleted stream's (`StreamDeleted`) leaves the view.
    State {
        #[serde(default)]
        fold: Fold,
    },
    /// Per value of `by`: events per minute, hour and day, under keys
    /// `minute/2026-11-29T04:31/<value>`, `hour/2026-11-29T04/<value>`,
    /// `day/2026-11-29/<value>` (by arrival, UTC), so a prefix lists one period's values.
    Count { by: By },
}

impl Projection for Builtin {
    fn key(&self, event: &ViewEvent) -> Option<String> {
        match self {
            Builtin::State { .. } => event.entity().map(|e| e.stream.to_owned()),
            Builtin::Count { .. } => None,
        }
    }

    fn apply(&self, state: Option<&Value>, event: &ViewEvent) -> std::result::Result<Change, String> {
        let (Builtin::State { fold }, Some(entity)) = (self, event.entity()) else { return Ok(Change::Keep) };
        // A forgotten subject's state stays the marker; its events, opened after the forget, become it.
        if state.is_some_and(|s| forgotten(s).is_some()) {
            return Ok(Change::Keep);
        }
        if let Some(marker) = entity.forgotten {
            return Ok(Change::Put(serde_json::json!({ FORGOTTEN: marker })));
        }
        if entity.event_type == STREAM_DELETED {
            return Ok(Change::Delete);
        }
        Ok(Change::Put(match fold {
            Fold::Replace => entity.data.clone(),
            Fold::Merge => {
                let mut next = state.cloned().unwrap_or(Value::Null);
                json_patch::merge(&mut next, entity.data);
                next
            }
        }))
    }

    fn tallies(&self, event: &ViewEvent) -> Vec<(String, i64)> {
        let Builtin::Count { by } = self else { return Vec::new() };
        let Some(value) = value_of(*by, event) else { return Vec::new() };
        let Some(at) = DateTime::<Utc>::from_timestamp_millis(event.event_ms) else { return Vec::new() };
        [("minute", "%Y-%m-%dT%H:%M"), ("hour", "%Y-%m-%dT%H"), ("day", "%Y-%m-%d")]
            .into_iter()
            .map(|(period, format)| (format!("{period}/{}/{value}", at.format(format)), 1))
            .collect()
    }
}

/// The value of `by` in `event`, if it has one.
fn value_of(by: By, event: &ViewEvent) -> Option<String> {
    let hit = || event.data.as_ref().map(Hit);
    let value = match by {
        By::Page => hit()?.page_path()?,
        By::ReferrerHost => hit()?.referrer_host()?,
        By::Type => hit()?.event_type()?.to_owned(),
        // A stream that is a data subject carries its keyed hash: counted by that, not by its name.
        By::Entity => match (event.entity(), event.body().and_then(|b| b.get("subject")).and_then(Value::as_str)) {
            (Some(_), Some(subject)) => subject.to_owned(),
            (Some(entity), None) => entity.stream.to_owned(),
            (None, _) => event.field("subject")?.to_owned(),
        },
    };
    (!value.is_empty()).then(|| bounded(value))
}

/// The longest value a counter's key keeps whole: a longer one (a pixel's `Referer` is the
/// client's to choose) is cut and completed with a hash of the whole, so keys stay well under
/// DynamoDB's 1,024 bytes and apart.
const MAX_VALUE_BYTES: usize = 200;

fn bounded(value: String) -> String {
    if value.len() <= MAX_VALUE_BYTES {
        return value;
    }
    let mut end = MAX_VALUE_BYTES - 17;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    let digest = hex::encode(&sha2::Sha256::digest(value.as_bytes())[..8]);
    format!("{}#{digest}", &value[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::tests::event;
    use serde_json::json;

    fn entity(version: u64, data: Value) -> ViewEvent {
        let body = json!({"stream": "todo-1", "EntityId": "todo-1", "version": version, "type": "t", "data": data});
        event("streams/todo-1", 1_000 + version as i64, json!({"body": body}))
    }

    #[test]
    fn state_views_merge_or_replace_each_streams_data_in_order() {
        let merge = Builtin::State { fold: Fold::Merge };
        let (first, second) =
            (entity(0, json!({"title": "milk", "done": false})), entity(1, json!({"done": true, "title": null})));
        assert_eq!(merge.key(&first).as_deref(), Some("todo-1"));
        let Change::Put(state) = merge.apply(None, &first).unwrap() else { panic!("a put") };
        let Change::Put(state) = merge.apply(Some(&state), &second).unwrap() else { panic!("a put") };
        assert_eq!(state, json!({"done": true}), "RFC 7386: fields replaced, a null removes one");
        let replace = Builtin::State { fold: Fold::Replace };
        assert_eq!(
            replace.apply(Some(&json!({"a": 1})), &second).unwrap(),
            Change::Put(json!({"done": true, "title": null}))
        );
        let gone = entity(2, Value::Null);
        let mut gone = gone.clone();
        gone.data.as_mut().unwrap()["body"]["forgotten"] = json!({"at": "T", "generation": 0});
        let Change::Put(marker) = merge.apply(Some(&state), &gone).unwrap() else { panic!("a put") };
        assert_eq!(marker, json!({"$forgotten": {"at": "T", "generation": 0}}), "a forgotten event: the marker");
        assert_eq!(merge.apply(Some(&marker), &first).unwrap(), Change::Keep, "and it stays");
        let mut deleted = entity(3, json!({}));
        deleted.data.as_mut().unwrap()["body"]["type"] = json!("StreamDeleted");
        assert_eq!(merge.apply(Some(&state), &deleted).unwrap(), Change::Delete, "a deleted stream leaves");
        let hit = event("visitor-1", 5, json!({"path": "/track.gif"}));
        assert_eq!((merge.key(&hit), merge.apply(None, &hit).unwrap()), (None, Change::Keep), "not an entity event");
    }

    #[test]
    fn counts_go_to_a_minute_an_hour_and_a_day_per_value() {
        // 2026-11-29T04:31:10Z
        let ms = 1_795_926_670_000;
        let pixel = json!({"path": "/track.gif", "headers": {"referer": "https://shop.example/cart?x=1#top"}});
        let mut hit = event("v", ms, pixel);
        hit.event_ms = ms;
        let pages = Builtin::Count { by: By::Page };
        assert_eq!(
            pages.tallies(&hit),
            vec![
                ("minute/2026-11-29T04:31//cart".into(), 1),
                ("hour/2026-11-29T04//cart".into(), 1),
                ("day/2026-11-29//cart".into(), 1)
            ]
        );
        assert_eq!(pages.key(&hit), None, "counters are only added to");
        let hosts = Builtin::Count { by: By::ReferrerHost };
        assert!(hosts.tallies(&hit).is_empty(), "the Referer is the page, not where its visitor came from");
        let posted = event(
            "v",
            ms,
            json!({"body": {"type": "signup", "page": "/join?ref=x", "referrer": "https://news.example/a"}}),
        );
        assert!(pages.tallies(&posted)[2].0.ends_with("//join"), "a posted page field wins");
        let tagged = event("v", ms, json!({"query": {"page": ["/p?x=1"]}, "headers": {"referer": "https://a/b"}}));
        assert!(pages.tallies(&tagged)[0].0.ends_with("//p"), "the pixel's page parameter");
        assert!(hosts.tallies(&posted)[0].0.ends_with("/news.example"));
        let tracked = event("v", ms, json!({"body": {"type": "pageview", "path": "/a?b", "referrer": "News.example"}}));
        assert!(pages.tallies(&tracked)[0].0.ends_with("//a"), "the tracker's path field");
        assert!(hosts.tallies(&tracked)[0].0.ends_with("/news.example"), "the tracker's bare host");
        assert!(Builtin::Count { by: By::Type }.tallies(&posted)[1].0.ends_with("/signup"));
        let typed = event("v", ms, json!({"path": "/track.gif", "query": {"type": ["download"]}}));
        assert!(Builtin::Count { by: By::Type }.tallies(&typed)[1].0.ends_with("/download"), "the pixel's type");
        let sealed = event("alice", ms, json!({"subject": "h:3f2a", "body": {"EntityId": "alice"}}));
        let entities = Builtin::Count { by: By::Entity };
        assert!(entities.tallies(&sealed)[0].0.ends_with("/h:3f2a"), "by the keyed hash, not the clear id");
        assert!(entities.tallies(&event("anon", ms, json!({"path": "/track.gif"}))).is_empty());
        let body = json!({"stream": "user-7", "version": 0, "type": "t", "data": null, "subject": "s:9c"});
        let sealed_stream = event("streams/user-7", ms, json!({"body": body}));
        assert!(entities.tallies(&sealed_stream)[0].0.ends_with("/s:9c"), "a subject's stream by its hash");
        let long = format!("https://x.example/{}", "p".repeat(3_000));
        let long_page = pages.tallies(&event("v", ms, json!({"headers": {"referer": long}})));
        assert!(long_page[0].0.len() < 300, "a long value is cut: {}", long_page[0].0.len());
    }

    #[test]
    fn definitions_read_as_the_cli_writes_them() {
        let state: Builtin = serde_json::from_value(json!({"kind": "state"})).unwrap();
        assert_eq!(state, Builtin::State { fold: Fold::Merge });
        let count: Builtin = serde_json::from_value(json!({"kind": "count", "by": "referrer_host"})).unwrap();
        assert_eq!(count, Builtin::Count { by: By::ReferrerHost });
        assert!(serde_json::from_value::<Builtin>(json!({"kind": "count"})).is_err(), "by is required");
        assert!(serde_json::from_value::<Builtin>(json!({"kind": "state", "fold": "sum"})).is_err());
    }
}
