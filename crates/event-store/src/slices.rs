//! Slices: the space of key hashes cut into equal ranges, so that a reader
//! responsible for some keys reads only the items that can hold them
//! (`docs/storage.md#slices`). Pure: no I/O.
//!
//! An event's key hash is the first 64 bits of the sha256 of its Kinesis
//! partition key: one key's events share it, so they share a slice and stay
//! in order. With `SLICES` = S (a power of two, 1 to [`MAX_SLICES`]), slice
//! `s` holds the hashes `[s, s + 1) * 2^64 / S`, and a slot's events of slice
//! `s` are stored under their own hash key, [`storage_key`]`(slot, S, s)`:
//! a slot's writes spread over S partitions, and a reader of a range of
//! hashes queries only the slices that meet it.
//!
//! Readers' ranges are cut the same way ([`KeyRange`]: part `p` of `P`), so
//! a reader of part `p` of `P` reads exactly `S / P` slices when `P` divides
//! `S`, and one slice shared with `P / S - 1` others when `S` divides `P`.
//! Ranges are never rehashed: a key's hash is fixed; changing `P` or `S`
//! only moves the lines between ranges.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use crate::config::{check_slices, MAX_SLICES};
use crate::error::{Error, Result};

/// A sliced item's hash key is `slot * SCALE + S + s`: `S + s` (below
/// `2 * MAX_SLICES`) is unique across every slice count, so items of one
/// slot cut under two counts (the setting changed) never share a key, and
/// the slot's 13 digits stay readable in front.
const SCALE: i64 = 10_000;

/// The 64-bit hash of a partition key (the first 8 bytes of its sha256).
pub(crate) fn key_hash(partition_key: &str) -> u64 {
    let digest = Sha256::digest(partition_key.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// The part (of `parts` equal ranges of hashes) that holds `hash`.
pub(crate) fn part_of(hash: u64, parts: u32) -> u32 {
    ((u128::from(hash) * u128::from(parts.max(1))) >> 64) as u32
}

/// The hash key of slice `slice` of `slot` cut into `slices`.
pub(crate) fn storage_key(slot: i64, slices: u32, slice: u32) -> i64 {
    slot * SCALE + i64::from(slices) + i64::from(slice)
}

/// What a reader is responsible for: part `part` of `parts` equal ranges of key hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyRange {
    pub part: u32,
    pub parts: u32,
}

impl KeyRange {
    /// Every key.
    pub const ALL: KeyRange = KeyRange { part: 0, parts: 1 };

    pub fn new(part: u32, parts: u32) -> Self {
        Self { part, parts: parts.max(1) }
    }

    /// A range a request names: 1 to [`MAX_SLICES`] parts, and one of them.
    pub(crate) fn checked(self) -> Result<Self> {
        if !(1..=MAX_SLICES).contains(&self.parts) || self.part >= self.parts {
            return Err(Error::BadInput(format!(
                "part {} of {}: the parts are 1 to {MAX_SLICES}, numbered from 0",
                self.part, self.parts
            )));
        }
        Ok(self)
    }

    /// Whether an event with this partition key is in the range.
    pub fn holds(&self, partition_key: &str) -> bool {
        self.parts <= 1 || part_of(key_hash(partition_key), self.parts) == self.part
    }

    /// The slices (of `slices`) that hold some hash of the range, in order.
    pub fn slices(&self, slices: u32) -> std::ops::Range<u32> {
        let (parts, slices_) = (u128::from(self.parts), u128::from(slices.max(1)));
        // The range's hashes are [ceil(p * 2^64 / P), ceil((p + 1) * 2^64 / P)).
        let first_hash = (u128::from(self.part) << 64).div_ceil(parts);
        let end_hash = (u128::from(self.part + 1) << 64).div_ceil(parts);
        let first = (first_hash * slices_) >> 64;
        let last = ((end_hash - 1) * slices_) >> 64;
        first as u32..(last as u32 + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_counts_are_powers_of_two_up_to_the_most() {
        for n in [1, 2, 64, 256, 1024] {
            assert_eq!(check_slices(n).unwrap(), n);
        }
        for n in [0, 3, 100, 2048] {
            assert!(check_slices(n).is_err(), "{n}");
        }
    }

    #[test]
    fn storage_keys_never_meet_across_slots_or_slice_counts() {
        let slot = 1_795_240_724_000;
        let mut seen = std::collections::BTreeSet::new();
        for s in [slot, slot + 1000] {
            for slices in [2, 4, 256, 1024] {
                for slice in 0..slices {
                    assert!(seen.insert(storage_key(s, slices, slice)), "{s} {slices} {slice}");
                }
            }
        }
        assert_eq!(storage_key(slot, 256, 3).to_string(), "17952407240000259", "the slot's digits in front");
        assert!(storage_key(0, 1, 0) > 0, "never a bookkeeping slot");
    }

    #[test]
    fn a_range_reads_the_slices_its_keys_fall_in_and_no_other() {
        let keys: Vec<String> = (0..4_000).map(|i| format!("user-{i}")).collect();
        for (parts, slices) in [(1, 1), (1, 256), (8, 256), (256, 256), (64, 16), (3, 8), (5, 1024), (1024, 1024)] {
            let mut read_by = vec![0u32; slices as usize];
            for part in 0..parts {
                let range = KeyRange::new(part, parts);
                let read = range.slices(slices);
                for s in read.clone() {
                    read_by[s as usize] += 1;
                }
                for key in keys.iter().filter(|k| range.holds(k)) {
                    let slice = part_of(key_hash(key), slices);
                    assert!(read.contains(&slice), "{parts}/{slices}: {key} in slice {slice}, not in {read:?}");
                }
                if slices % parts == 0 {
                    assert_eq!(read.len() as u32, slices / parts, "{parts} parts of {slices} slices");
                }
            }
            // Every slice is read; when the parts divide the slices, each exactly once.
            assert!(read_by.iter().all(|&n| n >= 1), "{parts}/{slices}");
            if slices % parts == 0 {
                assert!(read_by.iter().all(|&n| n == 1), "{parts}/{slices}: {read_by:?}");
            }
            if parts % slices == 0 {
                assert!(read_by.iter().all(|&n| n == parts / slices), "{parts}/{slices}");
            }
        }
    }

    #[test]
    fn parts_split_the_keys_evenly_and_a_key_never_moves_within_its_hash() {
        let mut counts = [0usize; 8];
        for i in 0..8_000 {
            counts[part_of(key_hash(&format!("user-{i}")), 8) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1_200).contains(&c)), "{counts:?}");
        assert_eq!(part_of(u64::MAX, 1024), 1023);
        assert_eq!(part_of(0, 1024), 0);
        // Halving the parts merges neighbours: part p of 16 lies in part p/2 of 8.
        for i in 0..1_000 {
            let h = key_hash(&format!("k{i}"));
            assert_eq!(part_of(h, 16) / 2, part_of(h, 8));
        }
        assert!(KeyRange::ALL.holds("anything"));
        assert!(KeyRange::new(3, 4).checked().is_ok());
        for (part, parts) in [(4, 4), (0, 0), (0, 2048)] {
            assert!(KeyRange { part, parts }.checked().is_err(), "{part} of {parts}");
        }
    }
}
