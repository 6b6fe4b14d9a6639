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
    Ok(match broken {
        None => Verified { entries: chosen.len() as u64, events, start, end, first_break: None },
        Some(broken) => {
            // The entries before the broken one passed.
            let entries = broken.seq().saturating_sub(chosen.first().map_or(0, |e| e.seq));
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
