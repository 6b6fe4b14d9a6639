//! Re-buffering records the pump's event source gave up on: written again
//! from their dead-letter record, with the arrivals they were first stored
//! with where the pump handed them back (`docs/operations.md`).

use std::collections::HashSet;

use aws_lambda_events::event::kinesis::{KinesisEvent, KinesisEventRecord};
use tracing::{error, info};

use super::copies::{client_copies, Copies};
use super::{by_shard, Pump};
use crate::bookkeeping::shard_position::{self, non_decreasing};

impl Pump {
    /// Buffers records given up on earlier (re-buffered from the failure
    /// destination): every record is written whatever the shard's position
    /// says (it has moved past them), with its own arrival made
    /// non-decreasing along the batch; the position is left alone. Returns
    /// the sequence numbers not written.
    pub async fn buffer_again(&self, event: KinesisEvent) -> Vec<String> {
        self.buffer_again_after(event, None).await.0
    }

    /// [`Self::buffer_again`] for a later part of one shard's re-buffered
    /// range: its arrivals go on from `carried`, the last arrival the part
    /// before it was stored with. Returns that of this part too.
    pub(crate) async fn buffer_again_after(
        &self,
        event: KinesisEvent,
        carried: Option<i64>,
    ) -> (Vec<String>, Option<i64>) {
        let mut last_arrival = carried;
        // Entity records are not dropped by their stream's logged version here: a record
        // given up on was never buffered, and a later version may have been logged since
        // (the hole the give-up made); a copy among them reaches readers as a copy. A
        // client's event id is checked: the client may have retried that event since.
        let mut failed = Vec::new();
        for (shard_id, records) in by_shard(&event.records) {
            let all = || records.iter().map(|r| r.kinesis.sequence_number.clone()).collect::<Vec<_>>();
            let mut copies = Copies::new(&shard_id, records.len());
            let first = records.first().map_or("", |r| r.kinesis.sequence_number.as_str());
            // The floor the records were first stored from, if the pump handed them back
            // (records stored ahead of the failure then get their stored sort keys again).
            let floor = match shard_position::floor(&self.dynamo, &self.config.event_table, (&shard_id, first)).await {
                Ok(floor) => floor,
                Err(err) => {
                    error!(error = %err, shard_id, "arrival floor unreadable: not buffered again");
                    failed.extend(all());
                    continue;
                }
            };
            if let Some(log) = &self.entity_log {
                if let Err(err) = client_copies(log, &records, &mut copies).await {
                    error!(error = %err, shard_id, "client ids unreadable: not buffered again");
                    failed.extend(all());
                    continue;
                }
            }
            let arrivals = non_decreasing(
                floor.max(carried),
                records.iter().map(|r| r.kinesis.approximate_arrival_timestamp.timestamp_millis()),
            );
            last_arrival = arrivals.last().copied().or(last_arrival);
            let (kept, kept_arrivals): (Vec<&KinesisEventRecord>, Vec<i64>) = records
                .iter()
                .zip(arrivals)
                .zip(&copies.dropped)
                .filter(|(_, dropped)| !**dropped)
                .map(|((r, arrival), _)| (*r, arrival))
                .unzip();
            let (buildable, not_done) = self.write(&kept, &kept_arrivals).await;
            info!(
                shard_id,
                records = records.len(),
                copies = copies.count(),
                failed = not_done.len(),
                floor,
                "buffered again"
            );
            let written: HashSet<&str> = kept[..buildable]
                .iter()
                .map(|r| r.kinesis.sequence_number.as_str())
                .filter(|sequence| !not_done.iter().any(|n| n == sequence))
                .collect();
            copies.ids.retain(|(i, _, _)| written.contains(records[*i].kinesis.sequence_number.as_str()));
            if let Err(err) = self.save_logged(&copies, records.len()).await {
                error!(error = %err, shard_id, "client ids not saved: buffered again on the next re-buffer");
                failed.extend(all());
                continue;
            }
            failed.extend(not_done);
            failed.extend(kept[buildable..].iter().map(|r| r.kinesis.sequence_number.clone()));
        }
        (failed, last_arrival)
    }
}
