//! Stream metadata, stored: the document in its own item (`_meta`, with its
//! version), the part reads act on copied to the tip in the same transaction
//! (so every read has it without another request), and the cleanup that
//! removes from the table what the metadata hides.
//!
//! A metadata change is not an event: it takes no version of the stream and
//! does not reach the log (an application that wants it audited appends an
//! event saying so). The log keeps its copies of every event under its own
//! retention whatever a stream's metadata says: it is the audit trail, and
//! `forget` is the tool for personal data.

use std::time::Instant;

use aws_sdk_dynamodb::types::{DeleteRequest, Put, TransactWriteItem, Update, WriteRequest};
use serde::{Deserialize, Serialize};

use super::append::is_cancelled;
use super::model::{batch_key, check_name, Batch, StreamItem, BOOKKEEPING_PREFIX, HASH_KEY, RANGE_KEY, TIP};
use super::retention::{Cut, StreamMetadata};
use super::{key, n, s, EntityError, EntityStore, Invalid};
use crate::dynamo::{write_all, Table};
use crate::error::Error;
use crate::event_item::item_size;
use crate::time::now_ms;

/// Sort key of a stream's metadata item.
pub const META_ITEM: &str = "_meta";
/// Batches one cleanup removes at most (four `BatchWriteItem`s, four `Query` pages); a step that
/// stops at this bound records how far it got on the tip (`trimmed`), a change of the tip that
/// wakes the relay for the next step: a long history goes in bounded steps.
pub(crate) const MAX_TRIM_BATCHES: usize = 100;

const _: () = assert!(META_ITEM.as_bytes()[0] == BOOKKEEPING_PREFIX as u8, "below every batch key");

/// The stored metadata item.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct MetaItem {
    stream: String,
    item: String,
    version: u64,
    /// The [`StreamMetadata`] as JSON text.
    metadata: String,
    at: i64,
}

/// What one cleanup removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    pub batches: usize,
    pub events: u64,
    /// Write units the deletes cost (each the deleted item's size, in started KB).
    pub write_units: u64,
    /// True when it stopped at its bound with more hidden batches left.
    pub more: bool,
}

impl EntityStore {
    /// The stream's metadata and its version (0: never set).
    pub async fn metadata(&self, stream: &str) -> Result<(u64, StreamMetadata), EntityError> {
        check_name(stream)?;
        match self.read_item(stream, META_ITEM).await? {
            Some(item) => {
                let item: MetaItem =
                    serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("{stream} metadata: {e}")))?;
                let metadata = serde_json::from_str(&item.metadata)
                    .map_err(|e| Error::Malformed(format!("{stream} metadata: {e}")))?;
                Ok((item.version, metadata))
            }
            None if self.tip(stream).await?.is_some() => Ok((0, StreamMetadata::default())),
            None => Err(EntityError::NotFound),
        }
    }

    /// Replaces the stream's metadata if its version is `expected` (any when
    /// `None`), and answers the new version. Reads act on it at once.
    pub async fn set_metadata(
        &self,
        stream: &str,
        expected: Option<u64>,
        metadata: &StreamMetadata,
    ) -> Result<u64, EntityError> {
        check_name(stream)?;
        metadata.check()?;
        let document = serde_json::to_string(metadata).map_err(|e| Error::encode("stream metadata", e))?;
        for attempt in 0..self.backoff.max_attempts {
            let base = match expected {
                Some(version) => version,
                None => self.metadata(stream).await?.0,
            };
            let Some(next) = base.checked_add(1) else {
                return Err(Invalid::BadRequest("the metadata's version is too large".into()).into());
            };
            if self.write_metadata(stream, base, next, metadata, &document).await? {
                return Ok(next);
            }
            let (current, stored) = self.metadata(stream).await?;
            // This very write, applied by a try whose answer was lost: done.
            if current == next && stored == *metadata {
                return Ok(next);
            }
            if expected.is_some() && current != base {
                return Err(EntityError::MetadataConflict { current });
            }
            self.backoff.wait(attempt).await;
        }
        Err(Error::Throttled {
            service: "dynamodb",
            operation: "TransactWriteItems",
            source: format!("stream {stream} metadata: still contended").into(),
        }
        .into())
    }

    /// One try: the tip's copy and the document, on the metadata being at
    /// `base`. False when the transaction was cancelled.
    async fn write_metadata(
        &self,
        stream: &str,
        base: u64,
        next: u64,
        metadata: &StreamMetadata,
        document: &str,
    ) -> Result<bool, Error> {
        let retention = metadata.retention();
        let mut tip = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(stream, TIP)))
            .expression_attribute_names("#version", "version")
            .expression_attribute_values(":new", n(next));
        tip = if retention.is_empty() {
            tip.update_expression("SET meta_version = :new REMOVE retention")
        } else {
            let text = serde_json::to_string(&retention).map_err(|e| Error::encode("retention", e))?;
            tip.update_expression("SET meta_version = :new, retention = :retention")
                .expression_attribute_values(":retention", s(text))
        };
        tip = if base == 0 {
            tip.condition_expression("attribute_exists(#version) AND attribute_not_exists(meta_version)")
        } else {
            tip.condition_expression("attribute_exists(#version) AND meta_version = :base")
                .expression_attribute_values(":base", n(base))
        };
        let item = MetaItem {
            stream: stream.to_owned(),
            item: META_ITEM.to_owned(),
            version: next,
            metadata: document.to_owned(),
            at: now_ms(),
        };
        let item = serde_dynamo::to_item(&item).map_err(|e| Error::encode("metadata item", e))?;
        let put = Put::builder().table_name(&self.table).set_item(Some(item)).build()?;
        let sent = self
            .dynamo
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(tip.build()?).build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(err) if is_cancelled(&err) => Ok(false),
            Err(err) => Err(Error::dynamo("TransactWriteItems", err)),
        }
    }

    /// Removes from the table up to [`MAX_TRIM_BATCHES`] batches whose every
    /// event the stream's metadata hides, oldest first, none with a version
    /// after `logged` (the log holds every version durably first: on the event
    /// stream and buffered by the pump; until then the relay may read it from
    /// the table). A batch straddling the cut stays whole (its hidden events
    /// are never shown) until the cut passes its last event. Snapshots,
    /// request records and offloaded data stay. The metadata is read from the
    /// tip now, never from the (possibly old) change that woke the cleanup.
    pub(crate) async fn trim(
        &self,
        stream: &str,
        logged: Option<u64>,
        now: i64,
        give_up: Instant,
    ) -> Result<Trimmed, Error> {
        let Some(tip) = self.tip(stream).await? else { return Ok(Trimmed::default()) };
        let cut = tip.cut(now);
        let Some(relayed) = logged.filter(|_| cut != Cut::NONE) else { return Ok(Trimmed::default()) };
        // A hidden batch starts below the cut (anywhere, by age), and at or before `relayed`.
        let high = match cut.not_before {
            Some(_) => relayed,
            None => relayed.min(cut.from - 1),
        };
        let low = tip.trimmed.unwrap_or(0);
        if low > high {
            return Ok(Trimmed::default());
        }
        // Pages of a quarter of the bound, so a cleanup that finds little to do reads little; strongly
        // consistent, so no batch is passed over (`trimmed` moves past whatever a step saw).
        let (mut removed, mut start): (Vec<(Batch, u64)>, _) = (Vec::new(), None);
        'pages: while removed.len() < MAX_TRIM_BATCHES {
            let out = self
                .dynamo
                .query()
                .table_name(&self.table)
                .key_condition_expression("#stream = :stream AND #item BETWEEN :low AND :high")
                .expression_attribute_names("#stream", HASH_KEY)
                .expression_attribute_names("#item", RANGE_KEY)
                .expression_attribute_values(":stream", s(stream))
                .expression_attribute_values(":low", s(batch_key(low)))
                .expression_attribute_values(":high", s(batch_key(high)))
                .limit((MAX_TRIM_BATCHES / 4) as i32)
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| Error::dynamo("Query", e))?;
            for item in out.items().iter().cloned() {
                let units = item_size(&item).div_ceil(1024) as u64;
                let StreamItem::Batch(batch) = StreamItem::decode(item)? else { continue };
                // Hidden events are a prefix: the first batch shown ends the cleanup.
                if !cut.hides_all(&batch) || batch.last() > relayed {
                    break 'pages;
                }
                removed.push((batch, units));
            }
            start = out.last_evaluated_key().cloned();
            if start.is_none() {
                break;
            }
        }
        let more = removed.len() >= MAX_TRIM_BATCHES;
        let Some(next) = removed.last().map(|(b, _)| b.last() + 1) else { return Ok(Trimmed::default()) };
        let requests = removed
            .iter()
            .map(|(batch, _)| {
                let delete = DeleteRequest::builder().set_key(Some(key(&batch.stream, &batch.item))).build()?;
                Ok((batch.first, WriteRequest::builder().delete_request(delete).build()))
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let table = Table { name: &self.table, key: &[HASH_KEY, RANGE_KEY] };
        let failed = write_all(&self.dynamo, table, requests, &self.backoff, Some(give_up)).await;
        if let Some(first) = failed.iter().min() {
            return Err(Error::Throttled {
                service: "dynamodb",
                operation: "BatchWriteItem",
                source: format!("{stream}: batch {first} not removed").into(),
            });
        }
        if more {
            // Only to go on: a later step finds where to start by its query anyway (removed
            // items are not read, nor paid for), so a step that finished writes nothing more.
            self.record_trimmed(stream, next).await?;
        }
        Ok(Trimmed {
            batches: removed.len(),
            events: removed.iter().map(|(b, _)| b.events.len() as u64).sum(),
            write_units: removed.iter().map(|(_, units)| *units).sum(),
            more,
        })
    }

    /// Records on the tip that versions below `next` have left the table. The
    /// tip's change comes back to the relay, which so continues a long cleanup.
    async fn record_trimmed(&self, stream: &str, next: u64) -> Result<(), Error> {
        let out = self
            .dynamo
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(stream, TIP)))
            .update_expression("SET trimmed = :next")
            .condition_expression("attribute_exists(#version) AND (attribute_not_exists(trimmed) OR trimmed < :next)")
            .expression_attribute_names("#version", "version")
            .expression_attribute_values(":next", n(next))
            .send()
            .await;
        match out {
            Ok(_) => Ok(()),
            // Another cleanup got further: nothing to record.
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => Ok(()),
            Err(err) => Err(Error::dynamo("UpdateItem", err)),
        }
    }
}
