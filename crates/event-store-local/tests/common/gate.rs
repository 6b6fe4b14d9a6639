//! A gate between a page's tracker script and the local stack's `/events`, which the test opens,
//! cuts, throttles or makes lose an answer, recording what came through it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

/// What the gate does with the next requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forwards to the stack.
    Open,
    /// Closes the connection without an answer (the network cut).
    Cut,
    /// Answers this many more requests 429 with `Retry-After: 2`, then opens.
    Throttled(u32),
    /// Forwards the next request, then answers it 503 (the answer lost); then opens.
    LoseOneAnswer,
}

/// One request through the gate: when, what it answered (0: cut), the `EventId`s it carried.
#[derive(Debug, Clone)]
pub struct Passed {
    pub at: Instant,
    pub status: u16,
    pub ids: Vec<String>,
}

#[derive(Clone)]
pub struct Gate {
    pub port: u16,
    mode: Arc<Mutex<Mode>>,
    log: Arc<Mutex<Vec<Passed>>>,
}

impl Gate {
    /// A gate on a free port of 127.0.0.1 in front of the stack's HTTP port.
    pub async fn start(upstream: u16) -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gate = Gate {
            port: listener.local_addr().unwrap().port(),
            mode: Arc::new(Mutex::new(Mode::Open)),
            log: Arc::new(Mutex::new(Vec::new())),
        };
        let serving = gate.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let gate = serving.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        let gate = gate.clone();
                        async move { gate.answer(req, upstream).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        gate
    }

    pub fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn passed(&self) -> Vec<Passed> {
        self.log.lock().unwrap().clone()
    }

    async fn answer(
        &self,
        req: Request<hyper::body::Incoming>,
        upstream: u16,
    ) -> Result<Response<Full<Bytes>>, std::io::Error> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
        let ids: Vec<String> = serde_json::from_slice::<Vec<serde_json::Value>>(&body)
            .map(|events| events.iter().filter_map(|e| e["EventId"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let mode = {
            let mut mode = self.mode.lock().unwrap();
            let now = *mode;
            *mode = match now {
                Mode::Throttled(n) if n > 1 => Mode::Throttled(n - 1),
                Mode::Throttled(_) | Mode::LoseOneAnswer => Mode::Open,
                other => other,
            };
            now
        };
        let record =
            |status: u16| self.log.lock().unwrap().push(Passed { at: Instant::now(), status, ids: ids.clone() });
        // Its own answers carry what the stack's would (CORS, `Retry-After`); a forwarded one is the stack's.
        let own = |status: StatusCode, body: &'static [u8]| {
            let mut response = Response::new(Full::new(Bytes::from_static(body)));
            *response.status_mut() = status;
            let headers = response.headers_mut();
            headers.insert("access-control-allow-origin", "*".parse().unwrap());
            headers.insert("access-control-expose-headers", "retry-after".parse().unwrap());
            headers.insert("retry-after", "2".parse().unwrap());
            response
        };
        let response = match mode {
            Mode::Cut => {
                record(0);
                return Err(std::io::Error::other("the network is cut"));
            }
            Mode::Throttled(_) => own(StatusCode::TOO_MANY_REQUESTS, br#"{"error":"slow down"}"#),
            Mode::LoseOneAnswer => {
                forward(parts, body, upstream).await?;
                own(StatusCode::SERVICE_UNAVAILABLE, br#"{"error":"lost"}"#)
            }
            Mode::Open => forward(parts, body, upstream).await?,
        };
        record(response.status().as_u16());
        Ok::<_, std::io::Error>(response)
    }
}

/// The stack's answer to the request, its headers as they were (its CORS among them).
async fn forward(
    parts: hyper::http::request::Parts,
    body: Bytes,
    upstream: u16,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut request = Request::new(Full::new(body));
    *request.method_mut() = parts.method;
    *request.uri_mut() =
        format!("http://127.0.0.1:{upstream}{}", parts.uri.path()).parse().map_err(std::io::Error::other)?;
    for name in ["content-type", "user-agent", "origin", "referer"] {
        if let Some(value) = parts.headers.get(name) {
            request.headers_mut().insert(name, value.clone());
        }
    }
    let answer = client.request(request).await.map_err(std::io::Error::other)?;
    let (mut parts, body) = answer.into_parts();
    let body = body.collect().await.map_err(std::io::Error::other)?.to_bytes();
    for hop in ["connection", "transfer-encoding", "content-length"] {
        parts.headers.remove(hop);
    }
    Ok(Response::from_parts(parts, Full::new(body)))
}
