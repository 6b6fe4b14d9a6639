//! What every connection shares: the seeded draw of faults, the counts, and the way upstream with its locks.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, CONTENT_LENGTH, HOST};
use hyper::{Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;

use crate::faults::Fault;
use crate::Applied;

pub(crate) struct State {
    pub(crate) upstream: String,
    pub(crate) client: Client<HttpConnector, Full<Bytes>>,
    pub(crate) rate: f64,
    pub(crate) only: Option<&'static [Fault]>,
    pub(crate) rng: Mutex<fastrand::Rng>,
    pub(crate) counts: Mutex<BTreeMap<String, u64>>,
    pub(crate) applied: Mutex<Vec<Applied>>,
    /// Held while a request is upstream, when requests go one at a time.
    pub(crate) one_at_a_time: Option<tokio::sync::Mutex<()>>,
    /// Held while a request is upstream, exclusively by a `TransactWriteItems`,
    /// when transactions go alone.
    pub(crate) transactions_alone: Option<tokio::sync::RwLock<()>>,
    /// Partition keys whose `PutRecords` entries are refused (a hot shard), whatever the rate.
    pub(crate) refused_keys: Mutex<HashSet<String>>,
    /// Every KMS request answered as a disabled key is (moto's own disabled keys still work).
    pub(crate) kms_disabled: std::sync::atomic::AtomicBool,
}

impl State {
    pub(crate) fn count(&self, key: &str) {
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(key.to_owned()).or_default() += 1;
        }
    }

    /// The fault for the next request, if any, and a random number for its details.
    pub(crate) fn draw(&self, faults: &[Fault]) -> (Option<Fault>, u64) {
        let Ok(mut rng) = self.rng.lock() else { return (None, 0) };
        if faults.is_empty() {
            return (None, 0);
        }
        let hit = rng.f64() < self.rate;
        let pick = rng.usize(..faults.len().max(1));
        let detail = rng.u64(..);
        (if hit { faults.get(pick).copied() } else { None }, detail)
    }

    pub(crate) async fn forward(
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

#[cfg(test)]
mod tests {
    use hyper_util::rt::TokioExecutor;

    use super::*;
    use crate::faults::{applicable, Service};

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
}
