//! The archiver: every complete hour is copied from the event table to S3
//! ([`crate::archive`]) as soon as it is complete, so SQL (Athena, DuckDB)
//! sees all but the current hour; its slots move out of the table only once
//! older than the hot retention. One object at a time, oldest first, each
//! within one hour of slots (laid out `date=…/hour=…` for Athena) and cut at
//! [`ArchiveConfig::object_bytes`]:
//! 1. read the range's events from the event table, in log order;
//! 2. put the Parquet object, read it back and check it (SHA-256, count,
//!    first and last sort key) against what was read;
//! 3. append its manifest entry (the next link of the hash chain), anchor it
//!    in S3 ([`crate::archive::anchor`]) and write its pointer: copied.
//!
//! Then, once its slots are older than the hot retention ([`clear`]):
//! 4. survey its slots' items, mark the slots of those holding events the
//!    object does not (late ones) late, and move the boundary past it: readers
//!    now read those slots from S3 (until then they read the table);
//! 5. delete the items that hold only archived events, and record that.
//!
//! A crash at any step repeats it: the object's key and bytes are the same
//! for the same events, a stored entry equal to the one being appended
//! counts as appended, the boundary only moves forward, and a run first
//! finishes the last entry's anchor and pointer, then copies, then moves,
//! first finishing a move's deletes (against the object read back from S3):
//! a move that fails holds no copy up. Nothing leaves DynamoDB before
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

use std::time::{Instant, SystemTime};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tracing::info;

use crate::archive::columns::{self, Row};
use crate::archive::manifest::Entry;
use crate::archive::object::Bucket;
use crate::archive::{anchor, object_key, store, HOUR_MS};
use crate::bookkeeping::slot_index::{first_slot, read_index, SlotRef};
use crate::bookkeeping::{settings, watermark};
use crate::config::ArchiveConfig;
use crate::error::{Error, Result};
use crate::invoke::{continue_with, Invoker};
use crate::log::reader::{Page, Reader, PAGES_AHEAD};
use crate::log::tiers::Tiers;
use crate::log::Window;
use crate::position::Checkpoint;
use crate::time::{effective_deadline, now_ms, remaining, slot_of};

mod clear;
mod once;
use once::off_the_runtime;

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ArchiveSummary {
    pub objects: u64,
    pub events: u64,
    pub bytes: u64,
    /// Slots before this are read from S3, and gone from the table.
    pub boundary: i64,
    /// Slots before this are copied to S3 (for SQL): every complete hour.
    pub copied_to: i64,
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
        // Moved out of the table: complete slots older than the hot retention.
        let move_to = slot_of(complete_end.min(now.saturating_sub(retention)), unit);
        // Copied: those, and every complete hour as soon as it is complete.
        let copy_to = move_to.max(slot_of(complete_end.div_euclid(HOUR_MS) * HOUR_MS, unit));
        let mut head = store::head(dynamo, table).await?;
        let boundary = store::boundary(dynamo, table).await?;
        summary.boundary = boundary.archived_to;
        // A run that stopped right after appending an entry: its anchor, then its pointer.
        if let Some(last) = head.as_ref().filter(|last| last.end > boundary.archived_to) {
            if store::object_at(dynamo, table, last.start).await?.is_none_or(|p| p.seq != last.seq) {
                anchor::put(&self.bucket, last).await?;
                store::put_object_pointer(dynamo, table, last).await?;
            }
        }
        // Copying first: SQL waits for no move (a move that fails, a backlog of them).
        loop {
            let from = head.as_ref().map_or(0, |h| h.end).max(summary.boundary);
            summary.copied_to = from;
            let Some(first) = first_slot(dynamo, table, from, copy_to).await? else { break };
            if Instant::now() + self.config.deadline_margin >= deadline {
                summary.more = true;
                return Ok(summary);
            }
            // An object that starts before the move's cut ends there at the latest, so it moves whole.
            let until = if first.slot < move_to { move_to } else { copy_to };
            // An object holds the slots of one hour (a slot across the hour's end with them):
            // its key's hour is its events', and it ends on a slot boundary whatever TIME_UNIT is.
            let hour = first.slot.div_euclid(HOUR_MS) * HOUR_MS;
            let start = from.max(slot_of(hour, unit));
            let end = (slot_of(hour + HOUR_MS - 1, unit) + unit as i64).min(until);
            let entry = self.copy_range((start, end, copy_to), head.as_ref(), unit).await?;
            summary.objects += 1;
            summary.events += entry.count;
            summary.bytes += entry.bytes;
            summary.copied_to = entry.end;
            info!(key = entry.key, seq = entry.seq, count = entry.count, bytes = entry.bytes, "copied");
            head = Some(entry);
        }
        if !self.move_copied(move_to, &mut summary, deadline).await? {
            summary.more = true;
        }
        Ok(summary)
    }

    /// Moves out of the table, in manifest order, the copied entries whose
    /// slots end by `move_to`, after finishing one whose move stopped before
    /// its deletes; false when the deadline came first.
    async fn move_copied(&self, move_to: i64, summary: &mut ArchiveSummary, deadline: Instant) -> Result<bool> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        loop {
            let boundary = store::boundary(dynamo, table).await?;
            summary.boundary = boundary.archived_to;
            // The last entry moved ends at the boundary; the next one to move is the manifest's next.
            let (before, after) = store::pointers_around(dynamo, table, boundary.archived_to - 1).await?;
            let last = before.filter(|p| p.end == boundary.archived_to);
            let unfinished = last.as_ref().filter(|p| p.end > boundary.cleared_to).map(|p| p.seq);
            let seq = unfinished.unwrap_or_else(|| last.as_ref().map_or(0, |p| p.seq + 1));
            let Some(entry) = store::entry(dynamo, table, seq).await? else { return Ok(true) };
            if unfinished.is_none() && entry.end > move_to {
                return Ok(true);
            }
            if unfinished.is_none() && entry.end <= boundary.archived_to {
                return Err(Error::Archive(format!(
                    "the boundary is past entry {seq} and no pointer ends there: nothing moved (event-store verify)"
                )));
            }
            if Instant::now() + self.config.deadline_margin >= deadline {
                return Ok(false);
            }
            // Readers look for its pointer once the boundary passes it: one lost is written again.
            if unfinished.is_none() && after.is_none_or(|p| p.seq != entry.seq) {
                anchor::put(&self.bucket, &entry).await?;
                store::put_object_pointer(dynamo, table, &entry).await?;
            }
            // What decides the deletes is the object as its entry describes it, checked again.
            let bytes = self.bucket.get(&entry.key).await?;
            let object = off_the_runtime({
                let bytes = bytes.clone();
                move || Ok(columns::open(bytes).ok())
            })
            .await?;
            let Some(object) = object.filter(|object| entry.matches(&object.facts(&bytes))) else {
                return Err(Error::Archive(format!(
                    "{} is not the object entry {} describes: nothing moved (event-store verify)",
                    entry.key, entry.seq
                )));
            };
            if !self.move_out(&entry, &object.rows, summary, deadline).await? {
                return Ok(false);
            }
        }
    }

    /// Steps 1 to 3 for the slots from `start` up to at most `end` (up to
    /// `limit` when a first attempt's object there reaches further).
    async fn copy_range(&self, (start, end, limit): (i64, i64, i64), head: Option<&Entry>, unit: u64) -> Result<Entry> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let key = object_key(&self.config.prefix, start);
        // A repeat after a crash may find its first attempt's object: it reads at least up to that
        // one's last slot (late events since could have moved the size cut before it; the move's cut
        // may have come before it since), so the two compare.
        let earlier = match self.bucket.get_if_there(&key).await? {
            Some(bytes) => off_the_runtime(move || Ok(columns::read(bytes).ok())).await?,
            None => None,
        };
        let cut_from =
            earlier.as_ref().and_then(|rows| rows.last()).map_or(start, |last| slot_of(last.slot, unit) + unit as i64);
        let end = end.max(cut_from.min(limit));
        let (slots, _) = read_index(dynamo, table, start, end).await?;
        // Cut as its slots were (the most slices any was cut into), so readers of some keys read theirs.
        let most = slots.iter().map(SlotRef::most_slices).max().unwrap_or(1);
        let (rows, end) = self.read_rows(slots, (start, end), unit, cut_from).await?;
        let slices = crate::archive::cut::slices_for(most, rows.len(), self.config.min_slice_rows);
        let facts = self.put_once(&key, rows, slices).await?;
        let entry = Entry::next(head, key, start, end, &facts);
        if !store::append(dynamo, table, &entry).await? {
            return Err(Error::Archive(format!("archive manifest entry {} is taken: another archiver ran", entry.seq)));
        }
        anchor::put(&self.bucket, &entry).await?;
        store::put_object_pointer(dynamo, table, &entry).await?;
        Ok(entry)
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
                for event in page.events.iter().filter(|e| !expires_while_hot(e, self.config.hot_retention)) {
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
}

/// Whether `event`'s retention (`RETENTION_DAYS`) ends before its slot would
/// leave the table: it goes with its TTL, never to S3 (hours are copied
/// within minutes, weeks before they move; a copy must not outlive the
/// retention the event was written with).
pub(super) fn expires_while_hot(event: &crate::event_item::EventItem, hot_retention: std::time::Duration) -> bool {
    let hot_ms = i64::try_from(hot_retention.as_millis()).unwrap_or(i64::MAX);
    event.expires_at.is_some_and(|at| at.saturating_mul(1000) < event.slot.saturating_add(hot_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_whose_retention_ends_while_it_is_hot_is_not_copied() {
        let day = std::time::Duration::from_secs(86_400);
        let event = |expires_at: Option<i64>| crate::event_item::EventItem {
            slot: 1_795_000_000_000,
            sort_key: crate::event_item::sort_key(1_795_000_000_000, "shardId-000000000000:1"),
            event_id: "shardId-000000000000:1".into(),
            arrival: 1_795_000_000_000,
            partition_key: "k".into(),
            data: Some(b"{}".to_vec()),
            encoding: None,
            payload: None,
            expires_at,
            moved_at: None,
        };
        assert!(!expires_while_hot(&event(None), 30 * day), "kept for good");
        assert!(expires_while_hot(&event(Some(1_795_000_000 + 7 * 86_400)), 30 * day), "7 days, hot for 30");
        assert!(!expires_while_hot(&event(Some(1_795_000_000 + 60 * 86_400)), 30 * day), "60 days, hot for 30");
        assert!(!expires_while_hot(&event(Some(1_795_000_000 + 1)), std::time::Duration::ZERO));
    }
}
