//! `event-store tail`: the complete log's events as their slots complete, one
//! JSON line each (the played-record shape), read straight from the event
//! table with the caller's credentials, local or deployed alike.

use std::io::Write;
use std::ops::ControlFlow;
use std::time::Duration;

use anyhow::Result;
use event_store::bookkeeping::settings;
use event_store::bookkeeping::slot_index::read_index;
use event_store::bookkeeping::watermark;
use event_store::config::SubscriptionConfig;
use event_store::event_item::EventItem;
use event_store::log::copies::RecentIds;
use event_store::log::reader::Reader;
use event_store::log::tiers::Tiers;
use event_store::log::{Checkpoint, Filter, PlayedEvent, Window};
use event_store::time::slot_of;
use serde_json::Value;

/// How often the watermark is read while the log is followed.
const POLL: Duration = Duration::from_secs(1);

/// Prints the events of the complete log from `from` (ms) on, until `limit`
/// events are printed, stdout is closed (`| head`) or `stop` resolves;
/// returns how many it printed.
pub async fn tail(
    dynamo: &aws_sdk_dynamodb::Client,
    tiers: Tiers,
    event_table: &str,
    from: i64,
    filters: &[Filter],
    limit: Option<u64>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<u64> {
    let mut config = SubscriptionConfig::for_table(event_table.to_owned())?;
    // The slot size the store was started with, whatever this shell's TIME_UNIT says.
    if let Some(unit) = settings::time_unit(dynamo, event_table).await? {
        config.time_unit_ms = unit;
    }
    let mut printed = 0u64;
    tokio::select! {
        result = follow(dynamo, &config, &tiers, from, filters, limit, &mut printed) => result?,
        () = stop => {}
    }
    Ok(printed)
}

async fn follow(
    dynamo: &aws_sdk_dynamodb::Client,
    config: &SubscriptionConfig,
    tiers: &Tiers,
    from: i64,
    filters: &[Filter],
    limit: Option<u64>,
    printed: &mut u64,
) -> Result<()> {
    let (table, unit) = (config.event_table.as_str(), config.time_unit_ms);
    let mut position = Checkpoint::at_slot(slot_of(from, unit));
    let mut recent = RecentIds::new(config.dedupe_window_ms);
    let mut closed = false;
    let done = |printed: u64, closed: bool| closed || limit.is_some_and(|l| printed >= l);
    while !done(*printed, closed) {
        let complete_end = watermark::read(dynamo, table).await?.complete_end(unit);
        if let Some(end) = complete_end.filter(|end| position.slot < *end) {
            let window = Window { start: from, end };
            let (slots, _) = read_index(dynamo, table, position.slot, end).await?;
            let reader = Reader {
                dynamo,
                table,
                time_unit_ms: unit,
                page_items: config.page_items,
                dedupe_window_ms: config.dedupe_window_ms,
                window: &window,
                keys: event_store::slices::KeyRange::ALL,
                tiers,
            };
            let mut out = std::io::stdout().lock();
            let mut failed = None;
            let print = |event: &EventItem, json: Option<Value>, bytes: &[u8]| {
                if !filters.iter().all(|f| f.matches(json.as_ref())) {
                    return ControlFlow::Continue(());
                }
                let line = match serde_json::to_string(&PlayedEvent::new(event, json, bytes, *printed)) {
                    Ok(line) => line,
                    Err(err) => {
                        failed = Some(err.into());
                        return ControlFlow::Break(());
                    }
                };
                match writeln!(out, "{line}").and_then(|()| out.flush()) {
                    Ok(()) => *printed += 1,
                    // The reader of our output is gone (`| head`): an end, not an error.
                    Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => closed = true,
                    Err(err) => failed = Some(err.into()),
                }
                if failed.is_some() || done(*printed, closed) {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            };
            reader.each_event(slots, position.clone(), &mut recent, print).await?;
            if let Some(err) = failed {
                return Err(err);
            }
            position = Checkpoint::at_slot(end);
        }
        if !done(*printed, closed) {
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}
