//! The archiver's object, put once: `If-None-Match: *` (the role may put no
//! other way), read back and checked; an earlier attempt's object found there
//! kept when it is one of these slots' (`docs/storage.md#cold-tier-s3`).

use std::collections::{BTreeSet, HashSet};

use tracing::warn;

use super::Archiver;
use crate::archive::columns::{self, Row};
use crate::archive::manifest::{self, Facts};
use crate::bookkeeping::late_slots;
use crate::error::{Error, Result};
use crate::time::now_ms;

impl Archiver {
    /// Puts the object made of `rows` once (`If-None-Match: *`: the role may
    /// not put any other way), reads it back and checks it; returns the
    /// facts of the object stored. An object already
    /// there is a repeat's after a crash: the same bytes are done; an earlier
    /// attempt's that misses events read since (late ones, written between
    /// the crash and this repeat) is kept as it is, and those events stay in
    /// the table with their slots marked late, where readers find them; any
    /// other object is an error (the errors alarm), and nothing is archived
    /// past it. The object is cut into `slices` slices ([`columns::write`]).
    pub(super) async fn put_once(&self, key: &str, rows: Vec<Row>, slices: u32) -> Result<Facts> {
        // Encoding and decoding Parquet is CPU work (and deep): off the runtime's threads.
        let (object, rows) =
            off_the_runtime(move || columns::write(&rows, slices).map(|object| (object, rows))).await?;
        let sha256 = manifest::sha256_hex(&object);
        let written = self.bucket.put_new(key, object, columns::CONTENT_TYPE).await?;
        let bytes = self.bucket.get(key).await?;
        let read_back = bytes.clone();
        let stored = off_the_runtime(move || Ok(columns::open(read_back))).await?;
        if written || manifest::sha256_hex(&bytes) == sha256 {
            return match stored {
                Ok(stored) if manifest::sha256_hex(&bytes) == sha256 && stored.rows == rows => Ok(stored.facts(&bytes)),
                _ => Err(Error::Archive(format!("{key} read back is not what was written: nothing deleted"))),
            };
        }
        let stored = match stored {
            Ok(stored) if in_order_among(&stored.rows, &rows, now_ms() / 1000) => stored,
            _ => {
                return Err(Error::Archive(format!(
                    "{key} is already there and is not an object of these slots' events: not replaced, nothing archived past it (event-store verify)"
                )))
            }
        };
        let kept: HashSet<&str> = stored.rows.iter().map(|r| r.sort_key.as_str()).collect();
        let late: BTreeSet<i64> = rows.iter().filter(|r| !kept.contains(r.sort_key.as_str())).map(|r| r.slot).collect();
        warn!(
            key,
            missed = rows.len().saturating_sub(stored.rows.len()),
            "an earlier attempt's object kept; the events it misses stay in the table as late ones"
        );
        late_slots::mark(&self.dynamo, &self.config.event_table, crate::bookkeeping::Family::Archive, &late).await?;
        Ok(stored.facts(&bytes))
    }
}

/// `work`'s answer, run on a blocking thread.
pub(super) async fn off_the_runtime<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| Error::Archive(format!("a blocking task failed: {e}")))?
}

/// Whether every row of `stored` is one of `rows`, in the same order, but
/// for rows past their retention's TTL (`now_s`): gone from the table since,
/// they are no reason to refuse the object that kept them.
fn in_order_among(stored: &[Row], rows: &[Row], now_s: i64) -> bool {
    let mut at = 0;
    for row in stored {
        match rows[at..].iter().position(|r| r == row) {
            Some(i) => at += i + 1,
            None if row.expires_at.is_some_and(|t| t <= now_s) => {}
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: i64) -> Row {
        let id = format!("shardId-000000000000:{n}");
        Row::of(&crate::event_item::EventItem {
            slot: 1_795_000_000_000,
            sort_key: crate::event_item::sort_key(1_795_000_000_000 + n, &id),
            event_id: id,
            arrival: 1_795_000_000_000 + n,
            partition_key: "k".into(),
            data: Some(format!("{{\"n\":{n}}}").into_bytes()),
            encoding: None,
            payload: None,
            expires_at: None,
            moved_at: None,
        })
        .unwrap()
    }

    #[test]
    fn an_earlier_object_is_kept_only_when_its_rows_are_among_the_ones_read_now_in_order() {
        let rows: Vec<Row> = (0..5).map(row).collect();
        let now = 1_795_000_000;
        assert!(in_order_among(&rows, &rows, now));
        assert!(in_order_among(&[row(0), row(2), row(4)], &rows, now), "late events missed");
        assert!(in_order_among(&[], &rows, now));
        assert!(!in_order_among(&[row(2), row(0)], &rows, now), "reordered");
        assert!(!in_order_among(&[row(0), row(9)], &rows, now), "an event never read");
        assert!(!in_order_among(&[row(1), row(1)], &rows, now), "one event twice");
        let expired = Row { expires_at: Some(now - 1), ..row(9) };
        assert!(in_order_among(&[row(0), expired.clone(), row(4)], &rows, now), "gone from the table by its TTL");
        assert!(!in_order_among(&[Row { expires_at: Some(now + 1), ..expired }], &rows, now), "not expired yet");
    }
}
