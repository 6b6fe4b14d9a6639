//! `make playback`: plays a window back from the running local stack's
//! event table onto its playback stream, with a progress bar (slots done of
//! the slots the index names, events, rate, ETA), then a summary and a
//! sparkline of the window's events per second.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use event_store::config::PlaybackConfig;
use event_store::playback::{Playback, PlaybackRequest, PlaybackSummary, Progress, ProgressObserver, Status};
use event_store::time::format_ms;
use event_store_emulator::runs::{deadline_in, run_playback};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::stack::PLAYBACK_TIMEOUT;

/// Runs the playback of `request` and its continuations to the end; with
/// `interactive`, draws a progress bar and prints a per-second sparkline.
/// Returns one summary per run.
pub async fn play(
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    request: PlaybackRequest,
    interactive: bool,
) -> Result<Vec<PlaybackSummary>> {
    let config = PlaybackConfig::from_env()?;
    let unit = config.time_unit_ms;
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} slots  {msg}  {per_sec}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let per_slot: Arc<Mutex<BTreeMap<i64, usize>>> = Arc::default();
    let observer: Option<ProgressObserver> = interactive.then(|| {
        let (bar, per_slot) = (bar.clone(), per_slot.clone());
        Arc::new(move |progress: &Progress| match progress {
            Progress::Planned { slots } => bar.inc_length(*slots as u64),
            Progress::Slot(slot) => {
                bar.inc(1);
                if let Ok(mut counts) = per_slot.lock() {
                    *counts.entry(slot.slot).or_default() += slot.count;
                    bar.set_message(format!("{} events", counts.values().sum::<usize>()));
                }
            }
        }) as ProgressObserver
    });
    let make = |invoker| {
        let playback = Playback::new(dynamo, kinesis, config, invoker);
        match observer {
            Some(observer) => playback.with_observer(observer),
            None => playback,
        }
    };
    let results = run_playback(make, serde_json::to_value(&request)?, deadline_in(PLAYBACK_TIMEOUT)).await;
    bar.finish_and_clear();
    let mut summaries = Vec::new();
    for result in results {
        match result {
            Ok(summary) => summaries.push(summary),
            Err(err) => bail!("playback failed: {err}"),
        }
    }
    if interactive {
        if let (Some(first), Ok(counts)) = (summaries.first(), per_slot.lock()) {
            print_sparkline(first, &counts, unit);
        }
    }
    Ok(summaries)
}

/// Adds up the runs of one playback (the first run's window is the whole window).
pub fn total(summaries: &[PlaybackSummary]) -> PlaybackSummary {
    let mut total = summaries.first().cloned().unwrap_or_default();
    for s in summaries.iter().skip(1) {
        total.events += s.events;
        total.filtered_out += s.filtered_out;
        total.queries += s.queries;
        total.index_queries += s.index_queries;
        total.put_requests += s.put_requests;
        total.kinesis_records += s.kinesis_records;
        total.resent += s.resent;
        total.checked_requests += s.checked_requests;
        total.duplicates_dropped += s.duplicates_dropped;
        total.unreadable += s.unreadable;
        total.oversized += s.oversized;
        if total.first_event.is_none() {
            total.first_event = s.first_event.clone();
        }
        if s.last_event.is_some() {
            total.last_event = s.last_event.clone();
        }
        total.next_seq = s.next_seq;
        total.status = s.status;
    }
    total
}

pub fn print_summary(total: &PlaybackSummary, runs: usize) {
    match total.status {
        Status::Incomplete => {
            println!(
                "window [{}, {}) is not complete yet: the watermark is at {} (scan has not sealed it); \
                 try again later or pass --wait SECONDS",
                total.start,
                total.end,
                total.watermark.as_deref().unwrap_or("- (no complete scan pass yet)")
            );
            return;
        }
        Status::AlreadyDone => {
            println!(
                "window [{}, {}) was already played back ({} events, id {}); pass --restart to play it again",
                total.start, total.end, total.events, total.id
            );
            return;
        }
        Status::Busy => {
            println!(
                "playback {} is being run by another runner (its lease lasts until {}); try again then",
                total.id,
                total.busy_until.as_deref().unwrap_or("-")
            );
            return;
        }
        Status::Stopped => {
            println!(
                "playback {} stopped after MAX_CONTINUATIONS continuations ({} events so far); run the same request again to go on",
                total.id, total.events
            );
            return;
        }
        Status::Complete | Status::Continued => {}
    }
    println!(
        "played back {} events from {} non-empty slots of [{}, {}) in {} PutRecords and {} Query requests \
         (+{} index) ({} run{}); first {}, last {}; watermark {}",
        total.events,
        total.slots,
        total.start,
        total.end,
        total.put_requests,
        total.queries,
        total.index_queries,
        runs,
        if runs == 1 { "" } else { "s" },
        total.first_event.as_deref().unwrap_or("-"),
        total.last_event.as_deref().unwrap_or("-"),
        total.watermark.as_deref().unwrap_or("-"),
    );
    if total.filtered_out > 0 {
        println!("{} events did not match the filter", total.filtered_out);
    }
    if total.late_events > 0 {
        println!(
            "note: {} late events so far (moved after their slot was sealed; see docs/http-api.md)",
            total.late_events
        );
    }
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Widest sparkline printed; longer windows put several seconds in a column.
const COLUMNS: i64 = 100;

/// Events per column, for `columns` equal columns over `[start, end)`.
pub fn histogram(counts: &BTreeMap<i64, usize>, start: i64, end: i64, column_ms: i64) -> Vec<usize> {
    let columns = ((end - start).max(1) + column_ms - 1) / column_ms;
    let mut out = vec![0; columns as usize];
    for (&slot, &count) in counts.range(start - column_ms..end) {
        let column = ((slot.max(start) - start) / column_ms) as usize;
        if let Some(c) = out.get_mut(column) {
            *c += count;
        }
    }
    out
}

pub fn sparkline(values: &[usize]) -> String {
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    values.iter().map(|&v| if v == 0 { ' ' } else { BARS[(v * (BARS.len() - 1)).div_ceil(max).min(7)] }).collect()
}

fn print_sparkline(summary: &PlaybackSummary, counts: &BTreeMap<i64, usize>, unit_ms: u64) {
    let (Ok(start), Ok(end)) =
        (event_store::time::parse_time(&summary.start), event_store::time::parse_time(&summary.end))
    else {
        return;
    };
    let second = 1000.max(unit_ms as i64);
    let column_ms = second * (((end - start) / second + COLUMNS - 1) / COLUMNS).max(1);
    let values = histogram(counts, start, end, column_ms);
    println!(
        "events per {} s, {} .. {} (peak {}):",
        column_ms / 1000,
        format_ms(start),
        format_ms(end),
        values.iter().max().unwrap_or(&0)
    );
    println!("|{}|", sparkline(&values));
}

pub fn require_emulator(endpoint: &str, port: u16) -> Result<()> {
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        bail!("no emulator answers at {endpoint}: start the local stack first (`make local` in another terminal)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_puts_each_slot_in_its_column_and_the_sparkline_scales() {
        let counts = BTreeMap::from([(1_000, 2), (2_000, 0), (3_000, 8), (4_500, 4)]);
        assert_eq!(histogram(&counts, 1_000, 5_000, 1_000), vec![2, 0, 8, 4]);
        assert_eq!(histogram(&counts, 1_000, 5_000, 2_000), vec![2, 12]);
        assert_eq!(sparkline(&[0, 1, 4, 8]), " ▂▅█");
    }
}
