//! Erasure by crypto-shredding (`docs/privacy.md`): an event that belongs to
//! a data subject has its personal parts sealed under that subject's own key
//! before it is first written anywhere, and forgetting the subject destroys
//! the key, so every copy (Kinesis, the tables, the archive, a dead-letter
//! queue) becomes unreadable at once while order, ids and hashes stay valid.
//!
//! - [`crate::crypto`]: the subject's keyed hash and AES-256-GCM sealing (pure, below the shapes that carry it);
//! - [`Sealer`], [`open_record`], [`Keys::open_entity_data`]: the one door to sealing and opening
//!   (key bytes never leave `privacy/`);
//! - [`SubjectRule`], [`StreamSubjects`]: who an event's subject is (`SUBJECT_FROM`, `STREAM_SUBJECTS`);
//! - [`seal`]: which parts of a record are sealed, and the `forgotten` marker (pure);
//! - [`keys`]: the data keys, wrapped by KMS in the key table, cached, forgotten; opened from a
//!   [`KeyStore`] by [`key_store`];
//! - [`maker`]: who makes new keys, and how a writer asks the `keys` function.
//! - [`manage`]: the `privacy` function's `forget`, and the `keys` function that makes keys.

mod door;
pub mod keys;
pub mod maker;
pub mod manage;
mod rules;
pub(crate) mod seal;

use std::sync::Arc;
use std::time::Duration;

use crate::config::{SubjectsConfig, DEFAULT_KEY_CACHE};
use crate::crypto;
use crate::error::{Error, Result};
pub use door::{open_record, Opened, Sealer};
use keys::Keys;
use maker::Maker;
pub use rules::{StreamSubjects, SubjectRule};

/// What a writer seals with: the keys, and how it finds and hashes subjects.
#[derive(Clone)]
pub struct Subjects {
    pub keys: Arc<Keys>,
    /// Ingested events' subjects.
    pub rule: SubjectRule,
    /// Entity streams that are subjects.
    pub streams: StreamSubjects,
    hash_key: Vec<u8>,
}

impl Subjects {
    /// From `config` (a writer's: it has the hash key), its rules read.
    pub fn new(keys: Arc<Keys>, config: &SubjectsConfig) -> Result<Self> {
        let (rule, streams) = rules(config)?;
        Ok(Self { keys, rule, streams, hash_key: config.hash_key()?.to_vec() })
    }

    /// A writer's, from its configuration (`None` without `KEY_TABLE`, or when its rules name no
    /// subject); one whose rules name subjects needs a maker of keys and the hash key.
    pub fn configured(aws: &aws_config::SdkConfig, config: Option<&SubjectsConfig>) -> Result<Option<Self>> {
        let Some(config) = config else { return Ok(None) };
        if rules(config)? == (SubjectRule::None, StreamSubjects::None) {
            return Ok(None);
        }
        if config.key_function.is_none() && config.kms_key.is_none() {
            return Err(Error::Config(
                "KEY_TABLE is set: sealing needs KEY_FUNCTION (or SUBJECT_KMS_KEY to make keys itself)".into(),
            ));
        }
        Ok(Some(Self::new(key_store(aws, KeyStore::configured(config)), config)?))
    }

    /// The subject `id` as the log keeps it.
    pub fn hash(&self, id: &str) -> String {
        crypto::subject_hash(&self.hash_key, id)
    }

    /// The entity stream `stream`, a subject, as the log keeps it beside its name.
    pub(crate) fn stream_hash(&self, stream: &str) -> String {
        crypto::stream_subject_hash(&self.hash_key, stream)
    }
}

/// The rules `config` names (none for a reader's).
fn rules(config: &SubjectsConfig) -> Result<(SubjectRule, StreamSubjects)> {
    let rule = config.subject_from.as_deref().map_or(Ok(SubjectRule::None), str::parse)?;
    let streams = config.stream_subjects.as_deref().map_or(Ok(StreamSubjects::None), str::parse)?;
    Ok((rule, streams))
}

/// Which key store, and who makes its new keys: what every user of
/// subjects' keys opens them from ([`key_store`]).
#[derive(Debug, Clone)]
pub struct KeyStore {
    pub table: String,
    pub making: Making,
    /// How long an unwrapped key is used before it is read again.
    pub cache: Duration,
}

/// Who makes a key store's new keys, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Making {
    /// Nobody: a reader, which only opens.
    Nobody,
    /// This process, under this KMS key (the `keys` function, local runs).
    Kms(String),
    /// The `keys` function of this name (writers in a stack).
    Function(String),
}

impl KeyStore {
    /// A reader's (the CLI's, named by the stack): it opens, never makes.
    pub fn reading(table: String) -> Self {
        Self { table, making: Making::Nobody, cache: DEFAULT_KEY_CACHE }
    }

    /// The store `config` names: new keys made by the keys function it
    /// names, else here under its KMS key (a reader's names neither).
    pub fn configured(config: &SubjectsConfig) -> Self {
        let making = match (&config.key_function, &config.kms_key) {
            (Some(name), _) => Making::Function(name.clone()),
            (None, Some(kms_key)) => Making::Kms(kms_key.clone()),
            (None, None) => Making::Nobody,
        };
        Self { table: config.key_table.clone(), making, cache: config.cache }
    }
}

/// The key store `store` describes, with clients made from `aws`: the one
/// way the functions and tools open subjects' keys ([`Keys::new`] below it
/// takes the clients themselves).
pub fn key_store(aws: &aws_config::SdkConfig, store: KeyStore) -> Arc<Keys> {
    let maker = match store.making {
        Making::Nobody => None,
        Making::Kms(kms_key) => Some(Maker::Kms(kms_key)),
        Making::Function(name) => Some(Maker::Function { lambda: aws_sdk_lambda::Client::new(aws), name }),
    };
    let keys = Keys::new(aws_sdk_dynamodb::Client::new(aws), aws_sdk_kms::Client::new(aws), store.table);
    Arc::new(keys.made_by(maker).cached_for(store.cache))
}
