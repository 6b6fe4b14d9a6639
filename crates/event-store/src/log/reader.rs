//! Reads the window's non-empty slots from the event table, page by page,
//! ahead of the puts: the first pages of the next slots are in flight
//! together, a slot's further pages follow one by one.
//!
//! A slot's items are chunks of many events ([`crate::chunk`]), or single
//! events written before chunks, stored under one or more sub-keys, or under
//! their slices' keys. Each hash key the reader's keys may be under is
//! queried in key order (the order of each chunk's first event) and the
//! events are merged ([`SlotMerge`]): handed out in sort-key order, each
//! once, only once no chunk still unread can hold an earlier one.
//!
//! A slot before the archive's boundary is read from its object in S3
//! instead, and a slot the boundary passes while it is read goes on from
//! there ([`Tiers`]): readers see one log, whichever tier holds it.
//!
//! A chunk may start before where reading begins (a window's start, a
//! checkpoint inside the slot) and end after it, so a slot is queried from
//! its first key, and items ending before the start are filtered out by
//! their `last` attribute (they still cost their read units).

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::time::Instant;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use futures::StreamExt;
use tokio::sync::mpsc;
use tracing::warn;

use super::tiers::Tiers;
use super::window::Window;
use crate::bookkeeping::slot_index::SlotRef;
use crate::chunk::{self, decode_item, SlotMerge};
use crate::error::{Error, Result};
use crate::event_item::{self, sort_key_floor, EventItem};
use crate::log::copies::{envelope_id, RecentIds};
use crate::position::{Checkpoint, Lookback};
use crate::slices::KeyRange;

/// Slots whose first page is queried ahead of the one being put.
const QUERY_AHEAD: usize = 8;
/// A slot's hash keys (sub-keys, slices) whose first pages are queried at once.
const SOURCES_AT_ONCE: usize = 16;
/// Pages fetched but not yet consumed (memory bound: about this many MB).
pub const PAGES_AHEAD: usize = 4;

/// Events of one slot, in order, from one or more query pages.
pub struct Page {
    pub slot: i64,
    pub events: Vec<EventItem>,
    /// Items that could not be decoded as items at all (skipped, logged).
    /// A chunk whose bytes do not decode comes as one event whose `bytes()`
    /// fail, so that readers park or count it where it stands.
    pub unreadable: usize,
    /// Set when the slot has more: the sort key to resume after (every event
    /// up to it is in this page or an earlier one).
    pub last_key: Option<String>,
    /// `Query` requests this page took.
    pub queries: usize,
}

/// Reads the event table's slots within `window` (playback's, and a subscription partition's).
pub struct Reader<'a> {
    pub dynamo: &'a aws_sdk_dynamodb::Client,
    pub table: &'a str,
    pub time_unit_ms: u64,
    /// Items per query page; `None`: DynamoDB's 1 MB pages.
    pub page_items: Option<i32>,
    pub dedupe_window_ms: u64,
    pub window: &'a Window,
    /// The keys this reader reads: in a slot cut into slices, only the slices
    /// that hold them are queried ([`crate::slices`]); events of other keys
    /// in what it reads (sub-keys, a slice shared with other ranges, the cold
    /// tier) still come, for the caller to pass over.
    pub keys: KeyRange,
    /// Where each slot is read from (shared by everything this reader reads).
    pub tiers: &'a Tiers,
}

impl Reader<'_> {
    /// Queries `slots`' pages in order into `tx`, the first from `from`.
    /// Stops when the consumer hangs up.
    pub async fn fetch_pages(&self, slots: Vec<SlotRef>, from: Checkpoint, tx: mpsc::Sender<Result<Page>>) {
        let first_pages = futures::stream::iter(slots)
            .map(|slot| {
                let after = if slot.slot == from.slot { from.after.clone() } else { None };
                async move {
                    let (lo, to) = self.window.key_range(slot.slot, self.time_unit_ms);
                    let after = after.filter(|a| *a > lo).unwrap_or(lo);
                    let mut read = SlotRead::new(self, slot, after, to);
                    let page = read.next_page().await;
                    (read, page)
                }
            })
            .buffered(QUERY_AHEAD);
        futures::pin_mut!(first_pages);
        while let Some((mut read, mut page)) = first_pages.next().await {
            loop {
                let more = page.as_ref().is_ok_and(|p| p.last_key.is_some());
                if tx.send(page).await.is_err() {
                    return;
                }
                if !more {
                    break;
                }
                page = read.next_page().await;
            }
        }
    }

    /// Hands `each` the readable events of `slots` from `from`, in log
    /// order, each once (a copy of an event already handed out, by envelope
    /// id within the dedupe window, is skipped), with its JSON when it is
    /// JSON, until `each` says stop or the slots end. For readers that
    /// follow the log without a checkpoint of their own (`tail`, the local page).
    pub async fn each_event(
        &self,
        slots: Vec<SlotRef>,
        from: Checkpoint,
        recent: &mut RecentIds,
        mut each: impl FnMut(&EventItem, Option<serde_json::Value>, &[u8]) -> ControlFlow<()>,
    ) -> Result<()> {
        let (tx, rx) = mpsc::channel::<Result<Page>>(PAGES_AHEAD);
        let consume = async move {
            // Owned here: leaving early (stop, or an error) drops it, which stops the reader.
            let mut rx = rx;
            while let Some(page) = rx.recv().await {
                let mut opened = self.tiers.opened(page?.events);
                while let Some((event, readable)) = opened.next().await {
                    let bytes = match readable {
                        Ok(readable) => readable.bytes,
                        Err(err) if err.is_unreadable() => {
                            // Not handed out (no checkpoint to park it under), and not silently.
                            tracing::warn!(slot = event.slot, sort_key = event.sort_key, error = %err, "unreadable event skipped");
                            continue;
                        }
                        Err(err) => return Err(err),
                    };
                    let json: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
                    if recent.is_copy(json.as_ref(), event.arrival) {
                        continue;
                    }
                    if each(&event, json, &bytes).is_break() {
                        return Ok(());
                    }
                }
            }
            Ok(())
        };
        let ((), consumed) = tokio::join!(self.fetch_pages(slots, from, tx), consume);
        consumed
    }

    /// The envelope ids in `range` of `slots` (the part of the log before a
    /// run's position), in log order, and the `Query` requests it took.
    ///
    /// The slots are read `QUERY_AHEAD` at a time and taken in order: a
    /// runner that starts (a subscription's every minute) reads the whole
    /// dedupe window before it delivers, and one slot after another would
    /// add a round trip per second of the window to its first delivery.
    pub(crate) async fn recent_ids(&self, slots: &[SlotRef], range: &Lookback) -> Result<(RecentIds, usize)> {
        let ids_of_slot = |slot: SlotRef| async move {
            let mut read = SlotRead::new(self, slot, range.from_key.clone(), range.to_key.clone());
            let (mut ids, mut queries) = (Vec::new(), 0);
            loop {
                let page = read.next_page().await?;
                queries += page.queries;
                for event in &page.events {
                    let json = event.bytes().ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
                    if let Some(id) = json.as_ref().and_then(envelope_id) {
                        ids.push((id.to_owned(), event.arrival));
                    }
                }
                if page.last_key.is_none() {
                    return Ok::<_, Error>((ids, queries));
                }
            }
        };
        let mut slots = futures::stream::iter(slots.iter().copied()).map(ids_of_slot).buffered(QUERY_AHEAD);
        let mut recent = RecentIds::new(self.dedupe_window_ms);
        let mut queries = 0;
        while let Some(read) = slots.next().await {
            let (ids, slot_queries) = read?;
            queries += slot_queries;
            for (id, arrival) in ids {
                recent.first_sight(&id, arrival);
            }
        }
        Ok((recent, queries))
    }

    /// The event of `slot` with `sort_key`, if the table holds it.
    pub(crate) async fn event_at(&self, slot: SlotRef, sort_key: &str) -> Result<Option<EventItem>> {
        let mut read = SlotRead::new(self, slot, sort_key_floor(slot.slot), sort_key.to_owned());
        loop {
            let page = read.next_page().await?;
            if let Some(event) = page.events.into_iter().find(|e| e.sort_key == sort_key) {
                return Ok(Some(event));
            }
            if page.last_key.is_none() {
                return Ok(None);
            }
        }
    }

    /// One page of items under the hash key `storage` with sort keys in
    /// `[from, to]`, after `start`, keeping those whose last event is after `after`.
    async fn query(
        &self,
        storage: i64,
        (from, to): (&str, &str),
        after: Option<&str>,
        start: Option<HashMap<String, AttributeValue>>,
    ) -> Result<(Vec<HashMap<String, AttributeValue>>, Option<String>)> {
        let mut query = self
            .dynamo
            .query()
            .table_name(self.table)
            .consistent_read(true)
            .key_condition_expression("#slot = :slot AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#slot", event_item::HASH_KEY)
            .expression_attribute_names("#sk", event_item::RANGE_KEY)
            .expression_attribute_values(":slot", AttributeValue::N(storage.to_string()))
            .expression_attribute_values(":from", AttributeValue::S(from.to_owned()))
            .expression_attribute_values(":to", AttributeValue::S(to.to_owned()));
        if let Some(after) = after {
            // Items written before chunks have no `last`: they pass, and the merge drops those before `after`.
            query = query
                .filter_expression("attribute_not_exists(#last) OR #last > :after")
                .expression_attribute_names("#last", chunk::LAST)
                .expression_attribute_values(":after", AttributeValue::S(after.to_owned()));
        }
        let out = query
            .set_limit(self.page_items)
            .set_exclusive_start_key(start)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        let last_key =
            out.last_evaluated_key().and_then(|k| k.get(event_item::RANGE_KEY)).and_then(|v| v.as_s().ok()).cloned();
        Ok((out.items().to_vec(), last_key))
    }
}

/// One slot being read: a query cursor per hash key and the merge of their events.
struct SlotRead<'a> {
    reader: &'a Reader<'a>,
    slot: SlotRef,
    /// The hash keys queried (sub-keys, slices), one source of the merge each.
    storage: Vec<i64>,
    /// Events after this key are wanted (exclusive).
    after: String,
    /// ... up to this key (inclusive).
    to: String,
    merge: SlotMerge,
    /// Per hash key: where its next page starts (`None` before the first page).
    cursors: Vec<Option<String>>,
    started: bool,
    /// The last event handed out: where reading from S3 resumes.
    handed: Option<String>,
    /// When the last query not yet confirmed by a boundary read ended.
    unconfirmed: Option<Instant>,
    /// The slot is read from the archive.
    cold: bool,
}

impl<'a> SlotRead<'a> {
    fn new(reader: &'a Reader<'a>, slot: SlotRef, after: String, to: String) -> Self {
        let storage = slot.storage_keys(reader.keys);
        let sources = storage.len();
        Self {
            reader,
            slot,
            storage,
            merge: SlotMerge::new(sources, Some(after.clone()), to.clone()),
            after,
            to,
            cursors: vec![None; sources],
            started: false,
            handed: None,
            unconfirmed: None,
            cold: false,
        }
    }

    /// The next events of the slot, querying until some are final or the
    /// slot is read; from S3 once the slot is archived.
    async fn next_page(&mut self) -> Result<Page> {
        let (reader, slot) = (self.reader, self.slot.slot);
        if !self.cold && reader.tiers.archived(reader.dynamo, reader.table, slot).await? {
            self.cold = true;
        }
        let mut page = Page { slot, events: Vec::new(), unreadable: 0, last_key: None, queries: 0 };
        if self.cold {
            return self.cold_page(page).await;
        }
        if !self.started {
            self.started = true;
            let sources: Vec<usize> = (0..self.cursors.len()).collect();
            // A reader of every key of a slot cut into 1,024 slices: a bounded number of queries at once.
            let mut pages = Vec::with_capacity(sources.len());
            for group in sources.chunks(SOURCES_AT_ONCE) {
                pages.extend(futures::future::join_all(group.iter().map(|&source| self.query_source(source))).await);
            }
            self.unconfirmed = Some(Instant::now());
            for (source, result) in sources.into_iter().zip(pages) {
                self.add(source, result?, &mut page);
            }
        }
        loop {
            page.events.extend(self.merge.ready());
            let done = self.merge.is_done();
            if done || !page.events.is_empty() {
                break;
            }
            let Some(source) = self.merge.next_source() else { break };
            let result = self.query_source(source).await?;
            self.unconfirmed = Some(Instant::now());
            self.add(source, result, &mut page);
        }
        // What the queries saw is whole only if the archiver had not yet passed the slot.
        if let Some(ended) = self.unconfirmed.take() {
            if !reader.tiers.still_hot(reader.dynamo, reader.table, slot, ended).await? {
                self.cold = true;
                page.events.clear();
                page.unreadable = 0;
                return self.cold_page(page).await;
            }
        }
        if !self.merge.is_done() {
            page.last_key = Some(page.events.last().map(|e| e.sort_key.clone()).unwrap_or_default());
        }
        if let Some(last) = page.events.last() {
            self.handed = Some(last.sort_key.clone());
        }
        Ok(page)
    }

    /// The rest of the slot from its archive object, at once.
    async fn cold_page(&mut self, mut page: Page) -> Result<Page> {
        let reader = self.reader;
        let after = self.handed.as_deref().unwrap_or(&self.after).max(&self.after).to_owned();
        page.events =
            reader.tiers.events(reader.dynamo, reader.table, (self.slot, reader.keys), (&after, &self.to)).await?;
        page.last_key = None;
        if let Some(last) = page.events.last() {
            self.handed = Some(last.sort_key.clone());
        }
        Ok(page)
    }

    async fn query_source(&self, source: usize) -> Result<(Vec<HashMap<String, AttributeValue>>, Option<String>)> {
        let slot = self.slot.slot;
        let storage = self.storage[source];
        let from = sort_key_floor(slot);
        // A chunk whose first event is `to` itself sorts just after it: the bound takes it in.
        let to = format!("{}{}\u{10FFFF}", self.to, chunk::SEPARATOR);
        let after = (self.after > from).then_some(self.after.as_str());
        let start = self.cursors[source].clone().map(|key| event_key(storage, key));
        self.reader.query(storage, (&from, &to), after, start).await
    }

    fn add(
        &mut self,
        source: usize,
        (items, last_key): (Vec<HashMap<String, AttributeValue>>, Option<String>),
        page: &mut Page,
    ) {
        page.queries += 1;
        let mut events = Vec::new();
        for item in &items {
            let decoded = decode_item(self.slot.slot, item);
            match decoded.events {
                Ok(mut decoded) => events.append(&mut decoded),
                // In its place, so that a reader stops there (and after an upgrade reads it).
                Err(err) if err.is_newer() => {
                    warn!(slot = self.slot.slot, sort_key = decoded.sort_key, error = %err, "item of a newer version: a reader stops at it");
                    events.push(in_its_place(self.slot.slot, &decoded.sort_key, item, false));
                }
                Err(err) if decoded.sort_key.contains(chunk::SEPARATOR) => {
                    warn!(slot = self.slot.slot, sort_key = decoded.sort_key, error = %err, "chunk that cannot be read: handed on as one unreadable event");
                    events.push(in_its_place(self.slot.slot, &decoded.sort_key, item, true));
                }
                Err(err) => {
                    warn!(slot = self.slot.slot, error = %err, "event item skipped");
                    page.unreadable += 1;
                }
            }
        }
        self.merge.add(source, events, last_key.as_deref(), last_key.is_some());
        self.cursors[source] = last_key;
    }
}

/// An item that does not decode, as one event at its first key whose bytes
/// are an error: [unreadable](Error::is_unreadable) (readers park it or count
/// it, never skip it silently), or, for an item of a newer version, its own
/// encoding, which stops a reader there ([`Error::Newer`]).
fn in_its_place(slot: i64, sort_key: &str, item: &HashMap<String, AttributeValue>, unreadable: bool) -> EventItem {
    let first = chunk::first_key_of(sort_key).to_owned();
    let encoding = item.get("encoding").and_then(|v| v.as_s().ok()).cloned().unwrap_or_else(|| "none".into());
    let encoding = if unreadable { format!("{}{encoding}", crate::encoding::UNREADABLE) } else { encoding };
    EventItem {
        slot,
        arrival: first.get(..13).and_then(|ms| ms.parse().ok()).unwrap_or(slot),
        sort_key: first,
        event_id: format!("chunk {sort_key}"),
        partition_key: String::new(),
        data: item.get("data").and_then(|v| v.as_b().ok()).map(|b| b.as_ref().to_vec()).or(Some(Vec::new())),
        // `bytes()` says why the item cannot be read.
        encoding: Some(encoding),
        payload: None,
        expires_at: None,
        moved_at: None,
    }
}

fn event_key(slot: i64, sort_key: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (event_item::HASH_KEY.to_owned(), AttributeValue::N(slot.to_string())),
        (event_item::RANGE_KEY.to_owned(), AttributeValue::S(sort_key)),
    ])
}
