//! What one rate needs: shards, scan segments, slices (the scan's writes simulated), readers.

use std::collections::HashMap;

use super::prices::{
    CHUNK_OVERHEAD_BYTES, EVENT_BYTES, MAX_SCAN_SEGMENTS, MAX_SLICES, MAX_SUBSCRIPTION_PARTITIONS, MB_PER_VCPU,
    PARTITION_RCU, PARTITION_WCU, PIXEL_SECONDS, PUMP_BATCH, PUMP_MEMORY_MB, RUNNER_RAW_BYTES_PER_S, SCAN_CYCLE_S,
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
    /// Simulated peak write units a second on one event-table partition key, with one key a slot and with the slices chosen.
    pub peak_wcu_one_key: f64,
    /// Slices (`Slices`) so that no key takes more than its share of 1,000 write units a second.
    pub slices: usize,
    pub peak_wcu: f64,
    /// Write units per event at that slice count (measured cut into slices when it is above 1).
    pub write_units_per_event: f64,
    pub buffer_wcu_s: f64,
    pub event_wcu_s: f64,
    /// Read units per delivered event for one subscription (any partition count dividing the slices).
    pub read_units_per_delivered: f64,
    /// Read units a second one real-time subscription takes from one slice key.
    pub subscription_rcu_per_slice: f64,
    /// Real-time subscriptions one slice key carries (3,000 read units a second).
    pub subscriptions_per_slice: usize,
    /// Runners one subscription needs to keep up, and the partitions that gives it (a power of two, at most the slices or 1,024).
    pub subscription_runners: usize,
    pub subscription_partitions: usize,
    pub target_shards: usize,
    /// Runs of a playback (`--parallel`) that fill those shards, and one
    /// hour's events played back by them and by one run, in seconds.
    pub playback_runs: usize,
    pub playback_hour_s: f64,
    pub playback_hour_one_run_s: f64,
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

    // Runners one subscription needs to keep up, as partitions: a power of two the slices line up with.
    let subscription_runners = (events_per_s * EVENT_BYTES / RUNNER_RAW_BYTES_PER_S).ceil() as usize;
    let subscription_partitions = subscription_runners.next_power_of_two().min(MAX_SUBSCRIPTION_PARTITIONS);

    // Slices: as many as the hottest key's writes need, and at least the partitions (each reads its own).
    let pattern = Pattern { shards, shard_rate, batch, bytes_per_event: m.stored_bytes_per_event, scan_segments };
    let peak_wcu_one_key = pattern.peak_wcu(1);
    let mut slices = 1;
    let mut peak_wcu = peak_wcu_one_key;
    while (peak_wcu > PARTITION_WCU * UTILISATION || slices < subscription_partitions) && slices < MAX_SLICES {
        slices *= 2;
        peak_wcu = pattern.peak_wcu(slices);
    }

    // Writes: the pump's put and the scan's delete on the buffer, the scan's put on the event table.
    let write_units_per_event = match (&m.delivery, slices) {
        (Some(d), s) if s > 1 => d.write_units_cut,
        _ => m.write_units_per_event,
    };
    let buffer_wcu_s = events_per_s * write_units_per_event * 2.0 / 3.0;
    let event_wcu_s = events_per_s * write_units_per_event / 3.0;
    // A subscription's partitions read only their slices: a delivered event costs what one reader of
    // the log pays for it, whatever the partitions (measured; else a unit per 4 KB of stored event).
    let read_units_per_delivered =
        m.delivery.as_ref().map_or(m.stored_bytes_per_event / 4096.0, |d| d.read_units_per_event);
    let subscription_rcu_per_slice = events_per_s * read_units_per_delivered / slices as f64;
    let subscriptions_per_slice = (PARTITION_RCU * UTILISATION / subscription_rcu_per_slice).floor() as usize;
    let target_shards = (events_per_s * EVENT_BYTES / (SHARD_BYTES_PER_S * UTILISATION)).ceil() as usize;
    // A playback onto those shards: runs of `RUNNER_RAW_BYTES_PER_S` each, as many as fill them (a
    // power of two, so that they line up with the slices), at the shards' whole limit.
    let target_bytes_per_s = target_shards as f64 * SHARD_BYTES_PER_S;
    let playback_runs =
        ((target_bytes_per_s / RUNNER_RAW_BYTES_PER_S).ceil() as usize).next_power_of_two().min(MAX_SLICES);
    let hour_bytes = events_per_s * EVENT_BYTES * 3600.0;
    let playback_hour_s = hour_bytes / target_bytes_per_s.min(playback_runs as f64 * RUNNER_RAW_BYTES_PER_S);
    let playback_hour_one_run_s = hour_bytes / target_bytes_per_s.min(RUNNER_RAW_BYTES_PER_S);
    let pixel = (events_per_s * PIXEL_SECONDS).ceil() as usize;
    let pump = (shards as f64 * pump_duty.min(1.0)).ceil() as usize;
    let concurrency = pump + scan_segments + subscription_partitions + pixel;
    Plan {
        events_per_s,
        shards,
        pump_invocations_per_shard_s,
        pump_duty,
        chunk_bytes,
        scan_segments,
        scan_pass_s,
        peak_wcu_one_key,
        slices,
        peak_wcu,
        write_units_per_event,
        buffer_wcu_s,
        event_wcu_s,
        read_units_per_delivered,
        subscription_rcu_per_slice,
        subscriptions_per_slice,
        subscription_runners,
        subscription_partitions,
        target_shards,
        playback_runs,
        playback_hour_s,
        playback_hour_one_run_s,
        concurrency,
    }
}

/// The scan's writes onto the event table, simulated: every shard's pump
/// batches of one cycle cut into chunks at slot boundaries, the chunks dealt
/// to segments as the hash of their buffer key deals them, each segment
/// writing its chunks in scan (hash) order at its speed, each chunk onto
/// one of `K` keys of the slot at random (sub-keys by a hash of the chunk's
/// key; slices by the keys of its events, which the scan pools per slice).
struct Pattern {
    shards: usize,
    shard_rate: f64,
    batch: f64,
    bytes_per_event: f64,
    scan_segments: usize,
}

impl Pattern {
    /// The highest write units a second any one partition key takes.
    fn peak_wcu(&self, keys: usize) -> f64 {
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
                let key = (slot, rng.usize(..keys), clock.floor() as i64);
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
    fn shards_follow_the_record_limit_and_slices_grow_with_the_rate() {
        let m = measured();
        let [small, medium, large] = RATES.map(|r| plan(r, &m));
        assert_eq!((small.shards, medium.shards, large.shards), (2, 125, 1250));
        assert_eq!(small.slices, 1, "{small:?}");
        assert!(large.slices > 1 && large.slices.is_power_of_two() && large.peak_wcu <= 800.0, "{large:?}");
        assert!(large.subscription_partitions <= 1024 && large.subscription_partitions >= large.subscription_runners);
        // An hour plays back within the hour at every rate with parallel runs; one run takes days at the most.
        for p in RATES.map(|r| plan(r, &m)) {
            assert!(p.playback_hour_s < 3600.0 && p.playback_runs <= 1024, "{} events/s", p.events_per_s);
        }
        assert!(large.playback_hour_one_run_s > 86_400.0, "one run at 1,000,000 events/s: days");
        assert!(
            RATES.map(|r| plan(r, &m)).iter().all(|p| p.slices >= p.subscription_partitions),
            "a slice per partition at least"
        );
        assert!(large.peak_wcu_one_key > 1000.0, "one key a slot breaks at a million a second: {large:?}");
        assert!(medium.scan_segments < large.scan_segments);
    }

    #[test]
    fn more_keys_a_slot_spread_the_same_writes() {
        let pattern =
            Pattern { shards: 100, shard_rate: 800.0, batch: 500.0, bytes_per_event: 200.0, scan_segments: 20 };
        let one = pattern.peak_wcu(1);
        let eight = pattern.peak_wcu(8);
        // The hottest of 8 keys a second is above an eighth of one key: whole chunks land at random.
        assert!(eight < one / 2.0, "K = 8 {eight}, K = 1 {one}");
    }
}
