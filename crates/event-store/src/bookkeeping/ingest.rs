//! Events moved into the event table per minute of their arrival, for the
//! ingest sparkline of `event-store status`: one item per minute, added to
//! by `ADD` at the end of each scan segment run (one `UpdateItem` per
//! minute the run moved events of, usually one or two), read by status.
//!
//! A count, not a ledger: a scan that crashes between its buffer deletes
//! and this write leaves its events uncounted, and one repaired after a crash
//! between its puts and deletes counts them twice. The log itself is exact;
//! this only draws its rate.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use super::{key, query_range, sort_key_of};
use crate::error::{Error, Result};

const PREFIX: &str = "ingest#";
pub const MINUTE_MS: i64 = 60_000;

/// The minute (its start, ms) an arrival falls in.
pub fn minute_of(arrival: i64) -> i64 {
    arrival.div_euclid(MINUTE_MS) * MINUTE_MS
}

fn minute_key(minute: i64) -> String {
    format!("{PREFIX}{minute:013}")
}

/// Adds `counts` (minute start -> events) to the minutes' items.
pub async fn add(dynamo: &aws_sdk_dynamodb::Client, table: &str, counts: &BTreeMap<i64, u64>) -> Result<()> {
    for (&minute, &events) in counts.iter().filter(|(_, n)| **n > 0) {
        dynamo
            .update_item()
            .table_name(table)
            .set_key(Some(key(minute_key(minute))))
            .update_expression("ADD events :n")
            .expression_attribute_values(":n", AttributeValue::N(events.to_string()))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
            .send()
            .await
            .map_err(|e| Error::dynamo("UpdateItem", e))?;
    }
    Ok(())
}

/// Events per minute for the `minutes` minutes that end with the one `now` is in, oldest first.
pub async fn per_minute(dynamo: &aws_sdk_dynamodb::Client, table: &str, now: i64, minutes: usize) -> Result<Vec<u64>> {
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
