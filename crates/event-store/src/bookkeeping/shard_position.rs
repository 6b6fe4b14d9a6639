//! How far the pump has buffered each shard of the event stream: the last
//! sequence number of an unbroken run of buffered records, and the (made
//! non-decreasing) arrival it was stored with. Written by the pump after its
//! buffer writes, forward only; read by the pump (to continue the arrival
//! order across batches and to skip redelivered records) and by the scan,
//! which asks Kinesis what lies after it (`docs/design.md#4-completeness-the-watermark`).
//!
//! The pump's family (slot -3). A stack upgraded from when every family
//! shared slot -2 has its positions there until the pump next writes each
//! shard: a shard's position is the further of the two, so nothing moves
//! (the event source hands a shard's batches to one pump at a time, so the
//! old position is never further on than a new one).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity};

use super::{get_in, key_in, moved_forward, query_in, sort_key_of, Family};
use crate::error::{Error, Result};
use crate::event_item::sortable_sequence;

const PREFIX: &str = "shard#";

/// One shard's buffered position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPosition {
    pub shard_id: String,
    /// Every record of the shard up to this sequence number is in the buffer (or moved on).
    pub sequence: String,
    /// The arrival the record at `sequence` was stored with: no later record
    /// of the shard is stored with an earlier one.
    pub arrival: i64,
}

impl ShardPosition {
    /// True when `sequence` is at or before this position (already buffered).
    pub(crate) fn covers(&self, sequence: &str) -> bool {
        sortable_sequence(sequence) <= sortable_sequence(&self.sequence)
    }

    /// The further of two positions of one shard.
    fn further(self, other: Option<Self>) -> Self {
        match other {
            Some(other) if sortable_sequence(&other.sequence) > sortable_sequence(&self.sequence) => other,
            _ => self,
        }
    }

    fn from_item(item: &HashMap<String, AttributeValue>) -> Option<Self> {
        let shard_id = sort_key_of(item)?.strip_prefix(PREFIX)?.to_owned();
        let sequence = item.get("sequence")?.as_s().ok()?.clone();
        let arrival = item.get("arrival")?.as_n().ok()?.parse().ok()?;
        Some(Self { shard_id, sequence, arrival })
    }
}

/// The arrival each record is stored with: Kinesis' approximate arrival,
/// raised where needed so that arrivals never decrease along the shard
/// (AWS does not promise they do), starting from the position's arrival.
pub(crate) fn non_decreasing(previous: Option<i64>, arrivals: impl IntoIterator<Item = i64>) -> Vec<i64> {
    let mut floor = previous.unwrap_or(i64::MIN);
    arrivals
        .into_iter()
        .map(|arrival| {
            floor = floor.max(arrival);
            floor
        })
        .collect()
}

fn position_key(shard_id: &str) -> String {
    format!("{PREFIX}{shard_id}")
}

/// One shard's position (strongly consistent), if the pump has recorded one.
pub(crate) async fn read(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    shard_id: &str,
) -> Result<Option<ShardPosition>> {
    // Once the pump has written a shard's position here, it is the further one.
    if let Some(item) = get_in(dynamo, table, Family::Pump, position_key(shard_id)).await? {
        return Ok(ShardPosition::from_item(&item));
    }
    let legacy = get_in(dynamo, table, Family::legacy(), position_key(shard_id)).await?;
    Ok(legacy.as_ref().and_then(ShardPosition::from_item))
}

/// Every shard's position, by shard id.
pub(crate) async fn read_all(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<HashMap<String, ShardPosition>> {
    let range = || (PREFIX.to_owned(), format!("{PREFIX}~"));
    let mut positions: HashMap<String, ShardPosition> = HashMap::new();
    for family in [Family::legacy(), Family::Pump] {
        let (items, _) = query_in(dynamo, table, family, range()).await?;
        for position in items.iter().filter_map(ShardPosition::from_item) {
            let known = positions.remove(&position.shard_id);
            positions.insert(position.shard_id.clone(), position.further(known));
        }
    }
    Ok(positions)
}

/// Moves a shard's position forward to `position` (never backward: a
/// conditional write on the sortable sequence). False when it was already there.
pub(crate) async fn advance(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    position: &ShardPosition,
    now_ms: i64,
) -> Result<bool> {
    let result = dynamo
        .update_item()
        .table_name(table)
        .set_key(Some(key_in(Family::Pump, position_key(&position.shard_id))))
        .update_expression("SET #seq = :seq, sequence_key = :key, arrival = :arrival, updated_at = :now")
        .condition_expression("attribute_not_exists(sequence_key) OR sequence_key < :key")
        .expression_attribute_names("#seq", "sequence")
        .expression_attribute_values(":seq", AttributeValue::S(position.sequence.clone()))
        .expression_attribute_values(":key", AttributeValue::S(sortable_sequence(&position.sequence)))
        .expression_attribute_values(":arrival", AttributeValue::N(position.arrival.to_string()))
        .expression_attribute_values(":now", AttributeValue::N(now_ms.to_string()))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await;
    moved_forward(result)
}

fn floor_key(shard_id: &str, sequence: &str) -> String {
    format!("{FLOOR_PREFIX}{shard_id}#{}", sortable_sequence(sequence))
}

/// The floor markers' prefix (not under [`PREFIX`]: they are no positions).
const FLOOR_PREFIX: &str = "floor#";
/// How long a floor is kept: as long as the pump's dead-letter queue keeps a message (14 days).
const FLOOR_SECONDS: i64 = 14 * 24 * 3600;

/// Records the floor the arrivals of a shard's records from `sequence` on
/// were made non-decreasing from (the arrival of the record before it),
/// when the pump hands them back to the event source. Should the source
/// give them up, a re-buffer starts from the same floor, so every record
/// stored ahead of the failure gets its stored arrival (and sort key) again.
pub(crate) async fn save_floor(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (shard_id, sequence): (&str, &str),
    arrival: i64,
    now_ms: i64,
) -> Result<()> {
    let mut item = key_in(Family::Pump, floor_key(shard_id, sequence));
    item.insert("arrival".into(), AttributeValue::N(arrival.to_string()));
    item.insert("expires_at".into(), AttributeValue::N((now_ms / 1000 + FLOOR_SECONDS).to_string()));
    dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(item))
        .return_consumed_capacity(ReturnConsumedCapacity::Total)
        .send()
        .await
        .map_err(|e| Error::dynamo("PutItem", e))?;
    Ok(())
}

/// The floor recorded for a shard's records from `sequence` on, if any.
pub(crate) async fn floor(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    (shard_id, sequence): (&str, &str),
) -> Result<Option<i64>> {
    let arrival = |item: Option<HashMap<String, AttributeValue>>| item?.get("arrival")?.as_n().ok()?.parse().ok();
    if let Some(floor) = arrival(get_in(dynamo, table, Family::Pump, floor_key(shard_id, sequence)).await?) {
        return Ok(Some(floor));
    }
    Ok(arrival(get_in(dynamo, table, Family::legacy(), floor_key(shard_id, sequence)).await?))
}

/// Deletes every shard position, so the pump writes everything it is given
/// again (rebuilding a buffer from the stream; the benchmark's rounds).
pub async fn forget_all(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<usize> {
    let positions = read_all(dynamo, table).await?;
    for shard_id in positions.keys() {
        for family in [Family::Pump, Family::legacy()] {
            dynamo
                .delete_item()
                .table_name(table)
                .set_key(Some(key_in(family, position_key(shard_id))))
                .send()
                .await
                .map_err(|e| Error::dynamo("DeleteItem", e))?;
        }
    }
    Ok(positions.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_never_go_back_along_a_shard_and_continue_from_the_last_batch() {
        assert_eq!(non_decreasing(None, [5, 3, 7, 6, 9]), vec![5, 5, 7, 7, 9]);
        assert_eq!(non_decreasing(Some(8), [5, 9, 7]), vec![8, 9, 9], "the previous batch's last arrival is a floor");
        assert!(non_decreasing(Some(1), []).is_empty());
    }

    #[test]
    fn a_position_covers_sequence_numbers_numerically() {
        let p = ShardPosition { shard_id: "s".into(), sequence: "100".into(), arrival: 0 };
        assert!(p.covers("99") && p.covers("100"));
        assert!(!p.covers("101") && !p.covers("1000"));
    }

    #[test]
    fn of_two_positions_of_a_shard_the_further_counts() {
        let at = |sequence: &str| ShardPosition { shard_id: "s".into(), sequence: sequence.into(), arrival: 0 };
        assert_eq!(at("100").further(Some(at("99"))), at("100"));
        assert_eq!(at("99").further(Some(at("100"))), at("100"), "numerically, not as text");
        assert_eq!(at("7").further(None), at("7"));
    }

    #[test]
    fn positions_read_back_from_their_items() {
        let mut item = key_in(Family::Pump, position_key("shardId-000000000001"));
        item.insert("sequence".into(), AttributeValue::S("4956".into()));
        item.insert("arrival".into(), AttributeValue::N("1700".into()));
        let p = ShardPosition::from_item(&item).unwrap();
        assert_eq!(
            p,
            ShardPosition { shard_id: "shardId-000000000001".into(), sequence: "4956".into(), arrival: 1700 }
        );
        item.remove("arrival");
        assert_eq!(ShardPosition::from_item(&item), None);
    }
}
