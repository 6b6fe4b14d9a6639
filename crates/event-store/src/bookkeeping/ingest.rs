//! Events moved into the event table per minute of their arrival, for the
//! ingest sparkline of `event-store status`: one item per minute, added to
//! by `ADD` at the end of each scan segment run (one `UpdateItem` per
//! minute the run moved events of, usually one or two), read by status.
//!
//! A count, not a ledger: a scan that crashes between its buffer deletes
//! and this write leaves its events uncounted, and an item two overlapping
//! runs both moved, or one repaired after a crash between its puts and
//! deletes, is counted twice. The log itself is exact; this only draws its
//! rate. The items expire (`expires_at`, the event table's TTL) after
//! [`KEEP_MS`], as status reads only the last hour.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};
use futures::{StreamExt, TryStreamExt};

use super::{key, query_range, sort_key_of};
use crate::error::{Error, Result};

const PREFIX: &str = "ingest#";
pub const MINUTE_MS: i64 = 60_000;
/// How long a minute's count is kept.
pub const KEEP_MS: i64 = 2 * 86_400_000;
/// Minutes written at once (a run draining a backlog can touch hundreds).
const CONCURRENCY: usize = 16;

/// The minute (its start, ms) an arrival falls in.
pub(crate) fn minute_of(arrival: i64) -> i64 {
    arrival.div_euclid(MINUTE_MS) * MINUTE_MS
}

fn minute_key(minute: i64) -> String {
    format!("{PREFIX}{minute:013}")
}

/// Adds `counts` (minute start -> events) to the minutes' items.
pub(crate) async fn add(dynamo: &aws_sdk_dynamodb::Client, table: &str, counts: &BTreeMap<i64, u64>) -> Result<()> {
    let add_one = |(minute, events): (i64, u64)| async move {
        dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(key(minute_key(minute))))
            .update_expression("ADD events :n SET expires_at = :expires")
            .expression_attribute_values(":n", AttributeValue::N(events.to_string()))
            // The TTL attribute is in seconds.
            .expression_attribute_values(":expires", AttributeValue::N(((minute + KEEP_MS) / 1000).to_string()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map(|_| ())
            .map_err(|e| Error::dynamo("UpdateItem", e))
    };
    let counts: Vec<(i64, u64)> = counts.iter().filter(|(_, n)| **n > 0).map(|(m, n)| (*m, *n)).collect();
    futures::stream::iter(counts).map(add_one).buffer_unordered(CONCURRENCY).try_collect::<Vec<()>>().await.map(|_| ())
}

/// Events per minute for the `minutes` minutes that end with the one `now` is in, oldest first.
pub async fn per_minute(dynamo: &aws_sdk_dynamodb::Client, table: &str, now: i64, minutes: usize) -> Result<Vec<u64>> {
    if minutes == 0 {
        return Ok(Vec::new());
    }
    let last = minute_of(now);
    let first = last - (minutes as i64 - 1) * MINUTE_MS;
    let (items, _) = query_range(dynamo, table, minute_key(first), minute_key(last)).await?;
    let mut out = vec![0; minutes];
    for item in &items {
        let Some(minute) = sort_key_of(item).and_then(|k| k.strip_prefix(PREFIX)).and_then(|m| m.parse::<i64>().ok())
        else {
            continue;
        };
        let events = item.get("events").and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
        if let Some(slot) = usize::try_from((minute - first) / MINUTE_MS).ok().and_then(|i| out.get_mut(i)) {
            *slot += events;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_keyed_in_time_order() {
        assert_eq!(minute_of(1_795_327_159_999), 1_795_327_140_000);
        assert_eq!(minute_of(1_795_327_140_000), 1_795_327_140_000);
        assert!(minute_key(960_000) < minute_key(1_795_327_140_000), "13 digits: text order is time order");
    }
}
