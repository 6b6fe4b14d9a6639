//! The event stream's buffered frontier, as the scan looks at it when a pass starts (and status too): for every shard,
//! the lowest arrival a record not buffered yet can be stored with. The
//! pump's position says where its unbroken run of buffered records ends
//! ([`crate::bookkeeping::shard_position`]); Kinesis is asked for the next
//! record after it (`GetShardIterator AFTER_SEQUENCE_NUMBER`, `GetRecords
//! Limit=1`), or for the shard's first record when the pump has not started
//! it. Closed shards (a split or merge) are asked like open ones while
//! Kinesis still lists them, so an unread parent holds the watermark back
//! until the pump has read it; a closed shard read to its end bounds nothing.
//! The rule these bounds serve: [`crate::bookkeeping::watermark`].

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
    /// Closed and buffered to its end: nothing more comes from it.
    None,
    /// A record waits: it, and all after it, are stored no earlier than this.
    From(i64),
    /// Open and buffered up to its tip: the next record is stored no earlier
    /// than the position's arrival (if any), nor earlier than it arrives.
    CaughtUp(Option<i64>),
    /// No bound can be given: the pass must not move the watermark.
    Unknown,
}

/// The pump stores arrivals made non-decreasing from its position, so a
/// record after the position is stored no earlier than the position's arrival.
pub(crate) fn shard_bound(position: Option<&ShardPosition>, probe: Probe, closed: bool) -> Bound {
    let floor = position.map(|p| p.arrival);
    match probe {
        Probe::CaughtUp if closed => Bound::None,
        Probe::CaughtUp => Bound::CaughtUp(floor),
        Probe::Record { arrival } => Bound::From(floor.map_or(arrival, |f| f.max(arrival))),
        Probe::Unknown => floor.map_or(Bound::Unknown, Bound::From),
    }
}

/// What a pass learns from the stream when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// The earliest arrival of a record waiting in the stream, not yet buffered.
    pub unbuffered_from: Option<i64>,
    /// Every record not in the buffer yet is stored with an arrival at or after this.
    pub bound: i64,
}

/// Combines the shards' bounds; `clock_floor` is the pass start less
/// `WATERMARK_LAG_MS`, the earliest arrival a record put from now on gets
/// whatever Kinesis' clock says. `None` if a shard gave no bound.
pub(crate) fn look_of(bounds: &[Bound], clock_floor: i64) -> Option<Look> {
    let mut look = Look { unbuffered_from: None, bound: i64::MAX };
    for bound in bounds {
        let lowest = match *bound {
            Bound::None => continue,
            Bound::From(arrival) => {
                look.unbuffered_from = Some(look.unbuffered_from.map_or(arrival, |u| u.min(arrival)));
                arrival
            }
            Bound::CaughtUp(floor) => floor.map_or(clock_floor, |f| f.max(clock_floor)),
            Bound::Unknown => return None,
        };
        look.bound = look.bound.min(lowest);
    }
    // Every shard closed and read (a stream being replaced): the clock still bounds what comes.
    if look.bound == i64::MAX {
        look.bound = clock_floor;
    }
    Some(look)
}

/// The look at every shard Kinesis lists (see [`look_of`]).
pub(crate) async fn look(
    kinesis: &aws_sdk_kinesis::Client,
    dynamo: &aws_sdk_dynamodb::Client,
    stream: &str,
    table: &str,
    clock_floor: i64,
) -> Result<Look> {
    // Positions first: a record buffered after this read is found in the stream (a bound too early, never too late).
    let positions = shard_position::read_all(dynamo, table).await?;
    let shards = list_shards(kinesis, stream).await?;
    let bounds: Vec<(String, Bound)> = futures::stream::iter(shards)
        .map(|shard| {
            let position = positions.get(shard.shard_id());
            async move {
                let probe = probe(kinesis, stream, &shard, position).await?;
                let closed = shard.sequence_number_range().and_then(|r| r.ending_sequence_number()).is_some();
                Ok::<_, Error>((shard.shard_id().to_owned(), shard_bound(position, probe, closed)))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    let only: Vec<Bound> = bounds.iter().map(|(_, b)| *b).collect();
    look_of(&only, clock_floor).ok_or_else(|| {
        let unknown: Vec<&str> =
            bounds.iter().filter(|(_, b)| *b == Bound::Unknown).map(|(id, _)| id.as_str()).collect();
        let source = format!("{}: empty answers short of the tip", unknown.join(", ")).into();
        Error::Kinesis { operation: "GetRecords", source }
    })
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
    fn a_shard_bounds_the_watermark_by_what_it_will_store_next() {
        let at = |arrival| ShardPosition { shard_id: "s".into(), sequence: "9".into(), arrival };
        assert_eq!(shard_bound(Some(&at(500)), Probe::CaughtUp, false), Bound::CaughtUp(Some(500)));
        assert_eq!(shard_bound(Some(&at(500)), Probe::CaughtUp, true), Bound::None, "closed and read: nothing comes");
        assert_eq!(shard_bound(None, Probe::CaughtUp, false), Bound::CaughtUp(None), "empty, never read");
        assert_eq!(shard_bound(None, Probe::Record { arrival: 700 }, false), Bound::From(700), "its first record");
        assert_eq!(shard_bound(Some(&at(500)), Probe::Record { arrival: 700 }, true), Bound::From(700));
        assert_eq!(
            shard_bound(Some(&at(800)), Probe::Record { arrival: 700 }, false),
            Bound::From(800),
            "stored no earlier than the position's arrival"
        );
        assert_eq!(shard_bound(Some(&at(500)), Probe::Unknown, false), Bound::From(500));
        assert_eq!(shard_bound(None, Probe::Unknown, false), Bound::Unknown, "no bound at all");
    }

    #[test]
    fn a_busy_shard_bounds_by_its_own_arrivals_an_idle_one_by_the_clock() {
        let clock = 10_000;
        let look = |bounds: &[Bound]| look_of(bounds, clock);
        let busy = look(&[Bound::CaughtUp(Some(11_500)), Bound::CaughtUp(Some(11_800))]).unwrap();
        assert_eq!(busy, Look { unbuffered_from: None, bound: 11_500 }, "buffered to a recent arrival: past the clock");
        let idle = look(&[Bound::CaughtUp(Some(11_500)), Bound::CaughtUp(Some(3_000))]).unwrap();
        assert_eq!(idle.bound, clock, "an idle shard's next record may arrive any time from the clock floor");
        assert_eq!(look(&[Bound::CaughtUp(None)]).unwrap().bound, clock, "a shard never read");
        let waiting = look(&[Bound::CaughtUp(Some(11_500)), Bound::From(9_000), Bound::From(9_500)]).unwrap();
        assert_eq!(waiting, Look { unbuffered_from: Some(9_000), bound: 9_000 }, "the earliest waiting record");
        assert_eq!(look(&[Bound::From(12_000)]).unwrap().bound, 12_000, "a waiting record bounds by its own stamp");
        assert_eq!(look(&[Bound::None, Bound::None]).unwrap().bound, clock, "all closed: the clock");
        assert_eq!(look(&[Bound::CaughtUp(Some(11_500)), Bound::Unknown]), None, "one unknown shard: no bound");
    }
}
