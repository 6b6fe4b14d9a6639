//! Per-subject encryption's settings (`docs/privacy.md`), read by every
//! function that seals or opens: without `KEY_TABLE` nothing is sealed, and a
//! reader that meets a sealed event fails instead of handing it out sealed.

use std::time::Duration;

use super::{Env, Variables};
use crate::error::{Error, Result};
use crate::privacy::keys::DEFAULT_CACHE;
use crate::privacy::SubjectRule;

/// The shortest `SUBJECT_HASH_KEY`: 32 bytes, HMAC-SHA256's block of strength.
pub const MIN_HASH_KEY_BYTES: usize = 32;

/// Where subjects' keys are, and (for writers) how subjects are found and hashed.
#[derive(Debug, Clone)]
pub struct SubjectsConfig {
    pub key_table: String,
    /// The KMS key new data keys are made under (writers).
    pub kms_key: Option<String>,
    /// The secret the subject's id is hashed with (writers, and `forget`).
    pub hash_key: Option<String>,
    /// Where an ingested event's subject comes from (`SUBJECT_FROM`, default `EntityId`).
    pub rule: SubjectRule,
    /// How long an unwrapped key is used (`KEY_CACHE_SECONDS`).
    pub cache: Duration,
}

impl SubjectsConfig {
    /// `None` when `KEY_TABLE` is unset. A reader reads `KEY_TABLE` and
    /// `KEY_CACHE_SECONDS`; a `writer` (it seals) also `SUBJECT_KMS_KEY`,
    /// `SUBJECT_HASH_KEY` and `SUBJECT_FROM`, and needs the first two.
    pub(super) fn from_env(env: &Env, writer: bool) -> Result<Option<Self>> {
        let Some(key_table) = env.raw("KEY_TABLE") else { return Ok(None) };
        let seconds: u64 = env.var_or("KEY_CACHE_SECONDS", DEFAULT_CACHE.as_secs())?;
        if seconds > 3600 {
            return Err(Error::Config(format!("KEY_CACHE_SECONDS={seconds}: at most 3600 (a forget waits that long)")));
        }
        let cache = Duration::from_secs(seconds);
        if !writer {
            return Ok(Some(Self { key_table, kms_key: None, hash_key: None, rule: SubjectRule::None, cache }));
        }
        let config = Self {
            key_table,
            kms_key: env.raw("SUBJECT_KMS_KEY"),
            hash_key: env.raw("SUBJECT_HASH_KEY"),
            rule: env.raw("SUBJECT_FROM").map_or(Ok(SubjectRule::EntityId), |rule| rule.parse())?,
            cache,
        };
        if config.rule != SubjectRule::None {
            if config.kms_key.is_none() {
                return Err(Error::Config("KEY_TABLE is set: sealing needs SUBJECT_KMS_KEY too".into()));
            }
            config.hash_key()?;
        }
        Ok(Some(config))
    }

    /// The hash key's bytes, at least [`MIN_HASH_KEY_BYTES`].
    pub fn hash_key(&self) -> Result<&[u8]> {
        match self.hash_key.as_deref() {
            Some(key) if key.len() >= MIN_HASH_KEY_BYTES => Ok(key.as_bytes()),
            Some(_) => Err(Error::Config(format!("SUBJECT_HASH_KEY: at least {MIN_HASH_KEY_BYTES} characters"))),
            None => Err(Error::Config("KEY_TABLE is set: SUBJECT_HASH_KEY is needed to hash subjects".into())),
        }
    }
}

/// The `privacy` function's (`forget`): the key table, and the secret subjects are hashed with.
#[derive(Debug, Clone)]
pub struct PrivacyConfig {
    pub key_table: String,
    pub hash_key: String,
}

impl PrivacyConfig {
    pub const VARIABLES: Variables = Variables { required: &["KEY_TABLE", "SUBJECT_HASH_KEY"], optional: &[] };

    pub fn from_env() -> Result<Self> {
        let env = Env(Self::VARIABLES);
        let config = Self { key_table: env.var("KEY_TABLE")?, hash_key: env.var("SUBJECT_HASH_KEY")? };
        if config.hash_key.len() < MIN_HASH_KEY_BYTES {
            return Err(Error::Config(format!("SUBJECT_HASH_KEY: at least {MIN_HASH_KEY_BYTES} characters")));
        }
        Ok(config)
    }
}
