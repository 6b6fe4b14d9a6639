//! Configuration from environment variables, one struct per function so each
//! function reads (and its template entry declares) only what it uses.

use std::time::Duration;

use crate::error::{Error, Result};

/// Slot size in milliseconds (`TIME_UNIT`), default one second.
pub const DEFAULT_TIME_UNIT_MS: u64 = 1000;

fn var(name: &str) -> Result<String> {
    std::env::var(name)
        .map_err(|_| Error::Config(format!("environment variable {name} is not set")))
}

fn var_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::Config(format!("{name}={v:?} is not valid"))),
        Err(_) => Ok(default),
    }
}

fn optional<T: std::str::FromStr>(name: &str) -> Result<Option<T>> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::Config(format!("{name}={v:?} is not valid"))),
        Err(_) => Ok(None),
    }
}

fn time_unit() -> Result<u64> {
    let unit: u64 = var_or("TIME_UNIT", DEFAULT_TIME_UNIT_MS)?;
    if unit == 0 {
        return Err(Error::Config("TIME_UNIT must be at least 1 (ms)".into()));
    }
    Ok(unit)
}

/// How a client's IP address is kept in the event envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IpMode {
    Full,
    /// Salted sha256, hex: lets you count distinct visitors without storing addresses.
    Hash {
        salt: String,
    },
    None,
}

#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub event_stream: String,
    /// Largest event (envelope JSON) accepted. Everything accepted must later fit a
    /// DynamoDB item (400 KB), so the default stays below that, well under Kinesis' 1 MiB.
    pub max_event_bytes: usize,
    pub ip_mode: IpMode,
}

/// Default `MAX_EVENT_BYTES`: 384 KiB, leaving room for the item's other attributes.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 384 * 1024;

impl LoadConfig {
    pub fn from_env() -> Result<Self> {
        let ip_mode = match var_or("IP_MODE", String::from("hash"))?.as_str() {
            "full" => IpMode::Full,
            "none" => IpMode::None,
            "hash" => IpMode::Hash {
                salt: std::env::var("IP_SALT").unwrap_or_default(),
            },
            other => {
                return Err(Error::Config(format!(
                    "IP_MODE={other:?}: expected full, hash or none"
                )))
            }
        };
        Ok(Self {
            event_stream: var("EVENT_STREAM")?,
            max_event_bytes: var_or("MAX_EVENT_BYTES", DEFAULT_MAX_EVENT_BYTES)?,
            ip_mode,
        })
    }
}

#[derive(Debug, Clone)]
pub struct PumpConfig {
    pub buffer_table: String,
}

impl PumpConfig {
    pub fn from_env() -> Result<Self> {
        Ok(Self {
            buffer_table: var("DYNAMO_BUFFER_TABLE")?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct ScanConfig {
    pub buffer_table: String,
    pub event_table: String,
    pub time_unit_ms: u64,
    /// Number of parallel scan segments a scheduled run fans out to.
    pub segments: u32,
    /// Stop and hand over to a fork when less than this is left before the deadline.
    pub deadline_margin: Duration,
    /// Items per scan page (`SCAN_PAGE_ITEMS`); unset = DynamoDB's 1 MB pages.
    pub page_items: Option<i32>,
}

impl ScanConfig {
    pub fn from_env() -> Result<Self> {
        let segments: u32 = var_or("SCAN_SEGMENTS", 4)?;
        if segments == 0 {
            return Err(Error::Config("SCAN_SEGMENTS must be at least 1".into()));
        }
        Ok(Self {
            buffer_table: var("DYNAMO_BUFFER_TABLE")?,
            event_table: var("DYNAMO_EVENT_TABLE")?,
            time_unit_ms: time_unit()?,
            segments,
            deadline_margin: Duration::from_millis(var_or("DEADLINE_MARGIN_MS", 10_000)?),
            page_items: optional("SCAN_PAGE_ITEMS")?,
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
}

impl PlaybackConfig {
    pub fn from_env() -> Result<Self> {
        Ok(Self {
            event_table: var("DYNAMO_EVENT_TABLE")?,
            playback_stream: var("PLAYBACK_STREAM")?,
            time_unit_ms: time_unit()?,
            deadline_margin: Duration::from_millis(var_or("DEADLINE_MARGIN_MS", 10_000)?),
            page_items: optional("QUERY_PAGE_ITEMS")?,
        })
    }
}
