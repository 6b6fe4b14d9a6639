//! Running the real `event-store-local` binary (its demo report, the local
//! stack) and the processes a test starts beside it.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use event_store_emulator::answers;

/// A child process stopped when the test ends: SIGTERM first, so it can stop cleanly.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        event_store_emulator::stop(&mut self.0, Duration::from_secs(10));
    }
}

/// The SDK's configuration for the emulator at `endpoint`, with dummy credentials.
pub async fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new("local", "local", None, None, "test"))
        .load()
        .await
}

pub fn wait_for_port(port: u16, what: &str) {
    let started = Instant::now();
    while !answers(port) {
        assert!(started.elapsed() < Duration::from_secs(60), "{what} did not start on port {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `event-store-local local` (stage `stage`) on the emulator at `emulator_port`, its pixel server on
/// `http_port`, scanning every second; stopped when dropped.
pub fn start_local_stack(emulator_port: u16, http_port: u16, stage: &str, extra: &[(&str, &str)]) -> Process {
    let mut command = Command::new(env!("CARGO_BIN_EXE_event-store-local"));
    command
        .arg("local")
        .env("EMULATOR_PORT", emulator_port.to_string())
        .env("PORT", http_port.to_string())
        .env("SCAN_INTERVAL", "1")
        .env("STAGE", stage)
        .env_remove("AWS_ENDPOINT_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (name, value) in extra {
        command.env(name, value);
    }
    let stack = Process(command.spawn().unwrap());
    wait_for_port(http_port, "the local stack");
    stack
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `demo` with `env` on top of a clean environment for the SDK; returns its exit status and report.
pub fn run_demo(env: &[(&str, String)], limit: Duration) -> (ExitStatus, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_event-store-local"));
    command
        .arg("demo")
        .env("MOTO_SERVER", event_store_emulator::moto_server(&repo_root()))
        .env_remove("AWS_ENDPOINT_URL")
        // The template's schedules unless the test says otherwise (not the shell's).
        .env_remove("SCAN_INTERVAL")
        .env_remove("ARCHIVE_INTERVAL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    let output = wait_with_limit(Process(command.spawn().unwrap()), limit, "demo");
    let (status, out) = (output.status, String::from_utf8_lossy(&output.stdout).into_owned());
    println!("{out}");
    if !status.success() {
        // Its log, to tell why (the last lines: the demo logs warnings and errors only;
        // its progress lines say nothing the report does not).
        let log = String::from_utf8_lossy(&output.stderr);
        let lines: Vec<&str> = log.lines().filter(|l| !l.starts_with("   received ")).collect();
        println!("demo's log (last 60 lines):\n{}", lines[lines.len().saturating_sub(60)..].join("\n"));
        if let Some(path) = std::env::var_os("DEMO_LOG_FILE") {
            let _ = std::fs::write(path, &output.stderr);
        }
    }
    (status, out)
}

/// The process's output (stdout and stderr, if piped), or a panic (the
/// process stopped by PID) when it runs past `limit`.
pub fn wait_with_limit(mut process: Process, limit: Duration, what: &str) -> std::process::Output {
    let read = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = read(process.0.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = read(process.0.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = process.0.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < limit, "{what} did not finish in {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    std::process::Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// The first number after `label` on the report line that starts with it.
pub fn figure(out: &str, label: &str) -> u64 {
    let line = out.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label:?} line"));
    line[label.len()..].split_whitespace().next().unwrap().parse().unwrap()
}
