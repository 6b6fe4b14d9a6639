//! The local HTTP server: the `load` handler and the `/streams` API (the
//! same handlers Lambda runs) behind hyper, routed as the template's HTTP
//! API routes them and called as API Gateway would, plus the page at `/`
//! (the store at a glance, with the pixel and a button) and the JSON it polls,
//! and `/log` followed as server-sent events ([`crate::sse`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use event_store::entity::http::StreamsApi;
use event_store::load::Load;
use event_store::log::http::LogApi;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use lambda_http::aws_lambda_events::apigw::ApiGatewayV2httpRequestContext;
use lambda_http::aws_lambda_events::query_map::QueryMap;
use lambda_http::request::RequestContext;
use lambda_http::RequestExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::warn;

use crate::glance::Glance;
use crate::stats::Stats;
use crate::template::Cors;

/// The page served at `/`: the store at a glance (it polls `/status.json` and
/// `/recent.json`), the pixel and a button that posts an event. One file, no
/// build step and nothing from elsewhere, so it works offline.
pub const PAGE: &str = include_str!("page.html");
/// Lambda's request payload limit; API Gateway would refuse more.
const MAX_BODY_BYTES: usize = 6 * 1024 * 1024;

/// Any of the server's answers: whole, or a stream.
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// The functions behind the HTTP API.
pub struct Api {
    pub load: Load,
    pub streams: StreamsApi,
    /// The log, for the event stream (the streams function's `/log` answers pages).
    pub log: Arc<LogApi>,
    pub glance: Glance,
    /// What API Gateway adds in AWS (the template's `CorsConfiguration`): a page on another site
    /// (the tracker script's) may send and read the answers.
    pub cors: Cors,
}

pub async fn serve(listener: TcpListener, api: Arc<Api>, stats: Arc<Stats>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(ok) => ok,
                    Err(err) => {
                        warn!(error = %err, "accept failed");
                        continue;
                    }
                };
                let (api, stats) = (api.clone(), stats.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, peer, api.clone(), stats.clone()));
                    let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
                });
            }
            _ = shutdown.changed() => return,
        }
    }
}

async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    api: Arc<Api>,
    stats: Arc<Stats>,
) -> Result<Response<Body>, Infallible> {
    let cors = api.cors.clone();
    if crate::sse::wants(req.method(), req.uri().path(), req.headers()) {
        let started = match crate::sse::start(req.uri().query(), req.headers()) {
            Ok((from, filters)) => crate::sse::follow(api.log.clone(), from, filters).await,
            Err(message) => Err((StatusCode::BAD_REQUEST, message)),
        };
        let answer = match started {
            Ok(stream) => stream.map(BodyExt::boxed_unsync),
            Err((status, message)) => {
                let body = serde_json::json!({ "error": message }).to_string();
                respond(status, "application/json", body.into()).map(BodyExt::boxed_unsync)
            }
        };
        return Ok(with_cors(answer, &cors));
    }
    let answer = route(req, peer, api, stats).await?;
    Ok(with_cors(answer.map(BodyExt::boxed_unsync), &cors))
}

/// A CORS preflight's answer, or the CORS headers on any other answer, as API Gateway adds them.
fn with_cors<B>(mut response: Response<B>, cors: &Cors) -> Response<B> {
    let headers = response.headers_mut();
    let mut set = |name: &'static str, value: &str| {
        if let Ok(value) = header::HeaderValue::from_str(value) {
            headers.insert(name, value);
        }
    };
    set("access-control-allow-origin", &cors.allow_origins);
    set("access-control-expose-headers", &cors.expose_headers);
    response
}

async fn route(
    req: Request<Incoming>,
    peer: SocketAddr,
    api: Arc<Api>,
    stats: Arc<Stats>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() == Method::OPTIONS {
        let mut preflight = respond(StatusCode::NO_CONTENT, "text/plain", Bytes::new());
        let headers = preflight.headers_mut();
        for (name, value) in [
            ("access-control-allow-methods", &api.cors.allow_methods),
            ("access-control-allow-headers", &api.cors.allow_headers),
            ("access-control-max-age", &api.cors.max_age),
        ] {
            if let Ok(value) = header::HeaderValue::from_str(value) {
                headers.insert(name, value);
            }
        }
        return Ok(preflight);
    }
    if req.method() == Method::GET {
        match req.uri().path() {
            "/" => return Ok(respond(StatusCode::OK, "text/html; charset=utf-8", Bytes::from_static(PAGE.as_bytes()))),
            "/status.json" => return Ok(json_answer(api.glance.status().await)),
            "/recent.json" => {
                let after = query_value(req.uri().query(), "after").and_then(|a| a.parse().ok());
                return Ok(json_answer(api.glance.recent(after).await));
            }
            _ => {}
        }
    }
    let (parts, body) = req.into_parts();
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            return Ok(respond(
                StatusCode::PAYLOAD_TOO_LARGE,
                "application/json",
                r#"{"error":"body too large"}"#.into(),
            ))
        }
    };
    if StreamsApi::serves(parts.uri.path()) {
        let response = api.streams.handle(lambda_request(parts, bytes, peer)).await;
        stats.received.fetch_add(appended_events(&response), Ordering::Relaxed);
        let (parts, body) = response.into_parts();
        return Ok(Response::from_parts(parts, Full::new(Bytes::copy_from_slice(body.as_ref()))));
    }
    let response = api.load.handle(lambda_request(parts, bytes, peer)).await;
    stats.received.fetch_add(accepted_events(&response), Ordering::Relaxed);
    let (parts, body) = response.into_parts();
    Ok(Response::from_parts(parts, Full::new(Bytes::copy_from_slice(body.as_ref()))))
}

/// The request as API Gateway (HTTP API) would hand it to Lambda.
fn lambda_request(parts: hyper::http::request::Parts, body: Bytes, peer: SocketAddr) -> lambda_http::Request {
    let query: QueryMap = parts.uri.query().unwrap_or_default().parse().unwrap_or_default();
    let mut context = ApiGatewayV2httpRequestContext::default();
    context.http.method = parts.method.clone();
    context.http.path = Some(parts.uri.path().to_owned());
    context.http.source_ip = Some(peer.ip().to_string());
    let body = match String::from_utf8(body.to_vec()) {
        Ok(text) if text.is_empty() => lambda_http::Body::Empty,
        Ok(text) => lambda_http::Body::Text(text),
        Err(err) => lambda_http::Body::Binary(err.into_bytes()),
    };
    lambda_http::Request::from_parts(parts, body)
        .with_query_string_parameters(query)
        .with_request_context(RequestContext::ApiGatewayV2(context))
}

/// Events a load response accepted: 1 for a pixel, `accepted` for a post.
fn accepted_events(response: &lambda_http::Response<lambda_http::Body>) -> u64 {
    let is_gif = response.headers().get(header::CONTENT_TYPE).is_some_and(|v| v == "image/gif");
    match response.status() {
        StatusCode::OK if is_gif => 1,
        StatusCode::ACCEPTED | StatusCode::MULTI_STATUS => {
            serde_json::from_slice::<serde_json::Value>(response.body().as_ref())
                .ok()
                .and_then(|v| v["accepted"].as_u64())
                .unwrap_or(0)
        }
        _ => 0,
    }
}

/// Events an append answered `201` for (a client's retry of an append is
/// answered the same, and counted again: the status line is not the log).
fn appended_events(response: &lambda_http::Response<lambda_http::Body>) -> u64 {
    if response.status() != StatusCode::CREATED {
        return 0;
    }
    serde_json::from_slice::<serde_json::Value>(response.body().as_ref())
        .ok()
        .and_then(|v| v["versions"].as_array().map(|versions| versions.len() as u64))
        .unwrap_or(0)
}

/// `?name=value` from a query string.
fn query_value(query: Option<&str>, name: &str) -> Option<String> {
    let query: QueryMap = query.unwrap_or_default().parse().ok()?;
    query.first(name).map(str::to_owned)
}

/// A value as JSON, or the error as `500 {"error": ...}` (logged).
fn json_answer<T: serde::Serialize>(value: anyhow::Result<T>) -> Response<Full<Bytes>> {
    let json = value.and_then(|v| Ok(serde_json::to_vec(&v)?));
    match json {
        Ok(body) => respond(StatusCode::OK, "application/json", body.into()),
        Err(err) => {
            warn!(error = format!("{err:#}"), "the page's data could not be read");
            let body = serde_json::json!({"error": format!("{err:#}")}).to_string();
            respond(StatusCode::INTERNAL_SERVER_ERROR, "application/json", body.into())
        }
    }
}

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: StatusCode, content_type: &str, body: &str) -> lambda_http::Response<lambda_http::Body> {
        let mut response = lambda_http::Response::new(lambda_http::Body::Text(body.to_owned()));
        *response.status_mut() = status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, content_type.parse().unwrap_or(header::HeaderValue::from_static("x")));
        response
    }

    /// The status line's `received` counts every source: pixel hits, posted events and entity appends.
    #[test]
    fn every_source_counts_as_received() {
        assert_eq!(accepted_events(&answer(StatusCode::OK, "image/gif", "GIF89a")), 1);
        assert_eq!(accepted_events(&answer(StatusCode::ACCEPTED, "application/json", r#"{"accepted":3}"#)), 3);
        let appended = r#"{"stream":"todo","first":4,"last":6,"versions":[4,5,6]}"#;
        assert_eq!(appended_events(&answer(StatusCode::CREATED, "application/json", appended)), 3);
        assert_eq!(appended_events(&answer(StatusCode::CONFLICT, "application/json", r#"{"current_version":1}"#)), 0);
    }
}
