//! A table's DynamoDB stream read the way Lambda's DynamoDB event source
//! mapping reads it, for `relay` where there is no mapping (the local stack,
//! the tests): every shard from its start, records turned into the Lambda
//! `DynamoDBEvent` shape, a batch delivered again from the first record the
//! handler reports as failed, in memory only (a restarted reader re-reads
//! from the start, which readers of the log absorb: copies have the same id).

use std::collections::VecDeque;
use std::future::Future;

use aws_lambda_events::event::dynamodb::{Event, EventRecord};
use aws_lambda_events::event::streams::DynamoDbEventResponse;
use aws_sdk_dynamodbstreams::types::{OperationType, Record, ShardIteratorType};
use event_store::batch::Backoff;
use serde_json::json;

use crate::process::Error;

type Result<T> = std::result::Result<T, Error>;

fn failed(operation: &str, err: impl std::fmt::Display) -> Error {
    Error(format!("{operation}: {err}"))
}

struct Shard {
    id: String,
    last_sequence: Option<String>,
    /// A closed shard (split or stream disabled) that has been read to its end.
    done: bool,
}

/// The stream of one table, all its shards.
pub struct TableStreamReader {
    client: aws_sdk_dynamodbstreams::Client,
    dynamo: aws_sdk_dynamodb::Client,
    table: String,
    pub stream_arn: String,
    region: String,
    shards: Vec<Shard>,
}

impl TableStreamReader {
    /// The latest stream of `table` (created with a stream specification).
    pub async fn open(
        dynamo: &aws_sdk_dynamodb::Client,
        client: aws_sdk_dynamodbstreams::Client,
        table: &str,
        region: &str,
    ) -> Result<Self> {
        let out = dynamo.describe_table().table_name(table).send().await.map_err(|e| failed("DescribeTable", e))?;
        let arn = out
            .table()
            .and_then(|t| t.latest_stream_arn())
            .ok_or_else(|| Error(format!("table {table} has no stream")))?
            .to_owned();
        Ok(Self {
            client,
            dynamo: dynamo.clone(),
            table: table.to_owned(),
            stream_arn: arn,
            region: region.to_owned(),
            shards: vec![],
        })
    }

    async fn refresh_shards(&mut self) -> Result<()> {
        let out = self
            .client
            .describe_stream()
            .stream_arn(&self.stream_arn)
            .send()
            .await
            .map_err(|e| failed("DescribeStream", e))?;
        for shard in out.stream_description().map(|d| d.shards()).unwrap_or_default() {
            let Some(id) = shard.shard_id() else { continue };
            if !self.shards.iter().any(|s| s.id == id) {
                self.shards.push(Shard { id: id.to_owned(), last_sequence: None, done: false });
            }
        }
        Ok(())
    }

    /// The records that arrived since the last call (one `GetRecords` per shard, shards in order).
    pub async fn poll(&mut self) -> Result<Vec<Record>> {
        self.refresh_shards().await?;
        let mut records = Vec::new();
        for shard in self.shards.iter_mut().filter(|s| !s.done) {
            // A fresh iterator on every poll, after the last record read, never the one the
            // last read returned: when a transaction fails, moto replaces the table with a
            // copy made before it, and an older iterator goes on reading the replaced
            // table's stream, which holds records of the cancelled transaction's writes
            // (and then nothing more). DynamoDB emits nothing for a cancelled transaction.
            let request = self.client.get_shard_iterator().stream_arn(&self.stream_arn).shard_id(&shard.id);
            let request = match &shard.last_sequence {
                Some(seq) => request.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).sequence_number(seq),
                None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
            };
            let out = request.send().await.map_err(|e| failed("GetShardIterator", e))?;
            let Some(iterator) = out.shard_iterator().map(str::to_owned) else {
                continue;
            };
            let out = self
                .client
                .get_records()
                .shard_iterator(iterator)
                .limit(1000)
                .send()
                .await
                .map_err(|e| failed("GetRecords", e))?;
            // A read that raced a cancelled transaction in moto (its put recorded, the table
            // not yet replaced) ends before the phantom; the next poll reads on from there
            // in the replacement, whose sequence numbers may repeat the phantom's.
            let mut read = out.records().to_vec();
            // Numbers only increase along a shard: a repeat (moto numbering two writes alike,
            // without its launcher's lock) would hand this read the same record for ever.
            let mut last = shard.last_sequence.clone();
            for number in read.iter().filter_map(sequence) {
                if last.as_deref().is_some_and(|last| !increases(last, number)) {
                    return Err(Error(format!("shard {}: sequence number {number} after {last:?}", shard.id)));
                }
                last = Some(number.to_owned());
            }
            let mut phantom = false;
            for (at, record) in read.iter().enumerate() {
                if is_phantom(&self.dynamo, &self.table, record).await? {
                    read.truncate(at);
                    phantom = true;
                    break;
                }
            }
            if let Some(seq) = read.last().and_then(|r| r.dynamodb()).and_then(|d| d.sequence_number()) {
                shard.last_sequence = Some(seq.to_owned());
            }
            shard.done = !phantom && out.next_shard_iterator().is_none();
            records.extend(read);
        }
        Ok(records)
    }

    /// The Lambda event for `records`, as the event source mapping would build it.
    pub fn lambda_event(&self, records: &[Record]) -> Event {
        let mut event = Event::default();
        event.records = records.iter().filter_map(|r| lambda_record(r, &self.stream_arn, &self.region)).collect();
        event
    }
}

/// An insert whose item is not in the table: only a cancelled transaction's
/// write in moto (nothing here deletes what it inserts).
async fn is_phantom(dynamo: &aws_sdk_dynamodb::Client, table: &str, record: &Record) -> Result<bool> {
    if record.event_name() != Some(&OperationType::Insert) {
        return Ok(false);
    }
    let Some(keys) = record.dynamodb().and_then(|d| d.keys()) else {
        return Ok(false);
    };
    let key: std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> =
        serde_dynamo::Item::from(keys.clone()).into();
    let out = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| failed("GetItem", e))?;
    Ok(out.item().is_none())
}

fn lambda_record(record: &Record, arn: &str, region: &str) -> Option<EventRecord> {
    let change = record.dynamodb()?;
    let image = |map: Option<&std::collections::HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>>| {
        map.map(|m| serde_dynamo::Item::from(m.clone()))
            .and_then(|item| serde_json::to_value(item).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    let value = json!({
        "awsRegion": region,
        "eventID": record.event_id().unwrap_or_default(),
        "eventName": record.event_name().map(|n| n.as_str()).unwrap_or_default(),
        "eventSource": "aws:dynamodb",
        "eventVersion": "1.1",
        "eventSourceARN": arn,
        "dynamodb": {
            "Keys": image(change.keys()),
            "NewImage": image(change.new_image()),
            "OldImage": image(change.old_image()),
            "SequenceNumber": change.sequence_number(),
            "SizeBytes": change.size_bytes().unwrap_or_default(),
            "StreamViewType": change.stream_view_type().map(|v| v.as_str()),
        },
    });
    serde_json::from_value(value).ok()
}

fn sequence(record: &Record) -> Option<&str> {
    record.dynamodb().and_then(|d| d.sequence_number())
}

/// True when sequence number `next` comes after `last` (decimal strings of any length).
fn increases(last: &str, next: &str) -> bool {
    (next.len(), next) > (last.len(), last)
}

/// How many records of a delivered batch are done: everything before the first one reported as failed.
pub fn done_before_first_failure(records: &[Record], response: &DynamoDbEventResponse) -> usize {
    let failed: Vec<&str> = response.batch_item_failures.iter().filter_map(|f| f.item_identifier.as_deref()).collect();
    records.iter().position(|r| sequence(r).is_some_and(|s| failed.contains(&s))).unwrap_or(records.len())
}

/// Delivers everything the stream holds now to `handle` in batches of
/// `batch_size`, each batch again from its first failed record (with
/// backoff, at most `max_retries` times in a row); returns the records delivered.
pub async fn deliver_all<F, Fut>(
    reader: &mut TableStreamReader,
    pending: &mut VecDeque<Record>,
    batch_size: usize,
    max_retries: u32,
    mut handle: F,
) -> Result<usize>
where
    F: FnMut(Event) -> Fut,
    Fut: Future<Output = DynamoDbEventResponse>,
{
    let backoff = Backoff::default();
    let (mut delivered, mut retry) = (0, 0);
    loop {
        if pending.len() < batch_size {
            pending.extend(reader.poll().await?);
        }
        if pending.is_empty() {
            return Ok(delivered);
        }
        let batch: Vec<Record> = pending.iter().take(batch_size).cloned().collect();
        let event = reader.lambda_event(&batch);
        if event.records.len() != batch.len() {
            return Err(Error(format!(
                "{} of {} stream records could not be read",
                batch.len() - event.records.len(),
                batch.len()
            )));
        }
        let response = handle(event).await;
        let done = done_before_first_failure(&batch, &response);
        tracing::debug!(batch = batch.len(), done, "table stream batch delivered");
        pending.drain(..done);
        delivered += done;
        if done < batch.len() {
            tracing::warn!(failed_from = done, batch = batch.len(), retry, "relay reported failures; delivering again");
            if retry >= max_retries {
                return Err(Error(format!("relay kept failing: {} records left", pending.len())));
            }
            backoff.wait(retry).await;
            retry += 1;
        } else {
            retry = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::increases;

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert!(increases("1100000000017454423062", "1100000000017454423063"));
        assert!(!increases("1100000000017454423062", "1100000000017454423062"), "a repeat");
        assert!(!increases("1100000000017454423062", "1100000000017454423061"));
        assert!(increases("999", "1000"), "longer is larger");
        assert!(!increases("1000", "999"));
    }
}
