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
//! groups (more partitions than slices) share one fetch, and a whole object
//! serves every range.

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

/// Pieces kept decoded for each kind of piece (the whole object, or one range
/// of row groups): the one being read and the one before or after it. The
/// pieces readers of disjoint ranges need add up to one object.
const PIECES_KEPT: usize = 2;
/// Entries kept (they are small): the objects whose pieces are kept.
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
/// A piece of an object as fetched, checked and decoded, and when.
type KeptPiece = (Pointer, Piece, Instant, Fetch<Rows>);

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
    pieces: Mutex<VecDeque<KeptPiece>>,
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
            pieces.retain(|(_, _, fetched, fetch)| usable(*fetched, fetch));
            let held = |p: &Piece| *p == piece || *p == Piece::Whole;
            match pieces.iter().find(|(p, kind, _, _)| *p == pointer && held(kind)) {
                Some((_, _, _, fetch)) => fetch.clone(),
                None => {
                    let fetch = fetch_rows(bucket.clone(), (dynamo.clone(), table.to_owned()), entry, piece.clone());
                    pieces.push_back((pointer, piece.clone(), Instant::now(), fetch.clone()));
                    if pieces.iter().filter(|(_, kind, _, _)| *kind == piece).count() > PIECES_KEPT {
                        if let Some(oldest) = pieces.iter().position(|(_, kind, _, _)| *kind == piece) {
                            pieces.remove(oldest);
                        }
                    }
                    fetch
                }
            }
        };
        fetch.await.map(Some).map_err(|e| Error::Archive(e.to_string()))
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
