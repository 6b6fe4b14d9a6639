//! `event-store`: one command for the local stack and a deployed one.
//!
//! `--local` (the default) talks to `make local`'s emulator on
//! 127.0.0.1:`EMULATOR_PORT`; `--stack NAME` to a deployed stack, found by its
//! CloudFormation outputs with the usual AWS credentials and region.
//!
//! Exit codes (for scripts): 0 done (for `status`: healthy); 1 done, and
//! something needs a hand (`status`: a problem named in the verdict); 2 bad
//! usage; 3 no store reached (no local stack, an unknown stack, a stack that
//! is not an event store, no credentials); 4 the store answered with an error.

mod render;
mod target;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use event_store::status::{self, Clients, Limits};

use crate::target::Target;

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
}

/// See the module's documentation.
enum Exit {
    Done = 0,
    NeedsAHand = 1,
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
    let target = match &cli.stack {
        Some(name) if !cli.local => target::stack(name).await,
        _ => target::local().await,
    };
    let target = match target {
        Ok(target) => target,
        Err(err) => return fail(&err, Exit::NoStore),
    };
    match cli.command {
        Command::Status { stall_after } => status(&target, stall_after, cli.json).await,
    }
}

async fn status(target: &Target, stall_after: Option<u32>, json: bool) -> Exit {
    let limits = match stall_after {
        Some(s) => {
            let ms = i64::from(s) * 1000;
            Limits { watermark_lag_ms: ms, pump_behind_ms: ms, subscription_lag_ms: ms }
        }
        None => Limits::default(),
    };
    let clients = Clients {
        dynamo: aws_sdk_dynamodb::Client::new(&target.sdk),
        kinesis: aws_sdk_kinesis::Client::new(&target.sdk),
        sqs: aws_sdk_sqs::Client::new(&target.sdk),
    };
    let now = event_store::time::now_ms();
    let status = match status::gather(&clients, &target.resources, &limits, now).await {
        Ok(status) => status,
        Err(err) => return fail(&anyhow::Error::new(err).context(target.label.clone()), Exit::StoreError),
    };
    if json {
        let mut value = serde_json::to_value(&status).unwrap_or_default();
        value["target"] = target.label.clone().into();
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
    } else {
        print!("{}", render::status(&target.label, &status, &render::Paint(std::io::stdout().is_terminal())));
    }
    if status.verdict.healthy {
        Exit::Done
    } else {
        Exit::NeedsAHand
    }
}

/// One line on stderr, with the causes.
fn fail(err: &dyn std::fmt::Display, exit: Exit) -> Exit {
    eprintln!("error: {err:#}");
    exit
}
