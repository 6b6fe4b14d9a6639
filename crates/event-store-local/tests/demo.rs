//! `make demo` in small: the real binary, end to end, on its own emulator.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use event_store_emulator::{answers, free_port, moto_server};

#[test]
fn a_small_demo_stores_and_plays_back_every_event_in_order() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (emulator_port, http_port) = (free_port(), free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_event-store-local"))
        .arg("demo")
        .env("N", "200")
        .env("C", "10")
        .env("SCAN_INTERVAL", "1")
        .env("EMULATOR_PORT", emulator_port.to_string())
        .env("PORT", http_port.to_string())
        .env("MOTO_SERVER", moto_server(&root))
        .env("STAGE", "demotest")
        .env_remove("AWS_ENDPOINT_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(240) {
            let _ = child.kill();
            panic!("demo did not finish in 240 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    println!("{out}");
    assert!(status.success(), "demo failed:\n{out}");
    let figure = |label: &str| -> u64 {
        let line = out.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label:?} line"));
        line[label.len()..].split_whitespace().next().unwrap().parse().unwrap()
    };
    assert_eq!(figure("events sent"), 200);
    assert_eq!(figure("events stored"), 200);
    assert_eq!(figure("events played back"), 200);
    assert_eq!(figure("lost"), 0);
    assert_eq!(figure("out of order"), 0);
    assert!(out.contains("RESULT: OK"));
    assert!(!answers(emulator_port), "the demo stopped the emulator it started");
    assert!(!answers(http_port), "and its pixel server");
}
