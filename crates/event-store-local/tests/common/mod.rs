//! Running the real `event-store-local demo` binary and reading its report.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

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
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("demo did not finish in {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    println!("{out}");
    (status, out)
}

/// The first number after `label` on the report line that starts with it.
pub fn figure(out: &str, label: &str) -> u64 {
    let line = out.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label:?} line"));
    line[label.len()..].split_whitespace().next().unwrap().parse().unwrap()
}
