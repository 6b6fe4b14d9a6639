//! Subscriptions: durable, checkpointed consumers of the complete log.
//!
//! A subscription ([`crate::readers::subscriptions::spec`]) delivers every event that arrived from its
//! start on, and passes its filter, to its target ([`target`]: a Kinesis
//! stream or a Lambda function), in order per partition key, forever. Its
//! events are split over N partitions by a hash of their partition key;
//! each partition has one runner at a time ([`runner`]), which reads only
//! complete slots (so a late writer cannot be missed: the completeness
//! watermark, not a backtracking heuristic) and saves its checkpoint
//! after every delivery, fenced by its lease ([`crate::readers::subscriptions`]).
//!
//! One Lambda function does it all, by payload:
//! - a schedule event (anything without `action` or `run`): the **tick**:
//!   measures each subscription's lag and starts a runner (an asynchronous
//!   self-invocation) for every partition that has none;
//! - `{"run": {"subscription", "partition"}}`: a partition's runner; where
//!   it starts comes from the stored checkpoint, never from the payload;
//! - `{"action": ...}`: management ([`manage`]): create, list, pause,
//!   resume, reset, delete, parked, redrive.
//!
//! Invoked through its `tick` alias ([`TICK_ALIAS`]), it ticks whatever the
//! payload: the awake scan may invoke that alias alone, so it can start a
//! tick and nothing else.

pub(crate) mod follow;
pub mod manage;
pub mod metrics;
pub mod projections;
pub(crate) mod rebuild;
pub(crate) mod run;
pub(crate) mod runner;
pub(crate) mod target;

use std::sync::Arc;
use std::time::SystemTime;

use aws_sdk_kinesis::config::retry::RetryConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::{info, warn};

pub(crate) use crate::readers::subscriptions::position_ms;
pub use crate::readers::subscriptions::{
    status, statuses, NewSubscription, OnPoison, PartitionStatus, State, Subscription, SubscriptionStatus, Target,
};
pub use manage::Manage;
pub use run::{PartitionTask, RunStatus, RunSummary};

use crate::batch::Backoff;
use crate::bookkeeping::settings;
use crate::bookkeeping::watermark;
use crate::config::SubscriptionConfig;
use crate::error::{Error, Result};
use crate::invoke::{continue_with, Invoker};
use crate::time::format_ms;

/// The AWS actions this function calls, and so the only ones its IAM role grants.
pub const AWS_ACTIONS: &[&str] = &[
    "dynamodb:Query",
    "dynamodb:GetItem",
    // Its partitions' items, each under a key of its own.
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:BatchWriteItem",
    // An upgraded stack's subscription moved only if no delete left word since (a transaction's check).
    "dynamodb:ConditionCheckItem",
    // Kinesis targets: put, check at create, read back after an ambiguous failure.
    "kinesis:PutRecords",
    "kinesis:DescribeStreamSummary",
    "kinesis:ListShards",
    "kinesis:GetShardIterator",
    "kinesis:GetRecords",
    // Lambda targets, and runners started by the tick or continued (itself).
    "lambda:InvokeFunction",
    // Slots before the archive's boundary (`ARCHIVE_BUCKET`).
    "s3:GetObject",
    // Not called: S3 answers a missing key 404 (an unreadable event) only to a role that may list
    // the bucket, and 403 (a failure retried for ever) to one that may not.
    "s3:ListBucket",
    // Unwrapping subjects' data keys, to open sealed events (`KEY_TABLE`).
    "kms:Decrypt",
];

pub struct Subscriptions {
    pub(crate) dynamo: aws_sdk_dynamodb::Client,
    /// Reads Kinesis targets back after an ambiguous put failure.
    pub(crate) kinesis: aws_sdk_kinesis::Client,
    /// Puts on Kinesis targets without the SDK's blind retries (see `Playback`).
    pub(crate) putter: aws_sdk_kinesis::Client,
    /// Invokes Lambda targets.
    pub(crate) lambda: aws_sdk_lambda::Client,
    pub(crate) config: SubscriptionConfig,
    pub(crate) invoker: Arc<dyn Invoker>,
    pub(crate) backoff: Backoff,
    time_unit_checked: tokio::sync::OnceCell<()>,
    /// Where slots are read from (see `Playback`).
    tiers: crate::log::tiers::Tiers,
    /// The CloudWatch namespace runners write their delivery latency to (EMF on stdout), if any.
    pub(crate) metrics: Option<String>,
}

/// What a tick did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TickSummary {
    pub watermark: Option<String>,
    pub subscriptions: Vec<SubscriptionStatus>,
    /// Partition runners started.
    pub started: usize,
    /// Projections whose rebuilt version serves from this tick on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub switched: Vec<String>,
}

impl Subscriptions {
    /// A reader of the event table within `window`, for the keys `keys`, with this function's settings.
    pub(crate) fn reader<'w>(
        &'w self,
        window: &'w crate::log::Window,
        keys: crate::slices::KeyRange,
    ) -> crate::log::reader::Reader<'w> {
        crate::log::reader::Reader {
            dynamo: &self.dynamo,
            table: &self.config.event_table,
            time_unit_ms: self.config.time_unit_ms,
            page_items: self.config.page_items,
            dedupe_window_ms: self.config.dedupe_window_ms,
            window,
            keys,
            tiers: &self.tiers,
        }
    }

    /// `lambda` invokes targets; `invoker` starts runners (this function itself).
    pub fn new(
        dynamo: aws_sdk_dynamodb::Client,
        kinesis: aws_sdk_kinesis::Client,
        lambda: aws_sdk_lambda::Client,
        config: SubscriptionConfig,
        invoker: Arc<dyn Invoker>,
    ) -> Self {
        let no_retries = kinesis.config().to_builder().retry_config(RetryConfig::disabled()).build();
        Self {
            dynamo,
            putter: aws_sdk_kinesis::Client::from_conf(no_retries),
            kinesis,
            lambda,
            config,
            invoker,
            backoff: Backoff::default(),
            time_unit_checked: Default::default(),
            tiers: crate::log::tiers::Tiers::new(None),
            metrics: None,
        }
    }

    /// Runners write `DeliveryLatencySeconds` lines (embedded metric format, on stdout) to
    /// the configured `METRICS_NAMESPACE`: in Lambda, where CloudWatch reads them from the log.
    pub fn with_metrics(mut self) -> Self {
        self.metrics = Some(self.config.metrics_namespace.clone());
        self
    }

    /// Reads archived slots from `bucket` (`ARCHIVE_BUCKET`).
    pub fn with_archive(mut self, bucket: Option<crate::archive::object::Bucket>) -> Self {
        self.tiers = crate::log::tiers::Tiers::new(bucket).with_keys(self.tiers.keys());
        self
    }

    /// Opens sealed events with `keys` (`KEY_TABLE`, [`crate::privacy`]).
    pub fn with_keys(mut self, keys: Option<std::sync::Arc<crate::privacy::keys::Keys>>) -> Self {
        self.tiers = std::mem::replace(&mut self.tiers, crate::log::tiers::Tiers::new(None)).with_keys(keys);
        self
    }

    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// One invocation through `invoked_arn` (the context's `invoked_function_arn`):
    /// through the tick alias a tick, whatever the payload; otherwise as [`Self::handle`].
    pub async fn handle_invoked(&self, invoked_arn: &str, payload: Value, deadline: SystemTime) -> Result<Answer> {
        if through_tick_alias(invoked_arn) {
            return Ok(Answer::Ticked(Box::pin(self.tick()).await?));
        }
        // Boxed: each kind of invocation's future is deep, and the compiler lays them out nested.
        Box::pin(self.handle(payload, deadline)).await
    }

    /// One invocation: a tick, a partition run, or a management action (see the module doc).
    pub async fn handle(&self, payload: Value, deadline: SystemTime) -> Result<Answer> {
        Ok(if payload.get("action").is_some() {
            let request: Manage =
                serde_json::from_value(payload).map_err(|e| Error::BadInput(format!("subscription action: {e}")))?;
            Answer::Managed(Box::pin(self.manage(request)).await?)
        } else if let Some(task) = payload.get("run") {
            let task: PartitionTask =
                serde_json::from_value(task.clone()).map_err(|e| Error::BadInput(format!("subscription run: {e}")))?;
            Answer::Ran(Box::pin(self.run_partition(task, deadline)).await?)
        } else {
            Answer::Ticked(Box::pin(self.tick()).await?)
        })
    }

    /// Refuses a slot size other than the one the scan recorded (see [`settings`]).
    pub(crate) async fn ensure_time_unit(&self) -> Result<()> {
        let (dynamo, table, unit) = (&self.dynamo, &self.config.event_table, self.config.time_unit_ms);
        self.time_unit_checked.get_or_try_init(|| settings::check_time_unit(dynamo, table, unit)).await.map(|_| ())
    }

    /// The watermark itself (ms): every event that arrived before it is in
    /// the event table, so a runner delivers up to it, mid-slot too (a slot
    /// boundary would add up to a slot's length to every delivery's latency).
    pub(crate) async fn complete_to(&self) -> Result<Option<i64>> {
        Ok(watermark::read(&self.dynamo, &self.config.event_table).await?.time)
    }

    /// The end of the last complete slot, if every scan segment has finished a pass.
    pub(crate) async fn complete_end(&self) -> Result<Option<i64>> {
        let watermark = watermark::read(&self.dynamo, &self.config.event_table).await?;
        Ok(watermark.complete_end(self.config.time_unit_ms))
    }

    /// Every subscription's status (lag per partition).
    pub async fn statuses(&self) -> Result<(Option<i64>, Vec<SubscriptionStatus>)> {
        let complete_end = self.complete_end().await?;
        let out = statuses(&self.dynamo, &self.config.event_table, complete_end, self.config.time_unit_ms).await?;
        Ok((complete_end, out))
    }

    /// The schedule's tick: every subscription's lag, and a runner started
    /// for each partition of an active subscription that has none (its
    /// lease free or expired) and is not stopped.
    pub(crate) async fn tick(&self) -> Result<TickSummary> {
        self.ensure_time_unit().await?;
        // An upgraded stack's subscriptions, still in slot -2, move (their partitions at their runners' takes).
        crate::readers::subscriptions::move_all(&self.dynamo, &self.config.event_table).await?;
        let (mut complete_end, mut subscriptions) = self.statuses().await?;
        // Rebuilt projections that caught up serve from now on; their old versions' runners are not started.
        let switched = self.tend_projections(&subscriptions).await;
        if !switched.is_empty() {
            (complete_end, subscriptions) = self.statuses().await?;
        }
        let mut started = 0;
        for sub in subscriptions.iter().filter(|s| s.subscription.state == State::Active) {
            let Some(sub) = self.rescale_step(sub, complete_end).await? else { continue };
            for partition in sub.partitions.iter().filter(|p| p.stopped.is_none() && p.leased_until.is_none()) {
                let task = PartitionTask::first(&sub.subscription.name, partition.partition);
                match continue_with(self.invoker.as_ref(), &serde_json::json!({ "run": task })).await {
                    Ok(()) => started += 1,
                    Err(err) => {
                        warn!(subscription = %sub.subscription.name, partition = partition.partition, error = %err, "runner not started")
                    }
                }
            }
        }
        info!(subscriptions = subscriptions.len(), started, "subscriptions tick");
        Ok(TickSummary { watermark: complete_end.map(format_ms), subscriptions, started, switched })
    }
}

impl Subscriptions {
    /// A step of `sub`'s rescale, if one is under way; the partitions to
    /// start runners for, or none while they stop.
    async fn rescale_step(
        &self,
        sub: &SubscriptionStatus,
        complete_end: Option<i64>,
    ) -> Result<Option<SubscriptionStatus>> {
        use crate::readers::subscriptions::{self as subs, RescaleStep};
        let (dynamo, table, unit) = (&self.dynamo, self.config.event_table.as_str(), self.config.time_unit_ms);
        match subs::rescale_step(dynamo, table, &sub.subscription, unit, crate::time::now_ms()).await? {
            RescaleStep::None => Ok(Some(sub.clone())),
            RescaleStep::Draining(_, behind) => {
                let mut draining = sub.clone();
                draining.partitions.retain(|p| behind.contains(&p.partition));
                Ok(Some(draining))
            }
            RescaleStep::Stopping => Ok(None),
            RescaleStep::Switched => {
                let Some(now) = subs::get(dynamo, table, &sub.subscription.name).await? else { return Ok(None) };
                let stored = subs::partitions(dynamo, table, &now).await?;
                Ok(Some(subs::status(&now, &stored, complete_end, unit)))
            }
        }
    }
}

/// The alias of the subscriptions function that only ticks (`SubscriptionsTickAlias` in the template).
pub const TICK_ALIAS: &str = "tick";

/// Whether a function ARN is qualified with [`TICK_ALIAS`]
/// (`arn:aws:lambda:<region>:<account>:function:<name>:tick`).
pub(crate) fn through_tick_alias(invoked_arn: &str) -> bool {
    let parts: Vec<&str> = invoked_arn.split(':').collect();
    parts.len() == 8 && parts[5] == "function" && parts[7] == TICK_ALIAS
}

/// What an invocation answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Answer {
    Ticked(TickSummary),
    Ran(RunSummary),
    Managed(Value),
}

impl Answer {
    pub fn to_json(&self) -> Result<Value> {
        serde_json::to_value(self).map_err(|e| Error::encode("answer", e))
    }
}

#[cfg(test)]
mod tests {
    use super::through_tick_alias;

    #[test]
    fn only_an_arn_qualified_with_the_tick_alias_is_tick_only() {
        let function = "arn:aws:lambda:eu-west-1:123456789012:function:events-prod-subscriptions";
        assert!(through_tick_alias(&format!("{function}:tick")));
        // Unqualified, $LATEST, another alias, a function itself named "tick": the payload decides.
        assert!(!through_tick_alias(function));
        assert!(!through_tick_alias(&format!("{function}:$LATEST")));
        assert!(!through_tick_alias(&format!("{function}:ticked")));
        assert!(!through_tick_alias("arn:aws:lambda:eu-west-1:123456789012:function:tick"));
        assert!(!through_tick_alias(""));
    }
}
