//! The event table's bookkeeping partition (`slot = -2`): what the scan
//! knows and readers need, kept next to the events so no other table, role
//! or stack output is needed. One module per kind of item:
//!
//! | sort key | module | written by |
//! |---|---|---|
//! | `index#<slot start ms, 13 digits>` | [`slot_index`] | scan, with the slot's events (idempotent put) |
//! | `watermark#<segments, 4 digits>#<segment, 4 digits>` | [`watermark`] | scan, forward only; `late` by `ADD` |
//! | `shard#<shard id>` | [`shard_position`] | pump, after its buffer writes, forward only |
//! | `pass#<segments, 4 digits>#<segment, 4 digits>` | [`segment_pass`] | scan: claimed by the schedule, then its chain (token-fenced) |
//! | `awake#scan` | [`awake`] | pump: the time it last left work; scan: the awake run's lease (owner-fenced) |
//! | `playback#<id>` | [`crate::readers::playbacks`] | playback: binding, lease, and checkpoint after every put (lease-fenced) |
//! | `sub#<name>`, `subpart#<name>#<n>`, `parked#<name>#…` | [`crate::readers::subscriptions`] | management; a partition's lease holder (lease-fenced) |
//! | `settings` | [`settings`] | scan, playback and subscriptions, at first use (`TIME_UNIT`) |
//! | `ingest#<minute start ms, 13 digits>` | [`ingest`] | scan, `ADD` at the end of each segment run (a count for status) |
//! | `late#<slot start ms, 13 digits>` | [`late_slots`] | scan, before it writes late events into the slot |
//! | `archive#entry#…`, `archive#object#…`, `archive#boundary`, `archive#lease` | [`crate::archive::store`] | the archiver, under its lease |
//!
//! Every item has one writer at a time (a scan page, a scan segment's pass,
//! a playback run's lease holder); where two could race, the write is
//! conditional (forward only, or on holding the lease). Readers of the
//! log never read negative slots, so neither this partition nor the
//! quarantine (`slot = -1`) is ever played back.

pub mod awake;
pub mod entity_positions;
pub(crate) mod frontier;
pub mod ingest;
pub mod late_slots;
pub mod lease;
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

/// The bookkeeping partition's `slot`.
pub const BOOKKEEPING_SLOT: i64 = -2;

/// The key of the bookkeeping item with sort key `sort_key`.
pub fn key(sort_key: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (HASH_KEY.to_owned(), AttributeValue::N(BOOKKEEPING_SLOT.to_string())),
        (RANGE_KEY.to_owned(), AttributeValue::S(sort_key)),
    ])
}

/// All bookkeeping items whose sort key is in `[from, to]`, page by page
/// (strongly consistent: bookkeeping is read to decide what is complete).
/// Returns them with the number of `Query` requests it took.
pub async fn query_range(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    from: String,
    to: String,
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
            .expression_attribute_values(":bookkeeping", AttributeValue::N(BOOKKEEPING_SLOT.to_string()))
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
