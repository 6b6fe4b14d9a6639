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
    event.records = records.iter().map(|r| event_record(stream_arn, shard_id, region, r)).collect();
    event
}

fn event_record(
    stream_arn: &str,
    shard_id: &str,
    region: &str,
    record: &aws_sdk_kinesis::types::Record,
) -> KinesisEventRecord {
    let arrival_ms = record.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
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

/// How many records of a delivered batch are done, the way an event source
/// mapping with `ReportBatchItemFailures` checkpoints: everything before the
/// first failed record. The rest (failed or not) is delivered again.
pub fn done_before_first_failure(
    sequences: &[&str],
    response: &aws_lambda_events::event::streams::KinesisEventResponse,
) -> usize {
    let failed: Vec<&str> = response.batch_item_failures.iter().filter_map(|f| f.item_identifier.as_deref()).collect();
    sequences.iter().position(|s| failed.contains(s)).unwrap_or(sequences.len())
}

#[cfg(test)]
mod tests {
    use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};

    use super::*;

    fn response(failed: &[&str]) -> KinesisEventResponse {
        let mut response = KinesisEventResponse::default();
        response.batch_item_failures = failed
            .iter()
            .map(|s| {
                let mut f = KinesisBatchItemFailure::default();
                f.item_identifier = Some(s.to_string());
                f
            })
            .collect();
        response
    }

    #[test]
    fn checkpoint_stops_before_the_first_failure() {
        let batch = ["1", "2", "3", "4"];
        assert_eq!(done_before_first_failure(&batch, &response(&[])), 4);
        assert_eq!(done_before_first_failure(&batch, &response(&["4", "2"])), 1);
        assert_eq!(done_before_first_failure(&batch, &response(&["1"])), 0);
        assert_eq!(done_before_first_failure(&batch, &response(&["9"])), 4);
    }

    #[test]
    fn get_records_results_become_the_lambda_event_shape() {
        let record = aws_sdk_kinesis::types::Record::builder()
            .sequence_number("42")
            .partition_key("pk")
            .data(aws_sdk_kinesis::primitives::Blob::new("{}"))
            .approximate_arrival_timestamp(aws_sdk_kinesis::primitives::DateTime::from_millis(1_795_327_124_010))
            .build()
            .unwrap();
        let event = kinesis_event("arn:s", "shardId-000000000001", "eu-west-1", &[record]);
        let r = &event.records[0];
        assert_eq!(r.event_id.as_deref(), Some("shardId-000000000001:42"));
        assert_eq!(r.event_source_arn.as_deref(), Some("arn:s"));
        assert_eq!(r.kinesis.approximate_arrival_timestamp.timestamp_millis(), 1_795_327_124_010);
        assert_eq!(r.kinesis.data.0, b"{}");
    }
}
