//! The sections of a run as `main` dispatches them: each one `BENCH_ONLY` selects alone, or all in turn.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use event_store_emulator::{moto_server, Emulator};

use crate::cold_start::{self, COLD_STARTS};
use crate::results::{self, archive_json, encryption_json};
use crate::{archive, delivery, entity, latency, privacy, projection, stages, trace_cost};

/// What every section is given: the repository, the bench's moto and its
/// SDK config, events per payload size, and the date and machine the
/// results name.
pub(crate) struct Run<'a> {
    pub(crate) root: &'a Path,
    pub(crate) sdk: &'a aws_config::SdkConfig,
    pub(crate) emulator: &'a Emulator,
    pub(crate) events: usize,
    pub(crate) date: &'a str,
    pub(crate) machine: &'a str,
}

impl Run<'_> {
    /// bench/, where the results go.
    pub(crate) fn dir(&self) -> PathBuf {
        self.root.join("bench")
    }
}

/// `BENCH_ONLY=privacy`: per-subject encryption alone.
pub(crate) async fn only_privacy(run: &Run<'_>) -> Result<()> {
    let (sealed, _) = privacy_section(run).await?;
    let encryption = encryption_json(&sealed, run.date, run.machine);
    results::replace_in_results(&run.dir().join("results.json"), vec![("encryption", encryption)])?;
    println!(
        "wrote bench/privacy.md and results.json's encryption (BENCH_ONLY=privacy: the other stages were not run)"
    );
    Ok(())
}

/// `BENCH_ONLY=latency`: latency as deployed alone, then docs/capacity.md.
pub(crate) async fn only_latency(run: &Run<'_>) -> Result<()> {
    let (latency, subscription, md) = latency::run(run.root, run.emulator, (run.date, run.machine)).await?;
    std::fs::write(run.dir().join("latency.md"), &md)?;
    // The other figures stay as the last full run left them; these are this run's.
    let parts = vec![("latency", latency), ("subscription", subscription)];
    results::replace_in_results(&run.dir().join("results.json"), parts)?;
    println!("wrote bench/latency.md and results.json's latency and subscription (BENCH_ONLY=latency)");
    results::write_capacity(run.root)
}

/// `BENCH_ONLY=archive`: the cold tier alone, then docs/capacity.md.
pub(crate) async fn only_archive(run: &Run<'_>) -> Result<()> {
    let (archived, _) = archive_section(run).await?;
    // The other figures stay as the last full run left them; `archive` is this run's.
    let archive = archive_json(&archived, run.date, run.machine);
    results::replace_in_results(&run.dir().join("results.json"), vec![("archive", archive)])?;
    println!("wrote bench/archive.md and results.json's archive (BENCH_ONLY=archive: the other stages were not run)");
    results::write_capacity(run.root)
}

/// `BENCH_ONLY=delivery`: delivery's reads by partitions alone (bench/delivery.md, results.json's `delivery`).
pub(crate) async fn only_delivery(run: &Run<'_>) -> Result<()> {
    let delivery = delivery_section(run).await?;
    results::replace_in_results(&run.dir().join("results.json"), vec![("delivery", delivery)])?;
    println!(
        "wrote bench/delivery.md and results.json's delivery (BENCH_ONLY=delivery: the other stages were not run)"
    );
    Ok(())
}

/// Delivery's figures on a dynalite of their own (bench/delivery.md).
async fn delivery_section(run: &Run<'_>) -> Result<serde_json::Value> {
    println!("== delivery: write units by slice count, read units per delivered event by partitions");
    let (json, md) = delivery::run(run.root, run.sdk).await?;
    std::fs::write(run.dir().join("delivery.md"), format!("# Delivery ({}, {})\n{md}", run.date, run.machine))?;
    Ok(serde_json::json!({ "date": run.date, "machine": run.machine, "figures": json }))
}

/// `BENCH_ONLY=projection`: projections' figures alone (bench/projection.md, results.json's `projection`).
pub(crate) async fn only_projection(run: &Run<'_>) -> Result<()> {
    let projection = projection_section(run).await?;
    results::replace_in_results(&run.dir().join("results.json"), vec![("projection", projection)])?;
    println!(
        "wrote bench/projection.md and results.json's projection (BENCH_ONLY=projection: the other stages were not run)"
    );
    Ok(())
}

/// `BENCH_ONLY=trace`: what the trace context costs where it is stored (bench/trace.md).
pub(crate) fn only_trace(run: &Run<'_>) -> Result<()> {
    let trace = trace_section(run)?;
    results::replace_in_results(&run.dir().join("results.json"), vec![("trace", trace)])?;
    println!("wrote bench/trace.md and results.json's trace (BENCH_ONLY=trace: the other stages were not run)");
    Ok(())
}

fn trace_section(run: &Run<'_>) -> Result<serde_json::Value> {
    println!("== trace context: the bytes and write units an event's traceparent adds, as stored");
    let (json, md) = trace_cost::run()?;
    std::fs::write(run.dir().join("trace.md"), format!("# Trace context ({}, {})\n{md}", run.date, run.machine))?;
    Ok(serde_json::json!({ "date": run.date, "machine": run.machine, "figures": json }))
}

/// Projections' figures on a moto of their own (bench/projection.md).
async fn projection_section(run: &Run<'_>) -> Result<serde_json::Value> {
    println!("== projections: a count projection against a subscription, a rebuild's read side from each tier");
    let (json, md) = projection::run(run.root, run.sdk).await?;
    std::fs::write(run.dir().join("projection.md"), format!("# Projections ({}, {})\n{md}", run.date, run.machine))?;
    Ok(serde_json::json!({ "date": run.date, "machine": run.machine, "figures": json }))
}

/// `BENCH_ONLY=entity`: the entity streams alone (bench/entity.md).
pub(crate) async fn only_entity(run: &Run<'_>) -> Result<()> {
    let (entity, _) = entity_section(run).await?;
    // The other figures stay as the last full run left them; `entity` is this run's.
    results::replace_in_results(&run.dir().join("results.json"), vec![("entity", serde_json::to_value(&entity)?)])?;
    println!("wrote bench/entity.md and results.json's entity (BENCH_ONLY=entity: the other stages were not run)");
    Ok(())
}

/// The full run: entity streams, the cold tier, per-subject encryption, the
/// stages per payload size, latency and cold starts; then results.json,
/// results.md and docs/capacity.md.
pub(crate) async fn full(run: &Run<'_>) -> Result<()> {
    let (date, machine) = (run.date, run.machine);
    let (entity, entity_md) = entity_section(run).await?;
    let (archived, archive_md) = archive_section(run).await?;
    let (sealed, privacy_md) = privacy_section(run).await?;
    let payloads = stages::every_size(run.root, run.sdk, run.events).await?;
    let (latency, subscription, latency_md) = latency::run(run.root, run.emulator, (date, machine)).await?;
    std::fs::write(run.dir().join("latency.md"), &latency_md)?;
    let cold = cold_starts_section(run).await?;
    let delivery = delivery_section(run).await?;
    let projection = projection_section(run).await?;
    let trace = trace_section(run)?;
    let bootstraps: BTreeMap<&str, u64> = results::bootstrap_sizes().into_iter().collect();
    let json = serde_json::json!({
        "date": date, "machine": machine, "results": payloads, "arm64_bootstrap_bytes": bootstraps,
        "latency": latency, "subscription": subscription, "cold_starts": cold, "entity": entity,
        "archive": archive_json(&archived, date, machine),
        "encryption": encryption_json(&sealed, date, machine),
        "delivery": delivery,
        "projection": projection,
        "trace": trace,
    });
    std::fs::write(run.dir().join("results.json"), serde_json::to_string_pretty(&json)?)?;
    let mut md = results::markdown(&payloads, machine, date);
    let cold_md = cold_start::markdown(&cold);
    for part in [&latency_md, &cold_md, &entity_md, &archive_md, &privacy_md] {
        md.push_str(part);
    }
    std::fs::write(run.dir().join("results.md"), md)?;
    println!("wrote bench/results.md and bench/results.json");
    results::write_capacity(run.root)
}

/// The entity streams first, on a moto of their own (moto copies a table per
/// transaction): bench/entity.md, and its part of the results.
async fn entity_section(run: &Run<'_>) -> Result<(entity::EntityFigures, String)> {
    println!("== entity streams: appends across {} streams vs the raw transaction loop, loads, one hot stream", 100);
    let entity_emulator = Emulator::start_on_free_port(&moto_server(run.root))?;
    let entity_sdk = run.sdk.to_builder().endpoint_url(&entity_emulator.endpoint).build();
    let entity = entity::run(&entity_sdk, &entity_emulator.endpoint).await?;
    drop(entity_emulator);
    let entity_md = entity::markdown(&entity, run.date, run.machine);
    print!("{entity_md}");
    std::fs::write(run.dir().join("entity.md"), &entity_md)?;
    Ok((entity, entity_md))
}

/// The cold tier's figures on a moto of their own (bench/archive.md, and its part of the results).
async fn archive_section(run: &Run<'_>) -> Result<(archive::ArchiveBench, String)> {
    println!("== cold tier: a window replayed from DynamoDB and from the archive, archiving, storage cost");
    let emulator = Emulator::start_on_free_port(&moto_server(run.root))?;
    let archive_sdk = run.sdk.to_builder().endpoint_url(&emulator.endpoint).build();
    let archived = archive::run(&archive_sdk, run.events, 1024).await?;
    let md = archive::markdown(&archived, run.date, run.machine);
    print!("{md}");
    std::fs::write(run.root.join("bench/archive.md"), &md)?;
    Ok((archived, md))
}

/// Per-subject encryption's figures on a moto of their own (bench/privacy.md, and its part of the results).
async fn privacy_section(run: &Run<'_>) -> Result<(privacy::PrivacyBench, String)> {
    println!("== per-subject encryption: load, pump and playback with every event sealed and with none");
    let emulator = Emulator::start_on_free_port(&moto_server(run.root))?;
    let privacy_sdk = run.sdk.to_builder().endpoint_url(&emulator.endpoint).build();
    let sealed = privacy::run(run.root, &privacy_sdk, run.events, 1024).await?;
    let md = privacy::markdown(&sealed, run.date, run.machine);
    print!("{md}");
    std::fs::write(run.root.join("bench/privacy.md"), &md)?;
    Ok((sealed, md))
}

/// Each release binary's cold start on the bench's moto, printed as measured.
async fn cold_starts_section(run: &Run<'_>) -> Result<Vec<(&'static str, cold_start::ColdStart)>> {
    println!("== cold starts of the x86_64 release binaries under a Lambda runtime API ({COLD_STARTS} each)");
    let cold = cold_start::cold_starts(run.root, run.sdk, &run.emulator.endpoint).await?;
    for (name, c) in &cold {
        println!(
            "   {name:<9} init {:.1} ms, first response {:.1} ms, peak RSS {:.1} MB ({})",
            c.init_ms, c.first_response_ms, c.peak_rss_mb, c.outcome
        );
    }
    Ok(cold)
}
