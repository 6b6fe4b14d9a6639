//! Time slots and timestamps. Times are kept as milliseconds since the Unix
//! epoch (UTC) everywhere; ISO 8601 text only at the edges (envelope, playback input).

use std::time::{Duration, SystemTime};

use chrono::{DateTime, SecondsFormat, Utc};

use crate::error::{Error, Result};

/// Start of the slot holding `ms`: the event table's partition key.
pub fn slot_of(ms: i64, unit_ms: u64) -> i64 {
    ms.div_euclid(unit_ms as i64) * unit_ms as i64
}

/// ISO 8601 with milliseconds, UTC: `2026-11-21T05:58:44.123Z`.
pub fn format_ms(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// Parses an RFC 3339 / ISO 8601 timestamp with offset, or plain epoch milliseconds.
pub fn parse_time(text: &str) -> Result<i64> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|_| Error::BadInput(format!("{text:?} is not an ISO 8601 time like 2026-11-21T05:58:44Z")))
}

pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// A point in time as ms since the epoch.
pub(crate) fn ms_of(time: SystemTime) -> i64 {
    time.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Time left before `deadline`, zero when past it.
pub(crate) fn remaining(deadline: SystemTime) -> Duration {
    deadline.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO)
}

/// Time budget of a run whose deadline had already passed when it started.
pub const FALLBACK_BUDGET: Duration = Duration::from_secs(60);

/// The deadline a run works to. Lambda never starts a run past its deadline,
/// so a deadline already gone at the start is a clock that cannot be trusted
/// (skew, or a runtime emulator that sends none): the run then takes
/// `FALLBACK_BUDGET` rather than handing over after every page.
pub(crate) fn effective_deadline(deadline: SystemTime, started: SystemTime) -> SystemTime {
    if deadline <= started {
        started + FALLBACK_BUDGET
    } else {
        deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_gone_before_the_start_gets_the_fallback_budget() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let later = start + Duration::from_secs(5);
        assert_eq!(effective_deadline(later, start), later);
        assert_eq!(effective_deadline(start, start), start + FALLBACK_BUDGET);
        assert_eq!(effective_deadline(SystemTime::UNIX_EPOCH, start), start + FALLBACK_BUDGET);
    }

    #[test]
    fn remaining_time_is_zero_past_the_deadline() {
        assert_eq!(remaining(SystemTime::now() - Duration::from_secs(1)), Duration::ZERO);
        assert!(remaining(SystemTime::now() + Duration::from_secs(100)) > Duration::from_secs(99));
    }

    #[test]
    fn slots_truncate_down_including_before_epoch() {
        assert_eq!(slot_of(1_700_000_000_999, 1000), 1_700_000_000_000);
        assert_eq!(slot_of(1_700_000_001_000, 1000), 1_700_000_001_000);
        assert_eq!(slot_of(1_700_000_059_999, 60_000), 1_700_000_040_000);
        assert_eq!(slot_of(-1, 1000), -1000);
    }

    #[test]
    fn formats_and_parses_round_trip() {
        let ms = 1_763_704_724_123;
        let text = format_ms(ms);
        assert_eq!(text, "2025-11-21T05:58:44.123Z");
        assert_eq!(parse_time(&text).unwrap(), ms);
        assert_eq!(parse_time("2025-11-21T06:58:44.123+01:00").unwrap(), ms);
        assert_eq!(parse_time("1763704724123").unwrap(), ms);
        assert!(matches!(parse_time("yesterday"), Err(Error::BadInput(_))));
    }
}
