//! Where each entity stream stands in the time-ordered log, so that the log
//! holds each version once and in version order, however long the relay is
//! retried and however DynamoDB shards the table's stream.
//!
//! - **Key namespace.** Entity events go on the event stream under the
//!   partition key `streams/<name>` ([`crate::envelope::entity_key`]); `load` refuses an
//!   `EntityId` in that namespace, so an anonymous hit never passes for an
//!   entity event, and a reader's `partition_key` filter selects one stream.
//! - **Two small items per stream** in the entity table, beside its tip (and
//!   the appends' request records, `_req#…`, see `entity::model::RequestItem`). Their
//!   sort keys start with `_`, below every batch key (`e…`), so reads of a
//!   stream's events never meet them:
//!   - `_relay`, written by the relay: `relayed`, the last version stored on
//!     the event stream. The relay puts only the versions after it, in
//!     order, reading from the table what its stream records do not carry,
//!     so a later version never reaches the event stream before an earlier
//!     one (whatever order the table's stream shards deliver them in). While
//!     the stream's puts keep failing, `failing_since`; after the hold
//!     limit, `held_at` and `held_reason`: the relay leaves the stream alone
//!     until a re-relay relays it from the table.
//!   - `_log`, written by the pump: `logged`, the last version buffered. A
//!     record of a version at or below it is a copy (a relay retry whose
//!     first answer was lost, two relays racing on one stream) and is
//!     dropped by its identity, however late it comes (`docs/design.md`,
//!     invariant 11). With it, the record that buffered it (`shard`,
//!     `sequence`) and the version logged before that delivery (`before`):
//!     should the delivery be made again (its shard position not saved),
//!     the pump decides from `before` and so keeps exactly what it kept the
//!     first time, rather than dropping its own records as copies and
//!     writing their chunk again without them.
//! - **Client event ids**, the pump's too: one item `ids/<envelope id>`,
//!   `_id` per ingest event a client gave an `EventId`, naming the record
//!   buffered for it (`sequence`) and expiring a day later (`expires_at`,
//!   the table's TTL). A later record of the same id is a client's retry of
//!   an event already stored, and is dropped.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes, PutRequest, ReturnValue, WriteRequest};
use serde::{Deserialize, Serialize};

use crate::batch::Backoff;
use crate::dynamo::{write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::sortable_sequence;

/// The entity table's key attributes (`entity::model` names its items).
pub const HASH_KEY: &str = "stream";
pub const RANGE_KEY: &str = "item";

/// Sort key of a stream's relay position.
pub const RELAY_ITEM: &str = "_relay";
/// Sort key of a stream's logged position (the pump's).
pub const LOG_ITEM: &str = "_log";
/// Sort key of the pump's marker of a client event id (partition `ids/<envelope id>`).
pub const CLIENT_ID_ITEM: &str = "_id";
/// How long a client's retry is known for a copy: a day, as other idempotency keys go.
pub const CLIENT_ID_RETENTION_SECS: i64 = 24 * 3600;
/// The condition that a stream has a relay position: every stream created
/// since positions exist has one from its first append (`created_at`), one
/// relayed since has `relayed`. Marks are never written on a stream without
/// one (it would then look positioned at nothing, and be relayed from 0).
const TRACKED: &str = "(attribute_exists(created_at) OR attribute_exists(relayed))";
/// Keys one `BatchGetItem` may ask for.
const BATCH_GET_KEYS: usize = 100;

/// A stream's relay position (its `_relay` item).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayPosition {
    pub stream: String,
    pub item: String,
    /// The last version stored on the event stream (`None`: nothing yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relayed: Option<u64>,
    /// Since when (ms) the stream's puts have been failing, unbroken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<i64>,
    /// When (ms) the relay gave up on the stream; until a re-relay, it stays held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_reason: Option<String>,
    /// True when the item exists: every stream created since positions exist
    /// has one from its first append; one without was relayed before them.
    #[serde(skip)]
    pub known: bool,
}

impl RelayPosition {
    /// The first version not yet relayed.
    pub(crate) fn next(&self) -> u64 {
        self.relayed.map_or(0, |v| v + 1)
    }

    pub fn held(&self) -> bool {
        self.held_at.is_some()
    }

    /// True when the stream has been failing for `hold_after` by `now`.
    pub(crate) fn due_for_hold(&self, now: i64, hold_after: Duration) -> bool {
        self.failing_since.is_some_and(|since| now - since >= hold_after.as_millis() as i64)
    }
}

/// The positions of a table's streams.
#[derive(Clone)]
pub struct Positions {
    dynamo: aws_sdk_dynamodb::Client,
    table: String,
    backoff: Backoff,
}

/// A stream's `_log` item: the last version buffered, the record that
/// buffered it, and the version logged before the delivery that did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Logged {
    pub version: u64,
    /// The shard and sequence number of the record that buffered `version`
    /// (empty in items written before they were kept).
    pub shard: String,
    pub sequence: String,
    pub before: Option<u64>,
}

impl Logged {
    /// The version a batch of `shard` whose first record of the stream is
    /// `sequence` decides from: the version logged before, when that record
    /// is at or before the one that logged this (the same records delivered
    /// again); this version otherwise.
    pub(crate) fn base_for(&self, shard: &str, sequence: &str) -> Option<u64> {
        let again = !self.sequence.is_empty()
            && self.shard == shard
            && sortable_sequence(sequence) <= sortable_sequence(&self.sequence);
        if again {
            self.before
        } else {
            Some(self.version)
        }
    }
}

fn key(stream: &str, item: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (HASH_KEY.to_owned(), AttributeValue::S(stream.to_owned())),
        (RANGE_KEY.to_owned(), AttributeValue::S(item.to_owned())),
    ])
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

impl Positions {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        Self { dynamo, table: table.into(), backoff: Backoff::default() }
    }

    /// The relay positions of `streams` (strongly consistent; a stream never relayed has a default one).
    pub(crate) async fn relay_positions(&self, streams: &[&str]) -> Result<HashMap<String, RelayPosition>> {
        let items = self.get_all(streams, RELAY_ITEM).await?;
        let mut positions: HashMap<String, RelayPosition> = HashMap::new();
        for item in items {
            let mut position: RelayPosition =
                serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("relay position: {e}")))?;
            position.known = true;
            positions.insert(position.stream.clone(), position);
        }
        for stream in streams {
            positions.entry((*stream).to_owned()).or_insert_with(|| RelayPosition {
                stream: (*stream).to_owned(),
                item: RELAY_ITEM.to_owned(),
                ..Default::default()
            });
        }
        Ok(positions)
    }

    /// One stream's relay position.
    pub async fn relay_position(&self, stream: &str) -> Result<RelayPosition> {
        let mut positions = self.relay_positions(&[stream]).await?;
        Ok(positions.remove(stream).unwrap_or_default())
    }

    /// The logged versions of `streams` (absent: nothing logged yet).
    pub async fn logged(&self, streams: &[&str]) -> Result<HashMap<String, u64>> {
        Ok(self.logged_entries(streams).await?.into_iter().map(|(stream, logged)| (stream, logged.version)).collect())
    }

    /// The `_log` items of `streams` (absent: nothing logged yet).
    pub(crate) async fn logged_entries(&self, streams: &[&str]) -> Result<HashMap<String, Logged>> {
        let items = self.get_all(streams, LOG_ITEM).await?;
        Ok(items
            .iter()
            .filter_map(|item| {
                let stream = item.get(HASH_KEY)?.as_s().ok()?.clone();
                let text = |name: &str| item.get(name).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default();
                let number = |name: &str| item.get(name).and_then(|v| v.as_n().ok()).and_then(|n| n.parse().ok());
                let logged = Logged {
                    version: number("logged")?,
                    shard: text("shard"),
                    sequence: text("sequence"),
                    before: number("before"),
                };
                Some((stream, logged))
            })
            .collect())
    }

    /// Records the logged versions (the live pump is the only writer of a
    /// stream's `_log`: all of a stream's records are on one shard at a
    /// time, and shards are pumped parent before child; a delivery made
    /// again after a partial one may move it back, to where its shard
    /// position stands).
    pub(crate) async fn save_logged(&self, logged: &HashMap<String, Logged>) -> Result<()> {
        let items = logged.iter().map(|(stream, logged)| {
            let mut item = key(stream, LOG_ITEM);
            item.insert("logged".into(), n(logged.version));
            item.insert("shard".into(), AttributeValue::S(logged.shard.clone()));
            item.insert("sequence".into(), AttributeValue::S(logged.sequence.clone()));
            if let Some(before) = logged.before {
                item.insert("before".into(), n(before));
            }
            (stream.clone(), item)
        });
        self.put_all(items, "logged positions").await
    }

    /// Puts `items` (each with its partition key, to name what was not written) with `BatchWriteItem`.
    async fn put_all(
        &self,
        items: impl Iterator<Item = (String, HashMap<String, AttributeValue>)>,
        what: &str,
    ) -> Result<()> {
        let requests: Vec<(String, WriteRequest)> = items
            .map(|(partition, item)| {
                let put = PutRequest::builder().set_item(Some(item)).build().map_err(Error::from)?;
                Ok((partition, WriteRequest::builder().put_request(put).build()))
            })
            .collect::<Result<_>>()?;
        let table = Table { name: &self.table, key: &[HASH_KEY, RANGE_KEY] };
        let unwritten = write_all(&self.dynamo, table, requests, &self.backoff, None).await;
        match unwritten.is_empty() {
            true => Ok(()),
            false => Err(Error::Dynamo {
                operation: "BatchWriteItem",
                source: format!("{what} of {unwritten:?} not written").into(),
            }),
        }
    }

    /// The sequence number of the record buffered for each of `markers`
    /// (client event ids, [`crate::envelope::client_id_marker`]) that has one.
    pub(crate) async fn buffered_ids(&self, markers: &[&str]) -> Result<HashMap<String, String>> {
        let items = self.get_all(markers, CLIENT_ID_ITEM).await?;
        Ok(items
            .iter()
            .filter_map(|item| {
                let marker = item.get(HASH_KEY)?.as_s().ok()?.clone();
                Some((marker, item.get("sequence")?.as_s().ok()?.clone()))
            })
            .collect())
    }

    /// Records that `(marker, sequence)`'s record is buffered, for a day from `now_secs`.
    pub(crate) async fn save_buffered_ids(&self, buffered: &[(String, String)], now_secs: i64) -> Result<()> {
        let items = buffered.iter().map(|(marker, sequence)| {
            let mut item = key(marker, CLIENT_ID_ITEM);
            item.insert("sequence".into(), AttributeValue::S(sequence.clone()));
            item.insert("expires_at".into(), n(now_secs + CLIENT_ID_RETENTION_SECS));
            (marker.clone(), item)
        });
        self.put_all(items, "client event ids").await
    }

    /// Moves the relay position forward to `version` and clears the failure
    /// mark (a position further on, from a relay racing this one, stays).
    pub(crate) async fn advance(&self, stream: &str, version: u64) -> Result<()> {
        let result = self
            .dynamo
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(stream, RELAY_ITEM)))
            .update_expression("SET relayed = :v REMOVE failing_since")
            .condition_expression("attribute_not_exists(relayed) OR relayed < :v")
            .expression_attribute_values(":v", n(version))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => Ok(()),
            Err(err) => Err(Error::dynamo("UpdateItem", err)),
        }
    }

    /// Marks the stream failing from `now` (kept if already failing), unless
    /// another relay has relayed `failed_at` since; returns the position as it
    /// now is, `None` when it was relayed.
    pub(crate) async fn failing(&self, stream: &str, failed_at: u64, now: i64) -> Result<Option<RelayPosition>> {
        let result = self
            .dynamo
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(stream, RELAY_ITEM)))
            .update_expression("SET failing_since = if_not_exists(failing_since, :now)")
            .condition_expression(format!("{TRACKED} AND (attribute_not_exists(relayed) OR relayed < :failed)"))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":failed", n(failed_at))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match result {
            Ok(out) => {
                let mut position: RelayPosition = serde_dynamo::from_item(out.attributes.unwrap_or_default())
                    .map_err(|e| Error::Malformed(format!("relay position: {e}")))?;
                position.known = true;
                Ok(Some(position))
            }
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => Ok(None),
            Err(err) => Err(Error::dynamo("UpdateItem", err)),
        }
    }

    /// Clears a failure mark that no longer holds (the stream is caught up).
    pub(crate) async fn clear_failing(&self, stream: &str) -> Result<()> {
        self.update(stream, "REMOVE failing_since", Some(TRACKED), &[]).await
    }

    /// Holds the stream, if it is still failing since `since` and not held
    /// (a re-relay that released it in between wins): the relay leaves it
    /// alone until [`Self::release`].
    pub(crate) async fn hold(&self, stream: &str, since: i64, now: i64, reason: &str) -> Result<()> {
        let values = [(":now", n(now)), (":since", n(since)), (":reason", AttributeValue::S(reason.to_owned()))];
        let condition = "attribute_not_exists(held_at) AND failing_since = :since";
        self.update(stream, "SET held_at = :now, held_reason = :reason", Some(condition), &values).await
    }

    /// Lets the relay handle the stream again (a re-relay, before it relays what was held).
    pub(crate) async fn release(&self, stream: &str) -> Result<()> {
        self.update(stream, "REMOVE held_at, held_reason, failing_since", Some(TRACKED), &[]).await
    }

    async fn update(
        &self,
        stream: &str,
        expression: &str,
        condition: Option<&str>,
        values: &[(&str, AttributeValue)],
    ) -> Result<()> {
        let mut request = self
            .dynamo
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(stream, RELAY_ITEM)))
            .update_expression(expression)
            .set_condition_expression(condition.map(str::to_owned));
        for (name, value) in values {
            request = request.expression_attribute_values(*name, value.clone());
        }
        match request.send().await {
            Ok(_) => Ok(()),
            // Nothing to change: no position (a stream from before positions), or the condition moved on.
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => {
                match condition == Some(TRACKED) {
                    true => Ok(()),
                    false => Err(Error::dynamo("UpdateItem", err)),
                }
            }
            Err(err) => Err(Error::dynamo("UpdateItem", err)),
        }
    }

    /// The `item` of every stream in `streams`, by `BatchGetItem` (100 keys a
    /// request, unprocessed keys asked again with backoff).
    pub(crate) async fn get_all(&self, streams: &[&str], item: &str) -> Result<Vec<HashMap<String, AttributeValue>>> {
        let mut found = Vec::new();
        let mut unique: Vec<&str> = streams.to_vec();
        unique.sort_unstable();
        unique.dedup();
        for chunk in unique.chunks(BATCH_GET_KEYS) {
            let mut keys: Vec<HashMap<String, AttributeValue>> = chunk.iter().map(|s| key(s, item)).collect();
            let mut attempt = 0;
            while !keys.is_empty() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .build()
                    .map_err(Error::from)?;
                let out = self
                    .dynamo
                    .batch_get_item()
                    .request_items(&self.table, request)
                    .send()
                    .await
                    .map_err(|e| Error::dynamo("BatchGetItem", e))?;
                found.extend(out.responses.and_then(|mut r| r.remove(&self.table)).unwrap_or_default());
                keys = out.unprocessed_keys.and_then(|mut u| u.remove(&self.table)).map(|k| k.keys).unwrap_or_default();
                if !keys.is_empty() {
                    if attempt + 1 >= self.backoff.max_attempts {
                        return Err(Error::Throttled {
                            service: "dynamodb",
                            operation: "BatchGetItem",
                            source: format!("{} keys still unprocessed", keys.len()).into(),
                        });
                    }
                    self.backoff.wait(attempt).await;
                    attempt += 1;
                }
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_held_once_it_has_failed_for_the_limit() {
        let mut position = RelayPosition::default();
        assert_eq!(position.next(), 0);
        assert!(!position.due_for_hold(1_000_000, Duration::from_secs(60)));
        position.failing_since = Some(1_000_000);
        position.relayed = Some(4);
        assert_eq!(position.next(), 5);
        assert!(!position.due_for_hold(1_059_999, Duration::from_secs(60)));
        assert!(position.due_for_hold(1_060_000, Duration::from_secs(60)));
    }
}
