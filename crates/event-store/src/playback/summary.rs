//! What a playback run reports: to its caller when it ends ([`PlaybackSummary`]),
//! and to an observer while it plays ([`Progress`]).

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// How a run ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Everything up to `end` is on the stream.
    #[default]
    Complete,
    /// The rest was handed to an asynchronous continuation.
    Continued,
    /// `end` is past the watermark (after waiting `wait_seconds`): nothing played.
    Incomplete,
    /// A checkpoint says this run already finished (send `restart: true` to play again).
    AlreadyDone,
    /// Another run of this id holds its lease (until `busy_until`): nothing played.
    Busy,
    /// The chain of continuations reached `MAX_CONTINUATIONS`: the same request again goes on.
    Stopped,
}

/// What one invocation played back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaybackSummary {
    pub id: String,
    pub status: Status,
    pub start: String,
    pub end: String,
    /// The completeness watermark when the run began.
    pub watermark: Option<String>,
    /// Events the scan moved after the watermark had passed them (all time; see docs/http-api.md, late events).
    pub late_events: u64,
    /// Non-empty slots this run read (from the slot index).
    pub slots: usize,
    pub events: usize,
    /// Events skipped by the filter or the selection.
    pub filtered_out: usize,
    /// Events of keys another of the window's parallel runs plays (passed over unopened).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub other_keys: usize,
    pub first_event: Option<String>,
    pub last_event: Option<String>,
    /// `Query` requests for events, and for the slot index.
    pub queries: usize,
    pub index_queries: usize,
    pub put_requests: usize,
    /// Kinesis records put (an aggregated record carries many events).
    pub kinesis_records: usize,
    /// Records sent again: refused by Kinesis, or found not stored after an ambiguous failure.
    pub resent: usize,
    /// Requests that failed ambiguously (5xx, timeout) and were checked against the stream.
    pub checked_requests: usize,
    /// Copies of an accepted event (same envelope id) skipped: load stored it twice after an ambiguous failure.
    pub duplicates_dropped: usize,
    /// Items in the event table that could not be decoded (skipped, logged).
    pub unreadable: usize,
    /// Events whose played record would be over Kinesis' 1 MiB: a marker
    /// with their place in the event table was put instead (see [`crate::log::record`]).
    pub oversized: usize,
    /// When the lease of the run that holds this id runs out (status `busy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_until: Option<String>,
    /// The playback sequence number the next record would get.
    pub next_seq: u64,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One non-empty slot played back (possibly in part, when a run stopped inside it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SlotPlayed {
    pub slot: i64,
    pub first_event: i64,
    pub count: usize,
}

/// What a run tells an observer (the local CLI draws its progress bar from these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The non-empty slots this run will read.
    Planned {
        slots: usize,
    },
    Slot(SlotPlayed),
}

pub type ProgressObserver = Arc<dyn Fn(&Progress) + Send + Sync>;

impl PlaybackSummary {
    /// One playback's runs added up (the first run's window is the whole window; the last run's status counts).
    pub fn total(runs: &[PlaybackSummary]) -> PlaybackSummary {
        let mut total = runs.first().cloned().unwrap_or_default();
        for s in runs.iter().skip(1) {
            total.slots += s.slots;
            total.events += s.events;
            total.filtered_out += s.filtered_out;
            total.other_keys += s.other_keys;
            total.queries += s.queries;
            total.index_queries += s.index_queries;
            total.put_requests += s.put_requests;
            total.kinesis_records += s.kinesis_records;
            total.resent += s.resent;
            total.checked_requests += s.checked_requests;
            total.duplicates_dropped += s.duplicates_dropped;
            total.unreadable += s.unreadable;
            total.oversized += s.oversized;
            total.first_event = total.first_event.or_else(|| s.first_event.clone());
            total.last_event = s.last_event.clone().or(total.last_event);
            total.next_seq = s.next_seq;
            total.status = s.status;
        }
        total
    }
}

impl PlaybackSummary {
    /// The runs of one window played together (`--parallel`, each its total):
    /// added up, with the status that needs a hand first (any run not
    /// played leaves the window not played).
    pub fn together(parts: &[PlaybackSummary]) -> PlaybackSummary {
        let mut total = PlaybackSummary::total(parts);
        // Every run reads the window's slots (the slot index names them): not N times as many slots.
        total.slots = parts.iter().map(|p| p.slots).max().unwrap_or(0);
        if let (Some(first), true) = (parts.first(), parts.len() > 1) {
            // The runs' ids are the window's with -<p>of<N>: named together as -*of<N>.
            let base = first.id.rsplit_once('-').map_or(first.id.as_str(), |(base, _)| base);
            total.id = format!("{base}-*of{}", parts.len());
        }
        let not_played = [Status::Incomplete, Status::Busy, Status::Stopped];
        total.status = match parts.iter().find(|p| not_played.contains(&p.status)) {
            Some(part) => part.status,
            None if parts.iter().all(|p| p.status == Status::AlreadyDone) => Status::AlreadyDone,
            None => Status::Complete,
        };
        total.first_event = parts.iter().filter_map(|p| p.first_event.clone()).min();
        total.last_event = parts.iter().filter_map(|p| p.last_event.clone()).max();
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_playbacks_runs_add_up_and_the_last_ones_status_counts() {
        let first = PlaybackSummary {
            status: Status::Continued,
            events: 3,
            slots: 2,
            first_event: Some("a".into()),
            last_event: Some("b".into()),
            ..Default::default()
        };
        let last = PlaybackSummary { status: Status::Complete, events: 4, slots: 1, next_seq: 7, ..Default::default() };
        let total = PlaybackSummary::total(&[first, last]);
        assert_eq!((total.status, total.events, total.slots, total.next_seq), (Status::Complete, 7, 3, 7));
        assert_eq!((total.first_event.as_deref(), total.last_event.as_deref()), (Some("a"), Some("b")));
        assert_eq!(PlaybackSummary::total(&[]).events, 0);
    }

    #[test]
    fn parallel_runs_add_up_and_any_not_played_leaves_the_window_not_played() {
        let part = |status, events, first: &str| PlaybackSummary {
            id: format!("abc-{first}of2"),
            slots: 4,
            status,
            events,
            first_event: Some(first.into()),
            last_event: Some(first.into()),
            ..Default::default()
        };
        let done = [part(Status::Complete, 3, "b"), part(Status::AlreadyDone, 2, "a")];
        let total = PlaybackSummary::together(&done);
        assert_eq!((total.status, total.events, total.slots), (Status::Complete, 5, 4));
        assert_eq!(total.id, "abc-*of2");
        assert_eq!((total.first_event.as_deref(), total.last_event.as_deref()), (Some("a"), Some("b")));
        let busy = PlaybackSummary::together(&[part(Status::Complete, 1, "a"), part(Status::Busy, 0, "b")]);
        assert_eq!(busy.status, Status::Busy);
        let before = PlaybackSummary::together(&[part(Status::AlreadyDone, 1, "a"), part(Status::AlreadyDone, 1, "b")]);
        assert_eq!(before.status, Status::AlreadyDone);
    }
}
