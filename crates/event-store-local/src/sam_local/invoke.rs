//! `invoke`: one function's deployed artefact run once under `sam local invoke` with an event, and its answer.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::session::Session;
use super::template::read_template;
use crate::settings::Settings;

/// Window `invoke playback` plays when no event file is given: the last 15 minutes.
const PLAYBACK_WINDOW_MINUTES: i64 = 15;

/// What `invoke` runs: a function of template.yaml, by its short name (its `target/lambda/<name>/`).
pub struct Invocation {
    pub function: String,
    /// The event file; default `events/<function>.json` (for playback: the last 15 minutes).
    pub event: Option<PathBuf>,
}

/// The playback request `invoke playback` sends without an event file: the
/// last 15 minutes up to `now`, waiting for the watermark to pass `now`.
pub fn recent_playback(now: chrono::DateTime<chrono::Utc>, wait_seconds: u64) -> Value {
    let iso = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    json!({ "start": iso(now - chrono::Duration::minutes(PLAYBACK_WINDOW_MINUTES)), "end": iso(now), "wait_seconds": wait_seconds })
}

/// The error a function answered with, if its answer (sam's stdout) is one.
pub fn function_error(answer: &str) -> Option<String> {
    let value: Value = serde_json::from_str(answer.trim()).ok()?;
    let kind = value.get("errorType")?.as_str().unwrap_or("error");
    Some(format!("{kind}: {}", value.get("errorMessage").and_then(Value::as_str).unwrap_or_default()))
}

/// Runs the invocation; true when the function answered without an error.
pub async fn invoke(settings: &Settings, sam: &Path, root: &Path, invocation: Invocation) -> Result<bool> {
    let function = invocation.function.as_str();
    let template = read_template(root)?;
    let logical_id = template.function(function)?.logical_id.clone();
    let bootstrap = root.join("target/lambda").join(function).join("bootstrap");
    if !bootstrap.exists() {
        bail!("{} is missing: `make build` builds the functions (make invoke does it first)", bootstrap.display());
    }
    let event = match &invocation.event {
        Some(path) => Some(std::fs::canonicalize(path).with_context(|| format!("event file {}", path.display()))?),
        None if function == "playback" => None,
        None => {
            let path = root.join("events").join(format!("{function}.json"));
            Some(std::fs::canonicalize(&path).with_context(|| format!("no event given and no {}", path.display()))?)
        }
    };
    let session = Session::open(settings, &template).await?;
    let event = match event {
        Some(path) => path,
        None => {
            let wait = (settings.scan_interval.as_secs() * 4).max(30);
            let path = session.dir().join("playback.json");
            std::fs::write(&path, recent_playback(chrono::Utc::now(), wait).to_string())?;
            path
        }
    };
    eprintln!("== sam local invoke {logical_id} ({}) with {}", bootstrap.display(), event.display());
    let mut command = session.sam(sam, settings, &["invoke", &logical_id]);
    command.arg("--event").arg(&event).stdout(Stdio::piped());
    let started = Instant::now();
    let child = command.spawn().with_context(|| format!("starting {}", sam.display()))?;
    let output = tokio::select! {
        output = child.wait_with_output() => output,
        _ = crate::stack::shutdown_signal() => Err(std::io::Error::other("interrupted")),
    };
    session.close().await;
    let output = output?;
    let answer = String::from_utf8_lossy(&output.stdout);
    println!("{}", answer.trim());
    eprintln!("== {logical_id} answered in {:.1} s", started.elapsed().as_secs_f64());
    if !output.status.success() {
        bail!("sam local invoke failed ({})", output.status);
    }
    if let Some(error) = function_error(&answer) {
        eprintln!("the function answered with an error: {error}");
        return Ok(false);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_playback_is_the_last_15_minutes() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-25T10:00:00.250Z").unwrap().to_utc();
        let request = recent_playback(now, 30);
        assert_eq!(
            request,
            json!({ "start": "2026-11-25T09:45:00.250Z", "end": "2026-11-25T10:00:00.250Z", "wait_seconds": 30 })
        );
        let parsed: event_store::playback::PlaybackRequest = serde_json::from_value(request).unwrap();
        assert_eq!(parsed.wait_seconds, Some(30));
    }

    #[test]
    fn errors_answered_by_the_function_are_recognised() {
        let error = r#"{"errorType": "DynamoDbError", "errorMessage": "dynamodb UpdateItem: service error"}"#;
        assert_eq!(function_error(error).as_deref(), Some("DynamoDbError: dynamodb UpdateItem: service error"));
        assert_eq!(function_error(r#"{"status": "complete", "events": 5}"#), None);
        assert_eq!(function_error("not json"), None);
    }
}
