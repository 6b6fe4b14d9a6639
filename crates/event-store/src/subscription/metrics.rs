//! Subscription lag as CloudWatch metrics, in the embedded metric format
//! ([`crate::metrics`]).
//!
//! Metric `SubscriptionLagSeconds` (the watermark's complete end less the
//! slowest partition's position), once per subscription (dimension
//! `Subscription`) and once without dimensions: the largest of all, 0 with
//! no subscription, which the template's alarm watches. The tick writes
//! one every minute, so a missing value means the tick itself is not running.

use super::TickSummary;
use crate::metrics::seconds_line;

pub const LAG_METRIC: &str = "SubscriptionLagSeconds";

/// Arrival to delivery of the oldest event of a runner's round, per
/// subscription (dimension `Subscription`), written by runners as they
/// deliver: what a consumer waits, beside the lag (which is how far behind
/// the log a subscription is, also when nothing arrives).
pub const DELIVERY_LATENCY_METRIC: &str = "DeliveryLatencySeconds";

/// Writes the line to stdout (where Lambda's log takes it) when a namespace is set.
pub(crate) fn write_delivery_latency(namespace: Option<&str>, subscription: &str, latency_ms: i64, now_ms: i64) {
    if let Some(namespace) = namespace {
        println!("{}", delivery_latency_line(namespace, subscription, latency_ms, now_ms));
    }
}

/// The EMF line for one round's arrival-to-delivery time.
pub(crate) fn delivery_latency_line(namespace: &str, subscription: &str, latency_ms: i64, now_ms: i64) -> String {
    let seconds = latency_ms as f64 / 1000.0;
    seconds_line(namespace, DELIVERY_LATENCY_METRIC, seconds, &[("Subscription", subscription)], now_ms)
}

/// The EMF lines for a tick's lags, at `now_ms`.
pub fn lag_lines(namespace: &str, tick: &TickSummary, now_ms: i64) -> Vec<String> {
    let seconds = |ms: i64| ms as f64 / 1000.0;
    let mut lines = Vec::new();
    let mut largest = 0;
    for sub in &tick.subscriptions {
        let Some(lag) = sub.lag_ms else { continue };
        largest = largest.max(lag);
        let name = sub.subscription.name.as_str();
        lines.push(seconds_line(namespace, LAG_METRIC, seconds(lag), &[("Subscription", name)], now_ms));
    }
    lines.push(seconds_line(namespace, LAG_METRIC, seconds(largest), &[], now_ms));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::readers::subscriptions::spec::{NewSubscription, Target};
    use crate::subscription::SubscriptionStatus;
    use serde_json::{json, Value};

    #[test]
    fn one_line_per_subscription_and_one_for_the_alarm() {
        let sub = |name: &str, lag_ms| SubscriptionStatus {
            subscription: NewSubscription {
                name: name.into(),
                target: Some(Target::Kinesis("s".into())),
                ..Default::default()
            }
            .validate(1_000)
            .unwrap(),
            lag_ms,
            partitions: Vec::new(),
        };
        let tick =
            TickSummary { subscriptions: vec![sub("a", Some(90_000)), sub("b", Some(1_500))], ..Default::default() };
        let lines: Vec<Value> =
            lag_lines("EventStore/test", &tick, 7).iter().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["Subscription"], "a");
        assert_eq!(lines[0][LAG_METRIC], 90.0);
        assert_eq!(lines[0]["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["Subscription"]]));
        assert_eq!(lines[2][LAG_METRIC], 90.0, "the alarm's metric: the largest lag");
        assert_eq!(lines[2]["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([[]]));
        assert_eq!(lines[2]["_aws"]["Timestamp"], 7);
        let delivered: Value = serde_json::from_str(&delivery_latency_line("EventStore/test", "a", 1_250, 9)).unwrap();
        assert_eq!(
            (delivered[DELIVERY_LATENCY_METRIC].as_f64(), delivered["Subscription"].as_str()),
            (Some(1.25), Some("a"))
        );
        assert_eq!(delivered["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([["Subscription"]]));
        let idle = lag_lines("n", &TickSummary::default(), 7);
        assert_eq!(idle.len(), 1, "no subscription: still a 0, so a silent tick is what alarms");
    }
}
