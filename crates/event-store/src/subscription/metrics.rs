//! Subscription lag as CloudWatch metrics, in the embedded metric format
//! ([`crate::metrics`]).
//!
//! Metric `SubscriptionLagSeconds` (the watermark's complete end less the
//! slowest partition's position), once per subscription (dimension
//! `Subscription`) and once without dimensions: the largest of all, 0 with
//! no subscription, which the template's alarm watches. The tick writes
//! one every minute, so a missing value means the tick itself is not running.
//!
//! Metric `PartitionLagSeconds` (dimension `Subscription`): every
//! partition's lag, as the values of one metric (EMF value arrays, 100 a
//! line), so CloudWatch keeps their distribution (p50, p99, maximum) per
//! subscription without a metric per partition (1,024 partitions would be
//! 1,024 custom metrics).

use super::TickSummary;
use crate::metrics::{seconds_line, seconds_values_line, MAX_EMF_VALUES};

pub const LAG_METRIC: &str = "SubscriptionLagSeconds";
/// Each partition's lag, per subscription.
pub const PARTITION_LAG_METRIC: &str = "PartitionLagSeconds";

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
        let lags: Vec<f64> = sub.partitions.iter().filter_map(|p| p.lag_ms).map(seconds).collect();
        for values in lags.chunks(MAX_EMF_VALUES) {
            lines.push(seconds_values_line(namespace, PARTITION_LAG_METRIC, values, &[("Subscription", name)], now_ms));
        }
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
            skew: None,
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
        // Each partition's lag: values of one metric, 100 a line.
        let partitions: Vec<_> = (0..250)
            .map(|p| crate::subscription::PartitionStatus {
                partition: p,
                lag_ms: Some(i64::from(p) * 10),
                ..Default::default()
            })
            .collect();
        let wide = SubscriptionStatus { partitions, ..sub("w", Some(2_490)) };
        let lines: Vec<Value> = lag_lines("n", &TickSummary { subscriptions: vec![wide], ..Default::default() }, 7)
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let values: Vec<&Value> = lines.iter().filter(|l| l.get(PARTITION_LAG_METRIC).is_some()).collect();
        assert_eq!(
            values.iter().map(|l| l[PARTITION_LAG_METRIC].as_array().unwrap().len()).collect::<Vec<_>>(),
            [100, 100, 50]
        );
        assert_eq!(values[2][PARTITION_LAG_METRIC][49], 2.49);
        assert!(values.iter().all(|l| l["Subscription"] == "w"));
        let idle = lag_lines("n", &TickSummary::default(), 7);
        assert_eq!(idle.len(), 1, "no subscription: still a 0, so a silent tick is what alarms");
    }
}
