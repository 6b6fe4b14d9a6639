//! Playback's put path alone, on one shard paced at its write limit: plain against aggregated records.

use std::time::Instant;

use anyhow::Result;
use event_store::batch::{Backoff, KINESIS_BATCH_RECORDS};
use event_store::kinesis::{put_in_key_order, send_put_records, OutgoingRecord};
use event_store::log::record::kinesis_records;
use event_store::log::RecordFormat;
use event_store::playback::Pacer;
use event_store_emulator::resources::{create_streams, Names};

use crate::measure::per_second;
use crate::tracking::payload;

/// Events through playback's put path alone, at 200 B: enough to see the pace.
pub(crate) const CAP_EVENTS: usize = 10_000;

/// Playback's put path alone (no DynamoDB, which is what bounds the full
/// stage on moto), onto a 1-shard stream paced at its write limit: events/s
/// with one record per event (`plain`, held to 1,000 records/s) and with
/// aggregated records. The played events are built beforehand.
pub(crate) async fn put_path_against_the_cap(
    sdk: &aws_config::SdkConfig,
    size: usize,
) -> Result<Vec<(RecordFormat, f64)>> {
    let kinesis = aws_sdk_kinesis::Client::new(sdk);
    let events: Vec<OutgoingRecord> = (0..CAP_EVENTS)
        .map(|i| OutgoingRecord { partition_key: format!("user-{}", i % 50), data: payload(i, size) })
        .collect();
    let mut out = Vec::new();
    for format in [RecordFormat::Plain, RecordFormat::Aggregated] {
        let names = Names::for_stack(&format!("bench-cap-{format:?}").to_lowercase());
        create_streams(&kinesis, &names, 1).await?;
        let stream = names.playback_stream.as_str();
        let mut pacer = Pacer::for_shards(1);
        let started = Instant::now();
        for batch in events.chunks(KINESIS_BATCH_RECORDS) {
            let records = kinesis_records(batch.to_vec(), format);
            tokio::time::sleep(pacer.next_at().saturating_sub(started.elapsed())).await;
            let kinesis = &kinesis;
            let put = put_in_key_order(
                &records,
                &Backoff::default(),
                |b| async move { send_put_records(kinesis, stream, &b).await },
                |b| async move { Ok(vec![false; b.len()]) },
            )
            .await;
            anyhow::ensure!(put.failures.is_empty(), "the put path failed {} records", put.failures.len());
            pacer.sent(records.len(), records.iter().map(OutgoingRecord::size).sum());
        }
        out.push((format, per_second(CAP_EVENTS, started.elapsed())));
    }
    Ok(out)
}
