//! Stream metadata, the pure part: what a stream keeps of its history
//! (KurrentDB's `$maxAge`, `$maxCount` and `$tb`), and which of its events
//! a reader is shown now. Reads apply the cut at once; the relay's cleanup
//! ([`super::metadata`]) removes what it hides from the table afterwards.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::model::{Batch, Invalid, Tip};

/// The application's own part of a stream's metadata, at most this many bytes of JSON.
pub const MAX_CUSTOM_METADATA_BYTES: usize = 16 * 1024;

/// A stream's metadata as clients send and read it (`PUT /streams/{name}/metadata`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamMetadata {
    /// Events appended more than this many seconds ago are not shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u64>,
    /// Only the latest this many events are shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_count: Option<u64>,
    /// Events below this version are not shown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate_before: Option<u64>,
    /// Free-form, the application's (the store only keeps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<Value>,
}

/// What a stream keeps of its history: the part of [`StreamMetadata`] reads act on,
/// kept on the stream's tip so every read has it without another request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_count: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate_before: Option<u64>,
}

impl StreamMetadata {
    /// Checks what a client sent: positive limits, custom metadata within its size.
    pub(crate) fn check(&self) -> Result<(), Invalid> {
        if self.max_age == Some(0) || self.max_count == Some(0) {
            return Err(Invalid::BadRequest("max_age and max_count are 1 or more".into()));
        }
        // Far past any use, and well inside the milliseconds arithmetic.
        if self.max_age.is_some_and(|s| s > 1_000 * 365 * 24 * 3600) {
            return Err(Invalid::BadRequest("max_age is at most 1,000 years".into()));
        }
        let custom = self.custom.as_ref().map_or(0, |c| c.to_string().len());
        if custom > MAX_CUSTOM_METADATA_BYTES {
            return Err(Invalid::TooLarge(format!(
                "custom metadata is {custom} bytes; the limit is {MAX_CUSTOM_METADATA_BYTES}"
            )));
        }
        Ok(())
    }

    pub(crate) fn retention(&self) -> Retention {
        Retention { max_age: self.max_age, max_count: self.max_count, truncate_before: self.truncate_before }
    }
}

/// Which of a stream's events a reader is shown now: versions from `from`,
/// appended at or after `not_before` (ms). Everything else is hidden, and
/// hidden events form a prefix of the stream (append times follow versions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cut {
    pub(crate) from: u64,
    pub(crate) not_before: Option<i64>,
}

impl Cut {
    /// Shows every event: what the relay reads (the log keeps every version).
    pub(crate) const NONE: Cut = Cut { from: 0, not_before: None };

    /// True when the batch appended at `at` is past the stream's `max_age`.
    pub(crate) fn expired(&self, at: i64) -> bool {
        self.not_before.is_some_and(|not_before| at < not_before)
    }

    /// True when none of the batch's events is shown: it may leave the table.
    pub(crate) fn hides_all(&self, batch: &Batch) -> bool {
        batch.last() < self.from || self.expired(batch.at)
    }
}

impl Retention {
    pub(crate) fn is_empty(&self) -> bool {
        *self == Retention::default()
    }

    /// What a stream at `version` shows at `now` (ms).
    pub(crate) fn cut(&self, version: u64, now: i64) -> Cut {
        let by_count = self.max_count.map_or(0, |count| (version + 1).saturating_sub(count));
        let from = by_count.max(self.truncate_before.unwrap_or(0));
        let not_before = self.max_age.map(|secs| now.saturating_sub(secs.saturating_mul(1000) as i64));
        Cut { from, not_before }
    }
}

impl Tip {
    /// Its retention, none when unset or unreadable (a tip is written by this
    /// code; an unreadable one shows everything rather than hide by mistake).
    pub(crate) fn retention(&self) -> Retention {
        self.retention.as_deref().and_then(|text| serde_json::from_str(text).ok()).unwrap_or_default()
    }

    /// What a reader of this stream is shown at `now`.
    pub(crate) fn cut(&self, now: i64) -> Cut {
        self.retention().cut(self.version, now)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn max_count_shows_the_latest_events_and_truncate_before_a_version() {
        let count = Retention { max_count: Some(10), ..Default::default() };
        assert_eq!(count.cut(24, 0).from, 15, "25 events (0..=24), the last 10");
        assert_eq!(count.cut(5, 0).from, 0, "fewer than max_count: all of them");
        let both = Retention { max_count: Some(10), truncate_before: Some(20), ..Default::default() };
        assert_eq!(both.cut(24, 0).from, 20, "the stricter of the two");
        assert_eq!(Retention::default().cut(24, 0), Cut::NONE);
    }

    #[test]
    fn max_age_hides_batches_appended_before_it() {
        let age = Retention { max_age: Some(60), ..Default::default() }.cut(9, 100_000);
        assert_eq!(age.not_before, Some(40_000));
        assert!(age.expired(39_999) && !age.expired(40_000));
        let batch = |first, at, events: usize| Batch {
            stream: "s".into(),
            item: super::super::model::batch_key(first),
            first,
            at,
            events: super::super::model::prepare(
                (0..events).map(|_| super::super::model::NewEvent::new("t", json!({}))).collect(),
                super::super::model::Limits::INLINE,
            )
            .unwrap(),
        };
        assert!(age.hides_all(&batch(0, 39_000, 3)) && !age.hides_all(&batch(3, 41_000, 3)));
        let count = Retention { max_count: Some(10), ..Default::default() }.cut(24, 0);
        assert!(count.hides_all(&batch(10, 0, 5)), "versions 10..=14: all below 15");
        assert!(!count.hides_all(&batch(12, 0, 5)), "versions 12..=16 straddle the cut: kept whole");
    }

    #[test]
    fn metadata_is_checked_and_typos_are_refused() {
        let ok: StreamMetadata =
            serde_json::from_value(json!({"max_count": 10, "custom": {"owner": "team-a"}})).unwrap();
        assert!(ok.check().is_ok());
        assert_eq!(ok.retention(), Retention { max_count: Some(10), ..Default::default() });
        assert!(serde_json::from_value::<StreamMetadata>(json!({"maxCount": 10})).is_err());
        let zero = StreamMetadata { max_count: Some(0), ..Default::default() };
        assert!(matches!(zero.check(), Err(Invalid::BadRequest(_))));
        let big = StreamMetadata { custom: Some(json!("x".repeat(MAX_CUSTOM_METADATA_BYTES))), ..Default::default() };
        assert!(matches!(big.check(), Err(Invalid::TooLarge(_))));
    }
}
