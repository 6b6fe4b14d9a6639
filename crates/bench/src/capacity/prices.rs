//! AWS's prices and limits, the template's defaults and the assumptions the capacity model plans with.

/// Prices, us-east-1, on-demand list prices as read on the date below. The
/// machines that build this have no internet: they were read from stored
/// copies of the pages named, not live.
pub const PRICES_READ: &str = "2026-11-24";
/// aws.amazon.com/api-gateway/pricing: HTTP APIs, first 300 million requests a month (metered per 512 KB).
pub(super) const HTTP_API_PER_MILLION: f64 = 1.00;
/// aws.amazon.com/lambda/pricing: requests, and arm64 duration per GB-second.
pub(super) const LAMBDA_PER_MILLION_REQUESTS: f64 = 0.20;
pub(super) const LAMBDA_ARM_PER_GB_SECOND: f64 = 0.000_013_333_4;
/// aws.amazon.com/kinesis/data-streams/pricing, provisioned mode: shard-hour,
/// PUT payload units (25 KB each), extended retention (24 h to 7 days) per
/// shard-hour, long-term retention (past 7 days) per GB-month.
pub(super) const KINESIS_SHARD_HOUR: f64 = 0.015;
pub(super) const KINESIS_PER_MILLION_PUT_UNITS: f64 = 0.014;
pub(super) const KINESIS_EXTENDED_SHARD_HOUR: f64 = 0.02;
pub(super) const KINESIS_LONG_TERM_GB_MONTH: f64 = 0.023;
/// aws.amazon.com/dynamodb/pricing/on-demand (since the 2024-11-01 reduction) and Standard storage.
pub(super) const DYNAMO_PER_MILLION_WRU: f64 = 0.625;
pub(super) const DYNAMO_PER_MILLION_RRU: f64 = 0.125;
pub(super) const DYNAMO_GB_MONTH: f64 = 0.25;
/// aws.amazon.com/eventbridge/pricing: custom events per million (per 64 KB
/// chunk), archive processing per GB and archive storage per GB-month.
pub(super) const EVENTBRIDGE_PER_MILLION: f64 = 1.00;
pub(super) const EVENTBRIDGE_ARCHIVE_GB: f64 = 0.10;
pub(super) const EVENTBRIDGE_ARCHIVE_GB_MONTH: f64 = 0.023;

/// AWS limits (docs/DESIGN.md): per Kinesis shard in, per DynamoDB partition.
pub(super) const SHARD_RECORDS_PER_S: f64 = 1000.0;
pub(super) const SHARD_BYTES_PER_S: f64 = 1_048_576.0;
pub(super) const PARTITION_WCU: f64 = 1000.0;
pub(super) const PARTITION_RCU: f64 = 3000.0;
/// Plan every limit at this share of it: headroom for bursts and uneven keys.
pub(super) const UTILISATION: f64 = 0.8;
/// Lambda gives a function CPU in proportion to memory: one vCPU at 1,769 MB.
pub(super) const MB_PER_VCPU: f64 = 1769.0;

/// The template's defaults the plan starts from.
pub(super) const EVENT_BYTES: f64 = 1024.0;
pub(super) const PUMP_BATCH: f64 = 500.0;
pub(super) const PUMP_MEMORY_MB: f64 = 128.0;
/// The other functions' memory (the template's global default).
pub(super) const MEMORY_MB: f64 = 128.0;
pub(super) const TIME_UNIT_S: f64 = 1.0;
pub(super) const SCAN_CYCLE_S: f64 = 60.0;
pub(super) const MAX_SCAN_SEGMENTS: usize = 100;
pub(super) const MAX_SUBSCRIPTION_PARTITIONS: usize = 1024;
pub(super) const MAX_SLICES: usize = 1024;

/// Assumed, not measured (no AWS account here): what one scan segment moves
/// (a 1 MB Scan page, its chunks written and deleted, about 200 ms), what one
/// DynamoDB batch write takes, and what one subscription runner or playback
/// delivers (decode, JSON, PutRecords of up to 5 MB; order per key keeps one
/// request in flight).
pub(super) const SEGMENT_BYTES_PER_S: f64 = 5e6;
pub(super) const WRITE_LATENCY_S: f64 = 0.025;
pub(super) const RUNNER_RAW_BYTES_PER_S: f64 = 4e6;
/// A pixel hit's billed duration (assumed, too).
pub(super) const PIXEL_SECONDS: f64 = 0.010;
/// An event-table chunk's attributes besides its data (keys, counts, times).
pub(super) const CHUNK_OVERHEAD_BYTES: f64 = 200.0;
