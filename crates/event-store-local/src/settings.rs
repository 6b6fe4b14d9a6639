//! The local stack's settings, from the environment, and the environment it
//! gives the stages: the same variables the template gives the Lambda
//! functions, plus the SDK's standard endpoint settings pointing at the emulator.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use event_store_emulator::resources::Names;

#[derive(Debug, Clone)]
pub struct Settings {
    /// Emulator port on 127.0.0.1 (`EMULATOR_PORT`, default 4566).
    pub emulator_port: u16,
    /// Port of the local pixel server (`PORT`, default 3000).
    pub port: u16,
    /// Time between scheduled scans (`SCAN_INTERVAL`, seconds, default 5).
    pub scan_interval: Duration,
    /// Records per pump invocation, as the template's event source mapping (`PUMP_BATCH_SIZE`).
    pub batch_size: usize,
    /// Shards of each stream, as the template's default (`SHARDS`).
    pub shards: i32,
    /// The emulator to start when none answers (`MOTO_SERVER`).
    pub moto_server: PathBuf,
    /// Resource names for stage `STAGE` (default `local`).
    pub names: Names,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        // Set but empty counts as unset (as `make` exports undefined variables).
        Ok(v) if !v.trim().is_empty() => v.trim().parse().ok().with_context(|| format!("{name}={v:?} is not valid")),
        _ => Ok(default),
    }
}

impl Settings {
    pub fn from_env() -> Result<Self> {
        let stage = env_or("STAGE", String::from("local"))?;
        let seconds: f64 = env_or("SCAN_INTERVAL", 5.0)?;
        if !seconds.is_finite() || seconds <= 0.0 {
            bail!("SCAN_INTERVAL must be a positive number of seconds");
        }
        Ok(Self {
            emulator_port: env_or("EMULATOR_PORT", 4566)?,
            port: env_or("PORT", 3000)?,
            names: Names::for_stage(&stage),
            scan_interval: Duration::from_secs_f64(seconds),
            batch_size: env_or("PUMP_BATCH_SIZE", 500)?,
            shards: env_or("SHARDS", 1)?,
            moto_server: event_store_emulator::moto_server(Path::new(".")),
        })
    }

    pub fn emulator_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.emulator_port)
    }

    /// Sets, for this process, what Lambda would see: resource names from the
    /// template, and (unless already set) the SDK endpoint, region and dummy
    /// credentials for the emulator. Call before any thread starts.
    pub fn export_env(&self) {
        let set = |name: &str, value: &str| std::env::set_var(name, value);
        let default = |name: &str, value: &str| {
            if std::env::var_os(name).is_none() {
                std::env::set_var(name, value);
            }
        };
        set("EVENT_STREAM", &self.names.event_stream);
        set("PLAYBACK_STREAM", &self.names.playback_stream);
        set("DYNAMO_BUFFER_TABLE", &self.names.buffer_table);
        set("DYNAMO_EVENT_TABLE", &self.names.event_table);
        set("DYNAMO_ENTITY_TABLE", &self.names.entity_table);
        set("ARCHIVE_BUCKET", &self.names.archive_bucket);
        // Per-subject encryption, on as in a deployed stack (docs/privacy.md); the stack makes the key.
        set("KEY_TABLE", &self.names.key_table);
        set("SUBJECT_KMS_KEY", &self.names.subject_key_alias);
        // The local writers make keys themselves: a stack's keys function left in the shell would win.
        std::env::remove_var("KEY_FUNCTION");
        default("SUBJECT_HASH_KEY", event_store_emulator::resources::LOCAL_SUBJECT_HASH_KEY);
        default("AWS_ENDPOINT_URL", &self.emulator_endpoint());
        default("AWS_REGION", "us-east-1");
        default("IP_SALT", "local-stack-salt-not-secret");
        // The in-process event source hands records to the pump within a second.
        default("WATERMARK_LAG_MS", "2000");
        // One scan segment: the local buffer is small, and the watermark is the lowest of the
        // segments' last passes, so on a busy emulator four segments kept it a tick or two behind.
        default("SCAN_SEGMENTS", "1");
        // A runner follows the sealed log this long, then the next tick starts another; it looks at
        // the watermark every 250 ms (the scan runs every few seconds here, every minute in AWS).
        default("SUBSCRIPTION_FOLLOW_SECONDS", "30");
        default("SUBSCRIPTION_POLL_MS", "250");
        default("AWS_ACCESS_KEY_ID", "local");
        default("AWS_SECRET_ACCESS_KEY", "local");
    }
}
