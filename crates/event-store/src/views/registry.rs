//! Projections by name: each one's definition and the version that serves
//! its queries, one item each under the views table's hash key
//! `~projections` (written at create and delete only; no view's key starts
//! with `~`), and a version's items cleared when it goes.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, WriteRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::builtin::Builtin;
use super::{ViewRef, HASH_KEY, POSITION_ITEM, RANGE_KEY};
use crate::batch::Backoff;
use crate::dynamo::{query_partition, write_all, Table};
use crate::error::{Error, Result};
use crate::select::Select;

/// The registry's hash key.
pub const REGISTRY: &str = "~projections";
/// A projection's name: 1 to 48 of `A-Z a-z 0-9 _ -` (its subscriptions are `view.<name>.v<version>`).
pub const MAX_NAME_LEN: usize = 48;

/// What a projection folds the log with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Kind {
    /// `state` or `count`, run by the store.
    Builtin(Builtin),
    /// The user's code: a Lambda function built on [`crate::views::lambda`], invoked with each batch.
    Code(Code),
}

/// A projection in the user's code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Code {
    Function { function: String },
}

/// A projection's definition: what it folds, which events, over how many partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Definition {
    #[serde(flatten)]
    pub kind: Kind,
    #[serde(default, skip_serializing_if = "Select::is_empty")]
    pub select: Select,
    pub partitions: u32,
}

/// A projection as registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Registered {
    pub name: String,
    /// The serving version's definition.
    pub definition: Definition,
    /// The version queries read, and its instance (part of its keys).
    pub serving: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Events that arrived from this time (ms) on are in its views: a rebuild starts here too.
    pub start_ms: i64,
    /// A version being built beside the serving one, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub building: Option<Building>,
    pub created_at: String,
}

/// A version being built from the log beside the serving one, until it has caught up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Building {
    pub version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    pub definition: Definition,
    pub started_at: String,
}

impl Registered {
    /// The view of the serving version (its items spread over as many buckets as it has partitions).
    pub(crate) fn view(&self, version: u32) -> ViewRef {
        let (definition, instance) = match &self.building {
            Some(building) if building.version == version => (&building.definition, &building.instance),
            _ => (&self.definition, &self.instance),
        };
        let instance = instance.clone();
        ViewRef { projection: self.name.clone(), version, buckets: definition.partitions, instance }
    }

    /// The views this projection keeps: the serving one, and the one being built.
    pub(crate) fn views(&self) -> Vec<ViewRef> {
        std::iter::once(self.serving).chain(self.building.as_ref().map(|b| b.version)).map(|v| self.view(v)).collect()
    }
}

/// A new version's instance: random, so that a version number given again (a cancelled rebuild's,
/// a deleted projection's) never meets what an earlier one left.
pub(crate) fn new_instance() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// The subscription that keeps version `version` of projection `name`.
pub(crate) fn subscription_name(name: &str, version: u32) -> String {
    format!("{VIEW_PREFIX}{name}.v{version}")
}

/// What the names of projections' subscriptions start with (users' subscriptions may not).
pub const VIEW_PREFIX: &str = "view.";

/// A projection's name, checked.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let valid = (1..=MAX_NAME_LEN).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if !valid {
        return Err(Error::BadInput(format!(
            "projection name {name:?}: 1 to {MAX_NAME_LEN} letters, digits, '_' or '-'"
        )));
    }
    Ok(())
}

/// The registry item: the record, and the versions (serving, building or 0) conditions compare.
fn item_of(registered: &Registered) -> Result<HashMap<String, AttributeValue>> {
    let record = serde_json::to_string(registered).map_err(|e| Error::encode("projection", e))?;
    let building = registered.building.as_ref().map_or(0, |b| b.version);
    Ok(HashMap::from([
        (HASH_KEY.to_owned(), AttributeValue::S(REGISTRY.into())),
        (RANGE_KEY.to_owned(), AttributeValue::S(registered.name.clone())),
        ("record".to_owned(), AttributeValue::S(record)),
        ("serving".to_owned(), AttributeValue::N(registered.serving.to_string())),
        ("building".to_owned(), AttributeValue::N(building.to_string())),
    ]))
}

/// Replaces the registry item of `next.name` if it still has `was`'s versions: `false` when
/// another change came first (a rebuild started, switched or cancelled meanwhile).
pub(crate) async fn replace(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    was: &Registered,
    next: &Registered,
) -> Result<bool> {
    let building = was.building.as_ref().map_or(0, |b| b.version);
    let put = dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(item_of(next)?))
        .condition_expression("#serving = :serving AND #building = :building")
        .expression_attribute_names("#serving", "serving")
        .expression_attribute_names("#building", "building")
        .expression_attribute_values(":serving", AttributeValue::N(was.serving.to_string()))
        .expression_attribute_values(":building", AttributeValue::N(building.to_string()))
        .send()
        .await;
    match put {
        Ok(_) => Ok(true),
        // Our own write, applied before a 500 and retried by the SDK, is no conflict.
        Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => {
            Ok(get(dynamo, table, &next.name).await?.as_ref() == Some(next))
        }
        Err(e) => Err(Error::dynamo("PutItem", e)),
    }
}

fn registered_of(item: &HashMap<String, AttributeValue>) -> Result<Registered> {
    let record = item.get("record").and_then(|v| v.as_s().ok()).ok_or_else(|| Error::Malformed("projection".into()))?;
    serde_json::from_str(record).map_err(|e| Error::Malformed(format!("projection: {e}")))
}

/// Registers a new projection; `BadInput` when one of that name exists.
pub(crate) async fn create(dynamo: &aws_sdk_dynamodb::Client, table: &str, registered: &Registered) -> Result<()> {
    let put = dynamo
        .put_item()
        .table_name(table)
        .set_item(Some(item_of(registered)?))
        .condition_expression("attribute_not_exists(#k)")
        .expression_attribute_names("#k", RANGE_KEY)
        .send()
        .await;
    match put {
        Ok(_) => Ok(()),
        Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => {
            // Our own put, applied before a 500 and retried by the SDK, is no conflict.
            if get(dynamo, table, &registered.name).await?.as_ref() == Some(registered) {
                return Ok(());
            }
            Err(Error::BadInput(format!("projection {:?} exists", registered.name)))
        }
        Err(e) => Err(Error::dynamo("PutItem", e)),
    }
}

/// The projection `name`, if registered.
pub(crate) async fn get(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Option<Registered>> {
    let got = dynamo
        .get_item()
        .table_name(table)
        .key(HASH_KEY, AttributeValue::S(REGISTRY.into()))
        .key(RANGE_KEY, AttributeValue::S(name.into()))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| Error::dynamo("GetItem", e))?;
    got.item.as_ref().map(registered_of).transpose()
}

/// The projection `name`; `BadInput` when there is none.
pub(crate) async fn existing(dynamo: &aws_sdk_dynamodb::Client, table: &str, name: &str) -> Result<Registered> {
    get(dynamo, table, name).await?.ok_or_else(|| Error::BadInput(format!("no projection {name:?}")))
}

/// Every projection, by name.
pub(crate) async fn list(dynamo: &aws_sdk_dynamodb::Client, table: &str) -> Result<Vec<Registered>> {
    let items = query_partition(dynamo, table, (HASH_KEY, AttributeValue::S(REGISTRY.into()))).await?;
    items.iter().map(registered_of).collect()
}

/// Unregisters `name` (its versions' items are cleared by [`clear`]); with `was`, only while it
/// still has `was`'s versions (`false` when another change came first).
pub(crate) async fn remove(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
    name: &str,
    was: Option<&Registered>,
) -> Result<bool> {
    let mut delete = dynamo
        .delete_item()
        .table_name(table)
        .key(HASH_KEY, AttributeValue::S(REGISTRY.into()))
        .key(RANGE_KEY, AttributeValue::S(name.into()));
    if let Some(was) = was {
        let building = was.building.as_ref().map_or(0, |b| b.version);
        delete = delete
            .condition_expression("#serving = :serving AND #building = :building")
            .expression_attribute_names("#serving", "serving")
            .expression_attribute_names("#building", "building")
            .expression_attribute_values(":serving", AttributeValue::N(was.serving.to_string()))
            .expression_attribute_values(":building", AttributeValue::N(building.to_string()));
    }
    match delete.send().await {
        Ok(_) => Ok(true),
        // Our own delete, applied before a 500 and retried by the SDK, left nothing.
        Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => {
            Ok(get(dynamo, table, name).await?.is_none())
        }
        Err(e) => Err(Error::dynamo("DeleteItem", e)),
    }
}

/// Deletes every item and partition position of `view` (its runners must
/// be gone: their subscription deleted first). Returns the items deleted.
pub(crate) async fn clear(dynamo: &aws_sdk_dynamodb::Client, table: &str, view: &ViewRef) -> Result<usize> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for bucket in 0..view.buckets.max(1) {
        let hash = view.bucket_key(bucket);
        for item in query_partition(dynamo, table, (HASH_KEY, AttributeValue::S(hash.clone()))).await? {
            if let Some(range) = item.get(RANGE_KEY).and_then(|v| v.as_s().ok()) {
                keys.push((hash.clone(), range.clone()));
            }
        }
    }
    for partition in 0..view.buckets.max(1) {
        keys.push((view.position_key(partition), POSITION_ITEM.to_owned()));
        let markers = view.redriven_key(partition);
        for item in query_partition(dynamo, table, (HASH_KEY, AttributeValue::S(markers.clone()))).await? {
            if let Some(range) = item.get(RANGE_KEY).and_then(|v| v.as_s().ok()) {
                keys.push((markers.clone(), range.clone()));
            }
        }
    }
    let requests: Vec<WriteRequest> = keys
        .iter()
        .map(|(hash, range)| {
            let key = HashMap::from([
                (HASH_KEY.to_owned(), AttributeValue::S(hash.clone())),
                (RANGE_KEY.to_owned(), AttributeValue::S(range.clone())),
            ]);
            Ok(WriteRequest::builder().delete_request(DeleteRequest::builder().set_key(Some(key)).build()?).build())
        })
        .collect::<Result<_>>()?;
    let count = requests.len();
    let tagged: Vec<(usize, WriteRequest)> = requests.into_iter().enumerate().collect();
    let table = Table { name: table, key: &[HASH_KEY, RANGE_KEY] };
    let left = write_all(dynamo, table, tagged, &Backoff::default(), None).await;
    if !left.is_empty() {
        let source = format!("view {}: {} items left undeleted", view.projection, left.len()).into();
        return Err(Error::Dynamo { operation: "BatchWriteItem", source });
    }
    Ok(count)
}

/// Puts the forgotten marker `marker` in place of the state of item `key` (a stream: the subject of
/// that name) in every version of every `state` projection whose selection takes that stream, whether
/// it has the item yet or not: a runner still holding events opened before the forget (read, or a key
/// it cached) finds the marker there, its transaction conditioned on the revision it read is cancelled,
/// and the fold keeps the marker. The items written. Views of projections in users' code are theirs.
pub(crate) async fn forget(dynamo: &aws_sdk_dynamodb::Client, table: &str, key: &str, marker: &Value) -> Result<usize> {
    let state = serde_json::json!({ super::FORGOTTEN: marker }).to_string();
    let mut changed = 0;
    for registered in list(dynamo, table).await? {
        let versions = std::iter::once((registered.serving, &registered.definition))
            .chain(registered.building.as_ref().map(|b| (b.version, &b.definition)));
        for (version, definition) in versions {
            let holds = definition.select.keeps(&crate::envelope::entity_key(key), None) != Some(false);
            if !matches!(definition.kind, Kind::Builtin(Builtin::State { .. })) || !holds {
                continue;
            }
            let view = registered.view(version);
            let update = dynamo
                .update_item()
                .table_name(table)
                .key(HASH_KEY, AttributeValue::S(view.item_key(key)))
                .key(RANGE_KEY, AttributeValue::S(key.to_owned()))
                .update_expression("SET #doc = :doc ADD #rev :one")
                .expression_attribute_names("#doc", "doc")
                .expression_attribute_names("#rev", "rev")
                .expression_attribute_values(":doc", AttributeValue::S(state.clone()))
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .send()
                .await;
            update.map_err(|e| Error::dynamo("UpdateItem", e))?;
            changed += 1;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::builtin::{By, Fold};
    use serde_json::json;

    #[test]
    fn definitions_read_both_kinds_and_names_are_checked() {
        let state: Definition = serde_json::from_value(
            json!({"kind": "state", "fold": "replace", "partitions": 4, "select": {"categories": ["todo"]}}),
        )
        .unwrap();
        assert_eq!(state.kind, Kind::Builtin(Builtin::State { fold: Fold::Replace }));
        let count: Definition =
            serde_json::from_value(json!({"kind": "count", "by": "page", "partitions": 1})).unwrap();
        assert_eq!(count.kind, Kind::Builtin(Builtin::Count { by: By::Page }));
        let code: Definition =
            serde_json::from_value(json!({"kind": "function", "function": "f", "partitions": 2})).unwrap();
        assert_eq!(code.kind, Kind::Code(Code::Function { function: "f".into() }));
        assert!(serde_json::from_value::<Definition>(json!({"kind": "sum", "partitions": 1})).is_err());
        assert!(check_name("todos").is_ok() && check_name("page-views_2").is_ok());
        for bad in ["", "a.b", "a#b", "~x", &"x".repeat(49)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(subscription_name("todos", 3), "view.todos.v3");
    }
}
