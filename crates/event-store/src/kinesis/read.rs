//! Reading a stream back: its shards, a `GetRecords` call, the records
//! stored since a time (how a put cut short learns what the stream already
//! holds), and records in the shape Lambda's event source delivers them.

use std::collections::HashSet;

use aws_sdk_kinesis::types::{Shard, ShardIteratorType};

use super::OutgoingRecord;
use crate::error::{Error, Result};

/// Every shard Kinesis lists for `stream` (open and, within retention, closed).
pub async fn list_shards(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> Result<Vec<Shard>> {
    existing_shards(kinesis, stream)
        .await?
        .ok_or_else(|| Error::Kinesis { operation: "ListShards", source: format!("no stream {stream}").into() })
}

/// [`list_shards`], `None` when there is no such stream.
pub(crate) async fn existing_shards(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> Result<Option<Vec<Shard>>> {
    let mut shards = Vec::new();
    let mut next_token: Option<String> = None;
    loop {
        // With a token, ListShards takes no stream name.
        let request = match next_token.take() {
            Some(token) => kinesis.list_shards().next_token(token),
            None => kinesis.list_shards().stream_name(stream),
        };
        let out = match request.send().await {
            Ok(out) => out,
            Err(e) if e.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => return Ok(None),
            Err(e) => return Err(Error::kinesis("ListShards", e)),
        };
        shards.extend(out.shards().iter().cloned());
        match out.next_token() {
            Some(token) => next_token = Some(token.to_owned()),
            None => return Ok(Some(shards)),
        }
    }
}

/// One `GetRecords` call: up to `limit` records from `iterator`.
pub async fn get_records(
    kinesis: &aws_sdk_kinesis::Client,
    iterator: String,
    limit: i32,
) -> Result<aws_sdk_kinesis::operation::get_records::GetRecordsOutput> {
    kinesis
        .get_records()
        .shard_iterator(iterator)
        .limit(limit)
        .send()
        .await
        .map_err(|e| Error::kinesis("GetRecords", e))
}

/// Which of `records` are on `stream`, read back from every shard from
/// `since_ms` (Kinesis arrival time) to the tip: after an ambiguous failure,
/// this tells the records Kinesis applied from those it did not.
pub(crate) async fn stored_since(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    since_ms: i64,
    records: &[OutgoingRecord],
) -> Result<Vec<bool>> {
    let wanted: HashSet<(&str, &[u8])> =
        records.iter().map(|r| (r.partition_key.as_str(), r.data.as_slice())).collect();
    let mut found: HashSet<(String, Vec<u8>)> = HashSet::new();
    read_since(client, stream, since_ms, |key, data| {
        if wanted.contains(&(key, data)) {
            found.insert((key.to_owned(), data.to_vec()));
        }
    })
    .await?;
    Ok(records.iter().map(|r| found.contains(&(r.partition_key.clone(), r.data.clone()))).collect())
}

/// Which of `events` (user records, put alone or in KPL aggregated records)
/// are on `stream` from `since_ms` on: what a delivery that was cut short
/// stored ahead of its first failure, so that only the rest goes again.
pub(crate) async fn events_stored_since(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    since_ms: i64,
    events: &[OutgoingRecord],
) -> Result<Vec<bool>> {
    let wanted: HashSet<(&str, &[u8])> = events.iter().map(|r| (r.partition_key.as_str(), r.data.as_slice())).collect();
    let mut found: HashSet<(String, Vec<u8>)> = HashSet::new();
    read_since(client, stream, since_ms, |key, data| {
        for (key, data) in crate::aggregation::deaggregate(key, data).unwrap_or_default() {
            if wanted.contains(&(key.as_str(), data.as_slice())) {
                found.insert((key, data));
            }
        }
    })
    .await?;
    Ok(events.iter().map(|r| found.contains(&(r.partition_key.clone(), r.data.clone()))).collect())
}

/// Hands every record of `stream` from `since_ms` (Kinesis arrival time) to
/// the tip to `seen` (partition key, data), shard by shard.
async fn read_since(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    since_ms: i64,
    mut seen: impl FnMut(&str, &[u8]),
) -> Result<()> {
    for shard in list_shards(client, stream).await? {
        let out = client
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(ShardIteratorType::AtTimestamp)
            .timestamp(aws_sdk_kinesis::primitives::DateTime::from_millis(since_ms))
            .send()
            .await
            .map_err(|e| Error::kinesis("GetShardIterator", e))?;
        let mut iterator = out.shard_iterator().map(str::to_owned);
        for _ in 0..MAX_READ_BACK_CALLS {
            let Some(current) = iterator.take() else { break };
            let out = get_records(client, current, 10_000).await?;
            for record in out.records() {
                seen(record.partition_key().unwrap_or_default(), record.data().as_ref());
            }
            if out.records().is_empty() && out.millis_behind_latest().is_none_or(|behind| behind == 0) {
                break;
            }
            iterator = out.next_shard_iterator().map(str::to_owned);
        }
    }
    Ok(())
}

/// `GetRecords` calls per shard a read-back makes at most (10,000 records each).
const MAX_READ_BACK_CALLS: usize = 20;

/// The Lambda event for `records` read from `shard_id` of the stream
/// `stream_arn`, as a Kinesis event source mapping delivers it.
pub fn lambda_event(
    stream_arn: &str,
    shard_id: &str,
    region: &str,
    records: &[aws_sdk_kinesis::types::Record],
) -> aws_lambda_events::event::kinesis::KinesisEvent {
    let mut event = aws_lambda_events::event::kinesis::KinesisEvent::default();
    event.records = records.iter().map(|r| event_record(stream_arn, shard_id, region, r)).collect();
    event
}

fn event_record(
    stream_arn: &str,
    shard_id: &str,
    region: &str,
    record: &aws_sdk_kinesis::types::Record,
) -> aws_lambda_events::event::kinesis::KinesisEventRecord {
    let arrival_ms = record.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).unwrap_or(0);
    let mut kinesis = aws_lambda_events::event::kinesis::KinesisRecord::default();
    kinesis.approximate_arrival_timestamp = aws_lambda_events::encodings::SecondTimestamp(
        chrono::DateTime::<chrono::Utc>::from_timestamp_millis(arrival_ms).unwrap_or_default(),
    );
    *kinesis.data = record.data().as_ref().to_vec();
    kinesis.partition_key = record.partition_key().unwrap_or_default().to_owned();
    kinesis.sequence_number = record.sequence_number().to_owned();
    kinesis.kinesis_schema_version = Some("1.0".into());
    let mut out = aws_lambda_events::event::kinesis::KinesisEventRecord::default();
    out.aws_region = Some(region.to_owned());
    out.event_id = Some(format!("{shard_id}:{}", record.sequence_number()));
    out.event_name = Some("aws:kinesis:record".into());
    out.event_source = Some("aws:kinesis".into());
    out.event_source_arn = Some(stream_arn.to_owned());
    out.event_version = Some("1.0".into());
    out.kinesis = kinesis;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_records_results_become_the_lambda_event_shape() {
        let record = aws_sdk_kinesis::types::Record::builder()
            .sequence_number("42")
            .partition_key("pk")
            .data(aws_sdk_kinesis::primitives::Blob::new("{}"))
            .approximate_arrival_timestamp(aws_sdk_kinesis::primitives::DateTime::from_millis(1_795_327_124_010))
            .build()
            .unwrap();
        let event = lambda_event("arn:s", "shardId-000000000001", "eu-west-1", &[record]);
        let r = &event.records[0];
        assert_eq!(r.event_id.as_deref(), Some("shardId-000000000001:42"));
        assert_eq!(r.event_source_arn.as_deref(), Some("arn:s"));
        assert_eq!(r.kinesis.approximate_arrival_timestamp.timestamp_millis(), 1_795_327_124_010);
        assert_eq!(r.kinesis.data.0, b"{}");
    }
}
