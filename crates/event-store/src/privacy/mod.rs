//! Erasure by crypto-shredding (`docs/privacy.md`): an event that belongs to
//! a data subject has its personal parts sealed under that subject's own key
//! before it is first written anywhere, and forgetting the subject destroys
//! the key, so every copy (Kinesis, the tables, the archive, a dead-letter
//! queue) becomes unreadable at once while order, ids and hashes stay valid.
//!
//! - [`crypto`]: the subject's keyed hash and AES-256-GCM sealing (pure);
//! - [`seal`]: which parts of a record are sealed, and the `forgotten` marker (pure);
//! - [`keys`]: the data keys, wrapped by KMS in the key table, cached, forgotten.
//! - [`manage`]: the `privacy` function's `forget` action.

pub mod crypto;
pub mod keys;
pub mod manage;
pub mod seal;

use std::collections::BTreeMap;
use std::str::FromStr;

use std::sync::Arc;

use serde_json::Value;

use crate::config::SubjectsConfig;
use crate::envelope::ENTITY_ID;
use crate::error::{Error, Result};
use keys::Keys;

/// What a writer seals with: the keys, and how it finds and hashes subjects.
pub struct Subjects {
    pub keys: Arc<Keys>,
    pub rule: SubjectRule,
    hash_key: Vec<u8>,
}

impl Subjects {
    /// From `config` (a writer's: it has the hash key).
    pub fn new(keys: Arc<Keys>, config: &SubjectsConfig) -> Result<Self> {
        Ok(Self { keys, rule: config.rule.clone(), hash_key: config.hash_key()?.to_vec() })
    }

    /// A writer's, from its configuration (`None` without `KEY_TABLE`, or with `SUBJECT_FROM=none`).
    pub fn configured(aws: &aws_config::SdkConfig, config: Option<&SubjectsConfig>) -> Result<Option<Self>> {
        match config.filter(|c| c.rule != SubjectRule::None) {
            Some(config) => Ok(Some(Self::new(keys(aws, config), config)?)),
            None => Ok(None),
        }
    }

    /// The subject `id` as the log keeps it.
    pub fn hash(&self, id: &str) -> String {
        crypto::subject_hash(&self.hash_key, id)
    }
}

/// A reader's keys, from its configuration (`None` without `KEY_TABLE`).
pub fn reader_keys(aws: &aws_config::SdkConfig, config: Option<&SubjectsConfig>) -> Option<Arc<Keys>> {
    config.map(|config| keys(aws, config))
}

/// The keys in `table`, for a reader (the CLI's, named by the stack).
pub fn table_keys(aws: &aws_config::SdkConfig, table: String) -> Arc<Keys> {
    Arc::new(Keys::new(aws_sdk_dynamodb::Client::new(aws), aws_sdk_kms::Client::new(aws), table))
}

/// The key store `config` names, with clients made from `aws`.
pub fn keys(aws: &aws_config::SdkConfig, config: &SubjectsConfig) -> Arc<Keys> {
    let keys = Keys::new(aws_sdk_dynamodb::Client::new(aws), aws_sdk_kms::Client::new(aws), config.key_table.clone())
        .sealing_with(config.kms_key.clone())
        .cached_for(config.cache);
    Arc::new(keys)
}

/// Where an ingested event's subject comes from (`SUBJECT_FROM`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectRule {
    /// The event's `EntityId` (query, else body): the default.
    EntityId,
    /// A JSON pointer into the posted event (`/user/id`).
    Pointer(String),
    /// A query parameter (`query:uid`).
    Query(String),
    /// No event has a subject: nothing is sealed.
    None,
}

impl FromStr for SubjectRule {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text.trim() {
            "EntityId" => Ok(SubjectRule::EntityId),
            "none" => Ok(SubjectRule::None),
            pointer if pointer.starts_with('/') => Ok(SubjectRule::Pointer(pointer.to_owned())),
            other => match other.strip_prefix("query:") {
                Some(name) if !name.is_empty() => Ok(SubjectRule::Query(name.to_owned())),
                _ => Err(Error::Config(format!(
                    "SUBJECT_FROM={other:?}: expected EntityId, none, a JSON pointer (/user/id) or query:<name>"
                ))),
            },
        }
    }
}

impl SubjectRule {
    /// The subject's plain id, if the event has one: a non-empty string or a
    /// number where the rule points.
    pub fn subject(&self, query: &BTreeMap<String, Vec<String>>, body: Option<&Value>) -> Option<String> {
        let from_query = |name: &str| query.get(name).and_then(|v| v.first()).cloned();
        let scalar = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        let id = match self {
            SubjectRule::EntityId => from_query(ENTITY_ID).or_else(|| body?.get(ENTITY_ID).and_then(scalar)),
            SubjectRule::Pointer(pointer) => body?.pointer(pointer).and_then(scalar),
            SubjectRule::Query(name) => from_query(name),
            SubjectRule::None => None,
        };
        id.filter(|id| !id.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_comes_from_where_the_rule_says() {
        let query = BTreeMap::from([("uid".to_owned(), vec!["u-1".to_owned()])]);
        let body = serde_json::json!({"EntityId": 42, "user": {"id": "u-2"}, "empty": ""});
        let rule = |text: &str| text.parse::<SubjectRule>().unwrap();
        assert_eq!(rule("EntityId").subject(&query, Some(&body)).as_deref(), Some("42"));
        assert_eq!(rule("/user/id").subject(&query, Some(&body)).as_deref(), Some("u-2"));
        assert_eq!(rule("query:uid").subject(&query, Some(&body)).as_deref(), Some("u-1"));
        assert_eq!(rule("none").subject(&query, Some(&body)), None);
        assert_eq!(rule("/empty").subject(&query, Some(&body)), None, "an empty id is none");
        assert_eq!(rule("/user").subject(&query, Some(&body)), None, "an object is no id");
        assert_eq!(rule("/user/id").subject(&query, None), None);
        for bad in ["user", "query:", "entityid"] {
            assert!(matches!(bad.parse::<SubjectRule>(), Err(Error::Config(_))), "{bad}");
        }
    }
}
