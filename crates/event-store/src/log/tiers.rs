//! Which tier holds a slot, for every reader of the log: the event table at
//! and after the archive's boundary, the archive's objects in S3 before it
//! (`docs/storage.md#cold-tier-s3`).
//!
//! The archiver moves the boundary past a slot only once the slot's object
//! is verified in S3, and deletes the slot's items only after that. So a
//! page queried from the event table is whole if the boundary, read after
//! the query ended, is still at or before the slot; if it has moved past,
//! the reader drops the page and reads the slot on from S3, after the last
//! event it handed out. One boundary read confirms every query that ended
//! before it was sent, so the slots read together share it.
//!
//! A reader of some keys ([`KeyRange`]) reads of an object cut by slice
//! only the footer and its slices' row groups, each checked against the
//! anchored entry's hashes before it is decoded ([`super::objects`]).
//!
//! Late events written into an archived slot stay in the event table (the
//! objects are never rewritten); the scan marks such slots
//! ([`crate::bookkeeping::late_slots`]), and a marked slot is read from both
//! tiers, merged in sort-key order.
//!
//! Reads in flight (of the boundary, of an object) are shared futures, not
//! locks held across an `await`: a reader's slots are futures polled by one
//! stream, and one that is not being polled must not hold up the others.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::{BoxFuture, FutureExt, Shared};

use super::objects::{Cold, Objects};
use crate::archive::object::Bucket;
use crate::archive::store;
use crate::bookkeeping::slot_index::SlotRef;
use crate::chunk::decode_item;
use crate::dynamo::query_partition;
use crate::envelope::entity_stream;
use crate::error::{Error, Result};
use crate::event_item::{self, EventItem};
use crate::offload::{self, OffloadRef};
use crate::privacy::keys::Keys;
use crate::slices::KeyRange;

/// Events of a page opened at once by [`Tiers::opened`]: their keys are
/// fetched concurrently, so a reader of many subjects with cold keys waits for
/// a round trip per 16 of them, not per subject. Offloaded payloads (up to
/// 4 MiB each) are fetched one at a time: at most 16 opened events are held
/// besides the page, and one payload is being put back.
pub const OPEN_AT_ONCE: usize = 16;
type Fetch<T> = Shared<BoxFuture<'static, std::result::Result<T, Arc<Error>>>>;

/// The tiers as one reader sees them. A reader with no archive bucket
/// fails on an archived slot instead of finding it empty.
pub struct Tiers {
    cold: Option<Bucket>,
    /// Subjects' keys: sealed events are opened with them ([`crate::privacy`]).
    keys: Option<Arc<Keys>>,
    boundary: Mutex<Boundary>,
    /// Archive objects fetched: whole, or the parts readers of some keys need.
    objects: Objects,
}

#[derive(Default)]
struct Boundary {
    seen: Option<Seen>,
    /// The read in flight, and when it was sent.
    reading: Option<(Instant, Fetch<Seen>)>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    /// When the read was sent (at the latest): it saw every write before this.
    sent: Instant,
    archived_to: i64,
}

/// An event's bytes for its consumer.
#[derive(Debug)]
pub struct Readable {
    /// As they were sent, an offloaded payload put back.
    pub bytes: Vec<u8>,
    /// Where the payload lies, when it was offloaded (for a consumer that cannot take it whole).
    pub offloaded: Option<OffloadRef>,
}

impl Tiers {
    pub fn new(cold: Option<Bucket>) -> Self {
        Self { cold, keys: None, boundary: Mutex::default(), objects: Objects::default() }
    }

    /// The keys this reader opens sealed events with.
    pub(crate) fn keys(&self) -> Option<Arc<Keys>> {
        self.keys.clone()
    }

    /// Opens sealed events with `keys` (a reader without them fails on one).
    pub fn with_keys(mut self, keys: Option<Arc<Keys>>) -> Self {
        self.keys = keys;
        self
    }

    /// The event's bytes as they were sent, with an offloaded payload
    /// fetched from the bucket (`ARCHIVE_BUCKET`) and checked against its
    /// hash, and sealed parts opened (or marked `forgotten`).
    /// An [unreadable](Error::is_unreadable) error: the event does not decode,
    /// or its payload is missing or altered. A key that cannot be had is
    /// another error ([`Error::Key`], [`Error::Kms`]): try again later.
    pub async fn bytes(&self, event: &EventItem) -> Result<Readable> {
        self.bytes_in_turn(event, None).await
    }

    /// [`Tiers::bytes`], fetching an offloaded payload only with `large`'s permit.
    async fn bytes_in_turn(&self, event: &EventItem, large: Option<&tokio::sync::Semaphore>) -> Result<Readable> {
        let bytes = event.bytes()?;
        let entity = entity_stream(&event.partition_key).is_some();
        let Some(reference) = offload::reference(&bytes, entity) else {
            return Ok(Readable { bytes: self.open(event, bytes).await?, offloaded: None });
        };
        let Some(bucket) = &self.cold else {
            return Err(Error::Config(format!(
                "event {} has its payload at {}, and this reader has no ARCHIVE_BUCKET",
                event.event_id,
                reference.location()
            )));
        };
        // Released once this event is opened (the permit is the stream's own: holding it waits on nothing else).
        let _turn = match large {
            Some(large) => Some(large.acquire().await.map_err(|_| Error::Config("a closed semaphore".into()))?),
            None => None,
        };
        let content = offload::fetch(bucket, &reference).await?;
        let bytes = self.open(event, offload::splice(&bytes, entity, &content)?).await?;
        Ok(Readable { bytes, offloaded: Some(reference) })
    }

    /// `events` with what [`Tiers::bytes`] says of each, [`OPEN_AT_ONCE`] of
    /// them opened at a time, handed out in their order.
    pub(crate) fn opened(
        &self,
        events: Vec<EventItem>,
    ) -> impl futures::Stream<Item = (EventItem, Result<Readable>)> + Unpin + '_ {
        use futures::StreamExt;
        let large = Arc::new(tokio::sync::Semaphore::new(1));
        futures::stream::iter(events)
            .map(move |event| {
                let large = large.clone();
                async move {
                    let readable = self.bytes_in_turn(&event, Some(&large)).await;
                    (event, readable)
                }
                .boxed()
            })
            .buffered(OPEN_AT_ONCE)
    }

    /// `bytes` with their sealed parts opened with the subject's key, if sealed.
    async fn open(&self, event: &EventItem, bytes: Vec<u8>) -> Result<Vec<u8>> {
        let entity = entity_stream(&event.partition_key).is_some();
        crate::privacy::open_record(self.keys.as_deref(), bytes, entity, &event.event_id).await
    }

    /// Whether `slot` is archived, as far as the boundary was last read.
    pub(crate) async fn archived(&self, dynamo: &aws_sdk_dynamodb::Client, table: &str, slot: i64) -> Result<bool> {
        let last = self.lock_boundary().seen;
        let seen = match last {
            Some(seen) => seen,
            None => self.read(dynamo, table, None).await?,
        };
        Ok(slot < seen.archived_to)
    }

    /// Whether a query of `slot` that ended at `ended` saw all of it: the
    /// boundary, read after `ended`, has not passed the slot.
    pub(crate) async fn still_hot(
        &self,
        dynamo: &aws_sdk_dynamodb::Client,
        table: &str,
        slot: i64,
        ended: Instant,
    ) -> Result<bool> {
        let last = self.lock_boundary().seen;
        if let Some(seen) = last {
            if seen.sent >= ended || slot < seen.archived_to {
                return Ok(slot >= seen.archived_to);
            }
        }
        Ok(slot >= self.read(dynamo, table, Some(ended)).await?.archived_to)
    }

    /// A boundary read sent after `after` (any, when `None`): the one in
    /// flight if it was, else a new one.
    async fn read(&self, dynamo: &aws_sdk_dynamodb::Client, table: &str, after: Option<Instant>) -> Result<Seen> {
        let fetch = {
            let mut boundary = self.lock_boundary();
            match &boundary.reading {
                Some((sent, fetch)) if fetch.peek().is_none() && after.is_none_or(|after| *sent >= after) => {
                    fetch.clone()
                }
                _ => {
                    let (dynamo, table, sent) = (dynamo.clone(), table.to_owned(), Instant::now());
                    let fetch = async move {
                        let boundary = store::boundary(&dynamo, &table).await.map_err(Arc::new)?;
                        Ok(Seen { sent, archived_to: boundary.archived_to })
                    }
                    .boxed()
                    .shared();
                    boundary.reading = Some((sent, fetch.clone()));
                    fetch
                }
            }
        };
        let seen = fetch.await.map_err(|e| Error::Archive(format!("reading the archive's boundary: {e}")))?;
        let mut boundary = self.lock_boundary();
        if boundary.seen.is_none_or(|old| old.sent < seen.sent) {
            boundary.seen = Some(seen);
        }
        Ok(seen)
    }

    fn lock_boundary(&self) -> std::sync::MutexGuard<'_, Boundary> {
        self.boundary.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The archived events of `slot` in `(after, to]` a reader of `keys`
    /// needs (others too, where they share what it reads), in log order
    /// (with the late ones the table holds, when the slot is marked). A slot
    /// before the boundary that no object holds had no events when it was
    /// archived (the manifest says so, or this is an error): whatever the
    /// table holds for it came late.
    pub(crate) async fn events(
        &self,
        dynamo: &aws_sdk_dynamodb::Client,
        table: &str,
        (slot, keys): (SlotRef, KeyRange),
        (after, to): (&str, &str),
    ) -> Result<Vec<EventItem>> {
        let Some(cold) = Box::pin(self.rows_of(dynamo, table, slot.slot, keys)).await? else {
            let mut late = late_events(dynamo, table, slot).await?;
            late.retain(|e| e.sort_key.as_str() > after && e.sort_key.as_str() <= to);
            late.sort_by(|a, b| a.sort_key.cmp(&b.sort_key));
            late.dedup_by(|a, b| a.sort_key == b.sort_key);
            return Ok(late);
        };
        let rows = &cold.rows;
        // Rows are in sort-key order, which is slot order too.
        let first = rows.partition_point(|r| r.sort_key.as_str() <= after);
        let archived = rows[first..]
            .iter()
            .take_while(|r| r.sort_key.as_str() <= to)
            .filter(|r| r.slot == slot.slot)
            .map(|r| r.clone().into_event());
        if !cold.late.contains(&slot.slot) {
            return Ok(archived.collect());
        }
        let mut merged: BTreeMap<String, EventItem> = archived.map(|e| (e.sort_key.clone(), e)).collect();
        for event in late_events(dynamo, table, slot).await? {
            if event.sort_key.as_str() > after && event.sort_key.as_str() <= to {
                merged.entry(event.sort_key.clone()).or_insert(event);
            }
        }
        Ok(merged.into_values().collect())
    }

    /// The rows of the object holding `slot` a reader of `keys` needs
    /// ([`Objects::rows_of`]); `None` when no object holds it.
    async fn rows_of(
        &self,
        dynamo: &aws_sdk_dynamodb::Client,
        table: &str,
        slot: i64,
        keys: KeyRange,
    ) -> Result<Option<Arc<Cold>>> {
        let Some(bucket) = &self.cold else {
            return Err(Error::Archive(format!(
                "slot {slot} is archived in S3, and this reader has no archive bucket (ARCHIVE_BUCKET)"
            )));
        };
        self.objects.rows_of(bucket, (dynamo, table), slot, keys).await
    }
}

/// Every event the table still holds under `slot` (each sub-key and slice): its late events.
async fn late_events(dynamo: &aws_sdk_dynamodb::Client, table: &str, slot: SlotRef) -> Result<Vec<EventItem>> {
    let mut events = Vec::new();
    for key in slot.all_storage_keys() {
        let storage = (event_item::HASH_KEY, AttributeValue::N(key.to_string()));
        for item in query_partition(dynamo, table, storage).await? {
            match decode_item(slot.slot, &item).events {
                Ok(decoded) => events.extend(decoded),
                Err(err) if err.is_newer() => return Err(err),
                Err(err) => return Err(Error::Archive(format!("a late item of archived slot {}: {err}", slot.slot))),
            }
        }
    }
    Ok(events)
}
