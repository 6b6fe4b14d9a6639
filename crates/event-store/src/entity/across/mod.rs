//! Appends across streams: one `TransactWriteItems` that appends to several
//! streams, each on its own expected version, and checks streams it does not
//! write ("B is still at version 7", "C does not exist"): the consistency
//! boundary of one decision drawn around several streams, as Axon's and
//! KurrentDB's multi-stream appends draw it.
//!
//! Each written stream gets what a single append writes (its tip's version
//! check, its batch, a new stream's relay position and index item), each
//! condition a `ConditionCheck` on a tip, and a request whose events all carry
//! client ids one record (in its first stream) naming every stream's versions:
//! a retry is answered with them. The relay then puts each stream's events on
//! the log once and in its version order, as for any append; the log does not
//! order one request's streams among themselves.

use aws_sdk_dynamodb::types::{ConditionCheck, TransactWriteItem};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::append::{is_cancelled, AppendFailure, Keyed};
use super::model::{
    check_name, request_item_key, RequestItem, StoredEventItem, Tip, MAX_NEW_NAME_BYTES, MAX_VERSION, TIP,
};
use super::{key, n, Also, Appended, EntityError, EntityStore, Expected, Invalid, NewEvent};
use crate::error::Error;
use crate::time::now_ms;

/// Streams one request may touch, written or checked: each written stream
/// takes up to 4 of a transaction's 100 actions (tip, batch, and for a new
/// stream its relay position and index item), each checked one 1, the record 1.
pub const MAX_STREAMS_ACROSS: usize = 24;
// 4 actions a stream at most, and the record: within a transaction's 100.
const _: () = assert!(MAX_STREAMS_ACROSS * 4 < 100);
/// Events stored inline in all its batches: a transaction carries at most 4 MB.
pub const MAX_ACROSS_BYTES: usize = 3 * 1024 * 1024;

/// One stream's part of an append across streams.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamAppend {
    pub stream: String,
    pub expected: Expected,
    pub events: Vec<NewEvent>,
}

/// What a stream the request does not write must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// At exactly this version.
    Version(u64),
    /// Not existing.
    NoStream,
    /// Existing, at any version.
    Exists,
}

/// One stream's versions, as an across-streams record keeps them.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Versions {
    stream: String,
    first: u64,
    last: u64,
}

/// A prepared append: its stream, what it expects, its stored events.
struct Part {
    stream: String,
    expected: Expected,
    events: Vec<StoredEventItem>,
}

impl EntityStore {
    /// Appends each of `appends` to its stream if its expectation holds and
    /// every one of `conditions` holds, all or none. Sending the same events
    /// again (same ids, every event with one) after a success answers the
    /// original versions with `replayed` set. A failed expectation or condition
    /// is [`EntityError::Refused`], naming the stream.
    pub async fn append_across(
        &self,
        appends: Vec<StreamAppend>,
        conditions: Vec<(String, Condition)>,
    ) -> Result<Vec<Appended>, EntityError> {
        check_across(&appends, &conditions)?;
        let mut parts = Vec::with_capacity(appends.len());
        let mut keyed = Keyed::Yes;
        for StreamAppend { stream, expected, mut events } in appends {
            self.stamp(&mut events);
            if Keyed::by_client(&events) == Keyed::No {
                keyed = Keyed::No;
            }
            let events = self.prepare(&stream, events).await?;
            parts.push(Part { stream, expected, events });
        }
        // What the batch items carry: each stream's events as one JSON text.
        let inline: usize = parts
            .iter()
            .map(|p| serde_json::to_string(&p.events).map(|text| text.len()))
            .sum::<Result<usize, _>>()
            .map_err(|e| Error::encode("events", e))?;
        if inline > MAX_ACROSS_BYTES {
            return Err(
                Invalid::TooLarge(format!("{inline} bytes of events; at most {MAX_ACROSS_BYTES} in all")).into()
            );
        }
        let request = across_key(&parts);
        let streams: Vec<&str> =
            parts.iter().map(|p| p.stream.as_str()).chain(conditions.iter().map(|c| &*c.0)).collect();
        // Read only when needed: for an `Any` (it takes the version the tip has), and after a cancel.
        let mut tips = None;
        for attempt in 0..self.backoff.max_attempts {
            if tips.is_none() && parts.iter().any(|p| p.expected == Expected::Any) {
                tips = Some(self.tips_of(&streams).await?);
            }
            let expected = match &tips {
                Some(tips) => match expectations(&parts, &conditions, tips) {
                    Ok(expected) => expected,
                    // Refused by the tips as they are, unless this very request made them so.
                    Err(refused) => {
                        return match self.applied_across(&parts, tips, &request, keyed).await? {
                            Some(replayed) => Ok(replayed),
                            None => Err(refused),
                        }
                    }
                },
                None => parts.iter().map(|p| p.expected).collect(),
            };
            let versions = versions(&parts, &expected)?;
            if self.write_across(&parts, &expected, &versions, &conditions, &request, keyed).await? {
                return Ok(versions
                    .iter()
                    .map(|v| Appended { first: v.first, last: v.last, replayed: false })
                    .collect());
            }
            // Cancelled: applied before (the original answer), refused (named by the tips as they
            // are now), or another transaction held one of the items (tried again). The tips are
            // read first: a copy of this request that commits meanwhile shows in them or its record.
            let now = self.tips_of(&streams).await?;
            if let Some(replayed) = self.applied_across(&parts, &now, &request, keyed).await? {
                return Ok(replayed);
            }
            expectations(&parts, &conditions, &now)?;
            tips = Some(now);
            self.backoff.wait(attempt).await;
        }
        Err(Error::Throttled {
            service: "dynamodb",
            operation: "TransactWriteItems",
            source: format!("{} streams: still contended after {} attempts", parts.len(), self.backoff.max_attempts)
                .into(),
        }
        .into())
    }

    /// One try. False when the transaction was cancelled.
    async fn write_across(
        &self,
        parts: &[Part],
        expectations: &[Expected],
        versions: &[Versions],
        conditions: &[(String, Condition)],
        request: &str,
        keyed: Keyed,
    ) -> Result<bool, Error> {
        let now = now_ms();
        let failure = |f: AppendFailure| match f {
            AppendFailure::Store(err) => err,
            AppendFailure::Cancelled => Error::Malformed("a transaction built as cancelled".into()),
        };
        let mut items = Vec::new();
        for ((part, expected), v) in parts.iter().zip(expectations).zip(versions) {
            let built = self.append_items(&part.stream, *expected, v.first, &part.events, request, Also::Nothing, now);
            items.extend(built.map_err(failure)?);
        }
        for (stream, condition) in conditions {
            items.push(TransactWriteItem::builder().condition_check(self.check(stream, *condition)?).build());
        }
        if keyed == Keyed::Yes {
            let across = serde_json::to_string(versions).map_err(|e| Error::encode("request record", e))?;
            let record = RequestItem {
                stream: parts[0].stream.clone(),
                item: request_item_key(request),
                first: versions[0].first,
                last: versions[0].last,
                at: now,
                across: Some(across),
            };
            items.push(
                TransactWriteItem::builder().put(self.put_new(&record, "request record").map_err(failure)?).build(),
            );
        }
        match self.dynamo.transact_write_items().set_transact_items(Some(items)).send().await {
            Ok(_) => Ok(true),
            Err(err) if is_cancelled(&err) => Ok(false),
            Err(err) => Err(Error::dynamo("TransactWriteItems", err)),
        }
    }

    fn check(&self, stream: &str, condition: Condition) -> Result<ConditionCheck, Error> {
        let check = ConditionCheck::builder()
            .table_name(&self.table)
            .set_key(Some(key(stream, TIP)))
            .expression_attribute_names("#version", "version");
        let check = match condition {
            Condition::Version(v) => {
                check.condition_expression("#version = :v").expression_attribute_values(":v", n(v))
            }
            Condition::NoStream => check.condition_expression("attribute_not_exists(#version)"),
            Condition::Exists => check.condition_expression("attribute_exists(#version)"),
        };
        Ok(check.build()?)
    }

    /// The original answer of this request, if it was applied before: every
    /// written stream's tip still names it as its last append (what a retry
    /// of a request without client ids, or a copy sent at once, finds), or its
    /// record says so (a request of client ids, whatever was appended since).
    async fn applied_across(
        &self,
        parts: &[Part],
        tips: &[Option<Tip>],
        request: &str,
        keyed: Keyed,
    ) -> Result<Option<Vec<Appended>>, Error> {
        let by_tips: Option<Vec<Appended>> = parts
            .iter()
            .zip(tips)
            .map(|(part, tip)| {
                let tip = tip.as_ref().filter(|t| t.last_request.as_deref() == Some(request))?;
                let first = tip.last_first?;
                Some(Appended { first, last: first + part.events.len() as u64 - 1, replayed: true })
            })
            .collect();
        if by_tips.is_some() || keyed == Keyed::No {
            return Ok(by_tips);
        }
        let Some(record) = self.applied_request(&parts[0].stream, Some(request)).await? else { return Ok(None) };
        let versions: Vec<Versions> = match &record.across {
            Some(text) => serde_json::from_str(text).map_err(|e| Error::Malformed(format!("request record: {e}")))?,
            None => {
                return Err(Error::Malformed(format!("{}: a single append's record for this request", record.stream)))
            }
        };
        Ok(Some(versions.iter().map(|v| Appended { first: v.first, last: v.last, replayed: true }).collect()))
    }

    /// The tips of `streams` (strongly consistent reads), in order.
    async fn tips_of(&self, streams: &[&str]) -> Result<Vec<Option<Tip>>, Error> {
        let reads = streams.iter().map(|stream| self.tip(stream));
        futures::future::try_join_all(reads).await
    }
}

/// Each written stream's versions if its expectation holds.
fn versions(parts: &[Part], expectations: &[Expected]) -> Result<Vec<Versions>, Invalid> {
    parts
        .iter()
        .zip(expectations)
        .map(|(part, expected)| {
            let first = expected.first_version().unwrap_or(0);
            let last = first + part.events.len() as u64 - 1;
            if last > MAX_VERSION {
                return Err(Invalid::BadRequest(format!(
                    "{}: a stream holds at most {MAX_VERSION} events",
                    part.stream
                )));
            }
            if first == 0 && part.stream.len() > MAX_NEW_NAME_BYTES {
                return Err(Invalid::BadRequest(format!(
                    "{}: a new stream's name is 1 to {MAX_NEW_NAME_BYTES} bytes",
                    part.stream
                )));
            }
            Ok(Versions { stream: part.stream.clone(), first, last })
        })
        .collect()
}

/// What each write expects this round, from the tips just read; the first
/// expectation or condition they already refute is the answer.
fn expectations(
    parts: &[Part],
    conditions: &[(String, Condition)],
    tips: &[Option<Tip>],
) -> Result<Vec<Expected>, EntityError> {
    // `deleted` (a 410) for a written stream only: a deleted stream exists, at its version, to a condition.
    let refused = |stream: &str, tip: &Option<Tip>, written: bool| EntityError::Refused {
        stream: stream.to_owned(),
        current: tip.as_ref().map(|t| t.version),
        deleted: written && tip.as_ref().is_some_and(|t| t.deleted),
    };
    let mut expectations = Vec::with_capacity(parts.len());
    for (part, tip) in parts.iter().zip(tips) {
        let holds = match (part.expected, tip) {
            (_, Some(t)) if t.deleted => false,
            (Expected::Any, _) | (Expected::NoStream, None) => true,
            (Expected::Version(v), Some(t)) => t.version == v,
            _ => false,
        };
        if !holds {
            return Err(refused(&part.stream, tip, true));
        }
        expectations.push(match (part.expected, tip) {
            (Expected::Any, Some(t)) => Expected::Version(t.version),
            (Expected::Any, None) => Expected::NoStream,
            (other, _) => other,
        });
    }
    for ((stream, condition), tip) in conditions.iter().zip(&tips[parts.len()..]) {
        let holds = match (condition, tip) {
            (Condition::Version(v), Some(t)) => t.version == *v,
            (Condition::NoStream, None) | (Condition::Exists, Some(_)) => true,
            _ => false,
        };
        if !holds {
            return Err(refused(stream, tip, false));
        }
    }
    Ok(expectations)
}

/// An append across streams: what it writes, what it checks.
pub(crate) type Across = (Vec<StreamAppend>, Vec<(String, Condition)>);

/// The body of `POST /streams`: `{"appends": [{"stream", "expected_version"?:
/// <version> | "no_stream" | "any" (the default), "events": [...]}],
/// "conditions"?: [{"stream", "expected_version": <version> | "no_stream" | "exists"}]}`.
pub(crate) fn parse_across(body: &[u8]) -> Result<Across, Invalid> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        appends: Vec<AppendBody>,
        #[serde(default)]
        conditions: Vec<ConditionBody>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AppendBody {
        stream: String,
        #[serde(default)]
        expected_version: Option<serde_json::Value>,
        events: Vec<NewEvent>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ConditionBody {
        stream: String,
        expected_version: serde_json::Value,
    }
    let body: Body =
        serde_json::from_slice(body).map_err(|e| Invalid::BadRequest(format!("append across streams: {e}")))?;
    let bad = |stream: &str, what: &str| Invalid::BadRequest(format!("{stream}: expected_version is {what}"));
    let appends = body
        .appends
        .into_iter()
        .map(|a| {
            let expected = match a.expected_version.as_ref().map(|v| (v.as_u64(), v.as_str())) {
                None | Some((None, Some("any"))) => Expected::Any,
                Some((None, Some("no_stream"))) => Expected::NoStream,
                Some((Some(v), _)) => Expected::Version(v),
                _ => return Err(bad(&a.stream, "a version, \"no_stream\" or \"any\"")),
            };
            Ok(StreamAppend { stream: a.stream, expected, events: a.events })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let conditions = body
        .conditions
        .into_iter()
        .map(|c| {
            let condition = match (c.expected_version.as_u64(), c.expected_version.as_str()) {
                (Some(v), _) => Condition::Version(v),
                (None, Some("no_stream")) => Condition::NoStream,
                (None, Some("exists")) => Condition::Exists,
                _ => return Err(bad(&c.stream, "a version, \"no_stream\" or \"exists\"")),
            };
            Ok((c.stream, condition))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((appends, conditions))
}

/// Checks an append across streams before anything is read or written.
fn check_across(appends: &[StreamAppend], conditions: &[(String, Condition)]) -> Result<(), Invalid> {
    let touched = appends.len() + conditions.len();
    if appends.is_empty() || touched > MAX_STREAMS_ACROSS {
        return Err(Invalid::BadRequest(format!(
            "an append across streams writes 1 or more streams and touches at most {MAX_STREAMS_ACROSS} in all"
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for stream in appends.iter().map(|a| &a.stream).chain(conditions.iter().map(|c| &c.0)) {
        check_name(stream).map_err(|e| Invalid::BadRequest(format!("{stream}: {e}")))?;
        if !seen.insert(stream) {
            return Err(Invalid::BadRequest(format!("{stream} appears twice: one part per stream")));
        }
    }
    // Each stream's own limits (1 to 100 events, MAX_APPEND_BYTES) are checked as it is prepared.
    if appends.iter().any(|a| a.events.is_empty()) {
        return Err(Invalid::BadRequest("every stream appended to needs 1 or more events".into()));
    }
    Ok(())
}

/// The request key of an append across streams: a hash of its streams and their event ids, in order.
fn across_key(parts: &[Part]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(b"across\0");
    for part in parts {
        hasher.update(part.stream.as_bytes());
        hasher.update([1]);
        for event in &part.events {
            hasher.update(event.id.as_bytes());
            hasher.update([0]);
        }
    }
    hex::encode(&hasher.finalize()[..16])
}

#[cfg(test)]
mod tests;
