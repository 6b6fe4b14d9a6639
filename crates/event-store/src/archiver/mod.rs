//! The archiver: complete slots older than the hot retention move from the
//! event table to S3 ([`crate::archive`]), one object at a time, oldest
//! first, each within one hour of slots (laid
//! out `date=…/hour=…` for Athena) and cut at [`ArchiveConfig::object_bytes`]:
//! 1. read the range's events from the event table, in log order;
//! 2. put the Parquet object, read it back and check it (SHA-256, count,
//!    first and last sort key) against what was read;
//! 3. append its manifest entry (the next link of the hash chain), and
//!    anchor it in S3 ([`crate::archive::anchor`]);
//! 4. write its pointer, and move the boundary past it: readers now read
//!    those slots from S3;
//! 5. delete the slots' items that hold only archived events, and record that.
//!
//! A crash at any step repeats it: the object's key and bytes are the same
//! for the same events, a stored entry equal to the one being appended
//! counts as appended, the boundary only moves forward, and a run first
//! finishes the last entry's pointer, boundary and deletes (the deletes
//! against the object read back from S3). Nothing leaves DynamoDB before
//! its copy is verified, and an item written into a slot after the slot
//! was read (a late event) is not deleted with it. One run at a time: a
//! run holds the archive's lease, and a second one finds it taken and stops.
//!
//! Late events in archived slots stay in the event table, and readers merge
//! them in ([`crate::log::tiers`]). An item whose bytes do not decode
//! (damaged) is not archived: it moves to the quarantine partition with the
//! reason, as the pump's and the scan's do, is counted (`QuarantinedItems`,
//! alarmed; `status`), and the archiver goes on. An item of a newer version
//! is no damage: the run stops there with [`Error::Newer`] until upgraded.

use std::collections::HashSet;
use std::time::{Instant, SystemTime};

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::archive::columns::{self, Row};
use crate::archive::manifest::Entry;
use crate::archive::object::Bucket;
use crate::archive::{anchor, object_key, store, HOUR_MS};
use crate::batch::Backoff;
use crate::bookkeeping::slot_index::{first_slot, read_index, SlotRef};
use crate::bookkeeping::{settings, watermark};
use crate::chunk::decode_item;
use crate::config::ArchiveConfig;
use crate::dynamo::{query_partition, write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::{quarantine_item, HASH_KEY, RANGE_KEY};
use crate::invoke::{continue_with, Invoker};
use crate::log::reader::{Page, Reader, PAGES_AHEAD};
use crate::log::tiers::Tiers;
use crate::log::Window;
use crate::position::Checkpoint;
use crate::time::{effective_deadline, now_ms, remaining, slot_of};

mod once;
use once::off_the_runtime;

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ArchiveSummary {
    pub objects: u64,
    pub events: u64,
    pub bytes: u64,
    /// Slots before this are in S3.
    pub boundary: i64,
    /// Out of time with slots left to archive (or deletes left to finish).
    pub more: bool,
    /// Items of archived slots kept because they hold events the object does
    /// not: late events, written after their slot was read.
    pub kept: u64,
    /// Another run holds the lease: this one did nothing.
    pub busy: bool,
    /// Damaged items moved to the quarantine partition instead of the archive.
    pub quarantined: u64,
}

/// The AWS actions the archive function calls (its role grants exactly these; `tests/template.rs`).
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:Query",
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:BatchWriteItem",
    "s3:PutObject",
    "s3:GetObject",
    "s3:ListBucket",
    "lambda:InvokeFunction",
];

/// What the function is invoked with: the schedule's event, or its own continuation.
#[derive(Debug, Default, Deserialize)]
struct Request {
    #[serde(default)]
    continuation: u32,
}

pub struct Archiver {
    pub dynamo: aws_sdk_dynamodb::Client,
    pub bucket: Bucket,
    pub config: ArchiveConfig,
}

impl Archiver {
    /// One invocation: archives until done or near `deadline`, and hands
    /// what is left to a continuation (bounded by `MAX_CONTINUATIONS`; the
    /// next scheduled run goes on after that).
    pub async fn handle(&self, payload: Value, deadline: SystemTime, invoker: &dyn Invoker) -> Result<ArchiveSummary> {
        let request: Request = serde_json::from_value(payload).unwrap_or_default();
        let deadline = effective_deadline(deadline, SystemTime::now());
        let summary = self.run(now_ms(), Instant::now() + remaining(deadline)).await?;
        info!(
            objects = summary.objects,
            events = summary.events,
            boundary = summary.boundary,
            more = summary.more,
            kept = summary.kept,
            busy = summary.busy,
            quarantined = summary.quarantined,
            "archive run"
        );
        if summary.more && request.continuation < self.config.max_continuations {
            continue_with(invoker, &json!({"continuation": request.continuation + 1})).await?;
        }
        Ok(summary)
    }

    /// Archives what is due at `now`, object by object, until done or near
    /// `deadline`, under the archive's lease (taken and released here).
    pub async fn run(&self, now: i64, deadline: Instant) -> Result<ArchiveSummary> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        // The lease runs on the wall clock, whatever `now` the run archives up to.
        let wall = now_ms();
        let owner = format!("archiver-{wall}-{}", std::process::id());
        let until = wall.saturating_add(i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX));
        if !store::take_lease(dynamo, table, &owner, wall, until).await? {
            info!("another archiver holds the lease: nothing done");
            return Ok(ArchiveSummary { busy: true, ..ArchiveSummary::default() });
        }
        let result = match store::adopt(dynamo, table, wall).await {
            Ok(None) => self.archive_due(now, deadline).await,
            Ok(Some(until)) => {
                info!(until, "the previous version's archiver holds its lease: its items move once it lets go");
                Ok(ArchiveSummary { busy: true, ..ArchiveSummary::default() })
            }
            Err(err) => Err(err),
        };
        if let Err(err) = store::release_lease(dynamo, table, &owner).await {
            // It expires on its own.
            tracing::warn!(error = %err, "archive lease not released");
        }
        result
    }

    async fn archive_due(&self, now: i64, deadline: Instant) -> Result<ArchiveSummary> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let unit = settings::time_unit(dynamo, table).await?.unwrap_or(crate::config::DEFAULT_TIME_UNIT_MS);
        let mut summary = ArchiveSummary::default();
        // Readers follow anchored entries only: entries from before anchors get theirs, once.
        let anchored = anchor::backfill(dynamo, table, &self.bucket).await?;
        if anchored > 0 {
            info!(anchored, "entries appended before anchors are anchored now");
        }
        let Some(complete_end) = watermark::read(dynamo, table).await?.complete_end(unit) else {
            return Ok(summary);
        };
        let retention = i64::try_from(self.config.hot_retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = slot_of(complete_end.min(now.saturating_sub(retention)), unit);
        let mut head = store::head(dynamo, table).await?;
        loop {
            let boundary = store::boundary(dynamo, table).await?;
            summary.boundary = boundary.archived_to;
            // A run that stopped after an entry: its pointer, the boundary, then its deletes.
            if let Some(last) = head.as_ref() {
                if last.end > boundary.archived_to {
                    anchor::put(&self.bucket, last).await?;
                    store::put_object_pointer(dynamo, table, last).await?;
                    store::advance_boundary(dynamo, table, last.end).await?;
                    continue;
                }
                if last.end > boundary.cleared_to {
                    // What decides the deletes is the object as its entry describes it, checked again.
                    let bytes = self.bucket.get(&last.key).await?;
                    let object = off_the_runtime({
                        let bytes = bytes.clone();
                        move || columns::open(bytes)
                    })
                    .await?;
                    let rows = &object.rows;
                    if !last.matches(&object.facts(&bytes)) {
                        return Err(Error::Archive(format!(
                            "{} is not the object entry {} describes: nothing deleted (event-store verify)",
                            last.key, last.seq
                        )));
                    }
                    if !self.clear(last, rows, &mut summary, deadline).await? {
                        summary.more = true;
                        break;
                    }
                    continue;
                }
            }
            let Some(first) = first_slot(dynamo, table, summary.boundary, cutoff).await? else { break };
            if Instant::now() + self.config.deadline_margin >= deadline {
                summary.more = true;
                break;
            }
            // An object holds the slots of one hour (a slot across the hour's end with them):
            // its key's hour is its events', and it ends on a slot boundary whatever TIME_UNIT is.
            let hour = first.slot.div_euclid(HOUR_MS) * HOUR_MS;
            let start = summary.boundary.max(slot_of(hour, unit));
            let end = (slot_of(hour + HOUR_MS - 1, unit) + unit as i64).min(cutoff);
            let (entry, rows) = self.archive_range(start, end, head.as_ref(), unit).await?;
            summary.objects += 1;
            summary.events += entry.count;
            summary.bytes += entry.bytes;
            summary.boundary = entry.end;
            info!(key = entry.key, seq = entry.seq, count = entry.count, bytes = entry.bytes, "archived");
            let cleared = self.clear(&entry, &rows, &mut summary, deadline).await?;
            head = Some(entry);
            if !cleared {
                summary.more = true;
                break;
            }
        }
        Ok(summary)
    }

    /// Steps 1 to 4 for the slots from `start` up to at most `end`.
    async fn archive_range(&self, start: i64, end: i64, head: Option<&Entry>, unit: u64) -> Result<(Entry, Vec<Row>)> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let key = object_key(&self.config.prefix, start);
        // A repeat after a crash may find its first attempt's object: it reads at least up to that
        // one's last slot (late events since could have moved the size cut before it), so the two compare.
        let earlier = match self.bucket.get_if_there(&key).await? {
            Some(bytes) => off_the_runtime(move || Ok(columns::read(bytes).ok())).await?,
            None => None,
        };
        let cut_from =
            earlier.as_ref().and_then(|rows| rows.last()).map_or(start, |last| slot_of(last.slot, unit) + unit as i64);
        let (slots, _) = read_index(dynamo, table, start, end).await?;
        // Cut as its slots were (the most slices any was cut into), so readers of some keys read theirs.
        let most = slots.iter().map(SlotRef::most_slices).max().unwrap_or(1);
        let (rows, end) = self.read_rows(slots, (start, end), unit, cut_from).await?;
        let slices = crate::archive::cut::slices_for(most, rows.len(), self.config.min_slice_rows);
        let (facts, rows) = self.put_once(&key, rows, slices).await?;
        let entry = Entry::next(head, key, start, end, &facts);
        if !store::append(dynamo, table, &entry).await? {
            return Err(Error::Archive(format!("archive manifest entry {} is taken: another archiver ran", entry.seq)));
        }
        anchor::put(&self.bucket, &entry).await?;
        store::put_object_pointer(dynamo, table, &entry).await?;
        store::advance_boundary(dynamo, table, end).await?;
        Ok((entry, rows))
    }

    /// Step 5 for `entry`, whose object holds `rows`: false when the
    /// deadline came first (the next run goes on).
    async fn clear(
        &self,
        entry: &Entry,
        rows: &[Row],
        summary: &mut ArchiveSummary,
        deadline: Instant,
    ) -> Result<bool> {
        let archived: HashSet<&str> = rows.iter().map(|r| r.sort_key.as_str()).collect();
        let Some((kept, quarantined)) = self.delete_archived(entry.start, entry.end, &archived, deadline).await? else {
            return Ok(false);
        };
        if kept > 0 {
            warn!(kept, start = entry.start, end = entry.end, "items of late events kept in archived slots");
        }
        summary.kept += kept;
        summary.quarantined += quarantined;
        store::mark_cleared(&self.dynamo, &self.config.event_table, entry.end).await?;
        Ok(true)
    }

    /// The events of `slots` in `[start, end)`, in log order, as rows; cut
    /// at the first slot past the object size, but not before `cut_from`.
    /// Returns them and where they end.
    async fn read_rows(
        &self,
        slots: Vec<SlotRef>,
        (start, end): (i64, i64),
        unit: u64,
        cut_from: i64,
    ) -> Result<(Vec<Row>, i64)> {
        let window = Window { start, end };
        let reader = Reader {
            dynamo: &self.dynamo,
            table: &self.config.event_table,
            time_unit_ms: unit,
            page_items: None,
            dedupe_window_ms: self.config.dedupe_window_ms,
            window: &window,
            keys: crate::slices::KeyRange::ALL,
            // Its own range is past the boundary: the event table.
            tiers: &Tiers::new(None),
        };
        let (tx, rx) = mpsc::channel::<Result<Page>>(PAGES_AHEAD);
        let collect = async {
            // Owned here: leaving early (the cut, an error) drops it, which stops the reader.
            let mut rx = rx;
            let (mut rows, mut bytes, mut cut) = (Vec::new(), 0usize, end);
            while let Some(page) = rx.recv().await {
                // Damaged items are not archived: the clear step quarantines them.
                let page = page?;
                let past_size = bytes >= self.config.object_bytes && page.slot >= cut_from;
                if past_size && rows.last().is_some_and(|r: &Row| r.slot < page.slot) {
                    cut = page.slot;
                    break;
                }
                for event in &page.events {
                    let row = match Row::of(event) {
                        Ok(row) => row,
                        Err(err) if err.is_unreadable() => continue,
                        Err(err) => return Err(err),
                    };
                    bytes +=
                        row.payload.as_ref().map_or(0, String::len) + row.payload_bytes.as_ref().map_or(0, Vec::len);
                    rows.push(row);
                }
            }
            Ok::<_, Error>((rows, cut))
        };
        let ((), read) = tokio::join!(reader.fetch_pages(slots, Checkpoint::at_slot(start), tx), collect);
        read
    }

    /// Deletes the items of the slots in `[start, end)` (each sub-key) whose
    /// events are all `archived`, and the damaged ones once their quarantine
    /// copy is written; returns how many items it kept and how many it
    /// quarantined, or `None` when the deadline came first.
    async fn delete_archived(
        &self,
        start: i64,
        end: i64,
        archived: &HashSet<&str>,
        deadline: Instant,
    ) -> Result<Option<(u64, u64)>> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let (slots, _) = read_index(dynamo, table, start, end).await?;
        let (mut requests, mut kept, mut quarantined) = (Vec::new(), 0, 0);
        let events = Table { name: table, key: &[HASH_KEY, RANGE_KEY] };
        // Flushed as they gather, so that a run stopped by its deadline keeps what it deleted.
        // False when the deadline stopped the retries; deletes still failing with time left are
        // an error (the errors alarm), not "more" for a continuation that would fail the same way.
        let margin = self.config.deadline_margin;
        let flush = |requests: Vec<((), WriteRequest)>| async move {
            let left = write_all(dynamo, events, requests, &Backoff::default(), Some(deadline)).await.len();
            match left {
                0 => Ok(true),
                _ if Instant::now() + margin >= deadline => Ok(false),
                _ => Err(Error::Archive(format!("{left} deletes of archived items still failing after retries"))),
            }
        };
        for slot in slots {
            if Instant::now() + self.config.deadline_margin / 2 >= deadline {
                flush(std::mem::take(&mut requests)).await?;
                return Ok(None);
            }
            for key in slot.all_storage_keys() {
                let storage = (HASH_KEY, AttributeValue::N(key.to_string()));
                for item in query_partition(dynamo, table, storage).await? {
                    // An item whose events' bytes do not decode is as damaged as one that does not decode.
                    let events = decode_item(slot.slot, &item).events.and_then(|events| {
                        match events.iter().map(crate::event_item::EventItem::bytes).find_map(Result::err) {
                            Some(err) => Err(err),
                            None => Ok(events),
                        }
                    });
                    match &events {
                        Ok(events) if events.iter().all(|e| archived.contains(e.sort_key.as_str())) => {}
                        Err(err) if err.is_unreadable() => {
                            if !Box::pin(self.quarantine(&item, err, deadline)).await? {
                                kept += 1;
                                continue;
                            }
                            quarantined += 1;
                        }
                        _ => {
                            kept += 1;
                            continue;
                        }
                    }
                    let key = item.into_iter().filter(|(name, _)| name == HASH_KEY || name == RANGE_KEY).collect();
                    let delete =
                        DeleteRequest::builder().set_key(Some(key)).build().map_err(|e| Error::encode("delete", e))?;
                    requests.push(((), WriteRequest::builder().delete_request(delete).build()));
                }
            }
            if requests.len() >= 4 * 25 && !flush(std::mem::take(&mut requests)).await? {
                // Throttled until the deadline: the next run repeats the rest.
                return Ok(None);
            }
        }
        if !flush(requests).await? {
            return Ok(None);
        }
        Ok(Some((kept, quarantined)))
    }

    /// Copies a damaged item of the event table, with `why`, into the
    /// quarantine partition (its key: `event#<storage slot>#<sort key>`); true
    /// once the copy is durable, false when even the copy does not fit an
    /// item (the item then stays in the table, logged).
    async fn quarantine(
        &self,
        item: &std::collections::HashMap<String, AttributeValue>,
        why: &Error,
        deadline: Instant,
    ) -> Result<bool> {
        let text =
            |name: &str| item.get(name).and_then(|v| v.as_s().ok().or(v.as_n().ok())).cloned().unwrap_or_default();
        let id = format!("event#{}#{}", text(HASH_KEY), text(RANGE_KEY));
        let Some(copy) = quarantine_item(&id, &why.to_string(), item.clone(), now_ms()) else {
            error!(id, reason = %why, "damaged item too large to quarantine: left in the table");
            return Ok(false);
        };
        let put = PutRequest::builder().set_item(Some(copy)).build().map_err(|e| Error::encode("quarantine", e))?;
        let events = Table { name: &self.config.event_table, key: &[HASH_KEY, RANGE_KEY] };
        let request = vec![((), WriteRequest::builder().put_request(put).build())];
        if !write_all(&self.dynamo, events, request, &Backoff::default(), Some(deadline)).await.is_empty() {
            return Err(Error::Archive(format!("{id}: its quarantine copy could not be written")));
        }
        warn!(id, reason = %why, "damaged item quarantined instead of archived");
        // Counted as it happens: a run that fails later still has it alarmed.
        println!("{}", crate::metrics::quarantined_line(&self.config.metrics_namespace, 1, now_ms()));
        Ok(true)
    }
}
