//! A subscription's Lambda target, on 127.0.0.1: the Lambda `Invoke` API
//! (`POST /2015-03-31/functions/<name>/invocations`) answered by a consumer
//! the test or the local stack programs. moto runs functions only in
//! Docker, and a consumer is the user's own code anyway: this stands in for
//! it, over HTTP, so the runner's real SDK client and its error handling
//! are what is tested.
//!
//! It answers `DryRun` (204, or 404 for a function it does not know), a
//! function error (`X-Amz-Function-Error`), a partial batch failure
//! (`batchItemFailures`), throttling (429 `TooManyRequestsException`), and
//! a slow answer; and it records every batch it was sent.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// What the consumer answers to one batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// 200 with this payload (`null`, or `{"batchItemFailures": [...]}`).
    Ok(Value),
    /// The function failed (`X-Amz-Function-Error: Unhandled`) with this message.
    FunctionError(String),
    /// 429 `TooManyRequestsException`: the function was not run.
    Throttled,
    /// This answer, after a pause.
    Slow(Duration, Box<Answer>),
}

/// The consumer: decides each batch's answer.
pub type Consumer = Box<dyn Fn(&Value) -> Answer + Send + Sync>;

/// One batch the target was sent, and what it answered.
#[derive(Debug, Clone)]
pub struct Received {
    pub payload: Value,
    pub answer: Answer,
}

struct State {
    functions: HashSet<String>,
    consumer: Mutex<Consumer>,
    received: Mutex<Vec<Received>>,
}

pub struct LambdaTarget {
    pub endpoint: String,
    state: Arc<State>,
    stop: watch::Sender<bool>,
}

impl LambdaTarget {
    /// Serves `functions` on a free port of 127.0.0.1; every batch is taken (`null`) until [`Self::consume_with`].
    pub async fn start(functions: &[&str]) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let endpoint = format!("http://{}", listener.local_addr()?);
        let state = Arc::new(State {
            functions: functions.iter().map(|f| f.to_string()).collect(),
            consumer: Mutex::new(Box::new(|_| Answer::Ok(Value::Null))),
            received: Mutex::new(Vec::new()),
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

    pub fn consume_with(&self, consumer: impl Fn(&Value) -> Answer + Send + Sync + 'static) {
        if let Ok(mut current) = self.state.consumer.lock() {
            *current = Box::new(consumer);
        }
    }

    /// Every batch received so far, in the order they came.
    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The events of every batch the consumer took whole (`null` answered,
    /// or the part before a partial failure), in the order they came.
    pub fn taken(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for received in self.received() {
            let events = received.payload["events"].as_array().cloned().unwrap_or_default();
            let mut answer = &received.answer;
            while let Answer::Slow(_, inner) = answer {
                answer = inner;
            }
            match answer {
                Answer::Ok(Value::Null) => out.extend(events),
                Answer::Ok(partial) => {
                    let failed: Vec<&str> = partial["batchItemFailures"]
                        .as_array()
                        .map(|f| f.iter().filter_map(|f| f["itemIdentifier"].as_str()).collect())
                        .unwrap_or_default();
                    let first = events.iter().position(|e| failed.contains(&e["event_id"].as_str().unwrap_or("")));
                    out.extend(events.into_iter().take(first.unwrap_or(usize::MAX)));
                }
                _ => {}
            }
        }
        out
    }
}

impl Drop for LambdaTarget {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

fn reply(status: StatusCode, headers: &[(&str, &str)], body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (name.parse::<hyper::header::HeaderName>(), value.parse()) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

async fn handle(state: Arc<State>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let path = request.uri().path().to_owned();
    let dry_run = request.headers().get("x-amz-invocation-type").is_some_and(|v| v == "DryRun");
    let body = request.into_body().collect().await?.to_bytes();
    let function = path
        .strip_prefix("/2015-03-31/functions/")
        .and_then(|rest| rest.strip_suffix("/invocations"))
        .map(|name| name.rsplit(':').next().unwrap_or(name).to_owned());
    if !function.is_some_and(|f| state.functions.contains(&f)) {
        let message = json!({"Type": "User", "message": format!("Function not found: {path}")});
        let headers = [("x-amzn-errortype", "ResourceNotFoundException"), ("content-type", "application/json")];
        return Ok(reply(StatusCode::NOT_FOUND, &headers, message.to_string().into_bytes()));
    };
    if dry_run {
        return Ok(reply(StatusCode::NO_CONTENT, &[], Vec::new()));
    }
    let payload: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let answer = match state.consumer.lock() {
        Ok(consumer) => consumer(&payload),
        Err(_) => Answer::FunctionError("consumer poisoned".into()),
    };
    if let Ok(mut received) = state.received.lock() {
        received.push(Received { payload, answer: answer.clone() });
    }
    let mut answer = answer;
    while let Answer::Slow(pause, inner) = answer {
        tokio::time::sleep(pause).await;
        answer = *inner;
    }
    Ok(match answer {
        Answer::Ok(value) => {
            reply(StatusCode::OK, &[("x-amz-executed-version", "$LATEST")], value.to_string().into_bytes())
        }
        Answer::FunctionError(message) => {
            let body = json!({"errorMessage": message, "errorType": "Error"});
            reply(StatusCode::OK, &[("x-amz-function-error", "Unhandled")], body.to_string().into_bytes())
        }
        Answer::Throttled => {
            let body = json!({"Type": "User", "message": "Rate Exceeded.", "Reason": "ReservedFunctionConcurrentInvocationLimitExceeded"});
            let headers = [("x-amzn-errortype", "TooManyRequestsException"), ("content-type", "application/json")];
            reply(StatusCode::TOO_MANY_REQUESTS, &headers, body.to_string().into_bytes())
        }
        Answer::Slow(..) => reply(StatusCode::INTERNAL_SERVER_ERROR, &[], Vec::new()),
    })
}
