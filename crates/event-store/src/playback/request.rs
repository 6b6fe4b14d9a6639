//! What a playback is asked for: the request payload, its filters, and the
//! window it names, validated. Pure: no I/O.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::log::window::{Filter, Window};
use crate::log::RecordFormat;
use crate::select::Select;
use crate::slices::KeyRange;
use crate::time::parse_time;

/// Window played back when the request names no start: the 15 minutes before its end.
pub const DEFAULT_WINDOW_MS: i64 = 15 * 60 * 1000;

/// The invocation payload. Times are ISO 8601 (or epoch ms).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaybackRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// Default: the end of the last complete slot (the watermark's slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// When `end` is past the watermark: how long to wait for it (default 0: answer `incomplete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    /// Pace of delivery in played events per second; default: the playback
    /// stream's write limit, open shards × 1,000 Kinesis records and × 1 MiB a second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records_per_second: Option<u64>,
    /// `aggregated` (default): the KPL aggregated-record format, one Kinesis
    /// record per partition key per request; `plain`: one Kinesis record per event.
    #[serde(default, skip_serializing_if = "RecordFormat::is_default")]
    pub record_format: RecordFormat,
    /// Only events whose JSON matches every filter are played.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<Filter>,
    /// Only events these fields in the clear select (types, categories, a
    /// stream prefix, sources); the others are passed over unopened.
    #[serde(default, skip_serializing_if = "Select::is_empty")]
    pub select: Select,
    /// One of several runs playing the window together (`--parallel N`):
    /// this run plays the keys of part `part` of `parts`, under an id of its
    /// own (the window's with `-<part>of<parts>`), at its share of the pace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyRange>,
    /// Names the run's checkpoint, bound to the window and filter of its
    /// first run; default: derived from start, end and filter (without
    /// `end`, from `start` and filter, so a retry reuses the first window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Play again from the start even if a checkpoint says this run is done
    /// (and, with a window named, bind the id to it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart: bool,
    /// Continuations only: the lease token of the chain. Where to go on is
    /// read from the stored checkpoint, never from the payload; an unknown
    /// token is just another runner, which must wait for the lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// Continuations so far in this chain (bounded by `MAX_CONTINUATIONS`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hop: u32,
}

fn is_zero(hop: &u32) -> bool {
    *hop == 0
}

impl PlaybackRequest {
    /// The request in an invocation payload (`null`: all defaults). Unknown
    /// fields and filters whose field is not a JSON pointer are bad input.
    pub(crate) fn from_payload(payload: Value) -> Result<Self> {
        let request: Self = if payload.is_null() {
            Self::default()
        } else {
            serde_json::from_value(payload).map_err(|e| Error::BadInput(format!("playback request: {e}")))?
        };
        for filter in &request.filter {
            if !(filter.field.is_empty() || filter.field.starts_with('/')) {
                return Err(Error::BadInput(format!("filter field {:?} is not a JSON pointer (/a/b)", filter.field)));
            }
        }
        request.select.check()?;
        if let Some(keys) = request.keys {
            keys.checked()?;
            // Each run paces at an N-th of the rate: less than an event a second each is not a pace.
            if request.max_records_per_second.is_some_and(|rate| rate < u64::from(keys.parts)) {
                return Err(Error::BadInput(format!(
                    "max_records_per_second: at least one a second for each of the {} runs",
                    keys.parts
                )));
            }
        }
        Ok(request)
    }

    /// The `end` the request names, if any.
    pub(crate) fn end_ms(&self) -> Result<Option<i64>> {
        self.end.as_deref().map(parse_time).transpose()
    }

    /// The window the request names: `end` defaults to `default_end` (the
    /// complete end), `start` to 15 minutes before `end`; checked as
    /// [`Window::checked`] does.
    pub fn window(&self, default_end: i64, max: Duration) -> Result<Window> {
        let end = self.end_ms()?.unwrap_or(default_end);
        let start = self.start.as_deref().map(parse_time).transpose()?.unwrap_or(end - DEFAULT_WINDOW_MS);
        Window::checked(start, end, max)
    }

    /// True when the opened event (its JSON, if it is JSON) passes the selection and every filter.
    pub(crate) fn wants(&self, partition_key: &str, event: Option<&Value>) -> bool {
        self.select.keeps_opened(partition_key, event) && self.filter.iter().all(|f| f.matches(event))
    }

    /// The keys this run plays (every key, unless it is one of several runs).
    pub(crate) fn key_range(&self) -> KeyRange {
        self.keys.unwrap_or(KeyRange::ALL)
    }

    /// What the run's id is bound to besides its window, as canonical JSON:
    /// the filter alone, written as ids were bound before selections and
    /// parts (fields in declaration order), or with them.
    pub(crate) fn binds(&self) -> String {
        let filter = serde_json::to_string(&self.filter).unwrap_or_default();
        if self.select.is_empty() && self.keys.is_none() {
            return filter;
        }
        let select = serde_json::to_string(&self.select).unwrap_or_default();
        let keys = serde_json::to_string(&self.keys).unwrap_or_default();
        format!(r#"{{"filter":{filter},"select":{select},"keys":{keys}}}"#)
    }

    /// The run's id for the window `asked`, and whether the request is open
    /// ended (neither `id` nor `end`: its window moves with the watermark).
    /// One of several runs adds its part to the id: each has its own
    /// checkpoint and lease. A continuation (`lease` set) names its run's own
    /// id, the part already in it.
    pub fn id_for(&self, asked: &Window) -> (String, bool) {
        if let (Some(id), Some(_)) = (&self.id, &self.lease) {
            return (id.clone(), false);
        }
        let (base, open_ended) = match (&self.id, &self.end) {
            (Some(id), _) => (id.clone(), false),
            (None, Some(_)) => (self.window_id(asked), false),
            (None, None) => (open_ended_id(self), true),
        };
        let id = match self.keys {
            Some(keys) => format!("{base}-{}of{}", keys.part, keys.parts),
            None => base,
        };
        (id, open_ended)
    }

    /// [`run_id`], with the selection when there is one.
    fn window_id(&self, window: &Window) -> String {
        if self.select.is_empty() {
            return run_id(window, &self.filter);
        }
        let whole = Self { keys: None, ..self.clone() }.binds();
        hash_id(&format!("{}-{}-{whole}", window.start, window.end))
    }
}

fn hash_id(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// The id of a run when the request names none: the same window and filter give the same id.
pub fn run_id(window: &Window, filter: &[Filter]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(format!("{}-{}-", window.start, window.end));
    hasher.update(serde_json::to_vec(filter).unwrap_or_default());
    hex::encode(&hasher.finalize()[..8])
}

/// The id of a request without `end` (and without an id): the window such a
/// request means moves with the watermark, so the id follows what the
/// request says (its `start`, if any, and filter). A retry while its run is
/// unfinished finds it and reuses its window; once done, the same request
/// binds the id to a new window.
pub(crate) fn open_ended_id(request: &PlaybackRequest) -> String {
    let mut hasher = Sha256::new();
    hasher.update(format!("open-{}-", request.start.as_deref().unwrap_or("")));
    hasher.update(serde_json::to_vec(&request.filter).unwrap_or_default());
    if !request.select.is_empty() {
        hasher.update(serde_json::to_vec(&request.select).unwrap_or_default());
    }
    format!("open-{}", hex::encode(&hasher.finalize()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::format_ms;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn window_defaults_to_the_15_minutes_before_the_complete_end() {
        let sealed = 1_800_000_000_000;
        let w = PlaybackRequest::default().window(sealed, DAY).unwrap();
        assert_eq!((w.start, w.end), (sealed - 900_000, sealed));
        let only_start = PlaybackRequest { start: Some("1970-01-01T00:00:01Z".into()), ..Default::default() };
        assert!(only_start.window(sealed, DAY).is_err(), "decades: over the maximum");
        let recent = PlaybackRequest { start: Some(format_ms(sealed - 3_600_000)), ..Default::default() };
        assert_eq!(recent.window(sealed, DAY).unwrap().start, sealed - 3_600_000);
    }

    #[test]
    fn reversed_or_unparseable_windows_are_bad_input() {
        let reversed = PlaybackRequest {
            start: Some("2026-01-02T00:00:00Z".into()),
            end: Some("2026-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(reversed.window(0, DAY), Err(Error::BadInput(_))));
        let too_long = PlaybackRequest {
            start: Some("2026-01-01T00:00:00Z".into()),
            end: Some("2026-01-03T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(too_long.window(0, DAY), Err(Error::BadInput(m)) if m.contains("48 hours")));
        let before_1970 = PlaybackRequest {
            start: Some("1969-12-31T23:00:00Z".into()),
            end: Some("1970-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(before_1970.window(0, DAY), Err(Error::BadInput(_))));
        let garbage = PlaybackRequest { start: Some("last tuesday".into()), ..Default::default() };
        assert!(matches!(garbage.window(0, DAY), Err(Error::BadInput(_))));
    }

    #[test]
    fn requests_parse_strictly_and_ids_follow_window_and_filter() {
        let request = PlaybackRequest::from_payload(serde_json::json!({
            "start": "2026-11-21T10:00:00Z", "end": "2026-11-21T10:05:00Z", "wait_seconds": 30,
            "max_records_per_second": 200, "filter": [{"field": "/path", "equals": "/track.gif"}]
        }))
        .unwrap();
        assert_eq!(request.filter.len(), 1);
        assert!(PlaybackRequest::from_payload(serde_json::json!({"strat": "x"})).is_err(), "typos are errors");
        let not_a_pointer = serde_json::json!({"filter": [{"field": "path", "equals": 1}]});
        assert!(
            matches!(PlaybackRequest::from_payload(not_a_pointer), Err(Error::BadInput(m)) if m.contains("pointer"))
        );
        assert_eq!(PlaybackRequest::from_payload(Value::Null).unwrap(), PlaybackRequest::default());
        let w = Window { start: 1, end: 2 };
        assert_eq!(run_id(&w, &[]), run_id(&w, &[]));
        assert_ne!(run_id(&w, &[]), run_id(&w, &request.filter));
        assert_ne!(run_id(&w, &[]), run_id(&Window { start: 1, end: 3 }, &[]));
    }

    #[test]
    fn parallel_runs_have_ids_of_their_own_bound_to_their_part_and_selection() {
        let w = Window { start: 1, end: 2 };
        let whole = PlaybackRequest { end: Some("1970-01-01T00:00:00.002Z".into()), ..Default::default() };
        let (id, open_ended) = whole.id_for(&w);
        assert_eq!((id.as_str(), open_ended), (run_id(&w, &[]).as_str(), false), "ids as before");
        assert_eq!(whole.binds(), "[]", "bindings as before");
        let filter: Vec<Filter> = vec!["/path=/track.gif".parse().unwrap()];
        let filtered = PlaybackRequest { filter: filter.clone(), ..whole.clone() };
        assert_eq!(filtered.binds(), serde_json::to_string(&filter).unwrap(), "a filter's binding as before");
        let part = |part| PlaybackRequest { keys: Some(KeyRange::new(part, 4)), ..whole.clone() };
        assert_eq!(part(2).id_for(&w).0, format!("{id}-2of4"));
        assert_ne!(part(1).binds(), part(2).binds());
        let todos = PlaybackRequest {
            select: Select { categories: vec!["todo".into()], ..Default::default() },
            ..whole.clone()
        };
        assert_ne!(todos.id_for(&w).0, id, "another selection, another run");
        assert_ne!(open_ended_id(&todos), open_ended_id(&PlaybackRequest::default()));
        let named = PlaybackRequest { id: Some("nightly".into()), keys: Some(KeyRange::new(0, 2)), ..whole.clone() };
        assert_eq!(named.id_for(&w).0, "nightly-0of2");
        let bad = serde_json::json!({"keys": {"part": 4, "parts": 4}});
        assert!(matches!(PlaybackRequest::from_payload(bad), Err(Error::BadInput(m)) if m.contains("part 4 of 4")));
        let bad = serde_json::json!({"select": {"categories": ["todo-1"]}});
        assert!(PlaybackRequest::from_payload(bad).is_err());
        let round = serde_json::to_value(part(3)).unwrap();
        assert_eq!(PlaybackRequest::from_payload(round).unwrap(), part(3), "a continuation keeps its part");
        let (run, _) = part(3).id_for(&w);
        let continuation = PlaybackRequest { id: Some(run.clone()), lease: Some("token".into()), ..part(3) };
        assert_eq!(continuation.id_for(&w).0, run, "a continuation goes on under its run's id");
        let slow = serde_json::json!({"keys": {"part": 0, "parts": 8}, "max_records_per_second": 7});
        assert!(matches!(PlaybackRequest::from_payload(slow), Err(Error::BadInput(m)) if m.contains("each of the 8")));
    }
}
