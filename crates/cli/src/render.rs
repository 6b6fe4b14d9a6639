//! `status` for a person: one screen, a line per part, the verdict last;
//! colour only when stdout is a terminal.

use std::fmt::Write;

use event_store::status::{human_ms, Status};

/// ANSI colours, or none.
pub struct Paint(pub bool);

impl Paint {
    fn paint(&self, code: &str, text: &str) -> String {
        if self.0 {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_owned()
        }
    }
    fn good(&self, text: &str) -> String {
        self.paint("32", text)
    }
    fn bad(&self, text: &str) -> String {
        self.paint("31", text)
    }
    fn dim(&self, text: &str) -> String {
        self.paint("2", text)
    }
}

pub fn status(label: &str, status: &Status, paint: &Paint) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{label}  {}", paint.dim(&status.at));
    let watermark = match (&status.watermark, status.watermark_lag_ms) {
        (Some(at), Some(lag)) => format!("{at}  {} behind now", human_ms(lag)),
        _ => paint.bad("none yet"),
    };
    let _ = writeln!(
        out,
        "watermark      {watermark}  {}",
        paint.dim(&format!("late {}  quarantined {}", status.late, status.quarantined))
    );
    if !status.ingest_per_minute.is_empty() {
        let total: u64 = status.ingest_per_minute.iter().sum();
        let minutes = status.ingest_per_minute.len();
        let _ = writeln!(
            out,
            "ingest         {}  {}",
            sparkline(&status.ingest_per_minute),
            paint.dim(&format!("{total} events in {minutes} min, per minute of arrival"))
        );
    }
    for shard in &status.shards {
        let state = match (&shard.oldest_unbuffered, shard.unknown) {
            (_, true) => paint.bad("unknown (empty answers short of the tip)"),
            (Some(from), _) => format!("{} behind: records from {from} not buffered", human_ms(shard.behind_ms)),
            (None, _) => paint.good("caught up"),
        };
        let last = shard.pumped_to.as_deref().map(|t| format!("  last buffered {t}")).unwrap_or_default();
        let _ = writeln!(out, "pump           {}  {state}{}", shard.shard, paint.dim(&last));
    }
    if status.subscriptions.is_empty() {
        let _ = writeln!(out, "subscriptions  {}", paint.dim("none"));
    }
    for sub in &status.subscriptions {
        let lag = sub.lag_ms.map(human_ms).unwrap_or_else(|| "-".into());
        let stopped = sub.partitions.iter().filter(|p| p.stopped.is_some()).count();
        let mut line = format!("{}  {}  lag {lag}  delivered {}", sub.name, sub.state, sub.delivered);
        if stopped > 0 {
            line.push_str(&paint.bad(&format!("  {stopped} partitions stopped")));
        }
        if sub.parked > 0 {
            line.push_str(&paint.bad(&format!("  {} parked", sub.parked)));
        }
        if let Some(skew) = sub.skew.filter(|s| s.ratio >= 2.0) {
            let hot =
                format!("  partition {} has {:.1}x the mean load (a hot key?)", skew.busiest_partition, skew.ratio);
            line.push_str(&paint.dim(&hot));
        }
        if let Some(to) = sub.rescaling_to {
            line.push_str(&format!("  rescaling {} -> {to} partitions", sub.partitions.len()));
        }
        let _ = writeln!(out, "subscription   {line}");
    }
    if status.playbacks.is_empty() {
        let _ = writeln!(out, "playbacks      {}", paint.dim("none in progress"));
    }
    for run in &status.playbacks {
        let state = if run.running { "running" } else { "waiting to resume" };
        let _ = writeln!(
            out,
            "playback       {}  {}..{}  {:.0} %  {} events  {state}",
            run.id,
            run.start,
            run.end,
            run.progress * 100.0,
            run.events
        );
    }
    for queue in &status.queues {
        let depth =
            if queue.messages == 0 { paint.good("empty") } else { paint.bad(&format!("{} messages", queue.messages)) };
        let _ = writeln!(out, "queue          {}  {depth}", queue.name);
    }
    if status.verdict.healthy {
        let _ = writeln!(out, "verdict        {}", paint.good("healthy"));
    } else {
        for (i, problem) in status.verdict.problems.iter().enumerate() {
            let head = if i == 0 { "verdict" } else { "" };
            let _ = writeln!(out, "{head:<15}{}", paint.bad(problem));
        }
    }
    out
}

/// One character per value, its height relative to the largest; a space for none at all.
pub fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let top = values.iter().copied().max().unwrap_or(0);
    values
        .iter()
        .map(|&v| match v {
            0 => ' ',
            // 1..=top onto the 8 bars (the largest is a full bar): anything above zero shows.
            v => BARS[((v * 8).div_ceil(top.max(1)) - 1).min(7) as usize],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use event_store::status::{QueueDepth, ShardStatus, Verdict};

    #[test]
    fn a_stalled_store_reads_line_by_line_with_the_verdict_last() {
        let status = Status {
            at: "2026-11-25T10:00:00Z".into(),
            watermark: Some("2026-11-25T09:45:00Z".into()),
            watermark_lag_ms: Some(900_000),
            shards: vec![ShardStatus {
                shard: "shardId-0".into(),
                oldest_unbuffered: Some("2026-11-25T09:45:01Z".into()),
                behind_ms: 899_000,
                ..Default::default()
            }],
            queues: vec![QueueDepth { name: "pump dead-letter queue".into(), url: "u".into(), messages: 2 }],
            verdict: Verdict { healthy: false, problems: vec!["watermark stalled".into(), "2 messages".into()] },
            ..Default::default()
        };
        let text = status_text(&status);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "watermark      2026-11-25T09:45:00Z  15 min behind now  late 0  quarantined 0");
        assert_eq!(lines[2], "pump           shardId-0  15 min behind: records from 2026-11-25T09:45:01Z not buffered");
        assert_eq!(lines[5], "queue          pump dead-letter queue  2 messages");
        assert_eq!(&lines[6..], ["verdict        watermark stalled", "               2 messages"]);
        assert!(!text.contains('\x1b'), "no colour unless asked");
    }

    #[test]
    fn a_sparkline_is_a_bar_per_minute_scaled_to_the_busiest() {
        assert_eq!(sparkline(&[0, 1, 4, 8, 2]), " ▁▄█▂");
        assert_eq!(sparkline(&[5, 5]), "██");
        assert_eq!(sparkline(&[0, 0]), "  ", "nothing moved: blank, not a floor");
        let status = Status { ingest_per_minute: vec![0, 3, 6], ..Default::default() };
        let text = status_text(&status);
        assert!(text.lines().any(|l| l == "ingest          ▄█  9 events in 3 min, per minute of arrival"), "{text}");
    }

    fn status_text(status: &Status) -> String {
        super::status("stack prod", status, &Paint(false))
    }
}
