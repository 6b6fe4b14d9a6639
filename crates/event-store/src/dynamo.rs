//! `BatchWriteItem` to its limits: requests of 25, several in flight, and
//! `UnprocessedItems` retried with capped exponential backoff and jitter.
//! What still fails is handed back to the caller by tag (a pump record's
//! sequence number, a scan item's buffer key), never dropped.

use std::collections::HashMap;
use std::future::Future;

use std::hash::Hash;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, ReturnConsumedCapacity, WriteRequest};
use futures::StreamExt;
use tracing::warn;

use crate::batch::{Backoff, DYNAMO_BATCH_ITEMS};
use crate::error::{Error, Result};

/// How many `BatchWriteItem` requests one call keeps in flight.
pub const WRITE_CONCURRENCY: usize = 8;

/// Sends one `BatchWriteItem` to one table; returns the unprocessed requests.
pub async fn send_batch_write(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    requests: Vec<WriteRequest>,
) -> Result<Vec<WriteRequest>> {
    let out = client
        .batch_write_item()
        .request_items(table, requests)
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("BatchWriteItem", e))?;
    Ok(out.unprocessed_items().and_then(|m| m.get(table)).cloned().unwrap_or_default())
}

/// Writes every request to `table` and returns the tags of those that could
/// not be written after all retries.
pub async fn write_all<T: Send>(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    requests: Vec<(T, WriteRequest)>,
    backoff: &Backoff,
) -> Vec<T> {
    let mut chunks = Vec::new();
    let mut iter = requests.into_iter().peekable();
    while iter.peek().is_some() {
        chunks.push(iter.by_ref().take(DYNAMO_BATCH_ITEMS).collect::<Vec<_>>());
    }
    futures::stream::iter(chunks)
        .map(|chunk| retry_unprocessed(chunk, backoff, |reqs| send_batch_write(client, table, reqs)))
        .buffer_unordered(WRITE_CONCURRENCY)
        .flat_map(futures::stream::iter)
        .collect()
        .await
}

/// The retry loop of one batch: sends, then resends what came back
/// unprocessed (matched by value) until nothing is left or the attempts run
/// out. A request-level error counts as an attempt in which nothing was written.
pub async fn retry_unprocessed<T, W, F, Fut>(items: Vec<(T, W)>, backoff: &Backoff, mut send: F) -> Vec<T>
where
    W: Clone + PartialEq,
    F: FnMut(Vec<W>) -> Fut,
    Fut: Future<Output = Result<Vec<W>>>,
{
    let mut pending = items;
    for retry in 0..backoff.max_attempts {
        if pending.is_empty() {
            break;
        }
        if retry > 0 {
            backoff.wait(retry - 1).await;
        }
        match send(pending.iter().map(|(_, w)| w.clone()).collect()).await {
            Ok(unprocessed) => pending.retain(|(_, w)| unprocessed.contains(w)),
            Err(err) => {
                warn!(error = %err, items = pending.len(), retry, "batch write failed; retrying")
            }
        }
    }
    pending.into_iter().map(|(tag, _)| tag).collect()
}

/// Put requests for a batch of items, one per key, with the tags of every
/// source item under its key: DynamoDB rejects a batch that names an item
/// twice, and a failed put must be reported for each source (a pump record's
/// sequence number, a scan's buffer key).
pub struct KeyedPuts<K, T> {
    pub requests: Vec<(K, WriteRequest)>,
    pub sources: HashMap<K, Vec<T>>,
    /// Sources whose request could not be built (reported as failed, never dropped).
    pub failed: Vec<T>,
}

pub fn keyed_puts<K, T>(items: impl IntoIterator<Item = (K, T, HashMap<String, AttributeValue>)>) -> KeyedPuts<K, T>
where
    K: Hash + Eq + Clone,
{
    let mut puts = KeyedPuts { requests: Vec::new(), sources: HashMap::new(), failed: Vec::new() };
    for (key, tag, item) in items {
        if let Some(tags) = puts.sources.get_mut(&key) {
            tags.push(tag);
            continue;
        }
        match PutRequest::builder().set_item(Some(item)).build() {
            Ok(put) => {
                puts.requests.push((key.clone(), WriteRequest::builder().put_request(put).build()));
                puts.sources.insert(key, vec![tag]);
            }
            Err(_) => puts.failed.push(tag),
        }
    }
    puts
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn fast(attempts: u32) -> Backoff {
        Backoff { base: Duration::from_micros(1), cap: Duration::from_micros(10), max_attempts: attempts }
    }

    #[tokio::test]
    async fn unprocessed_items_are_retried_until_written() {
        let mut calls: Vec<Vec<u32>> = Vec::new();
        let items: Vec<(char, u32)> = vec![('a', 1), ('b', 2), ('c', 3)];
        let failed = retry_unprocessed(items, &fast(5), |reqs: Vec<u32>| {
            calls.push(reqs.clone());
            // First call leaves 2 and 3 unprocessed, second leaves 3, third writes all.
            let unprocessed: Vec<u32> = reqs.into_iter().filter(|&r| r as usize > calls.len()).collect();
            futures::future::ready(Ok(unprocessed))
        })
        .await;
        assert!(failed.is_empty());
        assert_eq!(calls, vec![vec![1, 2, 3], vec![2, 3], vec![3]]);
    }

    #[tokio::test]
    async fn what_stays_unprocessed_is_reported_by_tag() {
        let items: Vec<(&str, u32)> = vec![("seq-1", 1), ("seq-2", 2)];
        let failed = retry_unprocessed(items, &fast(3), |reqs: Vec<u32>| {
            futures::future::ready(Ok(reqs.into_iter().filter(|&r| r == 2).collect()))
        })
        .await;
        assert_eq!(failed, vec!["seq-2"]);

        let items: Vec<(&str, u32)> = vec![("seq-1", 1)];
        let mut attempts = 0;
        let failed = retry_unprocessed(items, &fast(4), |_: Vec<u32>| {
            attempts += 1;
            futures::future::ready(Err(Error::Config("down".into())))
        })
        .await;
        assert_eq!((failed, attempts), (vec!["seq-1"], 4));
    }

    #[test]
    fn a_key_named_twice_gets_one_request_and_both_sources() {
        let item = |v: &str| HashMap::from([("id".to_string(), AttributeValue::S(v.to_string()))]);
        let puts = keyed_puts(vec![("a", 1, item("a")), ("b", 2, item("b")), ("a", 3, item("a"))]);
        assert_eq!(puts.requests.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(puts.sources["a"], vec![1, 3]);
        assert_eq!(puts.sources["b"], vec![2]);
        assert!(puts.failed.is_empty());
    }
}
