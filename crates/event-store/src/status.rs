//! A store's health at a glance (`event-store status`): what the stages
//! already record, read back and judged. Nothing here writes.
//!
//! - the watermark (the complete end of the log) and how far it is behind now;
//! - events moved per minute over the last hour (the scan's ingest count);
//! - per event-stream shard, where the pump stands and the arrival of the
//!   oldest record it has not buffered yet (the scan's own probe);
//! - the quarantine, late events, every subscription's lag, stopped
//!   partitions and parked events, playback runs in progress;
//! - the depth of each dead-letter and failure queue;
//! - a verdict: `healthy`, or each thing that is stalled and since when
//!   ([`verdict`], pure, so its rules are tested without a network).

use aws_sdk_dynamodb::types::{AttributeValue, Select};
use aws_sdk_sqs::types::QueueAttributeName;
use serde::Serialize;
use tracing::warn;

use crate::bookkeeping::frontier::{probe, Probe};
use crate::bookkeeping::{self, ingest, shard_position, watermark};
use crate::error::{Error, Result};
use crate::event_item::{HASH_KEY, QUARANTINE_SLOT, RANGE_KEY};
use crate::kinesis::list_shards;
use crate::readers::playbacks::Stored;
use crate::readers::subscriptions::{self, PartitionStatus};
use crate::time::{format_ms, slot_of};

/// Where a store's parts are (from a stack's outputs, or the local names).
#[derive(Debug, Clone, Default)]
pub struct Resources {
    pub event_table: String,
    pub event_stream: String,
    /// Dead-letter and failure queues: (what it holds, URL).
    pub queues: Vec<(String, String)>,
}

/// The clients `gather` reads with.
#[derive(Debug, Clone)]
pub struct Clients {
    pub dynamo: aws_sdk_dynamodb::Client,
    pub kinesis: aws_sdk_kinesis::Client,
    pub sqs: aws_sdk_sqs::Client,
}

/// When something counts as stalled.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The watermark further behind now than this.
    pub watermark_lag_ms: i64,
    /// The pump's oldest unbuffered record older than this.
    pub pump_behind_ms: i64,
    /// A subscription partition further behind the complete end than this.
    pub subscription_lag_ms: i64,
}

impl Default for Limits {
    /// Five minutes: the scan runs every minute in AWS, so a healthy watermark
    /// is one or two minutes behind; an iterator age alarm fires at one minute.
    fn default() -> Self {
        Self { watermark_lag_ms: 300_000, pump_behind_ms: 60_000, subscription_lag_ms: 300_000 }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Status {
    /// When it was read (ISO 8601).
    pub at: String,
    /// Every event that arrived before it is in the event table.
    pub watermark: Option<String>,
    /// Now less the watermark (ms).
    pub watermark_lag_ms: Option<i64>,
    /// Events moved after the watermark had passed their arrival.
    pub late: u64,
    /// Buffer items that could not become events (slot -1).
    pub quarantined: u64,
    /// Events moved into the event table per minute of arrival, the last
    /// [`INGEST_MINUTES`] minutes, oldest first (the current minute last).
    pub ingest_per_minute: Vec<u64>,
    pub shards: Vec<ShardStatus>,
    pub subscriptions: Vec<SubscriptionLine>,
    pub playbacks: Vec<PlaybackRun>,
    pub queues: Vec<QueueDepth>,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ShardStatus {
    pub shard: String,
    /// The arrival of the last record the pump buffered.
    pub pumped_to: Option<String>,
    /// The arrival of the first record it has not buffered yet (none: caught up).
    pub oldest_unbuffered: Option<String>,
    /// Now less that arrival (ms); 0 when caught up.
    pub behind_ms: i64,
    /// Kinesis answered empty short of the tip: where the pump stands is unknown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unknown: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SubscriptionLine {
    pub name: String,
    pub state: String,
    /// The largest partition lag behind the complete end (ms).
    pub lag_ms: Option<i64>,
    pub delivered: u64,
    pub parked: usize,
    pub partitions: Vec<PartitionStatus>,
    /// The busiest partition against the mean (a hot key), when more than one delivered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skew: Option<crate::readers::subscriptions::status::Skew>,
    /// The partition count a rescale under way goes to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rescaling_to: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PlaybackRun {
    pub id: String,
    pub start: String,
    pub end: String,
    /// Where it stands (the start of the slot it reads).
    pub position: String,
    pub events: u64,
    /// Share of the window behind the position, 0 to 1.
    pub progress: f64,
    /// A run holds its lease now (else it waits to be resumed).
    pub running: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueueDepth {
    pub name: String,
    pub url: String,
    /// Visible and in flight (`ApproximateNumberOfMessages` + `…NotVisible`).
    pub messages: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Verdict {
    pub healthy: bool,
    /// What is stalled or needs a hand, and since when; empty when healthy.
    pub problems: Vec<String>,
}

/// Judges a status: every stall past `limits`, every message waiting in a
/// queue, every stopped partition and parked or quarantined event.
pub(crate) fn verdict(status: &Status, limits: &Limits) -> Verdict {
    let mut problems = Vec::new();
    let since = |ms: i64| format!("{} behind now", human_ms(ms));
    match (status.watermark.as_deref(), status.watermark_lag_ms) {
        (None, _) => problems.push("no watermark yet: the scan has not finished a pass of every segment".into()),
        (Some(at), Some(lag)) if lag > limits.watermark_lag_ms => {
            problems.push(format!("watermark stalled at {at} ({})", since(lag)))
        }
        _ => {}
    }
    for shard in &status.shards {
        if shard.unknown {
            problems
                .push(format!("pump position on {} unknown (Kinesis answered empty short of the tip)", shard.shard));
        } else if shard.behind_ms > limits.pump_behind_ms {
            let from = shard.oldest_unbuffered.as_deref().unwrap_or("?");
            problems.push(format!(
                "pump behind on {}: records from {from} not buffered ({})",
                shard.shard,
                since(shard.behind_ms)
            ));
        }
    }
    for sub in &status.subscriptions {
        for p in &sub.partitions {
            if let Some(reason) = &p.stopped {
                problems.push(format!(
                    "subscription {} partition {} stopped at {}: {reason}",
                    sub.name, p.partition, p.position
                ));
            } else if let Some(reason) = &p.waiting {
                problems.push(format!(
                    "subscription {} partition {} waits at {}: {reason}",
                    sub.name, p.partition, p.position
                ));
            } else if sub.state == "active" && p.lag_ms.is_some_and(|lag| lag > limits.subscription_lag_ms) {
                let lag = p.lag_ms.unwrap_or_default();
                problems.push(format!(
                    "subscription {} partition {} lagging at {} ({} behind the complete end)",
                    sub.name,
                    p.partition,
                    p.position,
                    human_ms(lag)
                ));
            }
        }
        if sub.parked > 0 {
            problems.push(format!(
                "subscription {}: {} (re-deliver them)",
                sub.name,
                count(sub.parked as u64, "parked event")
            ));
        }
    }
    for queue in status.queues.iter().filter(|q| q.messages > 0) {
        problems.push(format!("{} in the {} ({})", count(queue.messages, "message"), queue.name, queue.url));
    }
    if status.quarantined > 0 {
        problems.push(format!("{} quarantined (slot -1)", count(status.quarantined, "item")));
    }
    Verdict { healthy: problems.is_empty(), problems }
}

/// `1 message`, `3 messages`.
fn count(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `83 s`, `12 min`, `3.5 h`, `2.1 d`.
pub fn human_ms(ms: i64) -> String {
    let s = ms as f64 / 1000.0;
    match s {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s if s < 172_800.0 => format!("{:.1} h", s / 3600.0),
        s => format!("{:.1} d", s / 86_400.0),
    }
}

/// Minutes of ingest counts `status` shows.
pub const INGEST_MINUTES: usize = 60;

/// Reads everything `status` shows (a few requests per shard, subscription and queue).
pub async fn gather(clients: &Clients, resources: &Resources, limits: &Limits, now: i64) -> Result<Status> {
    let (dynamo, table) = (&clients.dynamo, resources.event_table.as_str());
    let mark = watermark::read(dynamo, table).await?;
    let unit = bookkeeping::settings::time_unit(dynamo, table).await?.unwrap_or(crate::config::DEFAULT_TIME_UNIT_MS);
    let complete_end = mark.complete_end(unit);
    let mut status = Status {
        at: format_ms(now),
        watermark: mark.time.map(format_ms),
        watermark_lag_ms: mark.time.map(|t| (now - t).max(0)),
        late: mark.late,
        quarantined: quarantined(dynamo, table).await?,
        ingest_per_minute: ingest::per_minute(dynamo, table, now, INGEST_MINUTES).await?,
        shards: shards(clients, resources, now).await?,
        playbacks: playbacks(dynamo, table, unit, now).await?,
        queues: queues(&clients.sqs, &resources.queues).await?,
        ..Status::default()
    };
    for line in subscriptions::statuses(dynamo, table, complete_end, unit).await? {
        let sub = &line.subscription;
        let parked = subscriptions::parked(dynamo, table, sub).await?.len();
        status.subscriptions.push(SubscriptionLine {
            name: sub.name.clone(),
            state: serde_json::to_value(sub.state).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
            lag_ms: line.lag_ms,
            delivered: line.partitions.iter().map(|p| p.delivered).sum(),
            parked,
            partitions: line.partitions,
            skew: line.skew,
            rescaling_to: sub.rescale.as_ref().map(|r| r.to),
        });
    }
    status.verdict = verdict(&status, limits);
    Ok(status)
}

async fn quarantined(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<u64> {
    let mut count = 0;
    let mut start = None;
    loop {
        let out = dynamo
            .query()
            .table_name(table)
            .key_condition_expression("#slot = :slot")
            .expression_attribute_names("#slot", HASH_KEY)
            .expression_attribute_values(":slot", AttributeValue::N(QUARANTINE_SLOT.to_string()))
            .select(Select::Count)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        count += out.count().max(0) as u64;
        start = out.last_evaluated_key;
        if start.is_none() {
            return Ok(count);
        }
    }
}

async fn shards(clients: &Clients, resources: &Resources, now: i64) -> Result<Vec<ShardStatus>> {
    let stream = resources.event_stream.as_str();
    let positions = shard_position::read_all(&clients.dynamo, &resources.event_table).await?;
    let mut out = Vec::new();
    for shard in list_shards(&clients.kinesis, stream).await? {
        let position = positions.get(shard.shard_id());
        let probe = probe(&clients.kinesis, stream, &shard, position).await?;
        let oldest = match probe {
            Probe::Record { arrival } => Some(arrival),
            _ => None,
        };
        out.push(ShardStatus {
            shard: shard.shard_id().to_owned(),
            pumped_to: position.map(|p| format_ms(p.arrival)),
            oldest_unbuffered: oldest.map(format_ms),
            behind_ms: oldest.map_or(0, |at| (now - at).max(0)),
            // With a position, the scan bounds the shard by it (a sparse shard often answers empty).
            unknown: probe == Probe::Unknown && position.is_none(),
        });
    }
    Ok(out)
}

async fn playbacks(dynamo: &aws_sdk_dynamodb::Client, table: &str, unit: u64, now: i64) -> Result<Vec<PlaybackRun>> {
    let prefix = crate::readers::playbacks::KEY_PREFIX;
    // Those not taken since they moved are still where they were (`bookkeeping::moving`).
    let mut items = std::collections::BTreeMap::new();
    for family in [bookkeeping::Family::legacy(), bookkeeping::Family::Playbacks] {
        let range = (prefix.to_owned(), format!("{prefix}{}", char::MAX));
        for item in bookkeeping::query_in(dynamo, table, family, range).await?.0 {
            items.insert(item.get(RANGE_KEY).and_then(|v| v.as_s().ok()).cloned().unwrap_or_default(), item);
        }
    }
    let mut runs = Vec::new();
    for item in items.values() {
        let id = item.get(RANGE_KEY).and_then(|v| v.as_s().ok()).and_then(|k| k.strip_prefix(prefix)).unwrap_or("");
        let stored = match Stored::from_item(item) {
            Ok(stored) => stored,
            Err(err) => {
                warn!(error = %err, id, "playback item unreadable: not shown");
                continue;
            }
        };
        let Some(binding) = stored.binding else { continue };
        // A first run that has not saved a checkpoint yet stands at its start.
        let checkpoint = stored.checkpoint.unwrap_or_default();
        if checkpoint.done {
            continue;
        }
        let at = checkpoint.slot.max(slot_of(binding.start, unit));
        let span = (binding.end - binding.start).max(1) as f64;
        runs.push(PlaybackRun {
            id: id.to_owned(),
            start: format_ms(binding.start),
            end: format_ms(binding.end),
            position: format_ms(at),
            events: checkpoint.events,
            progress: ((at - binding.start) as f64 / span).clamp(0.0, 1.0),
            running: stored.lease.is_some_and(|l| l.until > now),
        });
    }
    Ok(runs)
}

async fn queues(sqs: &aws_sdk_sqs::Client, queues: &[(String, String)]) -> Result<Vec<QueueDepth>> {
    let mut out = Vec::new();
    for (name, url) in queues {
        let attributes = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .map_err(|e| Error::Sqs { operation: "GetQueueAttributes", source: Box::new(e) })?;
        let get = |name: QueueAttributeName| -> u64 {
            attributes.attributes().and_then(|map| map.get(&name)).and_then(|v| v.parse().ok()).unwrap_or(0)
        };
        let messages = get(QueueAttributeName::ApproximateNumberOfMessages)
            + get(QueueAttributeName::ApproximateNumberOfMessagesNotVisible);
        out.push(QueueDepth { name: name.clone(), url: url.clone(), messages });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Status {
        Status {
            watermark: Some("2026-11-25T10:00:00Z".into()),
            watermark_lag_ms: Some(70_000),
            shards: vec![ShardStatus { shard: "shardId-0".into(), ..Default::default() }],
            queues: vec![QueueDepth { name: "pump dead-letter queue".into(), url: "q".into(), messages: 0 }],
            ..Default::default()
        }
    }

    #[test]
    fn a_store_within_its_limits_is_healthy() {
        let verdict = verdict(&healthy(), &Limits::default());
        assert_eq!(verdict, Verdict { healthy: true, problems: vec![] });
    }

    #[test]
    fn each_stall_is_named_with_since_when() {
        let limits = Limits::default();
        let mut status = healthy();
        status.watermark_lag_ms = Some(900_000);
        status.shards[0].behind_ms = 180_000;
        status.shards[0].oldest_unbuffered = Some("2026-11-25T09:57:00Z".into());
        status.queues[0].messages = 3;
        status.quarantined = 2;
        let problems = verdict(&status, &limits).problems;
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems[0].starts_with("watermark stalled at 2026-11-25T10:00:00Z (15 min behind now)"),
            "{problems:?}"
        );
        assert!(problems[1].contains("pump behind on shardId-0: records from 2026-11-25T09:57:00Z"), "{problems:?}");
        assert!(problems[2].starts_with("3 messages in the pump dead-letter queue"), "{problems:?}");
        assert!(problems[3].starts_with("2 items quarantined"), "{problems:?}");
        status.queues[0].messages = 1;
        status.quarantined = 1;
        let problems = verdict(&status, &limits).problems;
        assert!(problems[2].starts_with("1 message in the pump dead-letter queue"), "{problems:?}");
        assert!(problems[3].starts_with("1 item quarantined"), "{problems:?}");
    }

    #[test]
    fn subscriptions_stopped_lagging_or_with_parked_events_are_named() {
        let mut status = healthy();
        let partition = |partition, lag, stopped: Option<&str>| PartitionStatus {
            partition,
            position: "2026-11-25T09:00:00Z".into(),
            lag_ms: Some(lag),
            stopped: stopped.map(str::to_owned),
            ..Default::default()
        };
        status.subscriptions = vec![
            SubscriptionLine {
                name: "orders".into(),
                state: "active".into(),
                parked: 1,
                partitions: vec![
                    partition(0, 1_000, None),
                    partition(1, 3_600_000, None),
                    partition(2, 0, Some("poison")),
                    PartitionStatus { waiting: Some("written by a newer version".into()), ..partition(3, 0, None) },
                ],
                ..Default::default()
            },
            // A paused subscription lags by design.
            SubscriptionLine {
                name: "paused".into(),
                state: "paused".into(),
                partitions: vec![partition(0, 3_600_000, None)],
                ..Default::default()
            },
        ];
        let problems = verdict(&status, &Limits::default()).problems;
        assert_eq!(
            problems,
            [
                "subscription orders partition 1 lagging at 2026-11-25T09:00:00Z (60 min behind the complete end)",
                "subscription orders partition 2 stopped at 2026-11-25T09:00:00Z: poison",
                "subscription orders partition 3 waits at 2026-11-25T09:00:00Z: written by a newer version",
                "subscription orders: 1 parked event (re-deliver them)",
            ]
        );
    }

    #[test]
    fn no_watermark_and_an_unknown_shard_are_problems() {
        let mut status = healthy();
        status.watermark = None;
        status.watermark_lag_ms = None;
        status.shards[0].unknown = true;
        let problems = verdict(&status, &Limits::default()).problems;
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("no watermark yet"));
        assert!(problems[1].contains("unknown"));
    }

    #[test]
    fn durations_read_as_a_person_would_say_them() {
        assert_eq!(human_ms(83_000), "83 s");
        assert_eq!(human_ms(720_000), "12 min");
        assert_eq!(human_ms(12_600_000), "3.5 h");
        assert_eq!(human_ms(181_440_000), "2.1 d");
    }
}
