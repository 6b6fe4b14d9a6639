//! The `/streams/{name}` HTTP API over [`EntityStore`]: versions travel as
//! ETags (`"3"`), preconditions as `If-Match` / `If-None-Match`.
//!
//! | request | answer |
//! |---|---|
//! | `POST /streams/{name}` (`If-None-Match: *`, `If-Match: "v"` or none) | 201, 409, 404, 410 |
//! | `GET /streams?prefix=&after=&limit=` (names in name order, [`super::listing`]) | 200, 400 |
//! | `POST /streams` (an append across streams, [`super::across`]) | 201, 400, 409 (naming the stream), 410, 413 |
//! | `GET /streams/{name}?from=&limit=&direction=` | 200, 304, 404 |
//! | `DELETE /streams/{name}` with `If-Match` | 201, 409, 404, 410, 428 |
//! | `GET /streams/{name}/state` | 200, 304, 404 |
//! | `PUT /streams/{name}/snapshot` with `If-Match` | 200, 409, 404, 428 |
//! | `GET /streams/{name}/metadata` (its own version as the ETag) | 200, 404 |
//! | `PUT /streams/{name}/metadata` (`If-Match: "v"` of the metadata, or none) | 200, 400, 404, 409, 413 |
//! | `GET /views/{projection}[/{key}]` ([`ViewsApi`]) | 200, 404, 503 |
//! | `GET /log?from=&limit=&wait=&filter=` ([`LogApi`]) | 200, 400, 503 |

use lambda_http::http::{header, HeaderMap, Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use serde_json::{json, Value};
use tracing::{error, info};

use super::{Direction, EntityError, EntityStore, Expected, Invalid};
use crate::http::{body_text, check_json_content_type, json_response, Reject};
use crate::log::http::LogApi;
use crate::trace::{TraceContext, TRACEPARENT, TRACESTATE};
use crate::views::http::ViewsApi;

/// Events one `GET` returns unless `limit` says otherwise.
pub const DEFAULT_PAGE_EVENTS: usize = 100;
/// The most events one `GET` returns.
pub const MAX_PAGE_EVENTS: usize = 1000;

enum Route<'a> {
    List,
    Stream(&'a str),
    State(&'a str),
    Snapshot(&'a str),
    Metadata(&'a str),
}

/// `.../streams[/{name}[/state|/snapshot|/metadata]]`, behind any stage or base path.
fn route(path: &str) -> Option<Route<'_>> {
    let segments: Vec<&str> = path.split('/').collect();
    let at = segments.iter().rposition(|s| *s == "streams")?;
    match &segments[at + 1..] {
        [] => Some(Route::List),
        [name] => Some(Route::Stream(name)),
        [name, "state"] => Some(Route::State(name)),
        [name, "snapshot"] => Some(Route::Snapshot(name)),
        [name, "metadata"] => Some(Route::Metadata(name)),
        _ => None,
    }
}

/// A `/views` path: one whose first `views` segment comes before any `streams` one (a view's key
/// may hold `streams/...`, and a base path may hold either word: the API's own segment is first).
fn views_first(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    let first = |word: &str| segments.iter().position(|s| *s == word);
    ViewsApi::serves(path) && first("views") < first("streams").or(Some(usize::MAX))
}

fn reject(status: StatusCode, message: impl Into<String>) -> Reject {
    Reject::new(status, message)
}

/// An ETag for a version: `"3"`.
pub(crate) fn etag(version: u64) -> String {
    format!("\"{version}\"")
}

/// The version an `If-Match` names: `"3"` (or `3`).
fn parse_version(value: &str) -> Result<u64, Reject> {
    let trimmed = value.trim();
    let inner = trimmed.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(trimmed);
    if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_digit()) {
        return Err(reject(
            StatusCode::BAD_REQUEST,
            format!("If-Match must name a version, like \"3\"; got {value:?}"),
        ));
    }
    inner.parse().map_err(|_| reject(StatusCode::BAD_REQUEST, "the version in If-Match is too large"))
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<&str>, Reject> {
    headers
        .get(name.clone())
        .map(|v| v.to_str().map_err(|_| reject(StatusCode::BAD_REQUEST, format!("{name} is not ASCII"))))
        .transpose()
}

/// The events, each with the request's W3C trace context (`traceparent`, `tracestate`), if it has a valid one.
fn traced(events: Vec<super::NewEvent>, req: &Request) -> Vec<super::NewEvent> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let trace = TraceContext::parse(header(TRACEPARENT), header(TRACESTATE));
    if let Some(trace) = &trace {
        // The client's trace beside this invocation's X-Ray trace: the line that links the two.
        let xray = req.lambda_context_ref().and_then(|c| c.xray_trace_id.as_deref()).unwrap_or("-");
        info!(trace_ids = trace.trace_id(), xray_trace_id = xray, events = events.len(), "append traced");
    }
    events.into_iter().map(|event| super::NewEvent { trace: trace.clone(), ..event }).collect()
}

/// The precondition of an append: `If-None-Match: *`, `If-Match: "v"`, or none.
fn expected(headers: &HeaderMap) -> Result<Expected, Reject> {
    match (header_text(headers, header::IF_MATCH)?, header_text(headers, header::IF_NONE_MATCH)?) {
        (Some(_), Some(_)) => Err(reject(StatusCode::BAD_REQUEST, "send If-Match or If-None-Match, not both")),
        (Some(v), None) => Ok(Expected::Version(parse_version(v)?)),
        (None, Some(v)) if v.trim() == "*" => Ok(Expected::NoStream),
        (None, Some(_)) => Err(reject(StatusCode::BAD_REQUEST, "an append takes only If-None-Match: *")),
        (None, None) => Ok(Expected::Any),
    }
}

fn required_version(headers: &HeaderMap, what: &str) -> Result<u64, Reject> {
    match header_text(headers, header::IF_MATCH)? {
        Some(v) => parse_version(v),
        None => Err(reject(StatusCode::PRECONDITION_REQUIRED, format!("{what} needs If-Match with a version"))),
    }
}

/// The version an `If-None-Match` on a read names (`*` or an ETag list are not versions: ignored).
fn not_modified_since(headers: &HeaderMap) -> Option<u64> {
    header_text(headers, header::IF_NONE_MATCH).ok().flatten().and_then(|v| parse_version(v).ok())
}

fn with_etag(mut response: Response<Body>, version: u64) -> Response<Body> {
    if let Ok(value) = header::HeaderValue::from_str(&etag(version)) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

fn not_modified(version: u64) -> Response<Body> {
    let mut response = Response::new(Body::Empty);
    *response.status_mut() = StatusCode::NOT_MODIFIED;
    with_etag(response, version)
}

/// Maps what the store said to an answer: the caller's errors get their status, the store's a 503.
fn failure(err: EntityError) -> Response<Body> {
    let (status, body, version) = match &err {
        EntityError::Invalid(Invalid::BadRequest(m)) => (StatusCode::BAD_REQUEST, json!({"error": m}), None),
        EntityError::Invalid(Invalid::TooLarge(m)) => (StatusCode::PAYLOAD_TOO_LARGE, json!({"error": m}), None),
        EntityError::NotFound => (StatusCode::NOT_FOUND, json!({"error": "no such stream"}), None),
        EntityError::Conflict { current } => {
            (StatusCode::CONFLICT, json!({"error": err.to_string(), "current_version": current}), Some(*current))
        }
        EntityError::Refused { stream, current, deleted } => {
            let status = if *deleted { StatusCode::GONE } else { StatusCode::CONFLICT };
            (status, json!({"error": err.to_string(), "stream": stream, "current_version": current}), None)
        }
        EntityError::MetadataConflict { current } => {
            (StatusCode::CONFLICT, json!({"error": err.to_string(), "metadata_version": current}), Some(*current))
        }
        EntityError::Deleted { current } => {
            (StatusCode::GONE, json!({"error": err.to_string(), "current_version": current}), Some(*current))
        }
        EntityError::StaleSnapshot { stored } => {
            (StatusCode::CONFLICT, json!({"error": err.to_string(), "snapshot_version": stored}), None)
        }
        EntityError::Store(inner) => {
            error!(error = %inner, "entity store unavailable");
            (StatusCode::SERVICE_UNAVAILABLE, json!({"error": "store unavailable, retry later"}), None)
        }
    };
    let response = json_response(status, &body);
    match version {
        Some(v) => with_etag(response, v),
        None => response,
    }
}

fn rejected(r: Reject) -> Response<Body> {
    json_response(r.status, &json!({ "error": r.message }))
}

/// The `/streams` API of one entity table, and the projections' `/views` and the log's `/log` beside it.
pub struct StreamsApi {
    store: EntityStore,
    views: Option<ViewsApi>,
    log: Option<LogApi>,
}

impl StreamsApi {
    pub fn new(store: EntityStore) -> Self {
        Self { store, views: None, log: None }
    }

    /// Serves `/views` too (`VIEW_TABLE`): read models, under the same auth as the streams they come from.
    pub fn with_views(self, views: Option<ViewsApi>) -> Self {
        Self { views, ..self }
    }

    /// Serves `/log` too (`DYNAMO_EVENT_TABLE`): the complete log, a page at a time, under the same auth.
    pub fn with_log(self, log: Option<LogApi>) -> Self {
        Self { log, ..self }
    }

    /// True when `path` is one of this API's (the local server sends those here).
    pub fn serves(path: &str) -> bool {
        route(path).is_some() || ViewsApi::serves(path) || crate::log::http::serves(path)
    }

    /// Answers one request. Never fails: every outcome is a response.
    pub async fn handle(&self, req: Request) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if crate::log::http::serves(&path) && route(&path).is_none() {
            return match &self.log {
                Some(log) => log.handle(&req).await,
                None => rejected(reject(StatusCode::NOT_FOUND, "this stack serves no log (DYNAMO_EVENT_TABLE)")),
            };
        }
        if views_first(&path) {
            return match &self.views {
                Some(views) => views.handle(&req).await,
                None => rejected(reject(StatusCode::NOT_FOUND, "this stack serves no views (VIEW_TABLE)")),
            };
        }
        let answer = match (route(&path), req.method().clone()) {
            (Some(Route::List), Method::GET) => self.list(&req).await,
            (Some(Route::List), Method::POST) => self.append_across(&req).await,
            (Some(Route::Stream(name)), Method::POST) => self.append(&req, name, &path).await,
            (Some(Route::Stream(name)), Method::GET) => self.read(&req, name, &path).await,
            (Some(Route::Stream(name)), Method::DELETE) => self.delete(&req, name, &path).await,
            (Some(Route::State(name)), Method::GET) => self.state(&req, name).await,
            (Some(Route::Snapshot(name)), Method::PUT) => self.snapshot(&req, name).await,
            (Some(Route::Metadata(name)), Method::GET) => Ok(self.metadata(name).await),
            (Some(Route::Metadata(name)), Method::PUT) => self.set_metadata(&req, name).await,
            (Some(_), _) => Err(reject(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")),
            (None, _) => Err(reject(StatusCode::NOT_FOUND, "not found")),
        };
        answer.unwrap_or_else(rejected)
    }

    async fn append(&self, req: &Request, name: &str, path: &str) -> Result<Response<Body>, Reject> {
        let expected = expected(req.headers())?;
        check_json_content_type(req)?;
        let body = req.body().as_ref();
        if body.is_empty() {
            return Err(reject(StatusCode::BAD_REQUEST, "empty body: send an event or an array of events"));
        }
        let events = match super::model::parse_events(body) {
            Ok(events) => traced(events, req),
            Err(err) => return Ok(failure(err.into())),
        };
        Ok(match self.store.append(name, expected, events).await {
            Ok(done) => created(done, path, name),
            Err(err) => failure(err),
        })
    }

    async fn append_across(&self, req: &Request) -> Result<Response<Body>, Reject> {
        check_json_content_type(req)?;
        let (mut appends, conditions) = match super::across::parse_across(req.body().as_ref()) {
            Ok(parsed) => parsed,
            Err(err) => return Ok(failure(err.into())),
        };
        for append in &mut appends {
            append.events = traced(std::mem::take(&mut append.events), req);
        }
        let streams: Vec<String> = appends.iter().map(|a| a.stream.clone()).collect();
        Ok(match self.store.append_across(appends, conditions).await {
            Ok(done) => {
                let appended: Vec<Value> = streams
                    .iter()
                    .zip(&done)
                    .map(|(stream, d)| json!({"stream": stream, "first": d.first, "last": d.last}))
                    .collect();
                info!(
                    streams = streams.len(),
                    replayed = done.iter().any(|d| d.replayed),
                    "append across streams answered"
                );
                json_response(StatusCode::CREATED, &json!({"appends": appended}))
            }
            Err(err) => failure(err),
        })
    }

    async fn list(&self, req: &Request) -> Result<Response<Body>, Reject> {
        let query = req.query_string_parameters();
        let limit = match query.first("limit") {
            None => super::listing::MAX_LISTED,
            Some(limit) => limit.parse().map_err(|_| reject(StatusCode::BAD_REQUEST, "limit must be a number"))?,
        };
        let (prefix, after) = (query.first("prefix").unwrap_or_default(), query.first("after"));
        Ok(match self.store.list_streams(prefix, after, limit).await {
            Ok(listing) => json_response(StatusCode::OK, &json!(listing)),
            Err(err) => failure(err),
        })
    }

    async fn delete(&self, req: &Request, name: &str, path: &str) -> Result<Response<Body>, Reject> {
        let version = required_version(req.headers(), "DELETE")?;
        Ok(match self.store.delete(name, version).await {
            Ok(done) => created(done, path, name),
            Err(err) => failure(err),
        })
    }

    async fn read(&self, req: &Request, name: &str, path: &str) -> Result<Response<Body>, Reject> {
        let query = req.query_string_parameters();
        let number = |key: &str| -> Result<Option<u64>, Reject> {
            query
                .first(key)
                .map(|v| {
                    v.parse::<u64>().map_err(|_| reject(StatusCode::BAD_REQUEST, format!("{key} must be a number")))
                })
                .transpose()
        };
        let from = number("from")?;
        let limit = number("limit")?.map_or(DEFAULT_PAGE_EVENTS as u64, |l| l);
        if limit == 0 || limit > MAX_PAGE_EVENTS as u64 {
            return Err(reject(StatusCode::BAD_REQUEST, format!("limit is 1 to {MAX_PAGE_EVENTS}")));
        }
        let direction = match query.first("direction").unwrap_or("forward") {
            "forward" => Direction::Forward,
            "backward" => Direction::Backward,
            _ => return Err(reject(StatusCode::BAD_REQUEST, "direction is forward or backward")),
        };
        if let Some(seen) = not_modified_since(req.headers()) {
            match self.store.tip(name).await {
                // With metadata (max_age, a change of it) the answer can change at the same version.
                Ok(Some(tip)) if tip.version == seen && tip.meta_version.is_none() => return Ok(not_modified(seen)),
                Ok(_) => {}
                Err(err) => return Ok(failure(err.into())),
            }
        }
        let page = match self.store.read(name, from, limit as usize, direction).await {
            Ok(page) => page,
            Err(err) => return Ok(failure(err)),
        };
        let direction_text = if direction == Direction::Forward { "forward" } else { "backward" };
        let next = page.next.map(|from| format!("{path}?from={from}&limit={limit}&direction={direction_text}"));
        let body = json!({
            "stream": name,
            "version": page.version,
            "deleted": page.deleted,
            "events": page.events,
            "next": next,
        });
        Ok(with_etag(json_response(StatusCode::OK, &body), page.version))
    }

    async fn state(&self, req: &Request, name: &str) -> Result<Response<Body>, Reject> {
        let state = match self.store.state(name).await {
            Ok(state) => state,
            Err(err) => return Ok(failure(err)),
        };
        if not_modified_since(req.headers()) == Some(state.version) && state.metadata_version == 0 {
            return Ok(not_modified(state.version));
        }
        let snapshot = state.snapshot.as_ref().map(|s| json!({"version": s.version, "state": s.state}));
        let body = json!({
            "stream": name,
            "version": state.version,
            "deleted": state.deleted,
            "snapshot": snapshot,
            "events": state.events,
        });
        Ok(with_etag(json_response(StatusCode::OK, &body), state.version))
    }

    async fn snapshot(&self, req: &Request, name: &str) -> Result<Response<Body>, Reject> {
        let version = required_version(req.headers(), "a snapshot")?;
        check_json_content_type(req)?;
        let text = body_text(req)?.ok_or_else(|| reject(StatusCode::BAD_REQUEST, "empty body: send the state"))?;
        let state: Value = serde_json::from_str(&text).map_err(|e| {
            reject(StatusCode::BAD_REQUEST, format!("malformed JSON at line {} column {}", e.line(), e.column()))
        })?;
        Ok(match self.store.save_snapshot(name, version, &state).await {
            Ok(()) => json_response(StatusCode::OK, &json!({"stream": name, "snapshot_version": version})),
            Err(err) => failure(err),
        })
    }

    async fn metadata(&self, name: &str) -> Response<Body> {
        match self.store.metadata(name).await {
            Ok((version, metadata)) => {
                let body = json!({"stream": name, "metadata_version": version, "metadata": metadata});
                with_etag(json_response(StatusCode::OK, &body), version)
            }
            Err(err) => failure(err),
        }
    }

    async fn set_metadata(&self, req: &Request, name: &str) -> Result<Response<Body>, Reject> {
        let expected = header_text(req.headers(), header::IF_MATCH)?.map(parse_version).transpose()?;
        check_json_content_type(req)?;
        let text = body_text(req)?.ok_or_else(|| reject(StatusCode::BAD_REQUEST, "empty body: send the metadata"))?;
        let metadata: super::StreamMetadata =
            serde_json::from_str(&text).map_err(|e| reject(StatusCode::BAD_REQUEST, format!("metadata: {e}")))?;
        Ok(match self.store.set_metadata(name, expected, &metadata).await {
            Ok(version) => {
                let body = json!({"stream": name, "metadata_version": version});
                with_etag(json_response(StatusCode::OK, &body), version)
            }
            Err(err) => failure(err),
        })
    }
}

fn created(done: super::Appended, path: &str, name: &str) -> Response<Body> {
    info!(stream = name, first = done.first, last = done.last, replayed = done.replayed, "append answered");
    let versions: Vec<u64> = (done.first..=done.last).collect();
    let body = json!({"stream": name, "first": done.first, "last": done.last, "versions": versions});
    let mut response = with_etag(json_response(StatusCode::CREATED, &body), done.last);
    if let Ok(location) = header::HeaderValue::from_str(&format!("{path}?from={}", done.first)) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

#[cfg(test)]
mod tests {
    use lambda_http::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn routes_behind_any_base_path() {
        assert!(matches!(route("/streams/todo-1"), Some(Route::Stream("todo-1"))));
        assert!(matches!(route("/prod/streams/todo-1/state"), Some(Route::State("todo-1"))));
        assert!(matches!(route("/streams/todo-1/snapshot"), Some(Route::Snapshot("todo-1"))));
        assert!(matches!(route("/streams/todo-1/metadata"), Some(Route::Metadata("todo-1"))));
        assert!(matches!(route("/streams"), Some(Route::List)) && matches!(route("/prod/streams"), Some(Route::List)));
        assert!(route("/streams/a/b/c").is_none());
        assert!(route("/track.gif").is_none());
        assert!(StreamsApi::serves("/streams/x") && !StreamsApi::serves("/events"));
        assert!(views_first("/views/pages/day/x//streams/foo"), "a view's key may hold streams/");
        assert!(views_first("/prod/views/t/k") && !views_first("/streams/views"));
    }

    #[test]
    fn preconditions() {
        assert_eq!(expected(&headers(&[])).unwrap(), Expected::Any);
        assert_eq!(expected(&headers(&[(header::IF_NONE_MATCH, "*")])).unwrap(), Expected::NoStream);
        assert_eq!(expected(&headers(&[(header::IF_MATCH, "\"7\"")])).unwrap(), Expected::Version(7));
        assert_eq!(expected(&headers(&[(header::IF_MATCH, "7")])).unwrap(), Expected::Version(7));
        for bad in ["\"x\"", "W/\"1\"", "*", "\"\"", "-1", "\"99999999999999999999999\""] {
            let err = expected(&headers(&[(header::IF_MATCH, bad)])).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        let both = headers(&[(header::IF_MATCH, "\"1\""), (header::IF_NONE_MATCH, "*")]);
        assert_eq!(expected(&both).unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(
            expected(&headers(&[(header::IF_NONE_MATCH, "\"3\"")])).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(required_version(&headers(&[]), "DELETE").unwrap_err().status, StatusCode::PRECONDITION_REQUIRED);
        assert_eq!(not_modified_since(&headers(&[(header::IF_NONE_MATCH, "\"4\"")])), Some(4));
        assert_eq!(not_modified_since(&headers(&[(header::IF_NONE_MATCH, "*")])), None);
    }

    #[test]
    fn store_errors_map_to_statuses_and_etags() {
        let conflict = failure(EntityError::Conflict { current: 5 });
        assert_eq!(conflict.status(), StatusCode::CONFLICT);
        assert_eq!(conflict.headers()[header::ETAG], "\"5\"");
        assert_eq!(failure(EntityError::NotFound).status(), StatusCode::NOT_FOUND);
        let stale = failure(EntityError::MetadataConflict { current: 3 });
        assert_eq!((stale.status(), &stale.headers()[header::ETAG]), (StatusCode::CONFLICT, &"\"3\"".parse().unwrap()));
        assert_eq!(failure(EntityError::Deleted { current: 2 }).status(), StatusCode::GONE);
        assert_eq!(failure(Invalid::TooLarge("x".into()).into()).status(), StatusCode::PAYLOAD_TOO_LARGE);
        let store = failure(crate::Error::Malformed("boom".into()).into());
        assert_eq!(store.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(!String::from_utf8_lossy(store.body().as_ref()).contains("boom"), "no internal detail leaks");
    }
}
