//! Time slots and timestamps. Times are kept as milliseconds since the Unix
//! epoch (UTC) everywhere; ISO 8601 text only at the edges (envelope, playback input).

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

#[cfg(test)]
mod tests {
    use super::*;

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
