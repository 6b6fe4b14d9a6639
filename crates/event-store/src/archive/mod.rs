//! The cold tier's format and bookkeeping: complete slots as Parquet objects
//! in S3 ([`columns`]), cut by key slice ([`cut`]), chained by a manifest ([`manifest`]) whose entries,
//! object pointers and boundary live in the event table's bookkeeping
//! partition ([`store`]), each followed by readers only once checked
//! ([`vouch`]). The archiver that writes them is [`crate::archiver`]; below
//! everything that reads or writes the archive.

pub(crate) mod analyst;
pub mod anchor;
pub mod audit;
pub mod columns;
pub mod cut;
pub mod manifest;
pub mod object;
pub(crate) mod parts;
pub mod store;
pub(crate) mod vouch;

pub const HOUR_MS: i64 = 3_600_000;

/// The object's key: by date and hour of its first slot, then that slot.
/// Not by its end, which depends on when it was cut: a repeat after a crash
/// overwrites its own first attempt instead of leaving a second copy beside it.
pub fn object_key(prefix: &str, start: i64) -> String {
    let at = chrono::DateTime::from_timestamp_millis(start).unwrap_or_default();
    format!("{prefix}date={}/hour={}/{start:013}.parquet", at.format("%Y-%m-%d"), at.format("%H"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_laid_out_by_date_and_hour_of_their_first_slot() {
        // 2026-11-27T06:00:00Z and one hour later.
        let start = 1_795_759_200_000;
        assert_eq!(object_key("events/", start), "events/date=2026-11-27/hour=06/1795759200000.parquet");
    }
}
