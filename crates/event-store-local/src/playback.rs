//! `make playback`: plays a window back from the running local stack's
//! event table onto its playback stream, printing the original's line per
//! non-empty slot and a summary.

use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{bail, Result};
use event_store::config::PlaybackConfig;
use event_store::invoke::{run_until_idle, LocalInvoker};
use event_store::playback::{Playback, PlaybackRequest, PlaybackSummary};
use event_store::time::format_ms;

use crate::stack::PLAYBACK_TIMEOUT;

/// Runs the playback of `request` and its continuations to the end; prints
/// each non-empty slot when `print_slots`. Returns one summary per run.
pub async fn play(
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    request: PlaybackRequest,
    print_slots: bool,
) -> Result<Vec<PlaybackSummary>> {
    let (invoker, mut invocations) = LocalInvoker::channel();
    let mut playback = Playback::new(dynamo, kinesis, PlaybackConfig::from_env()?, Arc::new(invoker.clone()));
    if print_slots {
        playback = playback.with_observer(Arc::new(|slot| {
            println!("{}: {} [{}]", format_ms(slot.slot), format_ms(slot.first_event), slot.count)
        }));
    }
    let playback = Arc::new(playback);
    invoker.send(serde_json::to_value(&request)?)?;
    let results = run_until_idle(&mut invocations, move |payload| {
        let playback = playback.clone();
        async move { playback.handle(payload, SystemTime::now() + PLAYBACK_TIMEOUT).await }
    })
    .await;
    let mut summaries = Vec::new();
    for result in results {
        match result {
            Ok(summary) => summaries.push(summary),
            Err(err) => bail!("playback failed: {err}"),
        }
    }
    Ok(summaries)
}

/// Adds up the runs of one playback (the first run's window is the whole window).
pub fn total(summaries: &[PlaybackSummary]) -> PlaybackSummary {
    let mut total = summaries.first().cloned().unwrap_or_default();
    for s in summaries.iter().skip(1) {
        total.slots += s.slots;
        total.events += s.events;
        total.put_requests += s.put_requests;
        total.resent += s.resent;
        total.unreadable += s.unreadable;
        if total.first_event.is_none() {
            total.first_event = s.first_event.clone();
        }
        if s.last_event.is_some() {
            total.last_event = s.last_event.clone();
        }
    }
    total.continued = false;
    total
}

pub fn print_summary(total: &PlaybackSummary, runs: usize) {
    println!(
        "played back {} events from {} non-empty slots of [{}, {}) in {} PutRecords requests ({} run{}); first {}, last {}",
        total.events,
        total.slots,
        total.start,
        total.end,
        total.put_requests,
        runs,
        if runs == 1 { "" } else { "s" },
        total.first_event.as_deref().unwrap_or("-"),
        total.last_event.as_deref().unwrap_or("-"),
    );
}

pub fn require_emulator(endpoint: &str, port: u16) -> Result<()> {
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        bail!("no emulator answers at {endpoint}: start the local stack first (`make local` in another terminal)");
    }
    Ok(())
}
