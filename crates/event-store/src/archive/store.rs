//! The archive's bookkeeping items, in its own partition of the event
//! table (slot -4): the manifest entries (`archive#entry#<seq>`), one
//! time-ordered pointer per object for readers (`archive#object#<start>#<seq>`),
//! and the boundary (`archive#boundary`: slots before it are read from S3).
//!
//! A stack upgraded from when they were in slot -2 has them there until the
//! archiver's next run moves them ([`adopt`]; never, if archiving was turned
//! off since): until then they are read there ([`read_from`]).

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use super::manifest::Entry;
use crate::bookkeeping::{self, moved_forward, moving, query_in, unless_condition_failed, Family};
use crate::error::{Error, Result};
use crate::event_item::{HASH_KEY, RANGE_KEY};

const ENTRY: &str = "archive#entry#";
const OBJECT: &str = "archive#object#";
const BOUNDARY: &str = "archive#boundary";
const LEASE: &str = "archive#lease";

fn key(sort_key: String) -> HashMap<String, AttributeValue> {
    bookkeeping::key_in(Family::Archive, sort_key)
}

/// Where the archive's items are read: the archive's partition, unless only
/// slot -2 has a boundary (an upgraded stack whose archive has not moved;
/// the move copies the boundary last, so either place is whole).
async fn read_from(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Family> {
    Ok(match boundary_item(dynamo, table).await? {
        Some((family, _)) => family,
        None => Family::Archive,
    })
}

/// The boundary item, and which partition it is in (see [`read_from`]).
async fn boundary_item(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<Option<(Family, HashMap<String, AttributeValue>)>> {
    for family in [Family::Archive, Family::legacy()] {
        if let Some(item) = bookkeeping::get_in(dynamo, table, family, BOUNDARY.to_owned()).await? {
            return Ok(Some((family, item)));
        }
    }
    Ok(None)
}

async fn query_range(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: String,
    to: String,
) -> Result<(Vec<HashMap<String, AttributeValue>>, usize)> {
    query_in(dynamo, table, read_from(dynamo, table).await?, (from, to)).await
}

fn entry_key(seq: u64) -> String {
    format!("{ENTRY}{seq:012}")
}

fn object_key(start: i64, seq: u64) -> String {
    format!("{OBJECT}{start:013}#{seq:012}")
}

fn with_key(sort_key: String, mut item: HashMap<String, AttributeValue>) -> HashMap<String, AttributeValue> {
    item.extend(key(sort_key));
    item
}

/// The last manifest entry, if any.
pub(crate) async fn head(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Option<Entry>> {
    let family = read_from(dynamo, table).await?;
    let out = dynamo
        .query()
        .table_name(table)
        .key_condition_expression("#slot = :slot AND begins_with(#key, :prefix)")
        .expression_attribute_names("#slot", HASH_KEY)
        .expression_attribute_names("#key", RANGE_KEY)
        .expression_attribute_values(":slot", AttributeValue::N(family.slot().to_string()))
        .expression_attribute_values(":prefix", AttributeValue::S(ENTRY.to_owned()))
        .scan_index_forward(false)
        .limit(1)
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| Error::dynamo("Query", e))?;
    out.items().first().map(decode_entry).transpose()
}

/// Every manifest entry from `seq` on, in order.
pub async fn entries_from(dynamo: &aws_sdk_dynamodb::Client, table: &str, seq: u64) -> Result<Vec<Entry>> {
    let (items, _) = query_range(dynamo, table, entry_key(seq), format!("{ENTRY}~")).await?;
    items.iter().map(decode_entry).collect()
}

/// The entry `seq`, if it exists (a `Query`, which every reader of the log may send).
pub(crate) async fn entry(dynamo: &aws_sdk_dynamodb::Client, table: &str, seq: u64) -> Result<Option<Entry>> {
    let (items, _) = query_range(dynamo, table, entry_key(seq), entry_key(seq)).await?;
    items.first().map(decode_entry).transpose()
}

fn decode_entry(item: &HashMap<String, AttributeValue>) -> Result<Entry> {
    let mut item = item.clone();
    item.remove(HASH_KEY);
    item.remove(RANGE_KEY);
    serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("archive manifest entry: {e}")))
}

/// Appends `entry` to the manifest: only as the next one (no entry `seq`
/// yet). True when it is stored (also when this very entry already was: a
/// repeat after a crash); false when another entry holds the place.
pub(crate) async fn append(dynamo: &aws_sdk_dynamodb::Client, table: &str, entry: &Entry) -> Result<bool> {
    let item: HashMap<String, AttributeValue> =
        serde_dynamo::to_item(entry).map_err(|e| Error::encode("archive manifest entry", e))?;
    let put = dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(with_key(entry_key(entry.seq), item)))
        .condition_expression("attribute_not_exists(#key)")
        .expression_attribute_names("#key", RANGE_KEY)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    match put {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.as_service_error(), Some(PutItemError::ConditionalCheckFailedException(_))) => {
            Ok(self::entry(dynamo, table, entry.seq).await?.is_some_and(|stored| stored == *entry))
        }
        Err(e) => Err(Error::dynamo("PutItem", e)),
    }
}

/// The reader's pointer to an object: by start time, so a window finds its objects with one `Query`.
pub(crate) async fn put_object_pointer(dynamo: &aws_sdk_dynamodb::Client, table: &str, entry: &Entry) -> Result<()> {
    let item = HashMap::from([
        ("object".to_owned(), AttributeValue::S(entry.key.clone())),
        ("start".to_owned(), AttributeValue::N(entry.start.to_string())),
        ("end".to_owned(), AttributeValue::N(entry.end.to_string())),
        ("count".to_owned(), AttributeValue::N(entry.count.to_string())),
        ("seq".to_owned(), AttributeValue::N(entry.seq.to_string())),
    ]);
    dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(with_key(object_key(entry.start, entry.seq), item)))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("PutItem", e))?;
    Ok(())
}

/// An object as readers find it: which slots it holds and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    pub object: String,
    /// Its slots: `[start, end)`.
    pub start: i64,
    pub end: i64,
    pub count: u64,
    pub seq: u64,
}

/// The object that holds `slot`, if one does: the last pointer starting at
/// or before it, if it ends after it (as found: [`crate::archive::vouch`] checks it).
pub async fn object_at(dynamo: &aws_sdk_dynamodb::Client, table: &str, slot: i64) -> Result<Option<Pointer>> {
    let family = read_from(dynamo, table).await?;
    let pointer = nearest(dynamo, table, family, (OBJECT.to_owned(), format!("{OBJECT}{slot:013}#~")), false).await?;
    Ok(pointer.filter(|p| p.end > slot))
}

/// The pointers around `slot`: the last one starting at or before it, and
/// the first one starting after it (two `Query`s of one item each).
pub(crate) async fn pointers_around(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    slot: i64,
) -> Result<(Option<Pointer>, Option<Pointer>)> {
    let family = read_from(dynamo, table).await?;
    let before = nearest(dynamo, table, family, (OBJECT.to_owned(), format!("{OBJECT}{slot:013}#~")), false);
    let after = nearest(dynamo, table, family, (format!("{OBJECT}{:013}#", slot + 1), format!("{OBJECT}~")), true);
    let (before, after) = tokio::join!(before, after);
    Ok((before?, after?))
}

/// Every pointer, in start order (`verify`).
pub(crate) async fn pointers(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<Pointer>> {
    let (items, _) = query_range(dynamo, table, OBJECT.to_owned(), format!("{OBJECT}~")).await?;
    items.iter().map(decode_pointer).collect()
}

/// The first (`forward`) or last pointer whose key lies in `[from, to]`.
async fn nearest(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    family: Family,
    (from, to): (String, String),
    forward: bool,
) -> Result<Option<Pointer>> {
    let out = dynamo
        .query()
        .table_name(table)
        .key_condition_expression("#slot = :slot AND #key BETWEEN :from AND :to")
        .expression_attribute_names("#slot", HASH_KEY)
        .expression_attribute_names("#key", RANGE_KEY)
        .expression_attribute_values(":slot", AttributeValue::N(family.slot().to_string()))
        .expression_attribute_values(":from", AttributeValue::S(from))
        .expression_attribute_values(":to", AttributeValue::S(to))
        .scan_index_forward(forward)
        .limit(1)
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| Error::dynamo("Query", e))?;
    out.items().first().map(decode_pointer).transpose()
}

fn decode_pointer(item: &HashMap<String, AttributeValue>) -> Result<Pointer> {
    let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned();
    let number = |name: &str| item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok());
    let malformed = || Error::Malformed("archive object pointer without its object, start or end".into());
    Ok(Pointer {
        object: text("object").ok_or_else(malformed)?,
        start: number("start").ok_or_else(malformed)?,
        end: number("end").ok_or_else(malformed)?,
        count: number("count").unwrap_or(0) as u64,
        seq: number("seq").unwrap_or(0) as u64,
    })
}

/// Where the archive stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Boundary {
    /// Slots before this are read from S3 (0: nothing archived).
    pub archived_to: i64,
    /// The event table's items of archived slots are deleted up to here.
    pub cleared_to: i64,
}

/// Where the archive stands (read where [`read_from`] says: an upgraded
/// stack's readers know which slots are archived before the archive moved).
pub async fn boundary(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Boundary> {
    let item = boundary_item(dynamo, table).await?.map(|(_, item)| item);
    let number =
        |name: &str| item.as_ref().and_then(|i| i.get(name)).and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok());
    Ok(Boundary { archived_to: number("archived_to").unwrap_or(0), cleared_to: number("cleared_to").unwrap_or(0) })
}

/// Moves the archive's items from slot -2 (see [`moving`]) unless they moved
/// already: every one but the old lease, the boundary last (so a move cut
/// short is repeated whole, and readers follow the old boundary until then).
/// The caller holds the archive's lease; `Ok(Some(until))` while an
/// archiver of the version before holds the old one.
pub(crate) async fn adopt(dynamo: &aws_sdk_dynamodb::Client, table: &str, now: i64) -> Result<Option<i64>> {
    if bookkeeping::get_in(dynamo, table, Family::Archive, BOUNDARY.to_owned()).await?.is_some() {
        return Ok(None);
    }
    let old = bookkeeping::get_in(dynamo, table, Family::legacy(), LEASE.to_owned()).await?;
    if let Some(until) = old.as_ref().and_then(|lease| moving::held_until(lease, now)) {
        return Ok(Some(until));
    }
    let (items, _) = query_in(dynamo, table, Family::legacy(), ("archive#".to_owned(), "archive#~".to_owned())).await?;
    let (boundary, rest): (Vec<_>, Vec<_>) = items
        .into_iter()
        .filter(|item| bookkeeping::sort_key_of(item) != Some(LEASE))
        .partition(|item| bookkeeping::sort_key_of(item) == Some(BOUNDARY));
    moving::copy(dynamo, table, Family::Archive, rest).await?;
    moving::copy(dynamo, table, Family::Archive, boundary).await?;
    Ok(None)
}

/// Moves `archived_to` (readers go to S3 below it) forward to `to`, never back.
pub(crate) async fn advance_boundary(dynamo: &aws_sdk_dynamodb::Client, table: &str, to: i64) -> Result<()> {
    forward(dynamo, table, "archived_to", to).await
}

/// Records that the items below `to` are deleted, never back.
pub(crate) async fn mark_cleared(dynamo: &aws_sdk_dynamodb::Client, table: &str, to: i64) -> Result<()> {
    forward(dynamo, table, "cleared_to", to).await
}

async fn forward(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str, to: i64) -> Result<()> {
    let update = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(BOUNDARY.to_owned())))
        .update_expression("SET #at = :to")
        .condition_expression("attribute_not_exists(#at) OR #at < :to")
        .expression_attribute_names("#at", name)
        .expression_attribute_values(":to", AttributeValue::N(to.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    moved_forward(update)?;
    Ok(())
}

/// Takes the archive's lease for `owner` until `until` (ms): false when
/// another run holds it (not expired at `now`).
pub async fn take_lease(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    owner: &str,
    now: i64,
    until: i64,
) -> Result<bool> {
    let update = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(LEASE.to_owned())))
        .update_expression("SET lease_owner = :me, lease_until = :until")
        .condition_expression("attribute_not_exists(lease_until) OR lease_until < :now OR lease_owner = :me")
        .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
        .expression_attribute_values(":until", AttributeValue::N(until.to_string()))
        .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    Ok(unless_condition_failed(update)?.is_some())
}

/// Frees the lease, if `owner` still holds it.
pub async fn release_lease(dynamo: &aws_sdk_dynamodb::Client, table: &str, owner: &str) -> Result<()> {
    let update = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key(LEASE.to_owned())))
        .update_expression("REMOVE lease_owner, lease_until")
        .condition_expression("lease_owner = :me")
        .expression_attribute_values(":me", AttributeValue::S(owner.to_owned()))
        .send()
        .await;
    unless_condition_failed(update)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sort_as_the_chain_and_as_time() {
        assert!(entry_key(9) < entry_key(10) && entry_key(999_999) < format!("{ENTRY}~"));
        assert!(object_key(1_795_000_000_000, 7) < object_key(1_795_000_001_000, 3));
        assert!([BOUNDARY, LEASE].iter().all(|k| !k.starts_with(ENTRY) && !k.starts_with(OBJECT)));
    }
}
