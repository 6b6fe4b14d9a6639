//! What a rate costs per million events, line by line of the bill, beside EventBridge and Kinesis alone.

use super::plan::Plan;
use super::prices::{
    DYNAMO_GB_MONTH, DYNAMO_PER_MILLION_RRU, DYNAMO_PER_MILLION_WRU, EVENTBRIDGE_ARCHIVE_GB,
    EVENTBRIDGE_ARCHIVE_GB_MONTH, EVENTBRIDGE_PER_MILLION, EVENT_BYTES, HTTP_API_PER_MILLION,
    KINESIS_EXTENDED_SHARD_HOUR, KINESIS_LONG_TERM_GB_MONTH, KINESIS_PER_MILLION_PUT_UNITS, KINESIS_SHARD_HOUR,
    LAMBDA_ARM_PER_GB_SECOND, LAMBDA_PER_MILLION_REQUESTS, MEMORY_MB, PIXEL_SECONDS, PUMP_MEMORY_MB,
    RUNNER_RAW_BYTES_PER_S, SEGMENT_BYTES_PER_S,
};
use super::Measured;

/// Dollars per million events, each line of the bill.
#[derive(Debug, Clone, PartialEq)]
pub struct Cost {
    pub http_api: f64,
    pub lambda: f64,
    pub kinesis: f64,
    pub dynamodb: f64,
    /// Per month each million events is kept.
    pub storage_month: f64,
    /// Per million events one subscription delivers: its reads and its runners' time.
    pub delivered_per_subscription: f64,
}

impl Cost {
    pub fn ingest(&self, function_url: bool) -> f64 {
        self.lambda + self.kinesis + self.dynamodb + if function_url { 0.0 } else { self.http_api }
    }
}

pub fn cost(p: &Plan, m: &Measured) -> Cost {
    let per_million = 1e6;
    let gb_s = |seconds: f64, mb: f64| seconds * mb / 1024.0 * LAMBDA_ARM_PER_GB_SECOND;
    // The pixel: one invocation of about 10 ms per hit; the pump: its duty per shard.
    let pixel = LAMBDA_PER_MILLION_REQUESTS + per_million * gb_s(PIXEL_SECONDS, MEMORY_MB);
    let pump_seconds_per_event = p.pump_duty / (p.events_per_s / p.shards as f64);
    let pump = LAMBDA_PER_MILLION_REQUESTS / (p.events_per_s / p.shards as f64 / p.pump_invocations_per_shard_s)
        + per_million * gb_s(pump_seconds_per_event, PUMP_MEMORY_MB);
    let scan_seconds_per_event = m.stored_bytes_per_event / SEGMENT_BYTES_PER_S;
    let scan = per_million * gb_s(scan_seconds_per_event, MEMORY_MB);
    let shard_hours_per_million = p.shards as f64 / p.events_per_s / 3600.0 * per_million;
    Cost {
        http_api: HTTP_API_PER_MILLION,
        lambda: pixel + pump + scan,
        kinesis: shard_hours_per_million * KINESIS_SHARD_HOUR + KINESIS_PER_MILLION_PUT_UNITS,
        dynamodb: p.write_units_per_event * DYNAMO_PER_MILLION_WRU + m.read_units_per_event * DYNAMO_PER_MILLION_RRU,
        storage_month: per_million * m.stored_bytes_per_event / 1e9 * DYNAMO_GB_MONTH,
        delivered_per_subscription: p.read_units_per_delivered * DYNAMO_PER_MILLION_RRU
            + per_million * gb_s(EVENT_BYTES / RUNNER_RAW_BYTES_PER_S, MEMORY_MB),
    }
}

/// EventBridge custom events into an archive, and a Kinesis stream keeping a
/// year, for the same events, each behind the same HTTP API (a direct service
/// integration, no Lambda): (ingest $ per million, storage $ per million a month).
pub fn alternatives(p: &Plan) -> [(&'static str, f64, f64); 2] {
    let gb_per_million = 1e6 * EVENT_BYTES / 1e9;
    let eventbridge = (
        HTTP_API_PER_MILLION + EVENTBRIDGE_PER_MILLION + gb_per_million * EVENTBRIDGE_ARCHIVE_GB,
        gb_per_million * EVENTBRIDGE_ARCHIVE_GB_MONTH,
    );
    let shard_hours_per_million = p.shards as f64 / p.events_per_s / 3600.0 * 1e6;
    let kinesis = (
        HTTP_API_PER_MILLION
            + shard_hours_per_million * (KINESIS_SHARD_HOUR + KINESIS_EXTENDED_SHARD_HOUR)
            + KINESIS_PER_MILLION_PUT_UNITS,
        gb_per_million * KINESIS_LONG_TERM_GB_MONTH,
    );
    [
        ("EventBridge custom events + archive", eventbridge.0, eventbridge.1),
        ("Kinesis, 365-day retention", kinesis.0, kinesis.1),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::plan::plan;
    use crate::capacity::tests::measured;

    #[test]
    fn the_function_url_takes_the_http_api_off_the_bill() {
        let m = measured();
        let c = cost(&plan(1e5, &m), &m);
        assert!((c.ingest(false) - c.ingest(true) - HTTP_API_PER_MILLION).abs() < 1e-9);
        assert!((c.dynamodb - (0.5 * 0.625 + 0.1 * 0.125)).abs() < 1e-9);
    }
}
