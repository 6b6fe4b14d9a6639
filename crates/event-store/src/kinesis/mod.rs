//! Putting records on a Kinesis stream with `PutRecords`, to its limits
//! (500 records / 5 MiB a request), keeping each partition key's order:
//! `put_in_key_order` (load's posted arrays, playback): a request carries
//!   at most one record per partition key, and a key's next record goes only
//!   once the one before it is stored, so every reader sees each key's
//!   records in order on first delivery. PutRecords promises no order within
//!   a request and a failed record does not stop the later ones, so this is
//!   the only way short of one `PutRecord` at a time.
//!
//! A request that fails as a whole is either known not applied (throttling)
//! or ambiguous (5xx, timeout, reset: Kinesis may have stored it); the caller
//! says how to find out which records of an ambiguous request were stored.
//! The retry algorithms take the sending steps as closures, so they are unit
//! tested without a network; `send_put_records` is the real step.

use std::future::Future;

use aws_sdk_kinesis::primitives::Blob;
use std::collections::{HashMap, VecDeque};

use aws_sdk_kinesis::types::PutRecordsRequestEntry;

use crate::batch::{first_chunk_len, Backoff, KINESIS_BATCH_BYTES, KINESIS_BATCH_RECORDS};
use crate::error::{Error, Result};

mod read;

pub(crate) use read::{events_stored_since, existing_shards, stored_since};
pub use read::{get_records, lambda_event, list_shards};

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

/// The indices of `records` grouped by partition key: keys in order of first
/// appearance, each key's indices in order.
pub(crate) fn indices_by_key(records: &[OutgoingRecord]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<&str, usize> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        let group = *group_of.entry(record.partition_key.as_str()).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[group].push(index);
    }
    groups
}

/// What a key-ordered put did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyOrderedPut {
    pub requests: usize,
    /// Records sent again: refused by Kinesis, or found not stored after an ambiguous failure.
    pub retried: usize,
    /// Requests that failed ambiguously and were checked against the stream.
    pub checked: usize,
    /// Records not stored after all attempts, and the later records of their
    /// keys, never sent (code [`NOT_SENT`]) so that no key has a hole in its order.
    pub failures: Vec<Failure>,
}

/// The code of a record not sent because an earlier record of its key could not be stored.
pub const NOT_SENT: &str = "NotSent";

/// Puts `records` keeping each partition key's order on first delivery (see
/// the module doc). `check` is called with the records of a request that
/// failed ambiguously and answers, per record, whether it is on the stream;
/// an error from it counts the records as not stored (sent again, so a
/// duplicate is possible, never a hole).
pub async fn put_in_key_order<F, Fut, C, CFut>(
    records: &[OutgoingRecord],
    backoff: &Backoff,
    mut send: F,
    mut check: C,
) -> KeyOrderedPut
where
    F: FnMut(Vec<OutgoingRecord>) -> Fut,
    Fut: Future<Output = Result<Vec<RecordResult>>>,
    C: FnMut(Vec<OutgoingRecord>) -> CFut,
    CFut: Future<Output = Result<Vec<bool>>>,
{
    // Each key's records, in order: the head of each queue is next to go.
    let mut queues: Vec<VecDeque<usize>> = indices_by_key(records).into_iter().map(VecDeque::from).collect();
    let mut attempts = vec![0u32; records.len()];
    let mut out = KeyOrderedPut::default();
    let mut round = 0;
    loop {
        let heads: Vec<(usize, usize)> =
            queues.iter().enumerate().filter_map(|(queue, q)| q.front().map(|&index| (queue, index))).collect();
        if heads.is_empty() {
            return out;
        }
        let mut any_failed = false;
        let mut start = 0;
        while start < heads.len() {
            let sizes: Vec<usize> = heads[start..].iter().map(|&(_, i)| records[i].size()).collect();
            let end = start + first_chunk_len(&sizes, KINESIS_BATCH_RECORDS, KINESIS_BATCH_BYTES);
            let chunk = &heads[start..end];
            start = end;
            let batch: Vec<OutgoingRecord> = chunk.iter().map(|&(_, i)| records[i].clone()).collect();
            out.requests += 1;
            let outcomes = send_checked(batch, &mut send, &mut check, &mut out).await;
            any_failed |= settle(chunk, outcomes, (&mut queues, &mut attempts), backoff.max_attempts, &mut out);
        }
        if any_failed {
            backoff.wait(round).await;
            round += 1;
        } else {
            round = 0;
        }
    }
}

/// One request's outcome per record: stored, or the code it failed with. A
/// request refused whole by throttling stored nothing; one that failed
/// ambiguously is checked against the stream with `check`.
async fn send_checked<F, Fut, C, CFut>(
    batch: Vec<OutgoingRecord>,
    send: &mut F,
    check: &mut C,
    out: &mut KeyOrderedPut,
) -> Vec<std::result::Result<(), String>>
where
    F: FnMut(Vec<OutgoingRecord>) -> Fut,
    Fut: Future<Output = Result<Vec<RecordResult>>>,
    C: FnMut(Vec<OutgoingRecord>) -> CFut,
    CFut: Future<Output = Result<Vec<bool>>>,
{
    let len = batch.len();
    match send(batch.clone()).await {
        Ok(results) => results
            .into_iter()
            .map(|r| match r {
                RecordResult::Stored => Ok(()),
                RecordResult::Failed(code) => Err(code),
            })
            .collect(),
        Err(err) if err.is_throttled() => vec![Err(format!("RequestThrottled: {err}")); len],
        Err(err) => {
            out.checked += 1;
            let code = format!("RequestFailed: {err}");
            match check(batch).await {
                Ok(stored) => stored.into_iter().map(|s| if s { Ok(()) } else { Err(code.clone()) }).collect(),
                Err(_) => vec![Err(code); len],
            }
        }
    }
}

/// Applies one request's outcomes to the keys' queues: a stored record
/// leaves its queue; a failed one is tried again, or, out of attempts, is
/// given up with the rest of its key (unsent). True when any failed.
fn settle(
    chunk: &[(usize, usize)],
    outcomes: Vec<std::result::Result<(), String>>,
    (queues, attempts): (&mut [VecDeque<usize>], &mut [u32]),
    max_attempts: u32,
    out: &mut KeyOrderedPut,
) -> bool {
    let mut any_failed = false;
    for (&(queue, index), outcome) in chunk.iter().zip(outcomes) {
        let Err(code) = outcome else {
            queues[queue].pop_front();
            continue;
        };
        any_failed = true;
        attempts[index] += 1;
        if attempts[index] < max_attempts {
            out.retried += 1;
            continue;
        }
        let mut rest = std::mem::take(&mut queues[queue]).into_iter();
        if let Some(first) = rest.next() {
            out.failures.push(Failure { index: first, code });
        }
        out.failures.extend(rest.map(|index| Failure { index, code: NOT_SENT.to_owned() }));
    }
    any_failed
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

    /// What a consumer taking the first copy sees: per key, the data bytes in first-delivery order.
    fn first_deliveries(sent: &[(String, u8)]) -> std::collections::BTreeMap<String, Vec<u8>> {
        let mut seen = std::collections::HashSet::new();
        let mut out: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
        for (key, n) in sent {
            if seen.insert(*n) {
                out.entry(key.clone()).or_default().push(*n);
            }
        }
        out
    }

    fn never_checked(_: Vec<OutgoingRecord>) -> futures::future::Ready<Result<Vec<bool>>> {
        futures::future::ready(Err(Error::Config("no ambiguous failure expected".into())))
    }

    #[tokio::test]
    async fn key_ordered_put_keeps_each_keys_order_on_first_delivery_and_resends_only_failures() {
        let recs = records(12);
        let (sent, send) = flaky(vec![1, 4, 4, 7]);
        let stats = put_in_key_order(&recs, &fast(), send, never_checked).await;
        assert!(stats.failures.is_empty());
        let sent: Vec<(String, u8)> = sent.lock().unwrap().iter().map(|d| (format!("pk{}", d[0] % 3), d[0])).collect();
        assert_eq!(sent.len(), 12 + 4, "only the refused records went twice");
        for (key, ns) in first_deliveries(&sent) {
            let mut sorted = ns.clone();
            sorted.sort();
            assert_eq!(ns, sorted, "{key}: in order on first delivery");
            assert_eq!(ns.len(), 4);
        }
        assert_eq!(stats.retried, 4);
    }

    #[tokio::test]
    async fn an_ambiguous_failure_is_checked_so_stored_records_are_not_sent_again() {
        let recs = records(6);
        let log: SentLog = Arc::new(Mutex::new(Vec::new()));
        let stream = log.clone();
        let mut calls = 0;
        // The second request is applied, then answered with a 500.
        let send = move |batch: Vec<OutgoingRecord>| {
            calls += 1;
            stream.lock().unwrap().extend(batch.iter().map(|r| r.data.clone()));
            let answer = if calls == 2 {
                Err(Error::Kinesis { operation: "PutRecords", source: "500 InternalFailure".into() })
            } else {
                Ok(vec![RecordResult::Stored; batch.len()])
            };
            futures::future::ready(answer)
        };
        let on_stream = log.clone();
        let check = move |batch: Vec<OutgoingRecord>| {
            let stream = on_stream.lock().unwrap().clone();
            futures::future::ready(Ok(batch.iter().map(|r| stream.contains(&r.data)).collect()))
        };
        let stats = put_in_key_order(&recs, &fast(), send, check).await;
        assert!(stats.failures.is_empty());
        assert_eq!(stats.checked, 1);
        let sent: Vec<u8> = log.lock().unwrap().iter().map(|d| d[0]).collect();
        assert_eq!(sent.len(), 6, "nothing twice: the check found the applied records");
    }

    #[tokio::test]
    async fn a_record_given_up_on_stops_its_key_only() {
        let recs = records(9);
        let send = |batch: Vec<OutgoingRecord>| {
            let out = batch
                .iter()
                .map(|r| match r.data[0] {
                    4 => RecordResult::Failed("InternalFailure".to_string()),
                    _ => RecordResult::Stored,
                })
                .collect();
            futures::future::ready(Ok(out))
        };
        let stats = put_in_key_order(&recs, &fast(), send, never_checked).await;
        // Record 4 is key pk1's second; its third (7) is never sent.
        assert_eq!(
            stats.failures,
            vec![Failure { index: 4, code: "InternalFailure".into() }, Failure { index: 7, code: NOT_SENT.into() }]
        );
    }

    #[tokio::test]
    async fn puts_are_cut_at_500_records() {
        let recs: Vec<OutgoingRecord> =
            (0..1201).map(|i| OutgoingRecord { partition_key: format!("k{i}"), data: vec![1] }).collect();
        let mut sizes = Vec::new();
        let send = |batch: Vec<OutgoingRecord>| {
            sizes.push(batch.len());
            futures::future::ready(Ok(vec![RecordResult::Stored; batch.len()]))
        };
        let stats = put_in_key_order(&recs, &fast(), send, never_checked).await;
        assert_eq!(sizes, vec![500, 500, 201]);
        assert_eq!(stats.requests, 3);
    }
}
