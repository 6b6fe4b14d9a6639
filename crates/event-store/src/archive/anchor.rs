//! The manifest's anchors: each entry also written once to S3, as
//! `manifest/<seq>.json`, when it is appended. The chain in DynamoDB proves
//! that no entry before the head was changed; the anchors pin the head too:
//! rewriting the last entry with its object, or the whole chain from some
//! entry on, leaves anchors that no longer match. An anchor is put with
//! `If-None-Match: *`, so no `PutObject` replaces it, no role of the stack may
//! delete it, and with Object Lock (`ArchiveObjectLockDays`) nobody can.

use super::manifest::Entry;
use super::object::Bucket;
use crate::error::{Error, Result};

/// Anchors live under this prefix of the store's bucket.
pub const PREFIX: &str = "manifest/";

pub fn key(seq: u64) -> String {
    format!("{PREFIX}{seq:012}.json")
}

/// Writes `entry`'s anchor once. Writing it again (a repeat after a crash)
/// is fine when the stored one is the same entry; a different one is an error.
pub(crate) async fn put(bucket: &Bucket, entry: &Entry) -> Result<()> {
    let body = serde_json::to_vec(entry).map_err(|e| Error::encode("archive anchor", e))?;
    let key = key(entry.seq);
    if bucket.put_new(&key, body, "application/json").await? {
        return Ok(());
    }
    match get(bucket, entry.seq).await? {
        Some(stored) if stored == *entry => Ok(()),
        _ => Err(Error::Archive(format!("s3://{}/{key} anchors another entry {}", bucket.name, entry.seq))),
    }
}

/// The anchored entry `seq` as S3 holds it: `None` when there is none, and
/// an entry that does not decode is anchored as no entry (`Some(None)`).
pub async fn get(bucket: &Bucket, seq: u64) -> Result<Option<Entry>> {
    Ok(stored(bucket, seq).await?.flatten())
}

/// `None`: no anchor; `Some(None)`: an anchor that is not an entry.
pub(crate) async fn stored(bucket: &Bucket, seq: u64) -> Result<Option<Option<Entry>>> {
    let Some(bytes) = bucket.get_if_there(&key(seq)).await? else { return Ok(None) };
    Ok(Some(serde_json::from_slice(&bytes).ok()))
}
