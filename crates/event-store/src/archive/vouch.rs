//! What a reader checks before it follows the archive's records
//! (`docs/design.md#15`): a pointer against the manifest entry it names,
//! that entry against its anchor in S3 (written once, which no role of the
//! stack may replace or delete), and the object's bytes against the entry.
//! A reader of some keys fetches only the footer and its slices' row groups
//! of an object cut by slice: it checks each against the entry's hashes.
//! A slot before the boundary that no pointer covers is read as having had
//! no events only when the manifest says so: the entries on either side of
//! it are consecutive. Anything else is an error, never an empty slot.

use std::ops::Range;

use super::anchor;
use super::columns::{Object, Row};
use super::manifest::Entry;
use super::object::Bucket;
use super::store::{self, Pointer};
use crate::error::{Error, Result};
use crate::slices::{key_hash, part_of};

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

/// Checks an object's `bytes`, decoded as `object`, against its `entry`:
/// SHA-256, size, count, first and last key, cut, and every row within its slots.
pub(crate) fn check_object(entry: &Entry, bytes: &[u8], object: &Object) -> Result<()> {
    let within = object.rows.iter().all(|r| (entry.start..entry.end).contains(&r.slot));
    if entry.matches(&object.facts(bytes)) && within {
        return Ok(());
    }
    Err(not_described(entry))
}

/// Checks the `footer` and the bytes from `at` holding row groups `groups`
/// of an object cut by slice against its `entry`'s hashes, before they are decoded.
pub(crate) fn check_fetched(
    entry: &Entry,
    footer: &[u8],
    (at, bytes): (u64, &[u8]),
    groups: Range<usize>,
) -> Result<()> {
    match &entry.cut {
        Some(cut) if cut.holds(footer, at, bytes, groups) => Ok(()),
        _ => Err(not_described(entry)),
    }
}

/// Checks the `rows` decoded from row groups `groups` of `entry`'s object:
/// as many as the entry says, each of its group's slices and within the slots.
pub(crate) fn check_rows(entry: &Entry, groups: Range<usize>, rows: &[Row]) -> Result<()> {
    let Some(groups) = entry.cut.as_ref().and_then(|cut| Some((cut.slices, cut.groups.get(groups)?))) else {
        return Err(not_described(entry));
    };
    let (slices, groups) = groups;
    let count: u64 = groups.iter().map(|g| g.rows).sum();
    let slices_read = groups.first().map_or(0..0, |first| first.slice..groups[groups.len() - 1].slice + 1);
    let fits = |r: &Row| {
        (entry.start..entry.end).contains(&r.slot) && slices_read.contains(&part_of(key_hash(&r.partition_key), slices))
    };
    if count == rows.len() as u64 && rows.iter().all(fits) {
        return Ok(());
    }
    Err(not_described(entry))
}

pub(crate) fn not_described(entry: &Entry) -> Error {
    Error::Archive(format!(
        "{} is not the object entry {} describes: not read (event-store verify)",
        entry.key, entry.seq
    ))
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
