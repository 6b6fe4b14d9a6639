//! What the local page at `/` shows, as JSON it polls: the store's status
//! (the same as `event-store status`) and the events whose slots completed since its
//! last look. Read with the stack's own clients; nothing here writes.

use std::collections::VecDeque;
use std::ops::ControlFlow;

use anyhow::Result;
use event_store::bookkeeping::{settings, slot_index::read_index, watermark};
use event_store::event_item::EventItem;
use event_store::log::copies::RecentIds;
use event_store::log::reader::Reader;
use event_store::log::tiers::Tiers;
use event_store::log::{Checkpoint, PlayedEvent, Window};
use event_store::status::{self, Clients, Limits, Resources};
use event_store::time::slot_of;
use serde::Serialize;
use serde_json::Value;

/// The newest events a look returns, at most.
pub const RECENT_EVENTS: usize = 20;
/// How far back the first look reaches (each later look reads only what completed since).
const FIRST_LOOK_MS: i64 = 60_000;

/// Where the page's data comes from.
pub struct Glance {
    pub clients: Clients,
    pub resources: Resources,
    /// The archive's bucket: a look into slots already archived reads them there.
    pub archive: Option<event_store::archive::object::Bucket>,
    /// Subjects' keys: sealed events are shown opened.
    pub keys: Option<std::sync::Arc<event_store::privacy::keys::Keys>>,
}

/// The events of the complete log in `[from, complete_end)`, the newest [`RECENT_EVENTS`].
#[derive(Debug, Serialize)]
pub struct Recent {
    /// Where the next look starts (`?after=`); `None` before the first scan pass.
    #[serde(rename = "sealed_end")]
    pub complete_end: Option<i64>,
    pub events: Vec<PlayedEvent>,
}

impl Glance {
    pub async fn status(&self) -> Result<status::Status> {
        let now = event_store::time::now_ms();
        Ok(status::gather(&self.clients, &self.resources, &Limits::default(), now).await?)
    }

    /// What completed since `after` (ms; the first look: the last minute).
    pub async fn recent(&self, after: Option<i64>) -> Result<Recent> {
        let (dynamo, table) = (&self.clients.dynamo, self.resources.event_table.as_str());
        let unit = settings::time_unit(dynamo, table).await?.unwrap_or(event_store::config::DEFAULT_TIME_UNIT_MS);
        let Some(end) = watermark::read(dynamo, table).await?.complete_end(unit) else {
            return Ok(Recent { complete_end: None, events: vec![] });
        };
        let from = after.unwrap_or(end - FIRST_LOOK_MS).max(end - FIRST_LOOK_MS);
        let (slots, _) = read_index(dynamo, table, slot_of(from, unit), end).await?;
        let window = Window { start: from, end };
        let config = event_store::config::SubscriptionConfig::for_table(table.to_owned())?;
        let tiers = Tiers::new(self.archive.clone()).with_keys(self.keys.clone());
        let reader = Reader {
            dynamo,
            table,
            time_unit_ms: unit,
            page_items: config.page_items,
            dedupe_window_ms: config.dedupe_window_ms,
            window: &window,
            keys: event_store::slices::KeyRange::ALL,
            tiers: &tiers,
        };
        let mut events = VecDeque::with_capacity(RECENT_EVENTS);
        let mut recent = RecentIds::new(config.dedupe_window_ms);
        let keep = |event: &EventItem, json: Option<Value>, bytes: &[u8]| {
            if events.len() == RECENT_EVENTS {
                events.pop_front();
            }
            events.push_back(PlayedEvent::new(event, json, bytes, 0));
            ControlFlow::Continue(())
        };
        reader.each_event(slots, Checkpoint::at_slot(slot_of(from, unit)), &mut recent, keep).await?;
        Ok(Recent { complete_end: Some(end), events: events.into() })
    }
}
