//! Reading streams the way Lambda's Kinesis event source mapping does:
//! every shard polled once a second, batches of the template's batch size
//! delivered to `pump` once full or once the template's batching window has
//! passed, records named in `batch_item_failures` delivered again, a
//! checkpoint per shard (in memory: a restarted stack re-reads from the
//! start of the stream, which the idempotent pump absorbs).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aws_sdk_kinesis::types::{Record, ShardIteratorType};
use event_store::batch::Backoff;
use event_store::pump::Pump;
use event_store_emulator::event_source::{done_before_first_failure, kinesis_event};
use tokio::sync::watch;
use tracing::warn;

use crate::stats::Stats;

/// How often Lambda's event source mapping polls a shard (its base rate: once a second).
const POLL: Duration = Duration::from_secs(1);

/// One shard, read from its start, surviving expired iterators and throttling.
pub struct ShardReader {
    kinesis: aws_sdk_kinesis::Client,
    stream: String,
    pub shard_id: String,
    iterator: Option<String>,
    last_sequence: Option<String>,
}

impl ShardReader {
    pub fn new(kinesis: aws_sdk_kinesis::Client, stream: &str, shard_id: &str) -> Self {
        Self { kinesis, stream: stream.to_owned(), shard_id: shard_id.to_owned(), iterator: None, last_sequence: None }
    }

    /// The next records (possibly none).
    pub async fn next(&mut self) -> Result<Vec<Record>> {
        let iterator = match self.iterator.take() {
            Some(it) => it,
            None => self.fresh_iterator().await?,
        };
        let out = self.kinesis.get_records().shard_iterator(iterator).limit(10_000).send().await;
        match out {
            Ok(out) => {
                self.iterator = out.next_shard_iterator().map(str::to_owned);
                if let Some(last) = out.records().last() {
                    self.last_sequence = Some(last.sequence_number().to_owned());
                }
                Ok(out.records().to_vec())
            }
            Err(err) => {
                // Expired iterator or throttling: start again after the last record read.
                Err(anyhow::Error::new(err).context(format!("GetRecords on {}", self.shard_id)))
            }
        }
    }

    async fn fresh_iterator(&self) -> Result<String> {
        let request = self.kinesis.get_shard_iterator().stream_name(&self.stream).shard_id(&self.shard_id);
        let request = match &self.last_sequence {
            Some(seq) => {
                request.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(seq)
            }
            None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        let out = request.send().await.context("GetShardIterator")?;
        out.shard_iterator().map(str::to_owned).context("no shard iterator")
    }
}

pub async fn shard_ids(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> Result<Vec<String>> {
    let out = kinesis.list_shards().stream_name(stream).send().await.with_context(|| format!("ListShards {stream}"))?;
    Ok(out.shards().iter().map(|s| s.shard_id().to_owned()).collect())
}

pub async fn stream_arn(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> Result<String> {
    let out = kinesis.describe_stream_summary().stream_name(stream).send().await.context("DescribeStreamSummary")?;
    Ok(out.stream_description_summary().context("no stream summary")?.stream_arn().to_owned())
}

/// How the event source mapping batches: the template's `BatchSize` and `MaximumBatchingWindowInSeconds`.
#[derive(Debug, Clone, Copy)]
pub struct Batching {
    pub size: usize,
    pub window: Duration,
}

/// Feeds one shard of the event stream to `pump` until shutdown: a read a
/// second; the pump invoked with a full batch at once, or with what there is
/// once the batching window has passed since the first of it was read; a
/// full batch is followed by the next read at once (a shard behind catches up).
pub async fn feed_pump(
    mut reader: ShardReader,
    arn: String,
    region: String,
    pump: Arc<Pump>,
    batching: Batching,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) {
    let backoff = Backoff::default();
    let mut pending: VecDeque<Record> = VecDeque::new();
    // When the oldest pending record was read: the batching window runs from it.
    let mut gathering_since: Option<Instant> = None;
    let mut retry = 0;
    while !*shutdown.borrow() {
        let polled = Instant::now();
        if pending.len() < batching.size {
            match reader.next().await {
                Ok(records) => pending.extend(records),
                Err(err) => warn!(error = format!("{err:#}"), "event stream read failed; retrying"),
            }
        }
        if !pending.is_empty() {
            gathering_since.get_or_insert(polled);
        }
        let due = pending.len() >= batching.size || gathering_since.is_some_and(|t| t.elapsed() >= batching.window);
        if !due {
            tokio::select! {
                _ = tokio::time::sleep(POLL.saturating_sub(polled.elapsed())) => {}
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let batch: Vec<Record> = pending.iter().take(batching.size).cloned().collect();
        let response = pump.handle(kinesis_event(&arn, &reader.shard_id, &region, &batch)).await;
        let sequences: Vec<&str> = batch.iter().map(|r| r.sequence_number()).collect();
        let done = done_before_first_failure(&sequences, &response);
        pending.drain(..done);
        gathering_since = (!pending.is_empty()).then_some(polled);
        stats.add_buffered(done as u64);
        if done < batch.len() {
            warn!(shard = reader.shard_id, failed = batch.len() - done, "redelivering from the first failed record");
            backoff.wait(retry).await;
            retry += 1;
            continue;
        }
        retry = 0;
        if batch.len() < batching.size {
            tokio::select! {
                _ = tokio::time::sleep(POLL.saturating_sub(polled.elapsed())) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

/// Counts what arrives on one shard of the playback stream, for the status line.
pub async fn count_records(mut reader: ShardReader, stats: Arc<Stats>, mut shutdown: watch::Receiver<bool>) {
    while !*shutdown.borrow() {
        let n = match reader.next().await {
            Ok(records) => records.len(),
            Err(err) => {
                warn!(error = format!("{err:#}"), "playback stream read failed; retrying");
                0
            }
        };
        stats.played_back.fetch_add(n as u64, Ordering::Relaxed);
        if n == 0 {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}
