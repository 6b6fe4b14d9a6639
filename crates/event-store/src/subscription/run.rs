//! What a partition run is given and what it reports: its payload (a
//! continuation carries the lease token), how it ended, what it did.

use serde::{Deserialize, Serialize};

/// A partition run's payload (`{"run": ...}`). Where to start is read from
/// the stored checkpoint; a `lease` token from outside the chain is just
/// another runner, which must wait for the lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionTask {
    pub subscription: String,
    pub partition: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hop: u32,
}

fn is_zero(hop: &u32) -> bool {
    *hop == 0
}

impl PartitionTask {
    pub fn first(subscription: &str, partition: u32) -> Self {
        Self { subscription: subscription.to_owned(), partition, lease: None, hop: 0 }
    }
}

/// How a partition run ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Everything sealed is delivered; the lease is given up.
    #[default]
    CaughtUp,
    /// Handed over to a continuation near the deadline.
    Continued,
    /// Another runner holds the partition (until `busy_until`).
    Busy,
    /// The partition is stopped on a parked event (`error`); `resume` goes on.
    Stopped,
    Paused,
    /// No such subscription (deleted).
    Gone,
    /// The target could not be reached (`error`): nothing skipped; a tick after the backoff
    /// (`UNAVAILABLE_BACKOFF`, the partition's lease kept until then) tries again.
    Unavailable,
    /// The chain reached `MAX_CONTINUATIONS`; the next tick starts a new one.
    ChainStopped,
    /// A rescale is under way: the partition stopped for it, or delivered up to where it says.
    Rescaling,
}

/// What one partition run did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    pub subscription: String,
    pub partition: u32,
    pub status: RunStatus,
    /// Events delivered to the target (parked ones not included).
    pub delivered: usize,
    pub parked: usize,
    /// Events of the log skipped: in other partitions, or not passing the filter.
    pub other_partitions: usize,
    pub filtered_out: usize,
    /// Copies of an accepted event (same envelope id) skipped.
    pub duplicates_dropped: usize,
    pub unreadable: usize,
    /// `Query` requests (slot index and events).
    pub queries: usize,
    /// The longest arrival-to-delivery of the run's rounds (ms): each round's oldest event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_max_ms: Option<i64>,
    /// Requests to the target (`PutRecords`, `Invoke`).
    pub target_requests: usize,
    /// Where the partition stands at the end of the run (ISO 8601).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_until: Option<String>,
}
