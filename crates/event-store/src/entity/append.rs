//! The write path of an append: one `TransactWriteItems` (the tip's version
//! check, the batch, and the request record and relay position where they
//! apply), and what a cancelled one means (`docs/design.md`, invariant 1).

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use tracing::debug;

use super::model::{
    batch_key, request_item_key, request_key, Batch, RequestItem, SnapshotItem, StoredEventItem, Tip,
    MAX_NEW_NAME_BYTES, MAX_VERSION, RANGE_KEY, SNAPSHOT, TIP,
};
use super::{key, n, s, Also, Appended, EntityError, EntityStore, Expected, Invalid, NewEvent};
use crate::bookkeeping::entity_positions;
use crate::error::Error;
use crate::time::now_ms;

/// Whether an append is recorded by its request key (`_req#…`), so that a
/// retry is recognized however much was appended since: only when the client
/// chose every event's id (random ids differ on every try anyway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keyed {
    Yes,
    No,
}

/// An append's request key (`model::request_key`), and whether it is recorded.
#[derive(Debug, Clone, Copy)]
struct Request<'a> {
    key: &'a str,
    keyed: Keyed,
}

impl<'a> Request<'a> {
    fn recorded(self) -> Option<&'a str> {
        (self.keyed == Keyed::Yes).then_some(self.key)
    }
}

impl Keyed {
    pub(super) fn by_client(events: &[NewEvent]) -> Self {
        if events.iter().all(|e| e.id.is_some()) {
            Keyed::Yes
        } else {
            Keyed::No
        }
    }
}

impl EntityStore {
    pub(super) async fn append_stored(
        &self,
        stream: &str,
        expected: Expected,
        events: Vec<StoredEventItem>,
        also: Also<'_>,
        keyed: Keyed,
    ) -> Result<Appended, EntityError> {
        let count = events.len() as u64;
        let key = request_key(&events);
        let request = Request { key: &key, keyed };
        let recorded = request.recorded();
        for attempt in 0..self.backoff.max_attempts {
            let expectation = match expected {
                Expected::Any => match self.tip(stream).await? {
                    Some(tip) if tip.last_request.as_deref() == Some(request.key) => {
                        let first = tip.last_first.unwrap_or(tip.version + 1 - count);
                        return Ok(Appended { first, last: first + count - 1, replayed: true });
                    }
                    Some(tip) if tip.deleted => return Err(EntityError::Deleted { current: tip.version }),
                    Some(tip) => Expected::Version(tip.version),
                    None => Expected::NoStream,
                },
                other => other,
            };
            let first = expectation.first_version().unwrap_or(0);
            let last = first + count - 1;
            if last > MAX_VERSION {
                return Err(Invalid::BadRequest(format!("a stream holds at most {MAX_VERSION} events")).into());
            }
            if first == 0 && stream.len() > MAX_NEW_NAME_BYTES {
                return Err(
                    Invalid::BadRequest(format!("a new stream's name is 1 to {MAX_NEW_NAME_BYTES} bytes")).into()
                );
            }
            match self.write_append(stream, expectation, first, &events, request, also).await {
                Ok(()) => {
                    debug!(stream, first, last, "appended");
                    return Ok(Appended { first, last, replayed: false });
                }
                Err(AppendFailure::Store(err)) => return Err(err.into()),
                Err(AppendFailure::Cancelled) => {}
            }
            let cancelled = Cancelled { expected, expectation, first, last, recorded };
            if let Some(appended) = self.after_cancel(stream, cancelled, &events, request.key).await? {
                return Ok(appended);
            }
            self.backoff.wait(attempt).await;
        }
        Err(Error::Throttled {
            service: "dynamodb",
            operation: "TransactWriteItems",
            source: format!("stream {stream}: still contended after {} attempts", self.backoff.max_attempts).into(),
        }
        .into())
    }

    /// Why an append's transaction was cancelled: applied before (the
    /// original answer), a conflict, a deleted or missing stream (the error);
    /// `None` when the expectation still holds (another transaction was in
    /// flight on the tip) or `Any` lost a race: try again.
    async fn after_cancel(
        &self,
        stream: &str,
        cancelled: Cancelled<'_>,
        events: &[StoredEventItem],
        request: &str,
    ) -> Result<Option<Appended>, EntityError> {
        let Cancelled { expected, expectation, first, last, recorded } = cancelled;
        // Applied before (whatever was appended since)? Then the original answer.
        if let Some(applied) = self.applied_request(stream, recorded).await? {
            return Ok(Some(Appended { first: applied.first, last: applied.last, replayed: true }));
        }
        // Otherwise find out why from the tip as it is now.
        let tip = self.tip(stream).await?;
        if let Some(tip) = &tip {
            if tip.version >= last && self.already_applied(stream, tip, first, events, request).await? {
                return Ok(Some(Appended { first, last, replayed: true }));
            }
        }
        match (expectation, tip) {
            (_, Some(tip)) if tip.deleted => Err(EntityError::Deleted { current: tip.version }),
            (Expected::NoStream, Some(tip)) if expected != Expected::Any => {
                Err(EntityError::Conflict { current: tip.version })
            }
            (Expected::Version(_), None) if expected != Expected::Any => Err(EntityError::NotFound),
            (Expected::Version(v), Some(tip)) if tip.version != v && expected != Expected::Any => {
                Err(EntityError::Conflict { current: tip.version })
            }
            _ => Ok(None),
        }
    }

    /// The record of this request's earlier application, if it has one (a request of client ids).
    pub(super) async fn applied_request(
        &self,
        stream: &str,
        request: Option<&str>,
    ) -> Result<Option<RequestItem>, Error> {
        let Some(request) = request else { return Ok(None) };
        self.read_item(stream, &request_item_key(request))
            .await?
            .map(|item| serde_dynamo::from_item(item).map_err(|e| Error::Malformed(format!("request record: {e}"))))
            .transpose()
    }

    /// True when the batch at `first` holds exactly these events: this request was applied before
    /// (what recognizes the retry of a request without client ids, or from before request records).
    async fn already_applied(
        &self,
        stream: &str,
        tip: &Tip,
        first: u64,
        events: &[StoredEventItem],
        request: &str,
    ) -> Result<bool, Error> {
        if tip.last_request.as_deref() == Some(request) && tip.last_first == Some(first) {
            return Ok(true);
        }
        Ok(self.batch(stream, first).await?.is_some_and(|batch| batch.holds(events)))
    }

    /// The put of a new item of an append's transaction (refused if it exists).
    pub(super) fn put_new(&self, item: &impl serde::Serialize, what: &'static str) -> Result<Put, AppendFailure> {
        let item = serde_dynamo::to_item(item).map_err(|e| AppendFailure::Store(Error::encode(what, e)))?;
        Put::builder()
            .table_name(&self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#item)")
            .expression_attribute_names("#item", RANGE_KEY)
            .build()
            .map_err(|e| AppendFailure::Store(e.into()))
    }

    /// The update of the stream's tip an append makes: to `last`, with the
    /// request that did it, on the version the append expects.
    fn tip_update(
        &self,
        stream: &str,
        expected: Expected,
        (first, last): (u64, u64),
        request: &str,
        delete: bool,
        now: i64,
    ) -> Result<Update, AppendFailure> {
        let mut set =
            "SET #version = :last, updated_at = :now, last_request = :request, last_first = :first".to_owned();
        let mut update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(key(stream, TIP)))
            .expression_attribute_names("#version", "version")
            .expression_attribute_values(":last", n(last))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":request", s(request))
            .expression_attribute_values(":first", n(first));
        if delete {
            set.push_str(", deleted = :deleted");
            update = update.expression_attribute_values(":deleted", AttributeValue::Bool(true));
        }
        update = match expected {
            Expected::Version(v) => update
                .condition_expression("#version = :expected AND attribute_not_exists(deleted)")
                .expression_attribute_values(":expected", n(v)),
            _ => update.condition_expression("attribute_not_exists(#version)"),
        };
        update.update_expression(set).build().map_err(|e| AppendFailure::Store(e.into()))
    }

    async fn write_append(
        &self,
        stream: &str,
        expected: Expected,
        first: u64,
        events: &[StoredEventItem],
        request: Request<'_>,
        also: Also<'_>,
    ) -> Result<(), AppendFailure> {
        let now = now_ms();
        let mut items = self.append_items(stream, expected, first, events, request.key, also, now)?;
        if let Some(request) = request.recorded() {
            let last = first + events.len() as u64 - 1;
            let record = RequestItem {
                stream: stream.to_owned(),
                item: request_item_key(request),
                first,
                last,
                at: now,
                across: None,
            };
            items.push(TransactWriteItem::builder().put(self.put_new(&record, "request record")?).build());
        }
        match self.dynamo.transact_write_items().set_transact_items(Some(items)).send().await {
            Ok(_) => Ok(()),
            Err(err) if is_cancelled(&err) => Err(AppendFailure::Cancelled),
            Err(err) => Err(AppendFailure::Store(Error::dynamo("TransactWriteItems", err))),
        }
    }

    /// The writes of one stream's append, its request record aside: the tip's
    /// version check, the batch, a new stream's relay position and name-index
    /// item, and the snapshot `also` names.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn append_items(
        &self,
        stream: &str,
        expected: Expected,
        first: u64,
        events: &[StoredEventItem],
        request: &str,
        also: Also<'_>,
        now: i64,
    ) -> Result<Vec<TransactWriteItem>, AppendFailure> {
        let last = first + events.len() as u64 - 1;
        let update = self.tip_update(stream, expected, (first, last), request, matches!(also, Also::Delete), now)?;
        let batch =
            Batch { stream: stream.to_owned(), item: batch_key(first), first, at: now, events: events.to_vec() };
        let put = self.put_new(&batch, "batch item")?;
        let mut items =
            vec![TransactWriteItem::builder().update(update).build(), TransactWriteItem::builder().put(put).build()];
        if first == 0 {
            // A stream created from now on has a relay position from its first append,
            // so the relay can tell it from a stream relayed before positions existed.
            let position = Update::builder()
                .table_name(&self.table)
                .set_key(Some(key(stream, entity_positions::RELAY_ITEM)))
                .update_expression("SET created_at = if_not_exists(created_at, :now)")
                .expression_attribute_values(":now", n(now))
                .build()
                .map_err(|e| AppendFailure::Store(e.into()))?;
            items.push(TransactWriteItem::builder().update(position).build());
            // And its name in the index that lists streams (`listing`).
            let name = super::listing::index_put(&self.table, stream, now).map_err(AppendFailure::Store)?;
            items.push(TransactWriteItem::builder().put(name).build());
        }
        if let Also::Snapshot(state) = also {
            // No condition of its own: the tip's version check makes this the
            // newest version, so no stored snapshot can be of a later one.
            let snapshot = SnapshotItem {
                stream: stream.to_owned(),
                item: SNAPSHOT.to_owned(),
                version: last,
                state: state.state.clone(),
                at: now,
                subject: state.subject.clone(),
                sealed: state.sealed.clone(),
            };
            let item = serde_dynamo::to_item(&snapshot)
                .map_err(|e| AppendFailure::Store(Error::encode("snapshot item", e)))?;
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(item))
                .build()
                .map_err(|e| AppendFailure::Store(e.into()))?;
            items.push(TransactWriteItem::builder().put(put).build());
        }
        Ok(items)
    }
}

/// An append whose transaction was cancelled: what was asked
/// (`expected`), what the attempt expected, its versions, its request record.
struct Cancelled<'a> {
    expected: Expected,
    expectation: Expected,
    first: u64,
    last: u64,
    recorded: Option<&'a str>,
}

pub(super) enum AppendFailure {
    /// A condition failed (or another transaction held the item): see the tip to know which.
    Cancelled,
    Store(Error),
}

pub(super) fn is_cancelled<R>(
    err: &aws_sdk_dynamodb::error::SdkError<
        aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError,
        R,
    >,
) -> bool {
    // A failed condition and a concurrent transaction on the tip both cancel the transaction.
    err.as_service_error().is_some_and(|e| e.is_transaction_canceled_exception())
}
