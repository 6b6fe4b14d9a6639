//! `event-store playback`: a window of the sealed log onto the playback
//! stream, in order. Locally the run goes in this process, as the function
//! would run it; on a deployed stack the playback function is invoked
//! asynchronously and the run's checkpoint followed. Both draw a progress
//! bar and end with a summary and a sparkline of the window's events.
//! Ctrl-C leaves a deployed run going: the same command follows it again
//! (a request names its run by its window and filter, or by `--id`).

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use event_store::bookkeeping::{settings, watermark};
use event_store::config::PlaybackConfig;
use event_store::log::{Filter, Window};
use event_store::playback::{
    bound_window, open_ended_id, run_id, Playback, PlaybackRequest, PlaybackSummary, Progress, ProgressObserver, Status,
};
use event_store::readers::playbacks::{self, Stored};
use event_store::time::{format_ms, now_ms, parse_time};
use event_store_emulator::runs::{deadline_in, run_playback};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use crate::target::Target;

/// The playback request, as command-line arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Window start, ISO 8601 (e.g. 2026-11-21T06:00:00Z) or epoch ms; default: 15 minutes before the end.
    #[arg(long)]
    start: Option<String>,
    /// Window end (exclusive); default: the end of the last sealed slot (the watermark).
    #[arg(long)]
    end: Option<String>,
    /// When END is past the watermark, wait up to this many seconds for it.
    #[arg(long, default_value_t = 0)]
    wait: u64,
    /// Records per second onto the playback stream (default: its shards × 1,000).
    #[arg(long)]
    rate: Option<u64>,
    /// Only events whose JSON has this value at this pointer: `/path=/track.gif`. Repeatable.
    #[arg(long = "filter", value_delimiter = ',')]
    filters: Vec<String>,
    /// Play again even if this window was already played back completely.
    #[arg(long)]
    restart: bool,
    /// The run's id (default: named by the window and filter, so the same command finds the same run).
    #[arg(long)]
    id: Option<String>,
}

impl Args {
    /// The request the function takes; bad arguments are refused here, by
    /// the function's own rules, before anything is sent. `now` (epoch ms)
    /// stands in for the sealed end: a start after it, or a window longer
    /// than `max` ([`max_window`]), is refused.
    pub fn request(self, now: i64, max: Duration) -> Result<PlaybackRequest> {
        for (name, time) in [("--start", &self.start), ("--end", &self.end)] {
            if let Some(time) = time {
                parse_time(time).map_err(|e| anyhow!("{name} {time:?}: {e}"))?;
            }
        }
        // An end in the future is waited for (--wait); a start there has nothing to play yet.
        if let Some(start) = &self.start {
            if parse_time(start)? > now {
                return Err(anyhow!("--start {start} is in the future: nothing is stored there yet"));
            }
        }
        let request = PlaybackRequest {
            start: self.start,
            end: self.end,
            wait_seconds: Some(self.wait),
            max_records_per_second: self.rate,
            filter: self.filters.iter().map(|f| f.parse()).collect::<event_store::Result<Vec<Filter>>>()?,
            restart: self.restart,
            id: self.id,
            ..Default::default()
        };
        // The window's own checks (end before start, too long).
        request.window(now, max)?;
        Ok(request)
    }
}

/// The longest window a request may ask for: `PLAYBACK_MAX_HOURS` in this
/// command's environment, as the function reads it in its own (default 24).
pub fn max_window() -> Result<Duration> {
    Ok(PlaybackConfig::for_names(String::new(), String::new())?.max_window)
}

/// How a playback ended, for the exit code.
pub enum Ended {
    /// Played (or played before): exit 0.
    Done,
    /// Not complete, busy, stopped, left running: exit 1.
    NotDone,
}

/// Runs the playback in this process against the local stack.
pub async fn local(target: &Target, request: PlaybackRequest, json_out: bool) -> Result<Ended> {
    let stream = target.playback_stream.clone().ok_or_else(|| anyhow!("no playback stream"))?;
    let mut config = PlaybackConfig::for_names(target.resources.event_table.clone(), stream)?;
    let dynamo = aws_sdk_dynamodb::Client::new(&target.sdk);
    // The slot size the stack recorded, whatever this shell's TIME_UNIT says.
    if let Some(unit) = settings::time_unit(&dynamo, &config.event_table).await? {
        config.time_unit_ms = unit;
    }
    let unit = config.time_unit_ms;
    let bar = progress_bar(!json_out);
    let per_slot: Arc<Mutex<BTreeMap<i64, usize>>> = Arc::default();
    let observer: ProgressObserver = {
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
        })
    };
    let kinesis = aws_sdk_kinesis::Client::new(&target.sdk);
    let (archive, keys) = (target.archive(), target.keys());
    let make = |invoker| {
        Playback::new(dynamo, kinesis, config, invoker).with_observer(observer).with_archive(archive).with_keys(keys)
    };
    // As long as the function's timeout allows each run; continuations go on in this process.
    let runs = run_playback(make, serde_json::to_value(&request)?, deadline_in(Duration::from_secs(900))).await;
    bar.finish_and_clear();
    let runs = runs.into_iter().collect::<event_store::Result<Vec<_>>>()?;
    let total = PlaybackSummary::total(&runs);
    if json_out {
        println!("{}", serde_json::to_string_pretty(&total)?);
    } else {
        print_summary(&total, runs.len());
        if matches!(total.status, Status::Complete) {
            if let Ok(counts) = per_slot.lock() {
                print_sparkline(&total.start, &total.end, &counts, unit);
            }
        }
    }
    Ok(match total.status {
        Status::Complete | Status::Continued | Status::AlreadyDone => Ended::Done,
        Status::Incomplete | Status::Busy | Status::Stopped => Ended::NotDone,
    })
}

/// How often a deployed run's checkpoint is read.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);
/// How long a run may stay unstarted (beyond `--wait`) before the command says so.
const START_GRACE: Duration = Duration::from_secs(60);
/// How long a run whose lease lapsed may stay unchanged before the command says it stopped.
const LAPSED_GRACE: Duration = Duration::from_secs(10);
/// Past `--wait`, how long before an unstarted run's window is checked against the watermark again.
const WAIT_SLACK: Duration = Duration::from_secs(5);

/// Invokes the deployed playback function asynchronously and follows the
/// run's checkpoint to its end (or Ctrl-C, which leaves it going). A run
/// already going under the same id is followed without invoking again.
pub async fn deployed(target: &Target, function: &str, request: PlaybackRequest, json_out: bool) -> Result<Ended> {
    let dynamo = aws_sdk_dynamodb::Client::new(&target.sdk);
    let table = target.resources.event_table.as_str();
    let unit = settings::time_unit(&dynamo, table).await?.unwrap_or(event_store::config::DEFAULT_TIME_UNIT_MS);
    let sealed_end = watermark::read(&dynamo, table).await?.sealed_end(unit);
    let asked = request.window(sealed_end.unwrap_or_else(now_ms), max_window()?)?;
    let open_ended = request.id.is_none() && request.end.is_none();
    let id = match (&request.id, &request.end) {
        (Some(id), _) => id.clone(),
        (None, Some(_)) => run_id(&asked, &request.filter),
        (None, None) => open_ended_id(&request),
    };
    let before = playbacks::load(&dynamo, table, &id).await?;
    let done_before = before.as_ref().and_then(|s| s.checkpoint.as_ref()).is_some_and(|c| c.done);
    // The window the function will play: the one the id is bound to (a request naming another is refused).
    let stored = before.clone().unwrap_or_default();
    let (window, _) = bound_window(&id, &request, asked, &stored, open_ended && done_before)?;
    // What the function would answer without playing anything, said without invoking it.
    if done_before && !request.restart && !open_ended {
        let events = stored.checkpoint.as_ref().map_or(0, |c| c.events);
        report(json_out, &id, "already_done", &window, events, || {
            format!(
                "window [{}, {}) was already played back ({events} events, id {id}); pass --restart to play it again",
                format_ms(window.start),
                format_ms(window.end)
            )
        });
        return Ok(Ended::Done);
    }
    let incomplete = |sealed_end: Option<i64>| {
        report(json_out, &id, "incomplete", &window, 0, || {
            format!(
                "window [{}, {}) is not complete yet: the watermark is at {} (the scan has not sealed it); \
                 try again later or pass --wait SECONDS",
                format_ms(window.start),
                format_ms(window.end),
                sealed_end.map_or("- (no complete scan pass yet)".into(), format_ms)
            )
        })
    };
    // A run of this id holding its lease: followed, not invoked again (the invocation would only wait to answer busy).
    let live = !done_before && stored.lease.as_ref().is_some_and(|lease| lease.until > now_ms());
    let wait = Duration::from_secs(request.wait_seconds.unwrap_or(0));
    if !live && wait.is_zero() && sealed_end.is_none_or(|sealed| window.end > sealed) {
        incomplete(sealed_end);
        return Ok(Ended::NotDone);
    }
    if live {
        if !json_out {
            eprintln!("playback {id} is running: following its checkpoint (Ctrl-C leaves it running)");
        }
    } else {
        aws_sdk_lambda::Client::new(&target.sdk)
            .invoke()
            .function_name(function)
            .invocation_type(InvocationType::Event)
            .payload(Blob::new(serde_json::to_vec(&request)?))
            .send()
            .await
            .map_err(|e| anyhow!("invoking {function}: {}", aws_sdk_lambda::error::DisplayErrorContext(&e)))?;
        if !json_out {
            eprintln!("playback {id} started on {function}; following its checkpoint (Ctrl-C leaves it running)");
        }
    }
    let again = "run the same command again to follow it";
    let bar = progress_bar(!json_out);
    let mut follow = Follow { bar: &bar, per_slot: BTreeMap::new(), last: None, unit };
    let started = tokio::time::Instant::now();
    let mut unchanged_since = tokio::time::Instant::now();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let end = loop {
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_EVERY) => {}
            _ = &mut ctrl_c => {
                bar.finish_and_clear();
                eprintln!("left running: playback {id}; {again}");
                return Ok(Ended::NotDone);
            }
        }
        let now_stored = playbacks::load(&dynamo, table, &id).await?;
        // This request's run: one that was going already, or the item as it changes from what it was.
        let ours = now_stored.is_some() && (live || now_stored != before);
        let Some(stored) = now_stored.filter(|_| ours) else {
            // The function waits up to --wait for the watermark, then answers incomplete and writes nothing.
            if !wait.is_zero() && started.elapsed() > wait + WAIT_SLACK {
                let sealed_end = watermark::read(&dynamo, table).await?.sealed_end(unit);
                if sealed_end.is_none_or(|sealed| window.end > sealed) {
                    bar.finish_and_clear();
                    incomplete(sealed_end);
                    return Ok(Ended::NotDone);
                }
            }
            if started.elapsed() > wait + START_GRACE {
                bar.finish_and_clear();
                eprintln!(
                    "error: playback {id} has not started after {} s: see the stack's AsyncFailureQueue for the \
                     failed invocation, then {again}",
                    started.elapsed().as_secs()
                );
                return Ok(Ended::NotDone);
            }
            continue;
        };
        if follow.saw(&stored) {
            unchanged_since = tokio::time::Instant::now();
        }
        if stored.checkpoint.as_ref().is_some_and(|c| c.done) {
            break stored;
        }
        // Released (a failed run) or expired (a crashed one), and nothing moving.
        let lapsed = stored.lease.as_ref().is_none_or(|lease| lease.until < now_ms());
        if lapsed && unchanged_since.elapsed() > LAPSED_GRACE {
            bar.finish_and_clear();
            let (at, events) = stored.checkpoint.as_ref().map_or((window.start, 0), |c| (c.slot, c.events));
            eprintln!(
                "playback {id} stopped at {} ({events} events) and its lease has lapsed: Lambda retries a failed \
                 run once or twice, then sends it to the AsyncFailureQueue; {again} (it resumes from the checkpoint)",
                format_ms(at)
            );
            return Ok(Ended::NotDone);
        }
    };
    bar.finish_and_clear();
    let window = end.binding.as_ref().map_or(window, |b| Window { start: b.start, end: b.end });
    let events = end.checkpoint.as_ref().map_or(0, |c| c.events);
    report(json_out, &id, "complete", &window, events, || {
        format!(
            "played back {events} events of [{}, {}) (id {id}, {} s)",
            format_ms(window.start),
            format_ms(window.end),
            started.elapsed().as_secs()
        )
    });
    if !json_out {
        let counts: BTreeMap<i64, usize> = follow.per_slot;
        print_sparkline(&format_ms(window.start), &format_ms(window.end), &counts, unit);
    }
    Ok(Ended::Done)
}

/// The progress of a deployed run, from its checkpoint once a second.
struct Follow<'a> {
    bar: &'a ProgressBar,
    /// Events put, by the slot the checkpoint had reached when they were seen (approximate, for the sparkline).
    per_slot: BTreeMap<i64, usize>,
    last: Option<Stored>,
    unit: u64,
}

impl Follow<'_> {
    /// Draws what `stored` says; true when it changed.
    fn saw(&mut self, stored: &Stored) -> bool {
        if self.last.as_ref() == Some(stored) {
            return false;
        }
        if let (Some(binding), Some(position)) = (&stored.binding, &stored.checkpoint) {
            let unit = self.unit.max(1) as i64;
            self.bar.set_length(((binding.end - binding.start) / unit).max(1) as u64);
            self.bar.set_position(((position.slot - binding.start).max(0) / unit) as u64);
            self.bar.set_message(format!("{} events", position.events));
            let seen = self.last.as_ref().and_then(|s| s.checkpoint.as_ref()).map_or(0, |c| c.events);
            *self.per_slot.entry(position.slot).or_default() += position.events.saturating_sub(seen) as usize;
        }
        self.last = Some(stored.clone());
        true
    }
}

/// One line (or, with `--json`, one object) saying how a deployed playback ended.
fn report(json_out: bool, id: &str, status: &str, window: &Window, events: u64, line: impl FnOnce() -> String) {
    if json_out {
        let value: Value = json!({
            "id": id, "status": status, "start": format_ms(window.start), "end": format_ms(window.end), "events": events,
        });
        println!("{value}");
    } else {
        println!("{}", line());
    }
}

fn progress_bar(visible: bool) -> ProgressBar {
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
            "window {window} is not complete yet: the watermark is at {} (the scan has not sealed it); \
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
                    "note: {} late events so far (moved after their slot was sealed; see docs/http-api.md)",
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

fn print_sparkline(start: &str, end: &str, counts: &BTreeMap<i64, usize>, unit_ms: u64) {
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

    #[test]
    fn arguments_are_checked_before_anything_is_sent() {
        let args = |start: Option<&str>, end: Option<&str>, filter: &str| Args {
            start: start.map(str::to_owned),
            end: end.map(str::to_owned),
            wait: 0,
            rate: None,
            filters: vec![filter.to_owned()],
            restart: false,
            id: None,
        };
        // The time the arguments are checked against: noon of 2026-11-27, whatever the clock says.
        let now = parse_time("2026-11-27T12:00:00Z").unwrap();
        let day = Duration::from_secs(24 * 3600);
        let request = args(Some("2026-11-27T00:00:00Z"), None, "/kind=click").request(now, day).unwrap();
        assert_eq!((request.filter.len(), request.wait_seconds), (1, Some(0)));
        let day_later = now + 24 * 3_600_000;
        let open_ended = args(Some("2026-11-27T00:00:00Z"), None, "/kind=click").request(day_later, day);
        assert!(open_ended.unwrap_err().to_string().contains("36 hours long"), "a window without an end ends at now");
        assert!(args(Some("someday"), None, "/a=1").request(now, day).unwrap_err().to_string().contains("--start"));
        let backwards = args(Some("2026-11-27T00:00:00Z"), Some("2026-11-26T00:00:00Z"), "/a=1").request(now, day);
        assert!(backwards.unwrap_err().to_string().contains("before start"));
        let long = args(Some("2026-11-01T00:00:00Z"), Some("2026-11-27T00:00:00Z"), "/a=1").request(now, day);
        assert!(long.unwrap_err().to_string().contains("at most 24"));
        assert!(args(None, None, "kind").request(now, day).is_err(), "a filter needs its pointer");
        let future = args(Some("2026-11-28T00:00:00Z"), Some("2026-11-28T01:00:00Z"), "/a=1").request(now, day);
        assert_eq!(
            future.unwrap_err().to_string(),
            "--start 2026-11-28T00:00:00Z is in the future: nothing is stored there yet"
        );
    }
}
