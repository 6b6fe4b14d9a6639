//! `event-store`: one command for the local stack and a deployed one.
//!
//! `--local` (the default) talks to `make local`'s emulator on
//! 127.0.0.1:`EMULATOR_PORT`; `--stack NAME` to a deployed stack, found by its
//! CloudFormation outputs with the usual AWS credentials and region.
//!
//! Verbs: `status`; `playback` (locally in this process, on a deployed stack
//! by invoking its playback function asynchronously and following the run);
//! `subscription <action>`, `projection <action>` and `view` (locally in this process, on a deployed stack by
//! invoking its subscriptions function); `tail`; `redrive` (the dead-letter
//! queues, in this process); `streams` (entity streams through their HTTP
//! API, SigV4-signed on a deployed stack); `verify` (the archive's hash chain
//! against the objects in S3, exit 1 at the first break); `forget` (a data
//! subject's keys destroyed: locally in this process, on a deployed stack by
//! invoking its privacy function; exit 2 for a subject that never had one).
//!
//! Exit codes (for scripts): 0 done (for `status`: healthy); 1 done, and
//! something needs a hand (`status`: a problem named in the verdict); 2 bad
//! usage; 3 no store reached (no local stack, an unknown stack, a stack that
//! is not an event store, no credentials); 4 the store answered with an error.

mod playback;
mod privacy;
mod projection;
mod redrive;
mod render;
mod select;
mod stack;
mod streams;
mod subscription;
mod tail;

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use event_store::status::{self, Clients, Limits};

use crate::stack::Stack;

#[derive(Parser)]
#[command(name = "event-store", about = "One command for the local event store and a deployed one")]
struct Cli {
    /// The local stack (`make local`) on 127.0.0.1:EMULATOR_PORT (the default; wins over EVENT_STORE_STACK).
    #[arg(long, global = true)]
    local: bool,
    /// A deployed stack, by name (resources from its CloudFormation outputs); default EVENT_STORE_STACK.
    #[arg(long, global = true, env = "EVENT_STORE_STACK")]
    stack: Option<String>,
    /// Print JSON, for scripts.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The store at a glance: watermark, pump, subscriptions, playbacks, queues, and a verdict.
    Status {
        /// Call a part stalled after this many seconds behind (default: the watermark and
        /// subscriptions 300, the pump 60).
        #[arg(long)]
        stall_after: Option<u32>,
    },
    /// Play a window of the complete log back onto the playback stream, in order, with a progress bar.
    Playback(playback::Args),
    /// Manage subscriptions (what the subscriptions function does for {"action": ...}); prints its answer as JSON.
    Subscription {
        #[command(subcommand)]
        action: subscription::Action,
    },
    /// Manage projections: read models kept from the log exactly once (docs/projections.md); prints JSON.
    Projection {
        #[command(subcommand)]
        action: projection::Action,
    },
    /// A projection's view: one item (KEY), or a page in key order, with the log position it reflects.
    View(projection::ViewArgs),
    /// Drain the pump's and the relay's dead-letter queues (re-buffer, re-relay) (the stack's outputs, or --queue).
    Redrive(redrive::Args),
    /// Read and append entity streams through their HTTP API (signed with your AWS credentials on a stack).
    Streams {
        /// The API's base instead of the stack's StreamsUrl (a custom domain), e.g. https://api.example.com/streams.
        #[arg(long)]
        url: Option<String>,
        #[command(subcommand)]
        action: streams::Action,
    },
    /// Verify the archive's hash chain against the objects in S3 (exit 1 at the first break: an object
    /// altered, removed or reordered).
    Verify {
        /// From this time (`beginning`, ISO 8601 or epoch ms); the entry before it is trusted as stored.
        #[arg(long, default_value = "beginning")]
        from: String,
        /// Up to this time (`now`, ISO 8601 or epoch ms).
        #[arg(long, default_value = "now")]
        to: String,
    },
    /// List in `streams list` the entity streams created before the name index existed (a Scan of
    /// the entity table: run once after upgrading; safe to run again).
    ReindexStreams,
    /// Forget a data subject: destroy its keys, so every copy of its events reads as `forgotten`
    /// (docs/privacy.md). Exit 2 when no key was ever made for it.
    Forget {
        /// The subject's id, as the events carry it (an EntityId, say).
        subject: String,
    },
    /// Print the complete log's events as their slots complete, one JSON line each, until Ctrl-C (or --count).
    Tail {
        /// `now`, `beginning`, or a time (ISO 8601 or epoch ms).
        #[arg(long, default_value = "now")]
        from: String,
        /// Only events whose JSON has this value at this pointer: `/path=/track.gif`. Repeatable.
        #[arg(long = "filter", value_delimiter = ',')]
        filters: Vec<String>,
        /// Stop after this many events.
        #[arg(long)]
        count: Option<u64>,
    },
}

/// See the module's documentation.
enum Exit {
    Done = 0,
    NeedsAHand = 1,
    BadUsage = 2,
    NoStore = 3,
    StoreError = 4,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(Exit::StoreError as u8);
        }
    };
    ExitCode::from(runtime.block_on(run(cli)) as u8)
}

async fn run(cli: Cli) -> Exit {
    // Arguments are checked before any store is asked, so a bad one changes nothing.
    let verb = match Verb::of(cli.command, event_store::time::now_ms()) {
        Ok(verb) => verb,
        Err(err) => return fail(&err, Exit::BadUsage),
    };
    let stack = match &cli.stack {
        Some(name) if !cli.local => stack::deployed(name).await,
        _ => stack::local().await,
    };
    let stack = match stack {
        Ok(stack) => stack,
        Err(err) => return fail(&err, Exit::NoStore),
    };
    match verb {
        Verb::Status { stall_after } => status(&stack, stall_after, cli.json).await,
        Verb::Playback(request) => play(&stack, request, cli.json).await,
        Verb::Redrive(choice) if stack.name.is_none() && !choice.names_a_queue() => {
            fail(&"the local stack has no dead-letter queues of its own: name one with --queue URL", Exit::BadUsage)
        }
        Verb::Redrive(choice) => {
            let results = redrive::drain_queues(&stack, choice).await;
            redrive::report(&results, cli.json);
            if results.iter().any(|(_, _, drained)| drained.is_err()) {
                Exit::StoreError
            } else if results.iter().any(|(_, _, drained)| drained.as_ref().is_ok_and(|d| d.left > 0)) {
                // Messages left (unreadable, or not all of them done) need a look: their reasons are logged.
                Exit::NeedsAHand
            } else {
                Exit::Done
            }
        }
        Verb::Subscription(request) => manage(&stack, request).await,
        Verb::Tail { from, filters, count } => tail(&stack, from, &filters, count).await,
        Verb::Streams { url, call } => stream_call(&stack, url, call, cli.json).await,
        Verb::Verify { from, to } => verify(&stack, from, to, cli.json).await,
        Verb::Forget { subject } => forget(&stack, &subject, cli.json).await,
        Verb::ReindexStreams => reindex_streams(&stack).await,
    }
}

/// A command whose arguments were read and checked.
enum Verb {
    Status {
        stall_after: Option<u32>,
    },
    /// One request a run (`--parallel`).
    Playback(Vec<event_store::playback::PlaybackRequest>),
    Redrive(redrive::Choice),
    Subscription(event_store::subscription::Manage),
    Tail {
        from: i64,
        filters: Vec<event_store::log::Filter>,
        count: Option<u64>,
    },
    Streams {
        url: Option<reqwest::Url>,
        call: streams::Call,
    },
    Verify {
        from: i64,
        to: i64,
    },
    Forget {
        subject: String,
    },
    ReindexStreams,
}

impl Verb {
    fn of(command: Command, now_ms: i64) -> anyhow::Result<Self> {
        Ok(match command {
            Command::Status { stall_after } => Verb::Status { stall_after },
            Command::Playback(args) => Verb::Playback(args.requests(now_ms, playback::max_window()?)?),
            Command::Redrive(args) => Verb::Redrive(args.choice()?),
            Command::Subscription { action } => {
                settings_from_env()?;
                Verb::Subscription(action.request(now_ms)?)
            }
            Command::Projection { action } => Verb::Subscription(action.request()?),
            Command::View(args) => Verb::Subscription(args.request()?),
            Command::Streams { url, action } => {
                Verb::Streams { url: url.as_deref().map(streams::base_url).transpose()?, call: action.call()? }
            }
            Command::Verify { from, to } => {
                let time = |name: &str, value: &str| {
                    event_store::readers::subscriptions::spec::parse_start(value, now_ms)
                        .map_err(|e| anyhow::anyhow!("--{name} {value:?}: {e}"))
                };
                let (from, to) = (time("from", &from)?, time("to", &to)?);
                if from >= to {
                    anyhow::bail!("--from must be before --to");
                }
                Verb::Verify { from, to }
            }
            Command::Forget { subject } if subject.trim().is_empty() => anyhow::bail!("an empty subject"),
            Command::Forget { subject } => Verb::Forget { subject },
            Command::ReindexStreams => Verb::ReindexStreams,
            Command::Tail { from, filters, count } => Verb::Tail {
                count: settings_from_env().map(|()| count)?,
                from: event_store::readers::subscriptions::spec::parse_start(&from, now_ms)
                    .map_err(|e| anyhow::anyhow!("--from {from:?}: {e}"))?,
                filters: filters.iter().map(|f| f.parse()).collect::<event_store::Result<_>>()?,
            },
        })
    }
}

/// The settings the environment gives these verbs (TIME_UNIT, DEDUPE_WINDOW_MS, …), checked
/// before any store is asked: a bad one is bad usage.
fn settings_from_env() -> anyhow::Result<()> {
    event_store::config::SubscriptionConfig::for_table(String::new())?;
    Ok(())
}

async fn manage(stack: &Stack, request: event_store::subscription::Manage) -> Exit {
    if stack.name.is_some() && stack.subscriptions_function.is_none() {
        let err = format!("{}: no SubscriptionsFunctionName output (deploy the current template)", stack.label);
        return fail(&err, Exit::NoStore);
    }
    match subscription::manage(stack, request).await {
        Ok(answer) => {
            // A closed stdout (`| head`) is no failure of the action, which is done.
            let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&answer).unwrap_or_default());
            Exit::Done
        }
        Err(err) => fail(&err.context(stack.label.clone()), Exit::StoreError),
    }
}

async fn play(stack: &Stack, request: Vec<event_store::playback::PlaybackRequest>, json: bool) -> Exit {
    let request = match playback::pinned(stack, request).await {
        Ok(request) => request,
        Err(err) => return fail(&err.context(stack.label.clone()), Exit::StoreError),
    };
    let played = match (&stack.name, &stack.playback_function) {
        (Some(_), Some(function)) => playback::deployed(stack, function, request, json).await,
        (Some(_), None) => {
            let err = format!("{}: no PlaybackFunctionName output (deploy the current template)", stack.label);
            return fail(&err, Exit::NoStore);
        }
        (None, _) => playback::local(stack, request, json).await,
    };
    match played {
        Ok(playback::Ended::Done) => Exit::Done,
        Ok(playback::Ended::NotDone) => Exit::NeedsAHand,
        // The function's own refusal of the request (an id bound to another window, say): nothing was played.
        Err(err) if bad_input(&err) => fail(&err.context(stack.label.clone()), Exit::BadUsage),
        Err(err) => fail(&err.context(stack.label.clone()), Exit::StoreError),
    }
}

async fn tail(stack: &Stack, from: i64, filters: &[event_store::log::Filter], count: Option<u64>) -> Exit {
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
    eprintln!(
        "following the complete log of {} from {} (Ctrl-C stops)",
        stack.label,
        event_store::time::format_ms(from)
    );
    let stop = async {
        // Without a Ctrl-C handler, follow until --count or a closed stdout.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    match tail::tail(&dynamo, stack.tiers(), &stack.resources.event_table, from, filters, count, stop).await {
        Ok(printed) => {
            eprintln!("{printed} events");
            Exit::Done
        }
        Err(err) => fail(&err.context(stack.label.clone()), Exit::StoreError),
    }
}

async fn verify(stack: &Stack, from: i64, to: i64, json: bool) -> Exit {
    let Some(bucket) = stack.archive() else {
        let err = format!("{}: no archive (HotRetentionDays 0 keeps every event in DynamoDB)", stack.label);
        return fail(&err, Exit::BadUsage);
    };
    let dynamo = aws_sdk_dynamodb::Client::new(&stack.sdk);
    let verified =
        match event_store::archive::audit::verify(&dynamo, &stack.resources.event_table, &bucket, from, to).await {
            Ok(verified) => verified,
            Err(err) => return fail(&anyhow::Error::from(err).context(stack.label.clone()), Exit::StoreError),
        };
    let line = if json {
        serde_json::to_string(&verified).unwrap_or_default()
    } else {
        let span = match (verified.start, verified.end) {
            (Some(start), Some(end)) => {
                format!(" for {} to {}", event_store::time::format_ms(start), event_store::time::format_ms(end))
            }
            _ => String::new(),
        };
        match &verified.first_break {
            None if verified.entries == 0 => format!(
                "archive of {}: nothing is archived yet in that window, nothing to verify (HotRetentionDays 0 archives nothing)",
                stack.label
            ),
            None => format!(
                "archive of {}: {} objects ({} events){span} verified: the chain is intact",
                stack.label, verified.entries, verified.events
            ),
            Some(broken) => {
                format!("archive of {}: BROKEN after {} good objects: {broken}", stack.label, verified.entries)
            }
        }
    };
    let _ = writeln!(std::io::stdout(), "{line}");
    if verified.first_break.is_some() {
        Exit::NeedsAHand
    } else {
        Exit::Done
    }
}

async fn status(stack: &Stack, stall_after: Option<u32>, json: bool) -> Exit {
    let limits = match stall_after {
        Some(s) => {
            let ms = i64::from(s) * 1000;
            Limits { watermark_lag_ms: ms, pump_behind_ms: ms, subscription_lag_ms: ms }
        }
        None => Limits::default(),
    };
    let clients = Clients {
        dynamo: aws_sdk_dynamodb::Client::new(&stack.sdk),
        kinesis: aws_sdk_kinesis::Client::new(&stack.sdk),
        sqs: aws_sdk_sqs::Client::new(&stack.sdk),
    };
    let now = event_store::time::now_ms();
    let status = match status::gather(&clients, &stack.resources, &limits, now).await {
        Ok(status) => status,
        Err(err) => return fail(&anyhow::Error::new(err).context(stack.label.clone()), Exit::StoreError),
    };
    if json {
        let mut value = serde_json::to_value(&status).unwrap_or_default();
        value["target"] = stack.label.clone().into();
        let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&value).unwrap_or_default());
    } else {
        let screen = render::status(&stack.label, &status, &render::Paint(std::io::stdout().is_terminal()));
        // Ignored like the others: a closed stdout (`| head`) leaves the exit code to the verdict.
        let _ = write!(std::io::stdout(), "{screen}");
    }
    if status.verdict.healthy {
        Exit::Done
    } else {
        Exit::NeedsAHand
    }
}

async fn stream_call(stack: &Stack, url: Option<reqwest::Url>, call: streams::Call, json: bool) -> Exit {
    let given = url.is_some();
    let base = match url.map(Ok).or_else(|| stack.streams_url.as_deref().map(streams::base_url)) {
        Some(Ok(base)) => base,
        Some(Err(err)) => return fail(&err.context(stack.label.clone()), Exit::NoStore),
        None => {
            let err = format!("{}: no StreamsUrl output (deploy the current template, or give --url)", stack.label);
            return fail(&err, Exit::NoStore);
        }
    };
    // Only a deployed API checks signatures; the local server takes none.
    let signer = stack.name.as_ref().map(|_| &stack.sdk);
    let answer = match streams::send(&base, call, signer).await {
        Ok(answer) => answer,
        Err(err) => {
            let hint = if stack.name.is_none() && !given { " (is `make local` running with this PORT?)" } else { "" };
            return match err.downcast_ref::<streams::Unreachable>() {
                Some(unreachable) => fail(&format!("{unreachable}{hint}"), Exit::NoStore),
                None => fail(&err.context(stack.label.clone()), Exit::StoreError),
            };
        }
    };
    let status = answer.status;
    // `"1"`, or a weak `W/"1"`: the version either way.
    let version = answer.etag.as_deref().map(|e| e.trim_start_matches("W/").trim_matches('"').to_owned());
    if json {
        let value = serde_json::json!({"status": status.as_u16(), "version": version, "answer": answer.body});
        let _ = writeln!(std::io::stdout(), "{value}");
    } else {
        eprintln!("{status}{}", version.map(|v| format!(", version {v}")).unwrap_or_default());
        let _ = writeln!(std::io::stdout(), "{}", serde_json::to_string_pretty(&answer.body).unwrap_or_default());
    }
    match status.as_u16() {
        200..=299 | 304 => Exit::Done,
        // Refused as sent: nothing was written.
        400 | 413 | 415 => Exit::BadUsage,
        401 | 403 => Exit::NoStore,
        // No `error` from the streams API: the URL is not it (API Gateway's own `{"message": "Not Found"}`).
        404 if answer.body.get("error").is_none() => {
            fail(&format!("{base} does not serve entity streams (check --url or the stack)"), Exit::NoStore)
        }
        // The stream is not as the request expected (a conflict, unknown, deleted): nothing was written.
        404 | 409 | 410 | 412 | 428 => Exit::NeedsAHand,
        _ => Exit::StoreError,
    }
}

async fn forget(stack: &Stack, subject: &str, json: bool) -> Exit {
    match privacy::forget(stack, subject).await {
        Ok(answer) => {
            if json {
                let _ = writeln!(std::io::stdout(), "{answer}");
            } else {
                let _ = writeln!(std::io::stdout(), "{}", privacy::describe(subject, &answer));
            }
            if answer["forgotten"] == "unknown" {
                Exit::BadUsage
            } else {
                Exit::Done
            }
        }
        Err(err) if bad_input(&err) => fail(&err.context(stack.label.clone()), Exit::BadUsage),
        Err(err) => fail(&err.context(stack.label.clone()), Exit::StoreError),
    }
}

async fn reindex_streams(stack: &Stack) -> Exit {
    let Some(table) = &stack.entity_table else { return fail(&"this stack has no entity table", Exit::NoStore) };
    let store = event_store::entity::EntityStore::new(aws_sdk_dynamodb::Client::new(&stack.sdk), table.clone());
    match store.index_streams().await {
        Ok(added) => {
            let _ = writeln!(std::io::stdout(), "{}: {added} streams added to the name index", stack.label);
            Exit::Done
        }
        Err(err) => fail(&anyhow::Error::new(err).context(stack.label.clone()), Exit::StoreError),
    }
}

/// Whether the store refused the request as bad input.
fn bad_input(err: &anyhow::Error) -> bool {
    err.chain().any(|e| matches!(e.downcast_ref::<event_store::Error>(), Some(event_store::Error::BadInput(_))))
}

/// One line on stderr, with the causes.
fn fail(err: &dyn std::fmt::Display, exit: Exit) -> Exit {
    eprintln!("error: {err:#}");
    exit
}
