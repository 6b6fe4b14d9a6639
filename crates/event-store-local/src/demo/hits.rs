//! The demo's pixel hits: sent over HTTP, and told apart by the run they belong to.

use std::time::Duration;

use bytes::Bytes;
use event_store::envelope::Envelope;
use futures::StreamExt;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub(crate) async fn send_hits(
    port: u16,
    run_id: &str,
    events: usize,
    (concurrency, rate): (usize, Option<f64>),
) -> (usize, usize) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let started = tokio::time::Instant::now();
    let results: Vec<bool> = futures::stream::iter(0..events)
        .map(|n| {
            let client = client.clone();
            // Paced: hit n goes out n / rate seconds after the first.
            let at = rate.map(|rate| started + Duration::from_secs_f64(n as f64 / rate.max(0.001)));
            let uri = format!(
                "http://127.0.0.1:{port}/track.gif?EntityId=visitor-{}&page=%2Fpage-{}&n={n}&run={run_id}",
                n % 25,
                n % 7
            );
            async move {
                if let Some(at) = at {
                    tokio::time::sleep_until(at).await;
                }
                let Ok(uri) = uri.parse::<hyper::Uri>() else { return false };
                match client.get(uri).await {
                    Ok(response) => {
                        let gif = response.headers().get("content-type").is_some_and(|v| v == "image/gif");
                        let ok = response.status() == hyper::StatusCode::OK && gif;
                        let body = response.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0);
                        ok && body == event_store::load::PIXEL.len()
                    }
                    Err(_) => false,
                }
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let accepted = results.iter().filter(|ok| **ok).count();
    (accepted, events - accepted)
}

/// The run an event belongs to: a pixel hit's `run` parameter, an entity event's `metadata.run`.
pub(crate) fn run_of(envelope: &Envelope) -> Option<&str> {
    let entity = || envelope.body.as_ref()?.get("metadata")?.get("run")?.as_str();
    envelope.query.get("run").and_then(|v| v.first()).map(String::as_str).or_else(entity)
}
