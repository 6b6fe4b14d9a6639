//! Where a subscription's partitions keep their leases and checkpoints:
//! each partition number under a partition key of its own (`-600000 - n`,
//! in the subscriptions' family), so the runners of many partitions, each
//! renewing its lease and saving after every delivery, never all write one
//! key (DynamoDB takes about 1,000 writes a second per partition key).

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};

use super::{partition_key, Partition};
use crate::bookkeeping::{key_at, query_in, Family};
use crate::error::{Error, Result};

/// The partition key of partition `partition`'s item: in the subscriptions'
/// `LeadingKeys` range (`-6` followed by five digits).
pub fn partition_slot(partition: u32) -> i64 {
    Family::Subscriptions.slot() * 100_000 - i64::from(partition)
}

/// The key of partition `partition` of subscription `name`.
pub fn partition_item_key(name: &str, partition: u32) -> HashMap<String, AttributeValue> {
    key_at(partition_slot(partition), partition_key(name, partition))
}

/// The stored items of partitions `0..count` of `name` (those never run have
/// none yet), whoever left them; an upgraded stack's not moved yet where
/// they are (slot -2). One `BatchGetItem` per 100 partitions.
pub(super) async fn partition_items(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    name: &str,
    count: u32,
) -> Result<Vec<Partition>> {
    let mut by_number = BTreeMap::new();
    let range = (partition_key(name, 0), partition_key(name, 9_999));
    for item in query_in(dynamo, table, Family::legacy(), range).await?.0 {
        let partition = Partition::from_item(&item)?;
        by_number.insert(partition.partition, partition);
    }
    let numbers: Vec<u32> = (0..count).collect();
    for chunk in numbers.chunks(100) {
        let mut keys: Vec<_> = chunk.iter().map(|p| partition_item_key(name, *p)).collect();
        while !keys.is_empty() {
            let wanted = KeysAndAttributes::builder().set_keys(Some(keys)).consistent_read(true).build()?;
            let out = dynamo
                .batch_get_item()
                .request_items(table, wanted)
                .send()
                .await
                .map_err(|e| Error::dynamo("BatchGetItem", e))?;
            for item in out.responses().and_then(|r| r.get(table)).into_iter().flatten() {
                let partition = Partition::from_item(item)?;
                by_number.insert(partition.partition, partition);
            }
            // What DynamoDB left unprocessed (throttled), asked again.
            keys = out.unprocessed_keys().and_then(|u| u.get(table)).map(|k| k.keys().to_vec()).unwrap_or_default();
        }
    }
    Ok(by_number.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_partition_has_a_key_of_its_own_in_the_subscriptions_range() {
        assert_eq!(partition_slot(0), -600_000);
        assert_eq!(partition_slot(63), -600_063);
        let text = partition_slot(super::super::spec::MAX_PARTITIONS - 1).to_string();
        assert!(text.starts_with("-6") && text.len() == 7, "matches the role's -6????? grant: {text}");
    }
}
