//! What a subscription is: its definition, validated, and the rule that
//! assigns an event to one of its partitions. Pure: no I/O.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::log::{Filter, RecordFormat, Select};
use crate::position::Checkpoint;
use crate::slices::{key_hash, part_of, KeyRange};
use crate::time::{format_ms, parse_time};
use crate::views::registry::{Kind, VIEW_PREFIX};
use crate::views::ViewRef;

/// The most partitions a subscription may have (each is one runner at a
/// time, reading its range of key hashes: [`crate::slices::MAX_SLICES`]).
pub const MAX_PARTITIONS: u32 = crate::slices::MAX_SLICES;
/// The most partitions a subscription could have before slices.
pub const MAX_PARTITIONS_BEFORE_SLICES: u32 = 64;
/// Default events per delivery: Kinesis' request limit, and a Lambda batch
/// well under the 6 MB synchronous payload.
pub const DEFAULT_BATCH_SIZE: usize = 100;
/// A subscription's name: 1 to 64 of `A-Z a-z 0-9 _ - .` (it is part of bookkeeping sort keys).
pub const MAX_NAME_LEN: usize = 64;

/// Where a subscription delivers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Target {
    /// A Kinesis stream (by name), records as playback puts them.
    Kinesis(String),
    /// A Lambda function (name or ARN), invoked synchronously with ordered batches.
    Lambda(String),
    /// A projection's view, applied exactly once (made by creating a projection, not a subscription).
    View(ViewTarget),
}

/// The view a projection's subscription keeps, and what it folds the events with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ViewTarget {
    pub view: ViewRef,
    pub kind: Kind,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Kinesis(stream) => write!(f, "kinesis:{stream}"),
            Target::Lambda(function) => write!(f, "lambda:{function}"),
            Target::View(target) => write!(f, "view:{}.v{}", target.view.projection, target.view.version),
        }
    }
}

/// What a partition does after parking an event its target keeps refusing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPoison {
    /// Park it and go on with the next event.
    #[default]
    Park,
    /// Park it and stop the partition until `resume`.
    Stop,
}

/// How a subscription's partitions divide the keys.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keying {
    /// A key's hash modulo the partition count: every partition reads the
    /// whole log (subscriptions created before slices).
    #[default]
    Modulo,
    /// Equal ranges of key hashes ([`KeyRange`]): a partition reads only the
    /// slices of its range, and a rescale moves the lines between ranges.
    Ranges,
}

/// A rescale under way: the partitions stop; once none runs, `at` is set
/// past every one's position and they deliver up to it; then the new count
/// starts from it ([`super::rescale`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rescale {
    pub to: u32,
    /// Where the old partitions stop (ms, a slot's start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<i64>,
}

/// Where the partitions of a rescaled subscription start: the common
/// position (ms, a slot's start), and the first sequence number they use
/// (past every one the partitions before used, so the consumer's rule holds
/// for a key that changed partitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub at: i64,
    pub seq: u64,
}

/// Whether the runners deliver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    #[default]
    Active,
    Paused,
}

/// A stored subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    pub name: String,
    /// Made at create: partition and parked items carry it, so what an
    /// earlier subscription of the same name left behind is never taken for its own.
    #[serde(default)]
    pub id: String,
    /// Events that arrived at or after this time (ms) are delivered.
    pub start_ms: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<Filter>,
    /// Events kept by fields in the clear: the others are never opened.
    #[serde(default, skip_serializing_if = "Select::is_empty")]
    pub select: Select,
    pub target: Target,
    pub partitions: u32,
    #[serde(default)]
    pub on_poison: OnPoison,
    pub batch_size: usize,
    #[serde(default)]
    pub record_format: RecordFormat,
    #[serde(default)]
    pub state: State,
    pub created_at: String,
    /// Absent in a subscription stored before slices: [`Keying::Modulo`].
    #[serde(default)]
    pub keying: Keying,
    /// Bumped by each rescale: a partition item of another epoch is the
    /// partitions' before, and a runner starts that partition afresh.
    #[serde(default)]
    pub epoch: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_start: Option<EpochStart>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rescale: Option<Rescale>,
}

impl Subscription {
    /// The keys partition `partition` reads.
    pub(crate) fn keys_of(&self, partition: u32) -> KeyRange {
        match self.keying {
            Keying::Modulo => KeyRange::ALL,
            Keying::Ranges => KeyRange::new(partition, self.partitions),
        }
    }

    /// Where a partition that has not run (in this epoch) starts.
    pub(crate) fn start_checkpoint(&self, unit: u64) -> Checkpoint {
        match self.epoch_start {
            Some(start) => Checkpoint { seq: start.seq, ..Checkpoint::starting_at(start.at, unit) },
            None => Checkpoint::starting_at(self.start_ms, unit),
        }
    }

    /// The earliest arrival (ms) the current partitions deliver.
    pub(crate) fn start_floor(&self) -> i64 {
        self.epoch_start.map_or(self.start_ms, |start| start.at.max(self.start_ms))
    }

    /// Where the old partitions of a rescale stop, once it is set (ms).
    pub(crate) fn stop_at(&self) -> Option<i64> {
        self.rescale.as_ref().and_then(|r| r.at)
    }

    /// A rescale waits for the partitions to stop: none may run.
    pub fn stopping(&self) -> bool {
        self.rescale.as_ref().is_some_and(|r| r.at.is_none())
    }

    /// The partition an event with this partition key belongs to: one key's
    /// events all go to one partition, in order.
    pub(crate) fn partition_of(&self, partition_key: &str) -> u32 {
        match self.keying {
            Keying::Modulo => partition_of(partition_key, self.partitions),
            Keying::Ranges => part_of(key_hash(partition_key), self.partitions),
        }
    }
}

/// `create`'s fields, as a user sends them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSubscription {
    pub name: String,
    /// `beginning`, `now`, or a time (ISO 8601 or epoch ms); default `now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<Filter>,
    #[serde(default, skip_serializing_if = "Select::is_empty")]
    pub select: Select,
    pub target: Option<Target>,
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    #[serde(default)]
    pub on_poison: OnPoison,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    #[serde(default)]
    pub record_format: RecordFormat,
}

impl NewSubscription {
    /// The subscription this asks for at `now` (ms), or why not (nothing is created then).
    pub fn validate(self, now: i64) -> Result<Subscription> {
        let target = self
            .target
            .clone()
            .ok_or_else(|| bad("target is required: {\"kinesis\": \"<stream>\"} or {\"lambda\": \"<function>\"}"))?;
        if matches!(&target, Target::Kinesis(s) | Target::Lambda(s) if s.trim().is_empty()) {
            return Err(bad("the target names no stream or function"));
        }
        if matches!(target, Target::View(_)) {
            return Err(bad("a view is the target of a projection: create the projection"));
        }
        if self.name.starts_with(VIEW_PREFIX) {
            return Err(bad(&format!("names starting with {VIEW_PREFIX:?} are projections' subscriptions")));
        }
        self.with_target(target, now)
    }

    /// The subscription of a projection's version: this, keeping `view`.
    pub(crate) fn for_view(self, view: ViewTarget, now: i64) -> Result<Subscription> {
        self.with_target(Target::View(view), now)
    }

    fn with_target(self, target: Target, now: i64) -> Result<Subscription> {
        check_name(&self.name)?;
        let start_ms = parse_start(self.start.as_deref().unwrap_or("now"), now)?;
        let partitions = self.partitions.unwrap_or(1);
        check_partitions(partitions)?;
        let batch_size = self.batch_size.unwrap_or(DEFAULT_BATCH_SIZE);
        // A built-in view folds its batches in this process; every other target is sent them.
        let most = match &target {
            Target::View(ViewTarget { kind: Kind::Builtin(_), .. }) => crate::views::BUILTIN_BATCH,
            _ => crate::batch::KINESIS_BATCH_RECORDS,
        };
        if !(1..=most).contains(&batch_size) {
            return Err(bad(&format!("batch_size must be 1 to {most}, not {batch_size}")));
        }
        for filter in &self.filter {
            if !(filter.field.is_empty() || filter.field.starts_with('/')) {
                return Err(bad(&format!("filter field {:?} is not a JSON pointer (/a/b)", filter.field)));
            }
        }
        self.select.check()?;
        Ok(Subscription {
            name: self.name,
            id: uuid::Uuid::new_v4().simple().to_string(),
            start_ms,
            filter: self.filter,
            select: self.select,
            target,
            partitions,
            on_poison: self.on_poison,
            batch_size,
            record_format: self.record_format,
            state: State::Active,
            created_at: format_ms(now),
            keying: Keying::Ranges,
            epoch: 0,
            epoch_start: None,
            rescale: None,
        })
    }
}

/// A partition count: 1 to [`MAX_PARTITIONS`].
pub fn check_partitions(partitions: u32) -> Result<u32> {
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        return Err(bad(&format!("partitions must be 1 to {MAX_PARTITIONS}, not {partitions}")));
    }
    Ok(partitions)
}

fn bad(message: &str) -> Error {
    Error::BadInput(message.to_owned())
}

/// Names are part of bookkeeping sort keys: a short, plain alphabet.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > MAX_NAME_LEN || !name.chars().all(plain) {
        return Err(bad(&format!("subscription name {name:?}: 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 _ - .")));
    }
    Ok(())
}

/// `beginning` (the first event ever), `now`, or a time not in the future.
pub fn parse_start(start: &str, now: i64) -> Result<i64> {
    let ms = match start {
        "beginning" => 0,
        "now" => now,
        time => parse_time(time)?,
    };
    if ms > now {
        return Err(bad(&format!("start {} is in the future", format_ms(ms))));
    }
    Ok(ms.max(0))
}

/// The partition (of `partitions`) an event with this partition key belongs
/// to under [`Keying::Modulo`].
fn partition_of(partition_key: &str, partitions: u32) -> u32 {
    (key_hash(partition_key) % u64::from(partitions.max(1))) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_000_000_000;

    fn new(name: &str) -> NewSubscription {
        NewSubscription { name: name.into(), target: Some(Target::Kinesis("s".into())), ..Default::default() }
    }

    #[test]
    fn a_valid_request_gets_its_defaults() {
        let sub = new("orders-v1").validate(NOW).unwrap();
        assert_eq!((sub.start_ms, sub.partitions, sub.batch_size), (NOW, 1, DEFAULT_BATCH_SIZE));
        assert_eq!((sub.state, sub.on_poison), (State::Active, OnPoison::Park));
        let from_start = NewSubscription { start: Some("beginning".into()), ..new("a") }.validate(NOW).unwrap();
        assert_eq!(from_start.start_ms, 0);
        let two_days = NewSubscription { start: Some(format_ms(NOW - 172_800_000)), ..new("a") };
        assert_eq!(two_days.validate(NOW).unwrap().start_ms, NOW - 172_800_000);
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let cases = [
            (new(""), "name"),
            (new("has space"), "name"),
            (new(&"x".repeat(65)), "name"),
            (new("a#b"), "name"),
            (NewSubscription { start: Some(format_ms(NOW + 60_000)), ..new("a") }, "future"),
            (NewSubscription { start: Some("yesterday-ish".into()), ..new("a") }, "time"),
            (NewSubscription { target: None, ..new("a") }, "target"),
            (NewSubscription { partitions: Some(0), ..new("a") }, "partitions"),
            (NewSubscription { partitions: Some(1025), ..new("a") }, "partitions"),
            (NewSubscription { batch_size: Some(501), ..new("a") }, "batch_size"),
            (
                NewSubscription { filter: vec![Filter { field: "path".into(), equals: 1.into() }], ..new("a") },
                "pointer",
            ),
        ];
        for (request, word) in cases {
            let err = request.clone().validate(NOW).expect_err(&format!("{request:?}"));
            assert!(matches!(&err, Error::BadInput(m) if m.contains(word)), "{request:?}: {err}");
        }
    }

    #[test]
    fn targets_and_requests_parse_strictly() {
        let request: NewSubscription = serde_json::from_value(serde_json::json!({
            "name": "a", "target": {"lambda": "consumer"}, "partitions": 8, "on_poison": "stop"
        }))
        .unwrap();
        assert_eq!(request.target, Some(Target::Lambda("consumer".into())));
        assert_eq!(request.on_poison, OnPoison::Stop);
        assert!(serde_json::from_value::<NewSubscription>(serde_json::json!({"name": "a", "target": {"sqs": "q"}}))
            .is_err());
        assert!(serde_json::from_value::<NewSubscription>(serde_json::json!({"name": "a", "partition": 2})).is_err());
    }

    #[test]
    fn one_keys_events_share_a_partition_and_keys_spread_over_all() {
        assert_eq!(partition_of("user-7", 8), partition_of("user-7", 8));
        let mut counts = [0usize; 8];
        for i in 0..8_000 {
            counts[partition_of(&format!("user-{i}"), 8) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1_200).contains(&c)), "{counts:?}");
        assert_eq!(partition_of("anything", 1), 0);
    }

    #[test]
    fn a_new_subscription_splits_keys_by_ranges_and_one_stored_before_by_modulo() {
        let sub = NewSubscription { partitions: Some(8), ..new("a") }.validate(NOW).unwrap();
        assert_eq!(sub.keying, Keying::Ranges);
        for i in 0..500 {
            let key = format!("user-{i}");
            let p = sub.partition_of(&key);
            assert!(sub.keys_of(p).holds(&key) && !sub.keys_of((p + 1) % 8).holds(&key));
        }
        let mut stored = serde_json::to_value(&sub).unwrap();
        stored.as_object_mut().unwrap().remove("keying");
        let old: Subscription = serde_json::from_value(stored).unwrap();
        assert_eq!((old.keying, old.keys_of(3)), (Keying::Modulo, KeyRange::ALL));
        assert_eq!(old.partition_of("user-7"), partition_of("user-7", 8));
    }
}
