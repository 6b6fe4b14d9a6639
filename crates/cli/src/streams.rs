//! `event-store streams`: entity streams through their HTTP API, as an
//! application uses them. Locally the API is `make local`'s server (no
//! authentication); on a deployed stack it is the `StreamsUrl` output, whose
//! routes use `AWS_IAM`, so each request is SigV4-signed for `execute-api`
//! with the user's credentials (`aws-sigv4`, the SDK's own signer).

use std::time::{Duration, SystemTime};

use anyhow::{anyhow, Context, Result};
use aws_config::SdkConfig;
use aws_credential_types::provider::ProvideCredentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use clap::Subcommand;
use event_store::entity::model::check_name;
use reqwest::Method;
use serde_json::Value;

#[derive(Subcommand)]
pub enum Action {
    /// Stream names in name order with their versions (the next page: --after the answer's `next`).
    List {
        /// Only names starting with this.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Names after this one.
        #[arg(long)]
        after: Option<String>,
        /// Streams in the page, 1 to 100 (the API's default: 100).
        #[arg(long)]
        limit: Option<u32>,
    },
    /// A page of a stream's events in order (the next page: --from the answer's last version + 1).
    Read {
        name: String,
        /// The first version to read (the last one, with --backward).
        #[arg(long)]
        from: Option<u64>,
        /// Events in the page, 1 to 1000 (the API's default: 100).
        #[arg(long)]
        limit: Option<u32>,
        /// Newest first.
        #[arg(long)]
        backward: bool,
    },
    /// Append events, all or none: a JSON event `{"type": ..., "data": ...}` or an array of up to 100 (`-`: stdin).
    Append {
        name: String,
        events: String,
        /// Only if the stream is at exactly this version (else exit 1, nothing appended).
        #[arg(long)]
        expect: Option<u64>,
        /// Only if the stream does not exist yet.
        #[arg(long, conflicts_with = "expect")]
        new: bool,
    },
    /// Append to several streams at once, all or none: `{"appends": [{"stream", "expected_version"?,
    /// "events"}], "conditions"?: [{"stream", "expected_version"}]}` (`-`: stdin).
    AppendAcross { request: String },
    /// The latest snapshot and the events after it.
    State { name: String },
    /// Mark a stream deleted (appends `StreamDeleted`; its history stays readable).
    Delete {
        name: String,
        #[arg(long)]
        expect: u64,
    },
    /// Store a snapshot: the state (JSON, `-`: stdin) folded up to version --expect.
    Snapshot {
        name: String,
        state: String,
        #[arg(long)]
        expect: u64,
    },
    /// A stream's metadata; with --set, replace it: `{"max_age": s, "max_count": n,
    /// "truncate_before": v, "custom": {...}}` (`-`: stdin; `{}` clears it).
    Metadata {
        name: String,
        #[arg(long)]
        set: Option<String>,
        /// Only if the metadata is at exactly this version (its own, not the stream's).
        #[arg(long, requires = "set")]
        expect: Option<u64>,
    },
}

/// One request to the API, checked before anything is sent.
#[derive(Debug, PartialEq)]
pub struct Call {
    method: Method,
    /// After the API's base: `/<name>`, `/<name>/state`, …
    path: String,
    query: Vec<(&'static str, String)>,
    precondition: Option<(&'static str, String)>,
    body: Option<Vec<u8>>,
}

impl Action {
    /// The request this action makes; bad arguments are refused here.
    pub fn call(self) -> Result<Call> {
        let named = |name: &str| {
            check_name(name).map_err(|e| anyhow!("{name:?}: {e}"))?;
            // A URL would read them as "here" and "up": the request would go elsewhere.
            if name == "." || name == ".." {
                return Err(anyhow!("{name:?}: not a stream name this command can send"));
            }
            Ok(format!("/{name}"))
        };
        let version = |v: u64| ("if-match", format!("\"{v}\""));
        Ok(match self {
            Action::List { prefix, after, limit } => {
                if limit.is_some_and(|l| !(1..=100).contains(&l)) {
                    return Err(anyhow!("--limit is 1 to 100"));
                }
                let mut query = vec![("prefix", prefix)];
                query.extend(after.map(|a| ("after", a)));
                query.extend(limit.map(|l| ("limit", l.to_string())));
                Call { method: Method::GET, path: String::new(), query, precondition: None, body: None }
            }
            Action::Read { name, from, limit, backward } => {
                if limit.is_some_and(|l| !(1..=1000).contains(&l)) {
                    return Err(anyhow!("--limit is 1 to 1000"));
                }
                let mut query = Vec::new();
                query.extend(from.map(|v| ("from", v.to_string())));
                query.extend(limit.map(|l| ("limit", l.to_string())));
                if backward {
                    query.push(("direction", "backward".to_owned()));
                }
                Call { method: Method::GET, path: named(&name)?, query, precondition: None, body: None }
            }
            Action::Append { name, events, expect, new } => Call {
                method: Method::POST,
                path: named(&name)?,
                query: vec![],
                precondition: match (expect, new) {
                    (Some(v), _) => Some(version(v)),
                    (None, true) => Some(("if-none-match", "*".to_owned())),
                    (None, false) => None,
                },
                body: Some(json_argument("events", &events)?),
            },
            Action::AppendAcross { request } => Call {
                method: Method::POST,
                path: String::new(),
                query: vec![],
                precondition: None,
                body: Some(json_argument("request", &request)?),
            },
            Action::State { name } => Call {
                method: Method::GET,
                path: format!("{}/state", named(&name)?),
                query: vec![],
                precondition: None,
                body: None,
            },
            Action::Delete { name, expect } => Call {
                method: Method::DELETE,
                path: named(&name)?,
                query: vec![],
                precondition: Some(version(expect)),
                body: None,
            },
            Action::Snapshot { name, state, expect } => Call {
                method: Method::PUT,
                path: format!("{}/snapshot", named(&name)?),
                query: vec![],
                precondition: Some(version(expect)),
                body: Some(json_argument("state", &state)?),
            },
            Action::Metadata { name, set, expect } => Call {
                method: if set.is_some() { Method::PUT } else { Method::GET },
                path: format!("{}/metadata", named(&name)?),
                query: vec![],
                precondition: expect.map(version),
                body: set.map(|m| json_argument("metadata", &m)).transpose()?,
            },
        })
    }
}

/// A JSON argument (`-`: read from stdin), checked to be JSON before it is sent.
fn json_argument(what: &str, text: &str) -> Result<Vec<u8>> {
    let text = if text == "-" { std::io::read_to_string(std::io::stdin()).context("stdin")? } else { text.to_owned() };
    serde_json::from_str::<Value>(&text).map_err(|e| anyhow!("{what} is not JSON: {e}"))?;
    Ok(text.into_bytes())
}

/// The API's base URL, checked: http or https, a host, no query or fragment.
pub fn base_url(text: &str) -> Result<reqwest::Url> {
    let url = reqwest::Url::parse(text).map_err(|e| anyhow!("the streams URL {text:?}: {e}"))?;
    let fine = matches!(url.scheme(), "http" | "https")
        && url.host().is_some()
        && url.query().is_none()
        && url.fragment().is_none()
        && !url.cannot_be_a_base();
    if !fine {
        return Err(anyhow!("the streams URL {text:?} is not an http(s) URL with a host and no query"));
    }
    Ok(url)
}

/// What the API answered.
pub struct Answer {
    pub status: reqwest::StatusCode,
    pub etag: Option<String>,
    pub body: Value,
}

/// Why the API was not reached (exit 3), as opposed to an answer.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error("nothing answers on {url}: {detail}")]
    NoAnswer { url: String, detail: String },
    #[error("no AWS credentials to sign with: {0}")]
    NoCredentials(String),
}

/// How long a request may take, answer included.
const TIMEOUT: Duration = Duration::from_secs(30);

/// Sends `call` to the API at `base`; signed when `signer` is given (a deployed stack).
pub async fn send(base: &reqwest::Url, call: Call, signer: Option<&SdkConfig>) -> Result<Answer> {
    let mut url = base.clone();
    {
        let mut segments = url.path_segments_mut().map_err(|()| anyhow!("the streams URL {base} has no path"))?;
        segments.pop_if_empty();
        // No path: the API's base itself (a listing), not a trailing `/`.
        let path = call.path.trim_start_matches('/');
        if !path.is_empty() {
            segments.extend(path.split('/'));
        }
    }
    if !call.query.is_empty() {
        url.query_pairs_mut().extend_pairs(call.query.iter().map(|(k, v)| (*k, v.as_str())));
    }
    let mut headers: Vec<(&str, String)> = Vec::new();
    if call.body.is_some() {
        headers.push(("content-type", "application/json".to_owned()));
    }
    headers.extend(call.precondition.clone());
    let body = call.body.unwrap_or_default();
    if let Some(sdk) = signer {
        headers.extend(signature(sdk, &call.method, url.as_str(), &headers, &body).await?);
    }
    // A redirect would resend a signed request elsewhere, or a POST as a GET.
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .context("an HTTP client")?;
    let mut request = client.request(call.method, url.clone()).body(body);
    for (name, value) in &headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.map_err(|e| {
        // The innermost cause says it (`Connection refused`); the outer ones repeat the URL.
        let detail = anyhow::Error::new(e).chain().last().map(ToString::to_string).unwrap_or_default();
        Unreachable::NoAnswer { url: url.to_string(), detail }
    })?;
    let status = response.status();
    let etag = response.headers().get("etag").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let bytes = response.bytes().await.context("reading the answer")?;
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    Ok(Answer { status, etag, body })
}

/// The SigV4 headers (`authorization`, `x-amz-date`, the session token) for a request to API Gateway.
async fn signature(
    sdk: &SdkConfig,
    method: &Method,
    url: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Result<Vec<(&'static str, String)>> {
    let provider = sdk.credentials_provider().ok_or_else(|| Unreachable::NoCredentials("none configured".into()))?;
    let credentials = provider.provide_credentials().await.map_err(|e| Unreachable::NoCredentials(e.to_string()))?;
    let region = sdk.region().map(ToString::to_string).ok_or_else(|| anyhow!("no AWS region"))?;
    let identity = credentials.into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(&region)
        .name("execute-api")
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .context("signing parameters")?
        .into();
    let signable = SignableRequest::new(
        method.as_str(),
        url,
        headers.iter().map(|(k, v)| (*k, v.as_str())),
        SignableBody::Bytes(body),
    )
    .context("a request to sign")?;
    let (instructions, _) = sign(signable, &params).context("signing")?.into_parts();
    let (signed, _) = instructions.into_parts();
    Ok(signed.into_iter().map(|h| (h.name(), h.value().to_owned())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_become_the_api_s_requests() {
        let read = Action::Read { name: "todo-1".into(), from: Some(3), limit: None, backward: true };
        let call = read.call().unwrap();
        assert_eq!((call.method, call.path.as_str()), (Method::GET, "/todo-1"));
        assert_eq!(call.query, [("from", "3".to_owned()), ("direction", "backward".to_owned())]);
        let append = Action::Append { name: "t".into(), events: r#"{"type":"A"}"#.into(), expect: None, new: true };
        let call = append.call().unwrap();
        assert_eq!(call.precondition, Some(("if-none-match", "*".to_owned())));
        assert_eq!(call.body.as_deref(), Some(br#"{"type":"A"}"#.as_slice()));
        let delete = Action::Delete { name: "t".into(), expect: 4 }.call().unwrap();
        assert_eq!((delete.method, delete.precondition), (Method::DELETE, Some(("if-match", "\"4\"".to_owned()))));
        let snapshot = Action::Snapshot { name: "t".into(), state: "{}".into(), expect: 1 }.call().unwrap();
        assert_eq!(snapshot.path, "/t/snapshot");
        let list = Action::List { prefix: "order-".into(), after: Some("order-9".into()), limit: Some(5) };
        let call = list.call().unwrap();
        assert_eq!((call.method, call.path.as_str()), (Method::GET, ""));
        let query = [("prefix", "order-".to_owned()), ("after", "order-9".to_owned()), ("limit", "5".to_owned())];
        assert_eq!(call.query, query);
        let too_many = Action::List { prefix: String::new(), after: None, limit: Some(101) }.call().unwrap_err();
        assert_eq!(too_many.to_string(), "--limit is 1 to 100");
        let across = Action::AppendAcross { request: r#"{"appends":[]}"#.into() }.call().unwrap();
        assert_eq!((across.method, across.path.as_str()), (Method::POST, ""));
        let get = Action::Metadata { name: "t".into(), set: None, expect: None }.call().unwrap();
        assert_eq!((get.method, get.path.as_str(), get.body), (Method::GET, "/t/metadata", None));
        let set = Action::Metadata { name: "t".into(), set: Some(r#"{"max_count":10}"#.into()), expect: Some(2) };
        let set = set.call().unwrap();
        assert_eq!((set.method, set.precondition), (Method::PUT, Some(("if-match", "\"2\"".to_owned()))));
    }

    #[test]
    fn bad_names_and_bodies_are_refused_before_anything_is_sent() {
        let slash = Action::State { name: "a/b".into() }.call().unwrap_err().to_string();
        assert!(slash.contains("'/' is not allowed"), "{slash}");
        for dots in [".", ".."] {
            assert!(Action::State { name: dots.into() }.call().is_err(), "{dots}");
        }
        let read = |limit| Action::Read { name: "t".into(), from: None, limit: Some(limit), backward: false };
        assert_eq!(read(0).call().unwrap_err().to_string(), "--limit is 1 to 1000");
        assert!(read(1000).call().is_ok());
        for bad in ["ftp://h/streams", "http://h/streams?x=1", "streams", "http://h/streams#f"] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
        assert!(base_url("https://api.example.com/streams").is_ok());
        let not_json = Action::Append { name: "t".into(), events: "{type".into(), expect: None, new: false };
        assert!(not_json.call().unwrap_err().to_string().starts_with("events is not JSON"));
    }
}
