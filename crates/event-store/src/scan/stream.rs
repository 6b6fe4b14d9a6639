//! The scan's look at the event stream when a pass starts: for every shard,
//! is there a record the pump has not buffered yet, and when did it arrive?
//! The pump's position says where its unbroken run of buffered records ends
//! ([`crate::bookkeeping::shard_position`]); Kinesis is asked for the next
//! record after it (`GetShardIterator AFTER_SEQUENCE_NUMBER`, `GetRecords
//! Limit=1`), or for the shard's first record when the pump has not started
//! it. Closed shards (a split or merge) are asked like open ones while
//! Kinesis still lists them, so an unread parent holds the watermark back
//! until the pump has read it; idle and fully read shards hold nothing back.

use aws_sdk_kinesis::types::{Shard, ShardIteratorType};
use futures::{StreamExt, TryStreamExt};

use crate::bookkeeping::shard_position::{self, ShardPosition};
use crate::error::{Error, Result};
use crate::kinesis::{get_records, list_shards};

/// Empty `GetRecords` answers followed before a shard counts as unknown
/// (Kinesis may answer empty while records lie further on).
const MAX_EMPTY_READS: usize = 5;
/// Shards asked at once.
const CONCURRENCY: usize = 8;

/// What Kinesis said about the part of a shard after the pump's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// The first record there, and its approximate arrival (ms).
    Record { arrival: i64 },
    /// Nothing there: the shard is buffered up to its tip (or closed and read to its end).
    CaughtUp,
    /// Empty answers though Kinesis says the tip is further on.
    Unknown,
}

/// What a shard allows the watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// Every record is buffered: no bound.
    None,
    /// The earliest arrival a not-yet-buffered record will be stored with.
    From(i64),
    /// No bound can be given: the pass must not move the watermark.
    Unknown,
}

/// The pump stores arrivals made non-decreasing from its position, so a
/// record after the position is stored no earlier than the position's arrival.
pub fn shard_bound(position: Option<&ShardPosition>, probe: Probe) -> Bound {
    let floor = position.map(|p| p.arrival);
    match probe {
        Probe::CaughtUp => Bound::None,
        Probe::Record { arrival } => Bound::From(floor.map_or(arrival, |f| f.max(arrival))),
        Probe::Unknown => floor.map_or(Bound::Unknown, Bound::From),
    }
}

/// The earliest arrival of a record in the stream that is not in the buffer
/// yet, over every shard Kinesis lists; `None` when every shard is buffered.
pub async fn unbuffered_from(
    kinesis: &aws_sdk_kinesis::Client,
    dynamo: &aws_sdk_dynamodb::Client,
    stream: &str,
    table: &str,
) -> Result<Option<i64>> {
    // Positions first: a record buffered after this read is found in the stream (a bound too early, never too late).
    let positions = shard_position::read_all(dynamo, table).await?;
    let shards = list_shards(kinesis, stream).await?;
    let bounds: Vec<Option<i64>> = futures::stream::iter(shards)
        .map(|shard| {
            let position = positions.get(shard.shard_id());
            async move {
                let probe = probe(kinesis, stream, &shard, position).await?;
                match shard_bound(position, probe) {
                    Bound::None => Ok(None),
                    Bound::From(arrival) => Ok(Some(arrival)),
                    Bound::Unknown => {
                        let source = format!("{}: empty answers short of the tip", shard.shard_id()).into();
                        Err(Error::Kinesis { operation: "GetRecords", source })
                    }
                }
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    Ok(bounds.into_iter().flatten().min())
}

pub(crate) async fn probe(
    kinesis: &aws_sdk_kinesis::Client,
    stream: &str,
    shard: &Shard,
    position: Option<&ShardPosition>,
) -> Result<Probe> {
    let request = kinesis.get_shard_iterator().stream_name(stream).shard_id(shard.shard_id());
    let request = match position {
        Some(p) => {
            request.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(&p.sequence)
        }
        None => request.shard_iterator_type(ShardIteratorType::TrimHorizon),
    };
    let out = request.send().await.map_err(|e| Error::kinesis("GetShardIterator", e))?;
    let mut iterator = out.shard_iterator().map(str::to_owned);
    for _ in 0..MAX_EMPTY_READS {
        let Some(current) = iterator.take() else { return Ok(Probe::CaughtUp) };
        let out = get_records(kinesis, current, 1).await?;
        if let Some(record) = out.records().first() {
            let arrival = record.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok());
            // A record without an arrival time cannot be placed: bound by the position only.
            return Ok(arrival.map_or(Probe::Unknown, |arrival| Probe::Record { arrival }));
        }
        if out.millis_behind_latest() == Some(0) {
            return Ok(Probe::CaughtUp);
        }
        // A closed shard read to its end has no next iterator.
        iterator = out.next_shard_iterator().map(str::to_owned);
    }
    Ok(Probe::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_bounds_the_watermark_only_while_it_has_unbuffered_records() {
        let at = |arrival| ShardPosition { shard_id: "s".into(), sequence: "9".into(), arrival };
        assert_eq!(shard_bound(Some(&at(500)), Probe::CaughtUp), Bound::None, "idle: holds nothing back");
        assert_eq!(shard_bound(None, Probe::CaughtUp), Bound::None, "empty, never read");
        assert_eq!(shard_bound(None, Probe::Record { arrival: 700 }), Bound::From(700), "never read: its first record");
        assert_eq!(shard_bound(Some(&at(500)), Probe::Record { arrival: 700 }), Bound::From(700));
        assert_eq!(
            shard_bound(Some(&at(800)), Probe::Record { arrival: 700 }),
            Bound::From(800),
            "stored no earlier than the position's arrival"
        );
        assert_eq!(shard_bound(Some(&at(500)), Probe::Unknown), Bound::From(500));
        assert_eq!(shard_bound(None, Probe::Unknown), Bound::Unknown, "no bound at all: no watermark this pass");
    }
}
