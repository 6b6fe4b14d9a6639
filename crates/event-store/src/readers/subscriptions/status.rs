//! A subscription's partitions: where each stands and how far behind the
//! complete end, from their stored items (the tick, `list` and status report it).

use serde::{Deserialize, Serialize};

use super::{list, partitions, Partition};
use crate::error::Result;
use crate::position::Checkpoint;
use crate::readers::subscriptions::spec::Subscription;
use crate::time::{format_ms, now_ms};

/// A partition's place and lag, as the tick and `list` report it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionStatus {
    pub partition: u32,
    /// Where the partition stands: every event before it is delivered (ISO 8601).
    pub position: String,
    /// The watermark's complete end less the position (ms), when there is a watermark.
    pub lag_ms: Option<i64>,
    pub delivered: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Why its last run could not go on (written by a newer version: upgrade), until it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leased_until: Option<String>,
}

/// A subscription and its partitions' status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubscriptionStatus {
    #[serde(flatten)]
    pub subscription: Subscription,
    /// The largest partition lag (ms).
    pub lag_ms: Option<i64>,
    pub partitions: Vec<PartitionStatus>,
    /// How uneven the partitions' loads are, when more than one delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew: Option<Skew>,
}

/// The busiest partition against the mean: a hot key (all of whose events
/// go to one partition, in order) shows as one partition far above 1, which
/// more partitions cannot split (a key is never in two).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Skew {
    pub busiest_partition: u32,
    /// Its delivered events over the mean of all partitions' (1: even).
    pub ratio: f64,
}

/// The skew of `partitions`' delivered events (since the epoch's start), if more than one delivered.
fn skew(partitions: &[PartitionStatus]) -> Option<Skew> {
    let total: u64 = partitions.iter().map(|p| p.delivered).sum();
    let busiest = partitions.iter().max_by_key(|p| p.delivered)?;
    if partitions.len() < 2 || total == 0 {
        return None;
    }
    let mean = total as f64 / partitions.len() as f64;
    Some(Skew { busiest_partition: busiest.partition, ratio: busiest.delivered as f64 / mean })
}

/// Where a checkpoint stands, in ms of arrival time: the event after which it is, or its slot's start.
pub(crate) fn position_ms(checkpoint: &Checkpoint) -> i64 {
    checkpoint.after.as_deref().and_then(|k| k.get(..13)).and_then(|ms| ms.parse().ok()).unwrap_or(checkpoint.slot)
}

/// The status of `sub`'s partitions from their stored items, against the complete end.
pub fn status(sub: &Subscription, stored: &[Partition], complete_end: Option<i64>, unit: u64) -> SubscriptionStatus {
    let partitions: Vec<PartitionStatus> = (0..sub.partitions)
        .map(|partition| {
            let item = stored.iter().find(|p| p.partition == partition);
            let checkpoint = item.and_then(|p| p.checkpoint.clone()).unwrap_or_else(|| sub.start_checkpoint(unit));
            let at = position_ms(&checkpoint).max(sub.start_floor());
            PartitionStatus {
                partition,
                position: format_ms(at),
                lag_ms: complete_end.map(|end| (end - at).max(0)),
                delivered: checkpoint.events,
                stopped: item.and_then(|p| p.stopped.clone()),
                waiting: item.and_then(|p| p.waiting.clone()),
                leased_until: item
                    .and_then(|p| p.lease.as_ref())
                    .filter(|l| l.until > now_ms())
                    .map(|l| format_ms(l.until)),
            }
        })
        .collect();
    let lag_ms = partitions.iter().filter_map(|p| p.lag_ms).max();
    SubscriptionStatus { subscription: sub.clone(), lag_ms, skew: skew(&partitions), partitions }
}

/// Every stored subscription's status against `complete_end`.
pub async fn statuses(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    complete_end: Option<i64>,
    unit: u64,
) -> Result<Vec<SubscriptionStatus>> {
    let mut out = Vec::new();
    for sub in list(dynamo, table).await? {
        let stored = partitions(dynamo, table, &sub).await?;
        out.push(status(&sub, &stored, complete_end, unit));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_partition_shows_as_skew_and_an_even_load_as_one() {
        let loads = |delivered: &[u64]| -> Vec<PartitionStatus> {
            delivered
                .iter()
                .enumerate()
                .map(|(p, &d)| PartitionStatus { partition: p as u32, delivered: d, ..Default::default() })
                .collect()
        };
        assert_eq!(skew(&loads(&[100, 100, 100, 100])).map(|s| s.ratio), Some(1.0));
        let hot = skew(&loads(&[10, 10, 370, 10])).unwrap();
        assert_eq!((hot.busiest_partition, hot.ratio), (2, 3.7));
        assert_eq!(skew(&loads(&[0, 0])), None, "nothing delivered yet");
        assert_eq!(skew(&loads(&[5])), None, "one partition");
    }
}
