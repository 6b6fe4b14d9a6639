//! Re-buffering what the pump's event source gave up on. When a batch still
//! fails at the record age limit, the event source mapping sends a message
//! to its on-failure destination (the pump's dead-letter queue) that names
//! the shard and the sequence range, not the records. The records are still
//! in the stream (the age limit stays well inside the retention: a template
//! test checks it), so a re-buffer reads the range back and buffers it again
//! ([`super::Pump::buffer_again`]): idempotent, since buffer keys come
//! from the records' identity. Events re-buffered after the watermark passed
//! them are moved into their own slots and counted late, as any late event.

use aws_sdk_kinesis::types::{Record, ShardIteratorType};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::error::{Error, Result};
use crate::event_item::sortable_sequence;
use crate::kinesis::{get_records, lambda_event};

use super::Pump;
use crate::queue::{drain_with, Drained};

/// What Lambda's on-failure record for a Kinesis event source says about the batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KinesisBatchInfo {
    pub shard_id: String,
    pub start_sequence_number: String,
    pub end_sequence_number: String,
    pub stream_arn: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
}

/// An on-failure record (the body of a dead-letter queue message); other fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    #[serde(rename = "KinesisBatchInfo")]
    pub batch: KinesisBatchInfo,
}

impl DeadLetter {
    pub fn parse(body: &str) -> Result<Self> {
        serde_json::from_str(body)
            .map_err(|e| Error::BadInput(format!("not a Kinesis event source failure record: {e}")))
    }
}

/// What one re-buffer did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Rebuffered {
    /// Records of the range found in the stream.
    pub records: usize,
    /// Sequence numbers that could not be buffered (the message is kept).
    pub failed: Vec<String>,
}

/// Empty `GetRecords` answers followed before the range counts as read to the tip.
const MAX_EMPTY_READS: usize = 5;

/// The stream name in a stream ARN (`arn:aws:kinesis:<region>:<account>:stream/<name>`).
fn stream_name(arn: &str) -> Result<&str> {
    arn.rsplit_once(":stream/").map(|(_, name)| name).ok_or_else(|| Error::BadInput(format!("not a stream ARN: {arn}")))
}

fn region(arn: &str) -> &str {
    arn.split(':').nth(3).unwrap_or_default()
}

/// The records of `batch`'s range, read back from the stream; an error
/// unless the read reached the range's end (so a message is never deleted
/// after a partial read).
pub(crate) async fn read_range(kinesis: &aws_sdk_kinesis::Client, batch: &KinesisBatchInfo) -> Result<Vec<Record>> {
    let end = sortable_sequence(&batch.end_sequence_number);
    let mut iterator = kinesis
        .get_shard_iterator()
        .stream_name(stream_name(&batch.stream_arn)?)
        .shard_id(&batch.shard_id)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .starting_sequence_number(&batch.start_sequence_number)
        .send()
        .await
        .map_err(|e| Error::kinesis("GetShardIterator", e))?
        .shard_iterator;
    let mut records = Vec::new();
    let mut empty = 0;
    while let Some(current) = iterator.take() {
        let out = get_records(kinesis, current, 10_000).await?;
        let before = records.len();
        for record in out.records() {
            let sequence = sortable_sequence(record.sequence_number());
            if sequence > end {
                return Ok(records);
            }
            records.push(record.clone());
            if sequence == end {
                return Ok(records);
            }
        }
        empty = if records.len() == before { empty + 1 } else { 0 };
        if empty >= MAX_EMPTY_READS || out.millis_behind_latest() == Some(0) && records.len() == before {
            break;
        }
        iterator = out.next_shard_iterator;
    }
    let reached = records.last().map_or(batch.start_sequence_number.as_str(), |r| r.sequence_number());
    Err(Error::Kinesis {
        operation: "GetRecords",
        source: format!(
            "{} {}..{}: read only up to {reached} ({} records); try again",
            batch.shard_id,
            batch.start_sequence_number,
            batch.end_sequence_number,
            records.len()
        )
        .into(),
    })
}

/// Reads the dead letter's range back and buffers it again.
pub async fn rebuffer(kinesis: &aws_sdk_kinesis::Client, pump: &Pump, letter: &DeadLetter) -> Result<Rebuffered> {
    let batch = &letter.batch;
    let records = read_range(kinesis, batch).await?;
    if records.is_empty() {
        return Err(Error::Kinesis {
            operation: "GetRecords",
            source: format!(
                "{} {}..{}: no record in the stream any more (past its retention?)",
                batch.shard_id, batch.start_sequence_number, batch.end_sequence_number
            )
            .into(),
        });
    }
    if batch.batch_size.is_some_and(|size| size > records.len()) {
        warn!(shard = batch.shard_id, found = records.len(), batch_size = ?batch.batch_size, "fewer records than the batch had: the rest has left the stream");
    }
    let mut rebuffered = Rebuffered { records: records.len(), failed: Vec::new() };
    // One shard's range, in parts: each part's arrivals go on from the part before it.
    let mut carried = None;
    for chunk in records.chunks(500) {
        let event = lambda_event(&batch.stream_arn, &batch.shard_id, region(&batch.stream_arn), chunk);
        let (failed, last) = pump.buffer_again_after(event, carried).await;
        rebuffered.failed.extend(failed);
        carried = last;
    }
    info!(shard = batch.shard_id, records = rebuffered.records, failed = rebuffered.failed.len(), "re-buffered");
    Ok(rebuffered)
}

/// Re-buffers every message of the pump's dead-letter queue `queue_url`; a
/// message is deleted only after all its records were buffered again.
pub async fn drain_queue(
    sqs: &aws_sdk_sqs::Client,
    queue_url: &str,
    kinesis: &aws_sdk_kinesis::Client,
    pump: &Pump,
) -> Result<Drained> {
    drain_with(sqs, queue_url, |body| async move {
        let rebuffered = rebuffer(kinesis, pump, &DeadLetter::parse(&body)?).await?;
        match rebuffered.failed.is_empty() {
            true => Ok(rebuffered.records),
            false => Err(Error::BadInput(format!("{} records not buffered", rebuffered.failed.len()))),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape Lambda documents for a Kinesis event source's on-failure record.
    #[test]
    fn a_failure_record_names_the_range_to_read_back() {
        let body = r#"{
            "requestContext": {"requestId": "c9b8fa9f", "functionArn": "arn:aws:lambda:eu-west-1:123456789012:function:pump",
                               "condition": "RetryAttemptsExhausted", "approximateInvokeCount": 1},
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "version": "1.0",
            "timestamp": "2026-11-22T05:00:00.000Z",
            "KinesisBatchInfo": {
                "shardId": "shardId-000000000001",
                "startSequenceNumber": "49601189658422359378836298521827638475320189012309704722",
                "endSequenceNumber": "49601189658422359378836298522902373528957594348623495186",
                "approximateArrivalOfFirstRecord": "2026-11-22T04:59:00.000Z",
                "approximateArrivalOfLastRecord": "2026-11-22T04:59:01.000Z",
                "batchSize": 500,
                "streamArn": "arn:aws:kinesis:eu-west-1:123456789012:stream/event-store-prod-events"
            }
        }"#;
        let letter = DeadLetter::parse(body).unwrap();
        assert_eq!(letter.batch.shard_id, "shardId-000000000001");
        assert_eq!(letter.batch.batch_size, Some(500));
        assert_eq!(stream_name(&letter.batch.stream_arn).unwrap(), "event-store-prod-events");
        assert_eq!(region(&letter.batch.stream_arn), "eu-west-1");
        assert!(matches!(DeadLetter::parse("{\"Records\": []}"), Err(Error::BadInput(_))));
    }
}
