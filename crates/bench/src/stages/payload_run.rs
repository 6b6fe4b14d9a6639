//! One payload size's run: its clients and tables, each stage timed against its raw loop, units used.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use aws_lambda_events::event::kinesis::KinesisEvent;
use event_store::bookkeeping::shard_position;
use event_store::chunk::ChunkEvent;
use event_store::config::{PlaybackConfig, PumpConfig, ScanConfig, SubscriptionConfig};
use event_store::playback::Playback;
use event_store::pump::Pump;
use event_store::subscription::Subscriptions;
use event_store::time::format_ms;
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_streams, create_tables, Names};
use event_store_emulator::runs::{self, deadline_in, run_scan, run_subscriptions};
use futures::StreamExt;

use super::{Item, StageResult};
use crate::measure::{per_second, CONCURRENCY, STREAM_SHARDS, USD_PER_MILLION_RRU, USD_PER_MILLION_WRU};
use crate::raw;
use crate::units::{pack_mb_per_second, stored_bytes, uncompressed_write_units, Capacity};

/// Alternating rounds of pump and its raw loop (the best of each is kept).
const PUMP_ROUNDS: usize = 3;

/// One payload size's clients, tables and the stages measured so far.
pub(super) struct PayloadRun {
    counter: RequestCounter,
    /// The stages' clients, seen by the request counter.
    dynamo: aws_sdk_dynamodb::Client,
    kinesis: aws_sdk_kinesis::Client,
    /// The raw loops go through clients that the request counter does not see.
    plain: aws_sdk_dynamodb::Client,
    plain_kinesis: aws_sdk_kinesis::Client,
    /// The stages' tables and streams, and the raw loops' own.
    names: Names,
    raw: Names,
    events: usize,
    /// A week ago: complete as soon as the scan has passed.
    pub(super) t0: i64,
    pub(super) stages: Vec<StageResult>,
    /// Capacity units by operation, summed over the stages.
    units: BTreeMap<String, f64>,
}

impl PayloadRun {
    /// The clients, and the tables and streams of the stages and of the raw loops.
    pub(super) async fn start(
        dynamo_sdk: &aws_config::SdkConfig,
        kinesis_sdk: &aws_config::SdkConfig,
        events: usize,
        size: usize,
    ) -> Result<Self> {
        let counter = RequestCounter::default();
        let dynamo = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(dynamo_sdk).interceptor(counter.clone()).build(),
        );
        let kinesis = aws_sdk_kinesis::Client::from_conf(
            aws_sdk_kinesis::config::Builder::from(kinesis_sdk).interceptor(counter.clone()).build(),
        );
        let t0 = (event_store::time::now_ms() - 7 * 86_400_000) / 60_000 * 60_000;
        let names = Names::for_stack(&format!("bench-{size}"));
        let raw = Names::for_stack(&format!("bench-raw-{size}"));
        for n in [&names, &raw] {
            create_tables(&dynamo, n).await?;
            create_streams(&kinesis, n, STREAM_SHARDS).await?;
        }
        let plain = aws_sdk_dynamodb::Client::new(dynamo_sdk);
        let plain_kinesis = aws_sdk_kinesis::Client::new(kinesis_sdk);
        Ok(Self {
            counter,
            dynamo,
            kinesis,
            plain,
            plain_kinesis,
            names,
            raw,
            events,
            t0,
            stages: Vec::new(),
            units: BTreeMap::new(),
        })
    }

    /// Records a stage against its raw loop: the counter's capacity units
    /// added to the run's, its requests per event, and the counter reset.
    fn stage(&mut self, name: &'static str, eps: f64, baseline: &'static str, raw: f64) {
        for (op, n) in self.counter.capacity() {
            *self.units.entry(op).or_default() += n;
        }
        self.stages.push(StageResult {
            stage: name,
            events_per_second: eps,
            raw_baseline: baseline,
            raw_events_per_second: raw,
            ratio_to_raw: eps / raw,
            requests_per_event: per_event(&self.counter, self.events),
        });
        self.counter.reset();
    }

    /// pump, and its raw loop, in alternating rounds: the best of each, so a
    /// moment of noise on the shared machine does not decide the ratio.
    /// Pump writes are idempotent, so a round overwrites the previous one's items
    /// (once the shard positions are forgotten).
    pub(super) async fn pump(&mut self, batches: &[KinesisEvent], buffer_items: &[Item]) -> Result<()> {
        let events = self.events;
        let pump_config = PumpConfig::new(self.names.buffer_table.clone(), self.names.event_table.clone());
        let pump = Pump::new(self.dynamo.clone(), self.kinesis.clone(), pump_config);
        let (mut raw_pump, mut pumped) = (0.0f64, 0.0f64);
        for _ in 0..PUMP_ROUNDS {
            let started = Instant::now();
            raw::put_items(&self.plain, &self.raw.buffer_table, buffer_items.to_vec()).await?;
            raw_pump = raw_pump.max(per_second(events, started.elapsed()));
            // A new round must write again, not skip what the shard positions say is buffered.
            shard_position::forget_all(&self.plain, &self.names.event_table).await?;
            self.counter.reset();
            let started = Instant::now();
            let failures: usize = futures::stream::iter(batches.to_vec())
                .map(|batch| pump.handle(batch))
                .buffer_unordered(CONCURRENCY)
                .map(|response| response.batch_item_failures.len())
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .sum();
            anyhow::ensure!(failures == 0, "pump failed {failures} records");
            pumped = pumped.max(per_second(events, started.elapsed()));
        }
        self.stage("pump", pumped, "BatchWriteItem of the same items", raw_pump);
        Ok(())
    }

    /// The raw loops of the scan's and playback's work, on the raw tables: their events/s.
    pub(super) async fn raw_scan_and_playback(&self, now: i64, slots: Vec<i64>) -> Result<(f64, f64)> {
        let raw = &self.raw;
        let raw_scan = raw::scan(&self.plain, &raw.buffer_table, &raw.event_table, now).await?;
        let raw_playback =
            raw::playback(&self.plain, &self.plain_kinesis, &raw.event_table, &raw.playback_stream, slots).await?;
        self.counter.reset();
        Ok((raw_scan, raw_playback))
    }

    /// scan: one scheduled run and its forks.
    pub(super) async fn scan(&mut self, raw_scan: f64) -> Result<()> {
        let events = self.events;
        let config = ScanConfig { deadline_margin: Duration::from_secs(30), ..runs::scan_config(&self.names) };
        let started = Instant::now();
        let moved: usize = run_scan(
            self.dynamo.clone(),
            self.kinesis.clone(),
            config,
            serde_json::json!({}),
            deadline_in(Duration::from_secs(900)),
        )
        .await
        .into_iter()
        .map(|run| run.map(|s| s.moved).unwrap_or(0))
        .sum();
        anyhow::ensure!(moved == events, "scan moved {moved} of {events}");
        self.stage("scan", per_second(events, started.elapsed()), "Scan + puts + deletes of the same items", raw_scan);
        Ok(())
    }

    /// playback: the whole window. Its events/s, and its Kinesis records per played event.
    pub(super) async fn playback(&mut self, raw_playback: f64) -> Result<(f64, f64)> {
        let (events, t0) = (self.events, self.t0);
        let config = PlaybackConfig { deadline_margin: Duration::from_secs(30), ..runs::playback_config(&self.names) };
        let (invoker, _rx) = LocalInvoker::channel();
        let playback = Playback::new(self.dynamo.clone(), self.kinesis.clone(), config, Arc::new(invoker));
        let window =
            serde_json::json!({"start": format_ms(t0), "end": format_ms(t0 + events as i64 + 1), "restart": true});
        let started = Instant::now();
        let summary = playback.handle(window, SystemTime::now() + Duration::from_secs(900)).await?;
        anyhow::ensure!(summary.events == events, "playback played {} of {events}", summary.events);
        let started_playback_elapsed = started.elapsed();
        let playback_records_per_event = summary.kinesis_records as f64 / events as f64;
        self.stage(
            "playback",
            per_second(events, started_playback_elapsed),
            "Query + PutRecords of the same records",
            raw_playback,
        );
        Ok((per_second(events, started_playback_elapsed), playback_records_per_event))
    }

    /// subscription: a one-partition subscription from the window's start catches up over the same
    /// events onto a Kinesis target (the same put path as playback), in one tick and its runner.
    /// Its events/s; its capacity units are not the stages'.
    pub(super) async fn subscription(&mut self, dynamo_sdk: &aws_config::SdkConfig, raw_playback: f64) -> Result<f64> {
        let events = self.events;
        self.counter.reset();
        let sub_config =
            SubscriptionConfig { deadline_margin: Duration::from_secs(30), ..runs::subscription_config(&self.names) };
        let subscriptions = Subscriptions::new(
            self.dynamo.clone(),
            self.kinesis.clone(),
            aws_sdk_lambda::Client::new(dynamo_sdk),
            sub_config.clone(),
            Arc::new(LocalInvoker::channel().0),
        );
        let (t0, target) = (self.t0, &self.names.subscription_stream);
        let create = serde_json::json!({
            "action": "create", "name": "bench", "start": format_ms(t0), "target": {"kinesis": target}
        });
        subscriptions.handle(create, SystemTime::now() + Duration::from_secs(60)).await?;
        self.counter.reset();
        let (d, k, l) = (self.dynamo.clone(), self.kinesis.clone(), aws_sdk_lambda::Client::new(dynamo_sdk));
        let make = move |invoker| Subscriptions::new(d, k, l, sub_config, invoker);
        let started = Instant::now();
        let delivered: u64 = run_subscriptions(make, serde_json::json!({}), deadline_in(Duration::from_secs(900)))
            .await
            .into_iter()
            .map(|answer| answer.map(|a| a["delivered"].as_u64().unwrap_or(0)).unwrap_or(0))
            .sum();
        let subscription_eps = per_second(events, started.elapsed());
        anyhow::ensure!(delivered == events as u64, "the subscription delivered {delivered} of {events}");
        let subscription = StageResult {
            stage: "subscription",
            events_per_second: subscription_eps,
            raw_baseline: "Query + PutRecords of the same records",
            raw_events_per_second: raw_playback,
            ratio_to_raw: subscription_eps / raw_playback,
            requests_per_event: per_event(&self.counter, events),
        };
        self.stages.push(subscription);
        Ok(subscription_eps)
    }

    /// Capacity units per event through pump, scan and playback, what they
    /// cost, and the bytes stored and packed per event.
    pub(super) async fn capacity(
        &self,
        size: usize,
        records: &[(usize, Vec<u8>)],
        batch_events: &[Vec<ChunkEvent>],
    ) -> Result<Capacity> {
        let events = self.events;
        let units = &self.units;
        let per_event = |n: f64| n / events as f64;
        let writes: f64 = ["DynamoDB.BatchWriteItem", "DynamoDB.UpdateItem", "DynamoDB.PutItem"]
            .iter()
            .filter_map(|op| units.get(*op))
            .sum();
        let reads: f64 =
            ["DynamoDB.Scan", "DynamoDB.Query", "DynamoDB.GetItem"].iter().filter_map(|op| units.get(*op)).sum();
        Ok(Capacity {
            events,
            units_per_event: units.iter().map(|(op, n)| (op.clone(), per_event(*n))).collect(),
            write_units_per_event: per_event(writes),
            read_units_per_event: per_event(reads),
            uncompressed_write_units_per_event: uncompressed_write_units(events, size, self.t0)?,
            usd_per_million_events: per_event(writes) * USD_PER_MILLION_WRU + per_event(reads) * USD_PER_MILLION_RRU,
            stored_bytes_per_event: per_event(stored_bytes(&self.plain, &self.names.event_table).await? as f64),
            raw_bytes_per_event: per_event(records.iter().map(|(_, data)| data.len()).sum::<usize>() as f64),
            pack_mb_per_second: pack_mb_per_second(batch_events)?,
        })
    }
}

fn per_event(counter: &RequestCounter, events: usize) -> BTreeMap<String, f64> {
    counter.snapshot().into_iter().map(|(op, n)| (op, n as f64 / events as f64)).collect()
}
