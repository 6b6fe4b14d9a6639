//! What a reader checks before it follows the archive's records
//! (`docs/design.md#15`): a pointer against the manifest entry it names,
//! that entry against its anchor in S3 (written once, which no role of the
//! stack may replace or delete), and the object's bytes against the entry.
//! A slot before the boundary that no pointer covers is read as having had
//! no events only when the manifest says so: the entries on either side of
//! it are consecutive. Anything else is an error, never an empty slot.

use super::manifest::{Entry, Facts};
use super::object::Bucket;
use super::store::{self, Pointer};
use super::{anchor, columns::Row};
use crate::error::{Error, Result};

/// The anchored entry `pointer` names, once the pointer matches it.
pub(crate) async fn entry_of(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    bucket: &Bucket,
    pointer: &Pointer,
) -> Result<Entry> {
    let broken = |what: String| Error::Archive(format!("{what}: not read (event-store verify)"));
    let (stored, anchored) =
        tokio::join!(store::entry(dynamo, table, pointer.seq), anchor::stored(bucket, pointer.seq));
    let Some(entry) = stored? else {
        return Err(broken(format!(
            "the pointer to {} names entry {}, which the manifest lacks",
            pointer.object, pointer.seq
        )));
    };
    match anchored? {
        Some(Some(anchored)) if anchored == entry => {}
        None => {
            return Err(broken(format!(
                "entry {}'s anchor {} is missing (an entry appended before anchors gets its own at the archive function's next run)",
                entry.seq,
                anchor::key(entry.seq)
            )))
        }
        Some(_) => {
            return Err(broken(format!("entry {} is not what its anchor {} holds", entry.seq, anchor::key(entry.seq))))
        }
    }
    if entry.content_hash() != entry.hash {
        return Err(broken(format!("entry {}'s hash does not match its fields", entry.seq)));
    }
    let matches = entry.key == pointer.object
        && (entry.start, entry.end, entry.count) == (pointer.start, pointer.end, pointer.count);
    if !matches {
        return Err(broken(format!("the pointer to {} is not what entry {} says", pointer.object, entry.seq)));
    }
    Ok(entry)
}

/// Checks an object's `bytes`, decoded as `rows`, against its `entry`:
/// SHA-256, size, count, first and last key, and every row within its slots.
pub(crate) fn check_object(entry: &Entry, bytes: &[u8], rows: &[Row]) -> Result<()> {
    let keys: Vec<&str> = rows.iter().map(|r| r.sort_key.as_str()).collect();
    let within = rows.iter().all(|r| (entry.start..entry.end).contains(&r.slot));
    if entry.matches(&Facts::of(bytes, &keys)) && within {
        return Ok(());
    }
    Err(Error::Archive(format!(
        "{} is not the object entry {} describes: not read (event-store verify)",
        entry.key, entry.seq
    )))
}

/// Checks that `slot`, before the boundary and covered by no pointer (the
/// last one starting at or before it is `before`, the first after it
/// `after`), had no events when it was archived: the entries on either side
/// are consecutive (or it lies before the first), each as anchored.
pub(crate) async fn empty_slot(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    bucket: &Bucket,
    slot: i64,
    (before, after): (Option<Pointer>, Option<Pointer>),
) -> Result<()> {
    let missing = || {
        Error::Archive(format!(
            "slot {slot} is archived and no object holds it, nor does the manifest say it had no events \
             (a pointer or an entry is missing, or the boundary was moved): not read (event-store verify)"
        ))
    };
    let after = after.ok_or_else(missing)?;
    if before.as_ref().map_or(0, |b| b.seq + 1) != after.seq {
        return Err(missing());
    }
    if let Some(before) = &before {
        entry_of(dynamo, table, bucket, before).await?;
    }
    entry_of(dynamo, table, bucket, &after).await?;
    Ok(())
}
