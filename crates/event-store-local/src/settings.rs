//! The local stack's settings, from the environment, and the environment it
//! gives the stages: the same variables the template gives the Lambda
//! functions, plus the SDK's standard endpoint settings pointing at the emulator.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use event_store_emulator::resources::Names;

use crate::template::{Scheduled, Template};

#[derive(Debug, Clone)]
pub struct Settings {
    /// Emulator port on 127.0.0.1 (`EMULATOR_PORT`, default 4566).
    pub emulator_port: u16,
    /// Port of the local pixel server (`PORT`, default 3000).
    pub port: u16,
    /// Time between scheduled scans: the template's `ScanRate`, or `SCAN_INTERVAL` (seconds).
    pub scan_interval: Duration,
    /// Time between scheduled subscriptions ticks: the template's `SubscriptionRate`, or `SCAN_INTERVAL`.
    pub tick_interval: Duration,
    /// Time between scheduled archiver runs: the template's `ArchiveRate`, or `ARCHIVE_INTERVAL` (seconds).
    pub archive_interval: Duration,
    /// Records per pump invocation: the template's batch size, or `PUMP_BATCH_SIZE`.
    pub batch_size: usize,
    /// How long the event source gathers records before it invokes the pump (the template's batching window).
    pub batching_window: Duration,
    /// Shards of each stream: the template's `EventShardCount`, or `SHARDS`.
    pub shards: i32,
    /// The emulator to start when none answers (`MOTO_SERVER`).
    pub moto_server: PathBuf,
    /// Resource names for stage `STAGE` (default `local`).
    pub names: Names,
    /// The functions' variables as the template sets them with its parameters' defaults
    /// ([`Template::function_defaults`]): what the stages read unless the shell sets them.
    pub function_defaults: BTreeMap<String, String>,
}

/// `name`'s value from `lookup`, parsed, or `default`; set but empty counts as unset (as `make`
/// exports undefined variables).
fn var_or<T: std::str::FromStr>(lookup: &impl Fn(&str) -> Option<String>, name: &str, default: T) -> Result<T> {
    match lookup(name) {
        Some(v) if !v.trim().is_empty() => v.trim().parse().ok().with_context(|| format!("{name}={v:?} is not valid")),
        _ => Ok(default),
    }
}

/// An interval in seconds from `name`, or `default`.
fn seconds_or(lookup: &impl Fn(&str) -> Option<String>, name: &str, default: Duration) -> Result<Duration> {
    let seconds: f64 = var_or(lookup, name, default.as_secs_f64())?;
    if !seconds.is_finite() || seconds <= 0.0 {
        bail!("{name} must be a positive number of seconds");
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The process environment, as [`Settings::from_lookup`] reads it.
fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

impl Settings {
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(&process_env)
    }

    /// The settings from the variables `lookup` gives, and the template's for the rest.
    pub fn from_lookup(lookup: &impl Fn(&str) -> Option<String>) -> Result<Self> {
        let template = Template::project()?;
        let stage = var_or(lookup, "STAGE", String::from("local"))?;
        // SCAN_INTERVAL sets both the scan's and the tick's schedule (experiments and fast tests).
        let scan_interval = seconds_or(lookup, "SCAN_INTERVAL", template.rate(Scheduled::Scan)?)?;
        let tick_interval = match lookup("SCAN_INTERVAL").filter(|v| !v.trim().is_empty()) {
            Some(_) => scan_interval,
            None => template.rate(Scheduled::Subscriptions)?,
        };
        let (batch_size, batching_window) = template.pump_batching()?;
        let batch_size: usize = var_or(lookup, "PUMP_BATCH_SIZE", batch_size)?;
        if !(1..=10_000).contains(&batch_size) {
            bail!("PUMP_BATCH_SIZE must be 1 to 10000 (a Kinesis event source mapping's range)");
        }
        let shards = template.parameter_default("EventShardCount").and_then(|s| s.parse().ok()).unwrap_or(1);
        Ok(Self {
            emulator_port: var_or(lookup, "EMULATOR_PORT", 4566)?,
            port: var_or(lookup, "PORT", 3000)?,
            names: Names::for_stage(&stage),
            scan_interval,
            tick_interval,
            archive_interval: seconds_or(lookup, "ARCHIVE_INTERVAL", template.rate(Scheduled::Archive)?)?,
            batch_size,
            batching_window,
            shards: var_or(lookup, "SHARDS", shards)?,
            moto_server: event_store_emulator::moto_server(Path::new(".")),
            function_defaults: template.function_defaults()?,
        })
    }

    pub fn emulator_endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.emulator_port)
    }

    /// What Lambda would see, for the variables `lookup` does not set already (but
    /// resource names, set always): the template's variables with its defaults,
    /// resource names, the stack's keys, and the SDK endpoint, region and dummy
    /// credentials for the emulator. Nothing else: the stages' other settings are
    /// their code's defaults, as in a deployed stack.
    pub fn environment(&self, lookup: &impl Fn(&str) -> Option<String>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut set = |name: &str, value: &str| out.push((name.to_owned(), value.to_owned()));
        set("EVENT_STREAM", &self.names.event_stream);
        set("PLAYBACK_STREAM", &self.names.playback_stream);
        set("DYNAMO_BUFFER_TABLE", &self.names.buffer_table);
        set("DYNAMO_EVENT_TABLE", &self.names.event_table);
        set("DYNAMO_ENTITY_TABLE", &self.names.entity_table);
        set("ARCHIVE_BUCKET", &self.names.archive_bucket);
        // Per-subject encryption, on as in a deployed stack (docs/privacy.md); the stack makes the key.
        set("KEY_TABLE", &self.names.key_table);
        set("VIEW_TABLE", &self.names.view_table);
        set("SUBJECT_KMS_KEY", &self.names.subject_key_alias);
        let unset = |name: &str| lookup(name).is_none_or(|v| v.trim().is_empty());
        let mut defaults: Vec<(&str, String)> =
            self.function_defaults.iter().map(|(name, value)| (name.as_str(), value.clone())).collect();
        defaults.extend([
            // Secrets the template has no default for: not secret here.
            ("SUBJECT_HASH_KEY", event_store_emulator::resources::LOCAL_SUBJECT_HASH_KEY.to_owned()),
            ("IP_SALT", "local-stack-salt-not-secret".to_owned()),
            ("AWS_ENDPOINT_URL", self.emulator_endpoint()),
            ("AWS_REGION", "us-east-1".to_owned()),
            ("AWS_ACCESS_KEY_ID", "local".to_owned()),
            ("AWS_SECRET_ACCESS_KEY", "local".to_owned()),
        ]);
        for (name, value) in defaults {
            if unset(name) {
                set(name, &value);
            }
        }
        out
    }

    /// Sets [`Self::environment`] for this process, and unsets a stack's keys function
    /// left in the shell (the local writers make keys themselves). Call before any thread starts.
    pub fn export_env(&self) {
        for (name, value) in self.environment(&process_env) {
            std::env::set_var(name, value);
        }
        std::env::remove_var("KEY_FUNCTION");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The local stack runs what a deployment runs: with nothing set in the
    /// shell, its schedules, event source and every function's variables are
    /// the template's, and it sets no other setting of the stages (a local
    /// override of, say, `WATERMARK_LAG_MS` would make its figures describe
    /// something AWS does not run).
    #[test]
    fn with_nothing_set_the_local_stack_runs_what_the_template_configures() {
        let template: serde_yaml::Value = serde_yaml::from_str(include_str!("../../../template.yaml")).unwrap();
        let default = |parameter: &str| template["Parameters"][parameter]["Default"].clone();
        let settings = Settings::from_lookup(&|_| None).unwrap();
        let rate = |parameter: &str| crate::template::parse_rate(default(parameter).as_str().unwrap()).unwrap();
        assert_eq!(settings.scan_interval, rate("ScanRate"));
        assert_eq!(settings.tick_interval, rate("SubscriptionRate"));
        assert_eq!(settings.archive_interval, rate("ArchiveRate"));
        assert_eq!(Some(settings.shards as u64), default("EventShardCount").as_u64());
        assert_eq!(Some(settings.batch_size as u64), default("PumpBatchSize").as_u64());
        let mapping = &template["Resources"]["PumpEventSource"]["Properties"];
        assert_eq!(Some(settings.batching_window.as_secs()), mapping["MaximumBatchingWindowInSeconds"].as_u64());

        let environment: BTreeMap<String, String> = settings.environment(&|_| None).into_iter().collect();
        // A few by hand, so that a template the reader misread fails too.
        let segments = default("ScanSegments").as_u64().unwrap().to_string();
        assert_eq!(environment.get("SCAN_SEGMENTS"), Some(&segments));
        let follow = default("SubscriptionFollowSeconds").as_u64().unwrap().to_string();
        assert_eq!(environment.get("SUBSCRIPTION_FOLLOW_SECONDS"), Some(&follow));
        for (name, value) in &settings.function_defaults {
            assert_eq!(environment.get(name), Some(value), "{name}");
        }
        let names = ["EVENT_STREAM", "PLAYBACK_STREAM", "DYNAMO_BUFFER_TABLE", "DYNAMO_EVENT_TABLE"]
            .into_iter()
            .chain(["DYNAMO_ENTITY_TABLE", "ARCHIVE_BUCKET", "KEY_TABLE", "SUBJECT_KMS_KEY", "VIEW_TABLE"]);
        let secrets_and_sdk = [
            "SUBJECT_HASH_KEY",
            "IP_SALT",
            "AWS_ENDPOINT_URL",
            "AWS_REGION",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        ];
        let allowed: BTreeSet<&str> =
            settings.function_defaults.keys().map(String::as_str).chain(names).chain(secrets_and_sdk).collect();
        let extra: Vec<&String> = environment.keys().filter(|name| !allowed.contains(name.as_str())).collect();
        assert!(extra.is_empty(), "set locally but not by the template: {extra:?}");
        assert!(!environment.contains_key("WATERMARK_LAG_MS") && !environment.contains_key("SUBSCRIPTION_POLL_MS"));
    }

    #[test]
    fn the_shell_wins_over_the_template_and_scan_interval_sets_both_schedules() {
        let shell = |name: &str| match name {
            "SCAN_INTERVAL" => Some("1".to_owned()),
            "ARCHIVE_INTERVAL" => Some("30".to_owned()),
            "SCAN_SEGMENTS" => Some("2".to_owned()),
            "TIME_UNIT" => Some(String::new()), // set but empty, as make exports it: unset
            _ => None,
        };
        let settings = Settings::from_lookup(&shell).unwrap();
        assert_eq!((settings.scan_interval, settings.tick_interval), (Duration::from_secs(1), Duration::from_secs(1)));
        assert_eq!(settings.archive_interval, Duration::from_secs(30));
        let environment: BTreeMap<String, String> = settings.environment(&shell).into_iter().collect();
        assert!(!environment.contains_key("SCAN_SEGMENTS"), "the shell's value stays");
        assert_eq!(environment.get("TIME_UNIT"), settings.function_defaults.get("TIME_UNIT"));
        assert!(Settings::from_lookup(&|name: &str| (name == "SCAN_INTERVAL").then(|| "0".to_owned())).is_err());
        assert!(Settings::from_lookup(&|name: &str| (name == "PUMP_BATCH_SIZE").then(|| "0".to_owned())).is_err());
    }
}
