//! A page of the complete log from a position: what a reader over HTTP
//! follows (`GET /log`, issue 50). The events before the watermark, in log
//! order, from whichever tier holds them, opened when sealed, each once (a
//! copy within the dedupe window is skipped, also one across a page's edge:
//! the part of the log just before the position is read for its ids), each
//! with the position after it. A page ends at its limit, at
//! [`MAX_PAGE_BYTES`] (Lambda answers at most 6 MB), or at the watermark, and
//! names where the next one starts.
//!
//! A position is a slot and a sort key: the log's own order, which every tier
//! keeps (an archived slot's rows have the same keys) and every key slice
//! shares (a slot's slices are one order of keys). Clients treat it as opaque.

use std::ops::ControlFlow;
use std::time::Instant;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::reader::Reader;
use super::record::TooLarge;
use super::tiers::Tiers;
use super::{Checkpoint, Filter, PlayedEvent, Window};
use crate::bookkeeping::slot_index::{first_slot, read_index};
use crate::bookkeeping::watermark;
use crate::error::{Error, Result};
use crate::event_item::EventItem;
use crate::slices::KeyRange;
use crate::time::{format_ms, slot_of};

/// Events a page holds at most.
pub const MAX_LIMIT: usize = 1_000;
/// A page ends once its events' bytes pass this: its JSON stays under
/// Lambda's 6 MB answer (an event is at most 1 MiB, base64 adds a third).
pub const MAX_PAGE_BYTES: usize = 3 * 1024 * 1024;
/// A page reads the slot index this much of the log at a time.
const INDEX_SPAN_MS: i64 = 3_600_000;
/// The form of a position; another one is refused, not misread.
const POSITION_VERSION: &str = "p1";

/// One event of a page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogEvent {
    /// The position right after this event: a page from here starts with the next one.
    pub position: String,
    /// Its arrival, ISO 8601 and ms: the log's order.
    pub event_time: String,
    pub event_ms: i64,
    pub event_id: String,
    pub partition_key: String,
    /// The event when it is JSON...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// ...else its bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// Instead of the data: an event larger than a page carries (an
    /// offloaded payload of up to 4 MiB), and where it lies; `playback` or
    /// `tail` hand it out whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub too_large: Option<TooLarge>,
}

/// A page of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogPage {
    pub events: Vec<LogEvent>,
    /// Where the next page starts: after the last event read (one the
    /// filters left out too), or at the watermark.
    pub next: String,
    /// The watermark the page was read to: every event before it is sealed.
    pub sealed_to: String,
    pub sealed_to_ms: i64,
    /// The page read everything sealed: the next one has to wait for more.
    pub at_end: bool,
}

/// What reads pages: the event table and the tiers behind it.
pub struct LogReader<'a> {
    pub dynamo: &'a aws_sdk_dynamodb::Client,
    pub table: &'a str,
    pub time_unit_ms: u64,
    pub dedupe_window_ms: u64,
    pub tiers: &'a Tiers,
}

impl LogReader<'_> {
    /// The page from `from` (a position a page named, a time in RFC 3339, or
    /// ms since the epoch): at most `limit` events that match `filters`,
    /// read until `until` at the latest (a filter that matches little over a
    /// long log: the page ends where the reading stopped, not at the end).
    pub async fn page(&self, from: &str, limit: usize, filters: &[Filter], until: Instant) -> Result<LogPage> {
        let (dynamo, table, unit) = (self.dynamo, self.table, self.time_unit_ms);
        let start = parse_position(from, unit)?;
        let limit = limit.clamp(1, MAX_LIMIT);
        let sealed = watermark::read(dynamo, table).await?.complete_end(unit).unwrap_or(0);
        let mut page = LogPage {
            events: Vec::new(),
            next: position_text(&Checkpoint::at_slot(sealed.max(start.slot))),
            sealed_to: format_ms(sealed),
            sealed_to_ms: sealed,
            at_end: true,
        };
        if start.slot >= sealed {
            page.next = position_text(&start);
            return Ok(page);
        }
        // Nothing sealed after the position (a follower at the end): one query, no lookback.
        let Some(mut first) = first_slot(dynamo, table, start.slot, sealed).await? else { return Ok(page) };
        // The ids just before the position: a copy of one of them is not handed out again.
        let lookback = start.lookback(0, self.dedupe_window_ms);
        let (behind, _) = read_index(dynamo, table, slot_of(lookback.from_ms, unit), start.slot + 1).await?;
        let window = Window { start: 0, end: sealed };
        let reader = Reader {
            dynamo,
            table,
            time_unit_ms: unit,
            page_items: None,
            dedupe_window_ms: self.dedupe_window_ms,
            window: &window,
            keys: KeyRange::ALL,
            tiers: self.tiers,
        };
        let (mut recent, _) = reader.recent_ids(&behind, &lookback).await?;
        // Where the next page starts if this one stops: after the last event read, or a span's end.
        let (mut resume, mut bytes, mut stopped, mut at) = (None, 0usize, false, start);
        // The index an hour at a time from the first slot with events: a page reads what it needs of
        // a long log, and jumps a quiet stretch with one query.
        loop {
            let span_end = first.slot.saturating_add(INDEX_SPAN_MS).min(sealed);
            let (slots, _) = read_index(dynamo, table, at.slot, span_end).await?;
            let from = if first.slot > at.slot { Checkpoint::at_slot(first.slot) } else { at };
            reader
                .each_event(slots, from, &mut recent, |event, json, data| {
                    let position = position_text(&Checkpoint {
                        slot: event.slot,
                        after: Some(event.sort_key.clone()),
                        ..Checkpoint::default()
                    });
                    if filters.iter().all(|f| f.matches(json.as_ref())) {
                        // As answered: base64 (a third more) or JSON text (escapes), and the fields.
                        let size = if json.is_some() { data.len() * 5 / 4 } else { data.len() * 4 / 3 } + 512;
                        if !page.events.is_empty() && bytes + size > MAX_PAGE_BYTES {
                            stopped = true;
                            return ControlFlow::Break(());
                        }
                        bytes += size;
                        page.events.push(LogEvent::of(event, json, data, position.clone(), size > MAX_PAGE_BYTES));
                    }
                    resume = Some(position);
                    stopped = page.events.len() >= limit || bytes >= MAX_PAGE_BYTES || Instant::now() >= until;
                    if stopped {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                })
                .await?;
            if stopped {
                break;
            }
            at = Checkpoint::at_slot(span_end);
            resume = Some(position_text(&at));
            match first_slot(dynamo, table, at.slot, sealed).await? {
                Some(next) if Instant::now() < until => first = next,
                Some(_) => {
                    stopped = true;
                    break;
                }
                None => break,
            }
        }
        if let Some(resume) = resume.filter(|_| stopped) {
            (page.next, page.at_end) = (resume, false);
        }
        Ok(page)
    }
}

impl LogEvent {
    /// `event` as a page answers it, `position` the one after it; `too_large`:
    /// larger than a page may carry, its data left out and its place named.
    fn of(event: &EventItem, json: Option<Value>, data: &[u8], position: String, too_large: bool) -> Self {
        let played = match too_large {
            false => PlayedEvent::new(event, json, data, 0),
            true => PlayedEvent::too_large(event, data.len(), None, 0),
        };
        LogEvent {
            position,
            event_time: played.event_time,
            event_ms: played.event_ms,
            event_id: played.event_id,
            partition_key: played.partition_key,
            data: played.data,
            data_base64: played.data_base64,
            too_large: played.too_large,
        }
    }
}

fn position_text(position: &Checkpoint) -> String {
    let after = position.after.as_deref().unwrap_or_default();
    URL_SAFE_NO_PAD.encode(format!("{POSITION_VERSION}.{}.{after}", position.slot))
}

/// Where a page starts, as a client names it: a position a page named, a
/// time (RFC 3339), or ms since the epoch (the first event that arrived then or later).
fn parse_position(text: &str, unit: u64) -> Result<Checkpoint> {
    // Positions name 13-digit times: later than that is no time of the log's.
    let at = |ms: i64| Checkpoint::starting_at(ms.clamp(0, 9_999_999_999_999 - unit as i64), unit);
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(at(ms));
    }
    if let Ok(time) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(at(time.timestamp_millis()));
    }
    let decoded = URL_SAFE_NO_PAD.decode(text).ok().and_then(|bytes| String::from_utf8(bytes).ok());
    let parts = decoded.as_deref().and_then(|d| d.strip_prefix(POSITION_VERSION)?.strip_prefix('.')?.split_once('.'));
    let position = parts.and_then(|(slot, after)| {
        let slot = slot.parse::<i64>().ok().filter(|slot| *slot >= 0 && slot_of(*slot, unit) == *slot)?;
        // A sort key starts with its arrival's 13 digits, within its slot.
        let within = |key: &str| key.get(..13)?.parse::<i64>().ok().filter(|ms| slot_of(*ms, unit) == slot);
        match after {
            "" => Some(Checkpoint::at_slot(slot)),
            key => within(key).map(|_| Checkpoint { slot, after: Some(key.to_owned()), ..Checkpoint::default() }),
        }
    });
    position.ok_or_else(|| {
        Error::BadInput(format!(
            "from {text:?}: a position a page of the log named, a time (RFC 3339) or ms since the epoch"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::sort_key;

    #[test]
    fn positions_read_back_as_written_and_a_client_names_a_start_by_time_too() {
        let unit = 1_000;
        let slot = 1_795_000_000_000;
        let inside = Checkpoint { slot, after: Some(sort_key(slot + 250, "shardId-1:7")), ..Checkpoint::default() };
        for position in [inside, Checkpoint::at_slot(slot)] {
            let text = position_text(&position);
            assert!(text.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "URL-safe: {text}");
            assert_eq!(parse_position(&text, unit).unwrap(), position);
        }
        let by_time = parse_position("2026-11-18T20:26:40.250Z", unit).unwrap();
        assert_eq!(by_time, Checkpoint::starting_at(1_795_033_600_250, unit));
        assert_eq!(parse_position("1795033600250", unit).unwrap(), by_time, "ms since the epoch");
    }

    #[test]
    fn a_position_that_is_none_of_ours_is_refused() {
        let unit = 1_000;
        let slot = 1_795_000_000_000;
        let refused = |text: String| parse_position(&text, unit).is_err();
        assert!(refused("yesterday".into()));
        assert!(refused(URL_SAFE_NO_PAD.encode(format!("p0.{slot}."))), "another version");
        assert!(refused(URL_SAFE_NO_PAD.encode(format!("p1.{}.", slot + 1))), "not a slot's start");
        let elsewhere = sort_key(slot + 5_000, "shardId-1:7");
        assert!(refused(URL_SAFE_NO_PAD.encode(format!("p1.{slot}.{elsewhere}"))), "a key of another slot");
        assert!(refused(URL_SAFE_NO_PAD.encode("p1.-1000.")));
    }
}
