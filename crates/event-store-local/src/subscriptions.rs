//! `event-store-local subscription ...` and `tail`: managing subscriptions
//! of the running local stack (the same actions the `subscriptions` Lambda
//! takes as `{"action": ...}`), and following the sealed log in the terminal.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Subcommand;
use event_store::bookkeeping::slot_index::read_index;
use event_store::bookkeeping::watermark;
use event_store::config::SubscriptionConfig;
use event_store::dedupe::RecentIds;
use event_store::playback::reader::{Page, Reader, PAGES_AHEAD};
use event_store::playback::{Checkpoint, Filter, PlayedEvent, Window};
use event_store::subscription::{Manage, NewSubscription, OnPoison, Subscriptions, Target};
use event_store::time::{format_ms, now_ms, slot_of};
use event_store_emulator::invoke::{recursive_loop, LocalInvoker};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::playback::parse_filter;

/// The subscription actions, as command-line arguments.
#[derive(Subcommand)]
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
        /// Partitions (1 to 64): runners in parallel, each key's events in one of them.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// Only events whose JSON has this value at this pointer: `/path=/track.gif`. Repeatable.
        #[arg(long = "filter", value_delimiter = ',')]
        filters: Vec<String>,
        /// After parking an event the target keeps refusing: `park` (go on) or `stop`.
        #[arg(long, default_value = "park")]
        on_poison: String,
        /// Events per delivery (1 to 500).
        #[arg(long)]
        batch_size: Option<usize>,
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
pub fn parse_target(text: &str) -> Result<Target> {
    match text.split_once(':') {
        Some(("kinesis", stream)) => Ok(Target::Kinesis(stream.to_owned())),
        Some(("lambda", function)) => Ok(Target::Lambda(function.to_owned())),
        _ => anyhow::bail!("a target is kinesis:<stream> or lambda:<function>, not {text:?}"),
    }
}

impl Action {
    pub fn request(self) -> Result<Manage> {
        Ok(match self {
            Action::Create { name, start, target, partitions, filters, on_poison, batch_size } => {
                let on_poison = match on_poison.as_str() {
                    "park" => OnPoison::Park,
                    "stop" => OnPoison::Stop,
                    other => anyhow::bail!("--on-poison is park or stop, not {other:?}"),
                };
                Manage::Create(NewSubscription {
                    name,
                    start: Some(start),
                    filter: filters.iter().map(|f| parse_filter(f)).collect::<Result<_>>()?,
                    target: Some(parse_target(&target)?),
                    partitions: Some(partitions),
                    on_poison,
                    batch_size,
                    ..Default::default()
                })
            }
            Action::List => Manage::List,
            Action::Pause { name } => Manage::Pause { name },
            Action::Resume { name } => Manage::Resume { name },
            Action::Reset { name, to } => Manage::Reset { name, to },
            Action::Delete { name } => Manage::Delete { name },
            Action::Parked { name } => Manage::Parked { name },
            Action::Redrive { name, event_ids } => Manage::Redrive { name, event_ids },
        })
    }
}

/// The subscriptions of the local stack (runners started by a tick run in-process).
pub fn local(sdk: &aws_config::SdkConfig) -> Result<Subscriptions> {
    let (invoker, _) = LocalInvoker::with_recursion(recursive_loop("SubscriptionsFunction"));
    Ok(Subscriptions::new(
        aws_sdk_dynamodb::Client::new(sdk),
        aws_sdk_kinesis::Client::new(sdk),
        aws_sdk_lambda::Client::new(sdk),
        SubscriptionConfig::from_env()?,
        Arc::new(invoker),
    ))
}

/// The subscriptions of a started stack (its clients, which count their requests).
pub fn local_with(stack: &crate::stack::Stack) -> Result<Subscriptions> {
    let (invoker, _) = LocalInvoker::with_recursion(recursive_loop("SubscriptionsFunction"));
    Ok(Subscriptions::new(
        stack.dynamo.clone(),
        stack.kinesis.clone(),
        stack.lambda.clone(),
        SubscriptionConfig::from_env()?,
        Arc::new(invoker),
    ))
}

/// Runs one management action against the local stack; its answer.
pub async fn manage(sdk: &aws_config::SdkConfig, action: Action) -> Result<Value> {
    let subscriptions = local(sdk)?;
    let answer =
        subscriptions.handle(serde_json::to_value(action.request()?)?, SystemTime::now() + Duration::from_secs(900));
    Ok(answer.await?.to_json()?)
}

/// Prints the events of the sealed log from `from` on, as their slots seal,
/// one JSON line each (the played-record shape), until `stop` resolves;
/// returns how many it printed.
pub async fn tail(
    dynamo: &aws_sdk_dynamodb::Client,
    from: i64,
    filters: &[Filter],
    stop: impl std::future::Future<Output = ()>,
) -> Result<u64> {
    let config = SubscriptionConfig::from_env()?;
    let mut printed = 0u64;
    tokio::select! {
        result = follow(dynamo, &config, from, filters, &mut printed) => result?,
        () = stop => {}
    }
    Ok(printed)
}

async fn follow(
    dynamo: &aws_sdk_dynamodb::Client,
    config: &SubscriptionConfig,
    from: i64,
    filters: &[Filter],
    printed: &mut u64,
) -> Result<()> {
    let (table, unit) = (config.event_table.as_str(), config.time_unit_ms);
    let mut position = Checkpoint::at_slot(slot_of(from, unit));
    let mut recent = RecentIds::new(config.dedupe_window_ms);
    loop {
        let sealed_end = watermark::read(dynamo, table).await?.sealed_end(unit);
        if let Some(end) = sealed_end.filter(|end| position.slot < *end) {
            let window = Window { start: from, end };
            let (slots, _) = read_index(dynamo, table, position.slot, end).await?;
            let reader = Reader {
                dynamo,
                table,
                time_unit_ms: unit,
                page_items: config.page_items,
                dedupe_window_ms: config.dedupe_window_ms,
                window: &window,
            };
            let (tx, mut rx) = mpsc::channel::<event_store::Result<Page>>(PAGES_AHEAD);
            let printer = async {
                while let Some(page) = rx.recv().await {
                    for event in page?.events {
                        let Ok(bytes) = event.bytes() else { continue };
                        let json: Option<Value> = serde_json::from_slice(&bytes).ok();
                        if recent.is_copy(json.as_ref(), event.arrival)
                            || !filters.iter().all(|f| f.matches(json.as_ref()))
                        {
                            continue;
                        }
                        println!("{}", serde_json::to_string(&PlayedEvent::new(&event, json, &bytes, *printed))?);
                        *printed += 1;
                    }
                }
                anyhow::Ok(())
            };
            let ((), printed_all) = tokio::join!(reader.fetch_pages(slots, position.clone(), tx), printer);
            printed_all?;
            position = Checkpoint::at_slot(end);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `now`, `beginning`, or a time.
pub fn parse_from(text: &str) -> Result<i64> {
    event_store::subscription::spec::parse_start(text, now_ms()).with_context(|| format!("--from {text:?}"))
}

/// The time a tail started from, for its first line on stderr.
pub fn describe_from(from: i64) -> String {
    format_ms(from)
}
