//! A view read back, as the management action and the HTTP API answer it:
//! one item or a page in key order, with the log position the view
//! reflects; for one item, optionally after its stream reached a version.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::registry::{self, Registered};
use super::table::{self, key, s, ViewItem};
use super::{ViewRef, HASH_KEY, RANGE_KEY};
use crate::error::{Error, Result};
use crate::time::format_ms;

/// Items a page answers when the request sets no limit, and the most it may ask.
pub const VIEW_PAGE: usize = 100;
pub const MAX_VIEW_PAGE: usize = 1_000;
/// How long a read of one item waits for `at_least_version` before it answers that the view is behind.
pub const AT_LEAST_WAIT: Duration = Duration::from_secs(5);

/// A view query: one item (`key`), or a page in key order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ViewQuery {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// One item of a state view: wait (up to [`AT_LEAST_WAIT`]) until its stream version is at least this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_least_version: Option<u64>,
}

/// What a query found.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// The answer (an item, or `null` when the view has no such key; a page).
    Answer(Value),
    /// `at_least_version` was not reached in time: the item's version now (`None`: no item yet).
    Behind(Option<u64>),
    /// No projection has that name.
    NoProjection,
    /// The item's subject is forgotten: its marker (when).
    Forgotten(Value),
}

/// Answers `query` from the serving version of its projection; `BadInput` for an unknown one.
pub(crate) async fn answer(dynamo: &aws_sdk_dynamodb::Client, views_table: &str, query: &ViewQuery) -> Result<Found> {
    let Some(registered) = registry::get(dynamo, views_table, &query.name).await? else {
        return Ok(Found::NoProjection);
    };
    let view = registered.view(registered.serving);
    let mut answer = json!({ "projection": query.name, "version": view.version });
    match &query.key {
        Some(key) => {
            let item = item_at_least(dynamo, views_table, &view, key, query.at_least_version).await?;
            let item = match item {
                Ok(item) => item,
                Err(version) => return Ok(Found::Behind(version)),
            };
            if let Some(marker) = item.as_ref().and_then(|i| i.state.as_ref()).and_then(super::forgotten) {
                return Ok(Found::Forgotten(marker.clone()));
            }
            answer["item"] = json!(item);
        }
        None => {
            if query.at_least_version.is_some() {
                return Err(Error::BadInput("at_least_version is for one item (a key)".into()));
            }
            let limit = query.limit.unwrap_or(VIEW_PAGE);
            if !(1..=MAX_VIEW_PAGE).contains(&limit) {
                return Err(Error::BadInput(format!("limit must be 1 to {MAX_VIEW_PAGE}, not {limit}")));
            }
            let prefix = query.prefix.as_deref().unwrap_or_default();
            let items = page(dynamo, views_table, &view, (prefix, query.after.as_deref()), limit).await?;
            if items.len() == limit {
                answer["next"] = json!(items.last().map(|i| i.key.clone()));
            }
            answer["items"] = json!(items);
        }
    }
    answer["position"] = position(dynamo, views_table, &registered).await?;
    Ok(Found::Answer(answer))
}

/// The item `key`, once its stream version is at least `version` (polled, up to [`AT_LEAST_WAIT`]);
/// `Err` with the version it has when the wait ends first.
async fn item_at_least(
    dynamo: &aws_sdk_dynamodb::Client,
    views_table: &str,
    view: &super::ViewRef,
    key: &str,
    version: Option<u64>,
) -> Result<std::result::Result<Option<ViewItem>, Option<u64>>> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(50);
    loop {
        let item = get(dynamo, views_table, view, key).await?;
        let has = item.as_ref().and_then(|i| i.stream_version);
        let forgotten = item.as_ref().and_then(|i| i.state.as_ref()).is_some_and(|s| super::forgotten(s).is_some());
        match version.filter(|_| !forgotten) {
            Some(wanted) if has.is_none_or(|v| v < wanted) => {
                if started.elapsed() + pause > AT_LEAST_WAIT {
                    return Ok(Err(has));
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            _ => return Ok(Ok(item)),
        }
    }
}

/// Where a projection's serving version stands: each partition's last
/// applied event, and `through`, the arrival every partition has applied
/// the log up to (the least of theirs; absent while one has applied nothing).
pub(crate) async fn position(
    dynamo: &aws_sdk_dynamodb::Client,
    views_table: &str,
    registered: &Registered,
) -> Result<Value> {
    let view = registered.view(registered.serving);
    let positions = table::positions(dynamo, views_table, &view, registered.definition.partitions).await?;
    let mut through: Option<i64> = Some(i64::MAX);
    let mut partitions = Vec::new();
    for (partition, position) in positions.iter().enumerate() {
        let ms = position.at.as_ref().and_then(|at| at.sort_key.get(..13)).and_then(|ms| ms.parse::<i64>().ok());
        through = through.zip(ms).map(|(a, b)| a.min(b));
        partitions.push(json!({ "partition": partition, "at": position.at, "events": position.events }));
    }
    Ok(json!({ "through": through.map(format_ms), "partitions": partitions }))
}

/// One item of `view`, if it has it.
pub(crate) async fn get(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    view: &ViewRef,
    item: &str,
) -> Result<Option<ViewItem>> {
    let got = dynamo
        .get_item()
        .table_name(table)
        .set_key(Some(key(view.item_key(item), item)))
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    got.item.as_ref().map(ViewItem::from_item).transpose()
}

/// Up to `limit` items of `view` in key order, whose keys start with
/// `prefix`, after key `after`: one query per bucket, merged.
pub(crate) async fn page(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    view: &ViewRef,
    (prefix, after): (&str, Option<&str>),
    limit: usize,
) -> Result<Vec<ViewItem>> {
    // A start outside the prefix's keys: before them, none (DynamoDB refuses a start key outside
    // the query's range); after them, nothing is left.
    let after = after.filter(|a| !a.is_empty() && **a >= *prefix);
    if after.is_some_and(|a| !a.starts_with(prefix)) {
        return Ok(Vec::new());
    }
    let mut items = Vec::new();
    for bucket in 0..view.buckets.max(1) {
        items.extend(bucket_page(dynamo, table, view.bucket_key(bucket), (prefix, after), limit).await?);
    }
    items.sort_by(|a, b| a.key.cmp(&b.key));
    items.truncate(limit);
    Ok(items)
}

/// Up to `limit` items of one bucket in key order (the query pages on until it has them).
async fn bucket_page(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    bucket: String,
    (prefix, after): (&str, Option<&str>),
    limit: usize,
) -> Result<Vec<ViewItem>> {
    let mut condition = "#h = :h".to_owned();
    let mut values = HashMap::from([(":h".to_owned(), s(bucket.clone()))]);
    let mut names = HashMap::from([("#h".to_owned(), HASH_KEY.to_owned())]);
    if !prefix.is_empty() {
        names.insert("#r".into(), RANGE_KEY.into());
        condition.push_str(" AND begins_with(#r, :prefix)");
        values.insert(":prefix".into(), s(prefix));
    }
    let mut start = after.map(|after| key(bucket, after));
    let mut items = Vec::new();
    loop {
        let page = dynamo
            .query()
            .table_name(table)
            .key_condition_expression(&condition)
            .set_expression_attribute_names(Some(names.clone()))
            .set_expression_attribute_values(Some(values.clone()))
            .set_exclusive_start_key(start)
            .limit(limit.clamp(1, 1000) as i32)
            .send()
            .await
            .map_err(|e| Error::dynamo("Query", e))?;
        for item in page.items() {
            items.push(ViewItem::from_item(item)?);
        }
        start = page.last_evaluated_key;
        if start.is_none() || items.len() >= limit {
            items.truncate(limit);
            return Ok(items);
        }
    }
}
