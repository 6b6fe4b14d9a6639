//! The demo's projections (docs/projections.md): the entity streams' state, and the pixel hits
//! per page, kept by the stack from the log exactly once, read back over HTTP (`/views`, as a
//! client would) and checked against what the demo sent.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use event_store::log::Select;
use event_store::subscription::projections::NewProjection;
use event_store::subscription::{Manage, Subscriptions};
use event_store::time::format_ms;
use event_store::views::builtin::{Builtin, By, Fold};
use event_store::views::registry::Kind;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::entities::EntityRun;

/// The demo's two projections, by name.
pub(super) struct Views {
    /// `state` of the demo's entity streams (the Todo flow's, the Counter's, the accounts', the contended one's).
    pub(super) state: String,
    /// `count` of events by page.
    pub(super) pages: String,
}

/// What reading the views back found.
#[derive(Debug, Clone, Default)]
pub struct ViewsReport {
    pub streams_checked: usize,
    pub pages_checked: usize,
    pub problems: Vec<String>,
}

/// Creates the demo's projections, from `start` on (the window's start).
pub(super) async fn create(subscriptions: &Subscriptions, run_id: &str, start: i64) -> Result<Views> {
    let short = &run_id[..8];
    let views = Views { state: format!("entities-{short}"), pages: format!("pages-{short}") };
    let categories = ["todo", "counter", "account", "contended"].map(str::to_owned).to_vec();
    let select = Select { categories, ..Select::default() };
    for (name, kind, select) in [
        (&views.state, Kind::Builtin(Builtin::State { fold: Fold::Merge }), select),
        (&views.pages, Kind::Builtin(Builtin::Count { by: By::Page }), Select::default()),
    ] {
        println!("== creating projection {name}: {kind:?}, from now, 2 partitions");
        let new = NewProjection {
            name: name.clone(),
            kind,
            category: Vec::new(),
            select,
            partitions: Some(2),
            start: Some(format_ms(start)),
        };
        subscriptions.manage(Manage::CreateProjection(new)).await?;
    }
    Ok(views)
}

/// Reads both projections over HTTP until they hold what was sent (or a minute passes): each
/// entity stream at its last version, asked with `at_least_version` (the Todo flow's deleted, so gone), and each page's count,
/// summed over its days, equal to the hits sent for it (`/page-<n % 7>`). A view is read as a
/// client reads it, so the check waits on the answers, not on the runners' bookkeeping (the views
/// also take events no run id marks, as the todo's delete).
pub(super) async fn check(
    (subscriptions, port): (&Subscriptions, u16),
    views: &Views,
    (entities, hits): (&EntityRun, usize),
) -> Result<ViewsReport> {
    println!("== reading projections {} and {} over /views until they hold what was sent", views.state, views.pages);
    let started = std::time::Instant::now();
    loop {
        let report = read(port, views, (entities, hits)).await?;
        if report.problems.is_empty() || started.elapsed() > Duration::from_secs(60) {
            return with_why(report, subscriptions, views).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The views as they stand, against what was sent.
async fn read(port: u16, views: &Views, (entities, hits): (&EntityRun, usize)) -> Result<ViewsReport> {
    let mut report = ViewsReport::default();
    for (stream, events) in &entities.streams {
        // The Todo flow ends with the todo's delete: a deleted stream leaves a state view.
        let deleted = stream.starts_with("todo-");
        let last = events.saturating_sub(1);
        // Read as a client that just appended reads its own write: at least the version its last
        // append answered (the view waits for it a few seconds, else answers 503: asked again).
        let path = match deleted {
            true => format!("/views/{}/{stream}", views.state),
            false => format!("/views/{}/{stream}?at_least_version={last}", views.state),
        };
        let (status, answer) = get(port, &path).await?;
        report.streams_checked += 1;
        let version = answer["item"]["stream_version"].as_u64();
        let right = match deleted {
            true => status == 404,
            false => status == 200 && version == events.checked_sub(1),
        };
        if !right {
            let expected = if deleted { "gone (deleted)".into() } else { format!("at version {}", events - 1) };
            report.problems.push(format!("state view: {stream} answered {status} {version:?}, expected {expected}"));
        }
    }
    let (status, answer) = get(port, &format!("/views/{}?prefix=day/&limit=1000", views.pages)).await?;
    let mut counted: BTreeMap<String, i64> = BTreeMap::new();
    for item in answer["items"].as_array().into_iter().flatten() {
        let key = item["key"].as_str().unwrap_or_default();
        let page = key.splitn(3, '/').nth(2).unwrap_or_default().to_owned();
        *counted.entry(page).or_default() += item["count"].as_i64().unwrap_or(0);
    }
    let mut sent: BTreeMap<String, i64> = BTreeMap::new();
    for n in 0..hits {
        *sent.entry(format!("/page-{}", n % 7)).or_default() += 1;
    }
    report.pages_checked = sent.len();
    if status != 200 || counted != sent {
        let position = &answer["position"];
        report
            .problems
            .push(format!("pages view: answered {status}, counted {counted:?}, sent {sent:?} (position {position})"));
    }
    Ok(report)
}

/// A report with problems gets what the views' subscriptions parked, to say why.
async fn with_why(mut report: ViewsReport, subscriptions: &Subscriptions, views: &Views) -> Result<ViewsReport> {
    if !report.problems.is_empty() {
        for name in [&views.state, &views.pages] {
            let parked = subscriptions.manage(Manage::Parked { name: format!("view.{name}.v1") }).await?;
            report.problems.push(format!("{name}: parked {}", parked["parked"]));
        }
    }
    Ok(report)
}

/// `GET http://127.0.0.1:{port}{path}`: the status and the JSON answer.
async fn get(port: u16, path: &str) -> Result<(u16, Value)> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: hyper::Uri = format!("http://127.0.0.1:{port}{path}").parse()?;
    let response = tokio::time::timeout(Duration::from_secs(30), client.get(uri)).await.context("GET /views")??;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
}
