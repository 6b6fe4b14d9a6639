//! Core of the time-ordered event store: everything the four Lambda
//! functions do, so each `functions/<name>/src/main.rs` is a short adapter.
//!
//! # Layout
//! - Stages, one module each, in the order an event travels:
//!   [`load`] (HTTP → event stream), [`pump`] (event stream → buffer table),
//!   [`scan`] (buffer table → event table), [`playback`] (event table → playback stream).
//! - The shapes an event takes between them: [`envelope`] (load's JSON),
//!   [`buffer_item`], [`event_item`] (table codecs and keys), [`encoding`] (zstd).
//! - Shared mechanics: [`batch`] (limits, chunking, backoff), [`dynamo`] and
//!   [`kinesis`] (batch APIs with partial-failure retries), [`invoke`] (the
//!   asynchronous self-invocation port), [`time`] (slots), [`config`], [`error`].

pub mod batch;
pub mod buffer_item;
pub mod config;
pub mod dynamo;
pub mod encoding;
pub mod envelope;
pub mod error;
pub mod event_item;
pub mod event_source;
pub mod invoke;
pub mod kinesis;
pub mod load;
pub mod meta;
pub mod metrics;
pub mod playback;
pub mod pump;
pub mod resources;
pub mod scan;
pub mod time;

pub use error::{Error, Result};

impl From<Error> for lambda_runtime::Diagnostic {
    fn from(err: Error) -> Self {
        let error_type = match &err {
            Error::Config(_) => "ConfigError",
            Error::BadInput(_) => "BadInput",
            Error::Dynamo { .. } => "DynamoDbError",
            Error::Kinesis { .. } | Error::KinesisPartial { .. } => "KinesisError",
            Error::Invoke(_) => "InvokeError",
            Error::Malformed(_) => "MalformedItem",
        };
        lambda_runtime::Diagnostic { error_type: error_type.into(), error_message: err.to_string() }
    }
}

/// Loads the AWS SDK configuration the standard way (region, credentials,
/// `AWS_ENDPOINT_URL*`), once per cold start.
pub async fn aws_config() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}
