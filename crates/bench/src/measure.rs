//! What every section measures with (in-flight requests, batch and stream sizes, DynamoDB prices, rates).

use std::time::Duration;

/// In-flight requests for the raw loops and the stages alike.
pub(crate) const CONCURRENCY: usize = 8;
/// Records per pump invocation (the template's `PumpBatchSize` default).
pub(crate) const PUMP_BATCH: usize = 500;
/// DynamoDB on-demand prices, us-east-1, per million request units: $0.625 per
/// million write request units and $0.125 per million read request units
/// (aws.amazon.com/dynamodb/pricing/on-demand/, the prices since the
/// 2024-11-01 reduction; not re-read on 2026-11-21: no internet on this machine).
pub(crate) const USD_PER_MILLION_WRU: f64 = 0.625;
pub(crate) const USD_PER_MILLION_RRU: f64 = 0.125;
/// Shards of each bench stream: the playback stream's write limit is 1,000 records and 1 MiB a second per shard.
pub(crate) const STREAM_SHARDS: i32 = 2;

pub(crate) fn per_second(n: usize, elapsed: Duration) -> f64 {
    n as f64 / elapsed.as_secs_f64().max(1e-9)
}
