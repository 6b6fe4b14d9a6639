//! Counters for the status line and the demo report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[derive(Debug, Default)]
pub struct Stats {
    /// Events accepted: pixel hits, posted events and entity appends.
    pub received: AtomicU64,
    /// Records written to the buffer table by pump.
    pub buffered: AtomicU64,
    /// Items moved from the buffer to the event table by scan.
    pub moved: AtomicU64,
    /// Records seen on the playback stream.
    pub played_back: AtomicU64,
    /// Events delivered by subscriptions.
    pub delivered: AtomicU64,
    last_buffered: Mutex<Option<Instant>>,
    last_moved: Mutex<Option<Instant>>,
}

impl Stats {
    pub fn add_buffered(&self, n: u64) {
        if n > 0 {
            self.buffered.fetch_add(n, Ordering::Relaxed);
            if let Ok(mut t) = self.last_buffered.lock() {
                *t = Some(Instant::now());
            }
        }
    }

    pub fn add_moved(&self, n: u64) {
        if n > 0 {
            self.moved.fetch_add(n, Ordering::Relaxed);
            if let Ok(mut t) = self.last_moved.lock() {
                *t = Some(Instant::now());
            }
        }
    }

    pub fn add_delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Ordering::Relaxed);
    }

    pub fn last_buffered(&self) -> Option<Instant> {
        self.last_buffered.lock().ok().and_then(|t| *t)
    }

    pub fn last_moved(&self) -> Option<Instant> {
        self.last_moved.lock().ok().and_then(|t| *t)
    }

    pub fn line(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "received {} | buffered {} | moved {} | played back {} | delivered by subscriptions {}",
            get(&self.received),
            get(&self.buffered),
            get(&self.moved),
            get(&self.played_back),
            get(&self.delivered)
        )
    }
}
