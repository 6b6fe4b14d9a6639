//! `event-store playback`: a window of the complete log onto the playback
//! stream, in order. Locally the run goes in this process, as the function
//! would run it; on a deployed stack the playback function is invoked
//! asynchronously and the run's checkpoint followed. Both draw a progress
//! bar and end with a summary and a sparkline of the window's events.
//! Ctrl-C leaves a deployed run going: the same command follows it again
//! (a request names its run by its window and filter, or by `--id`).

mod deployed;
mod display;
mod local;

use std::time::Duration;

use anyhow::{anyhow, Result};
use event_store::bookkeeping::{settings, watermark};
use event_store::config::PlaybackConfig;
use event_store::log::Filter;
use event_store::playback::PlaybackRequest;
use event_store::slices::KeyRange;
use event_store::time::{format_ms, parse_time};

pub use deployed::deployed;
pub use local::local;

use crate::select::SelectArgs;
use crate::stack::Stack;

/// The playback request, as command-line arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Window start, ISO 8601 (e.g. 2026-11-21T06:00:00Z) or epoch ms; default: 15 minutes before the end.
    #[arg(long)]
    start: Option<String>,
    /// Window end (exclusive); default: the end of the last complete slot (the watermark).
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
    #[command(flatten)]
    select: SelectArgs,
    /// Runs playing the window together (1 to 1024), each the keys of its range of key hashes, in order per key,
    /// at its share of the pace; each resumes from its own checkpoint.
    #[arg(long, default_value_t = 1)]
    parallel: u32,
}

impl Args {
    /// The requests the function takes, one a run (`--parallel`); bad
    /// arguments are refused here, by the function's own rules, before
    /// anything is sent. `now` (epoch ms) stands in for the complete end: a
    /// start after it, or a window longer than `max` ([`max_window`]), is refused.
    pub fn requests(self, now: i64, max: Duration) -> Result<Vec<PlaybackRequest>> {
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
            select: self.select.select()?,
            ..Default::default()
        };
        // The window's own checks (end before start, too long).
        request.window(now, max)?;
        let parts = self.parallel;
        if !(1..=event_store::slices::MAX_SLICES).contains(&parts) {
            return Err(anyhow!("--parallel is 1 to {}, not {parts}", event_store::slices::MAX_SLICES));
        }
        if request.max_records_per_second.is_some_and(|rate| rate < u64::from(parts)) {
            return Err(anyhow!("--rate: at least one event a second for each of the {parts} runs"));
        }
        if parts == 1 {
            return Ok(vec![request]);
        }
        Ok((0..parts)
            .map(|part| PlaybackRequest { keys: Some(KeyRange::new(part, parts)), ..request.clone() })
            .collect())
    }
}

/// Runs of one window without `--end` (or `--id`) play the same window: the
/// one ending at the watermark as the command starts (each run reading the
/// watermark on its own could bind another).
pub async fn pinned(stack: &Stack, mut requests: Vec<PlaybackRequest>) -> Result<Vec<PlaybackRequest>> {
    let open_ended = requests.first().is_some_and(|r| r.end.is_none() && r.id.is_none());
    if requests.len() < 2 || !open_ended {
        return Ok(requests);
    }
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let table = stack.resources.event_table.as_str();
    let unit = settings::time_unit(&dynamo, table).await?.unwrap_or(event_store::config::DEFAULT_TIME_UNIT_MS);
    if let Some(end) = watermark::read(&dynamo, table).await?.complete_end(unit) {
        for request in &mut requests {
            request.end = Some(format_ms(end));
        }
    }
    Ok(requests)
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

#[cfg(test)]
mod tests {
    use super::*;

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
            select: SelectArgs::categories(&[], &[]),
            parallel: 1,
        };
        // The time the arguments are checked against: noon of 2026-11-27, whatever the clock says.
        let now = parse_time("2026-11-27T12:00:00Z").unwrap();
        let day = Duration::from_secs(24 * 3600);
        let request = args(Some("2026-11-27T00:00:00Z"), None, "/kind=click").requests(now, day).unwrap();
        assert_eq!((request[0].filter.len(), request[0].wait_seconds, request.len()), (1, Some(0), 1));
        let four = Args { parallel: 4, ..args(None, None, "/kind=click") }.requests(now, day).unwrap();
        let parts: Vec<_> = four.iter().map(|r| r.keys.map(|k| (k.part, k.parts))).collect();
        assert_eq!(parts, [Some((0, 4)), Some((1, 4)), Some((2, 4)), Some((3, 4))]);
        assert!(Args { parallel: 0, ..args(None, None, "/a=1") }.requests(now, day).is_err());
        assert!(Args { parallel: 2048, ..args(None, None, "/a=1") }.requests(now, day).is_err());
        let slow = Args { parallel: 8, rate: Some(7), ..args(None, None, "/a=1") }.requests(now, day);
        assert!(slow.unwrap_err().to_string().contains("each of the 8 runs"));
        let todos = Args { select: SelectArgs::categories(&["todo"], &[]), ..args(None, None, "/a=1") };
        assert_eq!(todos.requests(now, day).unwrap()[0].select.categories, ["todo"]);
        let dashed = Args { select: SelectArgs::categories(&["todo-1"], &[]), ..args(None, None, "/a=1") };
        assert!(dashed.requests(now, day).is_err(), "a category has no '-'");
        let day_later = now + 24 * 3_600_000;
        let open_ended = args(Some("2026-11-27T00:00:00Z"), None, "/kind=click").requests(day_later, day);
        assert!(open_ended.unwrap_err().to_string().contains("36 hours long"), "a window without an end ends at now");
        assert!(args(Some("someday"), None, "/a=1").requests(now, day).unwrap_err().to_string().contains("--start"));
        let backwards = args(Some("2026-11-27T00:00:00Z"), Some("2026-11-26T00:00:00Z"), "/a=1").requests(now, day);
        assert!(backwards.unwrap_err().to_string().contains("before start"));
        let long = args(Some("2026-11-01T00:00:00Z"), Some("2026-11-27T00:00:00Z"), "/a=1").requests(now, day);
        assert!(long.unwrap_err().to_string().contains("at most 24"));
        assert!(args(None, None, "kind").requests(now, day).is_err(), "a filter needs its pointer");
        let future = args(Some("2026-11-28T00:00:00Z"), Some("2026-11-28T01:00:00Z"), "/a=1").requests(now, day);
        assert_eq!(
            future.unwrap_err().to_string(),
            "--start 2026-11-28T00:00:00Z is in the future: nothing is stored there yet"
        );
    }
}
