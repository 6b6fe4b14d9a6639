//! Per-subject encryption's settings (`docs/privacy.md`), read by every
//! function that seals or opens: without `KEY_TABLE` nothing is sealed, and a
//! reader that meets a sealed event fails instead of handing it out sealed.

use std::time::Duration;

use super::{Env, Variables};
use crate::error::{Error, Result};

/// Default `KEY_CACHE_SECONDS`: how long an unwrapped key is used before it is read again.
pub const DEFAULT_KEY_CACHE: Duration = Duration::from_secs(60);

/// The shortest `SUBJECT_HASH_KEY`: 32 bytes, HMAC-SHA256's block of strength.
pub const MIN_HASH_KEY_BYTES: usize = 32;

/// Where subjects' keys are, and (for writers) how subjects are found and hashed.
#[derive(Debug, Clone)]
pub struct SubjectsConfig {
    pub key_table: String,
    /// The keys function writers ask for a subject's new key (`KEY_FUNCTION`): in a stack, writers
    /// may only read the key table.
    pub key_function: Option<String>,
    /// The KMS key new data keys are made under, by the writer itself when no keys function is
    /// named (local runs).
    pub kms_key: Option<String>,
    /// The secret the subject's id is hashed with (writers, and `forget`).
    pub hash_key: Option<String>,
    /// Where an ingested event's subject comes from (`SUBJECT_FROM`, `EntityId` when unset; load's
    /// only): the rule's text, read by [`crate::privacy::SubjectRule`].
    pub subject_from: Option<String>,
    /// Which entity streams are subjects (`STREAM_SUBJECTS`, `all` when unset; streams' only): read
    /// by [`crate::privacy::StreamSubjects`].
    pub stream_subjects: Option<String>,
    /// How long an unwrapped key is used (`KEY_CACHE_SECONDS`).
    pub cache: Duration,
}

impl SubjectsConfig {
    /// `None` when `KEY_TABLE` is unset. A reader reads `KEY_TABLE` and
    /// `KEY_CACHE_SECONDS`; a writer (it seals) also `KEY_FUNCTION` (else
    /// `SUBJECT_KMS_KEY`), `SUBJECT_HASH_KEY`, and `SUBJECT_FROM` (load) or
    /// `STREAM_SUBJECTS` (streams). What the rules say, and whether a writer
    /// has what sealing needs, `privacy::Subjects` checks at its cold start.
    pub(super) fn from_env(env: &Env, role: Role) -> Result<Option<Self>> {
        let Some(key_table) = env.raw("KEY_TABLE") else { return Ok(None) };
        let seconds: u64 = env.var_or("KEY_CACHE_SECONDS", DEFAULT_KEY_CACHE.as_secs())?;
        if seconds > 3600 {
            return Err(Error::Config(format!("KEY_CACHE_SECONDS={seconds}: at most 3600 (a forget waits that long)")));
        }
        let cache = Duration::from_secs(seconds);
        let (subject_from, stream_subjects) = match role {
            Role::Reader => (None, None),
            Role::Load => (Some(env.raw("SUBJECT_FROM").unwrap_or_else(|| "EntityId".into())), None),
            Role::Streams => (None, Some(env.raw("STREAM_SUBJECTS").unwrap_or_else(|| "all".into()))),
        };
        let (key_function, kms_key, hash_key) = if role == Role::Reader {
            (None, None, None)
        } else {
            (env.raw("KEY_FUNCTION"), env.raw("SUBJECT_KMS_KEY"), env.raw("SUBJECT_HASH_KEY"))
        };
        let config = Self { key_table, key_function, kms_key, hash_key, subject_from, stream_subjects, cache };
        Ok(Some(config))
    }

    /// The hash key's bytes, at least [`MIN_HASH_KEY_BYTES`].
    pub(crate) fn hash_key(&self) -> Result<&[u8]> {
        match self.hash_key.as_deref() {
            Some(key) if key.len() >= MIN_HASH_KEY_BYTES => Ok(key.as_bytes()),
            Some(_) => Err(Error::Config(format!("SUBJECT_HASH_KEY: at least {MIN_HASH_KEY_BYTES} characters"))),
            None => Err(Error::Config("KEY_TABLE is set: SUBJECT_HASH_KEY is needed to hash subjects".into())),
        }
    }
}

/// Which function reads the settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// Opens sealed events only.
    Reader,
    /// Seals ingested events (`SUBJECT_FROM`).
    Load,
    /// Seals entity events (`STREAM_SUBJECTS`).
    Streams,
}

/// The `privacy` function's (`forget`): the key table, the secret subjects are hashed with, and the
/// projections' views (`VIEW_TABLE`), where a forgotten stream's state is replaced by the marker.
#[derive(Debug, Clone)]
pub struct PrivacyConfig {
    pub key_table: String,
    pub hash_key: String,
    pub view_table: Option<String>,
}

impl PrivacyConfig {
    pub const VARIABLES: Variables =
        Variables { required: &["KEY_TABLE", "SUBJECT_HASH_KEY"], optional: &["VIEW_TABLE"] };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        let config = Self {
            key_table: env.var("KEY_TABLE")?,
            hash_key: env.var("SUBJECT_HASH_KEY")?,
            view_table: env.optional("VIEW_TABLE")?,
        };
        if config.hash_key.len() < MIN_HASH_KEY_BYTES {
            return Err(Error::Config(format!("SUBJECT_HASH_KEY: at least {MIN_HASH_KEY_BYTES} characters")));
        }
        Ok(config)
    }
}

/// The `keys` function's: the key table, and the KMS key new data keys are made under.
#[derive(Debug, Clone)]
pub struct KeysConfig {
    pub key_table: String,
    pub kms_key: String,
}

impl KeysConfig {
    pub const VARIABLES: Variables = Variables { required: &["KEY_TABLE", "SUBJECT_KMS_KEY"], optional: &[] };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        Ok(Self { key_table: env.var("KEY_TABLE")?, kms_key: env.var("SUBJECT_KMS_KEY")? })
    }
}
