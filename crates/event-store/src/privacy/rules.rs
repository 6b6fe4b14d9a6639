//! Who an event's data subject is: where an ingested event's subject comes
//! from (`SUBJECT_FROM`), and which entity streams are subjects
//! (`STREAM_SUBJECTS`). Pure.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde_json::Value;

use crate::error::{Error, Result};

/// The field (query parameter or body field) naming an ingested event's entity.
const ENTITY_ID: &str = "EntityId";

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
    pub(crate) fn subject<'a>(&self, stream: &'a str) -> Option<&'a str> {
        let is = match self {
            StreamSubjects::All => true,
            StreamSubjects::Prefixes(prefixes) => prefixes.iter().any(|p| stream.starts_with(p.as_str())),
            StreamSubjects::None => false,
        };
        is.then_some(stream)
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
    pub(crate) fn subject(&self, query: &BTreeMap<String, Vec<String>>, body: Option<&Value>) -> Option<String> {
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
