//! The watermark as the demo watches it move, and each delivery's latency split where it passed the event.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use event_store::time::now_ms;

/// Records `(seen at, watermark)` each time the watermark moves, until aborted.
pub(super) async fn watch_watermark(
    dynamo: aws_sdk_dynamodb::Client,
    table: String,
    seen: Arc<Mutex<Vec<(i64, i64)>>>,
) {
    let mut last = None;
    loop {
        if let Ok(watermark) = event_store::bookkeeping::watermark::read(&dynamo, &table).await {
            if let Some(time) = watermark.time.filter(|t| Some(*t) != last) {
                last = Some(time);
                if let Ok(mut seen) = seen.lock() {
                    seen.push((now_ms(), time));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Splits each delivery's latency where the watermark first passed the
/// event's arrival: (arrival to complete, complete to delivered), ms each. An
/// event complete before the watermark was first seen counts from then.
pub fn breakdown(delivered: &[(i64, i64)], completions: &[(i64, i64)]) -> (Vec<i64>, Vec<i64>) {
    let mut completing = Vec::new();
    let mut delivering = Vec::new();
    for &(arrival, at) in delivered {
        let Some(&(complete_at, _)) = completions.iter().find(|(_, watermark)| *watermark > arrival) else { continue };
        let complete_at = complete_at.min(at);
        completing.push(complete_at - arrival);
        delivering.push(at - complete_at);
    }
    (completing, delivering)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_is_split_where_the_watermark_first_passed_its_event() {
        let completions = [(1_000, 500), (2_000, 1_500), (3_000, 2_500)];
        let (completing, delivering) = breakdown(&[(600, 2_300), (1_600, 3_100), (4_000, 4_200)], &completions);
        assert_eq!((completing, delivering), (vec![1_400, 1_400], vec![300, 100]), "the last is never seen complete");
    }
}
