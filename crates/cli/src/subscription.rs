//! `event-store subscription <action>`: the management actions the
//! `subscriptions` function takes as `{"action": ...}`. Against the local
//! stack they run in this process on the stack's tables (the running `make
//! local` starts the runners); against a deployed stack the function itself is
//! invoked, so what a caller may do is what IAM lets them invoke.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Result;
use aws_sdk_lambda::primitives::Blob;
use clap::Subcommand;
use event_store::bookkeeping::settings;
use event_store::config::SubscriptionConfig;
use event_store::log::{Filter, RecordFormat};
use event_store::readers::subscriptions::spec::parse_start;
use event_store::subscription::{Manage, NewSubscription, OnPoison, Subscriptions, Target as Destination};
use event_store_emulator::invoke::{recursive_loop, LocalInvoker};
use serde_json::Value;

use crate::select::SelectArgs;
use crate::stack::Stack;

/// The subscription actions, as command-line arguments.
#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once from the command line; boxing `create`'s arguments buys nothing
pub enum Action {
    /// Create a subscription: every event from START on, in order per partition key, to TARGET.
    Create {
        name: String,
        /// `beginning`, `now`, or a time (ISO 8601 or epoch ms).
        #[arg(long, default_value = "now")]
        start: String,
        /// `kinesis:<stream>` or `lambda:<function>`.
        #[arg(long)]
        target: String,
        /// Partitions (1 to 1024): runners in parallel, each reading its range of key hashes, each key in one of them.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Only events whose JSON has this value at this pointer: `/path=/track.gif`. Repeatable.
        #[arg(long = "filter", value_delimiter = ',')]
        filters: Vec<String>,
        #[command(flatten)]
        select: SelectArgs,
        /// After parking an event the target keeps refusing: `park` (go on) or `stop`.
        #[arg(long, default_value = "park")]
        on_poison: String,
        /// Events per delivery (1 to 500).
        #[arg(long)]
        batch_size: Option<usize>,
        /// Kinesis targets: `aggregated` (many events a record, for KPL deaggregators) or `plain`.
        #[arg(long, default_value = "aggregated")]
        record_format: String,
    },
    /// Every subscription, with its lag per partition.
    List,
    Pause {
        name: String,
    },
    /// Active again; stopped partitions go on.
    Resume {
        name: String,
    },
    /// Deliver again from TO (`beginning`, `now` or a time).
    Reset {
        name: String,
        #[arg(long)]
        to: String,
    },
    /// A new partition count: the partitions stop, deliver up to a common position, and the new
    /// ones go on from it, each key in order (done by the stack's ticks; `list` shows it).
    Rescale {
        name: String,
        /// Partitions (1 to 1024).
        #[arg(long)]
        partitions: u32,
    },
    Delete {
        name: String,
    },
    /// The events a subscription parked, with their errors.
    Parked {
        name: String,
    },
    /// Deliver parked events again (all, or those named), and unpark those the target takes.
    Redrive {
        name: String,
        #[arg(long = "event-id")]
        event_ids: Vec<String>,
    },
}

/// `kinesis:<stream>` or `lambda:<function>`.
pub fn parse_target(text: &str) -> Result<Destination> {
    match text.split_once(':') {
        Some(("kinesis", stream)) if !stream.is_empty() => Ok(Destination::Kinesis(stream.to_owned())),
        Some(("lambda", function)) if !function.is_empty() => Ok(Destination::Lambda(function.to_owned())),
        _ => anyhow::bail!("a target is kinesis:<stream> or lambda:<function>, not {text:?}"),
    }
}

impl Action {
    /// The request the function takes; bad arguments are refused here, by the
    /// function's own rules, before anything is sent (the store still checks
    /// what only it knows: a name taken, a target that cannot be reached).
    /// `now` (epoch ms) is what `now` and every time are checked against.
    pub fn request(self, now: i64) -> Result<Manage> {
        Ok(match self {
            Action::Create {
                name,
                start,
                target,
                partitions,
                filters,
                select,
                on_poison,
                batch_size,
                record_format,
            } => {
                let on_poison = match on_poison.as_str() {
                    "park" => OnPoison::Park,
                    "stop" => OnPoison::Stop,
                    other => anyhow::bail!("--on-poison is park or stop, not {other:?}"),
                };
                let record_format = match record_format.as_str() {
                    "aggregated" => RecordFormat::Aggregated,
                    "plain" => RecordFormat::Plain,
                    other => anyhow::bail!("--record-format is aggregated or plain, not {other:?}"),
                };
                let new = NewSubscription {
                    name,
                    start: Some(start),
                    filter: filters.iter().map(|f| f.parse()).collect::<event_store::Result<Vec<Filter>>>()?,
                    select: select.select()?,
                    target: Some(parse_target(&target)?),
                    partitions: Some(partitions),
                    on_poison,
                    batch_size,
                    record_format,
                };
                new.clone().validate(now)?;
                Manage::Create(new)
            }
            Action::List => Manage::List,
            Action::Pause { name } => Manage::Pause { name },
            Action::Resume { name } => Manage::Resume { name },
            Action::Reset { name, to } => {
                parse_start(&to, now)?;
                Manage::Reset { name, to }
            }
            Action::Rescale { name, partitions } => {
                event_store::readers::subscriptions::spec::check_partitions(partitions)?;
                Manage::Rescale { name, partitions }
            }
            Action::Delete { name } => Manage::Delete { name },
            Action::Parked { name } => Manage::Parked { name },
            Action::Redrive { name, event_ids } => Manage::Redrive { name, event_ids },
        })
    }
}

/// Why an action was not done: the store's own answer (exit code 4).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// Runs `request` against `target`; its answer.
pub async fn manage(stack: &Stack, request: Manage) -> Result<Value> {
    let payload = serde_json::to_value(&request)?;
    match &stack.subscriptions_function {
        Some(function) => invoke(stack, function, payload).await,
        None => {
            let mut config = SubscriptionConfig::for_table(stack.resources.event_table.clone())?;
            config.view_table = stack.view_table.clone();
            let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
            // The slot size the stack recorded, whatever this shell's TIME_UNIT says (every action
            // checks it); on a store no stage has started yet, the environment's, as `make local`'s.
            if let Some(unit) = settings::time_unit(&dynamo, &stack.resources.event_table).await? {
                config.time_unit_ms = unit;
            }
            // Runners a reset or resume asks for are started by the running stack's next tick.
            let (invoker, _) = LocalInvoker::with_recursion(recursive_loop("SubscriptionsFunction"));
            let sdk = &stack.sdk;
            let subscriptions = Subscriptions::new(
                dynamo,
                aws_sdk_kinesis::Client::new(sdk),
                aws_sdk_lambda::Client::new(sdk),
                config,
                Arc::new(invoker),
            )
            .with_archive(stack.archive())
            .with_keys(stack.keys());
            let answer = subscriptions.handle(payload, SystemTime::now() + Duration::from_secs(900)).await;
            Ok(answer.map_err(|e| Refused(e.to_string()))?.to_json()?)
        }
    }
}

/// The deployed function, invoked and waited for.
pub(crate) async fn invoke(stack: &Stack, function: &str, payload: Value) -> Result<Value> {
    let out = aws_sdk_lambda::Client::new(&stack.sdk)
        .invoke()
        .function_name(function)
        .payload(Blob::new(serde_json::to_vec(&payload)?))
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("invoking {function}: {}", aws_sdk_lambda::error::DisplayErrorContext(e)))?;
    let raw = out.payload().map(|p| p.as_ref().to_vec()).unwrap_or_default();
    let body: Option<Value> = serde_json::from_slice(&raw).ok();
    if out.function_error().is_some() {
        let message = body.as_ref().and_then(|b| b["errorMessage"].as_str()).map(str::to_owned);
        let message = message.unwrap_or_else(|| String::from_utf8_lossy(&raw).into_owned());
        return Err(Refused(format!("{function}: {message}")).into());
    }
    body.ok_or_else(|| anyhow::anyhow!("{function} answered no JSON: {:?}", String::from_utf8_lossy(&raw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_before_anything_is_sent() {
        assert!(matches!(parse_target("kinesis:out").unwrap(), Destination::Kinesis(s) if s == "out"));
        assert!(matches!(parse_target("lambda:f").unwrap(), Destination::Lambda(f) if f == "f"));
        for bad in ["out", "sqs:q", "kinesis:"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
        let create = |on_poison: &str, filter: &str| Action::Create {
            name: "s".into(),
            start: "now".into(),
            target: "kinesis:out".into(),
            partitions: 2,
            filters: vec![filter.into()],
            select: SelectArgs::categories(&["todo"], &["stream"]),
            on_poison: on_poison.into(),
            batch_size: None,
            record_format: "plain".into(),
        };
        let now = event_store::time::parse_time("2026-11-27T12:00:00Z").unwrap();
        let Manage::Create(new) = create("stop", "/path=/track.gif").request(now).unwrap() else {
            panic!("not a create")
        };
        assert_eq!((new.on_poison, new.partitions, new.filter.len()), (OnPoison::Stop, Some(2), 1));
        assert_eq!(
            (new.select.categories.as_slice(), new.select.sources.as_slice()),
            (&["todo".to_string()][..], &[event_store::log::Source::Stream][..])
        );
        assert_eq!(new.record_format, RecordFormat::Plain);
        assert!(create("skip", "/path=/x").request(now).is_err());
        assert!(create("park", "path").request(now).is_err());
        let mut too_many = create("park", "/a=1");
        if let Action::Create { partitions, .. } = &mut too_many {
            *partitions = 1025;
        }
        assert!(too_many.request(now).unwrap_err().to_string().contains("partitions must be 1 to 1024"));
        let rescale = |partitions| Action::Rescale { name: "s".into(), partitions }.request(now);
        assert_eq!(rescale(16).unwrap(), Manage::Rescale { name: "s".into(), partitions: 16 });
        assert!(rescale(0).is_err() && rescale(1025).is_err());
        let reset = |to: &str| Action::Reset { name: "s".into(), to: to.into() }.request(now);
        assert!(reset("beginning").is_ok() && reset("someday").is_err());
    }
}
