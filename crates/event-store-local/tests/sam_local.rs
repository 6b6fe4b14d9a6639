//! `make invoke` for real: the deployed arm64 playback bootstrap, in a
//! container under `sam local invoke` (podman, qemu), plays back a window of
//! pixel hits from the local stack; the playback stream must hold every hit,
//! once, in the order it was sent.
//!
//! Needs what `make test` installs first: the SAM CLI in .venv, podman and the
//! locally built Lambda base image (`make tools-container`), and the arm64
//! bootstraps (`make test` builds them in the tools profile, `make build` in
//! release; either will do). With `DOCKER_HOST` set, that engine runs the
//! containers instead of podman, as with `make invoke`.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{repo_root, sdk_config, start_local_stack, wait_with_limit, Process};
use event_store::aggregation::deaggregate;
use event_store::envelope::Envelope;
use event_store::log::PlayedEvent;
use event_store_emulator::resources::read_stream;
use event_store_emulator::{free_port, moto_server, Emulator};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

const HITS: usize = 12;

#[tokio::test(flavor = "multi_thread")]
async fn sam_local_invoke_plays_back_every_pixel_hit_in_order_from_a_container() {
    let root = repo_root();
    let emulator = Emulator::start_on_free_port(&moto_server(&root)).unwrap();
    let _watchdog = event_store_emulator::watchdog::Watchdog::start(emulator.diagnostics().into_iter().collect());
    let http_port = free_port();
    let _stack = start_local_stack(emulator.port, http_port, "samtest", &[]);

    // The hits, one after another (a few ms apart, so their receive times are in send order).
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let first = chrono::Utc::now() - chrono::Duration::seconds(1);
    for hit in 0..HITS {
        let url = format!("http://127.0.0.1:{http_port}/track.gif?EntityId=sam-visitor&page=p{hit:02}");
        let response = client.get(url.parse().unwrap()).await.unwrap();
        assert_eq!(response.status(), 200);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let end = chrono::Utc::now() + chrono::Duration::seconds(1);

    let iso = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let event = std::env::temp_dir().join(format!("sam-local-playback-{}.json", std::process::id()));
    let request = serde_json::json!({ "start": iso(first), "end": iso(end), "wait_seconds": 60 });
    std::fs::write(&event, request.to_string()).unwrap();

    let started = Instant::now();
    let invoke = Process(
        Command::new(env!("CARGO_BIN_EXE_event-store-local"))
            .args(["invoke", "playback", "--event"])
            .arg(&event)
            .current_dir(&root)
            .env("SAM", root.join(".venv/bin/sam"))
            .env("EMULATOR_PORT", emulator.port.to_string())
            .env("STAGE", "samtest")
            .env_remove("AWS_ENDPOINT_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let output = wait_with_limit(invoke, Duration::from_secs(300), "invoke");
    let took = started.elapsed();
    let _ = std::fs::remove_file(&event);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    println!("sam local invoke PlaybackFunction took {:.1} s\n{stderr}", took.as_secs_f64());
    assert!(output.status.success(), "invoke failed:\nstdout: {stdout}\nstderr: {stderr}");
    // The artefact built for Lambda (arm64, target/lambda), mounted as the function's code.
    assert!(stderr.contains("target/lambda/playback/ as /var/task"), "{stderr}");
    let answer: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(answer["status"], "complete", "{answer}");
    assert_eq!(answer["events"], HITS, "{answer}");
    let scratch = stderr.lines().find_map(|l| l.strip_prefix("== working in ")).expect("the scratch directory");
    assert!(!std::path::Path::new(scratch).exists(), "invoke removed {scratch} (and the engine socket in it)");

    // What the container put on the playback stream: every hit, once, in order.
    let sdk = sdk_config(&emulator.endpoint).await;
    let played = read_played(&aws_sdk_kinesis::Client::new(&sdk), "event-store-samtest-playback").await;
    let pages: Vec<String> = played.iter().map(|(_, envelope)| envelope.query["page"][0].clone()).collect();
    let expected: Vec<String> = (0..HITS).map(|hit| format!("p{hit:02}")).collect();
    assert_eq!(pages, expected, "played in send order, each once");
    let seqs: Vec<u64> = played.iter().map(|(played, _)| played.playback_seq).collect();
    assert_eq!(seqs, (0..HITS as u64).collect::<Vec<_>>());
    assert!(played.windows(2).all(|w| w[0].0.event_ms <= w[1].0.event_ms), "event times never go back");
}

/// Every played event on the stream's shards, in stream order.
async fn read_played(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> Vec<(PlayedEvent, Envelope)> {
    let mut played = Vec::new();
    for (_, record) in read_stream(kinesis, stream).await.unwrap() {
        for (_, data) in deaggregate(record.partition_key().unwrap_or_default(), record.data().as_ref()).unwrap() {
            let event: PlayedEvent = serde_json::from_slice(&data).unwrap();
            let envelope: Envelope = serde_json::from_value(event.data.clone().unwrap()).unwrap();
            played.push((event, envelope));
        }
    }
    played
}
