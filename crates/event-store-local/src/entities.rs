//! The demo's entity streams, over HTTP against the local server: the
//! article's Todo flow and Counter step by step, then a few account streams
//! appended at once. Every event carries the run id in its metadata, so the
//! demo follows each one through relay, pump and scan into the playback and
//! the subscription, and checks each stream comes back in version order.

use std::collections::{BTreeMap, HashMap, HashSet};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

/// What the entity phase did.
#[derive(Debug, Default)]
pub struct EntityRun {
    /// Events of this run per entity stream: versions `0..n` (a `StreamDeleted` is not counted).
    pub streams: BTreeMap<String, u64>,
    /// Steps of the Todo flow and the Counter that did not answer as the contract says.
    pub problems: Vec<String>,
    pub requests: usize,
}

impl EntityRun {
    pub fn events(&self) -> usize {
        self.streams.values().sum::<u64>() as usize
    }
}

struct Answer {
    status: StatusCode,
    etag: Option<String>,
    body: Value,
}

struct Http {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    base: String,
}

impl Http {
    async fn call(&self, method: Method, path: &str, headers: &[(&str, &str)], body: Option<Value>) -> Result<Answer> {
        let mut request = Request::builder().method(method).uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let response =
            self.client.request(request.header("content-type", "application/json").body(Full::new(body))?).await?;
        let status = response.status();
        let etag = response.headers().get("etag").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok(Answer { status, etag, body: serde_json::from_slice(&bytes).unwrap_or(Value::Null) })
    }
}

/// Records a step that did not answer `status` (and `etag`, when given).
fn expect(out: &mut EntityRun, step: &str, answer: &Answer, status: StatusCode, etag: Option<&str>) {
    out.requests += 1;
    if answer.status != status || (etag.is_some() && answer.etag.as_deref() != etag) {
        out.problems
            .push(format!("{step}: {} {:?} {}, expected {status} {etag:?}", answer.status, answer.etag, answer.body));
    }
}

fn event(kind: &str, data: Value, run_id: &str) -> Value {
    json!({"type": kind, "data": data, "metadata": {"run": run_id}, "id": uuid::Uuid::new_v4()})
}

/// Writers that append to one stream at once in the contended phase, and appends each.
pub const CONTENDED_WRITERS: u64 = 8;
pub const CONTENDED_APPENDS: u64 = 5;

/// `CONTENDED_WRITERS` writers appending `CONTENDED_APPENDS` events each to
/// one stream at once, each `If-Match` the version it last saw: on `409` it
/// takes the current version from the answer and tries again, on a `5xx` it
/// sends the same request again (its event ids make that idempotent). Every
/// `201` must be in the stream, once, in the writer's order: returns the
/// stream's events, the problems, and the requests sent.
async fn contended(http: &Http, path: &str, run_id: &str) -> Result<(u64, Vec<String>, usize)> {
    let opened =
        http.call(Method::POST, path, &[("if-none-match", "*")], Some(event("Opened", json!({}), run_id))).await?;
    if opened.status != StatusCode::CREATED {
        return Ok((0, vec![format!("{path}: open: {} {}", opened.status, opened.body)], 1));
    }
    let writers = futures::future::join_all((0..CONTENDED_WRITERS).map(|w| async move {
        let (mut version, mut requests, mut acknowledged) = (0u64, 0usize, Vec::new());
        for n in 0..CONTENDED_APPENDS {
            let body = event("Added", json!({"writer": w, "n": n}), run_id);
            loop {
                requests += 1;
                let a = http
                    .call(Method::POST, path, &[("if-match", &format!("\"{version}\""))], Some(body.clone()))
                    .await?;
                match a.status {
                    StatusCode::CREATED => {
                        version = a.body["last"].as_u64().unwrap_or(version);
                        acknowledged.push((n, version));
                        break;
                    }
                    StatusCode::CONFLICT => version = a.body["current_version"].as_u64().unwrap_or(version),
                    status if status.is_server_error() => {
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await
                    }
                    status => anyhow::bail!("{path}: writer {w}: {status} {}", a.body),
                }
            }
        }
        Ok::<_, anyhow::Error>((w, acknowledged, requests))
    }))
    .await;
    let mut problems = Vec::new();
    let mut requests = 1;
    let read = http.call(Method::GET, &format!("{path}?limit=1000"), &[], None).await?;
    let events = read.body["events"].as_array().cloned().unwrap_or_default();
    for writer in writers {
        let (w, acknowledged, sent) = writer?;
        requests += sent;
        // Each acknowledged append where its answer said: (n, version).
        let stored: Vec<(u64, u64)> = events
            .iter()
            .filter(|e| e["data"]["writer"].as_u64() == Some(w))
            .filter_map(|e| Some((e["data"]["n"].as_u64()?, e["version"].as_u64()?)))
            .collect();
        if stored != acknowledged {
            problems.push(format!("{path}: writer {w} was acknowledged {acknowledged:?}, the stream holds {stored:?}"));
        }
    }
    let versions: Vec<u64> = events.iter().filter_map(|e| e["version"].as_u64()).collect();
    let expected = 1 + CONTENDED_WRITERS * CONTENDED_APPENDS;
    if versions != (0..expected).collect::<Vec<_>>() {
        problems.push(format!("{path}: versions {versions:?}, not 0..{expected}"));
    }
    Ok((events.len() as u64, problems, requests + 1))
}

/// Runs the Todo flow, the Counter, `streams` account streams of `appends`
/// appends each, and the contended stream.
pub async fn run(port: u16, run_id: &str, streams: usize, appends: u64) -> Result<EntityRun> {
    let http =
        Http { client: Client::builder(TokioExecutor::new()).build_http(), base: format!("http://127.0.0.1:{port}") };
    let mut out = EntityRun::default();
    let short = &run_id[..8];
    todo_flow(&http, run_id, &mut out).await?;
    counter_flow(&http, run_id, &mut out).await?;
    account_streams(&http, run_id, (streams, appends), &mut out).await?;

    // Many writers on one stream: no acknowledged append is lost (moto needs the local stack's
    // transactions-alone lane for that, as DynamoDB isolates a transaction from other writes).
    let name = format!("contended-{short}");
    let (events, problems, requests) = contended(&http, &format!("/streams/{name}"), run_id).await?;
    out.requests += requests;
    out.problems.extend(problems);
    out.streams.insert(name, events);
    Ok(out)
}

/// The article's Todo flow, step by step: create, create again, the same create retried, update,
/// a stale update, an update of an unknown id, delete, read.
async fn todo_flow(http: &Http, run_id: &str, out: &mut EntityRun) -> Result<()> {
    let short = &run_id[..8];
    let todo = format!("/streams/todo-{short}");
    let created = event("TodoCreated", json!({"title": "buy milk"}), run_id);
    let a = http.call(Method::POST, &todo, &[("if-none-match", "*")], Some(created.clone())).await?;
    expect(out, "create", &a, StatusCode::CREATED, Some("\"0\""));
    let a = http
        .call(Method::POST, &todo, &[("if-none-match", "*")], Some(event("TodoCreated", json!({}), run_id)))
        .await?;
    expect(out, "create again", &a, StatusCode::CONFLICT, Some("\"0\""));
    let a = http.call(Method::POST, &todo, &[("if-none-match", "*")], Some(created)).await?;
    expect(out, "the same create, retried", &a, StatusCode::CREATED, Some("\"0\""));
    let updated = event("TodoUpdated", json!({"title": "buy oat milk"}), run_id);
    let a = http.call(Method::POST, &todo, &[("if-match", "\"0\"")], Some(updated)).await?;
    expect(out, "update", &a, StatusCode::CREATED, Some("\"1\""));
    let a =
        http.call(Method::POST, &todo, &[("if-match", "\"0\"")], Some(event("TodoUpdated", json!({}), run_id))).await?;
    expect(out, "stale update", &a, StatusCode::CONFLICT, Some("\"1\""));
    let unknown = format!("/streams/todo-{short}-unknown");
    let a = http
        .call(Method::POST, &unknown, &[("if-match", "\"0\"")], Some(event("TodoUpdated", json!({}), run_id)))
        .await?;
    expect(out, "update an unknown id", &a, StatusCode::NOT_FOUND, None);
    let a = http.call(Method::DELETE, &todo, &[("if-match", "\"1\"")], None).await?;
    expect(out, "delete", &a, StatusCode::CREATED, Some("\"2\""));
    let a = http.call(Method::GET, &todo, &[], None).await?;
    expect(out, "read", &a, StatusCode::OK, Some("\"2\""));
    let types: Vec<&str> =
        a.body["events"].as_array().map(|e| e.iter().filter_map(|e| e["type"].as_str()).collect()).unwrap_or_default();
    if types != ["TodoCreated", "TodoUpdated", "StreamDeleted"] {
        out.problems.push(format!("read: events {types:?}"));
    }
    out.streams.insert(format!("todo-{short}"), 2);
    Ok(())
}

/// The article's Counter: three increments and a decrement, each `If-Match` the last version; the fold gives 2.
async fn counter_flow(http: &Http, run_id: &str, out: &mut EntityRun) -> Result<()> {
    let short = &run_id[..8];
    let counter = format!("/streams/counter-{short}");
    for (i, step) in ["Increment", "Increment", "Increment", "Decrement"].iter().enumerate() {
        let precondition =
            if i == 0 { ("if-none-match", "*".to_owned()) } else { ("if-match", format!("\"{}\"", i - 1)) };
        let a = http
            .call(Method::POST, &counter, &[(precondition.0, &precondition.1)], Some(event(step, json!({}), run_id)))
            .await?;
        expect(out, step, &a, StatusCode::CREATED, None);
    }
    let a = http.call(Method::GET, &counter, &[], None).await?;
    let value: i64 = a.body["events"]
        .as_array()
        .map(|events| events.iter().map(|e| if e["type"] == "Increment" { 1 } else { -1 }).sum())
        .unwrap_or_default();
    if value != 2 {
        out.problems.push(format!("counter: the fold gives {value}, not 2"));
    }
    out.streams.insert(format!("counter-{short}"), 4);
    Ok(())
}

/// `streams` account streams, appended at the same time, `appends` times each.
async fn account_streams(
    http: &Http,
    run_id: &str,
    (streams, appends): (usize, u64),
    out: &mut EntityRun,
) -> Result<()> {
    let short = &run_id[..8];
    // Account streams, appended at the same time: batches of 1 to 3 events, each If-Match the last ETag.
    let accounts = futures::future::join_all((0..streams).map(|k| async move {
        let path = format!("/streams/account-{short}-{k}");
        let mut version: Option<u64> = None;
        let mut problems = Vec::new();
        for n in 0..appends {
            let size = 1 + (n + k as u64) % 3;
            let events: Vec<Value> = (0..size).map(|i| event("Moved", json!({"n": n, "i": i}), run_id)).collect();
            let precondition = match version {
                None => ("if-none-match", "*".to_owned()),
                Some(v) => ("if-match", format!("\"{v}\"")),
            };
            let a = http.call(Method::POST, &path, &[(precondition.0, &precondition.1)], Some(json!(events))).await?;
            if a.status != StatusCode::CREATED {
                problems.push(format!("{path}: {} {}", a.status, a.body));
                break;
            }
            version = a.body["last"].as_u64();
        }
        Ok::<_, anyhow::Error>((format!("account-{short}-{k}"), version.map_or(0, |v| v + 1), problems))
    }))
    .await;
    for account in accounts {
        let (name, events, problems) = account.context("appending to the account streams")?;
        out.requests += appends as usize;
        out.problems.extend(problems);
        out.streams.insert(name, events);
    }
    Ok(())
}

/// Checks the delivered ids (`<stream>/<version>` per partition key, in delivery order) of each
/// entity stream (its events keyed `streams/<name>`): versions `0..n`, first deliveries in order, none missing.
pub fn check_versions(
    streams: &BTreeMap<String, u64>,
    delivered: &HashMap<String, Vec<String>>,
    what: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (stream, count) in streams {
        let mut seen = HashSet::new();
        let firsts: Vec<u64> = delivered
            .get(&event_store::envelope::entity_key(stream))
            .into_iter()
            .flatten()
            .filter(|id| seen.insert(id.as_str()))
            .filter_map(|id| id.rsplit_once('/').and_then(|(_, v)| v.parse().ok()))
            .collect();
        if firsts != (0..*count).collect::<Vec<_>>() {
            problems.push(format!("{what}: {stream} came as versions {firsts:?}, not 0..{count} in order"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_must_come_in_order_without_gaps_copies_aside() {
        let streams = BTreeMap::from([("a".to_owned(), 3)]);
        let ids = |v: &[&str]| HashMap::from([("streams/a".to_owned(), v.iter().map(|v| format!("a/{v}")).collect())]);
        assert!(check_versions(&streams, &ids(&["0", "1", "1", "2"]), "x").is_empty());
        assert_eq!(check_versions(&streams, &ids(&["0", "2", "1"]), "x").len(), 1);
        assert_eq!(check_versions(&streams, &ids(&["0", "1"]), "x").len(), 1);
        assert_eq!(check_versions(&streams, &HashMap::new(), "x").len(), 1);
    }
}
