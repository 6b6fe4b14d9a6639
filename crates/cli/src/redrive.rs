//! `event-store redrive`: the pump's and the relay's dead-letter queues,
//! drained in this process with the caller's credentials. A pump failure
//! record's range is read back from the event stream and buffered again
//! (from the arrival floor the pump saved, so what was stored keeps its sort
//! keys); a relay message's held entity streams are relayed from the entity
//! table, in order. A message is deleted only once all of it is done.

use anyhow::{anyhow, bail, Result};
use event_store::bookkeeping::settings;
use event_store::config::{PumpConfig, RelayConfig, DEFAULT_RELAY_HOLD_AFTER_SECONDS, DEFAULT_TIME_UNIT_MS};
use event_store::entity::relay::Relay;
use event_store::pump::rebuffer::drain_queue;
use event_store::pump::Pump;
use event_store::queue::{drain_with, Drained};
use serde_json::{json, Value};

use crate::stack::Stack;

/// Which queues, as command-line arguments.
#[derive(clap::Args)]
pub struct Args {
    /// Only the pump's dead-letter queue.
    #[arg(long, conflicts_with = "relay")]
    pump: bool,
    /// Only the relay's dead-letter queue.
    #[arg(long)]
    relay: bool,
    /// This queue's URL instead of the stack's output (the local stack has no queues of its own); with --pump or
    /// --relay.
    #[arg(long)]
    queue: Option<String>,
}

/// The queue a drain reads, and whose messages it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Pump,
    Relay,
}

impl Kind {
    /// The name `status` gives the queue (and so the stack's outputs).
    fn queue_name(self) -> &'static str {
        match self {
            Kind::Pump => "pump dead-letter queue",
            Kind::Relay => "relay dead-letter queue",
        }
    }
}

/// What was asked for: the kinds, and a queue named by hand.
pub struct Choice {
    kinds: Vec<Kind>,
    queue: Option<String>,
}

impl Args {
    pub fn choice(self) -> Result<Choice> {
        let kinds = match (self.pump, self.relay) {
            (true, _) => vec![Kind::Pump],
            (_, true) => vec![Kind::Relay],
            _ => vec![Kind::Pump, Kind::Relay],
        };
        if self.queue.is_some() && kinds.len() != 1 {
            bail!("--queue names one queue: say whose with --pump or --relay");
        }
        Ok(Choice { kinds, queue: self.queue })
    }
}

impl Choice {
    pub fn names_a_queue(&self) -> bool {
        self.queue.is_some()
    }
}

/// What one queue gave.
pub type QueueDrained = (Kind, String, Result<Drained>);

/// Drains each chosen queue, one after the other whatever the last one gave.
pub async fn drain_queues(stack: &Stack, choice: Choice) -> Vec<QueueDrained> {
    let mut out = Vec::new();
    for kind in choice.kinds {
        let queue = match &choice.queue {
            Some(url) => url.clone(),
            None => match stack.resources.queues.iter().find(|(what, _)| what == kind.queue_name()) {
                Some((_, url)) => url.clone(),
                None => {
                    let missing = anyhow!("no {} among the stack's outputs", kind.queue_name());
                    out.push((kind, String::new(), Err(missing)));
                    continue;
                }
            },
        };
        let drained = drain(stack, kind, &queue).await;
        out.push((kind, queue, drained));
    }
    out
}

async fn drain(stack: &Stack, kind: Kind, queue: &str) -> Result<Drained> {
    let sdk = &stack.sdk;
    let (sqs, kinesis, dynamo) =
        (aws_sdk_sqs::Client::new(sdk), aws_sdk_kinesis::Client::new(sdk), aws_sdk_dynamodb::Client::new(sdk));
    Ok(match kind {
        Kind::Pump => {
            let buffer = stack.buffer_table.as_deref().ok_or_else(|| anyhow!("no BufferTableName output"))?;
            let table = &stack.resources.event_table;
            // As the pump runs: the table's slot size, and the entity table (to drop copies of entity events).
            let config = PumpConfig {
                time_unit_ms: settings::time_unit(&dynamo, table).await?.unwrap_or(DEFAULT_TIME_UNIT_MS),
                entity_table: stack.entity_table.clone(),
                ..PumpConfig::new(buffer, table)
            };
            let pump = Pump::new(dynamo, kinesis.clone(), config);
            drain_queue(&sqs, queue, &kinesis, &pump).await?
        }
        Kind::Relay => {
            let entity_table = stack.entity_table.clone().ok_or_else(|| anyhow!("no EntityTableName output"))?;
            let config = RelayConfig {
                event_stream: stack.resources.event_stream.clone(),
                entity_table,
                // A stream that fails again stays held; its message stays in the queue.
                dead_letter_queue: None,
                hold_after: std::time::Duration::from_secs(DEFAULT_RELAY_HOLD_AFTER_SECONDS),
            };
            let relay = Relay::new(kinesis, dynamo, sqs.clone(), config);
            let relay = &relay;
            drain_with(&sqs, queue, |body| async move { relay.rerelay_message(&body).await.map(|done| done.versions) })
                .await?
        }
    })
}

/// One line per queue (a failed one on stderr), or JSON.
pub fn report(results: &[QueueDrained], json_out: bool) {
    if json_out {
        let value: Vec<Value> = results
            .iter()
            .map(|(kind, url, drained)| {
                let queue = kind.queue_name();
                match drained {
                    Ok(d) => {
                        json!({"queue": queue, "url": url, "messages": d.messages, "records": d.records, "left": d.left})
                    }
                    Err(err) => json!({"queue": queue, "url": url, "error": format!("{err:#}")}),
                }
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
        return;
    }
    for (kind, _, drained) in results {
        let what = match kind {
            Kind::Pump => "records buffered again",
            Kind::Relay => "entity versions relayed from the table",
        };
        match drained {
            Ok(d) => println!(
                "{}: drained {} messages ({} {what}); {} left in the queue",
                kind.queue_name(),
                d.messages,
                d.records,
                d.left
            ),
            Err(err) => eprintln!("error: {}: {err:#}", kind.queue_name()),
        }
    }
}
