//! Erasure by crypto-shredding (`docs/privacy.md`): an event that belongs to
//! a data subject has its personal parts sealed under that subject's own key
//! before it is first written anywhere, and forgetting the subject destroys
//! the key, so every copy (Kinesis, the tables, the archive, a dead-letter
//! queue) becomes unreadable at once while order, ids and hashes stay valid.
//!
//! - [`crate::crypto`]: the subject's keyed hash and AES-256-GCM sealing (pure, below the shapes that carry it);
//! - [`seal`]: which parts of a record are sealed, and the `forgotten` marker (pure);
//! - [`keys`]: the data keys, wrapped by KMS in the key table, cached, forgotten;
//! - [`maker`]: who makes new keys, and how a writer asks the `keys` function.
//! - [`manage`]: the `privacy` function's `forget`, and the `keys` function that makes keys.

pub mod keys;
pub mod maker;
pub mod manage;
pub mod seal;

use std::sync::Arc;

use crate::config::SubjectsConfig;
pub use crate::config::{StreamSubjects, SubjectRule};
use crate::crypto;
use crate::error::Result;
use keys::Keys;
use maker::Maker;

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
    /// From `config` (a writer's: it has the hash key).
    pub fn new(keys: Arc<Keys>, config: &SubjectsConfig) -> Result<Self> {
        let (rule, streams) = (config.rule.clone(), config.streams.clone());
        Ok(Self { keys, rule, streams, hash_key: config.hash_key()?.to_vec() })
    }

    /// A writer's, from its configuration (`None` without `KEY_TABLE`, or when its rule names no subject).
    pub fn configured(aws: &aws_config::SdkConfig, config: Option<&SubjectsConfig>) -> Result<Option<Self>> {
        match config.filter(|c| c.rule != SubjectRule::None || c.streams != StreamSubjects::None) {
            Some(config) => Ok(Some(Self::new(keys(aws, config), config)?)),
            None => Ok(None),
        }
    }

    /// The subject `id` as the log keeps it.
    pub fn hash(&self, id: &str) -> String {
        crypto::subject_hash(&self.hash_key, id)
    }
}

/// A reader's keys, from its configuration (`None` without `KEY_TABLE`).
pub fn reader_keys(aws: &aws_config::SdkConfig, config: Option<&SubjectsConfig>) -> Option<Arc<Keys>> {
    config.map(|config| keys(aws, config))
}

/// The keys in `table`, for a reader (the CLI's, named by the stack).
pub fn table_keys(aws: &aws_config::SdkConfig, table: String) -> Arc<Keys> {
    Arc::new(new_keys(aws, table))
}

fn new_keys(aws: &aws_config::SdkConfig, table: String) -> Keys {
    Keys::new(aws_sdk_dynamodb::Client::new(aws), aws_sdk_kms::Client::new(aws), table)
}

/// The keys in `table`, made here under `kms_key` (the `keys` function's).
pub fn making_keys(aws: &aws_config::SdkConfig, table: String, kms_key: String) -> Arc<Keys> {
    Arc::new(new_keys(aws, table).made_by(Some(Maker::Kms(kms_key))))
}

/// The key store `config` names, with clients made from `aws`; new keys are
/// made by the keys function it names, else here under its KMS key.
pub fn keys(aws: &aws_config::SdkConfig, config: &SubjectsConfig) -> Arc<Keys> {
    let maker = match (&config.key_function, &config.kms_key) {
        (Some(name), _) => Some(Maker::Function { lambda: aws_sdk_lambda::Client::new(aws), name: name.clone() }),
        (None, kms_key) => kms_key.clone().map(Maker::Kms),
    };
    Arc::new(new_keys(aws, config.key_table.clone()).made_by(maker).cached_for(config.cache))
}
