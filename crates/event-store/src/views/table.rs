//! The views table: a batch applied exactly once (items and position in one
//! transaction, conditioned on the position read), and views read back.
//!
//! Items: hash key `<projection>#v<version>#b<bucket>`, range key the
//! view's key; a state in `doc` (JSON text) with its revision `rev` (every
//! state write is conditioned on the revision it read, so two writers of one
//! key never lose an update), a counter in `n`, and `at_slot`/`at_key`: the
//! last event that changed it. Positions: hash key
//! `<projection>#v<version>#p<partition>`, range key `position`; the events a
//! redrive applied, out of the log's order: `...#r<partition>`, range key the event's place.

use std::collections::{BTreeSet, HashMap, HashSet};

use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, KeysAndAttributes, Put, TransactWriteItem, Update};
use serde::Serialize;
use serde_json::Value;

use super::fold::{self, Stored, Transaction, Write};
use super::{Change, Projection, ViewEvent, ViewRef, HASH_KEY, POSITION_ITEM, RANGE_KEY};
use crate::batch::Backoff;
use crate::error::{Error, Result};
use crate::position::Position;
use crate::time::now_ms;

/// Transactions cancelled in a row (a condition failed: another writer, a
/// conflict) before [`apply`] gives up and the partition backs off.
pub const MAX_CANCELLED: u32 = 10;

pub(super) type Item = HashMap<String, AttributeValue>;

pub(super) fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

pub(super) fn key(hash: String, range: &str) -> Item {
    HashMap::from([(HASH_KEY.to_owned(), s(hash)), (RANGE_KEY.to_owned(), s(range))])
}

/// Where a partition of a view stands: every event up to `at` is applied; `txn` counts the
/// transactions that wrote it (each conditioned on the count it read).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PartitionPosition {
    pub at: Option<Position>,
    /// Events applied so far.
    pub events: u64,
    #[serde(skip)]
    pub txn: u64,
}

/// What [`apply`] did with a batch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// The events before this index are in the view (applied now, or before).
    pub done: usize,
    /// Of those, the events the view had already.
    pub skipped: usize,
    /// The event the projection refused, and why (`done` is its index).
    pub failed: Option<String>,
    pub transactions: usize,
}

/// Applies `events` (one partition's, in log order) to `view`, exactly
/// once: events the partition's position has passed are skipped, and so is
/// an event a redrive applied already (a marker item of its own says so);
/// the rest go in transactions that each write their items and move the
/// position, conditioned on the position's transaction count read. A
/// cancelled transaction (another writer came first) is planned again from
/// what is stored now.
pub(crate) async fn apply(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (view, partition): (&ViewRef, u32),
    projection: &dyn Projection,
    events: &[ViewEvent],
    backoff: &Backoff,
) -> Result<Applied> {
    let mut applied = Applied::default();
    let mut cancelled = 0;
    'read: loop {
        let Some(first) = events.get(applied.done) else { return Ok(applied) };
        let mut position = read_position(dynamo, table, view, partition).await?;
        let redriven = redriven_from(dynamo, table, (view, partition), &first.position).await?;
        while let Some(event) = events.get(applied.done) {
            let passed = !event.redriven && position.at.as_ref().is_some_and(|at| event.position <= *at);
            if !(passed || redriven.contains(&redriven_id(&event.position))) {
                break;
            }
            applied.done += 1;
            applied.skipped += 1;
        }
        if applied.done == events.len() {
            return Ok(applied);
        }
        // A redriven event alone (it does not move the position); else up to the next one.
        let start = applied.done;
        let end = match events[start].redriven {
            true => start + 1,
            false => events[start..].iter().position(|e| e.redriven).map_or(events.len(), |i| start + i),
        };
        let rest = &events[start..end];
        let keys: BTreeSet<String> = rest.iter().filter_map(|e| projection.key(e)).collect();
        let stored = read_items(dynamo, table, view, &keys).await?;
        let plan = fold::plan(projection, rest, &stored);
        for transaction in &plan.transactions {
            let redriven = rest[transaction.events.start].redriven;
            if !commit(dynamo, table, (view, partition), transaction, &position, redriven).await? {
                cancelled += 1;
                if cancelled >= MAX_CANCELLED {
                    return Err(Error::Dynamo {
                        operation: "TransactWriteItems",
                        source: format!("view {}: {cancelled} transactions cancelled in a row", view.projection).into(),
                    });
                }
                backoff.wait(cancelled - 1).await;
                continue 'read;
            }
            cancelled = 0;
            position.txn += 1;
            if !redriven {
                position.at = Some(transaction.last.clone());
            }
            applied.done = start + transaction.events.end;
            applied.transactions += 1;
        }
        if let Some((index, error)) = plan.failed {
            applied.done = start + index;
            applied.failed = Some(error);
            return Ok(applied);
        }
    }
}

/// The id of an event in its partition's redrive markers: its place in the log (ids order as the log).
fn redriven_id(position: &Position) -> String {
    format!("{:013}/{}", position.slot, position.sort_key)
}

/// The ids of the events a redrive applied in this partition, from `from` on (one `Query`; none, mostly).
async fn redriven_from(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (view, partition): (&ViewRef, u32),
    from: &Position,
) -> Result<HashSet<String>> {
    let mut ids = HashSet::new();
    let mut start = None;
    loop {
        let page = dynamo
            .query()
            .table_name(table)
            .key_condition_expression("#h = :h AND #r >= :from")
            .expression_attribute_names("#h", HASH_KEY)
            .expression_attribute_names("#r", RANGE_KEY)
            .expression_attribute_values(":h", s(view.redriven_key(partition)))
            .expression_attribute_values(":from", s(redriven_id(from)))
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        ids.extend(page.items().iter().filter_map(|i| i.get(RANGE_KEY)?.as_s().ok().cloned()));
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(ids);
        }
    }
}

/// One transaction: its items, and the position moved (a redriven event: its
/// marker put instead), conditioned on the position's transaction count in
/// `before`. `false`: cancelled, nothing written.
async fn commit(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (view, partition): (&ViewRef, u32),
    transaction: &Transaction,
    before: &PartitionPosition,
    redriven: bool,
) -> Result<bool> {
    let mut position = Update::builder()
        .table_name(table)
        .set_key(Some(key(view.position_key(partition), POSITION_ITEM)))
        .expression_attribute_names("#events", "events")
        .expression_attribute_names("#txn", "txn")
        .expression_attribute_names("#updated", "updated_at")
        .expression_attribute_values(":events", n(transaction.events.len()))
        .expression_attribute_values(":one", n(1))
        .expression_attribute_values(":now", n(now_ms()));
    position = match before.txn {
        0 => position.condition_expression("attribute_not_exists(#txn)"),
        txn => position.condition_expression("#txn = :txn").expression_attribute_values(":txn", n(txn)),
    };
    position = match redriven {
        true => position.update_expression("ADD #events :events, #txn :one SET #updated = :now"),
        false => position
            .update_expression("ADD #events :events, #txn :one SET #slot = :slot, #after = :after, #updated = :now")
            .expression_attribute_names("#slot", "at_slot")
            .expression_attribute_names("#after", "at_key")
            .expression_attribute_values(":slot", n(transaction.last.slot))
            .expression_attribute_values(":after", s(&transaction.last.sort_key)),
    };
    let mut request =
        dynamo.transact_write_items().transact_items(TransactWriteItem::builder().update(position.build()?).build());
    if redriven {
        let marker = Put::builder()
            .table_name(table)
            .set_item(Some(key(view.redriven_key(partition), &redriven_id(&transaction.last))))
            .condition_expression("attribute_not_exists(#h)")
            .expression_attribute_names("#h", HASH_KEY)
            .build()?;
        request = request.transact_items(TransactWriteItem::builder().put(marker).build());
    }
    for write in &transaction.writes {
        request = request.transact_items(item_write(table, view, write)?);
    }
    match request.send().await {
        Ok(_) => Ok(true),
        Err(e) => match e.as_service_error() {
            Some(TransactWriteItemsError::TransactionCanceledException(cancelled)) => {
                let reasons: Vec<&str> = cancelled.cancellation_reasons().iter().filter_map(|r| r.code()).collect();
                // Another writer came first (a condition, a conflict): read again. Anything else (a
                // validation error) is no race, and reading again would not help.
                if reasons.iter().all(|r| matches!(*r, "None" | "ConditionalCheckFailed" | "TransactionConflict")) {
                    tracing::info!(view = %view.projection, partition, ?reasons, "view transaction cancelled: read again");
                    return Ok(false);
                }
                Err(Error::dynamo("TransactWriteItems", e))
            }
            _ => Err(Error::dynamo("TransactWriteItems", e)),
        },
    }
}

/// One item's write: its state set (or the item deleted) if its revision is
/// still the one read, and its counter added to.
fn item_write(table: &str, view: &ViewRef, write: &Write) -> Result<TransactWriteItem> {
    let item_key = key(view.item_key(&write.key), &write.key);
    let condition = |rev: u64| match rev {
        0 => ("attribute_not_exists(#rev)", None),
        rev => ("#rev = :rev", Some(n(rev))),
    };
    if let Some((Change::Delete, rev)) = &write.state.as_ref().filter(|_| write.add == 0) {
        let (expression, value) = condition(*rev);
        let delete = Delete::builder()
            .table_name(table)
            .set_key(Some(item_key))
            .condition_expression(expression)
            .expression_attribute_names("#rev", "rev")
            .set_expression_attribute_values(value.map(|v| HashMap::from([(":rev".to_owned(), v)])))
            .build()?;
        return Ok(TransactWriteItem::builder().delete(delete).build());
    }
    let mut sets = vec!["#at_slot = :at_slot", "#at_key = :at_key"];
    let mut update = Update::builder()
        .table_name(table)
        .set_key(Some(item_key))
        .expression_attribute_names("#at_slot", "at_slot")
        .expression_attribute_names("#at_key", "at_key")
        .expression_attribute_values(":at_slot", n(write.at.slot))
        .expression_attribute_values(":at_key", s(&write.at.sort_key));
    if let Some(version) = write.stream_version {
        sets.push("#stream_version = :stream_version");
        update = update
            .expression_attribute_names("#stream_version", "stream_version")
            .expression_attribute_values(":stream_version", n(version));
    }
    if let Some((Change::Put(state), rev)) = &write.state {
        sets.push("#doc = :doc");
        sets.push("#rev = :next_rev");
        let (expression, value) = condition(*rev);
        update = update
            .expression_attribute_names("#doc", "doc")
            .expression_attribute_names("#rev", "rev")
            .expression_attribute_values(":doc", s(state.to_string()))
            .expression_attribute_values(":next_rev", n(rev + 1))
            .condition_expression(expression);
        if let Some(value) = value {
            update = update.expression_attribute_values(":rev", value);
        }
    }
    let mut expression = format!("SET {}", sets.join(", "));
    if let Some((Change::Delete, rev)) = &write.state {
        // The state goes, the counter stays (added to in the same transaction).
        let (condition_text, value) = condition(*rev);
        expression.push_str(" REMOVE #doc, #rev");
        update = update
            .expression_attribute_names("#doc", "doc")
            .expression_attribute_names("#rev", "rev")
            .condition_expression(condition_text);
        if let Some(value) = value {
            update = update.expression_attribute_values(":rev", value);
        }
    }
    if write.add != 0 {
        expression.push_str(" ADD #n :n");
        update = update.expression_attribute_names("#n", "n").expression_attribute_values(":n", n(write.add));
    }
    Ok(TransactWriteItem::builder().update(update.update_expression(expression).build()?).build())
}

/// A partition's position in `view` (consistent).
pub(crate) async fn read_position(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    view: &ViewRef,
    partition: u32,
) -> Result<PartitionPosition> {
    let got = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key(view.position_key(partition), POSITION_ITEM)))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    Ok(got.item.as_ref().map(position_of).unwrap_or_default())
}

fn position_of(item: &Item) -> PartitionPosition {
    let number = |name: &str| item.get(name).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok());
    let at = match (number("at_slot"), item.get("at_key").and_then(|v| v.as_s().ok())) {
        (Some(slot), Some(sort_key)) => Some(Position { slot, sort_key: sort_key.clone() }),
        _ => None,
    };
    let count = |name: &str| number(name).unwrap_or(0) as u64;
    PartitionPosition { at, events: count("events"), txn: count("txn") }
}

/// The positions of partitions `0..partitions` of `view`, in order (`BatchGetItem`, 100 a request).
pub(crate) async fn positions(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    view: &ViewRef,
    partitions: u32,
) -> Result<Vec<PartitionPosition>> {
    let keys: Vec<Item> = (0..partitions).map(|p| key(view.position_key(p), POSITION_ITEM)).collect();
    let mut found: HashMap<String, PartitionPosition> = HashMap::new();
    for item in batch_get(dynamo, table, &keys, false).await? {
        if let Some(hash) = item.get(HASH_KEY).and_then(|v| v.as_s().ok()) {
            found.insert(hash.clone(), position_of(&item));
        }
    }
    Ok((0..partitions).map(|p| found.remove(&view.position_key(p)).unwrap_or_default()).collect())
}

/// The items of `keys` that exist (`BatchGetItem`, 100 keys a request, unprocessed keys asked again).
async fn batch_get(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    keys: &[Item],
    consistent: bool,
) -> Result<Vec<Item>> {
    let mut out = Vec::new();
    for chunk in keys.chunks(100) {
        let mut pending =
            KeysAndAttributes::builder().set_keys(Some(chunk.to_vec())).consistent_read(consistent).build()?;
        for attempt in 0.. {
            let got = dynamo
                .batch_get_item()
                .request_items(table, pending.clone())
                .send()
                .await
                .map_err(|e| Error::dynamo("BatchGetItem", e))?;
            out.extend(got.responses.and_then(|mut r| r.remove(table)).unwrap_or_default());
            match got.unprocessed_keys.and_then(|mut u| u.remove(table)) {
                Some(left) if !left.keys().is_empty() => {
                    if attempt >= 8 {
                        let source = format!("{table}: {} keys left unread", left.keys().len()).into();
                        return Err(Error::Dynamo { operation: "BatchGetItem", source });
                    }
                    Backoff::default().wait(attempt).await;
                    pending = left;
                }
                _ => break,
            }
        }
    }
    Ok(out)
}

/// The stored state and revision of each of `keys` that has an item (consistent reads).
async fn read_items(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    view: &ViewRef,
    keys: &BTreeSet<String>,
) -> Result<HashMap<String, Stored>> {
    let all: Vec<Item> = keys.iter().map(|k| key(view.item_key(k), k)).collect();
    let mut stored = HashMap::new();
    for item in batch_get(dynamo, table, &all, true).await? {
        let item = ViewItem::from_item(&item)?;
        stored.insert(item.key, Stored { state: item.state, rev: item.rev });
    }
    Ok(stored)
}

/// One item of a view, as queries answer it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ViewItem {
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
    /// For a state view: the stream version its state is at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_version: Option<u64>,
    /// The last event that changed it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<Position>,
    #[serde(skip)]
    pub rev: u64,
}

impl ViewItem {
    pub(super) fn from_item(item: &Item) -> Result<Self> {
        let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok());
        let number = |name: &str| item.get(name).and_then(|v| v.as_n().ok()).and_then(|v| v.parse::<i64>().ok());
        let key = text(RANGE_KEY).ok_or_else(|| Error::Malformed("view item without a key".into()))?.clone();
        let state = text("doc")
            .map(|doc| serde_json::from_str(doc).map_err(|e| Error::Malformed(format!("view item {key:?}: {e}"))))
            .transpose()?;
        let at = match (number("at_slot"), text("at_key")) {
            (Some(slot), Some(sort_key)) => Some(Position { slot, sort_key: sort_key.clone() }),
            _ => None,
        };
        Ok(Self {
            state,
            count: number("n"),
            stream_version: number("stream_version").map(|v| v as u64),
            at,
            rev: number("rev").unwrap_or(0) as u64,
            key,
        })
    }
}
