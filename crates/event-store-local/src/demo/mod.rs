//! `make demo`: the main job end to end on one machine. Starts the stack,
//! sends pixel hits over HTTP, waits until pump and scan have moved them all
//! into the event table, plays the window back, reads the playback stream
//! and checks that every event came back, in time order per partition key.
//! A subscription created before the first hit (4 partitions, a Kinesis
//! target) must have delivered every event too, in order per key. Entity
//! streams appended over `/streams` first (the Todo flow, the Counter, a few
//! accounts) must come back in both, each stream in version order. Two
//! projections made at the start (the entity streams' state, the hits per
//! page) must hold exactly what was sent, read back over `/views`.

mod check;
mod delivered;
mod hits;
mod report;
mod steps;
mod stored;
mod views;
mod watermark;

use std::time::{Duration, Instant};

use anyhow::Result;
use event_store::archive::audit::Verified;
use event_store::archiver::ArchiveSummary;

use crate::probes::Probes;
use crate::settings::Settings;
use report::Report;
use steps::{Delivered, Entities, Load, Played, Stored};

pub(crate) use hits::{run_of, send_hits};
pub use report::print;

/// How long to wait for the pipeline to store everything before calling the rest lost.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What the demo's steps found, for the report.
struct Outcome {
    entities: Entities,
    load: Load,
    stored: Stored,
    archived: ArchiveSummary,
    played: Played,
    verified: Verified,
    delivered: Delivered,
    views: views::ViewsReport,
}

/// `rate`: pixel hits a second at most (none: as fast as `concurrency` allows).
pub async fn run(
    settings: Settings,
    events: usize,
    concurrency: usize,
    rate: Option<f64>,
    probes: Probes,
) -> Result<Report> {
    let started = Instant::now();
    let demo = steps::start(settings).await?;
    let entities = steps::append_entity_streams(&demo).await?;
    let load = steps::send_pixel_hits(&demo, events, (concurrency, rate)).await;
    let stored = steps::wait_for_the_event_table(&demo, &entities, &load).await?;
    steps::wait_for_the_subscription(&demo, &stored).await?;
    let views = steps::check_the_views(&demo, &entities, &load).await?;
    let archived = steps::archive_first_half(&demo, &stored).await?;
    let played = steps::play_back(&demo).await?;
    let verified = steps::verify_the_archive(&demo, played.window_end).await?;
    let delivered = steps::read_back(&demo, &stored).await?;
    let idle = steps::idle_probes(&demo, probes).await?;
    let stack = steps::stop(demo).await?;
    let outcome = Outcome { entities, load, stored, archived, played, verified, delivered, views };
    Ok(Report::of(&outcome, idle, &stack, started))
}
