//! The HTTP edge's shared helpers, for `load` and the entity streams' API
//! alike: a deliberate 4xx ([`Reject`]), the body as text, the JSON content
//! type, and JSON answers (with `Retry-After` on 429 and 503).

use lambda_http::http::{header, StatusCode};
use lambda_http::{Body, Request, Response};
use serde_json::Value;

/// A request we answer with a 4xx: the status and a short message for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    pub status: StatusCode,
    pub message: String,
}

impl Reject {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

/// The request body as text: `None` when empty, 400 when not UTF-8.
pub(crate) fn body_text(req: &Request) -> Result<Option<String>, Reject> {
    let bytes: &[u8] = req.body().as_ref();
    if bytes.is_empty() {
        return Ok(None);
    }
    String::from_utf8(bytes.to_vec())
        .map(Some)
        .map_err(|_| Reject::new(StatusCode::BAD_REQUEST, "body is not valid UTF-8"))
}

pub(crate) fn check_json_content_type(req: &Request) -> Result<(), Reject> {
    let Some(value) = req.headers().get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let mime = value.to_str().unwrap_or("").split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if mime == "application/json" || mime.ends_with("+json") || mime == "text/plain" {
        Ok(())
    } else {
        Err(Reject::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "send events as application/json"))
    }
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response<Body> {
    let mut response = Response::new(Body::Text(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    // A shard's limits are per second: a second later the event fits again.
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}
