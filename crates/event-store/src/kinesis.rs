//! Putting records on a Kinesis stream with `PutRecords`, to its limits
//! (500 records / 5 MiB a request), handling per-record failures two ways:
//! - `put_unordered` (load): retry only the records that failed;
//! - `put_ordered` (playback): resend from the first failed record onward, so
//!   order per partition key survives at the price of duplicates.
//!
//! The retry algorithms take the sending step as a closure, so they are unit
//! tested without a network; `send_put_records` is the real step.

use std::future::Future;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use crate::batch::{first_chunk_len, Backoff, KINESIS_BATCH_BYTES, KINESIS_BATCH_RECORDS};
use crate::error::{Error, Result};

/// One record to put: the two things Kinesis keeps besides the sequence
/// number. (Not `aws_sdk_kinesis::types::Record`, which is a record read back.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord {
    pub partition_key: String,
    pub data: Vec<u8>,
}

impl OutgoingRecord {
    /// What counts against Kinesis' size limits: data plus partition key.
    pub fn size(&self) -> usize {
        self.data.len() + self.partition_key.len()
    }
}

/// The outcome of one record in a `PutRecords` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordResult {
    Stored,
    /// Kinesis' error code for the record (`ProvisionedThroughputExceededException`, `InternalFailure`).
    Failed(String),
}

impl RecordResult {
    pub fn is_stored(&self) -> bool {
        matches!(self, RecordResult::Stored)
    }
}

/// A record that still failed after all retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub index: usize,
    pub code: String,
}

/// Sends one `PutRecords` request and returns the outcome of each record, in order.
pub async fn send_put_records(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    records: &[OutgoingRecord],
) -> Result<Vec<RecordResult>> {
    let entries = records
        .iter()
        .map(|r| {
            PutRecordsRequestEntry::builder()
                .partition_key(&r.partition_key)
                .data(Blob::new(r.data.clone()))
                .build()
                .map_err(Error::from)
        })
        .collect::<Result<Vec<_>>>()?;
    let out = client
        .put_records()
        .stream_name(stream)
        .set_records(Some(entries))
        .send()
        .await
        .map_err(|e| Error::kinesis("PutRecords", e))?;
    if out.records().len() != records.len() {
        let message = format!("answered {} results for {} records", out.records().len(), records.len());
        return Err(Error::Kinesis { operation: "PutRecords", source: message.into() });
    }
    Ok(out
        .records()
        .iter()
        .map(|r| match r.error_code() {
            None => RecordResult::Stored,
            Some(code) => RecordResult::Failed(code.to_owned()),
        })
        .collect())
}

/// Puts every record, retrying only the failed ones with backoff. Returns the
/// records that still failed (by index into `records`); a request that fails
/// as a whole (after the SDK's own retries) counts as all its records failing,
/// so the answer can still say which events were stored.
pub async fn put_unordered<F, Fut>(records: &[OutgoingRecord], backoff: &Backoff, mut send: F) -> Result<Vec<Failure>>
where
    F: FnMut(Vec<OutgoingRecord>) -> Fut,
    Fut: Future<Output = Result<Vec<RecordResult>>>,
{
    let mut pending: Vec<usize> = (0..records.len()).collect();
    let mut failures = Vec::new();
    for retry in 0..backoff.max_attempts {
        if pending.is_empty() {
            break;
        }
        if retry > 0 {
            backoff.wait(retry - 1).await;
        }
        let mut still = Vec::new();
        failures.clear();
        let mut start = 0;
        while start < pending.len() {
            let sizes: Vec<usize> = pending[start..].iter().map(|&i| records[i].size()).collect();
            let end = start + first_chunk_len(&sizes, KINESIS_BATCH_RECORDS, KINESIS_BATCH_BYTES);
            let batch: Vec<OutgoingRecord> = pending[start..end].iter().map(|&i| records[i].clone()).collect();
            // A failed request fails its records, not the records earlier requests stored.
            let outcomes = match send(batch).await {
                Ok(outcomes) => outcomes,
                Err(err) => vec![RecordResult::Failed(format!("RequestFailed: {err}")); end - start],
            };
            for (&index, outcome) in pending[start..end].iter().zip(outcomes) {
                if let RecordResult::Failed(code) = outcome {
                    still.push(index);
                    failures.push(Failure { index, code });
                }
            }
            start = end;
        }
        pending = still;
    }
    Ok(failures)
}

/// Counts of an ordered put.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrderedPut {
    pub requests: usize,
    /// Records sent more than once because an earlier record of their request failed.
    pub resent: usize,
}

/// Puts every record in order. When a request comes back with failed
/// records, everything from the first failure onward is sent again (in
/// order), so a consumer never sees a record before one that preceded it.
pub async fn put_ordered<F, Fut>(records: &[OutgoingRecord], backoff: &Backoff, mut send: F) -> Result<OrderedPut>
where
    F: FnMut(Vec<OutgoingRecord>) -> Fut,
    Fut: Future<Output = Result<Vec<RecordResult>>>,
{
    let sizes: Vec<usize> = records.iter().map(OutgoingRecord::size).collect();
    let mut stats = OrderedPut::default();
    let mut pos = 0;
    let mut retry = 0;
    while pos < records.len() {
        let end = pos + first_chunk_len(&sizes[pos..], KINESIS_BATCH_RECORDS, KINESIS_BATCH_BYTES);
        let outcomes = send(records[pos..end].to_vec()).await?;
        stats.requests += 1;
        match outcomes.iter().position(|o| !o.is_stored()) {
            None => {
                pos = end;
                retry = 0;
            }
            Some(first) => {
                let code = match &outcomes[first] {
                    RecordResult::Failed(code) => code.clone(),
                    RecordResult::Stored => String::new(),
                };
                let later_ok = outcomes[first..].iter().filter(|o| o.is_stored()).count();
                stats.resent += later_ok;
                pos += first;
                retry += 1;
                if retry >= backoff.max_attempts {
                    return Err(Error::KinesisPartial { operation: "PutRecords", failed: end - pos, code });
                }
                backoff.wait(retry - 1).await;
            }
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    fn records(n: usize) -> Vec<OutgoingRecord> {
        (0..n).map(|i| OutgoingRecord { partition_key: format!("pk{}", i % 3), data: vec![i as u8] }).collect()
    }

    fn fast() -> Backoff {
        Backoff { base: Duration::from_micros(1), cap: Duration::from_micros(10), max_attempts: 5 }
    }

    type SentLog = Arc<Mutex<Vec<Vec<u8>>>>;
    type Sent = futures::future::Ready<Result<Vec<RecordResult>>>;

    /// A fake stream: fails the records whose first data byte is listed, once each.
    fn flaky(fail_once: Vec<u8>) -> (SentLog, impl FnMut(Vec<OutgoingRecord>) -> Sent) {
        let sent = Arc::new(Mutex::new(Vec::new()));
        let log = sent.clone();
        let mut pending = fail_once;
        let send = move |batch: Vec<OutgoingRecord>| {
            let mut out = Vec::new();
            for r in &batch {
                log.lock().unwrap().push(r.data.clone());
                if let Some(p) = pending.iter().position(|&b| b == r.data[0]) {
                    pending.remove(p);
                    out.push(RecordResult::Failed("ProvisionedThroughputExceededException".to_string()));
                } else {
                    out.push(RecordResult::Stored);
                }
            }
            futures::future::ready(Ok(out))
        };
        (sent, send)
    }

    #[tokio::test]
    async fn ordered_put_resends_from_the_first_failure() {
        let recs = records(6);
        let (sent, send) = flaky(vec![2, 4]);
        let stats = put_ordered(&recs, &fast(), send).await.unwrap();
        let sent: Vec<u8> = sent.lock().unwrap().iter().map(|d| d[0]).collect();
        // First request: 0..6 with 2 and 4 failing; then everything from 2 on, again, in order
        // (3 and 5 were stored already and go twice).
        assert_eq!(sent, vec![0, 1, 2, 3, 4, 5, 2, 3, 4, 5]);
        assert_eq!(stats, OrderedPut { requests: 2, resent: 2 });
    }

    #[tokio::test]
    async fn ordered_put_gives_up_after_max_attempts() {
        let recs = records(3);
        let send = |batch: Vec<OutgoingRecord>| {
            futures::future::ready(Ok(vec![RecordResult::Failed("InternalFailure".to_string()); batch.len()]))
        };
        let err = put_ordered(&recs, &fast(), send).await.unwrap_err();
        assert!(matches!(err, Error::KinesisPartial { failed: 3, .. }), "{err}");
    }

    #[tokio::test]
    async fn unordered_put_retries_only_failed_records_and_reports_the_rest() {
        let recs = records(5);
        let (sent, send) = flaky(vec![1, 3]);
        assert!(put_unordered(&recs, &fast(), send).await.unwrap().is_empty());
        let sent: Vec<u8> = sent.lock().unwrap().iter().map(|d| d[0]).collect();
        assert_eq!(sent, vec![0, 1, 2, 3, 4, 1, 3]);

        let always = |batch: Vec<OutgoingRecord>| {
            let out = batch
                .iter()
                .map(|r| match r.data[0] {
                    2 => RecordResult::Failed("InternalFailure".to_string()),
                    _ => RecordResult::Stored,
                })
                .collect();
            futures::future::ready(Ok(out))
        };
        let failures = put_unordered(&recs, &fast(), always).await.unwrap();
        assert_eq!(failures, vec![Failure { index: 2, code: "InternalFailure".into() }]);

        // A request failing as a whole fails its records only.
        let big = records(700);
        let mut calls = 0;
        let second_request_down = |batch: Vec<OutgoingRecord>| {
            calls += 1;
            let result = if calls == 2 {
                Err(Error::Config("down".into()))
            } else {
                Ok(vec![RecordResult::Stored; batch.len()])
            };
            futures::future::ready(result)
        };
        assert!(put_unordered(&big, &fast(), second_request_down).await.unwrap().is_empty(), "retried and stored");
    }

    #[tokio::test]
    async fn puts_are_cut_at_500_records() {
        let recs = records(1201);
        let mut sizes = Vec::new();
        let send = |batch: Vec<OutgoingRecord>| {
            sizes.push(batch.len());
            futures::future::ready(Ok(vec![RecordResult::Stored; batch.len()]))
        };
        let stats = put_ordered(&recs, &fast(), send).await.unwrap();
        assert_eq!(sizes, vec![500, 500, 201]);
        assert_eq!(stats.requests, 3);
    }
}
