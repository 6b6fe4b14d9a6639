//! Cold starts, measured the way Lambda starts a function: a minimal Lambda
//! runtime API (the calls a runtime makes: `next`, `response`, `error`) on
//! 127.0.0.1, the function's x86_64 release binary spawned with
//! `AWS_LAMBDA_RUNTIME_API` pointing at it, and one event served.
//!
//! Written by hand because the AWS runtime interface emulator ships as a
//! container image / GitHub binary (neither reachable here), and
//! `cargo lambda watch` compiles and starts binaries itself, so it cannot
//! time a process from its first instruction.
//!
//! `cold_starts` runs it for each function against the bench's moto (the
//! median of `COLD_STARTS` runs), and `markdown` is their table in results.md.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use event_store_emulator::resources::{create_streams, create_tables, Names};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Cold starts per function (the median is reported).
pub(crate) const COLD_STARTS: usize = 5;

/// A function's own environment variables.
type Env<'a> = Vec<(&'a str, &'a str)>;

#[derive(Debug, Clone, Serialize)]
pub struct ColdStart {
    /// Process start to its first `next` call: the function's init.
    pub init_ms: f64,
    /// Process start to the response of its first invocation.
    pub first_response_ms: f64,
    /// Peak resident set (VmHWM) after the first invocation.
    pub peak_rss_mb: f64,
    /// `ok`, or the error the function reported.
    pub outcome: String,
}

#[derive(Default)]
struct State {
    served: bool,
    next_at: Option<Instant>,
    done_at: Option<Instant>,
    outcome: Option<String>,
}

async fn handle(
    request: Request<Incoming>,
    state: Arc<Mutex<State>>,
    done: Arc<Notify>,
    event: Bytes,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path().to_owned();
    let is_next = request.method() == hyper::Method::GET && path.ends_with("/runtime/invocation/next");
    if is_next {
        let first = state.lock().map(|mut s| !std::mem::replace(&mut s.served, true)).unwrap_or(false);
        if !first {
            // One invocation per process: later `next` calls wait until the process is killed.
            futures::future::pending::<()>().await;
        }
        if let Ok(mut s) = state.lock() {
            s.next_at = Some(Instant::now());
        }
        let deadline = event_store::time::now_ms() + 60_000;
        let response = Response::builder()
            .header("Lambda-Runtime-Aws-Request-Id", "bench-0001")
            .header("Lambda-Runtime-Deadline-Ms", deadline.to_string())
            .header("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:bench")
            .header("Lambda-Runtime-Trace-Id", "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=0")
            .body(Full::new(event))
            .unwrap_or_default();
        return Ok(response);
    }
    let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let outcome = if path.ends_with("/response") {
        "ok".to_owned()
    } else {
        format!("error: {}", String::from_utf8_lossy(&body).chars().take(300).collect::<String>())
    };
    if let Ok(mut s) = state.lock() {
        s.done_at.get_or_insert_with(Instant::now);
        s.outcome.get_or_insert(outcome);
    }
    done.notify_one();
    Ok(Response::builder().status(202).body(Full::new(Bytes::new())).unwrap_or_default())
}

/// Peak resident set of a process, from /proc (Linux), in MB.
fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Starts `binary` under the runtime API with `env`, serves it `event`, and
/// times its init and first invocation.
pub async fn measure(binary: &Path, env: &[(String, String)], event: Vec<u8>) -> Result<ColdStart> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let state = Arc::new(Mutex::new(State::default()));
    let done = Arc::new(Notify::new());
    let event = Bytes::from(event);
    let server = {
        let (state, done) = (state.clone(), done.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (state, done, event) = (state.clone(), done.clone(), event.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        handle(request, state.clone(), done.clone(), event.clone())
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
    };
    let started = Instant::now();
    let mut child = tokio::process::Command::new(binary)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("AWS_LAMBDA_RUNTIME_API", address.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} (cargo build --release first)", binary.display()))?;
    let finished = tokio::time::timeout(Duration::from_secs(60), done.notified()).await;
    let rss = child.id().and_then(peak_rss_mb);
    let _ = child.kill().await;
    server.abort();
    if finished.is_err() {
        bail!("{} did not answer its first invocation within 60 s", binary.display());
    }
    let s = state.lock().map_err(|_| anyhow::anyhow!("state lock"))?;
    let ms = |t: Option<Instant>| t.map_or(f64::NAN, |t| t.duration_since(started).as_secs_f64() * 1000.0);
    Ok(ColdStart {
        init_ms: ms(s.next_at),
        first_response_ms: ms(s.done_at),
        peak_rss_mb: rss.unwrap_or(f64::NAN),
        outcome: s.outcome.clone().unwrap_or_default(),
    })
}

/// Each function's cold start, the median of `COLD_STARTS` runs, against the bench's moto.
pub(crate) async fn cold_starts(
    root: &Path,
    sdk: &aws_config::SdkConfig,
    endpoint: &str,
) -> Result<Vec<(&'static str, ColdStart)>> {
    let names = Names::for_stack("bench-cold");
    create_tables(&aws_sdk_dynamodb::Client::new(sdk), &names).await?;
    create_streams(&aws_sdk_kinesis::Client::new(sdk), &names, 1).await?;
    // (function, sample event, its environment variables)
    let functions: [(&str, &str, Env); 4] = [
        ("load", "load.json", vec![("EVENT_STREAM", &names.event_stream), ("IP_SALT", "bench-salt-not-secret")]),
        (
            "pump",
            "pump.json",
            vec![("DYNAMO_BUFFER_TABLE", &names.buffer_table), ("DYNAMO_EVENT_TABLE", &names.event_table)],
        ),
        (
            "scan",
            "scan-segment.json",
            vec![
                ("DYNAMO_BUFFER_TABLE", &names.buffer_table),
                ("DYNAMO_EVENT_TABLE", &names.event_table),
                ("EVENT_STREAM", &names.event_stream),
            ],
        ),
        (
            "playback",
            "playback.json",
            vec![("DYNAMO_EVENT_TABLE", &names.event_table), ("PLAYBACK_STREAM", &names.playback_stream)],
        ),
    ];
    let mut out = Vec::new();
    for (name, event, vars) in functions {
        let mut env: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        for (k, v) in [
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "bench"),
            ("AWS_SECRET_ACCESS_KEY", "bench"),
            ("AWS_LAMBDA_FUNCTION_NAME", name),
            ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128"),
            ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST"),
            ("AWS_LAMBDA_LOG_STREAM_NAME", "bench"),
            ("AWS_LAMBDA_LOG_GROUP_NAME", "/aws/lambda/bench"),
        ] {
            env.push((k.to_string(), v.to_string()));
        }
        let payload = std::fs::read(root.join("events").join(event))?;
        let mut runs = Vec::new();
        for _ in 0..COLD_STARTS {
            runs.push(measure(&root.join("target/release").join(name), &env, payload.clone()).await?);
        }
        let median = |f: fn(&ColdStart) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        out.push((
            name,
            ColdStart {
                init_ms: median(|c| c.init_ms),
                first_response_ms: median(|c| c.first_response_ms),
                peak_rss_mb: median(|c| c.peak_rss_mb),
                outcome: runs.iter().find(|c| c.outcome != "ok").map_or("ok".into(), |c| c.outcome.clone()),
            },
        ));
    }
    Ok(out)
}

/// The cold starts' table in bench/results.md.
pub(crate) fn markdown(cold: &[(&str, ColdStart)]) -> String {
    let mut md = format!(
        "\nCold start of each x86_64 release binary under a minimal Lambda runtime API (median of {COLD_STARTS}; \
         absolute times, so noisy on a shared machine):\n\n| function | init ms | first response ms | peak RSS MB | outcome |\n|---|---|---|---|---|\n"
    );
    for (name, c) in cold {
        md.push_str(&format!(
            "| {name} | {:.1} | {:.1} | {:.1} | {} |\n",
            c.init_ms, c.first_response_ms, c.peak_rss_mb, c.outcome
        ));
    }
    md.push('\n');
    md
}
