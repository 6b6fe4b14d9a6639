//! A playback on a deployed stack: its function invoked asynchronously and the run's checkpoint followed to its end.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use anyhow::{anyhow, Result};
use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use event_store::bookkeeping::{settings, watermark};
use event_store::log::Window;
use event_store::playback::{bound_window, PlaybackRequest};
use event_store::readers::playbacks::{self, Stored};
use event_store::time::{format_ms, now_ms};
use indicatif::ProgressBar;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::display::{print_sparkline, progress_bar};
use super::{max_window, Ended};
use crate::stack::Stack;

/// How often a deployed run's checkpoint is read.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);
/// How long a run may stay unstarted (beyond `--wait`) before the command says so.
const START_GRACE: Duration = Duration::from_secs(60);
/// How long a run whose lease lapsed may stay unchanged before the command says it stopped.
const LAPSED_GRACE: Duration = Duration::from_secs(10);
/// Past `--wait`, how long before an unstarted run's window is checked against the watermark again.
const WAIT_SLACK: Duration = Duration::from_secs(5);
/// The end of each message that leaves a run to a later command.
const AGAIN: &str = "run the same command again to follow it";

/// Invokes the deployed playback function asynchronously, once a run
/// (`--parallel`), and follows the runs' checkpoints to their end (or Ctrl-C,
/// which leaves them going) on one progress bar. A run already going under
/// its id is followed without invoking again; one done before is left as it is.
pub async fn deployed(stack: &Stack, function: &str, requests: Vec<PlaybackRequest>, json_out: bool) -> Result<Ended> {
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let table = stack.resources.event_table.as_str();
    // Read once for all the runs: the slot size the stack recorded, and where the watermark is.
    let unit = settings::time_unit(&dynamo, table).await?.unwrap_or(event_store::config::DEFAULT_TIME_UNIT_MS);
    let complete_end = watermark::read(&dynamo, table).await?.complete_end(unit);
    let mut runs = Vec::with_capacity(requests.len());
    for request in &requests {
        runs.push(Run::find(stack, request, (unit, complete_end), json_out).await?);
    }
    let (Some(first), Some(request)) = (runs.first(), requests.first()) else { return Ok(Ended::Done) };
    // What the function would answer without playing anything, said without invoking it.
    let done_before = |run: &Run| run.done_before && !request.restart && !run.open_ended;
    if runs.iter().all(done_before) {
        first.report_already_done(&together_id(&runs), runs.iter().map(Run::events_before).sum());
        return Ok(Ended::Done);
    }
    // A run holding its lease: followed, not invoked again (the invocation would only wait to answer busy).
    let live: Vec<bool> = runs.iter().map(Run::is_live).collect();
    let wait = Duration::from_secs(request.wait_seconds.unwrap_or(0));
    if !live.contains(&true) && wait.is_zero() && first.complete_end.is_none_or(|sealed| first.window.end > sealed) {
        first.report_incomplete(first.complete_end);
        return Ok(Ended::NotDone);
    }
    for ((run, request), &live) in runs.iter().zip(&requests).zip(&live) {
        if !done_before(run) {
            run.start_unless_live(stack, function, request, live).await?;
        }
    }
    let bar = progress_bar(!json_out);
    let shared = Mutex::new(vec![Seen::default(); runs.len()]);
    let started = Instant::now();
    let follows = runs.iter().zip(&live).enumerate().map(|(part, (run, &live))| {
        let (bar, shared) = (&bar, &shared);
        async move {
            let mut follow = Follow { bar, shared, part, per_slot: BTreeMap::new(), last: None, unit: run.unit };
            if done_before(run) {
                let end = run.before.clone().unwrap_or_default();
                follow.saw(&end);
                return Ok((Some(end), follow.per_slot));
            }
            let end = run.follow_to_end(&mut follow, live, wait, started).await?;
            anyhow::Ok((end, follow.per_slot))
        }
    });
    let mut ends = Vec::with_capacity(runs.len());
    let mut per_slot = BTreeMap::new();
    for followed in futures::future::join_all(follows).await {
        let (end, counts) = followed?;
        for (slot, count) in counts {
            *per_slot.entry(slot).or_default() += count;
        }
        ends.push(end);
    }
    let Some(ends) = ends.into_iter().collect::<Option<Vec<Stored>>>() else {
        return Ok(Ended::NotDone);
    };
    bar.finish_and_clear();
    first.report_complete(&together_id(&runs), &ends, &per_slot, started);
    Ok(Ended::Done)
}

/// The run a deployed request names, as found before anything is invoked.
struct Run<'a> {
    dynamo: aws_sdk_dynamodb::Client,
    table: &'a str,
    /// The slot size the stack recorded.
    unit: u64,
    /// The end of the last complete slot when the command began.
    complete_end: Option<i64>,
    /// The run's id: `--id`, or named by the window and filter.
    id: String,
    /// The window the function will play: the one the id is bound to.
    window: Window,
    /// The run's item before this command (this request's run is the item as it changes from it).
    before: Option<Stored>,
    /// The run played its window completely before.
    done_before: bool,
    /// Neither `--id` nor `--end`: the window moves with the watermark.
    open_ended: bool,
    json_out: bool,
}

impl<'a> Run<'a> {
    /// Finds the run `request` names: its id, the window the id is bound to
    /// (a request naming another is refused) and its item as it is now.
    /// `(unit, complete_end)`: the stack's slot size and the end of its complete log, as read when the command began.
    async fn find(
        stack: &'a Stack,
        request: &PlaybackRequest,
        (unit, complete_end): (u64, Option<i64>),
        json_out: bool,
    ) -> Result<Self> {
        let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
        let table = stack.resources.event_table.as_str();
        let asked = request.window(complete_end.unwrap_or_else(now_ms), max_window()?)?;
        let (id, open_ended) = request.id_for(&asked);
        let before = playbacks::load(&dynamo, table, &id).await?;
        let done_before = before.as_ref().and_then(|s| s.checkpoint.as_ref()).is_some_and(|c| c.done);
        // The window the function will play: the one the id is bound to (a request naming another is refused).
        let stored = before.clone().unwrap_or_default();
        let (window, _) = bound_window(&id, request, asked, &stored, open_ended && done_before)?;
        Ok(Self { dynamo, table, unit, complete_end, id, window, before, done_before, open_ended, json_out })
    }

    /// True when a run of this id, not done before, holds its lease now.
    fn is_live(&self) -> bool {
        let lease = self.before.as_ref().and_then(|s| s.lease.as_ref());
        !self.done_before && lease.is_some_and(|lease| lease.until > now_ms())
    }

    /// Invokes the function asynchronously with `request`, unless the run is
    /// `live`; says on stderr which, and that its checkpoint is followed.
    async fn start_unless_live(
        &self,
        stack: &Stack,
        function: &str,
        request: &PlaybackRequest,
        live: bool,
    ) -> Result<()> {
        let id = &self.id;
        if live {
            if !self.json_out {
                eprintln!("playback {id} is running: following its checkpoint (Ctrl-C leaves it running)");
            }
        } else {
            aws_sdk_lambda::Client::new(&stack.sdk)
                .invoke()
                .function_name(function)
                .invocation_type(InvocationType::Event)
                .payload(Blob::new(serde_json::to_vec(request)?))
                .send()
                .await
                .map_err(|e| anyhow!("invoking {function}: {}", aws_sdk_lambda::error::DisplayErrorContext(&e)))?;
            if !self.json_out {
                eprintln!("playback {id} started on {function}; following its checkpoint (Ctrl-C leaves it running)");
            }
        }
        Ok(())
    }

    /// Reads the run's item every [`FOLLOW_EVERY`] and draws it, until its
    /// checkpoint says done (then the item). `None` when the run is left
    /// going (Ctrl-C), has not started or has stopped, said on stderr.
    async fn follow_to_end(
        &self,
        follow: &mut Follow<'_>,
        live: bool,
        wait: Duration,
        started: Instant,
    ) -> Result<Option<Stored>> {
        let id = &self.id;
        let mut unchanged_since = Instant::now();
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_EVERY) => {}
                _ = &mut ctrl_c => {
                    follow.bar.finish_and_clear();
                    eprintln!("left running: playback {id}; {AGAIN}");
                    return Ok(None);
                }
            }
            let now_stored = playbacks::load(&self.dynamo, self.table, id).await?;
            // This request's run: one that was going already, or the item as it changes from what it was.
            let ours = now_stored.is_some() && (live || now_stored != self.before);
            let Some(stored) = now_stored.filter(|_| ours) else {
                if self.not_started(follow.bar, wait, started).await? {
                    return Ok(None);
                }
                continue;
            };
            if follow.saw(&stored) {
                unchanged_since = Instant::now();
            }
            if stored.checkpoint.as_ref().is_some_and(|c| c.done) {
                return Ok(Some(stored));
            }
            if self.stopped(&stored, follow.bar, unchanged_since) {
                return Ok(None);
            }
        }
    }

    /// No item of this request's run yet: true, said, when the function has
    /// answered incomplete past `--wait`, or the run has not started in time.
    async fn not_started(&self, bar: &ProgressBar, wait: Duration, started: Instant) -> Result<bool> {
        let id = &self.id;
        // The function waits up to --wait for the watermark, then answers incomplete and writes nothing.
        if !wait.is_zero() && started.elapsed() > wait + WAIT_SLACK {
            let complete_end = watermark::read(&self.dynamo, self.table).await?.complete_end(self.unit);
            if complete_end.is_none_or(|sealed| self.window.end > sealed) {
                bar.finish_and_clear();
                self.report_incomplete(complete_end);
                return Ok(true);
            }
        }
        if started.elapsed() > wait + START_GRACE {
            bar.finish_and_clear();
            eprintln!(
                "error: playback {id} has not started after {} s: see the stack's AsyncFailureQueue for the \
                 failed invocation, then {AGAIN}",
                started.elapsed().as_secs()
            );
            return Ok(true);
        }
        Ok(false)
    }

    /// True, said, when the run's lease has lapsed and its item has not
    /// changed for [`LAPSED_GRACE`].
    fn stopped(&self, stored: &Stored, bar: &ProgressBar, unchanged_since: Instant) -> bool {
        let id = &self.id;
        // Released (a failed run) or expired (a crashed one), and nothing moving.
        let lapsed = stored.lease.as_ref().is_none_or(|lease| lease.until < now_ms());
        if lapsed && unchanged_since.elapsed() > LAPSED_GRACE {
            bar.finish_and_clear();
            let (at, events) = stored.checkpoint.as_ref().map_or((self.window.start, 0), |c| (c.slot, c.events));
            eprintln!(
                "playback {id} stopped at {} ({events} events) and its lease has lapsed: Lambda retries a failed \
                 run once or twice, then sends it to the AsyncFailureQueue; {AGAIN} (it resumes from the checkpoint)",
                format_ms(at)
            );
            return true;
        }
        false
    }

    /// The events its checkpoint counted before this command.
    fn events_before(&self) -> u64 {
        self.before.as_ref().and_then(|s| s.checkpoint.as_ref()).map_or(0, |c| c.events)
    }

    /// Says the window was played back before, with its `events`.
    fn report_already_done(&self, id: &str, events: u64) {
        let window = &self.window;
        report(self.json_out, id, "already_done", window, events, || {
            format!(
                "window [{}, {}) was already played back ({events} events, id {id}); pass --restart to play it again",
                format_ms(window.start),
                format_ms(window.end)
            )
        });
    }

    /// Says the window is not complete yet, with where the watermark is (`complete_end`).
    fn report_incomplete(&self, complete_end: Option<i64>) {
        let (id, window) = (&self.id, &self.window);
        report(self.json_out, id, "incomplete", window, 0, || {
            format!(
                "window [{}, {}) is not complete yet: the watermark is at {} (the scan has not completed it); \
                 try again later or pass --wait SECONDS",
                format_ms(window.start),
                format_ms(window.end),
                complete_end.map_or("- (no complete scan pass yet)".into(), format_ms)
            )
        });
    }

    /// Says the runs played their window (`ends`, their last items) and, on a
    /// terminal, draws the sparkline of its events (`per_slot`).
    fn report_complete(&self, id: &str, ends: &[Stored], per_slot: &BTreeMap<i64, usize>, started: Instant) {
        let bound = ends.first().and_then(|end| end.binding.as_ref());
        let window = bound.map_or_else(|| self.window.clone(), |b| Window { start: b.start, end: b.end });
        let events: u64 = ends.iter().filter_map(|end| end.checkpoint.as_ref()).map(|c| c.events).sum();
        report(self.json_out, id, "complete", &window, events, || {
            format!(
                "played back {events} events of [{}, {}) (id {id}, {} s)",
                format_ms(window.start),
                format_ms(window.end),
                started.elapsed().as_secs()
            )
        });
        if !self.json_out {
            print_sparkline(&format_ms(window.start), &format_ms(window.end), per_slot, self.unit);
        }
    }
}

/// The id the runs of one window go by together: the one run's, or the window's with `-*of<N>`.
fn together_id(runs: &[Run]) -> String {
    match runs {
        [one] => one.id.clone(),
        [first, ..] => {
            let base = first.id.rsplit_once('-').map_or(first.id.as_str(), |(base, _)| base);
            format!("{base}-*of{}", runs.len())
        }
        [] => String::new(),
    }
}

/// Where one run stands, for the progress bar of them all: slots done of its window, events put.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    slots: u64,
    of: u64,
    events: u64,
}

/// The progress of a deployed run, from its checkpoint once a second.
struct Follow<'a> {
    bar: &'a ProgressBar,
    /// Every run's progress: the bar shows them added up.
    shared: &'a Mutex<Vec<Seen>>,
    part: usize,
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
            let of = ((binding.end - binding.start) / unit).max(1) as u64;
            let slots = if position.done { of } else { ((position.slot - binding.start).max(0) / unit) as u64 };
            let seen = self.last.as_ref().and_then(|s| s.checkpoint.as_ref()).map_or(0, |c| c.events);
            *self.per_slot.entry(position.slot).or_default() += position.events.saturating_sub(seen) as usize;
            let mut all = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            all[self.part] = Seen { slots, of, events: position.events };
            self.bar.set_length(all.iter().map(|s| s.of).sum::<u64>().max(1));
            self.bar.set_position(all.iter().map(|s| s.slots).sum());
            self.bar.set_message(format!("{} events", all.iter().map(|s| s.events).sum::<u64>()));
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
