//! Which of a shard's records are copies of events already in the log: entity
//! versions at or below their stream's logged one, and retries of a client's
//! `EventId` already buffered. Read before the buffer writes, recorded after.

use std::collections::HashMap;

use aws_lambda_events::event::kinesis::KinesisEventRecord;
use tracing::warn;

use crate::bookkeeping::entity_positions::{Logged, Positions};
use crate::envelope::{client_event, client_id_marker, entity_event, entity_stream};
use crate::error::Result;

/// Entity records that are copies: a version at or below its stream's
/// logged one, or seen earlier in this batch. The relay puts each stream's
/// versions in order, so the first record of a version is the one to keep.
/// A batch that goes over records an earlier delivery already logged (its
/// shard position was not saved) decides from the version logged before
/// that delivery: it keeps what that delivery kept, so the chunks it writes
/// again under the same keys hold the same events.
pub(super) async fn entity_copies(log: &Positions, records: &[&KinesisEventRecord], copies: &mut Copies) -> Result<()> {
    let versions: Vec<Option<(String, u64)>> = records
        .iter()
        .map(|r| {
            entity_stream(&r.kinesis.partition_key)?;
            entity_event(&r.kinesis.data)
        })
        .collect();
    let mut streams: Vec<&str> = versions.iter().flatten().map(|(stream, _)| stream.as_str()).collect();
    if streams.is_empty() {
        return Ok(());
    }
    streams.sort_unstable();
    streams.dedup();
    let entries = log.logged_entries(&streams).await?;
    let mut logged: HashMap<String, Option<u64>> = HashMap::new();
    for (i, entry) in versions.iter().enumerate() {
        let Some((stream, version)) = entry else { continue };
        if !logged.contains_key(stream) {
            let base = entries.get(stream).and_then(|e| e.base_for(&copies.shard, &records[i].kinesis.sequence_number));
            logged.insert(stream.clone(), base);
            copies.bases.insert(stream.clone(), base);
        }
        let at = logged.get(stream).copied().flatten();
        match at {
            Some(at) if *version <= at => copies.dropped[i] = true,
            Some(at) if *version > at + 1 => {
                warn!(
                    stream,
                    logged = at,
                    version,
                    "entity versions missing before this one (a record given up on upstream)"
                )
            }
            _ => {}
        }
        if !copies.dropped[i] {
            logged.insert(stream.clone(), Some(*version));
            copies.versions.push((i, stream.clone(), *version, records[i].kinesis.sequence_number.clone()));
        }
    }
    Ok(())
}

/// Ingest records with a client's `EventId` that are copies: a retry of an
/// event whose first record (another sequence number) is buffered, or seen
/// earlier in this batch. Every copy has the same partition key, so they
/// all come through one shard, in order: the first is the one kept.
pub(super) async fn client_copies(log: &Positions, records: &[&KinesisEventRecord], copies: &mut Copies) -> Result<()> {
    let markers: Vec<Option<String>> = records
        .iter()
        .map(|r| match entity_stream(&r.kinesis.partition_key) {
            Some(_) => None,
            None => client_event(&r.kinesis.data).map(|id| client_id_marker(&id)),
        })
        .collect();
    let asked: Vec<&str> = markers.iter().flatten().map(String::as_str).collect();
    if asked.is_empty() {
        return Ok(());
    }
    let mut buffered = log.buffered_ids(&asked).await?;
    for (i, marker) in markers.into_iter().enumerate() {
        let Some(marker) = marker else { continue };
        let sequence = &records[i].kinesis.sequence_number;
        match buffered.get(&marker) {
            // The first record's own redelivery is kept: the same record makes the same item.
            Some(first) if first != sequence => copies.dropped[i] = true,
            _ => {
                buffered.insert(marker.clone(), sequence.clone());
                copies.ids.push((i, marker, sequence.clone()));
            }
        }
    }
    Ok(())
}

/// The copies among one shard's batch, and what the others log.
pub(super) struct Copies {
    /// The shard the batch is of.
    pub(super) shard: String,
    pub(super) dropped: Vec<bool>,
    /// (record index, stream, version, sequence number) of every entity record kept, in order.
    pub(super) versions: Vec<(usize, String, u64, String)>,
    /// Each stream's logged version the batch decided from.
    pub(super) bases: HashMap<String, Option<u64>>,
    /// (record index, marker, sequence number) of every record kept with a client's event id.
    pub(super) ids: Vec<(usize, String, String)>,
}

impl Copies {
    /// No copies yet among `records` records of `shard`.
    pub(super) fn new(shard: &str, records: usize) -> Self {
        Self {
            shard: shard.to_owned(),
            dropped: vec![false; records],
            versions: Vec::new(),
            bases: HashMap::new(),
            ids: Vec::new(),
        }
    }

    pub(super) fn count(&self) -> usize {
        self.dropped.iter().filter(|d| **d).count()
    }

    /// Each stream's `_log` after the records before index `done`: its
    /// highest version kept among them, the record that has it, and the
    /// version the batch decided from.
    pub(super) fn logged_through(&self, done: usize) -> HashMap<String, Logged> {
        let mut logged = HashMap::new();
        for (_, stream, version, sequence) in self.versions.iter().filter(|(i, _, _, _)| *i < done) {
            let before = self.bases.get(stream).copied().flatten();
            let entry = Logged { version: *version, shard: self.shard.clone(), sequence: sequence.clone(), before };
            logged.insert(stream.clone(), entry);
        }
        logged
    }
}
