//! What the local page at `/` shows, as JSON it polls: the store's status
//! (the same as `event-store status`) and the events that sealed since its
//! last look. Read with the stack's own clients; nothing here writes.

use anyhow::Result;
use event_store::bookkeeping::{settings, slot_index::read_index, watermark};
use event_store::playback::reader::{Page, Reader, PAGES_AHEAD};
use event_store::playback::{Checkpoint, PlayedEvent, Window};
use event_store::status::{self, Clients, Limits, Resources};
use event_store::time::slot_of;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

/// The newest events a look returns, at most.
pub const RECENT_EVENTS: usize = 20;
/// How far back the first look reaches.
const FIRST_LOOK_MS: i64 = 10 * 60_000;

/// Where the page's data comes from.
pub struct Glance {
    pub clients: Clients,
    pub resources: Resources,
}

/// The events sealed in `[from, sealed_end)`, the newest [`RECENT_EVENTS`].
#[derive(Debug, Serialize)]
pub struct Recent {
    /// Where the next look starts (`?after=`); `None` before the first scan pass.
    pub sealed_end: Option<i64>,
    pub events: Vec<PlayedEvent>,
}

impl Glance {
    pub async fn status(&self) -> Result<status::Status> {
        let now = event_store::time::now_ms();
        Ok(status::gather(&self.clients, &self.resources, &Limits::default(), now).await?)
    }

    /// What sealed since `after` (ms; the first look: the last ten minutes).
    pub async fn recent(&self, after: Option<i64>) -> Result<Recent> {
        let (dynamo, table) = (&self.clients.dynamo, self.resources.event_table.as_str());
        let unit = settings::time_unit(dynamo, table).await?.unwrap_or(event_store::config::DEFAULT_TIME_UNIT_MS);
        let Some(end) = watermark::read(dynamo, table).await?.sealed_end(unit) else {
            return Ok(Recent { sealed_end: None, events: vec![] });
        };
        let from = after.unwrap_or(end - FIRST_LOOK_MS).max(end - FIRST_LOOK_MS);
        let (slots, _) = read_index(dynamo, table, slot_of(from, unit), end).await?;
        let window = Window { start: from, end };
        let config = event_store::config::SubscriptionConfig::for_table(table.to_owned())?;
        let reader = Reader {
            dynamo,
            table,
            time_unit_ms: unit,
            page_items: config.page_items,
            dedupe_window_ms: config.dedupe_window_ms,
            window: &window,
        };
        let (tx, mut rx) = mpsc::channel::<event_store::Result<Page>>(PAGES_AHEAD);
        let collect = async {
            let mut events = std::collections::VecDeque::with_capacity(RECENT_EVENTS);
            while let Some(page) = rx.recv().await {
                for event in page?.events {
                    let Ok(bytes) = event.bytes() else { continue };
                    let json: Option<Value> = serde_json::from_slice(&bytes).ok();
                    if events.len() == RECENT_EVENTS {
                        events.pop_front();
                    }
                    events.push_back(PlayedEvent::new(&event, json, &bytes, 0));
                }
            }
            anyhow::Ok(events)
        };
        let ((), events) =
            tokio::join!(reader.fetch_pages(slots, Checkpoint::at_slot(slot_of(from, unit)), tx), collect);
        Ok(Recent { sealed_end: Some(end), events: events?.into() })
    }
}
