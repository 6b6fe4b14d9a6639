//! When a caught-up runner keeps following the complete log, ends, or hands
//! the partition to a continuation (pure; [`super::runner`] does the I/O).
//!
//! A runner follows while the log brings events, its partition's or others'
//! (delivered, parked, filtered out, copies), and ends once none came for
//! `SUBSCRIPTION_FOLLOW_SECONDS`. A first run that found none ends after its
//! first look, so at idle a tick's runner costs a request or two, not a
//! Lambda following for most of the minute; when events come again, the
//! awake scan's tick starts one within a pass. A continuation was handed the
//! partition because events came lately, so it follows from its start. Near
//! its deadline a runner that met events hands over (no gap between
//! runners); one that met none ends, so no chain outlives the traffic.

use std::time::{Duration, Instant};

/// What a caught-up runner does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Look at the watermark again after this long.
    Look(Duration),
    /// Give the partition up: nothing came for the follow period, or at all.
    End,
    /// Hand the partition to a continuation (the deadline is near).
    HandOver,
}

#[derive(Debug, Clone)]
pub struct Follow {
    follow: Duration,
    /// Events the run's rounds met so far, and when that last grew.
    met: usize,
    active_at: Option<Instant>,
}

impl Follow {
    pub(crate) fn new(follow: Duration, continuation: bool, now: Instant) -> Self {
        Self { follow, met: 0, active_at: continuation.then_some(now) }
    }

    /// After a look: `met`, the events the rounds have met so far; `near_deadline`, whether
    /// the run must stop now; `poll`, the time between looks.
    pub(crate) fn next(&mut self, met: usize, near_deadline: bool, poll: Duration, now: Instant) -> Next {
        if met > self.met {
            (self.met, self.active_at) = (met, Some(now));
        }
        let left = self.active_at.map_or(Duration::ZERO, |at| self.follow.saturating_sub(now.duration_since(at)));
        match (left.is_zero(), near_deadline) {
            (true, _) => Next::End,
            (false, true) if self.met == 0 => Next::End,
            (false, true) => Next::HandOver,
            (false, false) => Next::Look(poll.min(left)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FOLLOW: Duration = Duration::from_secs(10);
    const POLL: Duration = Duration::from_millis(250);

    #[test]
    fn a_first_run_that_met_nothing_ends_at_its_first_look() {
        let t0 = Instant::now();
        assert_eq!(Follow::new(FOLLOW, false, t0).next(0, false, POLL, t0), Next::End);
    }

    #[test]
    fn a_run_follows_while_events_come_and_ends_the_follow_period_after_the_last() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut follow = Follow::new(FOLLOW, false, t0);
        assert_eq!(follow.next(5, false, POLL, t0), Next::Look(POLL));
        assert_eq!(follow.next(5, false, POLL, at(9)), Next::Look(POLL), "within the period of the last");
        assert_eq!(follow.next(7, false, POLL, at(9)), Next::Look(POLL), "other partitions' events count too");
        let almost = at(19) - Duration::from_millis(100);
        assert_eq!(follow.next(7, false, POLL, almost), Next::Look(Duration::from_millis(100)), "not past the period");
        assert_eq!(follow.next(7, false, POLL, at(19)), Next::End);
    }

    #[test]
    fn near_the_deadline_a_run_that_met_events_hands_over_and_one_that_did_not_ends() {
        let t0 = Instant::now();
        let mut busy = Follow::new(FOLLOW, false, t0);
        assert_eq!(busy.next(3, true, POLL, t0), Next::HandOver);
        // A continuation follows from its start without having met anything itself...
        let mut handed = Follow::new(FOLLOW, true, t0);
        assert_eq!(handed.next(0, false, POLL, t0 + Duration::from_secs(1)), Next::Look(POLL));
        // ...but does not hand over again unless events came in its own run.
        assert_eq!(handed.next(0, true, POLL, t0 + Duration::from_secs(2)), Next::End);
        assert_eq!(handed.next(0, false, POLL, t0 + FOLLOW), Next::End, "and ends the period after its start");
    }
}
