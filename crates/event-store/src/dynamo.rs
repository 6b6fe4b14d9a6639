//! `BatchWriteItem` to its limits: requests of 25, several in flight, and
//! `UnprocessedItems` retried with capped exponential backoff and jitter.
//! What still fails is handed back to the caller by tag (a pump record's
//! sequence number, a scan item's buffer key), never dropped.

use std::collections::HashMap;
use std::future::Future;

use aws_sdk_dynamodb::types::WriteRequest;
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

/// Groups equal keys so a batch never names one item twice (DynamoDB rejects
/// such a batch as a whole); the last write of a key wins.
pub fn dedupe_by_key<K: std::hash::Hash + Eq + Clone, V>(items: Vec<(K, V)>) -> Vec<(K, V)> {
    let mut last: HashMap<K, usize> = HashMap::new();
    for (i, (k, _)) in items.iter().enumerate() {
        last.insert(k.clone(), i);
    }
    items.into_iter().enumerate().filter(|(i, (k, _))| last.get(k) == Some(i)).map(|(_, kv)| kv).collect()
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
    fn duplicate_keys_keep_the_last_write() {
        let items = vec![("a", 1), ("b", 2), ("a", 3)];
        assert_eq!(dedupe_by_key(items), vec![("b", 2), ("a", 3)]);
    }
}
