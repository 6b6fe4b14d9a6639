//! What part of the complete log a reader wants: a window of arrival time and
//! filters on the events' JSON. Pure: no I/O.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::event_item::sort_key_floor;
use crate::time::format_ms;

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
    /// `start..end` in ms: `end` before `start`, a start before 1970 or a
    /// window over `max` is an error.
    pub(crate) fn checked(start: i64, end: i64, max: Duration) -> Result<Self> {
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
    pub(crate) fn key_range(&self, slot: i64, unit_ms: u64) -> (String, String) {
        let from = self.start.max(slot);
        let to = self.end.min(slot + unit_ms as i64);
        (sort_key_floor(from), sort_key_floor(to))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::sort_key;

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
}
