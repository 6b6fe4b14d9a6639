//! The archive objects one reader (or a process of many) has fetched,
//! checked and decoded, kept for the slots they hold
//! (`docs/storage.md#cold-tier-s3`).
//!
//! An object is followed only once its entry is vouched for
//! ([`crate::archive::vouch`]): the entry (kept per object) says how the object
//! is cut, and so which piece a reader of some keys needs: the whole object
//! (not cut, or every row group), or the row groups of its slices
//! ([`crate::archive::cut`]), fetched with two ranged `GET`s (footer, groups)
//! and checked hash by hash before they are decoded. Pieces are kept by what
//! they hold, not by who asked: readers of ranges that need the same row
//! groups (more partitions than slices, in one process) share one fetch, and
//! a whole object serves every range. Each range keeps the last pieces it
//! read, so readers of several ranges at different places in the archive do
//! not evict each other's.

use std::collections::{BTreeSet, VecDeque};
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::{BoxFuture, FutureExt, Shared};

use crate::archive::columns::{self, Row};
use crate::archive::manifest::{sha256_hex, Entry};
use crate::archive::object::Bucket;
use crate::archive::parts;
use crate::archive::store::{self, Pointer};
use crate::archive::vouch;
use crate::bookkeeping::late_slots;
use crate::error::{Error, Result};
use crate::slices::KeyRange;

/// Pieces kept decoded for each range of keys read: the one being read and
/// the one before or after it (a piece two ranges read counts for each).
const PIECES_KEPT: usize = 2;
/// Entries kept (small, and needed only to find a piece not kept).
const ENTRIES_KEPT: usize = 8;
/// How long a fetched piece (with its slots' late marks) or entry is reused:
/// a reader that lives long (a warm function's) sees late events marked since.
const OBJECT_TTL: Duration = Duration::from_secs(60);

/// A piece's rows, and the slots among them with late events in the table.
#[derive(Debug, Default)]
pub(crate) struct Cold {
    pub(crate) rows: Vec<Row>,
    pub(crate) late: BTreeSet<i64>,
}

type Rows = Arc<Cold>;
type Fetch<T> = Shared<BoxFuture<'static, std::result::Result<T, Arc<Error>>>>;
/// An object's entry as fetched and checked, and when.
type KeptEntry = (Pointer, Instant, Fetch<Arc<Entry>>);

/// A piece of an object as fetched, checked and decoded.
struct KeptPiece {
    pointer: Pointer,
    piece: Piece,
    fetched: Instant,
    fetch: Fetch<Rows>,
    /// The ranges that read it, each with its last read's turn ([`Pieces::turn`]).
    readers: Vec<(KeyRange, u64)>,
}

/// The pieces kept, and a count of reads (the turns that order them).
#[derive(Default)]
struct Pieces {
    kept: VecDeque<KeptPiece>,
    turn: u64,
}

impl Pieces {
    /// Piece `at` read by `keys`: the range's last read now, and its oldest
    /// piece dropped past [`PIECES_KEPT`] (a piece no range keeps is gone).
    fn read_by(&mut self, at: usize, keys: KeyRange) -> Fetch<Rows> {
        self.turn += 1;
        let (turn, fetch) = (self.turn, self.kept[at].fetch.clone());
        let readers = &mut self.kept[at].readers;
        match readers.iter_mut().find(|(range, _)| *range == keys) {
            Some(reader) => reader.1 = turn,
            None => readers.push((keys, turn)),
        }
        let last_read = |kept: &KeptPiece| kept.readers.iter().find(|(range, _)| *range == keys).map(|r| r.1);
        if self.kept.iter().filter(|kept| last_read(kept).is_some()).count() > PIECES_KEPT {
            let oldest =
                self.kept.iter_mut().filter(|kept| last_read(kept).is_some()).min_by_key(|kept| last_read(kept));
            if let Some(oldest) = oldest {
                oldest.readers.retain(|(range, _)| *range != keys);
            }
            self.kept.retain(|kept| !kept.readers.is_empty());
        }
        fetch
    }
}

/// What part of an object a reader needs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Whole,
    /// Row groups `groups`, at bytes `span`, and the footer at `footer`.
    Groups {
        groups: Range<usize>,
        span: Range<u64>,
        footer: Range<u64>,
    },
}

impl Piece {
    /// The piece of `entry`'s object a reader of `keys` needs.
    fn for_keys(entry: &Entry, keys: KeyRange) -> Result<Piece> {
        let Some(cut) = entry.cut.as_ref().filter(|_| keys != KeyRange::ALL) else { return Ok(Piece::Whole) };
        let groups = cut.groups_of(keys);
        if groups.len() == cut.groups.len() {
            return Ok(Piece::Whole);
        }
        let footer_end = cut.footer.offset.checked_add(cut.footer.length);
        let footer = footer_end.map(|end| cut.footer.offset..end).ok_or_else(|| vouch::not_described(entry))?;
        Ok(Piece::Groups { span: cut.span_of(groups.clone()), groups, footer })
    }
}

/// The objects fetched, by what they hold.
#[derive(Default)]
pub(crate) struct Objects {
    entries: Mutex<VecDeque<KeptEntry>>,
    pieces: Mutex<Pieces>,
}

impl Objects {
    /// The rows of the object holding `slot` a reader of `keys` needs (others
    /// too, where they share its row groups), fetched once for all the slots
    /// it holds; `None` when no object holds it.
    pub(crate) async fn rows_of(
        &self,
        bucket: &Bucket,
        (dynamo, table): (&aws_sdk_dynamodb::Client, &str),
        slot: i64,
        keys: KeyRange,
    ) -> Result<Option<Rows>> {
        if let Some(fetch) = self.kept(slot, keys) {
            return fetch.await.map(Some).map_err(|e| Error::Archive(e.to_string()));
        }
        let pointer = match self.pointer_at(slot) {
            Some(pointer) => pointer,
            // Boxed, as the checks below: inline, they would grow every reader's future (and stack).
            None => match Box::pin(store::pointers_around(dynamo, table, slot)).await? {
                (Some(before), _) if before.end > slot => before,
                around => {
                    Box::pin(vouch::empty_slot(dynamo, table, bucket, slot, around)).await?;
                    return Ok(None);
                }
            },
        };
        let entry = self.entry(bucket, (dynamo, table), &pointer).await?;
        let piece = Piece::for_keys(&entry, keys)?;
        let fetch = {
            let mut pieces = self.pieces.lock().unwrap_or_else(PoisonError::into_inner);
            pieces.kept.retain(|kept| usable(kept.fetched, &kept.fetch));
            let held =
                |kept: &KeptPiece| kept.pointer == pointer && (kept.piece == piece || kept.piece == Piece::Whole);
            let at = match pieces.kept.iter().position(held) {
                Some(at) => at,
                None => {
                    let fetch = fetch_rows(bucket.clone(), (dynamo.clone(), table.to_owned()), entry, piece.clone());
                    let fetched = Instant::now();
                    pieces.kept.push_back(KeptPiece { pointer, piece, fetched, fetch, readers: Vec::new() });
                    pieces.kept.len() - 1
                }
            };
            pieces.read_by(at, keys)
        };
        fetch.await.map(Some).map_err(|e| Error::Archive(e.to_string()))
    }

    /// The piece holding `slot` that `keys` read last (or a whole object), if kept.
    fn kept(&self, slot: i64, keys: KeyRange) -> Option<Fetch<Rows>> {
        let mut pieces = self.pieces.lock().unwrap_or_else(PoisonError::into_inner);
        let at = pieces.kept.iter().position(|kept| {
            let serves = kept.piece == Piece::Whole || kept.readers.iter().any(|(range, _)| *range == keys);
            kept.pointer.start <= slot && slot < kept.pointer.end && serves && usable(kept.fetched, &kept.fetch)
        })?;
        Some(pieces.read_by(at, keys))
    }

    /// A kept entry's pointer holding `slot`.
    fn pointer_at(&self, slot: i64) -> Option<Pointer> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let found =
            entries.iter().find(|(p, fetched, fetch)| p.start <= slot && slot < p.end && usable(*fetched, fetch));
        found.map(|(p, _, _)| p.clone())
    }

    /// The anchored entry `pointer` names, checked once for every piece of its object.
    async fn entry(
        &self,
        bucket: &Bucket,
        (dynamo, table): (&aws_sdk_dynamodb::Client, &str),
        pointer: &Pointer,
    ) -> Result<Arc<Entry>> {
        let fetch = {
            let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
            entries.retain(|(_, fetched, fetch)| usable(*fetched, fetch));
            // The whole pointer: one naming a kept object with other slots is checked afresh.
            match entries.iter().find(|(p, _, _)| p == pointer) {
                Some((_, _, fetch)) => fetch.clone(),
                None => {
                    let (bucket, dynamo, table, at) =
                        (bucket.clone(), dynamo.clone(), table.to_owned(), pointer.clone());
                    let fetch = async move { vouch::entry_of(&dynamo, &table, &bucket, &at).await.map(Arc::new) }
                        .map(|entry| entry.map_err(Arc::new))
                        .boxed()
                        .shared();
                    entries.push_back((pointer.clone(), Instant::now(), fetch.clone()));
                    if entries.len() > ENTRIES_KEPT {
                        entries.pop_front();
                    }
                    fetch
                }
            }
        };
        fetch.await.map_err(|e| Error::Archive(e.to_string()))
    }
}

/// A fetch worth reusing: recent, and not failed (a failed one is tried again).
fn usable<T: Clone>(fetched: Instant, fetch: &Fetch<T>) -> bool {
    fetched.elapsed() < OBJECT_TTL && !matches!(fetch.peek(), Some(Err(_)))
}

/// `piece` of `entry`'s object ([`piece_rows`]), fetched, checked and
/// decoded once, for whoever awaits it first, and the late marks of its slots.
fn fetch_rows(
    bucket: Bucket,
    (dynamo, table): (aws_sdk_dynamodb::Client, String),
    entry: Arc<Entry>,
    piece: Piece,
) -> Fetch<Rows> {
    async move {
        let late = late_slots::in_range(&dynamo, &table, entry.start, entry.end);
        let (rows, late) = tokio::join!(Box::pin(piece_rows(&bucket, entry.clone(), piece)), late);
        Ok(Arc::new(Cold { rows: rows.map_err(Arc::new)?, late: late.map_err(Arc::new)? }))
    }
    .boxed()
    .shared()
}

/// The rows of `piece` of `entry`'s object, checked against the entry: the
/// object's bytes as a whole, or the footer and each row group fetched.
async fn piece_rows(bucket: &Bucket, entry: Arc<Entry>, piece: Piece) -> Result<Vec<Row>> {
    let key = entry.key.clone();
    let (groups, span, footer) = match piece {
        Piece::Whole => {
            let bytes = bucket.get(&key).await?;
            return decode(bucket, &key, move || whole(&entry, bytes)).await;
        }
        Piece::Groups { groups, .. } if groups.is_empty() => return Ok(Vec::new()),
        Piece::Groups { groups, span, footer } => (groups, span, footer),
    };
    let (footer, bytes) = tokio::try_join!(bucket.get_range(&key, footer), bucket.get_range(&key, span.clone()))?;
    decode(bucket, &key, move || {
        vouch::check_fetched(&entry, &footer, (span.start, &bytes), groups.clone())?;
        let rows = parts::read_groups(entry.bytes, footer, (span.start, bytes), groups.clone())?;
        vouch::check_rows(&entry, groups, &rows)?;
        Ok(rows)
    })
    .await
}

/// The rows of a whole object, checked against its entry: its hash before
/// a byte of it is decoded, then the rows and the cut.
fn whole(entry: &Entry, bytes: bytes::Bytes) -> Result<Vec<Row>> {
    if bytes.len() as u64 != entry.bytes || sha256_hex(&bytes) != entry.sha256 {
        return Err(vouch::not_described(entry));
    }
    let object = columns::open(bytes.clone())?;
    vouch::check_object(entry, &bytes, &object)?;
    Ok(object.rows)
}

/// `work`'s rows: hashing and decoding are CPU work, off the runtime's threads.
async fn decode(
    bucket: &Bucket,
    key: &str,
    work: impl FnOnce() -> Result<Vec<Row>> + Send + 'static,
) -> Result<Vec<Row>> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::Archive(format!("decoding s3://{}/{key}: {e}", bucket.name)))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(n: i64) -> KeptPiece {
        let pointer = Pointer { object: format!("events/{n}.parquet"), start: n, end: n + 1, count: 1, seq: n as u64 };
        let fetch = futures::future::ready(Ok(Arc::new(Cold::default()))).boxed().shared();
        KeptPiece { pointer, piece: Piece::Whole, fetched: Instant::now(), fetch, readers: Vec::new() }
    }

    /// Reads piece `n` (added when not kept) as `keys` does, and says which pieces are kept then.
    fn read(pieces: &mut Pieces, n: i64, keys: KeyRange) -> Vec<i64> {
        let at = match pieces.kept.iter().position(|kept| kept.pointer.start == n) {
            Some(at) => at,
            None => {
                pieces.kept.push_back(piece(n));
                pieces.kept.len() - 1
            }
        };
        let _kept = pieces.read_by(at, keys);
        pieces.kept.iter().map(|kept| kept.pointer.start).collect()
    }

    #[test]
    fn each_range_keeps_the_last_pieces_it_read_and_a_piece_goes_once_no_range_keeps_it() {
        let (a, b) = (KeyRange::new(0, 2), KeyRange::new(1, 2));
        let mut pieces = Pieces::default();
        assert_eq!(read(&mut pieces, 1, a), [1]);
        assert_eq!(read(&mut pieces, 2, a), [1, 2]);
        assert_eq!(read(&mut pieces, 1, b), [1, 2], "shared");
        assert_eq!(read(&mut pieces, 1, a), [1, 2], "read again: a's latest");
        assert_eq!(read(&mut pieces, 3, a), [1, 3], "a drops 2, its oldest");
        assert_eq!(read(&mut pieces, 4, b), [1, 3, 4]);
        assert_eq!(read(&mut pieces, 5, b), [1, 3, 4, 5], "b drops 1, which a still keeps");
        assert_eq!(read(&mut pieces, 6, a), [3, 4, 5, 6], "and a drops it: gone");
        assert!(pieces.kept.iter().all(|kept| kept.readers.len() == 1));
    }
}
