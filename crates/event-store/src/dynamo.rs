//! `BatchWriteItem` to its limits: requests of 25, several in flight, and
//! `UnprocessedItems` retried with capped exponential backoff and jitter.
//! What still fails is handed back to the caller by tag (a pump record's
//! sequence number, a scan item's buffer key), never dropped.
//!
//! Unprocessed requests are matched by the item's *key*: DynamoDB may hand
//! back an item with its numbers normalised (`1.50` as `1.5`), and a match
//! by whole value would then count an unwritten item as written.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::time::Instant;

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

/// A table to write to: its name and its key attributes (hash, then range).
#[derive(Debug, Clone, Copy)]
pub struct Table<'a> {
    pub name: &'a str,
    pub key: &'a [&'a str],
}

/// A write request's key, by which an unprocessed request is recognised.
pub(crate) fn request_key(request: &WriteRequest, key: &[&str]) -> Vec<Option<AttributeValue>> {
    let attributes = match (request.put_request(), request.delete_request()) {
        (Some(put), _) => put.item(),
        (None, Some(delete)) => delete.key(),
        (None, None) => return Vec::new(),
    };
    key.iter().map(|name| attributes.get(*name).cloned()).collect()
}

/// Writes every request to `table` and returns the tags of those that could
/// not be written after all retries, or before `give_up` (no retry starts
/// whose wait would end after it: a deadline-aware caller keeps its margin;
/// first tries always go out, so every run makes progress).
pub(crate) async fn write_all<T: Send>(
    client: &aws_sdk_dynamodb::Client,
    table: Table<'_>,
    requests: Vec<(T, WriteRequest)>,
    backoff: &Backoff,
    give_up: Option<Instant>,
) -> Vec<T> {
    let mut chunks = Vec::new();
    let mut iter = requests.into_iter().peekable();
    while iter.peek().is_some() {
        chunks.push(iter.by_ref().take(DYNAMO_BATCH_ITEMS).collect::<Vec<_>>());
    }
    futures::stream::iter(chunks)
        .map(|chunk| {
            let key_of = |request: &WriteRequest| request_key(request, table.key);
            retry_unprocessed(chunk, backoff, give_up, key_of, |reqs| send_batch_write(client, table.name, reqs))
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .flat_map(futures::stream::iter)
        .collect()
        .await
}

/// The retry loop of one batch: sends, then resends what came back
/// unprocessed (matched by `key_of`) until nothing is left, the attempts run
/// out, or the next wait would end after `give_up`. A request-level error
/// counts as an attempt in which nothing was written.
pub(crate) async fn retry_unprocessed<T, W, K, F, Fut>(
    items: Vec<(T, W)>,
    backoff: &Backoff,
    give_up: Option<Instant>,
    key_of: impl Fn(&W) -> K,
    mut send: F,
) -> Vec<T>
where
    W: Clone,
    K: PartialEq,
    F: FnMut(Vec<W>) -> Fut,
    Fut: Future<Output = Result<Vec<W>>>,
{
    let mut pending = items;
    for retry in 0..backoff.max_attempts {
        if pending.is_empty() {
            break;
        }
        if retry > 0 {
            // The first try always goes out (every run makes progress); a retry only if it can end in time.
            if give_up.is_some_and(|give_up| Instant::now() + backoff.ceiling(retry - 1) >= give_up) {
                warn!(items = pending.len(), retry, "out of time: left unwritten");
                break;
            }
            backoff.wait(retry - 1).await;
        }
        match send(pending.iter().map(|(_, w)| w.clone()).collect()).await {
            Ok(unprocessed) => {
                let unprocessed: Vec<K> = unprocessed.iter().map(&key_of).collect();
                pending.retain(|(_, w)| unprocessed.contains(&key_of(w)));
            }
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

pub(crate) fn keyed_puts<K, T>(
    items: impl IntoIterator<Item = (K, T, HashMap<String, AttributeValue>)>,
) -> KeyedPuts<K, T>
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

/// Every item of one partition (`name` = `value`), page after page, strongly consistent.
pub(crate) async fn query_partition(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    (name, value): (&str, AttributeValue),
) -> Result<Vec<HashMap<String, AttributeValue>>> {
    let (mut items, mut start) = (Vec::new(), None);
    loop {
        let page = client
            .query()
            .table_name(table)
            .key_condition_expression("#key = :key")
            .expression_attribute_names("#key", name)
            .expression_attribute_values(":key", value.clone())
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        items.extend(page.items().iter().cloned());
        start = page.last_evaluated_key;
        if start.is_none() {
            return Ok(items);
        }
    }
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
        let failed = retry_unprocessed(
            items,
            &fast(5),
            None,
            |r: &u32| *r,
            |reqs: Vec<u32>| {
                calls.push(reqs.clone());
                // First call leaves 2 and 3 unprocessed, second leaves 3, third writes all.
                let unprocessed: Vec<u32> = reqs.into_iter().filter(|&r| r as usize > calls.len()).collect();
                futures::future::ready(Ok(unprocessed))
            },
        )
        .await;
        assert!(failed.is_empty());
        assert_eq!(calls, vec![vec![1, 2, 3], vec![2, 3], vec![3]]);
    }

    #[tokio::test]
    async fn what_stays_unprocessed_is_reported_by_tag() {
        let items: Vec<(&str, u32)> = vec![("seq-1", 1), ("seq-2", 2)];
        let failed = retry_unprocessed(
            items,
            &fast(3),
            None,
            |r: &u32| *r,
            |reqs: Vec<u32>| futures::future::ready(Ok(reqs.into_iter().filter(|&r| r == 2).collect())),
        )
        .await;
        assert_eq!(failed, vec!["seq-2"]);

        let items: Vec<(&str, u32)> = vec![("seq-1", 1)];
        let mut attempts = 0;
        let failed = retry_unprocessed(
            items,
            &fast(4),
            None,
            |r: &u32| *r,
            |_: Vec<u32>| {
                attempts += 1;
                futures::future::ready(Err(Error::Config("down".into())))
            },
        )
        .await;
        assert_eq!((failed, attempts), (vec!["seq-1"], 4));
    }

    /// DynamoDB hands unprocessed items back with its own normal form of
    /// numbers: such an item is still unwritten (it was counted as written,
    /// and so deleted from the buffer, when matched by whole value).
    #[tokio::test]
    async fn an_unprocessed_item_is_recognised_by_its_key_not_its_whole_value() {
        let item = |price: &str| {
            let item = HashMap::from([
                ("id".to_string(), AttributeValue::S("k1".into())),
                ("price".to_string(), AttributeValue::N(price.into())),
            ]);
            WriteRequest::builder().put_request(PutRequest::builder().set_item(Some(item)).build().unwrap()).build()
        };
        let mut calls = 0;
        let failed = write_requests_with(vec![("seq-1", item("1.50"))], |_| {
            calls += 1;
            futures::future::ready(Ok(vec![item("1.5")]))
        })
        .await;
        assert_eq!((failed, calls), (vec!["seq-1"], 3), "retried, then reported as not written");
    }

    /// The retry loop as `write_all` runs it on a buffer table (key `id`).
    async fn write_requests_with<F, Fut>(items: Vec<(&'static str, WriteRequest)>, send: F) -> Vec<&'static str>
    where
        F: FnMut(Vec<WriteRequest>) -> Fut,
        Fut: Future<Output = Result<Vec<WriteRequest>>>,
    {
        retry_unprocessed(items, &fast(3), None, |r: &WriteRequest| request_key(r, &["id"]), send).await
    }

    #[tokio::test]
    async fn no_retry_starts_that_would_end_after_the_give_up_time() {
        let slow = Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(5), max_attempts: 10 };
        let started = Instant::now();
        let mut calls = 0;
        let failed = retry_unprocessed(
            vec![("seq-1", 1u32)],
            &slow,
            Some(started + Duration::from_millis(2_500)),
            |r: &u32| *r,
            |reqs: Vec<u32>| {
                calls += 1;
                futures::future::ready(Ok(reqs))
            },
        )
        .await;
        assert_eq!(failed, vec!["seq-1"]);
        assert!(started.elapsed() < Duration::from_millis(2_500), "{:?}", started.elapsed());
        assert!((2..=3).contains(&calls), "the first try and the retries that fit: {calls}");
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
