//! Configuration from environment variables, one struct per function so each
//! function reads (and its template entry declares) only what it uses.

use std::time::Duration;

use crate::error::{Error, Result};

mod archive;
mod load;
mod privacy;
pub use archive::{ArchiveConfig, DEFAULT_ARCHIVE_LEASE, DEFAULT_MIN_SLICE_ROWS};
use load::inline_max_bytes;
pub use load::{
    IpMode, LoadConfig, DEFAULT_INLINE_MAX_BYTES, DEFAULT_MAX_EVENTS_PER_POST, DEFAULT_MAX_EVENT_BYTES,
    INLINE_MAX_BYTES_LIMIT, MAX_EVENTS_PER_POST, MAX_EVENT_BYTES_LIMIT, MAX_LARGE_EVENT_BYTES,
};
use privacy::Role;
pub use privacy::{KeysConfig, PrivacyConfig, SubjectsConfig, DEFAULT_KEY_CACHE, MIN_HASH_KEY_BYTES};

/// Slot size in milliseconds (`TIME_UNIT`), default one second.
pub const DEFAULT_TIME_UNIT_MS: u64 = 1000;
/// Default `MAX_CONTINUATIONS`: how many times a chain of self-invocations
/// may continue itself (a scan pass, a playback run) before it stops.
pub const DEFAULT_MAX_CONTINUATIONS: u32 = 1000;
/// Hand over to a continuation with this much time left (`DEADLINE_MARGIN_MS`):
/// more than a page's writes can take with all their retries.
pub const DEFAULT_DEADLINE_MARGIN_MS: u64 = 30_000;

/// The environment variables a function reads: the template must set every
/// required one and nothing that is not listed (checked by tests/template.rs).
#[derive(Debug, Clone, Copy)]
pub struct Variables {
    pub required: &'static [&'static str],
    pub optional: &'static [&'static str],
}

impl Variables {
    pub fn declares(&self, name: &str) -> bool {
        self.required.contains(&name) || self.optional.contains(&name)
    }
}

/// Reads the variables of one function; debug builds check that every name
/// read is declared, so the declarations cannot drift from the code.
struct Env(Variables);

impl Env {
    fn raw(&self, name: &str) -> Option<String> {
        debug_assert!(self.0.declares(name), "{name} is read but not declared");
        // Set but empty counts as unset (as `make` exports undefined variables).
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }

    fn var(&self, name: &str) -> Result<String> {
        self.raw(name).ok_or_else(|| Error::Config(format!("environment variable {name} is not set")))
    }

    fn optional<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>> {
        match self.raw(name) {
            Some(v) => v.trim().parse().map(Some).map_err(|_| Error::Config(format!("{name}={v:?} is not valid"))),
            None => Ok(None),
        }
    }

    fn var_or<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        Ok(self.optional(name)?.unwrap_or(default))
    }

    fn time_unit(&self) -> Result<u64> {
        let unit: u64 = self.var_or("TIME_UNIT", DEFAULT_TIME_UNIT_MS)?;
        if unit == 0 {
            return Err(Error::Config("TIME_UNIT must be at least 1 (ms)".into()));
        }
        Ok(unit)
    }

    fn deadline_margin(&self) -> Result<Duration> {
        Ok(Duration::from_millis(self.var_or("DEADLINE_MARGIN_MS", DEFAULT_DEADLINE_MARGIN_MS)?))
    }
}

#[derive(Debug, Clone)]
pub struct PumpConfig {
    pub buffer_table: String,
    /// Where the pump keeps each shard's buffered position (bookkeeping partition).
    pub event_table: String,
    /// The slot size: a chunk holds records of one slot (the scan cuts it again
    /// if its own `TIME_UNIT` differs, so this only decides how records are grouped).
    pub time_unit_ms: u64,
    /// The entity table, where the pump records each entity stream's logged
    /// version to drop copies of entity events (`bookkeeping::entity_positions`); without it,
    /// copies from the relay's retries reach the log.
    pub entity_table: Option<String>,
    /// The scan function (`SCAN_FUNCTION`), woken when records are buffered
    /// (`bookkeeping::awake`); without it, they wait for the scan's schedule.
    pub scan_function: Option<String>,
}

impl PumpConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["DYNAMO_BUFFER_TABLE", "DYNAMO_EVENT_TABLE"],
        optional: &["TIME_UNIT", "DYNAMO_ENTITY_TABLE", "SCAN_FUNCTION"],
    };

    /// The tables, with the default slot size and no entity table.
    pub fn new(buffer_table: impl Into<String>, event_table: impl Into<String>) -> Self {
        Self {
            buffer_table: buffer_table.into(),
            event_table: event_table.into(),
            time_unit_ms: DEFAULT_TIME_UNIT_MS,
            entity_table: None,
            scan_function: None,
        }
    }

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Ok(Self {
            buffer_table: env.var("DYNAMO_BUFFER_TABLE")?,
            event_table: env.var("DYNAMO_EVENT_TABLE")?,
            time_unit_ms: env.time_unit()?,
            entity_table: env.optional("DYNAMO_ENTITY_TABLE")?,
            scan_function: env.optional("SCAN_FUNCTION")?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct ScanConfig {
    pub buffer_table: String,
    pub event_table: String,
    /// The event stream, asked once per pass what the pump has not buffered yet.
    pub event_stream: String,
    pub time_unit_ms: u64,
    /// Number of parallel scan segments a scheduled run fans out to.
    pub segments: u32,
    /// Stop and hand over to a fork when less than this is left before the deadline.
    pub deadline_margin: Duration,
    /// Items per scan page (`SCAN_PAGE_ITEMS`); unset = DynamoDB's 1 MB pages.
    pub page_items: Option<i32>,
    /// Days an event is kept (`RETENTION_DAYS`, written as the `expires_at` TTL); unset or 0 = forever.
    pub retention_days: Option<u32>,
    /// How far Kinesis' arrival stamps and the scan's clock may differ (`WATERMARK_LAG_MS`, default 1 s):
    /// a shard with nothing new holds the watermark this far behind a pass's start (see `watermark`).
    pub watermark_lag_ms: u64,
    /// Continuations one segment's pass may chain (`MAX_CONTINUATIONS`).
    pub max_continuations: u32,
    /// Sub-keys a slot's chunks are spread over (`SLOT_SUBKEYS`, default 1): a partition takes at most
    /// 1,000 write units a second, so a slot written faster than about 1 MB/s of compressed events needs more.
    pub slot_subkeys: u32,
    /// Slices each slot is cut into by key hash (`SLICES`, default 1: not cut), so that a reader of
    /// some keys reads only their slices; a power of two up to 1,024, instead of sub-keys (`docs/storage.md#slices`).
    pub slices: u32,
    /// The CloudWatch namespace of the watermark-lag metric (`METRICS_NAMESPACE`).
    pub metrics_namespace: String,
    /// The subscriptions function's tick-only alias (`SUBSCRIPTIONS_TICK`, `<function>:tick`),
    /// which an awake scan invokes when the watermark moved, so idle partitions get a runner
    /// within a second; through it the scan can start nothing but a tick.
    pub subscriptions_tick: Option<String>,
}

/// The most slices a slot may be cut into (`SLICES`), and the most parts of a reader's range.
pub const MAX_SLICES: u32 = 1024;

/// `n` as a slice count: a power of two from 1 to [`MAX_SLICES`] (so that
/// every smaller power of two of readers' parts lines up with slices).
pub fn check_slices(n: u32) -> Result<u32> {
    if n == 0 || n > MAX_SLICES || !n.is_power_of_two() {
        return Err(Error::Config(format!("SLICES={n}: a power of two from 1 to {MAX_SLICES}")));
    }
    Ok(n)
}

/// Slices spread a slot's writes as sub-keys do, and keep each key in one
/// item: one or the other above 1 (the template's rule `SlicesOrSubkeys` says the same).
pub fn check_cut(slices: u32, slot_subkeys: u32) -> Result<()> {
    if slices > 1 && slot_subkeys > 1 {
        return Err(Error::Config(format!(
            "SLICES={slices} and SLOT_SUBKEYS={slot_subkeys}: slices spread a slot's writes as sub-keys do; set one"
        )));
    }
    Ok(())
}

/// The most `SLOT_SUBKEYS` may be.
pub const MAX_SLOT_SUBKEYS: u32 = 1000;

/// Default `WATERMARK_LAG_MS`: a clock allowance, far above what NTP-synced hosts differ by
/// (Lambda's hosts and Kinesis keep time with the Amazon Time Sync Service, within a
/// millisecond). A single event after a quiet spell is complete no sooner than this after it
/// arrived, so it bounds the latency of idle delivery; a record stamped more than this
/// behind the scan's clock is not lost but stored as a late event (counted, logged).
pub const DEFAULT_WATERMARK_LAG_MS: u64 = 1_000;

impl ScanConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["DYNAMO_BUFFER_TABLE", "DYNAMO_EVENT_TABLE", "EVENT_STREAM"],
        optional: &[
            "TIME_UNIT",
            "SCAN_SEGMENTS",
            "DEADLINE_MARGIN_MS",
            "SCAN_PAGE_ITEMS",
            "RETENTION_DAYS",
            "WATERMARK_LAG_MS",
            "MAX_CONTINUATIONS",
            "SLOT_SUBKEYS",
            "SLICES",
            "METRICS_NAMESPACE",
            "SUBSCRIPTIONS_TICK",
        ],
    };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        let segments: u32 = env.var_or("SCAN_SEGMENTS", 1)?;
        if segments == 0 {
            return Err(Error::Config("SCAN_SEGMENTS must be at least 1".into()));
        }
        let time_unit_ms = env.time_unit()?;
        let slot_subkeys: u32 = env.var_or("SLOT_SUBKEYS", 1)?;
        // Sub-key k of a slot is stored under `slot + k`: it must stay inside the slot.
        if slot_subkeys == 0 || slot_subkeys > MAX_SLOT_SUBKEYS || u64::from(slot_subkeys) > time_unit_ms {
            return Err(Error::Config(format!(
                "SLOT_SUBKEYS={slot_subkeys}: from 1 to {MAX_SLOT_SUBKEYS}, and at most TIME_UNIT ({time_unit_ms})"
            )));
        }
        let slices = check_slices(env.var_or("SLICES", 1)?)?;
        check_cut(slices, slot_subkeys)?;
        Ok(Self {
            buffer_table: env.var("DYNAMO_BUFFER_TABLE")?,
            event_table: env.var("DYNAMO_EVENT_TABLE")?,
            event_stream: env.var("EVENT_STREAM")?,
            time_unit_ms,
            segments,
            deadline_margin: env.deadline_margin()?,
            page_items: env.optional("SCAN_PAGE_ITEMS")?,
            retention_days: env.optional("RETENTION_DAYS")?.filter(|days| *days > 0),
            watermark_lag_ms: env.var_or("WATERMARK_LAG_MS", DEFAULT_WATERMARK_LAG_MS)?,
            max_continuations: env.var_or("MAX_CONTINUATIONS", DEFAULT_MAX_CONTINUATIONS)?,
            slot_subkeys,
            slices,
            metrics_namespace: env.var_or("METRICS_NAMESPACE", String::from("EventStore"))?,
            subscriptions_tick: env.optional("SUBSCRIPTIONS_TICK")?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct PlaybackConfig {
    pub event_table: String,
    pub playback_stream: String,
    pub time_unit_ms: u64,
    pub deadline_margin: Duration,
    /// Items per query page (`QUERY_PAGE_ITEMS`); unset = DynamoDB's 1 MB pages.
    pub page_items: Option<i32>,
    /// Longest window one request may ask for (`PLAYBACK_MAX_HOURS`, default 24).
    pub max_window: Duration,
    /// How far apart (arrival time) two copies of one accepted event can be:
    /// load's timeout and then some (`DEDUPE_WINDOW_MS`, see [`crate::log::copies`]).
    pub dedupe_window_ms: u64,
    /// Continuations one playback run may chain (`MAX_CONTINUATIONS`); then
    /// it stops, and the same request again goes on from its checkpoint.
    pub max_continuations: u32,
    /// How long a run's lease lasts past its last checkpoint save (renewed
    /// with each): a crashed run's id is free again this long after.
    pub lease: Duration,
    /// The archive's bucket (`ARCHIVE_BUCKET`): slots before the boundary are read from it.
    pub archive_bucket: Option<String>,
    /// Subjects' keys (`KEY_TABLE`): sealed events are opened with them.
    pub subjects: Option<SubjectsConfig>,
}

/// Default [`PlaybackConfig::lease`]: two minutes, far more than a run goes
/// between saves, and about when Lambda's second asynchronous attempt comes.
pub const DEFAULT_PLAYBACK_LEASE: Duration = Duration::from_secs(120);

/// Default `DEDUPE_WINDOW_MS`: three times load's Lambda timeout in the template (checked by a test).
pub const DEFAULT_DEDUPE_WINDOW_MS: u64 = 30_000;

impl PlaybackConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["DYNAMO_EVENT_TABLE", "PLAYBACK_STREAM"],
        optional: &[
            "TIME_UNIT",
            "DEADLINE_MARGIN_MS",
            "QUERY_PAGE_ITEMS",
            "PLAYBACK_MAX_HOURS",
            "DEDUPE_WINDOW_MS",
            "MAX_CONTINUATIONS",
            "ARCHIVE_BUCKET",
            "KEY_TABLE",
            "KEY_CACHE_SECONDS",
        ],
    };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Self::for_names(env.var("DYNAMO_EVENT_TABLE")?, env.var("PLAYBACK_STREAM")?)
    }

    /// The environment's settings for a table and stream named elsewhere (the CLI's).
    pub fn for_names(event_table: String, playback_stream: String) -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Ok(Self {
            event_table,
            playback_stream,
            time_unit_ms: env.time_unit()?,
            deadline_margin: env.deadline_margin()?,
            page_items: env.optional("QUERY_PAGE_ITEMS")?,
            max_window: Duration::from_secs(env.var_or("PLAYBACK_MAX_HOURS", 24u64)? * 3600),
            dedupe_window_ms: env.var_or("DEDUPE_WINDOW_MS", DEFAULT_DEDUPE_WINDOW_MS)?,
            max_continuations: env.var_or("MAX_CONTINUATIONS", DEFAULT_MAX_CONTINUATIONS)?,
            lease: DEFAULT_PLAYBACK_LEASE,
            archive_bucket: env.optional("ARCHIVE_BUCKET")?,
            subjects: SubjectsConfig::from_env(&env, Role::Reader)?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct SubscriptionConfig {
    pub event_table: String,
    pub time_unit_ms: u64,
    pub deadline_margin: Duration,
    /// Items per query page (`QUERY_PAGE_ITEMS`); unset = DynamoDB's 1 MB pages.
    pub page_items: Option<i32>,
    /// As for playback: copies of one accepted event within this are delivered once.
    pub dedupe_window_ms: u64,
    /// Continuations one partition run may chain (`MAX_CONTINUATIONS`); the next tick goes on.
    pub max_continuations: u32,
    /// How long a caught-up runner keeps following the complete log after it last brought events
    /// (`SUBSCRIPTION_FOLLOW_SECONDS`, default 10): past a gap in traffic this long the runner ends,
    /// and the awake scan's tick starts one again when events come; one that found none ends at once.
    pub follow: Duration,
    /// How often a caught-up runner reads the watermark (`SUBSCRIPTION_POLL_MS`,
    /// default 250): one `Query` each, only while a runner follows; the awake scan
    /// moves the watermark every half second while events come, so the poll is a
    /// share of every delivery's latency (on average half of it).
    pub poll: Duration,
    /// How long a runner's lease outlasts its deadline (clock differences between runners).
    pub lease_slack_ms: i64,
    /// How long a partition whose target was unavailable is left alone ([`UNAVAILABLE_BACKOFF`]).
    pub unavailable_backoff: Duration,
    /// The CloudWatch namespace of the lag metric (`METRICS_NAMESPACE`).
    pub metrics_namespace: String,
    /// The archive's bucket (`ARCHIVE_BUCKET`), as for playback.
    pub archive_bucket: Option<String>,
    /// Subjects' keys (`KEY_TABLE`), as for playback.
    pub subjects: Option<SubjectsConfig>,
    /// The projections' views (`VIEW_TABLE`); without it, projections are refused.
    pub view_table: Option<String>,
}

impl SubscriptionConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["DYNAMO_EVENT_TABLE"],
        optional: &[
            "TIME_UNIT",
            "DEADLINE_MARGIN_MS",
            "QUERY_PAGE_ITEMS",
            "DEDUPE_WINDOW_MS",
            "MAX_CONTINUATIONS",
            "SUBSCRIPTION_FOLLOW_SECONDS",
            "SUBSCRIPTION_POLL_MS",
            "METRICS_NAMESPACE",
            "ARCHIVE_BUCKET",
            "KEY_TABLE",
            "KEY_CACHE_SECONDS",
            "VIEW_TABLE",
        ],
    };

    pub fn from_env() -> Result<Self> {
        Self::for_table(Env(Self::VARIABLES).var("DYNAMO_EVENT_TABLE")?)
    }

    /// The environment's settings for a table named elsewhere (the CLI's: a stack output, or the stage's).
    pub fn for_table(event_table: String) -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Ok(Self {
            event_table,
            time_unit_ms: env.time_unit()?,
            deadline_margin: env.deadline_margin()?,
            page_items: env.optional("QUERY_PAGE_ITEMS")?,
            dedupe_window_ms: env.var_or("DEDUPE_WINDOW_MS", DEFAULT_DEDUPE_WINDOW_MS)?,
            max_continuations: env.var_or("MAX_CONTINUATIONS", DEFAULT_MAX_CONTINUATIONS)?,
            follow: Duration::from_secs(env.var_or("SUBSCRIPTION_FOLLOW_SECONDS", 10u64)?),
            poll: Duration::from_millis(env.var_or("SUBSCRIPTION_POLL_MS", 250u64)?.max(50)),
            lease_slack_ms: 30_000,
            unavailable_backoff: UNAVAILABLE_BACKOFF,
            metrics_namespace: env.var_or("METRICS_NAMESPACE", String::from("EventStore"))?,
            archive_bucket: env.optional("ARCHIVE_BUCKET")?,
            subjects: SubjectsConfig::from_env(&env, Role::Reader)?,
            view_table: env.optional("VIEW_TABLE")?,
        })
    }
}

/// A partition whose target was unavailable (throttled, gone) keeps its lease this long, so
/// that the ticks the awake scan starts twice a second while events come do not retry the
/// target at that pace: a tick after it tries again (while events come, within a pass of it;
/// at idle, the schedule's next minute). Short, because a target throttled for a moment
/// holds its partition's deliveries this long.
pub const UNAVAILABLE_BACKOFF: Duration = Duration::from_secs(10);

/// The `/streams` API (`streams` function): the entity table.
#[derive(Debug, Clone)]
pub struct StreamsConfig {
    pub entity_table: String,
    /// Event data larger than this is offloaded to `archive_bucket` ([`crate::offload`]).
    pub inline_max_bytes: usize,
    /// The store's bucket (`ARCHIVE_BUCKET`), for large event data; without
    /// one an event is at most [`crate::entity::model::MAX_EVENT_BYTES`].
    pub archive_bucket: Option<String>,
    /// Per-subject encryption (`KEY_TABLE` and the rest): the data of subjects' streams is sealed.
    pub subjects: Option<SubjectsConfig>,
    /// The projections' views (`VIEW_TABLE`), served at `/views`.
    pub view_table: Option<String>,
    /// The event table (`DYNAMO_EVENT_TABLE`): the complete log, served at `/log`.
    pub event_table: Option<String>,
    /// Copies of an event within this window are one (`DEDUPE_WINDOW_MS`, [`crate::log::copies`]).
    pub dedupe_window_ms: u64,
}

impl StreamsConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["DYNAMO_ENTITY_TABLE"],
        optional: &[
            "INLINE_MAX_BYTES",
            "ARCHIVE_BUCKET",
            "KEY_TABLE",
            "KEY_FUNCTION",
            "SUBJECT_KMS_KEY",
            "SUBJECT_HASH_KEY",
            "STREAM_SUBJECTS",
            "KEY_CACHE_SECONDS",
            "VIEW_TABLE",
            "DYNAMO_EVENT_TABLE",
            "DEDUPE_WINDOW_MS",
        ],
    };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Ok(Self {
            entity_table: env.var("DYNAMO_ENTITY_TABLE")?,
            inline_max_bytes: inline_max_bytes(&env)?,
            archive_bucket: env.raw("ARCHIVE_BUCKET"),
            subjects: SubjectsConfig::from_env(&env, Role::Streams)?,
            view_table: env.optional("VIEW_TABLE")?,
            event_table: env.optional("DYNAMO_EVENT_TABLE")?,
            dedupe_window_ms: env.var_or("DEDUPE_WINDOW_MS", DEFAULT_DEDUPE_WINDOW_MS)?,
        })
    }
}

/// The `relay` function: the event stream it puts entity events on, the
/// entity table (positions, and the versions a delivery lacks), the queue a
/// held stream is announced on, and how long a stream may fail before it is held.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub event_stream: String,
    pub entity_table: String,
    /// Where a held stream is announced (the relay's dead-letter queue).
    pub dead_letter_queue: Option<String>,
    /// How long a stream's puts may keep failing before it is held.
    pub hold_after: Duration,
}

/// How long a stream's puts may keep failing before the relay holds it (`RELAY_HOLD_AFTER_SECONDS`).
pub const DEFAULT_RELAY_HOLD_AFTER_SECONDS: u64 = 300;

impl RelayConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["EVENT_STREAM", "DYNAMO_ENTITY_TABLE"],
        optional: &["RELAY_DLQ_URL", "RELAY_HOLD_AFTER_SECONDS"],
    };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Ok(Self {
            event_stream: env.var("EVENT_STREAM")?,
            entity_table: env.var("DYNAMO_ENTITY_TABLE")?,
            dead_letter_queue: env.optional("RELAY_DLQ_URL")?,
            hold_after: Duration::from_secs(env.var_or("RELAY_HOLD_AFTER_SECONDS", DEFAULT_RELAY_HOLD_AFTER_SECONDS)?),
        })
    }
}

#[cfg(test)]
mod tests;
