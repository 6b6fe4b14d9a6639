//! Verifying the archive as it is now: the manifest's entries against the
//! objects S3 holds (`event-store verify`, and the demo). Recomputes each
//! object's SHA-256, count and first and last key from its bytes, and walks
//! the hash chain, and checks each entry against its anchor in S3
//! ([`super::anchor`]); the first break is reported where it is.

use serde::Serialize;

use super::anchor;
use super::columns;
use super::manifest::{self, Break, Entry, Facts};
use super::object::Bucket;
use super::store;
use crate::bookkeeping::late_slots;
use crate::bookkeeping::slot_index::read_index;
use crate::error::Result;

/// What a verification found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// Entries whose objects were checked.
    pub entries: u64,
    /// Events those objects hold.
    pub events: u64,
    /// The slots they cover: `[start, end)`, when any.
    pub start: Option<i64>,
    pub end: Option<i64>,
    /// The first break, if the chain breaks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_break: Option<String>,
}

/// Verifies the entries whose slots meet `[from, to)`, linked from the one
/// before them (trusted as stored: verify from the start to check it too).
pub async fn verify(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    bucket: &Bucket,
    from: i64,
    to: i64,
) -> Result<Verified> {
    let all = store::entries_from(dynamo, table, 0).await?;
    let first = all.iter().position(|e| e.end > from).unwrap_or(all.len());
    let previous = first.checked_sub(1).and_then(|i| all.get(i));
    let chosen: Vec<&Entry> = all[first..].iter().take_while(|e| e.start < to).collect();
    let mut checked = Vec::with_capacity(chosen.len());
    let mut unanchored = None;
    for entry in &chosen {
        checked.push((*entry, facts_of(bucket, &entry.key).await?));
        if unanchored.is_none() {
            let key = anchor::key(entry.seq);
            unanchored = match anchor::stored(bucket, entry.seq).await? {
                None => Some(Break::AnchorMissing { seq: entry.seq, key }),
                Some(anchored) if anchored.as_ref() != Some(*entry) => {
                    Some(Break::AnchorDiffers { seq: entry.seq, key })
                }
                Some(_) => None,
            };
        }
    }
    let events = chosen.iter().map(|e| e.count).sum();
    let (start, end) = (chosen.first().map(|e| e.start), chosen.last().map(|e| e.end));
    // The first break, in the chain or against the anchors.
    let broken = match (manifest::verify(previous, checked), unanchored) {
        (Ok(_), None) => None,
        (Ok(_), Some(anchor)) => Some(anchor),
        (Err(chain), Some(anchor)) if anchor.seq() < chain.seq() => Some(anchor),
        (Err(chain), _) => Some(chain),
    };
    // The chain holds: then what readers follow besides it (pointers, the boundary, late marks, anchors).
    let broken = match broken {
        // Boxed: its requests' futures would make every caller's future larger.
        None => Box::pin(followed(dynamo, table, bucket, &all, &chosen)).await?,
        broken => broken.map(|b| b.to_string()),
    };
    Ok(match broken {
        None => Verified { entries: chosen.len() as u64, events, start, end, first_break: None },
        Some(broken) if !broken.starts_with("entry ") => {
            Verified { entries: chosen.len() as u64, events, start, end, first_break: Some(broken) }
        }
        Some(broken) => {
            // The entries before the broken one passed.
            let seq = broken["entry ".len()..].split(':').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
            let entries = seq.saturating_sub(chosen.first().map_or(0, |e| e.seq));
            Verified { entries, events, start, end, first_break: Some(broken) }
        }
    })
}

/// The facts of the object at `key` as S3 holds it; `None` when it is not there.
async fn facts_of(bucket: &Bucket, key: &str) -> Result<Option<Facts>> {
    let Some(bytes) = bucket.get_if_there(key).await? else { return Ok(None) };
    // An object that is no Parquet file at all, or not ours, is altered: its keys are none.
    Ok(Some(match columns::open(bytes.clone()) {
        Ok(object) => object.facts(&bytes),
        Err(_) => Facts::of(&bytes, &[]),
    }))
}

/// The first problem in what readers follow besides the chain, for the
/// `chosen` entries of `all`: each entry's pointer as the entry says, and no
/// pointer without its entry; at the head, the boundary at its end, nothing
/// cleared past the boundary, and no anchor after it (an entry removed with
/// its object); late events in archived slots marked, so readers see them.
async fn followed(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    bucket: &Bucket,
    all: &[Entry],
    chosen: &[&Entry],
) -> Result<Option<String>> {
    let boundary = store::boundary(dynamo, table).await?;
    let (Some(first), Some(last)) = (chosen.first(), chosen.last()) else {
        // Nothing chosen: a manifest emptied while an anchor or the boundary says something was archived.
        if all.is_empty() && (boundary.archived_to > 0 || anchor::stored(bucket, 0).await?.is_some()) {
            return Ok(Some(
                "the manifest is empty, yet entry 0 is anchored or the boundary has moved: entries removed".into(),
            ));
        }
        return Ok(None);
    };
    let pointers = store::pointers(dynamo, table).await?;
    let head = all.last().map_or(0, |e| e.seq);
    // A run that stopped after appending the head has not written its pointer yet: readers do not
    // look for it until the boundary passes it, and the next run writes it first.
    for entry in chosen.iter().filter(|e| e.seq < head || e.end <= boundary.archived_to) {
        let theirs: Vec<&store::Pointer> = pointers.iter().filter(|p| p.seq == entry.seq).collect();
        let right = |p: &&store::Pointer| {
            p.object == entry.key && (p.start, p.end, p.count) == (entry.start, entry.end, entry.count)
        };
        match theirs.as_slice() {
            [] => {
                return Ok(Some(format!(
                    "entry {}: its pointer is missing, so readers would not find {}",
                    entry.seq, entry.key
                )))
            }
            [one] if right(one) => {}
            _ => return Ok(Some(format!("entry {}: its pointer is not what the entry says", entry.seq))),
        }
    }
    let in_window = |p: &&store::Pointer| p.end > first.start && p.start < last.end;
    if let Some(stray) = pointers.iter().filter(in_window).find(|p| p.seq > head || !all.iter().any(|e| e.seq == p.seq))
    {
        return Ok(Some(format!("a pointer to {} names entry {}, which the manifest lacks", stray.object, stray.seq)));
    }
    if last.seq == head {
        // Read again before saying so: a run may have appended it since the manifest was read.
        if anchor::stored(bucket, head + 1).await?.is_some() && store::entry(dynamo, table, head + 1).await?.is_none() {
            return Ok(Some(format!(
                "entry {}: it is anchored ({}) but not in the manifest: removed, with what it held",
                head + 1,
                anchor::key(head + 1)
            )));
        }
        if boundary.archived_to > last.end {
            return Ok(Some(format!(
                "the archive's boundary is at {}, past the last entry's end at {}: slots between would read as archived",
                crate::time::format_ms(boundary.archived_to),
                crate::time::format_ms(last.end)
            )));
        }
        if boundary.cleared_to > boundary.archived_to {
            return Ok(Some("items are recorded as cleared past the archive's boundary".into()));
        }
    }
    // Up to where the archived items are deleted (a run that stopped may have deletes left).
    let cleared = last.end.min(boundary.cleared_to);
    let (slots, _) = read_index(dynamo, table, first.start, cleared).await?;
    let marked = late_slots::in_range(dynamo, table, first.start, cleared).await?;
    for slot in slots.iter().filter(|s| !marked.contains(&s.slot)) {
        for key in slot.all_storage_keys() {
            let storage = (crate::event_item::HASH_KEY, aws_sdk_dynamodb::types::AttributeValue::N(key.to_string()));
            if !crate::dynamo::query_partition(dynamo, table, storage).await?.is_empty() {
                return Ok(Some(format!(
                    "slot {} is archived and the table still holds events of it, with no late mark: readers would not see them",
                    crate::time::format_ms(slot.slot)
                )));
            }
        }
    }
    Ok(None)
}
