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
//! Reads in flight (of the boundary, of an object) are shared futures, not
//! locks held across an `await`: a reader's slots are futures polled by one
//! stream, and one that is not being polled must not hold up the others.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use futures::future::{BoxFuture, FutureExt, Shared};

use crate::archive::columns::{self, Row};
use crate::archive::object::Bucket;
use crate::archive::store::{self, Pointer};
use crate::error::{Error, Result};
use crate::event_item::EventItem;

/// Objects kept decoded: the one being read and those just before and after it.
const OBJECTS_KEPT: usize = 3;

type Rows = Arc<Vec<Row>>;
type Fetch<T> = Shared<BoxFuture<'static, std::result::Result<T, Arc<Error>>>>;

/// The tiers as one reader sees them. Without an archive bucket, the
/// boundary is read once: a reader with no archive configured fails on an
/// archived slot instead of finding it empty.
pub struct Tiers {
    cold: Option<Bucket>,
    boundary: Mutex<Boundary>,
    objects: Mutex<VecDeque<(Pointer, Fetch<Rows>)>>,
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

impl Tiers {
    pub fn new(cold: Option<Bucket>) -> Self {
        Self { cold, boundary: Mutex::default(), objects: Mutex::default() }
    }

    /// Whether `slot` is archived, as far as the boundary was last read.
    pub async fn archived(&self, dynamo: &aws_sdk_dynamodb::Client, table: &str, slot: i64) -> Result<bool> {
        let last = self.lock_boundary().seen;
        let seen = match last {
            Some(seen) => seen,
            None => self.read(dynamo, table, None).await?,
        };
        Ok(slot < seen.archived_to)
    }

    /// Whether a query of `slot` that ended at `ended` saw all of it: the
    /// boundary, read after `ended`, has not passed the slot.
    pub async fn still_hot(
        &self,
        dynamo: &aws_sdk_dynamodb::Client,
        table: &str,
        slot: i64,
        ended: Instant,
    ) -> Result<bool> {
        let last = self.lock_boundary().seen;
        if let Some(seen) = last {
            if self.cold.is_none() || seen.sent >= ended || slot < seen.archived_to {
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

    /// The archived events of `slot` in `(after, to]`, in log order.
    pub async fn events(
        &self,
        dynamo: &aws_sdk_dynamodb::Client,
        table: &str,
        slot: i64,
        (after, to): (&str, &str),
    ) -> Result<Vec<EventItem>> {
        let rows = self.rows_of(dynamo, table, slot).await?;
        // Rows are in sort-key order, which is slot order too.
        let first = rows.partition_point(|r| r.sort_key.as_str() <= after);
        Ok(rows[first..]
            .iter()
            .take_while(|r| r.sort_key.as_str() <= to)
            .filter(|r| r.slot == slot)
            .map(|r| r.clone().into_event())
            .collect())
    }

    /// The rows of the object holding `slot`, fetched once for all the slots it holds.
    async fn rows_of(&self, dynamo: &aws_sdk_dynamodb::Client, table: &str, slot: i64) -> Result<Rows> {
        let Some(bucket) = &self.cold else {
            return Err(Error::Archive(format!(
                "slot {slot} is archived in S3, and this reader has no archive bucket (ARCHIVE_BUCKET)"
            )));
        };
        let fetch = match self.cached(|p| p.start <= slot && slot < p.end) {
            Some(fetch) => fetch,
            None => {
                let pointer = store::object_at(dynamo, table, slot).await?.ok_or_else(|| {
                    Error::Archive(format!("slot {slot} is archived, but no archive object holds it"))
                })?;
                let mut objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
                match objects.iter().find(|(p, _)| p.object == pointer.object) {
                    Some((_, fetch)) => fetch.clone(),
                    None => {
                        let fetch = fetch_rows(bucket.clone(), pointer.object.clone());
                        objects.push_back((pointer, fetch.clone()));
                        if objects.len() > OBJECTS_KEPT {
                            objects.pop_front();
                        }
                        fetch
                    }
                }
            }
        };
        fetch.await.map_err(|e| Error::Archive(e.to_string()))
    }

    fn cached(&self, holds: impl Fn(&Pointer) -> bool) -> Option<Fetch<Rows>> {
        let objects = self.objects.lock().unwrap_or_else(PoisonError::into_inner);
        objects.iter().find(|(p, _)| holds(p)).map(|(_, fetch)| fetch.clone())
    }
}

/// The object's rows, fetched and decoded once, for whoever awaits them first.
fn fetch_rows(bucket: Bucket, key: String) -> Fetch<Rows> {
    async move {
        let bytes = bucket.get(&key).await.map_err(Arc::new)?;
        // Decoding is CPU work: off the runtime's threads.
        let rows = tokio::task::spawn_blocking(move || columns::read(bytes))
            .await
            .map_err(|e| Arc::new(Error::Archive(format!("decoding s3://{}/{key}: {e}", bucket.name))))?
            .map_err(Arc::new)?;
        Ok(Arc::new(rows))
    }
    .boxed()
    .shared()
}
