//! Verifying the archive as it is now: the manifest's entries against the
//! objects S3 holds (`event-store verify`, and the demo). Recomputes each
//! object's SHA-256, count and first and last key from its bytes, and walks
//! the hash chain; the first break is reported where it is.

use serde::Serialize;

use super::columns;
use super::manifest::{self, Break, Entry, Facts};
use super::object::Bucket;
use super::store;
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
    for entry in &chosen {
        checked.push((*entry, facts_of(bucket, &entry.key).await?));
    }
    let events = chosen.iter().map(|e| e.count).sum();
    let (start, end) = (chosen.first().map(|e| e.start), chosen.last().map(|e| e.end));
    Ok(match manifest::verify(previous, checked) {
        Ok(entries) => Verified { entries, events, start, end, first_break: None },
        Err(broken) => {
            // The entries before the broken one passed.
            let entries = seq_of(&broken).saturating_sub(chosen.first().map_or(0, |e| e.seq));
            Verified { entries, events, start, end, first_break: Some(broken.to_string()) }
        }
    })
}

/// The facts of the object at `key` as S3 holds it; `None` when it is not there.
async fn facts_of(bucket: &Bucket, key: &str) -> Result<Option<Facts>> {
    let Some(bytes) = bucket.get_if_there(key).await? else { return Ok(None) };
    // An object that is no Parquet file at all, or not ours, is altered: its keys are none.
    let rows = columns::read(bytes.clone()).unwrap_or_default();
    let keys: Vec<&str> = rows.iter().map(|r| r.sort_key.as_str()).collect();
    Ok(Some(Facts::of(&bytes, &keys)))
}

fn seq_of(broken: &Break) -> u64 {
    match broken {
        Break::Sequence { seq, .. }
        | Break::EntryAltered { seq }
        | Break::Link { seq, .. }
        | Break::Range { seq, .. }
        | Break::ObjectMissing { seq, .. }
        | Break::ObjectAltered { seq, .. } => *seq,
    }
}
