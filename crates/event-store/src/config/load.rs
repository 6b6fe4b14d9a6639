//! `load`'s configuration: the event stream, the limits of what it accepts,
//! how it keeps client addresses, and where large events go.

use super::{Env, SubjectsConfig, Variables};
use crate::error::{Error, Result};

/// Default `INLINE_MAX_BYTES`: events up to this stay in the log itself
/// (today's entity event limit, so nothing smaller moves).
pub const DEFAULT_INLINE_MAX_BYTES: usize = 64 * 1024;
/// The most `INLINE_MAX_BYTES` may be: an inline event must fit a DynamoDB item.
pub const INLINE_MAX_BYTES_LIMIT: usize = 384 * 1024;
/// The largest event accepted when payloads can be offloaded: 4 MiB, so a
/// request carrying one fits Lambda's 6 MB request payload with room to spare.
pub const MAX_LARGE_EVENT_BYTES: usize = 4 * 1024 * 1024;

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
    /// Most events one `POST /events` may carry (413 above).
    pub max_events_per_post: usize,
    pub ip_mode: IpMode,
    /// Events larger than this are offloaded to `archive_bucket` ([`crate::offload`]).
    pub inline_max_bytes: usize,
    /// The store's bucket (`ARCHIVE_BUCKET`): without one nothing is offloaded,
    /// and `MAX_EVENT_BYTES` stays within what a DynamoDB item holds.
    pub archive_bucket: Option<String>,
    /// Per-subject encryption (`KEY_TABLE` and the rest): events with a subject are sealed.
    pub subjects: Option<SubjectsConfig>,
}

/// Default `MAX_EVENTS_PER_POST`: with the template's default rate of
/// `POST /events`, what fits one shard's 1,000 records/s beside the pixel.
pub const DEFAULT_MAX_EVENTS_PER_POST: usize = 100;
/// `MAX_EVENTS_PER_POST` may be at most this (one `PutRecords` worth when every `EntityId` differs).
pub const MAX_EVENTS_PER_POST: usize = 500;

/// Default `MAX_EVENT_BYTES`: 2 KiB, a pixel hit with a long URL and referer or a small analytics event. The
/// endpoint is public, and at this size the template's default route rates fit one event shard's 1 MiB/s (the
/// arithmetic is beside the template's parameters). Larger ones are opt-in, up to [`MAX_EVENT_BYTES_LIMIT`].
pub const DEFAULT_MAX_EVENT_BYTES: usize = 2 * 1024;
/// The most `MAX_EVENT_BYTES` may be without a bucket to offload to: 384 KiB, leaving room in a DynamoDB item
/// (400 KB) for its other attributes. With `ARCHIVE_BUCKET`, up to [`MAX_LARGE_EVENT_BYTES`].
pub const MAX_EVENT_BYTES_LIMIT: usize = 384 * 1024;

impl LoadConfig {
    pub const VARIABLES: Variables = Variables {
        required: &["EVENT_STREAM"],
        optional: &[
            "MAX_EVENT_BYTES",
            "MAX_EVENTS_PER_POST",
            "IP_MODE",
            "IP_SALT",
            "INLINE_MAX_BYTES",
            "ARCHIVE_BUCKET",
            "KEY_TABLE",
            "KEY_FUNCTION",
            "SUBJECT_KMS_KEY",
            "SUBJECT_HASH_KEY",
            "SUBJECT_FROM",
            "KEY_CACHE_SECONDS",
        ],
    };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        // `none` by default: an address is personal data, and an anonymous hit's cannot be erased later
        // (docs/privacy.md#client-addresses-ip_mode).
        let ip_mode = match env.var_or("IP_MODE", String::from("none"))?.as_str() {
            "full" => IpMode::Full,
            "none" => IpMode::None,
            "hash" => {
                let salt = env.raw("IP_SALT").unwrap_or_default();
                if salt.len() < 16 {
                    return Err(Error::Config(
                        "IP_MODE=hash needs IP_SALT of 16+ characters: without it a hashed IPv4 address is reversible"
                            .into(),
                    ));
                }
                IpMode::Hash { salt }
            }
            other => return Err(Error::Config(format!("IP_MODE={other:?}: expected full, hash or none"))),
        };
        let archive_bucket = env.raw("ARCHIVE_BUCKET");
        let max_event_bytes = env.var_or("MAX_EVENT_BYTES", DEFAULT_MAX_EVENT_BYTES)?;
        let largest = if archive_bucket.is_some() { MAX_LARGE_EVENT_BYTES } else { MAX_EVENT_BYTES_LIMIT };
        if max_event_bytes > largest {
            return Err(Error::Config(format!(
                "MAX_EVENT_BYTES={max_event_bytes}: at most {largest} ({})",
                if archive_bucket.is_some() {
                    "a request must fit Lambda's 6 MB"
                } else {
                    "an event must fit a DynamoDB item; set ARCHIVE_BUCKET to offload larger ones"
                }
            )));
        }
        let inline_max_bytes = inline_max_bytes(&env)?;
        let max_events_per_post = env.var_or("MAX_EVENTS_PER_POST", DEFAULT_MAX_EVENTS_PER_POST)?;
        if !(1..=MAX_EVENTS_PER_POST).contains(&max_events_per_post) {
            return Err(Error::Config(format!(
                "MAX_EVENTS_PER_POST={max_events_per_post}: 1 to {}",
                MAX_EVENTS_PER_POST
            )));
        }
        Ok(Self {
            event_stream: env.var("EVENT_STREAM")?,
            max_event_bytes,
            max_events_per_post,
            ip_mode,
            inline_max_bytes,
            archive_bucket,
            subjects: SubjectsConfig::from_env(&env, super::Role::Load)?,
        })
    }

    /// The defaults for `event_stream`.
    pub fn new(event_stream: impl Into<String>) -> Self {
        Self {
            event_stream: event_stream.into(),
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            max_events_per_post: DEFAULT_MAX_EVENTS_PER_POST,
            ip_mode: IpMode::Full,
            inline_max_bytes: DEFAULT_INLINE_MAX_BYTES,
            archive_bucket: None,
            subjects: None,
        }
    }
}

/// `INLINE_MAX_BYTES`: 1 byte to what a DynamoDB item holds.
pub(super) fn inline_max_bytes(env: &Env) -> Result<usize> {
    let bytes = env.var_or("INLINE_MAX_BYTES", DEFAULT_INLINE_MAX_BYTES)?;
    if !(1..=INLINE_MAX_BYTES_LIMIT).contains(&bytes) {
        return Err(Error::Config(format!("INLINE_MAX_BYTES={bytes}: 1 to {}", INLINE_MAX_BYTES_LIMIT)));
    }
    Ok(bytes)
}
