//! A fault-injecting HTTP proxy for tests and the benchmark: it sits between
//! the code under test and the emulator and, at a configured rate, answers
//! with the errors DynamoDB and Kinesis really return (throttling, 500, 503,
//! part of a `BatchWriteItem` unprocessed, part of a `PutRecords` failed),
//! resets connections or answers slowly. The choice of faults is a seeded
//! random sequence: the same seed and the same order of requests give the
//! same faults.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue, CONTENT_LENGTH, CONTENT_TYPE, HOST, TRANSFER_ENCODING};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The faults the proxy can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// 400 `ProvisionedThroughputExceededException`, request not applied.
    ProvisionedThroughputExceeded,
    /// 400 `ThrottlingException`, request not applied.
    Throttling,
    /// 400 `RequestLimitExceeded` (DynamoDB), request not applied.
    RequestLimitExceeded,
    /// 500 internal error, request not applied.
    InternalServerError,
    /// 503, request not applied.
    ServiceUnavailable,
    /// The request *was* applied, then the answer is a 500: DynamoDB writes
    /// (retries must be idempotent) and Kinesis puts (a retry stores the records again).
    AppliedThenInternalError,
    /// `BatchWriteItem`: part of the items left in `UnprocessedItems`.
    PartialBatchWrite,
    /// `PutRecords`: part of the records failed with `ProvisionedThroughputExceededException`.
    PartialPutRecords,
    /// The connection is closed without an answer, request not applied.
    ConnectionReset,
    /// The answer comes 300 ms late.
    Slow,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::ProvisionedThroughputExceeded => "ProvisionedThroughputExceeded",
            Fault::Throttling => "Throttling",
            Fault::RequestLimitExceeded => "RequestLimitExceeded",
            Fault::InternalServerError => "InternalServerError",
            Fault::ServiceUnavailable => "ServiceUnavailable",
            Fault::AppliedThenInternalError => "AppliedThenInternalError",
            Fault::PartialBatchWrite => "PartialBatchWrite",
            Fault::PartialPutRecords => "PartialPutRecords",
            Fault::ConnectionReset => "ConnectionReset",
            Fault::Slow => "Slow",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    DynamoDb,
    Kinesis,
    /// KMS (`TrentService.*`): only [`FaultProxy::disable_kms_keys`] touches it.
    Kms,
    Other,
}

/// The service and operation named by a JSON-protocol request's `X-Amz-Target`.
pub fn target(header: Option<&str>) -> (Service, String) {
    let Some((prefix, operation)) = header.and_then(|h| h.split_once('.')) else {
        return (Service::Other, String::new());
    };
    let service = if prefix.starts_with("DynamoDB") {
        Service::DynamoDb
    } else if prefix.starts_with("Kinesis") {
        Service::Kinesis
    } else if prefix == "TrentService" {
        Service::Kms
    } else {
        Service::Other
    };
    (service, operation.to_owned())
}

/// The faults that make sense for an operation: what AWS can answer to it.
pub fn applicable(service: Service, operation: &str) -> Vec<Fault> {
    use Fault::*;
    let mut faults = match service {
        Service::DynamoDb => vec![
            ProvisionedThroughputExceeded,
            Throttling,
            RequestLimitExceeded,
            InternalServerError,
            ServiceUnavailable,
            AppliedThenInternalError,
        ],
        Service::Kinesis => vec![ProvisionedThroughputExceeded, Throttling, InternalServerError, ServiceUnavailable],
        Service::Kms | Service::Other => return vec![],
    };
    faults.extend([ConnectionReset, Slow]);
    match operation {
        "BatchWriteItem" => faults.push(PartialBatchWrite),
        "PutRecords" => faults.extend([PartialPutRecords, AppliedThenInternalError]),
        "PutRecord" => faults.push(AppliedThenInternalError),
        _ => {}
    }
    faults
}

/// Error answer in the service's JSON protocol.
fn error_answer(service: Service, fault: Fault) -> (StatusCode, Value) {
    let (status, code) = match fault {
        Fault::Throttling => (StatusCode::BAD_REQUEST, "ThrottlingException"),
        Fault::RequestLimitExceeded => (StatusCode::BAD_REQUEST, "RequestLimitExceeded"),
        Fault::InternalServerError | Fault::AppliedThenInternalError => match service {
            Service::Kinesis => (StatusCode::INTERNAL_SERVER_ERROR, "InternalFailure"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError"),
        },
        Fault::ServiceUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        _ => (StatusCode::BAD_REQUEST, "ProvisionedThroughputExceededException"),
    };
    let error_type = match service {
        Service::DynamoDb => format!("com.amazonaws.dynamodb.v20120810#{code}"),
        _ => code.to_owned(),
    };
    (status, json!({ "__type": error_type, "message": format!("injected fault: {}", fault.name()) }))
}

/// Fault rate and seed.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub seed: u64,
    /// Share of requests (0..1) that get a fault.
    pub rate: f64,
    /// Only these faults (where they apply); `None` = every fault that fits the operation.
    pub only: Option<&'static [Fault]>,
}

struct State {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    rate: f64,
    only: Option<&'static [Fault]>,
    rng: Mutex<fastrand::Rng>,
    counts: Mutex<BTreeMap<String, u64>>,
    applied: Mutex<Vec<Applied>>,
    /// Held while a request is upstream, when requests go one at a time.
    one_at_a_time: Option<tokio::sync::Mutex<()>>,
    /// Held while a request is upstream, exclusively by a `TransactWriteItems`,
    /// when transactions go alone.
    transactions_alone: Option<tokio::sync::RwLock<()>>,
    /// Partition keys whose `PutRecords` entries are refused (a hot shard), whatever the rate.
    refused_keys: Mutex<HashSet<String>>,
    /// Every KMS request answered as a disabled key is (moto's own disabled keys still work).
    kms_disabled: std::sync::atomic::AtomicBool,
}

/// A request the proxy let through and then answered with a 500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// `DynamoDB.BatchWriteItem`, `Kinesis.PutRecords`...
    pub operation: String,
    /// The stream or table named in the request.
    pub target: String,
    /// Records (Kinesis) or write requests (DynamoDB batch) in it.
    pub entries: usize,
}

/// How requests share the way upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Any,
    OneAtATime,
    TransactionsAlone,
}

pub struct FaultProxy {
    pub endpoint: String,
    state: Arc<State>,
    stop: watch::Sender<bool>,
}

type Answer = Result<Response<Full<Bytes>>, std::io::Error>;

impl FaultProxy {
    /// Starts the proxy on a free 127.0.0.1 port in front of `upstream` (`http://127.0.0.1:PORT`).
    pub async fn start(upstream: &str, config: Config) -> std::io::Result<Self> {
        Self::launch(upstream, config, Lane::Any).await
    }

    /// A proxy without faults that lets one request at a time through. moto
    /// serves requests on many threads and applies `TransactWriteItems`
    /// without a lock (two concurrent transactions both pass their condition),
    /// where DynamoDB serializes the writes to an item: in front of moto this
    /// gives tests of concurrent writers DynamoDB's isolation. The clients
    /// still race (their reads and writes interleave request by request).
    pub async fn start_one_at_a_time(upstream: &str) -> std::io::Result<Self> {
        Self::launch(upstream, Config { seed: 0, rate: 0.0, only: Some(&[]) }, Lane::OneAtATime).await
    }

    /// A proxy without faults in front of moto where a `TransactWriteItems`
    /// is never upstream at the same time as any other request, and all other
    /// requests go at once. moto applies a transaction on a deep copy of all
    /// its tables kept for the rollback, and a cancelled one (a failed
    /// condition: every `409` of an append) puts that copy back, undoing
    /// whatever other requests wrote meanwhile, acknowledged appends
    /// included. DynamoDB isolates a transaction from other writes; this
    /// gives the local stack the same.
    pub async fn start_transactions_alone(upstream: &str) -> std::io::Result<Self> {
        Self::launch(upstream, Config { seed: 0, rate: 0.0, only: Some(&[]) }, Lane::TransactionsAlone).await
    }

    async fn launch(upstream: &str, config: Config, lane: Lane) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(State {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            rate: config.rate,
            only: config.only,
            rng: Mutex::new(fastrand::Rng::with_seed(config.seed)),
            counts: Mutex::new(BTreeMap::new()),
            applied: Mutex::new(Vec::new()),
            one_at_a_time: (lane == Lane::OneAtATime).then(|| tokio::sync::Mutex::new(())),
            transactions_alone: (lane == Lane::TransactionsAlone).then(|| tokio::sync::RwLock::new(())),
            refused_keys: Mutex::default(),
            kms_disabled: std::sync::atomic::AtomicBool::new(false),
        });
        let (stop, mut stopped) = watch::channel(false);
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let state = shared.clone();
                        tokio::spawn(async move {
                            let service = service_fn(move |req| handle(state.clone(), req));
                            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                        });
                    }
                    _ = stopped.changed() => return,
                }
            }
        });
        Ok(Self { endpoint, state, stop })
    }

    /// Every request applied and then answered with a 500, in order.
    pub fn applied_then_failed(&self) -> Vec<Applied> {
        self.state.applied.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// From now on (until [`Self::accept_partition_key`]) every `PutRecords`
    /// entry with this partition key fails with `ProvisionedThroughputExceededException`,
    /// as a shard kept over its limit by that key would answer; the other entries are stored.
    pub fn refuse_partition_key(&self, key: &str) {
        if let Ok(mut keys) = self.state.refused_keys.lock() {
            keys.insert(key.to_owned());
        }
    }

    pub fn accept_partition_key(&self, key: &str) {
        if let Ok(mut keys) = self.state.refused_keys.lock() {
            keys.remove(key);
        }
    }

    /// From now on (until called with `false`) every KMS request is answered
    /// `DisabledException`, as KMS answers one that uses a disabled key. moto
    /// 5.2 keeps encrypting and decrypting with a key `DisableKey` disabled.
    pub fn disable_kms_keys(&self, disabled: bool) {
        self.state.kms_disabled.store(disabled, std::sync::atomic::Ordering::SeqCst);
    }

    /// Requests seen and faults injected, by kind (`requests`, `faults`, then each fault's name).
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.state.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

impl State {
    fn count(&self, key: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(key.to_owned()).or_default() += 1;
        }
    }

    /// The fault for the next request, if any, and a random number for its details.
    fn draw(&self, faults: &[Fault]) -> (Option<Fault>, u64) {
        let Ok(mut rng) = self.rng.lock() else { return (None, 0) };
        if faults.is_empty() {
            return (None, 0);
        }
        let hit = rng.f64() < self.rate;
        let pick = rng.usize(..faults.len().max(1));
        let detail = rng.u64(..);
        (if hit { faults.get(pick).copied() } else { None }, detail)
    }

    async fn forward(
        &self,
        parts: &hyper::http::request::Parts,
        body: Bytes,
    ) -> Result<(StatusCode, HeaderMap, Bytes), std::io::Error> {
        let path = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let mut request = Request::builder().method(parts.method.clone()).uri(format!("{}{path}", self.upstream));
        for (name, value) in &parts.headers {
            if name != HOST && name != CONTENT_LENGTH {
                request = request.header(name, value);
            }
        }
        let request = request.body(Full::new(body)).map_err(std::io::Error::other)?;
        let _turn = match &self.one_at_a_time {
            Some(lock) => Some(lock.lock().await),
            None => None,
        };
        let transaction =
            parts.headers.get("x-amz-target").is_some_and(|t| t.as_bytes().ends_with(b".TransactWriteItems"));
        let (_alone, _shared) = match &self.transactions_alone {
            Some(lock) if transaction => (Some(lock.write().await), None),
            Some(lock) => (None, Some(lock.read().await)),
            None => (None, None),
        };
        let response = self.client.request(request).await.map_err(std::io::Error::other)?;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
        Ok((parts.status, parts.headers, bytes))
    }
}

fn respond(status: StatusCode, headers: Option<&HeaderMap>, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    if let Some(headers) = headers {
        for (name, value) in headers {
            // The body may have changed: its length and checksum are recomputed or dropped.
            if name != CONTENT_LENGTH && name != TRANSFER_ENCODING && name.as_str() != "x-amz-crc32" {
                response.headers_mut().append(name, value.clone());
            }
        }
    }
    if !response.headers().contains_key(CONTENT_TYPE) {
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/x-amz-json-1.0"));
    }
    response
}

fn json_response(status: StatusCode, headers: Option<&HeaderMap>, value: &Value) -> Response<Full<Bytes>> {
    respond(status, headers, Bytes::from(value.to_string()))
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Answer {
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    let header = parts.headers.get("x-amz-target").and_then(|v| v.to_str().ok());
    let (service, operation) = target(header);
    state.count("requests");
    if service == Service::Kms && state.kms_disabled.load(std::sync::atomic::Ordering::SeqCst) {
        state.count("KmsDisabled");
        let message = "arn:aws:kms:us-east-1:123456789012:key/injected is disabled.";
        return Ok(json_response(
            StatusCode::BAD_REQUEST,
            None,
            &json!({ "__type": "DisabledException", "message": message }),
        ));
    }
    if service == Service::Kinesis && operation == "PutRecords" {
        if let Some(held) = refused_entries(&state, &body) {
            state.count("RefusedKey");
            return partial_put_records(&state, &parts, body, held).await;
        }
    }
    let mut faults = applicable(service, &operation);
    if let Some(only) = state.only {
        faults.retain(|f| only.contains(f));
    }
    let (fault, detail) = state.draw(&faults);
    let Some(fault) = fault else {
        let (status, headers, bytes) = state.forward(&parts, body).await?;
        return Ok(respond(status, Some(&headers), bytes));
    };
    state.count("faults");
    state.count(fault.name());
    match fault {
        Fault::ConnectionReset => Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "injected reset")),
        Fault::Slow => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (status, headers, bytes) = state.forward(&parts, body).await?;
            Ok(respond(status, Some(&headers), bytes))
        }
        Fault::AppliedThenInternalError => {
            let applied = describe(service, &operation, &body);
            state.forward(&parts, body).await?;
            if let Ok(mut log) = state.applied.lock() {
                log.push(applied);
            }
            let (status, value) = error_answer(service, fault);
            Ok(json_response(status, None, &value))
        }
        Fault::PartialBatchWrite => partial_batch_write(&state, &parts, body, detail).await,
        Fault::PartialPutRecords => {
            let entries = describe(service, &operation, &body).entries;
            partial_put_records(&state, &parts, body, held_back(entries, detail)).await
        }
        _ => {
            let (status, value) = error_answer(service, fault);
            Ok(json_response(status, None, &value))
        }
    }
}

/// What an applied request was: its operation, the stream or table it names, its entries.
fn describe(service: Service, operation: &str, body: &Bytes) -> Applied {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let prefix = match service {
        Service::DynamoDb => "DynamoDB",
        Service::Kinesis => "Kinesis",
        Service::Kms => "TrentService",
        Service::Other => "Other",
    };
    let named = |field: &str| request.get(field).and_then(Value::as_str).map(str::to_owned);
    let target = named("StreamName")
        .or_else(|| named("StreamARN"))
        .or_else(|| named("TableName"))
        .or_else(|| request.get("RequestItems").and_then(Value::as_object).and_then(|t| t.keys().next().cloned()))
        .unwrap_or_default();
    let entries = match request.get("Records").and_then(Value::as_array) {
        Some(records) => records.len(),
        None => request
            .get("RequestItems")
            .and_then(Value::as_object)
            .map_or(1, |tables| tables.values().filter_map(Value::as_array).map(Vec::len).sum()),
    };
    Applied { operation: format!("{prefix}.{operation}"), target, entries }
}

/// Which of `n` entries to hold back: a non-empty pseudo-random subset.
fn held_back(n: usize, detail: u64) -> Vec<bool> {
    let mut rng = fastrand::Rng::with_seed(detail);
    let mut held: Vec<bool> = (0..n).map(|_| rng.bool()).collect();
    if n > 0 && !held.contains(&true) {
        held[rng.usize(..n)] = true;
    }
    held
}

async fn partial_batch_write(state: &State, parts: &hyper::http::request::Parts, body: Bytes, detail: u64) -> Answer {
    let mut request: Value = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    let mut unprocessed = serde_json::Map::new();
    if let Some(tables) = request.get_mut("RequestItems").and_then(Value::as_object_mut) {
        for (table, writes) in tables.iter_mut() {
            let Some(list) = writes.as_array_mut() else { continue };
            let held = held_back(list.len(), detail);
            let (kept, dropped): (Vec<_>, Vec<_>) = list.drain(..).zip(held).partition(|(_, h)| !h);
            *list = kept.into_iter().map(|(w, _)| w).collect();
            unprocessed.insert(table.clone(), Value::Array(dropped.into_iter().map(|(w, _)| w).collect()));
        }
        tables.retain(|_, writes| writes.as_array().is_some_and(|l| !l.is_empty()));
    }
    let nothing_left = request["RequestItems"].as_object().is_none_or(|t| t.is_empty());
    let (status, headers, mut answer) = if nothing_left {
        (StatusCode::OK, None, json!({}))
    } else {
        let (status, headers, bytes) = state.forward(parts, Bytes::from(request.to_string())).await?;
        (status, Some(headers), serde_json::from_slice(&bytes).map_err(std::io::Error::other)?)
    };
    if status != StatusCode::OK {
        return Ok(json_response(status, headers.as_ref(), &answer));
    }
    let merged = answer.as_object_mut().map(|a| a.entry("UnprocessedItems").or_insert_with(|| json!({})));
    if let Some(Value::Object(merged)) = merged {
        for (table, writes) in unprocessed {
            let entry = merged.entry(table).or_insert_with(|| json!([]));
            if let (Some(list), Value::Array(more)) = (entry.as_array_mut(), writes) {
                list.extend(more);
            }
        }
    }
    Ok(json_response(StatusCode::OK, headers.as_ref(), &answer))
}

/// Which entries of a `PutRecords` request name a refused partition key; `None` when none do.
fn refused_entries(state: &State, body: &Bytes) -> Option<Vec<bool>> {
    let keys = state.refused_keys.lock().ok()?;
    if keys.is_empty() {
        return None;
    }
    let request: Value = serde_json::from_slice(body).ok()?;
    let held: Vec<bool> = request
        .get("Records")?
        .as_array()?
        .iter()
        .map(|r| r.get("PartitionKey").and_then(Value::as_str).is_some_and(|k| keys.contains(k)))
        .collect();
    held.contains(&true).then_some(held)
}

/// Forwards the entries not `held` and answers for all of them, the held ones failed.
async fn partial_put_records(
    state: &State,
    parts: &hyper::http::request::Parts,
    body: Bytes,
    held: Vec<bool>,
) -> Answer {
    let mut request: Value = serde_json::from_slice(&body).map_err(std::io::Error::other)?;
    let records = request.get_mut("Records").and_then(Value::as_array_mut).map(std::mem::take).unwrap_or_default();
    let sent: Vec<Value> = records.iter().zip(&held).filter(|(_, h)| !**h).map(|(r, _)| r.clone()).collect();
    let mut results: Vec<Value> = Vec::new();
    let mut headers = None;
    if !sent.is_empty() {
        request["Records"] = Value::Array(sent);
        let (status, upstream_headers, bytes) = state.forward(parts, Bytes::from(request.to_string())).await?;
        let answer: Value = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
        if status != StatusCode::OK {
            return Ok(json_response(status, Some(&upstream_headers), &answer));
        }
        results = answer["Records"].as_array().cloned().unwrap_or_default();
        headers = Some(upstream_headers);
    }
    let mut upstream = results.into_iter();
    let mut failed = 0;
    let merged: Vec<Value> = held
        .iter()
        .map(|&h| {
            if h {
                failed += 1;
                json!({"ErrorCode": "ProvisionedThroughputExceededException", "ErrorMessage": "injected: rate exceeded for shard"})
            } else {
                let result = upstream.next().unwrap_or_else(|| json!({"ErrorCode": "InternalFailure", "ErrorMessage": "missing"}));
                if result.get("ErrorCode").is_some() {
                    failed += 1;
                }
                result
            }
        })
        .collect();
    Ok(json_response(StatusCode::OK, headers.as_ref(), &json!({ "FailedRecordCount": failed, "Records": merged })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_service_and_operation() {
        assert_eq!(target(Some("DynamoDB_20120810.BatchWriteItem")), (Service::DynamoDb, "BatchWriteItem".into()));
        assert_eq!(target(Some("Kinesis_20131202.PutRecords")), (Service::Kinesis, "PutRecords".into()));
        assert_eq!(target(None).0, Service::Other);
        assert_eq!(target(Some("TrentService.Decrypt")), (Service::Kms, "Decrypt".into()));
        assert!(applicable(Service::Kms, "Decrypt").is_empty(), "KMS only answers as a disabled key, when told");
    }

    #[test]
    fn faults_fit_the_operation() {
        assert!(applicable(Service::DynamoDb, "BatchWriteItem").contains(&Fault::PartialBatchWrite));
        assert!(!applicable(Service::DynamoDb, "Scan").contains(&Fault::PartialBatchWrite));
        assert!(applicable(Service::Kinesis, "PutRecords").contains(&Fault::PartialPutRecords));
        // The ambiguous failure that duplicates a Kinesis put, and only on puts.
        assert!(applicable(Service::Kinesis, "PutRecord").contains(&Fault::AppliedThenInternalError));
        assert!(applicable(Service::Kinesis, "PutRecords").contains(&Fault::AppliedThenInternalError));
        assert!(!applicable(Service::Kinesis, "GetRecords").contains(&Fault::AppliedThenInternalError));
        assert!(applicable(Service::Other, "").is_empty());
    }

    #[test]
    fn the_same_seed_gives_the_same_faults() {
        let draws = |seed| {
            let state = State {
                upstream: String::new(),
                client: Client::builder(TokioExecutor::new()).build_http(),
                rate: 0.3,
                only: None,
                rng: Mutex::new(fastrand::Rng::with_seed(seed)),
                counts: Mutex::default(),
                applied: Mutex::default(),
                one_at_a_time: None,
                transactions_alone: None,
                refused_keys: Mutex::default(),
                kms_disabled: std::sync::atomic::AtomicBool::new(false),
            };
            let faults = applicable(Service::DynamoDb, "BatchWriteItem");
            (0..200).map(|_| state.draw(&faults)).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let hits = draws(7).iter().filter(|(f, _)| f.is_some()).count();
        assert!((30..90).contains(&hits), "about 30 % of 200: {hits}");
    }

    #[test]
    fn something_is_always_held_back() {
        for seed in 0..50 {
            let held = held_back(3, seed);
            assert_eq!(held.len(), 3);
            assert!(held.contains(&true));
        }
        assert!(held_back(0, 1).is_empty());
    }
}
