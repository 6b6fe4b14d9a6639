//! `load`: the HTTP front door. `GET /track.gif` answers the pixel and puts
//! one event; `POST /events` puts up to 500 posted events with `PutRecords`,
//! each `EntityId`'s events in the order posted (`kinesis::put_in_key_order`).
//! Every answer is deliberate: bad input gets a short 4xx; events the stream
//! refused get a 429 (a shard over its limits) or a 503, with `Retry-After`,
//! naming each event not stored; no internal error text reaches the client.
//! A client that sends its own `EventId` may retry freely: every copy gets
//! the same envelope id, and the pump keeps the first (`crate::pump`).

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use lambda_http::http::{header, Method, StatusCode};
use lambda_http::request::RequestContext;
use lambda_http::{Body, Request, RequestExt, Response};
use serde_json::{json, Value};
use tracing::{debug, error, info, warn};

use crate::archive::object::Bucket;
use crate::batch::Backoff;
use crate::config::{LoadConfig, MAX_EVENT_BYTES_LIMIT};
use crate::envelope::{client_envelope_id, client_event_id, client_ip, Envelope, Headers, EVENT_ID};
use crate::error::Error;
use crate::http::{body_text, check_json_content_type, json_response, Reject};
use crate::kinesis::{put_in_key_order, send_put_records, OutgoingRecord, NOT_SENT};
use crate::offload::Offloads;
use crate::privacy::Subjects;
use crate::time::{format_ms, now_ms};
use crate::trace::TraceContext;

/// Subjects' keys fetched at once for one request (each is a key-table read, and for a new subject
/// a KMS request and two writes).
const KEYS_AT_ONCE: usize = 16;

/// A transparent 1x1 GIF, 43 bytes.
pub const PIXEL: [u8; 43] = [
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff,
    0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x02,
    0x02, 0x44, 0x01, 0x00, 0x3b,
];

pub use crate::config::MAX_EVENTS_PER_POST;

/// The tracker script (clients/web, built by `make web`), served at its versioned name: a new
/// version is a new path, so a browser or a CDN may keep each one for a year.
pub const TRACKER_SCRIPT: &str = "et-1.0.2.js";
const TRACKER: &str = include_str!("../../../clients/web/dist/et-1.0.2.js");

enum Route {
    Pixel,
    Events,
    Script,
}

/// Routes on the last path segment so the same handler works behind any API
/// Gateway stage or base path, a function URL, or the local server. Paths
/// under `/streams/` are the entity streams' (their events' `path` in the
/// log), never ingest's: a filter on `/path` selects one stream exactly.
fn route(path: &str) -> Option<Route> {
    if path.starts_with("/streams/") {
        return None;
    }
    match path.rsplit('/').next() {
        Some("track.gif") => Some(Route::Pixel),
        Some("events") => Some(Route::Events),
        Some(TRACKER_SCRIPT) => Some(Route::Script),
        _ => None,
    }
}

/// The AWS actions this stage calls, and so the only ones its IAM role
/// grants (tests check the code against this list, and the template against it).
pub const AWS_ACTIONS: &[&str] = &[
    "kinesis:PutRecord",
    "kinesis:PutRecords",
    "s3:PutObject",
    // Subjects' keys: read and unwrapped; a new one is asked of the keys function.
    "dynamodb:GetItem",
    "kms:Decrypt",
    "lambda:InvokeFunction",
];

pub struct Load {
    kinesis: aws_sdk_kinesis::Client,
    config: LoadConfig,
    backoff: Backoff,
    offloads: Option<Offloads>,
    subjects: Option<Subjects>,
}

impl Load {
    pub fn new(kinesis: aws_sdk_kinesis::Client, config: LoadConfig) -> Self {
        // Short: API Gateway gives up after 30 s, and a client retry would duplicate.
        let backoff = Backoff { base: Duration::from_millis(50), cap: Duration::from_millis(500), max_attempts: 4 };
        Self { kinesis, config, backoff, offloads: None, subjects: None }
    }

    /// Offloads events larger than `INLINE_MAX_BYTES` into `bucket` (the one `ARCHIVE_BUCKET` names).
    pub fn with_archive(mut self, bucket: Option<Bucket>) -> Self {
        self.offloads = bucket.map(|bucket| Offloads { bucket, inline_max: self.config.inline_max_bytes });
        self
    }

    /// Seals the personal parts of events with a subject ([`crate::privacy`]).
    pub fn with_subjects(mut self, subjects: Option<Subjects>) -> Self {
        self.subjects = subjects;
        self
    }

    /// Answers one HTTP request. Never fails: every outcome is a response.
    pub async fn handle(&self, req: Request) -> Response<Body> {
        let method = req.method().clone();
        let answer = match (route(req.uri().path()), &method) {
            (Some(Route::Pixel), &Method::GET | &Method::POST) => self.pixel(&req).await,
            (Some(Route::Events), &Method::POST) => self.events(&req).await,
            (Some(Route::Script), &Method::GET) => Ok(script()),
            (Some(_), _) => Err(Reject::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")),
            (None, _) => Err(Reject::new(StatusCode::NOT_FOUND, "not found")),
        };
        answer.unwrap_or_else(|reject| {
            debug!(status = reject.status.as_u16(), message = %reject.message, "request rejected");
            json_response(reject.status, &json!({ "error": reject.message }))
        })
    }

    async fn pixel(&self, req: &Request) -> Result<Response<Body>, Reject> {
        // A POSTed pixel keeps its body: JSON when it parses, else the text.
        let body = body_text(req)?.map(|text| serde_json::from_str(&text).unwrap_or(Value::String(text)));
        let (envelope, record) = self.event(req, body).await?;
        log_traces(req, [&envelope]);
        let out = self
            .kinesis
            .put_record()
            .stream_name(&self.config.event_stream)
            .partition_key(&record.partition_key)
            .data(Blob::new(record.data))
            .send()
            .await
            .map_err(|e| {
                let throttled = e.as_service_error().is_some_and(|s| s.is_provisioned_throughput_exceeded_exception());
                refused(throttled, Error::kinesis("PutRecord", e))
            })?;
        debug!(id = %envelope.id, sequence_number = out.sequence_number(), "pixel event put");
        Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "image/gif")
            .header(header::CACHE_CONTROL, "no-cache, no-store, must-revalidate")
            .header("X-Sequence-Number", out.sequence_number())
            .body(Body::Binary(PIXEL.to_vec()))
            .map_err(|e| internal(e.to_string()))
    }

    async fn events(&self, req: &Request) -> Result<Response<Body>, Reject> {
        check_json_content_type(req)?;
        if req.query_string_parameters().first(EVENT_ID).is_some() {
            // One id in the query would name every posted event the same: all but one dropped as copies.
            return Err(Reject::new(
                StatusCode::BAD_REQUEST,
                "send each event's EventId in the event, not in the query",
            ));
        }
        let text = body_text(req)?.ok_or_else(|| Reject::new(StatusCode::BAD_REQUEST, "empty body"))?;
        let events = parse_posted_events(&text, self.config.max_events_per_post)?;
        self.warm_keys(req, &events).await?;
        let (mut envelopes, mut records) = (Vec::with_capacity(events.len()), Vec::with_capacity(events.len()));
        for (index, event) in events.into_iter().enumerate() {
            let (envelope, record) = self
                .event(req, Some(event))
                .await
                .map_err(|r| Reject::new(r.status, format!("event {index}: {}", r.message)))?;
            envelopes.push(envelope);
            records.push(record);
        }
        log_traces(req, &envelopes);
        let stream = self.config.event_stream.as_str();
        // Per EntityId, in the order posted: a throttled "created" is never stored after its "paid".
        // An ambiguous failure is retried as not stored: a copy has the same envelope id, which readers drop.
        let failures = put_in_key_order(
            &records,
            &self.backoff,
            |batch| async move { send_put_records(&self.kinesis, stream, &batch).await },
            |batch| async move { Ok(vec![false; batch.len()]) },
        )
        .await
        .failures;
        let accepted = records.len() - failures.len();
        info!(accepted, failed = failures.len(), "events put");
        if failures.is_empty() {
            return Ok(json_response(StatusCode::ACCEPTED, &json!({ "accepted": accepted })));
        }
        warn!(failed = failures.len(), code = %failures[0].code, "some events could not be put");
        // The client learns which events to send again (by index, and by its own id where it gave one).
        let failed: Vec<Value> = failures
            .iter()
            .map(|f| match envelopes.get(f.index).and_then(|e| e.event_id.as_deref()) {
                Some(id) => json!({ "index": f.index, EVENT_ID: id, "error": f.code }),
                None => json!({ "index": f.index, "error": f.code }),
            })
            .collect();
        // Events held back behind a refused one of their EntityId (NotSent) say nothing of why.
        let throttled = failures
            .iter()
            .filter(|f| f.code != NOT_SENT)
            .all(|f| f.code == THROTTLED || f.code.starts_with("RequestThrottled"));
        let status = if throttled { StatusCode::TOO_MANY_REQUESTS } else { StatusCode::SERVICE_UNAVAILABLE };
        Ok(json_response(status, &json!({ "accepted": accepted, "failed": failed })))
    }

    /// Fetches (or makes) the keys of the posted events' subjects, several
    /// at once, so that sealing them one by one finds each cached.
    async fn warm_keys(&self, req: &Request, events: &[Value]) -> Result<(), Reject> {
        use futures::StreamExt;
        let Some(subjects) = &self.subjects else { return Ok(()) };
        let query =
            |name: &str| req.query_string_parameters().all(name).map(|v| v.into_iter().map(str::to_owned).collect());
        let mut from_query = BTreeMap::new();
        for name in [crate::envelope::ENTITY_ID] {
            if let Some(values) = query(name) {
                from_query.insert(name.to_owned(), values);
            }
        }
        if let crate::privacy::SubjectRule::Query(name) = &subjects.rule {
            if let Some(values) = query(name) {
                from_query.insert(name.clone(), values);
            }
        }
        let ids: std::collections::BTreeSet<String> =
            events.iter().filter_map(|e| subjects.rule.subject(&from_query, Some(e))).collect();
        let fetched: Vec<_> = futures::stream::iter(ids)
            .map(|id| async move { subjects.warm(&id).await })
            .buffer_unordered(KEYS_AT_ONCE)
            .collect()
            .await;
        fetched.into_iter().collect::<Result<(), _>>().map_err(unavailable)
    }

    /// The envelope of one event and its record: the client's `EventId`
    /// and `EntityId` checked, the envelope id made from them when there is
    /// an `EventId`, the size within `MAX_EVENT_BYTES`, the personal parts
    /// sealed when it has a subject (its partition key hashed when that is
    /// the subject's id), and a body or sealed block that makes it larger
    /// than `INLINE_MAX_BYTES` offloaded to S3.
    async fn event(&self, req: &Request, mut body: Option<Value>) -> Result<(Envelope, OutgoingRecord), Reject> {
        let header_text =
            |name: header::HeaderName| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let mut query: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (key, value) in req.query_string_parameters().iter() {
            query.entry(key.to_owned()).or_default().push(value.to_owned());
        }
        let event_id = client_event_id(&query, body.as_ref()).map_err(bad_input)?;
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let trace = TraceContext::take(&mut query, body.as_mut(), header);
        let mut envelope = Envelope {
            id: uuid::Uuid::new_v4().to_string(),
            event_id,
            received_at: format_ms(now_ms()),
            method: req.method().to_string(),
            path: req.uri().path().to_owned(),
            query,
            headers: Headers {
                user_agent: header_text(header::USER_AGENT),
                referer: header_text(header::REFERER),
                accept_language: header_text(header::ACCEPT_LANGUAGE),
            },
            source_ip: client_ip(source_ip(req).as_deref(), &self.config.ip_mode),
            body,
            body_ref: None,
            subject: None,
            sealed: None,
            sealed_ref: None,
            trace,
        };
        let mut partition_key = envelope.partition_key().map_err(bad_input)?;
        let subject = self.subjects.as_ref().and_then(|subjects| {
            let id = subjects.rule.subject(&envelope.query, envelope.body.as_ref())?;
            Some((subjects, id))
        });
        if let Some((subjects, id)) = &subject {
            if *id == partition_key {
                // The key stays in the clear (order, routing): as the subject's hash, not its id.
                partition_key = subjects.hash(id);
            }
        }
        if let Some(event_id) = &envelope.event_id {
            envelope.id = client_envelope_id(&partition_key, event_id);
        }
        let mut data = serde_json::to_vec(&envelope).map_err(|e| internal(e.to_string()))?;
        if data.len() > self.config.max_event_bytes && envelope.trace.take().is_some() {
            // A context the client's tooling added never costs the event: the context goes, the event stays.
            warn!(id = %envelope.id, bytes = data.len(), "trace context dropped: the event is over its limit with it");
            data = serde_json::to_vec(&envelope).map_err(|e| internal(e.to_string()))?;
        }
        if data.len() > self.config.max_event_bytes {
            return Err(Reject::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("event is {} bytes; the limit is {}", data.len(), self.config.max_event_bytes),
            ));
        }
        if let Some((subjects, id)) = subject {
            let sealer = subjects.sealer(&id).await.map_err(unavailable)?;
            sealer.seal_envelope(&mut envelope).map_err(|e| internal(e.to_string()))?;
            data = serde_json::to_vec(&envelope).map_err(|e| internal(e.to_string()))?;
            if self.offloads.is_none() && data.len() > MAX_EVENT_BYTES_LIMIT {
                return Err(Reject::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("sealed, the event is {} bytes; the limit is {MAX_EVENT_BYTES_LIMIT}", data.len()),
                ));
            }
        }
        if let Some(offloads) = self.offloads.as_ref().filter(|p| data.len() > p.inline_max) {
            let content = match (&envelope.body, &envelope.sealed) {
                (Some(body), _) => serde_json::to_vec(body),
                (None, Some(sealed)) => serde_json::to_vec(sealed),
                (None, None) => return Ok((envelope, OutgoingRecord { partition_key, data })),
            }
            .map_err(|e| internal(e.to_string()))?;
            let stored = offloads.store(content).await.map_err(unavailable)?;
            debug!(id = %envelope.id, payload = %stored.location(), bytes = stored.bytes, "payload offloaded");
            if envelope.body.take().is_some() {
                envelope.body_ref = Some(stored);
            } else {
                envelope.sealed = None;
                envelope.sealed_ref = Some(stored);
            }
            data = serde_json::to_vec(&envelope).map_err(|e| internal(e.to_string()))?;
        }
        Ok((envelope, OutgoingRecord { partition_key, data }))
    }
}

/// A store the event needs (S3 for its payload, the key table or KMS for its subject's key) failed.
fn unavailable(err: Error) -> Reject {
    error!(error = %err, "event store unavailable");
    Reject::new(StatusCode::SERVICE_UNAVAILABLE, "event store unavailable, retry later")
}

fn bad_input(err: Error) -> Reject {
    match err {
        Error::BadInput(message) => Reject::new(StatusCode::BAD_REQUEST, message),
        other => internal(other.to_string()),
    }
}

/// The client address: from the API Gateway request context, else the first
/// `X-Forwarded-For` entry.
fn source_ip(req: &Request) -> Option<String> {
    let from_context = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV1(ctx)) => ctx.identity.source_ip.clone(),
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.http.source_ip.clone(),
        _ => None,
    };
    from_context.or_else(|| {
        let forwarded = req.headers().get("x-forwarded-for")?.to_str().ok()?;
        forwarded.split(',').next().map(|ip| ip.trim().to_owned())
    })
}

/// One JSON object, or an array of 1 to `max` objects.
pub(crate) fn parse_posted_events(text: &str, max: usize) -> Result<Vec<Value>, Reject> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        Reject::new(StatusCode::BAD_REQUEST, format!("malformed JSON at line {} column {}", e.line(), e.column()))
    })?;
    let events = match value {
        Value::Object(_) => vec![value],
        Value::Array(items) => items,
        _ => return Err(Reject::new(StatusCode::BAD_REQUEST, "expected a JSON object or an array of objects")),
    };
    if events.is_empty() {
        return Err(Reject::new(StatusCode::BAD_REQUEST, "no events in the array"));
    }
    if events.len() > max {
        return Err(Reject::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("{} events; at most {max} per request", events.len()),
        ));
    }
    if let Some(i) = events.iter().position(|e| !e.is_object()) {
        return Err(Reject::new(StatusCode::BAD_REQUEST, format!("event {i} is not a JSON object")));
    }
    Ok(events)
}

/// Kinesis' answer for a record over its shard's limits.
const THROTTLED: &str = "ProvisionedThroughputExceededException";

/// A put the event stream refused: 429 when its shard was over its limits, else 503.
fn refused(throttled: bool, err: Error) -> Reject {
    if throttled {
        warn!(error = %err, "event stream shard over its limits");
        return Reject::new(StatusCode::TOO_MANY_REQUESTS, "event stream busy, retry later");
    }
    error!(error = %err, "event stream unavailable");
    Reject::new(StatusCode::SERVICE_UNAVAILABLE, "event stream unavailable, retry later")
}

fn internal(detail: String) -> Reject {
    error!(error = %detail, "internal error");
    Reject::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
}

/// The tracker script: no event, cached for a year (its path names its version), readable by any
/// page (`crossorigin` and Subresource Integrity need the CORS header on the script itself; API
/// Gateway's own CORS settings take its place there).
fn script() -> Response<Body> {
    let built = Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/javascript; charset=utf-8")
        .header(header::CACHE_CONTROL, "public, max-age=31536000, immutable")
        .header(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")
        .body(Body::Text(TRACKER.to_owned()));
    built.unwrap_or_else(|_| json_response(StatusCode::INTERNAL_SERVER_ERROR, &json!({"error": "script unavailable"})))
}

/// The request's clients' traces beside this invocation's X-Ray trace, in one line: what links the
/// two (once a request, however many of its events share a trace).
fn log_traces<'a>(req: &Request, envelopes: impl IntoIterator<Item = &'a Envelope>) {
    let ids: std::collections::BTreeSet<&str> =
        envelopes.into_iter().filter_map(|e| e.trace.as_ref()).map(TraceContext::trace_id).collect();
    if !ids.is_empty() {
        let xray = req.lambda_context_ref().and_then(|c| c.xray_trace_id.as_deref()).unwrap_or("-");
        let trace_ids = ids.into_iter().collect::<Vec<_>>().join(",");
        info!(trace_ids, xray_trace_id = xray, "events traced");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixel_is_a_43_byte_gif() {
        assert_eq!(PIXEL.len(), 43);
        assert_eq!(&PIXEL[..6], b"GIF89a");
        assert_eq!(PIXEL[42], 0x3b);
    }

    #[test]
    fn routes_on_the_last_segment() {
        assert!(matches!(route("/track.gif"), Some(Route::Pixel)));
        assert!(matches!(route("/Prod/track.gif"), Some(Route::Pixel)));
        assert!(matches!(route("/events"), Some(Route::Events)));
        assert!(route("/").is_none() && route("/track.png").is_none());
        assert!(route("/streams/events").is_none() && route("/streams/track.gif").is_none(), "the entity namespace");
        assert!(matches!(route("/prod/et-1.0.2.js"), Some(Route::Script)) && route("/et-1.0.1.js").is_none());
    }

    #[test]
    fn the_tracker_script_is_served_for_a_year_to_any_page() {
        let answer = script();
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()[header::CACHE_CONTROL], "public, max-age=31536000, immutable");
        assert_eq!(answer.headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(answer.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        let Body::Text(text) = answer.body() else { panic!("a text body") };
        assert!(text.starts_with("\"use strict\"") && text.contains("es:queue"), "the built tracker");
    }

    #[test]
    fn events_parse_as_object_or_bounded_array() {
        let parse_posted_events = |text: &str| parse_posted_events(text, MAX_EVENTS_PER_POST);
        assert_eq!(parse_posted_events(r#"{"a":1}"#).unwrap().len(), 1);
        assert_eq!(parse_posted_events(r#"[{"a":1},{"b":2}]"#).unwrap().len(), 2);
        assert_eq!(parse_posted_events("{oops").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(parse_posted_events("[]").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(parse_posted_events("[1]").unwrap_err().status, StatusCode::BAD_REQUEST);
        assert_eq!(parse_posted_events("\"x\"").unwrap_err().status, StatusCode::BAD_REQUEST);
        let many = format!("[{}]", vec!["{}"; 501].join(","));
        assert_eq!(parse_posted_events(&many).unwrap_err().status, StatusCode::PAYLOAD_TOO_LARGE);
        let max = format!("[{}]", vec!["{}"; 500].join(","));
        assert_eq!(parse_posted_events(&max).unwrap().len(), 500);
    }
}
