//! Reading entity streams: pages of events forward or backward, an entity's
//! state (its snapshot and the events after it), the streams' names; each
//! query asks for about the items it needs.

use super::model::{batch_key, Batch, Invalid, RecordedEvent, SnapshotItem, StreamItem, Tip, HASH_KEY, RANGE_KEY, TIP};
use super::retention::Cut;
use super::snapshot::Snapshot;
use super::{check_name, s, EntityError, EntityStore};
use crate::error::Error;
use crate::time::now_ms;

/// Which way a read goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Backward,
}

/// One page of a stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// The stream's version when it was read (its ETag).
    pub version: u64,
    pub deleted: bool,
    pub events: Vec<RecordedEvent>,
    /// Where the next page starts, when there is one.
    pub next: Option<u64>,
}

/// An entity, ready to fold: its latest snapshot and the events after it.
#[derive(Debug, Clone, PartialEq)]
pub struct State {
    pub version: u64,
    pub deleted: bool,
    pub snapshot: Option<Snapshot>,
    pub events: Vec<RecordedEvent>,
    /// DynamoDB requests the load took (1 when the snapshot is recent).
    pub requests: usize,
    /// The version of the stream's metadata (0: never set): with metadata, what
    /// a read shows can change while the stream's version does not.
    pub metadata_version: u64,
}

/// Items the first page of a state load asks for: the tip, the snapshot and
/// this many batches back is one request in the common case.
const STATE_FIRST_PAGE_ITEMS: i32 = 32;
/// The most items one page of a read asks DynamoDB for.
const MAX_QUERY_ITEMS: usize = 1000;
/// The most data one read puts back from S3 (beyond its first event): an
/// answer must fit Lambda's 6 MB response, and the function's memory.
pub const READ_PAYLOAD_BYTES: usize = 4 << 20;

impl EntityStore {
    /// Reads up to `limit` events from `from` (default: the start forward, the
    /// end backward), of those the stream's metadata still shows.
    pub async fn read(
        &self,
        stream: &str,
        from: Option<u64>,
        limit: usize,
        direction: Direction,
    ) -> Result<Page, EntityError> {
        let mut page = self.read_page(stream, from, limit, direction, true).await?;
        // Data put back from S3 fits one answer: the page ends before the event that would pass it.
        let mut from_s3 = 0;
        let fits = page.events.iter().position(|e| {
            from_s3 += e.data_ref.as_ref().map_or(0, |r| r.bytes);
            from_s3 > READ_PAYLOAD_BYTES
        });
        if let Some(cut) = fits.map(|i| i.max(1)).filter(|&cut| cut < page.events.len()) {
            page.events.truncate(cut);
            let last = page.events[cut - 1].version;
            page.next = match direction {
                Direction::Forward => Some(last + 1),
                Direction::Backward => last.checked_sub(1),
            };
        }
        self.resolve(&mut page.events).await?;
        Ok(page)
    }

    /// [`read`](Self::read), offloaded data left as its reference (`data_ref`),
    /// and every event the table holds, whatever the stream's metadata hides:
    /// what the relay puts in the log.
    pub(crate) async fn read_with_refs(
        &self,
        stream: &str,
        from: Option<u64>,
        limit: usize,
        direction: Direction,
    ) -> Result<Page, EntityError> {
        self.read_page(stream, from, limit, direction, false).await
    }

    async fn read_page(
        &self,
        stream: &str,
        from: Option<u64>,
        limit: usize,
        direction: Direction,
        honour_metadata: bool,
    ) -> Result<Page, EntityError> {
        check_name(stream)?;
        let limit = limit.clamp(1, MAX_QUERY_ITEMS);
        let tip = self.tip(stream).await?.ok_or(EntityError::NotFound)?;
        let cut = if honour_metadata { tip.cut(now_ms()) } else { Cut::NONE };
        // Nothing below where the cleanup got to is in the table any more: no query starts there.
        let gone = tip.trimmed.unwrap_or(0);
        let (events, ended) = match direction {
            Direction::Forward => {
                let from = from.unwrap_or(0).max(cut.from).max(gone);
                (self.read_forward(stream, from, tip.version, limit, cut).await?, false)
            }
            Direction::Backward => {
                self.read_backward(stream, from.unwrap_or(tip.version).min(tip.version), limit, cut).await?
            }
        };
        let next = match (direction, events.last()) {
            (Direction::Forward, Some(e)) if e.version < tip.version => Some(e.version + 1),
            (Direction::Backward, Some(e)) if e.version > cut.from.max(gone) && !ended => Some(e.version - 1),
            _ => None,
        };
        Ok(Page { version: tip.version, deleted: tip.deleted, events, next })
    }

    async fn read_forward(
        &self,
        stream: &str,
        from: u64,
        to: u64,
        limit: usize,
        cut: Cut,
    ) -> Result<Vec<RecordedEvent>, Error> {
        if from > to {
            return Ok(vec![]);
        }
        let mut events = Vec::new();
        // The batch that holds `from` may start before it: when no batch starts at `from`, look one back.
        let (mut batches, _) = self.query_batches(stream, (from, to), true, limit, cut).await?;
        if from > 0 && batches.first().is_none_or(|b| b.first != from) {
            if let Some(before) = self.query_batches(stream, (0, from - 1), false, 1, cut).await?.0.pop() {
                batches.insert(0, before);
            }
        }
        for batch in &batches {
            events.extend(batch.read().filter(|e| e.version >= from && e.version <= to));
            if events.len() >= limit {
                break;
            }
        }
        events.truncate(limit);
        Ok(events)
    }

    /// Events from `from` down, and whether they end at the first batch past the stream's `max_age`.
    async fn read_backward(
        &self,
        stream: &str,
        from: u64,
        limit: usize,
        cut: Cut,
    ) -> Result<(Vec<RecordedEvent>, bool), Error> {
        let mut events = Vec::new();
        if from < cut.from {
            return Ok((events, true));
        }
        let (batches, ended) = self.query_batches(stream, (0, from), false, limit, cut).await?;
        let mut batches = batches.into_iter();
        for batch in batches.by_ref() {
            let mut in_batch: Vec<RecordedEvent> =
                batch.read().filter(|e| e.version <= from && e.version >= cut.from).collect();
            in_batch.reverse();
            events.extend(in_batch);
            if events.len() >= limit {
                break;
            }
        }
        // Ended: nothing shown before what this page holds (every batch read taken, none cut).
        let ended = ended && batches.next().is_none() && events.len() <= limit;
        events.truncate(limit);
        Ok((events, ended))
    }

    /// Batches starting within `range` (inclusive), in order, until they hold
    /// at least `events` events. Those past `cut`'s age are a prefix of the
    /// stream (by append time): read forward, the ones before the first batch
    /// shown are skipped, in pages of the most items a page asks for; read
    /// backward, the first one ends the read (true: nothing shown before the
    /// batches answered, also when the range ran out).
    async fn query_batches(
        &self,
        stream: &str,
        range: (u64, u64),
        forward: bool,
        events: usize,
        cut: Cut,
    ) -> Result<(Vec<Batch>, bool), Error> {
        let mut batches: Vec<Batch> = Vec::new();
        let mut held = 0;
        let mut start = None;
        let mut skipping = false;
        loop {
            let ask = if skipping {
                MAX_QUERY_ITEMS as i32
            } else {
                items_to_ask(events.saturating_sub(held), batches.len(), held)
            };
            let out = self
                .dynamo
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("#stream = :stream AND #item BETWEEN :low AND :high")
                .expression_attribute_names("#stream", HASH_KEY)
                .expression_attribute_names("#item", RANGE_KEY)
                .expression_attribute_values(":stream", s(stream))
                .expression_attribute_values(":low", s(batch_key(range.0)))
                .expression_attribute_values(":high", s(batch_key(range.1)))
                .scan_index_forward(forward)
                .limit(ask)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| Error::dynamo("Query", e))?;
            for item in out.items().iter().cloned() {
                if let StreamItem::Batch(batch) = StreamItem::decode(item)? {
                    if cut.expired(batch.at) && batches.is_empty() && forward {
                        skipping = true;
                        continue;
                    }
                    if cut.expired(batch.at) && !forward {
                        return Ok((batches, true));
                    }
                    skipping = false;
                    held += batch.events.len();
                    // Read backward, the batch holding the cut's first version is the last one shown.
                    let last_shown = !forward && cut.from > 0 && batch.first <= cut.from;
                    batches.push(batch);
                    if last_shown {
                        return Ok((batches, true));
                    }
                }
            }
            start = out.last_evaluated_key().cloned();
            if start.is_none() || held >= events {
                // Read backward, a query that ran out reached the oldest batch stored: nothing before.
                return Ok((batches, !forward && start.is_none()));
            }
        }
    }

    /// The entity's latest snapshot and the events after it that its metadata
    /// still shows: one request when the snapshot is among the latest batches.
    /// A snapshot older than the cut stays usable: the events after it start
    /// where the cut does.
    pub async fn state(&self, stream: &str) -> Result<State, EntityError> {
        check_name(stream)?;
        let (mut tip, mut snapshot, mut batches) = (None::<Tip>, None::<SnapshotItem>, Vec::<Batch>::new());
        let mut start = None;
        let mut requests = 0;
        let now = now_ms();
        loop {
            let out = self
                .dynamo
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                // From the first batch key up: the bookkeeping items (`_…`) sort below it.
                .key_condition_expression("#stream = :stream AND #item >= :batches")
                .expression_attribute_names("#stream", HASH_KEY)
                .expression_attribute_names("#item", RANGE_KEY)
                .expression_attribute_values(":stream", s(stream))
                .expression_attribute_values(":batches", s(batch_key(0)))
                .scan_index_forward(false)
                .set_limit((requests == 0).then_some(STATE_FIRST_PAGE_ITEMS))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| Error::dynamo("Query", e))?;
            requests += 1;
            for item in out.items().iter().cloned() {
                match StreamItem::decode(item)? {
                    StreamItem::Tip(t) => tip = Some(t),
                    StreamItem::Snapshot(s) => snapshot = Some(s),
                    StreamItem::Batch(b) => batches.push(b),
                    StreamItem::Bookkeeping => {}
                }
            }
            let Some(cut) = tip.as_ref().map(|t| t.cut(now)) else { return Err(EntityError::NotFound) };
            // Done once the batch holding the first event shown after the snapshot is in.
            let needed_from = snapshot.as_ref().map_or(0, |s| s.version + 1).max(cut.from);
            start = out.last_evaluated_key().cloned();
            let reached = |b: &Batch| b.first <= needed_from || cut.expired(b.at);
            if start.is_none() || batches.last().is_some_and(reached) {
                break;
            }
        }
        let tip = tip.ok_or(EntityError::NotFound)?;
        let cut = tip.cut(now);
        let after = snapshot.as_ref().map(|s| s.version);
        // Newest first: the first batch past `max_age` ends what is shown, as a backward read ends.
        let shown: Vec<&Batch> = batches.iter().take_while(|b| !cut.expired(b.at)).collect();
        let mut events: Vec<RecordedEvent> = shown
            .into_iter()
            .rev()
            .flat_map(|b| b.read())
            .filter(|e| after.is_none_or(|v| e.version > v) && e.version >= cut.from && e.version <= tip.version)
            .collect();
        let from_s3: usize = events.iter().filter_map(|e| e.data_ref.as_ref()).map(|r| r.bytes).sum();
        if from_s3 > READ_PAYLOAD_BYTES {
            return Err(Invalid::TooLarge(format!(
                "the events after the snapshot hold {from_s3} bytes of data; read them in pages, or store a snapshot"
            ))
            .into());
        }
        self.resolve(&mut events).await?;
        let snapshot = match snapshot {
            Some(item) => Some(self.open_snapshot(item).await?),
            None => None,
        };
        let metadata_version = tip.meta_version.unwrap_or(0);
        Ok(State { version: tip.version, deleted: tip.deleted, snapshot, events, requests, metadata_version })
    }

    /// The names of the streams that start with `prefix`, in no particular
    /// order: a `Scan` of the whole table that keeps only tips, so for rare
    /// jobs (rebuilding a read model), not for serving requests.
    pub(crate) async fn stream_names(&self, prefix: &str) -> Result<Vec<String>, EntityError> {
        let mut names = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .dynamo
                .scan()
                .table_name(&self.table)
                .filter_expression("#item = :tip AND begins_with(#stream, :prefix)")
                .projection_expression("#stream")
                .expression_attribute_names("#item", RANGE_KEY)
                .expression_attribute_names("#stream", HASH_KEY)
                .expression_attribute_values(":tip", s(TIP))
                .expression_attribute_values(":prefix", s(prefix))
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| Error::dynamo("Scan", e))?;
            names.extend(out.items().iter().filter_map(|item| item.get(HASH_KEY)?.as_s().ok().cloned()));
            start = out.last_evaluated_key().cloned();
            if start.is_none() {
                return Ok(names);
            }
        }
    }
}

/// How many items to ask for to get `wanted` more events, after `seen` items
/// held `held` events: a query is billed for every item it reads, so ask for
/// about what is needed (a batch holds 1 to 100 events), never 1 MB by default.
fn items_to_ask(wanted: usize, seen: usize, held: usize) -> i32 {
    let per_item = if seen == 0 { 1.0 } else { (held as f64 / seen as f64).max(1.0) };
    let first_guess =
        if seen == 0 { wanted.min(FIRST_QUERY_ITEMS) } else { (wanted as f64 / per_item).ceil() as usize + 1 };
    first_guess.clamp(1, MAX_QUERY_ITEMS) as i32
}

/// The first page of a read asks for at most this many items, before it knows how large the batches are.
const FIRST_QUERY_ITEMS: usize = 25;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ask_for_about_the_items_they_need() {
        assert_eq!(items_to_ask(1, 0, 0), 1);
        assert_eq!(items_to_ask(1000, 0, 0), 25, "unknown batch sizes: a small first page");
        assert_eq!(items_to_ask(975, 25, 2500), 11, "100-event batches: ~10 more items");
        assert_eq!(items_to_ask(975, 25, 25), 976, "1-event batches: one item per event");
        assert_eq!(items_to_ask(5000, 25, 25), MAX_QUERY_ITEMS as i32);
    }
}
