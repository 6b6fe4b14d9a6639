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
//! only the footer and its slices' row groups ([`crate::archive::cut`]),
//! each checked against the anchored entry's hashes before it is decoded.
//!
//! Late events written into an archived slot stay in the event table (the
//! objects are never rewritten); the scan marks such slots
//! ([`crate::bookkeeping::late_slots`]), and a marked slot is read from both
//! tiers, merged in sort-key order.
//!
//! Reads in flight (of the boundary, of an object) are shared futures, not
//! locks held across an `await`: a reader's slots are futures polled by one
//! stream, and one that is not being polled must not hold up the others.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use futures::future::{BoxFuture, FutureExt, Shared};

use crate::archive::columns::{self, Row};
use crate::archive::object::Bucket;
use crate::archive::store::{self, Pointer};
use crate::archive::vouch;
use crate::bookkeeping::late_slots;
use crate::bookkeeping::slot_index::SlotRef;
use crate::chunk::decode_item;
use crate::dynamo::query_partition;
use crate::envelope::entity_stream;
use crate::error::{Error, Result};
use crate::event_item::{self, EventItem};
use crate::offload::{self, OffloadRef};
use crate::privacy::keys::Keys;
use crate::slices::KeyRange;

/// Objects kept decoded for each range of keys read (the parts of an object
/// different ranges hold add up to one object): the one being read and the
/// one before or after it. Per range, so that readers of several ranges
/// sharing these tiers (a process running many partitions) do not evict
/// each other's objects slot after slot.
const OBJECTS_KEPT: usize = 2;
/// Events of a page opened at once by [`Tiers::opened`]: their keys are
/// fetched concurrently, so a reader of many subjects with cold keys waits for
/// a round trip per 16 of them, not per subject. Offloaded payloads (up to
/// 4 MiB each) are fetched one at a time: at most 16 opened events are held
/// besides the page, and one payload is being put back.
pub const OPEN_AT_ONCE: usize = 16;
/// How long a fetched object (with its slots' late marks) is reused: a
/// reader that lives long (a warm function's) sees late events marked since.
const OBJECT_TTL: Duration = Duration::from_secs(60);

/// An object's rows, and the slots among them with late events in the table.
#[derive(Debug, Default)]
struct Cold {
    rows: Vec<Row>,
    late: BTreeSet<i64>,
}

type Rows = Arc<Cold>;
type Fetch<T> = Shared<BoxFuture<'static, std::result::Result<T, Arc<Error>>>>;
/// An object's rows fetched for a reader of some keys, and when.
type Held = (Pointer, KeyRange, Instant, Fetch<Rows>);

/// The tiers as one reader sees them. A reader with no archive bucket
/// fails on an archived slot instead of finding it empty.
pub struct Tiers {
    cold: Option<Bucket>,
    /// Subjects' keys: sealed events are opened with them ([`crate::privacy`]).
    keys: Option<Arc<Keys>>,
    boundary: Mutex<Boundary>,
    /// Objects fetched: whole (for [`KeyRange::ALL`]) or the part a range needs.
    objects: Mutex<VecDeque<Held>>,
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
        Self { cold, keys: None, boundary: Mutex::default(), objects: Mutex::default() }
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

    /// The rows of the object holding `slot` a reader of `keys` needs,
    /// fetched once for all the slots it holds; `None` when no object holds it.
    async fn rows_of(
        &self,
        dynamo: &aws_sdk_dynamodb::Client,
        table: &str,
        slot: i64,
        keys: KeyRange,
    ) -> Result<Option<Rows>> {
        let Some(bucket) = &self.cold else {
            return Err(Error::Archive(format!(
                "slot {slot} is archived in S3, and this reader has no archive bucket (ARCHIVE_BUCKET)"
            )));
        };
        let fetch = match self.cached(keys, |p| p.start <= slot && slot < p.end) {
            Some(fetch) => fetch,
            None => {
                // Boxed, as the checks below: inline, they would grow every reader's future (and stack).
                let pointer = match Box::pin(store::pointers_around(dynamo, table, slot)).await? {
                    (Some(before), _) if before.end > slot => before,
                    around => {
                        Box::pin(vouch::empty_slot(dynamo, table, bucket, slot, around)).await?;
                        return Ok(None);
                    }
                };
                let mut objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
                objects.retain(|(_, _, fetched, fetch)| usable(*fetched, fetch));
                // The whole pointer: one naming a cached object with other slots is checked afresh.
                match objects.iter().find(|(p, k, _, _)| *p == pointer && serves(*k, keys)) {
                    Some((_, _, _, fetch)) => fetch.clone(),
                    None => {
                        let fetch = fetch_rows(bucket.clone(), (dynamo.clone(), table.to_owned()), &pointer, keys);
                        objects.push_back((pointer, keys, Instant::now(), fetch.clone()));
                        if objects.iter().filter(|(_, k, _, _)| *k == keys).count() > OBJECTS_KEPT {
                            if let Some(oldest) = objects.iter().position(|(_, k, _, _)| *k == keys) {
                                objects.remove(oldest);
                            }
                        }
                        fetch
                    }
                }
            }
        };
        fetch.await.map(Some).map_err(|e| Error::Archive(e.to_string()))
    }

    fn cached(&self, keys: KeyRange, holds: impl Fn(&Pointer) -> bool) -> Option<Fetch<Rows>> {
        let objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
        objects
            .iter()
            .find(|(p, k, fetched, fetch)| holds(p) && serves(*k, keys) && usable(*fetched, fetch))
            .map(|(_, _, _, fetch)| fetch.clone())
    }
}

/// Whether an object's rows fetched for `fetched` hold every row a reader of `keys` needs.
fn serves(fetched: KeyRange, keys: KeyRange) -> bool {
    fetched == keys || fetched == KeyRange::ALL
}

/// A fetch worth reusing: recent, and not failed (a failed one is tried again).
fn usable(fetched: Instant, fetch: &Fetch<Rows>) -> bool {
    fetched.elapsed() < OBJECT_TTL && !matches!(fetch.peek(), Some(Err(_)))
}

/// The object's rows a reader of `keys` needs ([`object_rows`]), fetched,
/// checked and decoded once, for whoever awaits them first, and the late
/// markers of its slots.
fn fetch_rows(
    bucket: Bucket,
    (dynamo, table): (aws_sdk_dynamodb::Client, String),
    pointer: &Pointer,
    keys: KeyRange,
) -> Fetch<Rows> {
    let pointer = pointer.clone();
    async move {
        let rows = Box::pin(object_rows(&bucket, (&dynamo, &table), &pointer, keys));
        let late = late_slots::in_range(&dynamo, &table, pointer.start, pointer.end);
        let (rows, late) = tokio::join!(rows, late);
        Ok(Arc::new(Cold { rows: rows.map_err(Arc::new)?, late: late.map_err(Arc::new)? }))
    }
    .boxed()
    .shared()
}

/// The rows of the object `pointer` names that a reader of `keys` needs,
/// checked against the anchored entry the pointer names ([`vouch`]): of an
/// object cut by slice, the row groups of the slices of `keys` (two ranged
/// `GET`s: the footer and those groups); else the whole object.
async fn object_rows(
    bucket: &Bucket,
    (dynamo, table): (&aws_sdk_dynamodb::Client, &str),
    pointer: &Pointer,
    keys: KeyRange,
) -> Result<Vec<Row>> {
    let key = pointer.object.as_str();
    if keys == KeyRange::ALL {
        let (entry, bytes) = tokio::join!(vouch::entry_of(dynamo, table, bucket, pointer), bucket.get(key));
        let (entry, bytes) = (entry?, bytes?);
        return decode(bucket, key, move || whole(&entry, bytes)).await;
    }
    let entry = vouch::entry_of(dynamo, table, bucket, pointer).await?;
    // The row groups of the range, when they are not all of them; where they and the footer are.
    let part = entry.cut.as_ref().and_then(|cut| {
        let groups = cut.groups_of(keys);
        let footer = cut.footer.offset..cut.footer.offset + cut.footer.length;
        (groups.len() < cut.groups.len()).then(|| (groups.clone(), footer, cut.span_of(groups)))
    });
    let Some((groups, footer, span)) = part else {
        let bytes = bucket.get(key).await?;
        return decode(bucket, key, move || whole(&entry, bytes)).await;
    };
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let (footer, bytes) = tokio::try_join!(bucket.get_range(key, footer), bucket.get_range(key, span.clone()))?;
    decode(bucket, key, move || {
        vouch::check_fetched(&entry, &footer, (span.start, &bytes), groups.clone())?;
        let rows = columns::read_groups(entry.bytes, footer, (span.start, bytes), groups.clone())?;
        vouch::check_rows(&entry, groups, &rows)?;
        Ok(rows)
    })
    .await
}

/// The rows of a whole object, checked against its entry.
fn whole(entry: &crate::archive::manifest::Entry, bytes: bytes::Bytes) -> Result<Vec<Row>> {
    let object = columns::open(bytes.clone())?;
    vouch::check_object(entry, &bytes, &object)?;
    Ok(object.rows)
}

/// `work`'s rows: hashing and decoding are CPU work, off the runtime's threads.
async fn decode(
    bucket: &Bucket,
    key: &str,
    work: impl FnOnce() -> Result<Vec<Row>> + Send + 'static,
) -> Result<Vec<Row>> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Archive(format!("decoding s3://{}/{key}: {e}", bucket.name)))?
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
