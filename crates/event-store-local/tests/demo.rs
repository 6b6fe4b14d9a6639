//! `make demo` in small: the real binary, end to end, on its own emulator.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use common::{figure, run_demo};
use event_store_emulator::{answers, free_port};

/// With no override: the template's settings, as a deployment runs them (the
/// scan on its minute schedule, completing slots because the pump wakes it; the
/// subscription's runners started by the ticks the awake scan starts).
#[test]
fn a_small_demo_stores_and_plays_back_every_event_in_order() {
    let (emulator_port, http_port) = (free_port(), free_port());
    let (status, out) = run_demo(
        &[
            ("N", "200".into()),
            ("C", "10".into()),
            ("EMULATOR_PORT", emulator_port.to_string()),
            ("PORT", http_port.to_string()),
            ("STAGE", "demotest".into()),
        ],
        Duration::from_secs(240),
    );
    assert!(status.success(), "demo failed:\n{out}");
    assert_eq!(figure(&out, "events sent"), 200);
    // Every pixel hit, plus every event the demo appended to its entity
    // streams (the relay puts those on the same event stream).
    let entity_events = figure(&out, "entity events");
    assert!(entity_events > 0, "the demo appends to entity streams:\n{out}");
    assert_eq!(figure(&out, "events stored"), 200 + entity_events);
    assert_eq!(figure(&out, "events played back"), 200 + entity_events);
    assert_eq!(figure(&out, "events subscribed"), 200 + entity_events, "the subscription, woken by the scan");
    assert!(
        out.contains("scan every 60.0 s"),
        "the template's ScanRate, no override:
{out}"
    );
    assert_eq!(figure(&out, "lost"), 0);
    assert_eq!(figure(&out, "out of order"), 0);
    // The first half went to S3 before the playback, which read across both tiers, and the chain verifies.
    let archived = figure(&out, "archived");
    assert!(archived > 0 && archived < 200 + entity_events, "{archived} of the events archived:\n{out}");
    let line = out.lines().find(|l| l.starts_with("archived")).unwrap();
    let objects = line.split("(in ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap();
    assert!(line.contains(&format!("hash chain: {objects} entries verified)")) && objects != "0", "{line}");
    assert!(!out.contains("BROKEN"), "{out}");
    assert!(out.contains("RESULT: OK"));
    assert!(!answers(emulator_port), "the demo stopped the emulator it started");
    assert!(!answers(http_port), "and its pixel server");
}
