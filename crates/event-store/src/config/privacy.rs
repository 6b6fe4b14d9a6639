//! Per-subject encryption's settings (`docs/privacy.md`), read by every
//! function that seals or opens: without `KEY_TABLE` nothing is sealed, and a
//! reader that meets a sealed event fails instead of handing it out sealed.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use serde_json::Value;

use super::{Env, Variables};
use crate::error::{Error, Result};

/// Default `KEY_CACHE_SECONDS`: how long an unwrapped key is used before it is read again.
pub const DEFAULT_KEY_CACHE: Duration = Duration::from_secs(60);
/// The field (query parameter or body field) naming an ingested event's entity.
const ENTITY_ID: &str = "EntityId";

/// The shortest `SUBJECT_HASH_KEY`: 32 bytes, HMAC-SHA256's block of strength.
pub const MIN_HASH_KEY_BYTES: usize = 32;

/// Where subjects' keys are, and (for writers) how subjects are found and hashed.
#[derive(Debug, Clone)]
pub struct SubjectsConfig {
    pub key_table: String,
    /// The keys function writers ask for a subject's new key (`KEY_FUNCTION`): in a stack, writers
    /// may only read the key table.
    pub key_function: Option<String>,
    /// The KMS key new data keys are made under, by the writer itself when no keys function is
    /// named (local runs).
    pub kms_key: Option<String>,
    /// The secret the subject's id is hashed with (writers, and `forget`).
    pub hash_key: Option<String>,
    /// Where an ingested event's subject comes from (`SUBJECT_FROM`, default `EntityId`).
    pub rule: SubjectRule,
    /// Which entity streams are subjects (`STREAM_SUBJECTS`, default `all`).
    pub streams: StreamSubjects,
    /// How long an unwrapped key is used (`KEY_CACHE_SECONDS`).
    pub cache: Duration,
}

impl SubjectsConfig {
    /// `None` when `KEY_TABLE` is unset. A reader reads `KEY_TABLE` and
    /// `KEY_CACHE_SECONDS`; a writer (it seals) also `KEY_FUNCTION` (else
    /// `SUBJECT_KMS_KEY`), `SUBJECT_HASH_KEY`, and `SUBJECT_FROM` (load) or
    /// `STREAM_SUBJECTS` (streams), and needs a maker and the hash key unless
    /// its rule names no subject.
    pub(super) fn from_env(env: &Env, role: Role) -> Result<Option<Self>> {
        let Some(key_table) = env.raw("KEY_TABLE") else { return Ok(None) };
        let seconds: u64 = env.var_or("KEY_CACHE_SECONDS", DEFAULT_KEY_CACHE.as_secs())?;
        if seconds > 3600 {
            return Err(Error::Config(format!("KEY_CACHE_SECONDS={seconds}: at most 3600 (a forget waits that long)")));
        }
        let cache = Duration::from_secs(seconds);
        let (rule, streams) = match role {
            Role::Reader => (SubjectRule::None, StreamSubjects::None),
            Role::Load => {
                (env.raw("SUBJECT_FROM").map_or(Ok(SubjectRule::EntityId), |r| r.parse())?, StreamSubjects::None)
            }
            Role::Streams => {
                (SubjectRule::None, env.raw("STREAM_SUBJECTS").map_or(Ok(StreamSubjects::All), |r| r.parse())?)
            }
        };
        let writer = rule != SubjectRule::None || streams != StreamSubjects::None;
        let (key_function, kms_key, hash_key) = if role == Role::Reader {
            (None, None, None)
        } else {
            (env.raw("KEY_FUNCTION"), env.raw("SUBJECT_KMS_KEY"), env.raw("SUBJECT_HASH_KEY"))
        };
        let config = Self { key_table, key_function, kms_key, hash_key, rule, streams, cache };
        if writer {
            if config.key_function.is_none() && config.kms_key.is_none() {
                return Err(Error::Config(
                    "KEY_TABLE is set: sealing needs KEY_FUNCTION (or SUBJECT_KMS_KEY to make keys itself)".into(),
                ));
            }
            config.hash_key()?;
        }
        Ok(Some(config))
    }

    /// The hash key's bytes, at least [`MIN_HASH_KEY_BYTES`].
    pub fn hash_key(&self) -> Result<&[u8]> {
        match self.hash_key.as_deref() {
            Some(key) if key.len() >= MIN_HASH_KEY_BYTES => Ok(key.as_bytes()),
            Some(_) => Err(Error::Config(format!("SUBJECT_HASH_KEY: at least {MIN_HASH_KEY_BYTES} characters"))),
            None => Err(Error::Config("KEY_TABLE is set: SUBJECT_HASH_KEY is needed to hash subjects".into())),
        }
    }
}

/// Which function reads the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Opens sealed events only.
    Reader,
    /// Seals ingested events (`SUBJECT_FROM`).
    Load,
    /// Seals entity events (`STREAM_SUBJECTS`).
    Streams,
}

/// Which entity streams are data subjects (`STREAM_SUBJECTS`): each such
/// stream is its own subject, named by the stream's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSubjects {
    /// Every stream (the default).
    All,
    /// The streams whose names start with one of these (`prefix:user-,customer-`).
    Prefixes(Vec<String>),
    /// None: entity events are not sealed.
    None,
}

impl FromStr for StreamSubjects {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text.trim() {
            "all" => Ok(StreamSubjects::All),
            "none" => Ok(StreamSubjects::None),
            other => {
                let prefixes: Vec<String> = other
                    .strip_prefix("prefix:")
                    .map(|list| list.split(',').map(str::trim).filter(|p| !p.is_empty()).map(str::to_owned).collect())
                    .unwrap_or_default();
                if prefixes.is_empty() {
                    return Err(Error::Config(format!(
                        "STREAM_SUBJECTS={other:?}: expected all, none or prefix:<p1>,<p2>"
                    )));
                }
                Ok(StreamSubjects::Prefixes(prefixes))
            }
        }
    }
}

impl StreamSubjects {
    /// The subject's plain id of `stream`'s events, if the stream is one: its name.
    pub fn subject<'a>(&self, stream: &'a str) -> Option<&'a str> {
        let is = match self {
            StreamSubjects::All => true,
            StreamSubjects::Prefixes(prefixes) => prefixes.iter().any(|p| stream.starts_with(p.as_str())),
            StreamSubjects::None => false,
        };
        is.then_some(stream)
    }
}

/// The `privacy` function's (`forget`): the key table, and the secret subjects are hashed with.
#[derive(Debug, Clone)]
pub struct PrivacyConfig {
    pub key_table: String,
    pub hash_key: String,
}

impl PrivacyConfig {
    pub const VARIABLES: Variables = Variables { required: &["KEY_TABLE", "SUBJECT_HASH_KEY"], optional: &[] };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        let config = Self { key_table: env.var("KEY_TABLE")?, hash_key: env.var("SUBJECT_HASH_KEY")? };
        if config.hash_key.len() < MIN_HASH_KEY_BYTES {
            return Err(Error::Config(format!("SUBJECT_HASH_KEY: at least {MIN_HASH_KEY_BYTES} characters")));
        }
        Ok(config)
    }
}

/// The `keys` function's: the key table, and the KMS key new data keys are made under.
#[derive(Debug, Clone)]
pub struct KeysConfig {
    pub key_table: String,
    pub kms_key: String,
}

impl KeysConfig {
    pub const VARIABLES: Variables = Variables { required: &["KEY_TABLE", "SUBJECT_KMS_KEY"], optional: &[] };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Ok(Self { key_table: env.var("KEY_TABLE")?, kms_key: env.var("SUBJECT_KMS_KEY")? })
    }
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
        let streams = |text: &str| text.parse::<StreamSubjects>().unwrap();
        assert_eq!(streams("all").subject("todo-1"), Some("todo-1"));
        assert_eq!(streams("none").subject("todo-1"), None);
        let people = streams("prefix:user-, customer-");
        assert_eq!(
            (people.subject("user-7"), people.subject("customer-1"), people.subject("order-1")),
            (Some("user-7"), Some("customer-1"), None)
        );
        assert!("prefix:".parse::<StreamSubjects>().is_err() && "some".parse::<StreamSubjects>().is_err());
    }
}
