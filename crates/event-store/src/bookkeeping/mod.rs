//! The event table's bookkeeping partitions: what the stages know and
//! readers need, kept next to the events so no other table, role or stack
//! output is needed. Each family of items has one writing role and a
//! partition key (a negative `slot`) of its own, so IAM's
//! `dynamodb:LeadingKeys` (which sees only the partition key) lets each
//! role write its own family and nothing else (`docs/design.md#15`):
//!
//! | slot | sort key | module | written by |
//! |---|---|---|---|
//! | -2 | `index#<slot start ms, 13 digits>` | [`slot_index`] | scan, with the slot's events (idempotent put) |
//! | -2 | `watermark#<segments, 4 digits>#<segment, 4 digits>` | [`watermark`] | scan, forward only; `late` by `ADD` |
//! | -2 | `pass#<segments, 4 digits>#<segment, 4 digits>` | [`segment_pass`] | scan: claimed by the schedule, then its chain (token-fenced) |
//! | -2 | `awake#scan` | [`awake`] | scan: the awake run's lease (owner-fenced) |
//! | -2 | `settings` | [`settings`] | scan, at first use (`TIME_UNIT`) |
//! | -2 | `ingest#<minute start ms, 13 digits>` | [`ingest`] | scan, `ADD` at the end of each segment run (a count for status) |
//! | -2, -4 | `late#<slot start ms, 13 digits>` | [`late_slots`] | scan, before it writes late events into the slot; the archiver, for the late events an earlier object misses |
//! | -3 | `shard#<shard id>`, `floor#…` | [`shard_position`] | pump, after its buffer writes, forward only |
//! | -3 | `awake#scan` | [`awake`] | pump: the time it last left work |
//! | -4 | `archive#entry#…`, `archive#object#…`, `archive#boundary`, `archive#lease` | [`crate::archive::store`] | the archiver, under its lease |
//! | -5 | `playback#<id>` | [`crate::readers::playbacks`] | playback: binding, lease, and checkpoint after every put (lease-fenced) |
//! | -6 | `sub#<name>`, `parked#<name>#…`, `moved#<name>` | [`crate::readers::subscriptions`] | management; a partition's lease holder (parks) |
//! | -600000 − n | `subpart#<name>#<n>` | [`crate::readers::subscriptions`] | partition n's lease holder (lease-fenced); `reset`, `resume` |
//!
//! Slot -2 was once every family's; the families that left it are moved by
//! their owners ([`Family::legacy`]). Every item has one writer at a time;
//! where two could race, the write is conditional (forward only, or on
//! holding the lease). Readers of the log never read negative slots, so no
//! bookkeeping partition nor the quarantine (`slot = -1`) is ever played back.

pub mod awake;
pub mod entity_positions;
pub(crate) mod frontier;
pub mod ingest;
pub mod late_slots;
pub mod lease;
pub(crate) mod moving;
pub(crate) mod segment_pass;
pub mod settings;
pub mod shard_position;
pub mod slot_index;
pub mod watermark;

use std::collections::HashMap;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use crate::error::{Error, Result};
use crate::event_item::{HASH_KEY, RANGE_KEY};

/// A family of bookkeeping items: one writing role, one partition key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The scan's items (and, before they moved, every family's: [`Family::legacy`]).
    Scan,
    Pump,
    Archive,
    Playbacks,
    Subscriptions,
}

impl Family {
    /// The family's partition key (`slot`).
    pub const fn slot(self) -> i64 {
        match self {
            Family::Scan => -2,
            Family::Pump => -3,
            Family::Archive => -4,
            Family::Playbacks => -5,
            Family::Subscriptions => -6,
        }
    }

    /// Where the family's items were before each family had a partition of
    /// its own: a stack upgraded from then has them there until their owner
    /// moves them (read, never written, by the other families' roles).
    pub const fn legacy() -> Family {
        Family::Scan
    }
}

/// The scan's partition's `slot` (every family's, before they moved).
pub const BOOKKEEPING_SLOT: i64 = Family::Scan.slot();

/// The key of the scan's bookkeeping item with sort key `sort_key`.
pub fn key(sort_key: String) -> HashMap<String, AttributeValue> {
    key_in(Family::Scan, sort_key)
}

/// The key of `family`'s item with sort key `sort_key`.
pub fn key_in(family: Family, sort_key: String) -> HashMap<String, AttributeValue> {
    key_at(family.slot(), sort_key)
}

/// The key of the bookkeeping item under partition key `slot` (a family's,
/// or one of its own keys) with sort key `sort_key`.
pub(crate) fn key_at(slot: i64, sort_key: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (HASH_KEY.to_owned(), AttributeValue::N(slot.to_string())),
        (RANGE_KEY.to_owned(), AttributeValue::S(sort_key)),
    ])
}

/// The scan's bookkeeping items whose sort key is in `[from, to]`: [`query_in`].
pub(crate) async fn query_range(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: String,
    to: String,
) -> Result<(Vec<HashMap<String, AttributeValue>>, usize)> {
    query_in(dynamo, table, Family::Scan, (from, to)).await
}

/// All of `family`'s items whose sort key is in `[from, to]`, page by page
/// (strongly consistent: bookkeeping is read to decide what is complete).
/// Returns them with the number of `Query` requests it took.
pub async fn query_in(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    family: Family,
    (from, to): (String, String),
) -> Result<(Vec<HashMap<String, AttributeValue>>, usize)> {
    let mut items = Vec::new();
    let mut start_key = None;
    let mut queries = 0;
    loop {
        let page = dynamo
            .query()
            .table_name(table)
            .consistent_read(true)
            .key_condition_expression("#slot = :bookkeeping AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#slot", HASH_KEY)
            .expression_attribute_names("#sk", RANGE_KEY)
            .expression_attribute_values(":bookkeeping", AttributeValue::N(family.slot().to_string()))
            .expression_attribute_values(":from", AttributeValue::S(from.clone()))
            .expression_attribute_values(":to", AttributeValue::S(to.clone()))
            .set_exclusive_start_key(start_key.take())
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        queries += 1;
        items.extend(page.items().iter().cloned());
        match page.last_evaluated_key() {
            Some(last) => start_key = Some(last.clone()),
            None => return Ok((items, queries)),
        }
    }
}

/// `family`'s item with sort key `sort_key`, if any (strongly consistent).
pub(crate) async fn get_in(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    family: Family,
    sort_key: String,
) -> Result<Option<HashMap<String, AttributeValue>>> {
    get_at(dynamo, table, family.slot(), sort_key).await
}

/// The bookkeeping item under partition key `slot` and sort key `sort_key`, if any (strongly consistent).
pub(crate) async fn get_at(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    slot: i64,
    sort_key: String,
) -> Result<Option<HashMap<String, AttributeValue>>> {
    let out = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key_at(slot, sort_key)))
        .consistent_read(true)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    Ok(out.item().cloned())
}

/// A conditional `UpdateItem`'s answer: `Ok(None)` when its condition
/// failed, other errors as errors.
pub(crate) fn unless_condition_failed<O, R>(
    result: std::result::Result<O, aws_sdk_dynamodb::error::SdkError<UpdateItemError, R>>,
) -> Result<Option<O>>
where
    R: std::fmt::Debug + Send + Sync + 'static,
{
    match result {
        Ok(out) => Ok(Some(out)),
        Err(e) if matches!(e.as_service_error(), Some(UpdateItemError::ConditionalCheckFailedException(_))) => Ok(None),
        Err(e) => Err(Error::dynamo("UpdateItem", e)),
    }
}

/// The answer to a forward-only conditional `UpdateItem`: true when it
/// moved the item, false when the item was already there or further.
pub(crate) fn moved_forward<O, R>(
    result: std::result::Result<O, aws_sdk_dynamodb::error::SdkError<UpdateItemError, R>>,
) -> Result<bool>
where
    R: std::fmt::Debug + Send + Sync + 'static,
{
    Ok(unless_condition_failed(result)?.is_some())
}

/// The sort key of a bookkeeping item, if it has one.
pub(crate) fn sort_key_of(item: &HashMap<String, AttributeValue>) -> Option<&str> {
    item.get(RANGE_KEY).and_then(|v| v.as_s().ok()).map(String::as_str)
}
