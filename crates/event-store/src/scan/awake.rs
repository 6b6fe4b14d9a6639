//! The scan's awake run (woken by the pump, [`crate::bookkeeping::awake`]):
//! a pass of every free segment every half second while records keep
//! being buffered, the subscriptions' tick whenever the watermark moved, and
//! the lease handed to a continuation near the deadline.

use std::time::{Duration, Instant, SystemTime};

use tracing::{info, warn};

use super::{Scan, ScanSummary};
use crate::bookkeeping::awake::{self, AwakeRun, Held};
use crate::error::Result;
use crate::invoke::continue_with;
use crate::time::{now_ms, remaining};

/// How often an awake run starts a pass. Each pass normally asks each shard
/// once (`GetRecords`): with the event source mapping's read a second, three
/// of the five reads a shard allows each second.
pub const AWAKE_INTERVAL: Duration = Duration::from_millis(500);

impl Scan {
    /// How long after the last want an awake run keeps passing: until a
    /// pass starts late enough to complete the wanted events' slot (a caught-up
    /// shard holds the watermark `WATERMARK_LAG_MS` behind a pass's start),
    /// and a slot more for the passes in flight.
    fn linger_ms(&self) -> i64 {
        (self.config.watermark_lag_ms + 2 * self.config.time_unit_ms) as i64 + AWAKE_INTERVAL.as_millis() as i64
    }

    /// An awake run: starts passes every half second (the segments whose
    /// last pass is over) while the last want is recent, renewing its lease
    /// before each; then gives the lease up and stops, unless a want came
    /// meanwhile (see [`awake`]). Near its deadline it hands the lease to a
    /// continuation of itself.
    pub(super) async fn stay_awake(&self, run: AwakeRun, deadline: SystemTime, lease_ms: i64) -> Result<ScanSummary> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        let linger = self.linger_ms();
        let mut summary = ScanSummary::default();
        let mut passes = 0u32;
        // The watermark the subscriptions were last told of.
        let mut told = None;
        // A first hop claims the lease (its waker only wanted it); a continuation holds it already.
        let now = now_ms();
        if run.hop == 0 && !awake::claim(dynamo, table, awake::SCAN, &run.owner, now + awake::LEASE_MS, now).await? {
            // The run holding it reads the want that started this one; writers need not wait for this one.
            awake::looked(dynamo, table, awake::SCAN, now).await?;
            info!("another run holds the awake lease: this one stops");
            return Ok(summary);
        }
        loop {
            let started = Instant::now();
            let now = now_ms();
            let Held::Mine { wanted_at } =
                awake::hold(dynamo, table, awake::SCAN, &run.owner, now + awake::LEASE_MS).await?
            else {
                info!(passes, "another run holds the awake lease: this one stops");
                return Ok(summary);
            };
            if !awake::keep_going(wanted_at, now, linger) {
                // Given up and the want read in one request: a want that came since goes on here.
                let latest = match awake::hold(dynamo, table, awake::SCAN, &run.owner, 0).await? {
                    Held::Mine { wanted_at } => wanted_at,
                    Held::Lost => None,
                };
                let now = now_ms();
                let again = awake::keep_going(latest, now, linger)
                    && awake::claim(dynamo, table, awake::SCAN, &run.owner, now + awake::LEASE_MS, now).await?;
                if !again {
                    info!(passes, "nothing wanted lately: the awake scan stops");
                    return Ok(summary);
                }
            }
            match self.start_passes(lease_ms).await {
                Ok(pass) => {
                    // The latest watermark, for the lag metric the run's end writes (not its first pass's).
                    summary.watermark_at_start = pass.watermark_at_start.or(summary.watermark_at_start);
                    summary.forked += pass.forked;
                    summary.busy += pass.busy;
                    if pass.watermark_at_start > told {
                        told = pass.watermark_at_start;
                        self.tell_subscriptions(told).await;
                    }
                }
                // The next pass tries again; the lease, renewed, keeps wakes from starting a second run.
                Err(err) => warn!(error = %err, "awake pass not started"),
            }
            passes += 1;
            if remaining(deadline) < self.config.deadline_margin + AWAKE_INTERVAL {
                return self.hand_over_awake(run, summary).await;
            }
            tokio::time::sleep(AWAKE_INTERVAL.saturating_sub(started.elapsed())).await;
        }
    }

    /// Starts the subscriptions' tick (through its tick-only alias, so this
    /// role can start nothing else there), which starts a runner for every
    /// partition that has none; runners following the log see the new
    /// watermark themselves. Best effort: without it, idle partitions wait
    /// for the tick's schedule.
    async fn tell_subscriptions(&self, watermark: Option<i64>) {
        let Some(subscriptions) = &self.subscriptions else { return };
        let tick = serde_json::json!({ "sealed": watermark });
        if let Err(err) = subscriptions.invoke_async(tick).await {
            warn!(error = %err, "subscriptions not told of the watermark: idle partitions wait for their tick");
        }
    }

    /// Near the deadline: a continuation of the awake run goes on under the
    /// same lease, unless the chain reached `MAX_CONTINUATIONS` (then the
    /// lease is given up, and the pump's next want starts a new run).
    async fn hand_over_awake(&self, run: AwakeRun, mut summary: ScanSummary) -> Result<ScanSummary> {
        let (dynamo, table) = (&self.dynamo, self.config.event_table.as_str());
        if run.hop >= self.config.max_continuations {
            warn!(hops = run.hop, "the awake chain reached MAX_CONTINUATIONS: its lease is given up");
            awake::hold(dynamo, table, awake::SCAN, &run.owner, 0).await?;
            summary.stopped = true;
            return Ok(summary);
        }
        let next = AwakeRun { hop: run.hop + 1, ..run };
        if let Err(err) = continue_with(self.invoker.as_ref(), &next.payload()).await {
            // Given up, so the next want starts a run at once.
            let _ = awake::hold(dynamo, table, awake::SCAN, &next.owner, 0).await;
            return Err(err);
        }
        summary.forked += 1;
        Ok(summary)
    }
}
