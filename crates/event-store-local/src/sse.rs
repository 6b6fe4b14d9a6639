//! `GET /log` with `Accept: text/event-stream` on the local server: the
//! complete log followed live as server-sent events, each event's `id` its
//! position, so a client that loses the connection (or a server that
//! restarts) resumes with `Last-Event-ID` exactly after the last event it
//! got. API Gateway does not stream, so the deployed API answers `/log` a
//! page at a time (long polls, [`event_store::log::http`]); this server can.
//! The same reader serves both ([`LogReader::page`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use event_store::log::http::{LogApi, POLL};
use event_store::log::page::LogReader;
use event_store::log::Filter;
use http_body_util::StreamBody;
use hyper::body::Frame;
use hyper::{header, HeaderMap, Method, Response, StatusCode};
use lambda_http::aws_lambda_events::query_map::QueryMap;
use tokio::sync::mpsc;
use tracing::warn;

/// Events a page reads before sending them on.
const PAGE: usize = 100;
/// A comment line this often while nothing is sealed, so proxies keep the connection.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How long a reconnecting client waits (SSE's `retry`), in ms.
const RETRY_MS: u64 = 1_000;

pub type EventStream = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// Whether the request asks to follow the log as a stream (the `/log` path, `GET`, SSE accepted).
pub fn wants(method: &Method, path: &str, headers: &HeaderMap) -> bool {
    method == Method::GET
        && path.trim_end_matches('/').ends_with("/log")
        && !path.split('/').any(|s| s == "streams" || s == "views")
        && headers.get_all(header::ACCEPT).iter().any(|v| v.to_str().is_ok_and(|v| v.contains("text/event-stream")))
}

/// Where to start: `Last-Event-ID` (a reconnection) over `from`, else the log's start; and the filters.
pub fn start(query: Option<&str>, headers: &HeaderMap) -> Result<(String, Vec<Filter>), String> {
    let query: QueryMap = query.unwrap_or_default().parse().unwrap_or_default();
    let filters = query
        .all("filter")
        .unwrap_or_default()
        .iter()
        .map(|f| f.parse::<Filter>().map_err(|e| format!("filter: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let resumed = headers.get("last-event-id").and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty());
    let from = resumed.or(query.first("from")).unwrap_or("0").to_owned();
    Ok((from, filters))
}

/// The stream's answer: `200 text/event-stream`, fed by a task that reads the log from `from` and
/// ends when the client goes away. A start that is none of the log's is refused first (`400`), and
/// a store that cannot be read `503`: an `EventSource` would reconnect to a stream that ends at once
/// every second, for ever.
pub async fn follow(
    log: Arc<LogApi>,
    from: String,
    filters: Vec<Filter>,
) -> Result<Response<EventStream>, (StatusCode, String)> {
    let unavailable =
        |err: event_store::Error| (StatusCode::SERVICE_UNAVAILABLE, format!("the log cannot be read now: {err}"));
    let unit = event_store::bookkeeping::settings::time_unit(&log.dynamo, &log.event_table)
        .await
        .map_err(unavailable)?
        .unwrap_or(event_store::config::DEFAULT_TIME_UNIT_MS);
    match reader(&log, unit).page(&from, 1, &filters, Instant::now() + Duration::from_secs(5)).await {
        Err(event_store::Error::BadInput(message)) => return Err((StatusCode::BAD_REQUEST, message)),
        Err(err) => return Err(unavailable(err)),
        Ok(_) => {}
    }
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    tokio::spawn(async move { feed(&reader(&log, unit), from, &filters, &tx).await });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))));
    let mut response = Response::new(StreamBody::new(Box::pin(stream) as futures::stream::BoxStream<'static, _>));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, header::HeaderValue::from_static("no-cache"));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

fn reader(log: &LogApi, time_unit_ms: u64) -> LogReader<'_> {
    LogReader {
        dynamo: &log.dynamo,
        table: &log.event_table,
        time_unit_ms,
        dedupe_window_ms: log.dedupe_window_ms,
        tiers: &log.tiers,
    }
}

/// Sends the log's events from `from` as they are sealed, until the client is gone (noticed at
/// once, whatever the task is doing). The store unavailable: tried again every second.
async fn feed(reader: &LogReader<'_>, mut from: String, filters: &[Filter], tx: &mpsc::Sender<Bytes>) {
    if tx.send(Bytes::from(format!("retry: {RETRY_MS}\n\n"))).await.is_err() {
        return;
    }
    let mut quiet_since = Instant::now();
    loop {
        let read = reader.page(&from, PAGE, filters, Instant::now() + Duration::from_secs(20));
        let page = tokio::select! {
            _ = tx.closed() => return,
            page = read => page,
        };
        let page = match page {
            Ok(page) => page,
            Err(err) => {
                warn!(error = %err, "the log stream could not read: trying again");
                if !pause(tx, Duration::from_secs(1)).await {
                    return;
                }
                continue;
            }
        };
        for event in &page.events {
            let data = match serde_json::to_string(event) {
                Ok(data) => data,
                Err(err) => {
                    warn!(error = %err, position = %event.position, "an event could not be written: skipped");
                    continue;
                }
            };
            if tx.send(frame(&event.position, &data)).await.is_err() {
                return;
            }
            quiet_since = Instant::now();
        }
        from = page.next;
        if page.at_end && page.events.is_empty() {
            if quiet_since.elapsed() >= KEEP_ALIVE {
                if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                    return;
                }
                quiet_since = Instant::now();
            }
            if !pause(tx, POLL).await {
                return;
            }
        }
    }
}

/// Waits `time`; false when the client went away meanwhile.
async fn pause(tx: &mpsc::Sender<Bytes>, time: Duration) -> bool {
    tokio::select! {
        _ = tx.closed() => false,
        _ = tokio::time::sleep(time) => true,
    }
}

/// One server-sent event (`data` holds no newline: it is one line of JSON).
fn frame(id: &str, data: &str) -> Bytes {
    Bytes::from(format!("id: {id}\ndata: {data}\n\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_asked_for_by_accept_and_resumed_by_last_event_id() {
        let mut headers = HeaderMap::new();
        assert!(!wants(&Method::GET, "/log", &headers), "without Accept: a page, as the API answers");
        headers.insert(header::ACCEPT, "text/event-stream".parse().unwrap());
        assert!(wants(&Method::GET, "/log", &headers) && wants(&Method::GET, "/prod/log/", &headers));
        assert!(!wants(&Method::GET, "/streams/log", &headers) && !wants(&Method::POST, "/log", &headers));
        let (from, filters) = start(Some("from=2026-11-29T10:00:00Z&filter=/path=/track.gif"), &headers).unwrap();
        assert_eq!((from.as_str(), filters.len()), ("2026-11-29T10:00:00Z", 1));
        headers.insert("last-event-id", "cDEuMTc5".parse().unwrap());
        assert_eq!(start(Some("from=0"), &headers).unwrap().0, "cDEuMTc5", "a reconnection resumes where it was");
        assert!(start(Some("filter=nonsense"), &headers).is_err());
        assert_eq!(start(None, &HeaderMap::new()).unwrap().0, "0");
    }

    #[test]
    fn frames_are_server_sent_events() {
        assert_eq!(frame("p1", r#"{"a":1}"#), Bytes::from("id: p1\ndata: {\"a\":1}\n\n"));
    }
}
