//! Ends a test binary whose test has hung, with what the emulators were doing.
//!
//! `cargo test` has no time limit of its own: a test waiting on a request an
//! emulator never answers would wait until CI's limit cuts the whole run off,
//! printing nothing about where it stood. A watchdog started with a test's
//! emulators ends the binary after `TEST_WATCHDOG_SECS` (default 900, far
//! above the slowest test) and prints the test's name, the emulators'
//! stderr and, for moto, every one of its threads' stacks.

use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use crate::process::Diagnostics;

const DEFAULT_LIMIT: Duration = Duration::from_secs(900);

/// Fires unless dropped (with the test's emulators) within its limit.
pub struct Watchdog {
    _alive: mpsc::Sender<()>,
}

impl Watchdog {
    /// Watches the test running on this thread (the test harness names its
    /// threads after the tests).
    pub fn start(emulators: Vec<Diagnostics>) -> Self {
        let limit = std::env::var("TEST_WATCHDOG_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(DEFAULT_LIMIT, Duration::from_secs);
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        let (alive, done) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if done.recv_timeout(limit) == Err(RecvTimeoutError::Timeout) {
                // Straight to stderr: the harness's capture of the test's output dies with the process.
                let mut stderr = std::io::stderr().lock();
                let _ = writeln!(
                    stderr,
                    "\n{test}: still running after {} s (TEST_WATCHDOG_SECS); ending the tests",
                    limit.as_secs()
                );
                for emulator in &emulators {
                    let _ = writeln!(stderr, "{}", emulator.report());
                    // `exit` runs no destructors: the emulators would outlive the tests.
                    emulator.stop();
                }
                std::process::exit(124);
            }
        });
        Self { _alive: alive }
    }
}
