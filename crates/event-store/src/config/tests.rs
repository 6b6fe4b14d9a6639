use super::*;

/// The one test that touches the process environment: every function's
/// configuration loads from its declared variables alone (reading an
/// undeclared one would fail the debug assertion), and bad values are refused.
#[test]
fn configurations_read_only_their_declared_variables() {
    let all = [
        LoadConfig::VARIABLES,
        PumpConfig::VARIABLES,
        ScanConfig::VARIABLES,
        PlaybackConfig::VARIABLES,
        SubscriptionConfig::VARIABLES,
        ArchiveConfig::VARIABLES,
        StreamsConfig::VARIABLES,
    ];
    for name in all.iter().flat_map(|v| v.required.iter()) {
        std::env::set_var(name, format!("value-of-{name}"));
    }
    let load = LoadConfig::from_env().unwrap();
    assert_eq!(load.event_stream, "value-of-EVENT_STREAM");
    assert_eq!(load.ip_mode, IpMode::None, "no address kept by default");
    std::env::set_var("IP_MODE", "hash");
    assert!(matches!(LoadConfig::from_env(), Err(Error::Config(m)) if m.contains("IP_SALT")), "hash needs a salt");
    std::env::set_var("IP_SALT", "a salt of sixteen+");
    assert!(matches!(LoadConfig::from_env().unwrap().ip_mode, IpMode::Hash { .. }));
    std::env::remove_var("IP_MODE");
    assert_eq!(load.max_event_bytes, 2 * 1024, "a pixel's or a small analytics event's size; larger is opt-in");
    assert_eq!(load.max_events_per_post, 100);
    assert_eq!(load.inline_max_bytes, 64 * 1024);
    // Larger than an item holds only with a bucket to offload to, and at most 4 MiB.
    std::env::remove_var("ARCHIVE_BUCKET");
    std::env::set_var("MAX_EVENT_BYTES", "1048576");
    assert!(matches!(LoadConfig::from_env(), Err(Error::Config(m)) if m.contains("ARCHIVE_BUCKET")));
    std::env::set_var("ARCHIVE_BUCKET", "value-of-ARCHIVE_BUCKET");
    assert_eq!(LoadConfig::from_env().unwrap().max_event_bytes, 1 << 20);
    std::env::set_var("MAX_EVENT_BYTES", "4194305");
    assert!(matches!(LoadConfig::from_env(), Err(Error::Config(m)) if m.contains("6 MB")));
    std::env::remove_var("MAX_EVENT_BYTES");
    for bad in ["0", "393217"] {
        std::env::set_var("INLINE_MAX_BYTES", bad);
        assert!(matches!(LoadConfig::from_env(), Err(Error::Config(m)) if m.contains("INLINE_MAX_BYTES")), "{bad}");
        assert!(StreamsConfig::from_env().is_err(), "{bad}");
    }
    std::env::set_var("INLINE_MAX_BYTES", "1024");
    let streams = StreamsConfig::from_env().unwrap();
    assert_eq!((streams.inline_max_bytes, streams.archive_bucket.as_deref()), (1024, Some("value-of-ARCHIVE_BUCKET")));
    std::env::remove_var("INLINE_MAX_BYTES");
    for bad in ["0", "501"] {
        std::env::set_var("MAX_EVENTS_PER_POST", bad);
        let refused = LoadConfig::from_env();
        assert!(matches!(&refused, Err(Error::Config(m)) if m.contains("MAX_EVENTS_PER_POST")), "{bad}: {refused:?}");
    }
    std::env::remove_var("MAX_EVENTS_PER_POST");
    assert_eq!(PumpConfig::from_env().unwrap().buffer_table, "value-of-DYNAMO_BUFFER_TABLE");
    let scan = ScanConfig::from_env().unwrap();
    assert_eq!((scan.time_unit_ms, scan.segments), (DEFAULT_TIME_UNIT_MS, 1));
    assert_eq!(PlaybackConfig::from_env().unwrap().playback_stream, "value-of-PLAYBACK_STREAM");
    let subscriptions = SubscriptionConfig::from_env().unwrap();
    assert_eq!((subscriptions.follow.as_secs(), subscriptions.metrics_namespace.as_str()), (10, "EventStore"));

    let archive = ArchiveConfig::from_env().unwrap();
    assert_eq!((archive.hot_retention.as_secs(), archive.object_bytes), (30 * 86_400, 16 << 20));
    std::env::set_var("HOT_RETENTION_DAYS", "0");
    assert!(matches!(ArchiveConfig::from_env(), Err(Error::Config(m)) if m.contains("HOT_RETENTION_DAYS")));
    std::env::set_var("HOT_RETENTION_SECONDS", "90");
    assert_eq!(ArchiveConfig::from_env().unwrap().hot_retention.as_secs(), 90, "seconds win, for demos");
    std::env::remove_var("HOT_RETENTION_SECONDS");
    std::env::remove_var("HOT_RETENTION_DAYS");

    std::env::set_var("TIME_UNIT", "0");
    assert!(matches!(ScanConfig::from_env(), Err(Error::Config(_))));
    std::env::set_var("TIME_UNIT", "soon");
    assert!(matches!(PlaybackConfig::from_env(), Err(Error::Config(_))));
    std::env::remove_var("TIME_UNIT");
    std::env::set_var("IP_MODE", "partial");
    assert!(matches!(LoadConfig::from_env(), Err(Error::Config(_))));
    std::env::remove_var("IP_MODE");
    std::env::remove_var("DYNAMO_BUFFER_TABLE");
    assert!(matches!(PumpConfig::from_env(), Err(Error::Config(m)) if m.contains("DYNAMO_BUFFER_TABLE")));
}
