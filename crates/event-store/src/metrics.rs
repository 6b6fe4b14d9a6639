//! CloudWatch metrics in the embedded metric format: JSON lines in a
//! function's log that CloudWatch turns into metrics, so no `PutMetricData`
//! call (and no permission for it) is needed. Pure.
//!
//! Each metric is written by a scheduled run (the scan's, the subscriptions
//! tick) every period, so the alarms on them treat missing data as breaching:
//! silence means the schedule itself has stopped.

use serde_json::{json, Map, Value};

/// `now_ms` less the completeness watermark, written by every scheduled scan run.
pub const WATERMARK_LAG_METRIC: &str = "WatermarkLagSeconds";

/// Items the archiver found damaged and moved to the quarantine partition, per run (alarmed when any).
pub const QUARANTINED_METRIC: &str = "QuarantinedItems";

/// One EMF line: `metric` = `value` (seconds) in `namespace`, with
/// `dimensions` (name, value) (none: the metric without dimensions).
pub(crate) fn seconds_line(
    namespace: &str,
    metric: &str,
    value: f64,
    dimensions: &[(&str, &str)],
    now_ms: i64,
) -> String {
    line(namespace, (metric, "Seconds"), value, dimensions, now_ms)
}

/// The archiver's line: how many damaged items it quarantined.
pub(crate) fn quarantined_line(namespace: &str, items: u64, now_ms: i64) -> String {
    line(namespace, (QUARANTINED_METRIC, "Count"), items as f64, &[], now_ms)
}

/// One EMF line of many values of `metric` (seconds) at once: CloudWatch
/// keeps their distribution (percentiles, maximum, count) under one metric,
/// at most [`MAX_EMF_VALUES`] a line.
pub(crate) fn seconds_values_line(
    namespace: &str,
    metric: &str,
    values: &[f64],
    dimensions: &[(&str, &str)],
    now_ms: i64,
) -> String {
    line(namespace, (metric, "Seconds"), json!(values), dimensions, now_ms)
}

/// The most values one EMF metric may carry in one line.
pub const MAX_EMF_VALUES: usize = 100;

fn line(
    namespace: &str,
    (metric, unit): (&str, &str),
    value: impl Into<Value>,
    dimensions: &[(&str, &str)],
    now_ms: i64,
) -> String {
    let names: Vec<&str> = dimensions.iter().map(|(name, _)| *name).collect();
    let mut doc = Map::new();
    doc.insert(
        "_aws".into(),
        json!({
            "Timestamp": now_ms,
            "CloudWatchMetrics": [{
                "Namespace": namespace,
                "Dimensions": [names],
                "Metrics": [{"Name": metric, "Unit": unit}],
            }],
        }),
    );
    doc.insert(metric.into(), value.into());
    for (name, value) in dimensions {
        doc.insert((*name).into(), json!(value));
    }
    Value::Object(doc).to_string()
}

/// The scan's line: how far the watermark is behind `now_ms`.
pub fn watermark_lag_line(namespace: &str, watermark_ms: i64, now_ms: i64) -> String {
    let lag = (now_ms - watermark_ms).max(0) as f64 / 1000.0;
    seconds_line(namespace, WATERMARK_LAG_METRIC, lag, &[], now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_carries_its_namespace_metric_dimensions_and_value() {
        let line: Value = serde_json::from_str(&seconds_line("N", "M", 1.5, &[("Subscription", "a")], 7)).unwrap();
        assert_eq!(line["_aws"]["Timestamp"], 7);
        let spec = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!((spec["Namespace"].as_str(), spec["Metrics"][0]["Name"].as_str()), (Some("N"), Some("M")));
        assert_eq!(spec["Dimensions"], json!([["Subscription"]]));
        assert_eq!((line["M"].as_f64(), line["Subscription"].as_str()), (Some(1.5), Some("a")));
        let lag: Value = serde_json::from_str(&watermark_lag_line("N", 10_000, 72_500)).unwrap();
        assert_eq!(lag[WATERMARK_LAG_METRIC], 62.5);
        assert_eq!(lag["_aws"]["CloudWatchMetrics"][0]["Dimensions"], json!([[]]), "the alarm's metric: no dimensions");
        let quarantined: Value = serde_json::from_str(&quarantined_line("N", 2, 7)).unwrap();
        assert_eq!(quarantined[QUARANTINED_METRIC], 2.0);
        assert_eq!(quarantined["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Unit"], "Count");
    }
}
