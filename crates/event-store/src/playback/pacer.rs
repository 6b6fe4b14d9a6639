//! Paces puts to a rate in records and bytes per second: by default the
//! playback stream's write limit (per open shard 1,000 records and 1 MiB a
//! second). Pure: it only says when the next request may go.

use std::time::Duration;

/// Kinesis' write limits per shard.
pub const RECORDS_PER_SHARD_SECOND: u64 = 1000;
pub const BYTES_PER_SHARD_SECOND: u64 = 1024 * 1024;

/// The first request goes at once; each next one waits until the ones before it fit the rate.
#[derive(Debug, Clone)]
pub struct Pacer {
    records_per_second: f64,
    bytes_per_second: f64,
    records: u64,
    bytes: u64,
}

impl Pacer {
    pub(crate) fn new(records_per_second: u64, bytes_per_second: u64) -> Self {
        Self {
            records_per_second: records_per_second.max(1) as f64,
            bytes_per_second: bytes_per_second.max(1) as f64,
            records: 0,
            bytes: 0,
        }
    }

    /// The write limit of a stream with `shards` open shards.
    pub fn for_shards(shards: u64) -> Self {
        Self::new(shards * RECORDS_PER_SHARD_SECOND, shards * BYTES_PER_SHARD_SECOND)
    }

    /// One of `runs` equal shares of this pace.
    pub(crate) fn one_of(self, runs: u64) -> Self {
        let runs = runs.max(1) as f64;
        Self {
            records_per_second: (self.records_per_second / runs).max(1.0),
            bytes_per_second: (self.bytes_per_second / runs).max(1.0),
            ..self
        }
    }

    /// Time from the start before the next request may go.
    pub fn next_at(&self) -> Duration {
        let by_records = self.records as f64 / self.records_per_second;
        let by_bytes = self.bytes as f64 / self.bytes_per_second;
        Duration::from_secs_f64(by_records.max(by_bytes))
    }

    pub fn sent(&mut self, records: usize, bytes: usize) {
        self.records += records as u64;
        self.bytes += bytes as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pacer_holds_both_rates_and_lets_the_first_request_go_at_once() {
        let mut pacer = Pacer::new(1000, 1_000_000);
        assert_eq!(pacer.next_at(), Duration::ZERO);
        pacer.sent(500, 50_000);
        assert_eq!(pacer.next_at(), Duration::from_millis(500));
        pacer.sent(500, 1_950_000);
        assert_eq!(pacer.next_at(), Duration::from_secs(2), "bytes are the tighter limit now");
    }

    #[test]
    fn a_stream_paces_at_its_shards_write_limit() {
        let mut pacer = Pacer::for_shards(2);
        pacer.sent(1000, 10);
        assert_eq!(pacer.next_at(), Duration::from_millis(500));
        let mut quarter = Pacer::for_shards(2).one_of(4);
        quarter.sent(500, 10);
        assert_eq!(quarter.next_at(), Duration::from_secs(1), "one of four runs: a quarter of the limit");
    }
}
