//! Core of the time-ordered event store: everything the seven Lambda
//! functions do, so each `functions/<name>/src/main.rs` is a short adapter.
//! The invariants every module keeps are in `docs/design.md`.
//!
//! # Layout
//! - Stages, one module each, in the order an event travels:
//!   [`load`] (HTTP → event stream), [`pump`] (event stream → buffer table),
//!   [`scan`] (buffer table → event table), [`playback`] (event table → playback stream),
//!   [`subscription`] (the sealed log → subscribers' targets, forever, checkpointed);
//!   [`entity`] (entity streams: appends with a version check, reads, snapshots;
//!   its relay puts every append on the event stream);
//!   [`redrive`] puts back what the pump's event source gave up on;
//!   [`status`] reads what they all record and judges the store's health.
//! - The shapes an event takes between them: [`envelope`] (load's JSON),
//!   [`buffer_item`], [`event_item`] (table codecs and keys), [`chunk`] (many
//!   events in one item), [`encoding`] (zstd); and where a reader stands in
//!   the sealed log: [`position`].
//! - [`bookkeeping`]: the event table's bookkeeping partition: the slot
//!   index, the completeness watermark, shard positions, scan passes,
//!   settings (playback keeps its leases and checkpoints there too).
//! - Shared mechanics: [`batch`] (limits, chunking, backoff), [`dynamo`] and
//!   [`kinesis`] (batch APIs with partial-failure retries), [`invoke`] (the
//!   asynchronous self-invocation port), [`time`] (slots), [`config`], [`error`].
//!
//! What only runs outside Lambda (the emulator, resources, the event source
//! mapping, in-process invocations) is in the `event-store-emulator` crate.

pub mod aggregation;
pub mod archive;
pub mod archiver;
pub mod batch;
pub mod bookkeeping;
pub mod buffer_item;
pub mod chunk;
pub mod config;
pub mod crypto;
pub mod dynamo;
pub mod encoding;
pub mod entity;
pub mod envelope;
pub mod error;
pub mod event_item;
pub(crate) mod http;
pub mod invoke;
pub mod kinesis;
pub mod load;
pub mod log;
pub mod metrics;
pub mod offload;
pub mod playback;
pub mod position;
pub mod privacy;
pub mod pump;
pub mod queue;
pub mod readers;
pub mod scan;
pub mod status;
pub mod subscription;
pub mod time;

pub use error::{Error, Result};

impl From<Error> for lambda_runtime::Diagnostic {
    fn from(err: Error) -> Self {
        lambda_runtime::Diagnostic { error_type: err.kind().into(), error_message: err.to_string() }
    }
}

/// Loads the AWS SDK configuration the standard way (region, credentials,
/// `AWS_ENDPOINT_URL*`), once per cold start.
pub async fn aws_config() -> aws_config::SdkConfig {
    aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await
}
