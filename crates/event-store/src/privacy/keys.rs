//! Subjects' data keys (`docs/privacy.md`): one AES-256 key per subject and
//! generation, made by KMS (`GenerateDataKeyWithoutPlaintext`) and kept in the key table only
//! wrapped by the store's KMS key, with the subject's hash and the generation
//! as encryption context (a wrapped key moved to another subject does not
//! unwrap). Forgetting a subject removes its wrapped keys: nothing can open
//! its events again, wherever they lie.
//!
//! The key table, partition `subject` (the keyed hash), sort key `item`:
//! - `head`: the current generation (`gen`) and `state` (`active` or `forgotten`);
//! - `g#<gen>`: that generation's `wrapped` key, gone once forgotten (then `forgotten_at`);
//! - `forgot#<time>`: who forgot the subject and when (never the plain id).
//!
//! Keys are made by one role only ([`Maker`]): in a stack the `keys` function
//! (`GenerateDataKeyWithoutPlaintext`, conditional writes that only ever add
//! a generation), so writers' roles can read the key table but never
//! overwrite a key. Writers unwrap the new key as any reader does.
//!
//! Unwrapped keys are kept in memory for `KEY_CACHE_SECONDS` (default 60), so
//! KMS sees about one request per subject and minute per warm function, not
//! one per event; a forgotten generation is remembered for good. The price is
//! a window: for up to that long after a forget, a warm function may still
//! open (and seal under) the forgotten key.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_kms::primitives::Blob;
use aws_sdk_kms::types::DataKeySpec;

pub use super::maker::Maker;
use crate::error::{Error, Result};
use crate::time::{format_ms, now_ms};

pub const HASH_KEY: &str = "subject";
pub const RANGE_KEY: &str = "item";
const HEAD: &str = "head";
/// Default `KEY_CACHE_SECONDS`.
pub use crate::config::DEFAULT_KEY_CACHE as DEFAULT_CACHE;
/// Keys kept in memory at most; past it the expired ones go, then all.
const CACHE_ENTRIES: usize = 10_000;

fn generation_item(generation: u64) -> String {
    format!("g#{generation:010}")
}

/// A generation of a subject's key, as a reader finds it.
#[derive(Clone)]
pub(super) enum Key {
    Active(Arc<[u8; 32]>),
    /// Its wrapped key was destroyed at `at` (ISO 8601).
    Forgotten {
        at: String,
    },
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Active(_) => f.write_str("Key::Active(..)"),
            Key::Forgotten { at } => write!(f, "Key::Forgotten {{ at: {at} }}"),
        }
    }
}

/// What [`Keys::forget`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forgot {
    /// The subject's keys are destroyed now; `generations` of them (also
    /// when an earlier forget marked it and stopped before destroying them).
    Done { generations: usize },
    /// It was forgotten before, and nothing of it was left.
    Already,
    /// No key was ever made for it: nothing written, nothing to forget.
    Unknown,
}

/// The key table and KMS, with the unwrapped keys this function has used.
pub struct Keys {
    dynamo: aws_sdk_dynamodb::Client,
    kms: aws_sdk_kms::Client,
    table: String,
    maker: Option<Maker>,
    ttl: Duration,
    /// (subject, generation) → key, and when it was unwrapped.
    opened: Mutex<HashMap<(String, u64), (Instant, Key)>>,
    /// subject → the generation writers seal under.
    current: Mutex<HashMap<String, (Instant, u64)>>,
    /// One fetch at a time per key: concurrent misses of one key wait for the
    /// first and find it cached, rather than each asking KMS (and racing to create it).
    flights: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    kms_requests: AtomicU64,
}

impl Keys {
    pub fn new(dynamo: aws_sdk_dynamodb::Client, kms: aws_sdk_kms::Client, table: String) -> Self {
        Self {
            dynamo,
            kms,
            table,
            maker: None,
            ttl: DEFAULT_CACHE,
            opened: Mutex::default(),
            current: Mutex::default(),
            flights: Mutex::default(),
            kms_requests: AtomicU64::new(0),
        }
    }

    /// Has new data keys made by `maker`.
    pub fn made_by(mut self, maker: Option<Maker>) -> Self {
        self.maker = maker;
        self
    }

    /// How long an unwrapped key is used before it is read again.
    pub fn cached_for(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// KMS requests this instance has sent (what the cache saves is measured by it).
    pub fn kms_requests(&self) -> u64 {
        self.kms_requests.load(Ordering::Relaxed)
    }

    /// The generation and key to seal `subject`'s new events under: its
    /// current one, or a new one when it has none or was forgotten.
    pub(super) async fn sealing_key(&self, subject: &str) -> Result<(u64, Arc<[u8; 32]>)> {
        if let Some(found) = self.current_key(subject).await? {
            return Ok(found);
        }
        let _turn = self.flight(subject).await;
        if let Some(found) = self.current_key(subject).await? {
            return Ok(found);
        }
        for _ in 0..5 {
            let generation = match self.head(subject).await? {
                Some(Head { generation, forgotten: false }) => generation,
                _ => self.made(subject).await?,
            };
            match self.key(subject, generation).await? {
                Key::Active(key) => {
                    remember(&self.current, self.ttl, subject.to_owned(), (Instant::now(), generation));
                    return Ok((generation, key));
                }
                // Destroyed while the head says active: a forget ran as this generation was made (it
                // destroys every generation it finds). The maker makes the next one.
                Key::Forgotten { .. } => {
                    self.made(subject).await?;
                }
            }
        }
        Err(Error::Key(format!("subject {subject}: its key kept changing while read (forgotten over and over?)")))
    }

    /// Has [`Keys::make`] run, by the maker, and says the generation it made current.
    async fn made(&self, subject: &str) -> Result<u64> {
        match &self.maker {
            Some(Maker::Kms(_)) => self.make(subject).await,
            Some(Maker::Function { lambda, name }) => super::maker::invoke(lambda, name, subject).await,
            None => {
                Err(Error::Config("sealing needs KEY_FUNCTION or SUBJECT_KMS_KEY (who makes subjects' keys)".into()))
            }
        }
    }

    /// The generation `subject`'s new events are sealed under, made here when
    /// it has none, was forgotten, or its current one was destroyed (what the
    /// `keys` function runs). Never opens a key, never overwrites an item.
    pub(crate) async fn make(&self, subject: &str) -> Result<u64> {
        for _ in 0..5 {
            let generation = match self.head(subject).await? {
                None => self.create(subject, 0).await?,
                Some(Head { generation, forgotten: true }) => self.create(subject, generation + 1).await?,
                Some(Head { generation, forgotten: false }) => generation,
            };
            let item = self.get(subject, &generation_item(generation)).await?;
            if item.is_some_and(|item| item.contains_key("wrapped")) {
                return Ok(generation);
            }
            // Destroyed while the head says active: a forget ran as it was made (it destroys every
            // generation it finds). The next one is new.
            self.create(subject, generation + 1).await?;
        }
        Err(Error::Key(format!("subject {subject}: its key kept changing while made (forgotten over and over?)")))
    }

    /// The cached current generation's key, if it is cached and active.
    async fn current_key(&self, subject: &str) -> Result<Option<(u64, Arc<[u8; 32]>)>> {
        let cached = lock(&self.current).get(subject).filter(|(at, _)| at.elapsed() < self.ttl).map(|(_, g)| *g);
        let Some(generation) = cached else { return Ok(None) };
        match self.key(subject, generation).await? {
            Key::Active(key) => Ok(Some((generation, key))),
            Key::Forgotten { .. } => Ok(None),
        }
    }

    /// Waits for any fetch of `id` in flight, and holds the next one.
    async fn flight(&self, id: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let turn = {
            let mut flights = lock(&self.flights);
            if flights.len() >= CACHE_ENTRIES {
                flights.retain(|_, turn| Arc::strong_count(turn) > 1);
            }
            flights.entry(id.to_owned()).or_default().clone()
        };
        turn.lock_owned().await
    }

    /// The key of `id` from the cache, if it is there and still good.
    fn cached(&self, id: &(String, u64)) -> Option<Key> {
        let opened = lock(&self.opened);
        let (at, key) = opened.get(id)?;
        (matches!(key, Key::Forgotten { .. }) || at.elapsed() < self.ttl).then(|| key.clone())
    }

    /// Generation `generation` of `subject`'s key, to open its events with.
    pub(super) async fn key(&self, subject: &str, generation: u64) -> Result<Key> {
        let id = (subject.to_owned(), generation);
        if let Some(key) = self.cached(&id) {
            return Ok(key);
        }
        let _turn = self.flight(&format!("{subject}#{generation}")).await;
        if let Some(key) = self.cached(&id) {
            return Ok(key);
        }
        let item = self.get(subject, &generation_item(generation)).await?.ok_or_else(|| {
            // Not "unreadable": a reader pointed at the wrong table must fail, not skip every event.
            Error::Key(format!("subject {subject} has no key generation {generation} in {}", self.table))
        })?;
        let key = match item.get("wrapped") {
            Some(AttributeValue::B(wrapped)) => {
                let plain = self.unwrap(subject, generation, wrapped.as_ref().to_vec(), &item).await?;
                Key::Active(Arc::new(plain))
            }
            _ => Key::Forgotten { at: text(&item, "forgotten_at").unwrap_or_default() },
        };
        remember(&self.opened, self.ttl, id, (Instant::now(), key.clone()));
        Ok(key)
    }

    /// Destroys every generation of `subject`'s key, recording `by` and
    /// when. Idempotent: a second call finishes what a first left and says
    /// [`Forgot::Already`].
    pub async fn forget(&self, subject: &str, by: &str) -> Result<Forgot> {
        let Some(head) = self.head(subject).await? else { return Ok(Forgot::Unknown) };
        let at = format_ms(now_ms());
        let first = !head.forgotten;
        if first {
            // Who and when first, so a forget that stops half-way is on record.
            self.dynamo
                .put_item()
                .table_name(&self.table)
                .item(HASH_KEY, AttributeValue::S(subject.to_owned()))
                .item(RANGE_KEY, AttributeValue::S(format!("forgot#{at}")))
                .item("at", AttributeValue::S(at.clone()))
                .item("by", AttributeValue::S(by.to_owned()))
                .item("gen", AttributeValue::N(head.generation.to_string()))
                .send()
                .await
                .map_err(|e| Error::dynamo("PutItem", e))?;
            // Writers read the head: from now on they make a new generation.
            self.dynamo
                .update_item()
                .table_name(&self.table)
                .set_key(Some(item_key(subject, HEAD)))
                .update_expression("SET #state = :forgotten, forgotten_at = :at, forgotten_by = :by")
                .condition_expression("attribute_exists(#item)")
                .expression_attribute_names("#state", "state")
                .expression_attribute_names("#item", RANGE_KEY)
                .expression_attribute_values(":forgotten", AttributeValue::S("forgotten".into()))
                .expression_attribute_values(":at", AttributeValue::S(at.clone()))
                .expression_attribute_values(":by", AttributeValue::S(by.to_owned()))
                .send()
                .await
                .map_err(|e| Error::dynamo("UpdateItem", e))?;
        }
        let mut destroyed = 0;
        let items =
            crate::dynamo::query_partition(&self.dynamo, &self.table, (HASH_KEY, AttributeValue::S(subject.into())))
                .await?;
        for item in items {
            let Some(name) = text(&item, RANGE_KEY).filter(|name| name.starts_with("g#")) else { continue };
            if !item.contains_key("wrapped") {
                continue;
            }
            self.dynamo
                .update_item()
                .table_name(&self.table)
                .set_key(Some(item_key(subject, &name)))
                .update_expression("REMOVE #wrapped SET forgotten_at = :at")
                .expression_attribute_names("#wrapped", "wrapped")
                .expression_attribute_values(":at", AttributeValue::S(at.clone()))
                .send()
                .await
                .map_err(|e| Error::dynamo("UpdateItem", e))?;
            destroyed += 1;
        }
        lock(&self.opened).retain(|(s, _), _| s != subject);
        lock(&self.current).remove(subject);
        // A forget that stopped half-way left generations: destroying them now is this forget's work.
        Ok(if first || destroyed > 0 { Forgot::Done { generations: destroyed } } else { Forgot::Already })
    }

    /// One item of `subject`'s partition, read strongly consistent.
    async fn get(&self, subject: &str, item: &str) -> Result<Option<HashMap<String, AttributeValue>>> {
        let out = self
            .dynamo
            .get_item()
            .table_name(&self.table)
            .set_key(Some(item_key(subject, item)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| Error::dynamo("GetItem", e))?;
        Ok(out.item)
    }

    async fn head(&self, subject: &str) -> Result<Option<Head>> {
        let Some(item) = self.get(subject, HEAD).await? else { return Ok(None) };
        let generation = match item.get("gen") {
            Some(AttributeValue::N(n)) => n.parse().ok(),
            _ => None,
        }
        .ok_or_else(|| Error::Malformed(format!("the key head of {subject} has no gen")))?;
        Ok(Some(Head { generation, forgotten: text(&item, "state").as_deref() == Some("forgotten") }))
    }

    /// Makes generation `generation` of `subject`'s key (or finds the one a
    /// concurrent maker made) and makes it the current one. The key is made
    /// wrapped only: whoever seals under it unwraps it as a reader does.
    async fn create(&self, subject: &str, generation: u64) -> Result<u64> {
        let Some(Maker::Kms(kms_key)) = &self.maker else {
            return Err(Error::Config("only a maker with SUBJECT_KMS_KEY makes keys".into()));
        };
        self.kms_requests.fetch_add(1, Ordering::Relaxed);
        let made = self
            .kms
            .generate_data_key_without_plaintext()
            .key_id(kms_key)
            .key_spec(DataKeySpec::Aes256)
            .set_encryption_context(Some(context(subject, generation)))
            .send()
            .await
            .map_err(|e| Error::kms("GenerateDataKeyWithoutPlaintext", e))?;
        let wrapped = made.ciphertext_blob().ok_or_else(|| Error::Key("KMS sent no wrapped key".into()))?;
        let put = self
            .dynamo
            .put_item()
            .table_name(&self.table)
            .item(HASH_KEY, AttributeValue::S(subject.to_owned()))
            .item(RANGE_KEY, AttributeValue::S(generation_item(generation)))
            .item("wrapped", AttributeValue::B(aws_sdk_dynamodb::primitives::Blob::new(wrapped.as_ref())))
            .item("kms_key", AttributeValue::S(made.key_id().unwrap_or(kms_key).to_owned()))
            .item("created_at", AttributeValue::S(format_ms(now_ms())))
            .condition_expression("attribute_not_exists(#item)")
            .expression_attribute_names("#item", RANGE_KEY)
            .send()
            .await;
        match put {
            Ok(_) => {}
            // Another maker made this generation first: theirs is the one.
            Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => {}
            Err(e) => return Err(Error::dynamo("PutItem", e)),
        }
        let moved = self
            .dynamo
            .update_item()
            .table_name(&self.table)
            .set_key(Some(item_key(subject, HEAD)))
            .update_expression("SET #gen = :gen, #state = :active REMOVE forgotten_at, forgotten_by")
            .condition_expression("attribute_not_exists(#gen) OR #gen < :gen")
            .expression_attribute_names("#gen", "gen")
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":gen", AttributeValue::N(generation.to_string()))
            .expression_attribute_values(":active", AttributeValue::S("active".into()))
            .send()
            .await;
        match moved {
            Ok(_) => Ok(generation),
            // The head is at this generation or past it already (a concurrent writer, or a forget and another write).
            Err(e) if e.as_service_error().is_some_and(|s| s.is_conditional_check_failed_exception()) => {
                Ok(self.head(subject).await?.map_or(generation, |head| head.generation))
            }
            Err(e) => Err(Error::dynamo("UpdateItem", e)),
        }
    }

    async fn unwrap(
        &self,
        subject: &str,
        generation: u64,
        wrapped: Vec<u8>,
        item: &HashMap<String, AttributeValue>,
    ) -> Result<[u8; 32]> {
        self.kms_requests.fetch_add(1, Ordering::Relaxed);
        let plain = self
            .kms
            .decrypt()
            .ciphertext_blob(Blob::new(wrapped))
            .set_key_id(text(item, "kms_key"))
            .set_encryption_context(Some(context(subject, generation)))
            .send()
            .await
            .map_err(|e| Error::kms("Decrypt", e))?;
        let bytes = plain.plaintext().map(|p| p.as_ref()).unwrap_or_default();
        bytes.try_into().map_err(|_| Error::Key(format!("KMS unwrapped a {}-byte data key", bytes.len())))
    }
}

struct Head {
    generation: u64,
    forgotten: bool,
}

/// The key of item `item` of `subject`'s partition.
fn item_key(subject: &str, item: &str) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (HASH_KEY.to_owned(), AttributeValue::S(subject.to_owned())),
        (RANGE_KEY.to_owned(), AttributeValue::S(item.to_owned())),
    ])
}

/// The KMS encryption context of a subject's key: bound to the subject and generation.
fn context(subject: &str, generation: u64) -> HashMap<String, String> {
    HashMap::from([("es:subject".to_owned(), subject.to_owned()), ("es:gen".to_owned(), generation.to_string())])
}

fn text(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps `value` under `key`, within [`CACHE_ENTRIES`].
fn remember<K: std::hash::Hash + Eq, V>(
    cache: &Mutex<HashMap<K, (Instant, V)>>,
    ttl: Duration,
    key: K,
    value: (Instant, V),
) {
    let mut cache = lock(cache);
    if cache.len() >= CACHE_ENTRIES {
        cache.retain(|_, (at, _)| at.elapsed() < ttl);
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
    }
    cache.insert(key, value);
}
