//! What a playback is asked for: the request payload, its filters, and the
//! window it names, validated. Pure: no I/O.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::event_item::sort_key_floor;
use crate::time::{format_ms, parse_time};

/// Window played back when the request names no start: the 15 minutes before its end.
pub const DEFAULT_WINDOW_MS: i64 = 15 * 60 * 1000;

/// The invocation payload. Times are ISO 8601 (or epoch ms).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaybackRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    /// Default: the end of the last sealed slot (the watermark's slot).
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
    pub fn from_payload(payload: Value) -> Result<Self> {
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
        Ok(request)
    }

    /// The `end` the request names, if any.
    pub fn end_ms(&self) -> Result<Option<i64>> {
        self.end.as_deref().map(parse_time).transpose()
    }

    /// True when `event` (its JSON, if it is JSON) passes every filter.
    pub fn wants(&self, event: Option<&Value>) -> bool {
        self.filter.iter().all(|f| f.matches(event))
    }
}

/// How played events become Kinesis records (see [`crate::aggregation`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordFormat {
    /// Many events of one partition key in one record, for consumers with a
    /// KPL deaggregator (the KCL, `aws-kinesis-agg`): past 1,000 records/s per shard.
    #[default]
    Aggregated,
    /// One record per event, for any consumer; a key's events go one request after another.
    Plain,
}

impl RecordFormat {
    fn is_default(&self) -> bool {
        *self == RecordFormat::default()
    }
}

/// `field` is a JSON pointer into the event (`/path`, `/query/page`); the
/// event matches when the value there equals `equals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    pub field: String,
    pub equals: Value,
}

/// `POINTER=VALUE` (`/path=/track.gif`), as the command line takes it: the
/// value is read as JSON when it parses, else as a string.
impl std::str::FromStr for Filter {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let (field, value) =
            text.split_once('=').filter(|(field, _)| field.is_empty() || field.starts_with('/')).ok_or_else(|| {
                Error::BadInput(format!("a filter is POINTER=VALUE, e.g. /path=/track.gif, not {text:?}"))
            })?;
        let equals = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
        Ok(Filter { field: field.to_owned(), equals })
    }
}

impl Filter {
    pub fn matches(&self, event: Option<&Value>) -> bool {
        event.and_then(|e| e.pointer(&self.field)) == Some(&self.equals)
    }
}

/// A validated window, in ms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

impl Window {
    /// `end` defaults to `default_end` (the sealed bound), `start` to 15
    /// minutes before `end`. `end` before `start`, a start before 1970 or a
    /// window over `max` is an error.
    pub fn parse(request: &PlaybackRequest, default_end: i64, max: Duration) -> Result<Self> {
        let end = request.end_ms()?.unwrap_or(default_end);
        let start = request.start.as_deref().map(parse_time).transpose()?.unwrap_or(end - DEFAULT_WINDOW_MS);
        if end < start {
            return Err(Error::BadInput(format!("end {} is before start {}", format_ms(end), format_ms(start))));
        }
        if start < 0 {
            return Err(Error::BadInput("start is before 1970".into()));
        }
        let max_ms = i64::try_from(max.as_millis()).unwrap_or(i64::MAX);
        if end - start > max_ms {
            return Err(Error::BadInput(format!(
                "the window is {} hours long; at most {} per request (PLAYBACK_MAX_HOURS)",
                (end - start) / 3_600_000,
                max_ms / 3_600_000
            )));
        }
        Ok(Self { start, end })
    }

    /// The sort-key range of `slot` that lies in the window (inclusive bounds:
    /// every real key is longer than the 13-digit floor, so `[floor(a), floor(b)]`
    /// holds exactly the events of `[a, b)`).
    pub fn key_range(&self, slot: i64, unit_ms: u64) -> (String, String) {
        let from = self.start.max(slot);
        let to = self.end.min(slot + unit_ms as i64);
        (sort_key_floor(from), sort_key_floor(to))
    }
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
pub fn open_ended_id(request: &PlaybackRequest) -> String {
    let mut hasher = Sha256::new();
    hasher.update(format!("open-{}-", request.start.as_deref().unwrap_or("")));
    hasher.update(serde_json::to_vec(&request.filter).unwrap_or_default());
    format!("open-{}", hex::encode(&hasher.finalize()[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::sort_key;

    const DAY: Duration = Duration::from_secs(86_400);

    #[test]
    fn a_filter_on_the_command_line_is_a_pointer_and_a_json_or_text_value() {
        let f: Filter = "/path=/track.gif".parse().unwrap();
        assert_eq!((f.field.as_str(), &f.equals), ("/path", &Value::String("/track.gif".into())));
        let n: Filter = "/n=3".parse().unwrap();
        assert_eq!(n.equals, serde_json::json!(3), "a value that parses as JSON is JSON");
        assert!(n.matches(Some(&serde_json::json!({"n": 3}))) && !n.matches(Some(&serde_json::json!({"n": "3"}))));
        assert_eq!("=3".parse::<Filter>().unwrap().field, "", "the empty pointer: the whole event");
        for bad in ["path=/x", "/path", ""] {
            assert!(bad.parse::<Filter>().is_err(), "{bad:?} is no filter");
        }
    }

    #[test]
    fn window_defaults_to_the_15_minutes_before_the_sealed_bound() {
        let sealed = 1_800_000_000_000;
        let w = Window::parse(&PlaybackRequest::default(), sealed, DAY).unwrap();
        assert_eq!((w.start, w.end), (sealed - 900_000, sealed));
        let only_start = PlaybackRequest { start: Some("1970-01-01T00:00:01Z".into()), ..Default::default() };
        assert!(Window::parse(&only_start, sealed, DAY).is_err(), "decades: over the maximum");
        let recent = PlaybackRequest { start: Some(format_ms(sealed - 3_600_000)), ..Default::default() };
        assert_eq!(Window::parse(&recent, sealed, DAY).unwrap().start, sealed - 3_600_000);
    }

    #[test]
    fn reversed_or_unparseable_windows_are_bad_input() {
        let reversed = PlaybackRequest {
            start: Some("2026-01-02T00:00:00Z".into()),
            end: Some("2026-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(Window::parse(&reversed, 0, DAY), Err(Error::BadInput(_))));
        let too_long = PlaybackRequest {
            start: Some("2026-01-01T00:00:00Z".into()),
            end: Some("2026-01-03T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(Window::parse(&too_long, 0, DAY), Err(Error::BadInput(m)) if m.contains("48 hours")));
        let before_1970 = PlaybackRequest {
            start: Some("1969-12-31T23:00:00Z".into()),
            end: Some("1970-01-01T00:00:00Z".into()),
            ..Default::default()
        };
        assert!(matches!(Window::parse(&before_1970, 0, DAY), Err(Error::BadInput(_))));
        let garbage = PlaybackRequest { start: Some("last tuesday".into()), ..Default::default() };
        assert!(matches!(Window::parse(&garbage, 0, DAY), Err(Error::BadInput(_))));
    }

    #[test]
    fn key_ranges_clip_the_first_and_last_slot_to_the_window() {
        let w = Window { start: 1_500, end: 3_250 };
        let (from, to) = w.key_range(1_000, 1000);
        assert!(sort_key(1_499, "s:1") < from && from <= sort_key(1_500, "s:1"));
        assert!(sort_key(1_999, "s:9") <= to);
        let (from, to) = w.key_range(3_000, 1000);
        assert!(from <= sort_key(3_000, "s:1"));
        assert!(sort_key(3_249, "s:1") <= to && to < sort_key(3_250, "s:1"));
    }

    #[test]
    fn filters_compare_the_value_at_a_json_pointer() {
        let event = serde_json::json!({"path": "/track.gif", "query": {"page": "/docs"}, "n": 3});
        let f = |field: &str, equals: Value| Filter { field: field.into(), equals };
        assert!(f("/path", "/track.gif".into()).matches(Some(&event)));
        assert!(f("/query/page", "/docs".into()).matches(Some(&event)));
        assert!(f("/n", 3.into()).matches(Some(&event)));
        assert!(!f("/n", "3".into()).matches(Some(&event)), "types must match");
        assert!(!f("/missing", Value::Null).matches(Some(&event)));
        assert!(!f("/path", "/track.gif".into()).matches(None), "binary events never match a filter");
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
}
