//! Pure batching and retry arithmetic shared by every stage: how to cut work
//! into requests that respect the AWS batch limits, and how long to wait
//! before retrying what a batch API left unprocessed.

use std::ops::Range;
use std::time::Duration;

/// `BatchWriteItem` takes at most 25 requests.
pub const DYNAMO_BATCH_ITEMS: usize = 25;
/// `PutRecords` takes at most 500 records ...
pub const KINESIS_BATCH_RECORDS: usize = 500;
/// ... and at most 5 MiB in all (data plus partition keys).
pub const KINESIS_BATCH_BYTES: usize = 5 * 1024 * 1024;
/// One Kinesis record (data plus partition key) is at most 1 MiB.
pub const KINESIS_RECORD_BYTES: usize = 1024 * 1024;

/// Length of the first request cut from items of the given sizes: at most
/// `max_count` items and `max_bytes` bytes, and at least one item (an item
/// larger than `max_bytes` goes alone; the service then rejects it with a
/// per-record error, which the caller reports).
pub(crate) fn first_chunk_len(sizes: &[usize], max_count: usize, max_bytes: usize) -> usize {
    let mut bytes = 0usize;
    for (i, &size) in sizes.iter().enumerate() {
        if i == max_count || (i > 0 && bytes + size > max_bytes) {
            return i;
        }
        bytes += size;
    }
    sizes.len()
}

/// Cuts items with the given sizes into consecutive ranges, each one request.
pub(crate) fn chunk_ranges(sizes: &[usize], max_count: usize, max_bytes: usize) -> Vec<Range<usize>> {
    let mut ranges = Vec::new();
    let mut start = 0;
    while start < sizes.len() {
        let end = start + first_chunk_len(&sizes[start..], max_count, max_bytes);
        ranges.push(start..end);
        start = end;
    }
    ranges
}

/// Capped exponential backoff with full jitter (the AWS Architecture Blog
/// recipe): attempt `n` waits a random time in `[0, min(cap, base * 2^n))`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
    /// Attempts in all, the first one included.
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { base: Duration::from_millis(50), cap: Duration::from_secs(5), max_attempts: 10 }
    }
}

impl Backoff {
    /// Upper bound of the wait before retry number `retry` (0 = first retry).
    pub(crate) fn ceiling(&self, retry: u32) -> Duration {
        let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The wait before retry number `retry`, for a uniform `random` in [0, 1).
    pub(crate) fn delay(&self, retry: u32, random: f64) -> Duration {
        self.ceiling(retry).mul_f64(random.clamp(0.0, 1.0))
    }

    /// Sleeps the jittered delay for retry number `retry`.
    pub async fn wait(&self, retry: u32) {
        tokio::time::sleep(self.delay(retry, fastrand::f64())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_by_count() {
        let sizes = vec![1; 60];
        let ranges = chunk_ranges(&sizes, DYNAMO_BATCH_ITEMS, usize::MAX);
        assert_eq!(ranges, vec![0..25, 25..50, 50..60]);
    }

    #[test]
    fn chunks_by_500_records() {
        let sizes = vec![10; 1001];
        let ranges = chunk_ranges(&sizes, KINESIS_BATCH_RECORDS, KINESIS_BATCH_BYTES);
        assert_eq!(ranges, vec![0..500, 500..1000, 1000..1001]);
    }

    #[test]
    fn chunks_by_bytes_at_5_mib() {
        // 1 MiB records: five fit exactly, the sixth starts a new request.
        let sizes = vec![KINESIS_RECORD_BYTES; 11];
        let ranges = chunk_ranges(&sizes, KINESIS_BATCH_RECORDS, KINESIS_BATCH_BYTES);
        assert_eq!(ranges, vec![0..5, 5..10, 10..11]);
        let total: usize = ranges.iter().map(|r| r.len()).sum();
        assert_eq!(total, 11);
    }

    #[test]
    fn oversized_item_gets_its_own_chunk() {
        let ranges = chunk_ranges(&[10, 100, 10], 500, 50);
        assert_eq!(ranges, vec![0..1, 1..2, 2..3]);
        assert!(chunk_ranges(&[], 25, 10).is_empty());
    }

    #[test]
    fn backoff_grows_exponentially_and_is_capped() {
        let b = Backoff { base: Duration::from_millis(100), cap: Duration::from_secs(1), max_attempts: 5 };
        assert_eq!(b.ceiling(0), Duration::from_millis(100));
        assert_eq!(b.ceiling(1), Duration::from_millis(200));
        assert_eq!(b.ceiling(3), Duration::from_millis(800));
        assert_eq!(b.ceiling(4), Duration::from_secs(1));
        assert_eq!(b.ceiling(40), Duration::from_secs(1));
    }

    #[test]
    fn backoff_jitter_stays_below_the_ceiling() {
        let b = Backoff::default();
        assert_eq!(b.delay(3, 0.0), Duration::ZERO);
        assert_eq!(b.delay(3, 0.5), b.ceiling(3) / 2);
        assert!(b.delay(3, 0.999) < b.ceiling(3));
    }
}
