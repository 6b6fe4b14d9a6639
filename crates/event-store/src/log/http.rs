//! `GET /log?from=&limit=&wait=&filter=`: the complete log over HTTP, a page
//! at a time ([`super::page`]), as the streams function serves it beside
//! `/streams`, under the same auth (SigV4). At the end of the sealed log a
//! request waits up to `wait` seconds (at most [`MAX_WAIT`]) for new sealed
//! events, reading the watermark every [`POLL`]: a long poll, which every
//! deployment can serve (API Gateway does not stream; its answers end at
//! 30 s, Lambda's at 6 MB).
//!
//! | parameter | |
//! |---|---|
//! | `from` | a page's `next` (or an event's `position`), a time (RFC 3339), or ms since the epoch; default: the log's start |
//! | `limit` | events a page holds, 1 to 1,000 (default 100) |
//! | `wait` | seconds to wait at the end for new sealed events, 0 to 20 (default 0) |
//! | `filter` | `POINTER=VALUE` on the event's JSON, repeated for all of them (`/path=/track.gif`) |
//!
//! | answer | when |
//! |---|---|
//! | 200 | the page ([`super::page::LogPage`]) |
//! | 400 | a parameter that is not one of the above |
//! | 503 + `Retry-After` | the store unavailable |

use std::time::{Duration, Instant};

use lambda_http::http::{Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use serde_json::json;

use super::page::{LogReader, MAX_LIMIT};
use super::tiers::Tiers;
use super::Filter;
use crate::bookkeeping::settings;
use crate::error::Error;
use crate::http::json_response;

/// The longest a request waits at the end of the log: within the HTTP API's 30 s with a page to read.
pub const MAX_WAIT: Duration = Duration::from_secs(20);
/// How often a waiting request reads the watermark.
pub const POLL: Duration = Duration::from_millis(500);
/// A request answers within this, whatever it reads or waits: the function's timeout is 29 s.
const ANSWER_WITHIN: Duration = Duration::from_secs(25);
const DEFAULT_LIMIT: usize = 100;

/// The log of one event table, for readers over HTTP.
pub struct LogApi {
    pub dynamo: aws_sdk_dynamodb::Client,
    pub event_table: String,
    pub dedupe_window_ms: u64,
    /// The archive and the subjects' keys: archived slots read from S3, sealed events opened.
    pub tiers: Tiers,
}

/// `.../log`, behind any stage or base path: never a path of `/streams` or
/// `/views` (a stream, a view or a view's key named `log`).
pub(crate) fn serves(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    path.rsplit('/').next() == Some("log") && !path.split('/').any(|s| s == "streams" || s == "views")
}

impl LogApi {
    /// Answers one request. Never fails: every outcome is a response.
    pub(crate) async fn handle(&self, req: &Request) -> Response<Body> {
        let error = |status: StatusCode, message: String| json_response(status, &json!({ "error": message }));
        if req.method() != Method::GET {
            return error(StatusCode::METHOD_NOT_ALLOWED, "the log is read with GET".into());
        }
        let params = req.query_string_parameters();
        let number = |name: &str, default: u64, most: u64| match params.first(name) {
            None => Ok(default),
            Some(text) => text
                .parse::<u64>()
                .ok()
                .filter(|n| *n <= most)
                .ok_or_else(|| format!("{name} must be a whole number from 0 to {most}")),
        };
        let parsed = (
            number("limit", DEFAULT_LIMIT as u64, MAX_LIMIT as u64).and_then(|n| {
                if n == 0 {
                    Err(format!("limit must be a whole number from 1 to {MAX_LIMIT}"))
                } else {
                    Ok(n)
                }
            }),
            number("wait", 0, MAX_WAIT.as_secs()),
            params.all("filter").unwrap_or_default().iter().map(|f| f.parse::<Filter>()).collect::<Result<Vec<_>, _>>(),
        );
        let (limit, wait, filters) = match parsed {
            (Ok(limit), Ok(wait), Ok(filters)) => (limit as usize, Duration::from_secs(wait), filters),
            (Err(message), _, _) | (_, Err(message), _) => return error(StatusCode::BAD_REQUEST, message),
            (_, _, Err(err)) => return error(StatusCode::BAD_REQUEST, format!("filter: {err}")),
        };
        let from = params.first("from").unwrap_or("0").to_owned();
        let started = Instant::now();
        match self.page(from, limit, &filters, (started + wait, started + ANSWER_WITHIN)).await {
            Ok(page) => json_response(StatusCode::OK, &json!(page)),
            Err(Error::BadInput(message)) => error(StatusCode::BAD_REQUEST, message),
            Err(err) => {
                tracing::warn!(error = %err, "GET /log failed");
                error(StatusCode::SERVICE_UNAVAILABLE, format!("the log cannot be read now: {err}"))
            }
        }
    }

    /// The page from `from`; at the end of the sealed log with nothing to
    /// answer, read again every [`POLL`] from where it ended, until `until`;
    /// reading no later than `answer_by`.
    async fn page(
        &self,
        mut from: String,
        limit: usize,
        filters: &[Filter],
        (until, answer_by): (Instant, Instant),
    ) -> crate::Result<super::page::LogPage> {
        let unit =
            settings::time_unit(&self.dynamo, &self.event_table).await?.unwrap_or(crate::config::DEFAULT_TIME_UNIT_MS);
        let reader = LogReader {
            dynamo: &self.dynamo,
            table: &self.event_table,
            time_unit_ms: unit,
            dedupe_window_ms: self.dedupe_window_ms,
            tiers: &self.tiers,
        };
        loop {
            let page = reader.page(&from, limit, filters, answer_by).await?;
            let left = until.saturating_duration_since(Instant::now());
            if !page.events.is_empty() || !page.at_end || left.is_zero() {
                return Ok(page);
            }
            from = page.next;
            tokio::time::sleep(left.min(POLL)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_served_behind_any_stage() {
        assert!(serves("/log") && serves("/prod/log") && serves("/log/"));
        assert!(!serves("/streams/log") && !serves("/views/log") && !serves("/logs") && !serves("/streams"));
        assert!(!serves("/views/pages/log") && !serves("/views/p/a/log") && !serves("/streams/x/log"));
    }
}
