//! What a playback shows: its progress bar, the summary it ends with and the sparkline of the window's events.

use std::collections::BTreeMap;
use std::io::IsTerminal;

use event_store::playback::{PlaybackSummary, Status};
use event_store::time::{format_ms, parse_time};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub(super) fn progress_bar(visible: bool) -> ProgressBar {
    let target = if visible && std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(Some(0), target);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} slots  {msg}  {per_sec}  ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

pub fn print_summary(total: &PlaybackSummary, runs: usize) {
    let window = format!("[{}, {})", total.start, total.end);
    match total.status {
        Status::Incomplete => println!(
            "window {window} is not complete yet: the watermark is at {} (the scan has not completed it); \
             try again later or pass --wait SECONDS",
            total.watermark.as_deref().unwrap_or("- (no complete scan pass yet)")
        ),
        Status::AlreadyDone => println!(
            "window {window} was already played back ({} events, id {}); pass --restart to play it again",
            total.events, total.id
        ),
        Status::Busy => println!(
            "playback {} is being run by another runner (its lease lasts until {}); try again then",
            total.id,
            total.busy_until.as_deref().unwrap_or("-")
        ),
        Status::Stopped => println!(
            "playback {} stopped after MAX_CONTINUATIONS continuations ({} events so far); run the same command \
             again to go on",
            total.id, total.events
        ),
        Status::Complete | Status::Continued => {
            println!(
                "played back {} events from {} non-empty slots of {window} in {} PutRecords and {} Query requests \
                 (+{} index) ({runs} run{}); first {}, last {}; watermark {}",
                total.events,
                total.slots,
                total.put_requests,
                total.queries,
                total.index_queries,
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
                    "note: {} late events so far (moved after their slot was complete; see docs/http-api.md)",
                    total.late_events
                );
            }
        }
    }
}

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Widest sparkline printed; longer windows put several seconds in a column.
const COLUMNS: i64 = 100;

/// Events per column, for equal columns of `column_ms` over `[start, end)`.
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

pub(super) fn print_sparkline(start: &str, end: &str, counts: &BTreeMap<i64, usize>, unit_ms: u64) {
    let (Ok(start), Ok(end)) = (parse_time(start), parse_time(end)) else { return };
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
