//! An archive object cut by key slice (`docs/storage.md#cold-tier-s3`): its
//! rows grouped by the slice of their key hash ([`crate::slices`]), each
//! slice in row groups of its own, so that a reader of some keys fetches
//! only the footer and the row groups of its slices (one ranged `GET` each).
//! The manifest entry records where each row group lies and its SHA-256, and
//! the footer's: a reader checks every byte it decodes against the anchored
//! entry, as a reader of the whole object checks the object's hash. Pure.

use std::ops::Range;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::slices::KeyRange;

/// Bytes of an object: where they start, how many, their SHA-256 (hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub offset: u64,
    pub length: u64,
    pub sha256: String,
}

impl Span {
    /// Where it ends (`None` past `u64::MAX`: no object's).
    fn end(&self) -> Option<u64> {
        self.offset.checked_add(self.length)
    }
}

/// One row group: the slice its rows are of, how many, and its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Group {
    pub slice: u32,
    pub rows: u64,
    pub span: Span,
}

/// How an object is cut: into `slices` slices, its row groups in slice order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cut {
    pub slices: u32,
    /// The Parquet footer (metadata and its 8-byte tail): every reader needs it.
    pub footer: Span,
    pub groups: Vec<Group>,
}

/// The slices an object of `rows` rows is cut into, its slots having been
/// cut into at most `most`: as many, fewer when a slice would average under
/// `min_rows` rows (a power of two, so readers' ranges line up). Each row
/// group costs some 900 bytes of footer, which every reader of part of the
/// object fetches, and compresses worse the fewer rows it has.
pub(crate) fn slices_for(most: u32, rows: usize, min_rows: usize) -> u32 {
    let by_rows = (rows / min_rows.max(1)).max(1);
    let by_rows = 1u32 << (usize::BITS - 1 - by_rows.leading_zeros()).min(31);
    most.max(1).min(by_rows)
}

impl Cut {
    /// The row groups that hold some key of `keys` (contiguous: groups are in slice order).
    pub(crate) fn groups_of(&self, keys: KeyRange) -> Range<usize> {
        let slices = keys.slices(self.slices);
        let first = self.groups.partition_point(|g| g.slice < slices.start);
        let end = self.groups.partition_point(|g| g.slice < slices.end);
        first..end.max(first)
    }

    /// The bytes of `groups`, one range (row groups lie one after the other).
    pub(crate) fn span_of(&self, groups: Range<usize>) -> Range<u64> {
        match (self.groups.get(groups.start), groups.end.checked_sub(1).and_then(|last| self.groups.get(last))) {
            (Some(first), Some(last)) if groups.start < groups.end => {
                first.span.offset..last.span.end().unwrap_or(first.span.offset)
            }
            _ => 0..0,
        }
    }

    /// Whether `footer` and `bytes` (the object's bytes from `at`, covering
    /// `groups`) are what the cut says, hash by hash.
    pub(crate) fn holds(&self, footer: &[u8], at: u64, bytes: &[u8], groups: Range<usize>) -> bool {
        let hashed = |span: &Span, bytes: &[u8]| sha256_hex(bytes) == span.sha256;
        let footer_ok = footer.len() as u64 == self.footer.length && hashed(&self.footer, footer);
        footer_ok
            && self.groups.get(groups).is_some_and(|groups| {
                groups.iter().all(|g| {
                    let start = g.span.offset.checked_sub(at).and_then(|s| usize::try_from(s).ok());
                    let end = start.and_then(|s| s.checked_add(usize::try_from(g.span.length).ok()?));
                    let piece = start.zip(end).and_then(|(s, e)| bytes.get(s..e));
                    piece.is_some_and(|piece| hashed(&g.span, piece))
                })
            })
    }

    /// The cut's lines in the manifest entry's hashed text: every field, in order.
    pub(crate) fn hash_text(&self) -> String {
        let span = |s: &Span| format!("{} {} {}", s.offset, s.length, s.sha256);
        let mut text = format!("slices {}\nfooter {}\n", self.slices, span(&self.footer));
        for group in &self.groups {
            text.push_str(&format!("group {} {} {}\n", group.slice, group.rows, span(&group.span)));
        }
        text
    }
}

/// SHA-256 of `bytes`, hex: how the manifest names objects, footers and row groups.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(offset: u64, length: u64, bytes: &[u8]) -> Span {
        Span { offset, length, sha256: sha256_hex(bytes) }
    }

    #[test]
    fn objects_are_cut_as_their_slots_unless_slices_would_be_nearly_empty() {
        assert_eq!(slices_for(1, 1_000_000, 1024), 1);
        assert_eq!(slices_for(256, 1_000_000, 1024), 256);
        assert_eq!(slices_for(256, 1024 * 100, 1024), 64, "a power of two");
        assert_eq!(slices_for(256, 1024 * 100, 64), 256);
        assert_eq!(slices_for(4, 1000, 1024), 1);
        assert_eq!(slices_for(0, 10, 0), 1);
    }

    #[test]
    fn a_reader_fetches_the_groups_of_its_slices_and_checks_each() {
        // An object of 10 bytes: groups of slices 0, 0, 2 and 3 (of 4), then the footer.
        let object = b"aabbccddff";
        let cut = Cut {
            slices: 4,
            footer: span(8, 2, b"ff"),
            groups: vec![
                Group { slice: 0, rows: 1, span: span(0, 2, b"aa") },
                Group { slice: 0, rows: 1, span: span(2, 2, b"bb") },
                Group { slice: 2, rows: 1, span: span(4, 2, b"cc") },
                Group { slice: 3, rows: 1, span: span(6, 2, b"dd") },
            ],
        };
        assert_eq!(cut.groups_of(KeyRange::new(0, 4)), 0..2);
        assert_eq!(cut.groups_of(KeyRange::new(1, 4)), 2..2, "slice 1 has no rows");
        assert_eq!(cut.groups_of(KeyRange::new(1, 2)), 2..4);
        assert_eq!(cut.groups_of(KeyRange::new(5, 8)), 2..3, "a half slice: the slice's groups");
        assert_eq!(cut.span_of(0..2), 0..4);
        assert_eq!(cut.span_of(2..4), 4..8);
        assert_eq!(cut.span_of(2..2), 0..0);
        assert!(cut.holds(b"ff", 4, &object[4..8], 2..4));
        assert!(cut.holds(b"ff", 2, &object[2..6], 1..3));
        assert!(!cut.holds(b"fF", 4, &object[4..8], 2..4), "footer altered");
        assert!(!cut.holds(b"ff", 4, b"ccdD", 2..4), "a group altered");
        assert!(!cut.holds(b"ff", 4, &object[4..7], 2..4), "a group cut short");
        assert!(!cut.holds(b"ff", 5, &object[5..9], 2..4), "not where the cut says");
        assert!(cut.hash_text().contains("group 2 1 4 2 "));
    }
}
