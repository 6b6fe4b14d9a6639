//! Reads the window's non-empty slots from the event table, page by page,
//! ahead of the puts: the first pages of the next slots are in flight
//! together, a slot's further pages follow one by one.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use futures::StreamExt;
use tokio::sync::mpsc;
use tracing::warn;

use super::checkpoint::{Checkpoint, Lookback};
use super::request::Window;
use crate::dedupe::{envelope_id, RecentIds};
use crate::error::{Error, Result};
use crate::event_item::{self, EventItem};

/// Slots whose first page is queried ahead of the one being put.
const QUERY_AHEAD: usize = 8;
/// Pages fetched but not yet consumed (memory bound: about this many MB).
pub const PAGES_AHEAD: usize = 4;

/// One page of one slot, decoded.
pub struct Page {
    pub slot: i64,
    pub events: Vec<EventItem>,
    /// Items that could not be decoded (skipped, logged).
    pub unreadable: usize,
    /// Set when the slot has more pages.
    pub last_key: Option<String>,
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
}

impl Reader<'_> {
    /// Queries `slots`' pages in order into `tx`, the first from `from`.
    /// Stops when the consumer hangs up.
    pub async fn fetch_pages(&self, slots: Vec<i64>, from: Checkpoint, tx: mpsc::Sender<Result<Page>>) {
        let first_pages = futures::stream::iter(slots)
            .map(|slot| {
                let after = if slot == from.slot { from.after.clone() } else { None };
                async move { self.query_page(slot, after).await }
            })
            .buffered(QUERY_AHEAD);
        futures::pin_mut!(first_pages);
        while let Some(mut page) = first_pages.next().await {
            loop {
                let next = page.as_ref().ok().and_then(|p| p.last_key.clone().map(|k| (p.slot, k)));
                if tx.send(page).await.is_err() {
                    return;
                }
                match next {
                    Some((slot, key)) => page = self.query_page(slot, Some(key)).await,
                    None => break,
                }
            }
        }
    }

    /// The envelope ids in `range` of `slots` (the part of the log before a
    /// run's position), in log order, and the `Query` requests it took.
    pub async fn recent_ids(&self, slots: &[i64], range: &Lookback) -> Result<(RecentIds, usize)> {
        let mut recent = RecentIds::new(self.dedupe_window_ms);
        let mut queries = 0;
        for &slot in slots {
            let mut after = None;
            loop {
                let page = self.query_range(slot, range.from_key.clone(), range.to_key.clone(), after).await?;
                queries += 1;
                for event in &page.events {
                    let json = event.bytes().ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
                    if let Some(id) = json.as_ref().and_then(envelope_id) {
                        recent.first_sight(id, event.arrival);
                    }
                }
                match page.last_key {
                    Some(key) => after = Some(key),
                    None => break,
                }
            }
        }
        Ok((recent, queries))
    }

    async fn query_page(&self, slot: i64, after: Option<String>) -> Result<Page> {
        let (from, to) = self.window.key_range(slot, self.time_unit_ms);
        self.query_range(slot, from, to, after).await
    }

    /// One page of `slot`'s events with sort keys in `[from, to]`, after `after`.
    async fn query_range(&self, slot: i64, from: String, to: String, after: Option<String>) -> Result<Page> {
        let out = self
            .dynamo
            .query()
            .table_name(self.table)
            .consistent_read(true)
            .key_condition_expression("#slot = :slot AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#slot", event_item::HASH_KEY)
            .expression_attribute_names("#sk", event_item::RANGE_KEY)
            .expression_attribute_values(":slot", AttributeValue::N(slot.to_string()))
            .expression_attribute_values(":from", AttributeValue::S(from))
            .expression_attribute_values(":to", AttributeValue::S(to))
            .set_limit(self.page_items)
            .set_exclusive_start_key(after.map(|key| event_key(slot, key)))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        let mut page = Page { slot, events: Vec::new(), unreadable: 0, last_key: None };
        for item in out.items() {
            match EventItem::from_item(item.clone()) {
                Ok(event) => page.events.push(event),
                Err(err) => {
                    warn!(slot, error = %err, "event item skipped");
                    page.unreadable += 1;
                }
            }
        }
        page.last_key =
            out.last_evaluated_key().and_then(|k| k.get(event_item::RANGE_KEY)).and_then(|v| v.as_s().ok()).cloned();
        Ok(page)
    }
}

fn event_key(slot: i64, sort_key: String) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (event_item::HASH_KEY.to_owned(), AttributeValue::N(slot.to_string())),
        (event_item::RANGE_KEY.to_owned(), AttributeValue::S(sort_key)),
    ])
}
