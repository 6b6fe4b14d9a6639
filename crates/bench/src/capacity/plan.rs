//! What one rate needs: shards, scan segments, slot sub-keys (the scan's writes simulated), readers.

use std::collections::HashMap;

use super::prices::{
    CHUNK_OVERHEAD_BYTES, EVENT_BYTES, MAX_SCAN_SEGMENTS, MAX_SUBSCRIPTION_PARTITIONS, MB_PER_VCPU, PARTITION_RCU,
    PARTITION_WCU, PIXEL_SECONDS, PUMP_BATCH, PUMP_MEMORY_MB, RUNNER_RAW_BYTES_PER_S, SCAN_CYCLE_S,
    SEGMENT_BYTES_PER_S, SHARD_BYTES_PER_S, SHARD_RECORDS_PER_S, TIME_UNIT_S, UTILISATION, WRITE_LATENCY_S,
};
use super::Measured;

/// What one rate needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub events_per_s: f64,
    pub shards: usize,
    /// Pump invocations per shard per second, and the share of the shard's time they run.
    pub pump_invocations_per_shard_s: f64,
    pub pump_duty: f64,
    pub chunk_bytes: f64,
    pub scan_segments: usize,
    pub scan_pass_s: f64,
    /// Simulated peak write units a second on one event-table partition key, with K = 1 and the K chosen.
    pub peak_wcu_one_key: f64,
    pub subkeys: usize,
    pub peak_wcu: f64,
    pub buffer_wcu_s: f64,
    pub event_wcu_s: f64,
    /// Read units a second one real-time reader (playback, or one subscription partition) takes from one sub-key.
    pub reader_rcu_per_key: f64,
    /// Readers (subscription partitions, each reading the whole log) one sub-key carries at real time.
    pub readers_per_key: usize,
    pub subscription_partitions: usize,
    pub target_shards: usize,
    /// Peak Lambda concurrency: pump, scan, one subscription's runners, the pixel.
    pub concurrency: usize,
}

pub fn plan(events_per_s: f64, m: &Measured) -> Plan {
    let per_shard = (SHARD_RECORDS_PER_S.min(SHARD_BYTES_PER_S / EVENT_BYTES)) * UTILISATION;
    let shards = (events_per_s / per_shard).ceil() as usize;
    let shard_rate = events_per_s / shards as f64;
    // The event source mapping fills a batch or waits up to its 1 s window.
    let batch = PUMP_BATCH.min(shard_rate);
    let pump_invocations_per_shard_s = shard_rate / batch;
    let cpu_share = PUMP_MEMORY_MB / MB_PER_VCPU;
    let pack_s = batch * EVENT_BYTES / (m.pack_mb_per_second * 1e6 * cpu_share);
    let pump_duty = pump_invocations_per_shard_s * (pack_s + 2.0 * WRITE_LATENCY_S);
    let chunk_bytes = batch * m.stored_bytes_per_event + CHUNK_OVERHEAD_BYTES;

    let moved_per_s = events_per_s * m.stored_bytes_per_event;
    // Segments so that a pass takes at most half the cycle.
    let scan_segments = ((moved_per_s * 2.0 / SEGMENT_BYTES_PER_S).ceil() as usize).clamp(1, MAX_SCAN_SEGMENTS);
    let scan_pass_s = moved_per_s * SCAN_CYCLE_S / (scan_segments as f64 * SEGMENT_BYTES_PER_S);

    let pattern = Pattern { shards, shard_rate, batch, bytes_per_event: m.stored_bytes_per_event, scan_segments };
    let peak_wcu_one_key = pattern.peak_wcu(1);
    let mut subkeys = 1;
    let mut peak_wcu = peak_wcu_one_key;
    while peak_wcu > PARTITION_WCU * UTILISATION && subkeys < 1000 {
        subkeys = (subkeys * 2).min(1000);
        peak_wcu = pattern.peak_wcu(subkeys);
    }

    // Writes: the pump's put and the scan's delete on the buffer, the scan's put on the event table.
    let buffer_wcu_s = events_per_s * m.write_units_per_event * 2.0 / 3.0;
    let event_wcu_s = events_per_s * m.write_units_per_event / 3.0;
    // A strongly consistent read costs a unit per 4 KB; a real-time reader reads a second of log a second.
    let reader_rcu_per_key = moved_per_s / 4096.0 / subkeys as f64;
    let readers_per_key = (PARTITION_RCU * UTILISATION / reader_rcu_per_key).floor() as usize;
    let subscription_partitions = (events_per_s * EVENT_BYTES / RUNNER_RAW_BYTES_PER_S).ceil() as usize;
    let target_shards = (events_per_s * EVENT_BYTES / (SHARD_BYTES_PER_S * UTILISATION)).ceil() as usize;
    let pixel = (events_per_s * PIXEL_SECONDS).ceil() as usize;
    let pump = (shards as f64 * pump_duty.min(1.0)).ceil() as usize;
    let concurrency = pump + scan_segments + subscription_partitions.min(MAX_SUBSCRIPTION_PARTITIONS) + pixel;
    Plan {
        events_per_s,
        shards,
        pump_invocations_per_shard_s,
        pump_duty,
        chunk_bytes,
        scan_segments,
        scan_pass_s,
        peak_wcu_one_key,
        subkeys,
        peak_wcu,
        buffer_wcu_s,
        event_wcu_s,
        reader_rcu_per_key,
        readers_per_key,
        subscription_partitions,
        target_shards,
        concurrency,
    }
}

/// The scan's writes onto the event table, simulated: every shard's pump
/// batches of one cycle cut into chunks at slot boundaries, the chunks dealt
/// to segments as the hash of their buffer key deals them, each segment
/// writing its chunks in scan (hash) order at its speed, each chunk onto
/// `slot + hash(sort key) % K`.
struct Pattern {
    shards: usize,
    shard_rate: f64,
    batch: f64,
    bytes_per_event: f64,
    scan_segments: usize,
}

impl Pattern {
    /// The highest write units a second any one partition key takes.
    fn peak_wcu(&self, subkeys: usize) -> f64 {
        let mut rng = fastrand::Rng::with_seed(16);
        let batch_s = self.batch / self.shard_rate;
        let mut segments: Vec<Vec<(i64, f64)>> = vec![Vec::new(); self.scan_segments];
        for _ in 0..self.shards {
            let mut t = rng.f64() * batch_s;
            while t < SCAN_CYCLE_S {
                let end = t + batch_s;
                // One chunk per slot the batch touches, with that slot's share of its events.
                let mut from = t;
                while from < end {
                    let slot = (from / TIME_UNIT_S).floor();
                    let to = end.min((slot + 1.0) * TIME_UNIT_S);
                    let events = self.shard_rate * (to - from);
                    let bytes = events * self.bytes_per_event + CHUNK_OVERHEAD_BYTES;
                    segments[rng.usize(..self.scan_segments)].push((slot as i64, bytes));
                    from = to;
                }
                t = end;
            }
        }
        let mut load: HashMap<(i64, usize, i64), f64> = HashMap::new();
        for mut items in segments {
            rng.shuffle(&mut items);
            let mut clock = 0.0;
            for (slot, bytes) in items {
                clock += bytes / SEGMENT_BYTES_PER_S;
                let key = (slot, rng.usize(..subkeys), clock.floor() as i64);
                *load.entry(key).or_default() += (bytes / 1024.0).ceil();
            }
        }
        load.into_values().fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capacity::tests::measured;
    use crate::capacity::RATES;

    #[test]
    fn shards_follow_the_record_limit_and_subkeys_grow_with_the_rate() {
        let m = measured();
        let [small, medium, large] = RATES.map(|r| plan(r, &m));
        assert_eq!((small.shards, medium.shards, large.shards), (2, 125, 1250));
        assert_eq!(small.subkeys, 1, "{small:?}");
        assert!(large.subkeys > 1 && large.peak_wcu <= 800.0, "{large:?}");
        assert!(large.peak_wcu_one_key > 1000.0, "one key a slot breaks at a million a second: {large:?}");
        assert!(medium.scan_segments < large.scan_segments);
    }

    #[test]
    fn more_subkeys_spread_the_same_writes() {
        let pattern =
            Pattern { shards: 100, shard_rate: 800.0, batch: 500.0, bytes_per_event: 200.0, scan_segments: 20 };
        let one = pattern.peak_wcu(1);
        let eight = pattern.peak_wcu(8);
        // The hottest of 8 keys a second is above an eighth of one key: whole chunks land at random.
        assert!(eight < one / 2.0, "K = 8 {eight}, K = 1 {one}");
    }
}
