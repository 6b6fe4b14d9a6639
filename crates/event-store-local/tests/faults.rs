//! Nothing lost under the faults AWS really produces: the whole pipeline
//! (load → pump → scan → playback, the real binary) runs through a proxy that
//! answers 10 % of all requests with throttling, 500/503, partial batch
//! failures, connection resets or slow answers (seeded), and every event must
//! be in the event table exactly once and played back in order.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::time::Duration;

use common::{figure, repo_root, run_demo};
use event_store_emulator::{free_port, moto_server, Emulator};
use event_store_fault_proxy::{Config, FaultProxy};

#[tokio::test(flavor = "multi_thread")]
async fn the_pipeline_loses_and_duplicates_nothing_with_10_percent_of_requests_faulted() {
    let emulator = Emulator::start_on_free_port(&moto_server(&repo_root())).unwrap();
    let proxy = FaultProxy::start(&emulator.endpoint, Config { seed: 2026, rate: 0.10, only: None }).await.unwrap();
    let env = vec![
        ("N", "300".to_string()),
        ("C", "10".into()),
        ("SCAN_INTERVAL", "1".into()),
        ("EMULATOR_PORT", emulator.port.to_string()),
        ("PORT", free_port().to_string()),
        ("STAGE", "faults".into()),
        // The SDK's standard settings: every client goes through the proxy and retries more.
        ("AWS_ENDPOINT_URL", proxy.endpoint.clone()),
        ("AWS_MAX_ATTEMPTS", "10".into()),
    ];
    let (status, out) = tokio::task::spawn_blocking(move || run_demo(&env, Duration::from_secs(300))).await.unwrap();
    let counts = proxy.counts();
    println!("faults injected: {counts:?}");
    assert!(status.success(), "demo failed under faults:\n{out}");
    assert_eq!(figure(&out, "events sent"), 300);
    assert_eq!(figure(&out, "events stored"), 300);
    assert!(out.contains("events stored            300  (0 duplicates)"), "{out}");
    assert_eq!(figure(&out, "lost"), 0);
    assert_eq!(figure(&out, "out of order"), 0);
    assert!(figure(&out, "events played back") >= 300);

    let faults = counts.get("faults").copied().unwrap_or(0);
    let requests = counts["requests"];
    assert!(faults * 100 >= requests * 5 && faults * 100 <= requests * 15, "{faults} faults in {requests} requests");
    // Which kinds land where depends on the order of concurrent requests; many must have.
    let kinds = counts.keys().filter(|k| *k != "faults" && *k != "requests").count();
    assert!(kinds >= 6, "only {kinds} kinds of fault injected: {counts:?}");
}
