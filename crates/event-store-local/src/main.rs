//! `event-store-local`: the event store on one machine, against a local
//! emulator, on the same code that runs in Lambda.
//!
//! - `local`: run the stack until Ctrl-C (pixel server on 127.0.0.1:$PORT);
//! - `demo`: the main job end to end, with a report (exit 1 if anything was lost);
//! - `invoke`: run a deployed function artefact in a container under `sam local invoke`, against the running stack;
//! - `api`: serve the HTTP API from such containers with `sam local start-api`.
//!
//! `status`, `playback`, `subscription`, `tail` and `redrive` are verbs of
//! `event-store` (crates/cli), for this stack and a deployed one.

mod demo;
mod entities;
mod glance;
mod http;
mod lost;
mod probes;
mod sam_local;
mod settings;
mod source;
mod sse;
mod stack;
mod stats;
mod subscriptions;
mod template;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use tokio::sync::watch;

use crate::settings::Settings;
use crate::stack::{shutdown_signal, Stack};

#[derive(Parser)]
#[command(about = "The event store on one machine, against a local emulator")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole stack until Ctrl-C: pixel server, pump, scheduled scan.
    Local,
    /// Start the stack, send pixel hits, play them back and check nothing was lost.
    Demo {
        /// Pixel hits to send.
        #[arg(long, env = "N", default_value_t = 1000)]
        events: usize,
        /// Hits in flight at once.
        #[arg(long, env = "C", default_value_t = 10)]
        concurrency: usize,
        /// Hits a second at most (default: as fast as the concurrency allows).
        #[arg(long)]
        rate: Option<f64>,
        /// Also write the report as JSON to this file (the benchmark reads it).
        #[arg(long)]
        report_json: Option<std::path::PathBuf>,
        /// After the demo, single hits each sent after `--idle-seconds` without traffic, timed to delivery.
        #[arg(long, default_value_t = 0)]
        idle_probes: usize,
        /// Seconds without traffic before each idle probe.
        #[arg(long, default_value_t = 65)]
        idle_seconds: u64,
    },
    /// Run a function's deployed artefact (target/lambda/<FUNCTION>/bootstrap, from `make build`)
    /// in a container under `sam local invoke`, against the running local stack; prints its answer.
    Invoke {
        /// The function: load, pump, scan, playback, subscriptions, streams or relay.
        function: String,
        /// The event; default events/<FUNCTION>.json (for playback: the last 15 minutes).
        #[arg(long, env = "EVENT")]
        event: Option<std::path::PathBuf>,
        /// The SAM CLI.
        #[arg(long, env = "SAM", default_value = ".venv/bin/sam")]
        sam: std::path::PathBuf,
    },
    /// Serve the HTTP API (the pixel, /events, /streams) with `sam local start-api`: the deployed
    /// artefacts in warm containers, against the running local stack, until Ctrl-C.
    Api {
        /// Port on 127.0.0.1.
        #[arg(long, env = "API_PORT", default_value_t = 3001)]
        port: u16,
        /// The SAM CLI.
        #[arg(long, env = "SAM", default_value = ".venv/bin/sam")]
        sam: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let settings = match Settings::from_env() {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("error: {err:#}");
            return ExitCode::from(2);
        }
    };
    // Before any thread exists: the stages read their configuration from the
    // environment exactly as they do in Lambda.
    settings.export_env();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,event_store_local=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command, settings)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, settings: Settings) -> Result<bool> {
    match command {
        Command::Local => local(settings).await.map(|_| true),
        Command::Demo { events, concurrency, rate, report_json, idle_probes, idle_seconds } => {
            let probes = probes::Probes { count: idle_probes, idle: Duration::from_secs(idle_seconds) };
            let report = demo::run(settings, events, concurrency, rate, probes).await?;
            demo::print(&report);
            if let Some(path) = report_json {
                std::fs::write(&path, serde_json::to_vec_pretty(&report.to_json())?)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(report.ok())
        }
        Command::Invoke { function, event, sam } => {
            let root = std::env::current_dir()?;
            // Absolute: sam runs in a scratch directory.
            let sam = root.join(sam);
            sam_local::invoke(&settings, &sam, &root, sam_local::Invocation { function, event }).await
        }
        Command::Api { port, sam } => {
            let root = std::env::current_dir()?;
            sam_local::api(&settings, &root.join(sam), &root, port).await
        }
    }
}

async fn local(settings: Settings) -> Result<()> {
    let stack = Stack::start(settings).await?;
    let (stop, shutdown) = watch::channel(false);
    let mut services = stack.run_services(shutdown).await?;
    let s = &stack.settings;
    println!("event store running on the local emulator at {}", stack.emulator.endpoint);
    println!("  pixel:     http://127.0.0.1:{}/track.gif?EntityId=me&page=home", s.port);
    println!("  demo page: http://127.0.0.1:{}/", s.port);
    println!("  events:    curl -X POST -H 'Content-Type: application/json' -d '{{\"EntityId\":\"me\"}}' http://127.0.0.1:{}/events", s.port);
    println!(
        "  tables {}, {}; streams {}, {}",
        s.names.buffer_table, s.names.event_table, s.names.event_stream, s.names.playback_stream
    );
    println!("  scan every {:.1} s; Ctrl-C stops everything", s.scan_interval.as_secs_f64());
    let mut status = tokio::time::interval(Duration::from_secs(5));
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = status.tick() => {
                let line = stack.stats.line();
                if line != last {
                    println!("[{}] {line}", chrono::Utc::now().format("%H:%M:%S"));
                    last = line;
                }
            }
            _ = shutdown_signal() => break,
        }
    }
    println!("stopping{}", if stack.emulator.owned() { " (and the emulator)" } else { "" });
    let _ = stop.send(true);
    while services.join_next().await.is_some() {}
    Ok(())
}
