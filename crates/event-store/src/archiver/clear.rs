//! Moving a copied object's slots out of the event table, once they are
//! older than the hot retention: the items of its slots surveyed, the slots
//! of the items that hold events the object does not (late ones) marked late,
//! the boundary moved past it (readers read those slots from S3 now), then the
//! surveyed items deleted. An hour is copied within minutes of being sealed
//! and moved weeks later: a late event written in between is kept, and its
//! slot marked before readers stop reading the table, whether or not the
//! scan marked it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::Instant;

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, PutRequest, WriteRequest};
use tracing::{error, warn};

use super::{ArchiveSummary, Archiver};
use crate::archive::columns::Row;
use crate::archive::manifest::Entry;
use crate::archive::store;
use crate::batch::Backoff;
use crate::bookkeeping::late_slots;
use crate::bookkeeping::slot_index::read_index;
use crate::chunk::decode_item;
use crate::dynamo::{query_partition, write_all, Table};
use crate::error::{Error, Result};
use crate::event_item::{quarantine_item, HASH_KEY, RANGE_KEY};
use crate::time::now_ms;

type Item = HashMap<String, AttributeValue>;

/// What clearing an object's slots deletes and keeps.
#[derive(Default)]
struct Survey {
    /// Items whose events the object holds, by key.
    archived: Vec<Item>,
    /// Items that do not decode, whole (copied to the quarantine partition, then deleted).
    damaged: Vec<(Item, Error)>,
    /// Items kept: they hold events the object does not.
    kept: u64,
    /// Their slots.
    late: BTreeSet<i64>,
}

impl Archiver {
    /// Moves `entry`'s slots out of the event table ([module docs](self));
    /// its object holds `rows`. False when the deadline came first (the next
    /// run goes on: the boundary may have moved, and its deletes are left).
    pub(super) async fn move_out(
        &self,
        entry: &Entry,
        rows: &[Row],
        summary: &mut ArchiveSummary,
        deadline: Instant,
    ) -> Result<bool> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let archived: HashSet<&str> = rows.iter().map(|r| r.sort_key.as_str()).collect();
        let Some(survey) = self.survey(entry.start, entry.end, &archived, deadline).await? else {
            return Ok(false);
        };
        // Marked before readers stop reading the table: they read a marked slot from both tiers.
        late_slots::mark(dynamo, table, crate::bookkeeping::Family::Archive, &survey.late).await?;
        store::advance_boundary(dynamo, table, entry.end).await?;
        summary.boundary = summary.boundary.max(entry.end);
        if survey.kept > 0 {
            warn!(
                kept = survey.kept,
                start = entry.start,
                end = entry.end,
                "items of late events kept in archived slots"
            );
        }
        summary.kept += survey.kept;
        let Some(quarantined) = self.delete(survey, deadline).await? else { return Ok(false) };
        summary.quarantined += quarantined;
        store::mark_cleared(dynamo, table, entry.end).await?;
        Ok(true)
    }

    /// The items of the slots in `[start, end)` (each sub-key), sorted into
    /// those whose events are all `archived`, damaged ones, and the others;
    /// `None` when the deadline came first.
    async fn survey(
        &self,
        start: i64,
        end: i64,
        archived: &HashSet<&str>,
        deadline: Instant,
    ) -> Result<Option<Survey>> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let (slots, _) = read_index(dynamo, table, start, end).await?;
        let mut survey = Survey::default();
        // Not copied: their TTL has passed by now, and they go as it would take them.
        let gone = |event: &crate::event_item::EventItem| super::expires_while_hot(event, self.config.hot_retention);
        for slot in slots {
            if Instant::now() + self.config.deadline_margin / 2 >= deadline {
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
                    match events {
                        Ok(events) if events.iter().all(|e| archived.contains(e.sort_key.as_str()) || gone(e)) => {
                            survey.archived.push(key_of(item));
                        }
                        Err(err) if err.is_unreadable() => survey.damaged.push((item, err)),
                        _ => {
                            survey.kept += 1;
                            survey.late.insert(slot.slot);
                        }
                    }
                }
            }
        }
        Ok(Some(survey))
    }

    /// Deletes what `survey` found archived, and the damaged items once their
    /// quarantine copy is written (one that cannot be is kept); how many it
    /// quarantined, or `None` when the deadline came first.
    async fn delete(&self, survey: Survey, deadline: Instant) -> Result<Option<u64>> {
        let (mut keys, mut quarantined) = (survey.archived, 0);
        for (item, why) in survey.damaged {
            if Box::pin(self.quarantine(&item, &why, deadline)).await? {
                quarantined += 1;
                keys.push(key_of(item));
            }
        }
        let events = Table { name: &self.config.event_table, key: &[HASH_KEY, RANGE_KEY] };
        let mut requests = Vec::with_capacity(keys.len());
        for key in keys {
            let delete = DeleteRequest::builder().set_key(Some(key)).build().map_err(|e| Error::encode("delete", e))?;
            requests.push(((), WriteRequest::builder().delete_request(delete).build()));
        }
        // In steps, so that a run stopped by its deadline keeps what it deleted. Deletes still
        // failing with time left are an error (the errors alarm), not "more" for a continuation
        // that would fail the same way.
        let mut requests = requests.into_iter().peekable();
        while requests.peek().is_some() {
            let step: Vec<_> = requests.by_ref().take(4 * 25).collect();
            let left = write_all(&self.dynamo, events, step, &Backoff::default(), Some(deadline)).await.len();
            if left > 0 && Instant::now() + self.config.deadline_margin >= deadline {
                return Ok(None);
            }
            if left > 0 {
                return Err(Error::Archive(format!("{left} deletes of archived items still failing after retries")));
            }
        }
        Ok(Some(quarantined))
    }

    /// Copies a damaged item of the event table, with `why`, into the
    /// quarantine partition (its key: `event#<storage slot>#<sort key>`); true
    /// once the copy is durable, false when even the copy does not fit an
    /// item (the item then stays in the table, logged).
    async fn quarantine(&self, item: &Item, why: &Error, deadline: Instant) -> Result<bool> {
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

/// An item's key.
fn key_of(item: Item) -> Item {
    item.into_iter().filter(|(name, _)| name == HASH_KEY || name == RANGE_KEY).collect()
}
