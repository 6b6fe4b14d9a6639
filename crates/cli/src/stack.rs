//! Which store a command talks to: the local stack (`make local`: the
//! emulator on 127.0.0.1, resources named for `STAGE`), or a deployed stack
//! found by its CloudFormation outputs, with the user's usual AWS
//! credentials and region.

use std::collections::HashMap;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_cloudformation::error::DisplayErrorContext;
use event_store::status::Resources;
use event_store_emulator::resources::Names;

/// Why no store could be reached (exit code 3).
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(
        "no local stack answers on 127.0.0.1:{port}: start it with `make local` (or name a deployed one with --stack)"
    )]
    NoLocalStack { port: u16 },
    #[error("the emulator on 127.0.0.1:{port} has no table {table}: is `make local` running with STAGE={stage}?")]
    NoLocalTables { port: u16, stage: String, table: String },
    #[error("stack {name} not found in {region} (check the name, AWS_REGION or AWS_PROFILE)")]
    UnknownStack { name: String, region: String },
    #[error("stack {name} is not an event store: it has no {missing} output")]
    NotAnEventStore { name: String, missing: &'static str },
    #[error(
        "no AWS credentials: configure them as for the AWS CLI (AWS_PROFILE, aws configure, or AWS_ACCESS_KEY_ID)"
    )]
    NoCredentials,
    #[error("stack {name}: {detail}")]
    Unreachable { name: String, detail: String },
}

/// A store, and how to reach it.
pub struct Stack {
    /// `local (http://127.0.0.1:4566)` or `stack NAME (REGION)`.
    pub label: String,
    pub sdk: SdkConfig,
    pub resources: Resources,
    /// A deployed stack's subscriptions function (its `SubscriptionsFunctionName`
    /// output), which management actions invoke; `None` locally, where they
    /// run in this process.
    pub subscriptions_function: Option<String>,
    /// A deployed stack's playback function (`PlaybackFunctionName`), invoked
    /// asynchronously; `None` locally, where a playback runs in this process.
    pub playback_function: Option<String>,
    /// The stream playbacks go to (`PlaybackStreamName`, or the stage's).
    pub playback_stream: Option<String>,
    /// The buffer and entity tables (`BufferTableName`, `EntityTableName`, or the stage's), for draining the dead-letter queues.
    pub buffer_table: Option<String>,
    pub entity_table: Option<String>,
    /// The entity streams' HTTP API (`StreamsUrl`; locally `make local`'s server on `PORT`).
    pub streams_url: Option<String>,
    /// The archive's bucket (`ArchiveBucketName`, or the local stack's); `None` when the stack keeps everything hot.
    pub archive_bucket: Option<String>,
    /// Subjects' data keys (`KeyTableName`, or the local stack's), to open sealed events.
    pub key_table: Option<String>,
    /// Projections' views (`ViewTableName`, or the local stack's); local management actions use it.
    pub view_table: Option<String>,
    /// A deployed stack's privacy function (`PrivacyFunctionName`), which `forget` invokes.
    pub privacy_function: Option<String>,
    /// The deployed stack's name; `None` for the local one.
    pub name: Option<String>,
}

impl Stack {
    /// The archive's bucket, for readers of archived slots.
    pub fn archive(&self) -> Option<event_store::archive::object::Bucket> {
        let name = self.archive_bucket.clone()?;
        Some(event_store::archive::object::Bucket::new(&self.sdk, name))
    }

    /// Subjects' keys, for readers of sealed events.
    pub fn keys(&self) -> Option<std::sync::Arc<event_store::privacy::keys::Keys>> {
        Some(event_store::privacy::key_store(
            &self.sdk,
            event_store::privacy::KeyStore::reading(self.key_table.clone()?),
        ))
    }

    /// The tiers a reader of this stack's log reads, sealed events opened.
    pub fn tiers(&self) -> event_store::log::tiers::Tiers {
        event_store::log::tiers::Tiers::new(self.archive()).with_keys(self.keys())
    }
}

/// The local stack of `STAGE` (default `local`) on `EMULATOR_PORT` (default 4566).
pub async fn local() -> Result<Stack, StackError> {
    let port = env_port("EMULATOR_PORT", 4566);
    if !event_store_emulator::answers(port) {
        return Err(StackError::NoLocalStack { port });
    }
    let endpoint = format!("http://127.0.0.1:{port}");
    let stage = std::env::var("STAGE").ok().filter(|s| !s.trim().is_empty()).unwrap_or_else(|| "local".into());
    let names = Names::for_stage(&stage);
    let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
    // The emulator takes any key; the user's own are not sent to it.
    let credentials = aws_sdk_dynamodb::config::Credentials::new("local", "local", None, None, "local stack");
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .endpoint_url(&endpoint)
        .region(Region::new(region))
        .credentials_provider(credentials)
        .load()
        .await;
    let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
    if dynamo.describe_table().table_name(&names.event_table).send().await.is_err() {
        return Err(StackError::NoLocalTables { port, stage, table: names.event_table });
    }
    let resources = Resources { event_table: names.event_table, event_stream: names.event_stream, queues: vec![] };
    Ok(Stack {
        label: format!("local stack {stage} ({endpoint})"),
        sdk,
        resources,
        subscriptions_function: None,
        playback_function: None,
        playback_stream: Some(names.playback_stream),
        buffer_table: Some(names.buffer_table),
        entity_table: Some(names.entity_table),
        streams_url: Some(format!("http://127.0.0.1:{}/streams", env_port("PORT", 3000))),
        archive_bucket: Some(names.archive_bucket),
        key_table: Some(names.key_table),
        view_table: Some(names.view_table),
        privacy_function: None,
        name: None,
    })
}

/// A port from the environment (as `make local` reads it), else `default`.
fn env_port(name: &str, default: u16) -> u16 {
    std::env::var(name).ok().and_then(|p| p.trim().parse().ok()).unwrap_or(default)
}

/// The deployed stack `name`, from its outputs.
pub async fn deployed(name: &str) -> Result<Stack, StackError> {
    let sdk = aws_config::load_defaults(BehaviorVersion::latest()).await;
    let region = sdk.region().map(|r| r.to_string()).unwrap_or_else(|| "(no region)".into());
    let cloudformation = aws_sdk_cloudformation::Client::new(&sdk);
    let out = match cloudformation.describe_stacks().stack_name(name).send().await {
        Ok(out) => out,
        Err(err) => {
            let detail = DisplayErrorContext(&err).to_string();
            return Err(if detail.contains("does not exist") {
                StackError::UnknownStack { name: name.to_owned(), region }
            } else if detail.to_lowercase().contains("credential") {
                StackError::NoCredentials
            } else {
                StackError::Unreachable { name: name.to_owned(), detail }
            });
        }
    };
    let outputs: HashMap<String, String> = out
        .stacks()
        .first()
        .map(|s| s.outputs())
        .unwrap_or_default()
        .iter()
        .filter_map(|o| Some((o.output_key()?.to_owned(), o.output_value()?.to_owned())))
        .collect();
    let resources = resources_from_outputs(name, &outputs)?;
    Ok(Stack {
        label: format!("stack {name} ({region})"),
        sdk,
        resources,
        subscriptions_function: outputs.get("SubscriptionsFunctionName").cloned(),
        playback_function: outputs.get("PlaybackFunctionName").cloned(),
        playback_stream: outputs.get("PlaybackStreamName").cloned(),
        buffer_table: outputs.get("BufferTableName").cloned(),
        entity_table: outputs.get("EntityTableName").cloned(),
        streams_url: outputs.get("StreamsUrl").cloned(),
        archive_bucket: outputs.get("ArchiveBucketName").cloned(),
        key_table: outputs.get("KeyTableName").cloned(),
        view_table: outputs.get("ViewTableName").cloned(),
        privacy_function: outputs.get("PrivacyFunctionName").cloned(),
        name: Some(name.to_owned()),
    })
}

/// A stack's resources from its outputs (`template.yaml`'s `Outputs`).
pub fn resources_from_outputs(name: &str, outputs: &HashMap<String, String>) -> Result<Resources, StackError> {
    let required = |key: &'static str| {
        outputs.get(key).cloned().ok_or(StackError::NotAnEventStore { name: name.to_owned(), missing: key })
    };
    let queues = [
        ("pump dead-letter queue", "PumpDeadLetterQueueUrl"),
        ("relay dead-letter queue", "RelayDeadLetterQueueUrl"),
        ("failure queue", "AsyncFailureQueueUrl"),
    ]
    .into_iter()
    .filter_map(|(what, key)| Some((what.to_owned(), outputs.get(key)?.clone())))
    .collect();
    Ok(Resources { event_table: required("EventTableName")?, event_stream: required("EventStreamName")?, queues })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stack_is_an_event_store_by_its_outputs() {
        let outputs: HashMap<String, String> = [
            ("EventTableName", "t"),
            ("EventStreamName", "s"),
            ("PumpDeadLetterQueueUrl", "https://q/pump"),
            ("AsyncFailureQueueUrl", "https://q/failures"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let resources = resources_from_outputs("prod", &outputs).unwrap();
        assert_eq!((resources.event_table.as_str(), resources.event_stream.as_str()), ("t", "s"));
        let queues: Vec<&str> = resources.queues.iter().map(|(what, _)| what.as_str()).collect();
        assert_eq!(queues, ["pump dead-letter queue", "failure queue"]);

        let other: HashMap<String, String> = [("BucketName".to_owned(), "b".to_owned())].into();
        let err = resources_from_outputs("web", &other).unwrap_err().to_string();
        assert_eq!(err, "stack web is not an event store: it has no EventTableName output");
    }
}
