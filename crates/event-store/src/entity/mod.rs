//! Entity streams: one stream of events per entity (an order, a todo),
//! appended with optimistic concurrency, read back in version order, with a
//! snapshot so loading an entity does not mean reading its whole history.
//!
//! [`EntityStore`] is the library (users' own Lambdas call it); [`http`] is the
//! `/streams/{name}` API on top of it; [`relay`] puts every appended event on
//! the event stream, so entity events reach the time-ordered log too.
//!
//! Every append is **one** `TransactWriteItems`: a conditional update of the
//! stream's tip (the version check, never a read followed by a blind write)
//! and the put of one batch item holding all the request's events (so a
//! reader sees all of them or none). The storage layout is in [`model`].

mod across;
mod append;
pub mod cqrs;
pub mod http;
pub mod listing;
mod metadata;
pub mod model;
mod offload;
mod read;
pub mod relay;
pub(crate) mod rerelay;
pub(crate) mod retention;
mod sealing;
mod snapshot;
pub mod upcast;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::batch::Backoff;
use crate::error::Error;
use crate::offload::Offloads;
pub use across::{Condition, StreamAppend, MAX_ACROSS_BYTES, MAX_STREAMS_ACROSS};
use append::Keyed;
pub use metadata::{Trimmed, META_ITEM};
use model::{batch_key, check_name, deleted_event, Batch, StreamItem, Tip, HASH_KEY, RANGE_KEY, TIP};
pub use model::{Expected, Invalid, NewEvent, RecordedEvent};
pub use read::{Direction, Page, State, READ_PAYLOAD_BYTES};
pub use retention::{Retention, StreamMetadata, MAX_CUSTOM_METADATA_BYTES};
use snapshot::snapshot_text;
pub use snapshot::Snapshot;

/// The AWS actions the entity API calls (a transaction needs the actions of
/// its parts). [`EntityStore::index_streams`] (an operator's backfill) also
/// needs `dynamodb:Scan`; the streams function does not call it.
pub const AWS_ACTIONS: &[&str] = &[
    // Listing streams: their tips.
    "dynamodb:BatchGetItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:Query",
    "dynamodb:UpdateItem",
    "s3:GetObject",
    // Not called: S3 answers a missing key 404 (an unreadable event) only to a role that may list
    // the bucket, and 403 (a failure retried for ever) to one that may not.
    "s3:ListBucket",
    "s3:PutObject",
    // Sealing subjects' streams' data (`KEY_TABLE`): keys unwrapped, new ones asked of `keys`.
    "kms:Decrypt",
    "lambda:InvokeFunction",
];

/// Why an entity operation did not happen. Everything but `Store` is the
/// caller's to handle (the HTTP API maps each to a status).
#[derive(Debug, thiserror::Error)]
pub enum EntityError {
    #[error("{0}")]
    Invalid(#[from] Invalid),
    #[error("no such stream")]
    NotFound,
    /// The expected version did not hold: someone else appended first.
    #[error("the stream is at version {current}")]
    Conflict { current: u64 },
    /// An append across streams: this stream's expectation or condition did not
    /// hold (`current`: its version, `None` when it does not exist).
    #[error("{stream}: the expected version or condition does not hold (it is at {current:?}{})", if *.deleted { ", deleted" } else { "" })]
    Refused { stream: String, current: Option<u64>, deleted: bool },
    /// The metadata's expected version did not hold.
    #[error("the stream's metadata is at version {current}")]
    MetadataConflict { current: u64 },
    /// The stream was deleted (its `StreamDeleted` event is at `current`).
    #[error("the stream was deleted at version {current}")]
    Deleted { current: u64 },
    /// A snapshot of a later version is already stored.
    #[error("a snapshot at version {stored} is already stored")]
    StaleSnapshot { stored: u64 },
    #[error(transparent)]
    Store(#[from] Error),
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Version of the first event appended.
    pub first: u64,
    /// Version of the last one: the stream's version after the append.
    pub last: u64,
    /// True when this request had already been applied (the same event ids):
    /// nothing was written now, and this is the original answer.
    pub replayed: bool,
}

/// What an append writes besides its events.
#[derive(Debug, Clone, Copy)]
enum Also<'a> {
    Nothing,
    /// Marks the stream deleted (its events: the `StreamDeleted` event).
    Delete,
    /// The snapshot (JSON text, or sealed) folded up to the last appended event.
    Snapshot(&'a sealing::StoredState),
}

/// The entity streams of one table.
#[derive(Clone)]
pub struct EntityStore {
    dynamo: aws_sdk_dynamodb::Client,
    table: String,
    backoff: Backoff,
    /// Where large event data goes ([`crate::offload`]); `None`: every event inline.
    offloads: Option<Offloads>,
    /// Seals subjects' streams' data ([`crate::privacy`]); `keys` opens it.
    subjects: Option<crate::privacy::Subjects>,
    keys: Option<std::sync::Arc<crate::privacy::keys::Keys>>,
    /// Applied to every event read ([`upcast`]); `None`: events as stored.
    upcasters: Option<std::sync::Arc<upcast::Upcasters>>,
}

fn s(value: impl Into<String>) -> AttributeValue {
    AttributeValue::S(value.into())
}

fn n(value: impl ToString) -> AttributeValue {
    AttributeValue::N(value.to_string())
}

fn key(stream: &str, item: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([(HASH_KEY.to_owned(), s(stream)), (RANGE_KEY.to_owned(), s(item))])
}

impl EntityStore {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, table: impl Into<String>) -> Self {
        // Transaction conflicts between writers of one stream clear in milliseconds.
        let backoff = Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(500), max_attempts: 8 };
        Self { dynamo, table: table.into(), backoff, offloads: None, subjects: None, keys: None, upcasters: None }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// Appends `events` to `stream` if `expected` holds, all or none.
    /// Sending the same events (same ids) again after a success answers the
    /// original versions with `replayed` set, not a conflict.
    pub async fn append(
        &self,
        stream: &str,
        expected: Expected,
        events: Vec<NewEvent>,
    ) -> Result<Appended, EntityError> {
        check_name(stream)?;
        let mut events = events;
        self.stamp(&mut events);
        let keyed = Keyed::by_client(&events);
        let events = self.prepare(stream, events).await?;
        self.append_stored(stream, expected, events, Also::Nothing, keyed).await
    }

    /// Appends `events` as [`append`](Self::append) does and, in the same
    /// transaction, stores `state` as the snapshot folded up to the last of
    /// them: the snapshot can never be missing for a committed append, nor
    /// name one that failed (what an aggregate stored as its state needs).
    pub async fn append_with_snapshot(
        &self,
        stream: &str,
        expected: Expected,
        events: Vec<NewEvent>,
        state: &serde_json::Value,
    ) -> Result<Appended, EntityError> {
        check_name(stream)?;
        let state = self.seal_state(stream, snapshot_text(state)?).await?;
        let mut events = events;
        self.stamp(&mut events);
        let keyed = Keyed::by_client(&events);
        let events = self.prepare(stream, events).await?;
        self.append_stored(stream, expected, events, Also::Snapshot(&state), keyed).await
    }

    /// Marks the stream deleted by appending a `StreamDeleted` event (nothing
    /// is erased; later appends fail with [`EntityError::Deleted`]).
    pub async fn delete(&self, stream: &str, expected_version: u64) -> Result<Appended, EntityError> {
        check_name(stream)?;
        // Not recorded by request key: the deleted event's id is derivable, so an append
        // carrying it must not pass for the delete (a retry is still recognized at its position).
        let events = vec![deleted_event(stream)];
        self.append_stored(stream, Expected::Version(expected_version), events, Also::Delete, Keyed::No).await
    }

    /// The stream's tip (a strongly consistent read), `None` for a stream that does not exist.
    pub async fn tip(&self, stream: &str) -> Result<Option<Tip>, Error> {
        match self.get(stream, TIP).await? {
            Some(StreamItem::Tip(tip)) => Ok(Some(tip)),
            Some(_) => Err(Error::Malformed(format!("{stream}: the tip is not a tip"))),
            None => Ok(None),
        }
    }

    async fn batch(&self, stream: &str, first: u64) -> Result<Option<Batch>, Error> {
        match self.get(stream, &batch_key(first)).await? {
            Some(StreamItem::Batch(batch)) => Ok(Some(batch)),
            _ => Ok(None),
        }
    }

    async fn get(&self, stream: &str, item: &str) -> Result<Option<StreamItem>, Error> {
        self.read_item(stream, item).await?.map(StreamItem::decode).transpose()
    }

    /// One item of a stream as stored (a strongly consistent `GetItem`).
    async fn read_item(&self, stream: &str, item: &str) -> Result<Option<HashMap<String, AttributeValue>>, Error> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(stream, item)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| Error::dynamo("GetItem", e))?;
        Ok(out.item)
    }
}
