//! The archive function's settings.

use std::time::Duration;

use super::{Env, Variables, DEFAULT_DEDUPE_WINDOW_MS, DEFAULT_MAX_CONTINUATIONS};
use crate::error::{Error, Result};

/// The archiver's settings (`archive` function).
#[derive(Debug, Clone)]
pub struct ArchiveConfig {
    pub event_table: String,
    /// The archive's bucket (`ARCHIVE_BUCKET`).
    pub bucket: String,
    /// Key prefix of the objects (`events/`: the Glue table's location).
    pub prefix: String,
    /// Slots whose end is older than this are archived (`HOT_RETENTION_DAYS`,
    /// default 30; `HOT_RETENTION_SECONDS` instead, for demos and tests).
    pub hot_retention: Duration,
    /// An object is closed at the first slot boundary past this many bytes
    /// of events (`ARCHIVE_OBJECT_MB`, default 16: a few MB of Parquet, and
    /// what a reader holds decoded, twice at most, in its 256 MB).
    pub object_bytes: usize,
    /// An object is cut into as many slices as its slots were, but fewer
    /// when a slice would average under this many rows
    /// ([`DEFAULT_MIN_SLICE_ROWS`]; `docs/storage.md#cold-tier-s3`).
    pub min_slice_rows: usize,
    pub dedupe_window_ms: u64,
    /// Stop starting objects this long before the deadline.
    pub deadline_margin: Duration,
    /// How long a run's lease lasts: longer than a run (the function's timeout).
    pub lease: Duration,
    /// Continuations one run may chain (`MAX_CONTINUATIONS`); then the schedule goes on.
    pub max_continuations: u32,
    /// The CloudWatch namespace of the quarantine metric (`METRICS_NAMESPACE`).
    pub metrics_namespace: String,
}

/// Default [`ArchiveConfig::min_slice_rows`]: a row group of 1,024 events
/// of 1 KB holds some 200 KB compressed, against some 900 bytes of footer.
pub const DEFAULT_MIN_SLICE_ROWS: usize = 1024;

/// Default [`ArchiveConfig::lease`]: Lambda's longest run, and a minute.
pub const DEFAULT_ARCHIVE_LEASE: Duration = Duration::from_secs(16 * 60);

impl ArchiveConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["DYNAMO_EVENT_TABLE", "ARCHIVE_BUCKET"],
        optional: &[
            "HOT_RETENTION_DAYS",
            "HOT_RETENTION_SECONDS",
            "ARCHIVE_OBJECT_MB",
            "DEDUPE_WINDOW_MS",
            "DEADLINE_MARGIN_MS",
            "MAX_CONTINUATIONS",
            "METRICS_NAMESPACE",
        ],
    };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Self::for_names(env.var("DYNAMO_EVENT_TABLE")?, env.var("ARCHIVE_BUCKET")?)
    }

    /// The environment's settings for a table and bucket named elsewhere (the CLI's, the local stack's).
    pub fn for_names(event_table: String, bucket: String) -> Result<Self> {
        let env = Env(Self::VARIABLES);
        let hot_retention = match env.optional::<u64>("HOT_RETENTION_SECONDS")? {
            Some(seconds) => Duration::from_secs(seconds),
            None => Duration::from_secs(env.var_or("HOT_RETENTION_DAYS", 30u64)? * 86_400),
        };
        if hot_retention.is_zero() {
            return Err(Error::Config(
                "a hot retention of 0 keeps everything in DynamoDB: nothing to archive (HOT_RETENTION_DAYS)".into(),
            ));
        }
        let object_mb: usize = env.var_or("ARCHIVE_OBJECT_MB", 16)?;
        if !(1..=1024).contains(&object_mb) {
            return Err(Error::Config(format!("ARCHIVE_OBJECT_MB={object_mb}: from 1 to 1024")));
        }
        Ok(Self {
            event_table,
            bucket,
            prefix: "events/".into(),
            hot_retention,
            object_bytes: object_mb * 1024 * 1024,
            min_slice_rows: DEFAULT_MIN_SLICE_ROWS,
            dedupe_window_ms: env.var_or("DEDUPE_WINDOW_MS", DEFAULT_DEDUPE_WINDOW_MS)?,
            deadline_margin: env.deadline_margin()?,
            lease: DEFAULT_ARCHIVE_LEASE,
            max_continuations: env.var_or("MAX_CONTINUATIONS", DEFAULT_MAX_CONTINUATIONS)?,
            metrics_namespace: env.var_or("METRICS_NAMESPACE", String::from("EventStore"))?,
        })
    }
}
