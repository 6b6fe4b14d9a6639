//! What a Kinesis event source mapping does before calling `pump`: turn
//! `GetRecords` results into the Lambda `KinesisEvent` shape. Used where
//! there is no event source mapping: the local stack and the tests.

use aws_lambda_events::encodings::SecondTimestamp;
use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord, KinesisRecord};
use chrono::{DateTime, Utc};

/// The Lambda event for `records` read from `shard_id` of the stream `stream_arn`.
pub fn kinesis_event(
    stream_arn: &str,
    shard_id: &str,
    region: &str,
    records: &[aws_sdk_kinesis::types::Record],
) -> KinesisEvent {
    let mut event = KinesisEvent::default();
    event.records = records
        .iter()
        .map(|r| event_record(stream_arn, shard_id, region, r))
        .collect();
    event
}

fn event_record(
    stream_arn: &str,
    shard_id: &str,
    region: &str,
    record: &aws_sdk_kinesis::types::Record,
) -> KinesisEventRecord {
    let arrival_ms = record
        .approximate_arrival_timestamp()
        .and_then(|t| t.to_millis().ok())
        .unwrap_or(0);
    let mut kinesis = KinesisRecord::default();
    kinesis.approximate_arrival_timestamp =
        SecondTimestamp(DateTime::<Utc>::from_timestamp_millis(arrival_ms).unwrap_or_default());
    *kinesis.data = record.data().as_ref().to_vec();
    kinesis.partition_key = record.partition_key().unwrap_or_default().to_owned();
    kinesis.sequence_number = record.sequence_number().to_owned();
    kinesis.kinesis_schema_version = Some("1.0".into());
    let mut out = KinesisEventRecord::default();
    out.aws_region = Some(region.to_owned());
    out.event_id = Some(format!("{shard_id}:{}", record.sequence_number()));
    out.event_name = Some("aws:kinesis:record".into());
    out.event_source = Some("aws:kinesis".into());
    out.event_source_arn = Some(stream_arn.to_owned());
    out.event_version = Some("1.0".into());
    out.kinesis = kinesis;
    out
}
