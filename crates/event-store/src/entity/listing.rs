//! Listing streams by name, in name order within a prefix, without reading
//! their events and without a `Scan`.
//!
//! Each stream's name is an item of the entity table under one of
//! [`NAME_SHARDS`] hash keys, `~streams#<nn>` (a `#` is in no stream's name),
//! its sort key `_<name>` (a bookkeeping key: the relay and reads pass over
//! it). It is put in the stream's first append's transaction, so a stream
//! created since the index exists is listed once that append commits. The
//! shard is the name's hash: no one key takes every new stream (DynamoDB can
//! give the 16 keys partitions of their own as their writes grow). A listing
//! queries every shard in name order between the prefix and the last name
//! listed, merges their first names, and reads those streams' tips for their
//! versions.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, Put};
use futures::future::try_join_all;
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;

use super::model::{Invalid, StreamItem, BOOKKEEPING_PREFIX, HASH_KEY, MAX_NAME_BYTES, RANGE_KEY, TIP};
use super::{n, s, EntityError, EntityStore};
use crate::error::Error;
use crate::time::now_ms;

/// Hash keys of the name index.
pub const NAME_SHARDS: u32 = 16;
/// The most streams one listing answers (a `BatchGetItem` of their tips).
pub const MAX_LISTED: usize = 100;

/// One stream as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub name: String,
    pub version: u64,
    pub deleted: bool,
}

/// A page of a listing: streams in name order, and the name to list after for the next page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    pub streams: Vec<Listed>,
    pub next: Option<String>,
}

fn shard_key(shard: u32) -> String {
    format!("~streams#{shard:02}")
}

fn sort_key(name: &str) -> String {
    format!("{BOOKKEEPING_PREFIX}{name}")
}

/// `stream`'s index item, put at `now`.
fn index_item(stream: &str, now: i64) -> HashMap<String, AttributeValue> {
    let shard = (crate::slices::key_hash(stream) % u64::from(NAME_SHARDS)) as u32;
    HashMap::from([
        (HASH_KEY.to_owned(), s(shard_key(shard))),
        (RANGE_KEY.to_owned(), s(sort_key(stream))),
        ("created_at".to_owned(), n(now)),
    ])
}

/// The put of `stream`'s index item, for its first append's transaction.
pub(super) fn index_put(table: &str, stream: &str, now: i64) -> Result<Put, Error> {
    Ok(Put::builder().table_name(table).set_item(Some(index_item(stream, now))).build()?)
}

/// Streams one backfill indexes at once.
const INDEX_CONCURRENCY: usize = 16;

/// The sort keys a listing reads, inclusive: names from `prefix` on, after `after`. Names are
/// printable ASCII from `+` (0x2B) to `~` (0x7E), so a name is greater than `after` exactly when
/// it is at least `after` and a space, and starts with `prefix` exactly when it lies between
/// `prefix` and `prefix` and DEL (0x7F). `None`: no name can be listed.
fn bounds(prefix: &str, after: Option<&str>) -> Option<(String, String)> {
    let from = match after {
        Some(after) if format!("{after} ").as_str() > prefix => format!("{after} "),
        _ => prefix.to_owned(),
    };
    let to = format!("{prefix}\u{7f}");
    (from <= to).then(|| (sort_key(&from), sort_key(&to)))
}

/// The page of at most `limit` names out of each shard's first names, in name order, and the
/// name to list after next. A shard that had more names than it gave knows none past its last:
/// the page stops there (the smallest such last name), so no name is skipped.
fn merge(shards: Vec<(Vec<String>, bool)>, limit: usize) -> (Vec<String>, Option<String>) {
    let known_to = shards.iter().filter(|(_, more)| *more).filter_map(|(names, _)| names.last()).min().cloned();
    let mut names: Vec<String> = shards
        .into_iter()
        .flat_map(|(names, _)| names)
        .filter(|name| known_to.as_ref().is_none_or(|to| name <= to))
        .collect();
    names.sort();
    let cut = names.len() > limit;
    names.truncate(limit);
    let next = if cut || known_to.is_some() { names.last().cloned() } else { None };
    (names, next)
}

impl EntityStore {
    /// Indexes every stream that is not (those created before the index
    /// existed, or by functions of an older version during a deploy): a
    /// `Scan` of the tips (`dynamodb:Scan`) and a conditional `PutItem` per
    /// stream, for an operator's one-time backfill (`event-store
    /// reindex-streams`). Safe to run again, and beside appends. Answers the
    /// streams it added.
    pub async fn index_streams(&self) -> Result<usize, EntityError> {
        let names = self.stream_names("").await?;
        let now = now_ms();
        let added: Vec<bool> = futures::stream::iter(names.iter().map(|name| self.index_one(name, now)))
            .buffer_unordered(INDEX_CONCURRENCY)
            .try_collect()
            .await?;
        Ok(added.into_iter().filter(|added| *added).count())
    }

    /// Puts one stream's index item unless it has one: true when it was put.
    async fn index_one(&self, stream: &str, now: i64) -> Result<bool, Error> {
        let put = self
            .dynamo
            .put_item()
            .table_name(&self.table)
            .set_item(Some(index_item(stream, now)))
            .condition_expression("attribute_not_exists(#item)")
            .expression_attribute_names("#item", RANGE_KEY)
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(err) if err.as_service_error().is_some_and(|e| e.is_conditional_check_failed_exception()) => Ok(false),
            Err(err) => Err(Error::dynamo("PutItem", err)),
        }
    }

    /// Streams whose names start with `prefix`, after `after`, in name order: at most `limit`
    /// (1 to [`MAX_LISTED`]), with their versions and whether they are deleted.
    pub async fn list_streams(&self, prefix: &str, after: Option<&str>, limit: usize) -> Result<Listing, EntityError> {
        if !(1..=MAX_LISTED).contains(&limit) {
            return Err(Invalid::BadRequest(format!("limit is 1 to {MAX_LISTED}")).into());
        }
        if prefix.len() > MAX_NAME_BYTES || after.is_some_and(|a| a.len() > MAX_NAME_BYTES) {
            return Err(
                Invalid::BadRequest(format!("prefix and after are names: at most {MAX_NAME_BYTES} bytes")).into()
            );
        }
        let Some((from, to)) = bounds(prefix, after) else { return Ok(Listing { streams: Vec::new(), next: None }) };
        let shards = (0..NAME_SHARDS).map(|shard| self.shard_names(shard, (&from, &to), limit));
        let (names, next) = merge(try_join_all(shards).await?, limit);
        let mut tips = self.tips(&names).await?;
        let streams = names
            .into_iter()
            .filter_map(|name| {
                // Put with the tip in one transaction: a name without one is not a stream.
                let (version, deleted) = tips.remove(&name)?;
                Some(Listed { name, version, deleted })
            })
            .collect();
        Ok(Listing { streams, next })
    }

    /// The first `limit` names of one shard between `from` and `to`, and whether it holds more.
    async fn shard_names(
        &self,
        shard: u32,
        (from, to): (&str, &str),
        limit: usize,
    ) -> Result<(Vec<String>, bool), Error> {
        let out = self
            .dynamo
            .query()
            .table_name(&self.table)
            .key_condition_expression("#stream = :shard AND #item BETWEEN :from AND :to")
            .expression_attribute_names("#stream", HASH_KEY)
            .expression_attribute_names("#item", RANGE_KEY)
            .expression_attribute_values(":shard", s(shard_key(shard)))
            .expression_attribute_values(":from", s(from))
            .expression_attribute_values(":to", s(to))
            .projection_expression("#item")
            .consistent_read(true)
            .limit(limit as i32)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        let names = out
            .items()
            .iter()
            .filter_map(|item| item.get(RANGE_KEY)?.as_s().ok()?.strip_prefix(BOOKKEEPING_PREFIX).map(str::to_owned))
            .collect();
        Ok((names, out.last_evaluated_key().is_some()))
    }

    /// The tips of `names`: their versions and whether they are deleted.
    async fn tips(&self, names: &[String]) -> Result<HashMap<String, (u64, bool)>, Error> {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let positions = crate::bookkeeping::entity_positions::Positions::new(self.dynamo.clone(), &self.table);
        let mut found = HashMap::new();
        for item in positions.get_all(&names, TIP).await? {
            if let StreamItem::Tip(tip) = StreamItem::decode(item)? {
                found.insert(tip.stream, (tip.version, tip.deleted));
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_take_a_prefix_and_the_names_after_one() {
        let (from, to) = bounds("order-", None).unwrap();
        assert_eq!((from.as_str(), to.as_str()), ("_order-", "_order-\u{7f}"));
        let inside = |name: &str| {
            let key = sort_key(name);
            from <= key && key <= to
        };
        assert!(inside("order-") && inside("order-1") && inside("order-~~"));
        assert!(!inside("order") && !inside("orders") && !inside("order.1"));
        let (from, _) = bounds("order-", Some("order-12")).unwrap();
        let after = |name: &str| sort_key(name) >= from;
        assert!(!after("order-12") && after("order-12+") && after("order-13") && after("order-2"));
        assert_eq!(bounds("order-", Some("a")).unwrap().0, "_order-", "an after before the prefix: from the prefix");
        assert_eq!(bounds("order-", Some("p")), None, "an after past the prefix: nothing");
        assert_eq!(bounds("", None).unwrap(), ("_".to_owned(), "_\u{7f}".to_owned()));
    }

    #[test]
    fn a_page_is_the_first_names_of_every_shard_merged_up_to_what_each_shard_knows() {
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let (page, next) = merge(vec![(names(&["a", "c"]), false), (names(&["b", "d"]), false)], 3);
        assert_eq!((page, next.as_deref()), (names(&["a", "b", "c"]), Some("c")));
        let all = merge(vec![(names(&["a"]), false), (names(&["b"]), false)], 3);
        assert_eq!(all, (names(&["a", "b"]), None), "all of it");
        // A shard cut short at "b" may hold "c" after it: the page stops at "b", "e" waits.
        let (page, next) = merge(vec![(names(&["a", "b"]), true), (names(&["d", "e"]), false)], 3);
        assert_eq!((page, next.as_deref()), (names(&["a", "b"]), Some("b")));
        assert_eq!(merge(Vec::new(), 3), (Vec::new(), None));
    }
}
