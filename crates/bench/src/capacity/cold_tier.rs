//! The cold tier's section of docs/capacity.md: what keeping events costs once they move to S3.

/// The cold tier's section: what keeping events costs once they move to S3.
pub(super) fn cold_tier(archive: &serde_json::Value) -> String {
    let f = |name: &str| archive["figures"][name].as_f64().unwrap_or(f64::NAN);
    format!(
        "\n## Kept for good: the cold tier\n\n\
         Measured by `make bench` on {date} (bench/archive.md: {events} events of 1 KB, moto; prices as above, \
         S3 Standard $0.023 per GB-month). After `HotRetentionDays` events live in S3 as Parquet \
         ([storage.md](storage.md#cold-tier-s3)).\n\n\
         | per million 1 KB events | hot only (DynamoDB) | tiered (S3, after HotRetentionDays) |\n|---|---|---|\n\
         | bytes per event | {hot_bytes:.0} | {cold_bytes:.0} |\n\
         | storage, per month kept | ${hot:.4} | ${cold:.4} (**{ratio:.1}x** cheaper; target 8x) |\n\
         | replay onto Kinesis, events/s (same window, same run; paced to the stream's limit) | {hot_eps:.0} | {cold_eps:.0} (**{replay:.2}x**; target 1.0) |\n\
         | the window read alone, events/s | {hot_read:.0} | {cold_read:.0} ({read:.2}x) |\n\
         | archiving them once (item reads, deletes, S3 requests) | | ${archived:.2} |\n",
        date = archive["date"].as_str().unwrap_or("?"),
        events = f("events"),
        hot_bytes = f("dynamo_bytes_per_event"),
        cold_bytes = f("object_bytes_per_event"),
        hot = f("storage_usd_per_million_events_month_hot"),
        cold = f("storage_usd_per_million_events_month_tiered"),
        ratio = f("storage_cost_ratio_hot_to_tiered"),
        hot_eps = f("hot_replay_events_per_second"),
        cold_eps = f("archive_replay_events_per_second"),
        replay = f("replay_ratio_archive_to_hot"),
        hot_read = f("hot_read_events_per_second"),
        cold_read = f("archive_read_events_per_second"),
        read = f("read_ratio_archive_to_hot"),
        archived = f("usd_per_million_events_archived"),
    )
}
