//! `pump`: Kinesis event source → buffer table. Every record becomes one
//! buffer item under a key derived from its identity, written with
//! `BatchWriteItem`; the response names exactly the records that could not
//! be written, so the event source retries those and nothing else.

use std::collections::HashMap;

use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_lambda_events::event::streams::{KinesisBatchItemFailure, KinesisEventResponse};
use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use tracing::{error, info};

use crate::batch::Backoff;
use crate::buffer_item::BufferItem;
use crate::config::PumpConfig;
use crate::dynamo::write_all;
use crate::event_item::{item_size, MAX_ITEM_BYTES};

pub struct Pump {
    dynamo: aws_sdk_dynamodb::Client,
    config: PumpConfig,
    backoff: Backoff,
}

impl Pump {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, config: PumpConfig) -> Self {
        Self { dynamo, config, backoff: Backoff::default() }
    }

    pub async fn handle(&self, event: KinesisEvent) -> KinesisEventResponse {
        let mut failed: Vec<String> = Vec::new();
        // Sequence numbers by buffer key: a batch may carry a record twice.
        let mut sequences: HashMap<String, Vec<String>> = HashMap::new();
        let mut writes: Vec<(String, WriteRequest)> = Vec::new();
        for record in &event.records {
            let sequence = record.kinesis.sequence_number.clone();
            let item = match BufferItem::from_kinesis(record) {
                Ok(item) => item,
                Err(err) => {
                    error!(error = %err, sequence, "record cannot be buffered");
                    failed.push(sequence);
                    continue;
                }
            };
            let attributes = item.to_item();
            let size = item_size(&attributes);
            if size > MAX_ITEM_BYTES {
                error!(sequence, size, "record too large for a DynamoDB item; left to the event source's failure destination");
                failed.push(sequence);
                continue;
            }
            let seen = sequences.entry(item.id.clone()).or_default();
            seen.push(sequence);
            if seen.len() == 1 {
                let put = PutRequest::builder().set_item(Some(attributes)).build();
                match put {
                    Ok(put) => writes.push((item.id, WriteRequest::builder().put_request(put).build())),
                    Err(err) => {
                        error!(error = %err, "cannot build put request");
                        failed.extend(sequences.remove(&item.id).unwrap_or_default());
                    }
                }
            }
        }
        let written = writes.len();
        let unwritten = write_all(&self.dynamo, &self.config.buffer_table, writes, &self.backoff).await;
        for key in &unwritten {
            failed.extend(sequences.remove(key).unwrap_or_default());
        }
        info!(records = event.records.len(), items = written - unwritten.len(), failed = failed.len(), "buffered");
        let mut response = KinesisEventResponse::default();
        response.batch_item_failures = failed
            .into_iter()
            .map(|sequence| {
                let mut failure = KinesisBatchItemFailure::default();
                failure.item_identifier = Some(sequence);
                failure
            })
            .collect();
        response
    }
}
