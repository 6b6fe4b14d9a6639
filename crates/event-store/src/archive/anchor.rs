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

/// Anchors the entries appended before anchors existed, once, so that
/// readers may follow anchored entries only ([`super::vouch`]); the number
/// anchored. Sound only from a chain that holds: from the first entry on,
/// each entry's hash its own and linked to the one before, up to the first
/// entry with an anchor, which must be the entry as stored (it pins the
/// chain before it). With no anchor at all the chain's head is trusted as
/// stored, as it was before anchors.
pub(crate) async fn backfill(dynamo: &aws_sdk_dynamodb::Client, table: &str, bucket: &Bucket) -> Result<u64> {
    // Nothing archived yet, or the first entry anchored (an S3 GET that may find nothing: the role may list).
    if super::store::head(dynamo, table).await?.is_none() || stored(bucket, 0).await?.is_some() {
        return Ok(0);
    }
    let entries = super::store::entries_from(dynamo, table, 0).await?;
    let mut unanchored = Vec::new();
    for entry in &entries {
        match stored(bucket, entry.seq).await? {
            None => unanchored.push(entry),
            Some(Some(anchored)) if anchored == *entry => break,
            Some(_) => {
                return Err(Error::Archive(format!(
                    "entry {} is not what its anchor holds (event-store verify)",
                    entry.seq
                )))
            }
        }
    }
    let mut previous: Option<&Entry> = None;
    for (i, entry) in entries.iter().take(unanchored.len() + 1).enumerate() {
        let linked = entry.prev == previous.map_or(super::manifest::GENESIS, |p| p.hash.as_str());
        if entry.seq != i as u64 || entry.content_hash() != entry.hash || !linked {
            return Err(Error::Archive(format!(
                "entry {}: the chain before the first anchor does not hold; nothing anchored (event-store verify)",
                entry.seq
            )));
        }
        previous = Some(entry);
    }
    for entry in &unanchored {
        put(bucket, entry).await?;
    }
    Ok(unanchored.len() as u64)
}
