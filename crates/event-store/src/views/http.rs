//! `GET /views/{projection}` (a page in key order: `?prefix=&after=&limit=`)
//! and `GET /views/{projection}/{key}` (one item; `?at_least_version=`), as
//! the streams function serves them beside `/streams`, under the same auth.
//! A key may hold `/` (a count view's `day/2026-11-29//cart`): everything
//! after the projection is the key, percent-decoded.
//!
//! | answer | when |
//! |---|---|
//! | 200 | the item, or the page, with the position the view reflects |
//! | 404 | no such projection, or no such item |
//! | 410 | the item's subject is forgotten (`forget`): the marker, when |
//! | 503 + `Retry-After` | `at_least_version` not reached within the wait; the store unavailable |

use lambda_http::http::{Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use percent_encoding::percent_decode_str;
use serde_json::json;

use super::query::{self, Found, ViewQuery};
use crate::error::Error;
use crate::http::json_response;

/// `.../views/{projection}[/{key}]`, behind any stage or base path.
fn route(path: &str) -> Option<(String, Option<String>)> {
    let segments: Vec<&str> = path.split('/').collect();
    let at = segments.iter().position(|s| *s == "views")?;
    let decode = |s: &str| percent_decode_str(s).decode_utf8().ok().map(|s| s.into_owned());
    match &segments[at + 1..] {
        [name] if !name.is_empty() => Some((decode(name)?, None)),
        [name, key @ ..] if !name.is_empty() && !key.is_empty() && key != [""] => {
            Some((decode(name)?, Some(decode(&key.join("/"))?)))
        }
        _ => None,
    }
}

/// What `GET /views` calls: the registry item, an item, a page (`Query`), the positions.
pub const AWS_ACTIONS: &[&str] = &["dynamodb:GetItem", "dynamodb:Query", "dynamodb:BatchGetItem"];

/// The `/views` API of one views table.
pub struct ViewsApi {
    dynamo: aws_sdk_dynamodb::Client,
    table: String,
}

impl ViewsApi {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, table: String) -> Self {
        Self { dynamo, table }
    }

    /// True when `path` is one of this API's.
    pub(crate) fn serves(path: &str) -> bool {
        route(path).is_some()
    }

    /// Answers one request. Never fails: every outcome is a response.
    pub async fn handle(&self, req: &Request) -> Response<Body> {
        let error = |status: StatusCode, message: String| json_response(status, &json!({ "error": message }));
        let Some((name, key)) = route(req.uri().path()) else {
            return error(StatusCode::NOT_FOUND, "not found".into());
        };
        if req.method() != Method::GET {
            return error(StatusCode::METHOD_NOT_ALLOWED, "views are read with GET".into());
        }
        let params = req.query_string_parameters();
        let number = |name: &str| params.first(name).map(|v| v.parse::<u64>().map_err(|_| name.to_owned())).transpose();
        let (limit, at_least_version) = match (number("limit"), number("at_least_version")) {
            (Ok(limit), Ok(at_least)) => (limit, at_least),
            (Err(name), _) | (_, Err(name)) => {
                return error(StatusCode::BAD_REQUEST, format!("{name} must be a number"))
            }
        };
        let query = ViewQuery {
            key: key.clone(),
            prefix: params.first("prefix").map(str::to_owned),
            after: params.first("after").map(str::to_owned),
            limit: limit.map(|l| l as usize),
            at_least_version,
            name,
        };
        match query::answer(&self.dynamo, &self.table, &query).await {
            Ok(Found::Answer(answer)) if key.is_some() && answer["item"].is_null() => json_response(
                StatusCode::NOT_FOUND,
                &json!({ "error": "no such item", "position": answer["position"] }),
            ),
            Ok(Found::Answer(answer)) => json_response(StatusCode::OK, &answer),
            Ok(Found::NoProjection) => error(StatusCode::NOT_FOUND, format!("no projection {:?}", query.name)),
            Ok(Found::Forgotten(marker)) => {
                json_response(StatusCode::GONE, &json!({ "error": "its subject is forgotten", "forgotten": marker }))
            }
            Ok(Found::Behind(version)) => json_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({ "error": "the view has not reached that version yet: ask again", "stream_version": version }),
            ),
            Err(Error::BadInput(message)) => error(StatusCode::BAD_REQUEST, message),
            Err(err) => {
                tracing::error!(error = %err, "views unavailable");
                json_response(StatusCode::SERVICE_UNAVAILABLE, &json!({"error": "store unavailable, retry later"}))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_take_everything_after_the_projection_as_the_key() {
        assert_eq!(route("/views/todos"), Some(("todos".into(), None)));
        assert_eq!(route("/prod/views/todos/todo-1"), Some(("todos".into(), Some("todo-1".into()))));
        let count = route("/views/pages/day/2026-11-29//cart").unwrap();
        assert_eq!(count.1.as_deref(), Some("day/2026-11-29//cart"));
        assert_eq!(route("/views/pages/day%2F2026-11-29%2F%2Fcart"), Some(count));
        assert_eq!(route("/views/t/a%20b").unwrap().1.as_deref(), Some("a b"));
        for other in ["/views", "/views/", "/views//x", "/views/t/", "/streams/x", "/views/t/%FF"] {
            assert_eq!(route(other), None, "{other}");
        }
    }
}
