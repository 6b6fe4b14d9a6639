//! A playback run in this process against the local stack, as the function would run it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, Result};
use event_store::bookkeeping::settings;
use event_store::config::PlaybackConfig;
use event_store::playback::{Playback, PlaybackRequest, PlaybackSummary, Progress, ProgressObserver, Status};
use event_store_emulator::runs::{deadline_in, run_playback};

use super::display::{print_sparkline, print_summary, progress_bar};
use super::Ended;
use crate::stack::Stack;

/// Runs the playback in this process against the local stack: its runs
/// (`--parallel`) side by side, each as its own function's chain would, one
/// progress bar for them all.
pub async fn local(stack: &Stack, requests: Vec<PlaybackRequest>, json_out: bool) -> Result<Ended> {
    let stream = stack.playback_stream.clone().ok_or_else(|| anyhow!("no playback stream"))?;
    let mut config = PlaybackConfig::for_names(stack.resources.event_table.clone(), stream)?;
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
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
    let kinesis = aws_sdk_kinesis::Client::new(&stack.sdk);
    let (archive, keys) = (stack.archive(), stack.keys());
    let chains = requests.iter().map(|request| {
        let (dynamo, kinesis, config) = (dynamo.clone(), kinesis.clone(), config.clone());
        let (observer, archive, keys) = (observer.clone(), archive.clone(), keys.clone());
        let make = |invoker| {
            Playback::new(dynamo, kinesis, config, invoker)
                .with_observer(observer)
                .with_archive(archive)
                .with_keys(keys)
        };
        let payload = serde_json::to_value(request);
        async move {
            // As long as the function's timeout allows each run; continuations go on in this process.
            let runs = run_playback(make, payload?, deadline_in(Duration::from_secs(900))).await;
            anyhow::Ok(PlaybackSummary::total(&runs.into_iter().collect::<event_store::Result<Vec<_>>>()?))
        }
    });
    let parts = futures::future::join_all(chains).await;
    bar.finish_and_clear();
    let parts = parts.into_iter().collect::<Result<Vec<_>>>()?;
    let total = PlaybackSummary::together(&parts);
    if json_out {
        println!("{}", serde_json::to_string_pretty(&total)?);
    } else {
        print_summary(&total, parts.len());
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
