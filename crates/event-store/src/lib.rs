//! Core of the time-ordered event store: everything the ten Lambda functions
//! do, so each `functions/<name>/src/main.rs` is a short adapter. The
//! invariants every module keeps are in `docs/design.md`, the words it uses
//! in its glossary, the file map in `docs/layout.md`.
//!
//! # Layout
//! - **Stages**, peers that never import each other, in the order an event
//!   travels: [`load`] (HTTP → event stream), [`pump`] (event stream → buffer
//!   table; re-buffering what its event source gave up on), [`scan`] (buffer
//!   table → event table, the watermark), [`playback`] (a window of the
//!   complete log → playback stream), [`subscription`] (the complete log →
//!   subscribers' targets, forever, checkpointed), [`entity`] (entity streams:
//!   appends with a version check, reads, snapshots; its relay puts every
//!   append on the event stream), [`archiver`] (complete slots → the cold
//!   tier in S3), privacy's [`privacy::manage`] (forget, and making keys), and
//!   [`status`] (what they all record, read back and judged).
//! - **Floors** they stand on: [`log`] (the complete log as readers see it:
//!   window, filter, reader across tiers, the played record, copies dropped),
//!   [`readers`] (where playbacks and subscriptions stand), [`position`] (the
//!   checkpoint), [`bookkeeping`] (the event table's bookkeeping partition:
//!   slot index, watermark, frontier, shard and entity positions, leases),
//!   [`archive`] (the cold tier's format and items), [`privacy`] (subjects'
//!   keys and the one door to sealing and opening), [`crypto`].
//! - The shapes an event takes: [`envelope`] (load's JSON), [`buffer_item`],
//!   [`event_item`] (table codecs and keys), [`chunk`] (many events in one
//!   item), [`slices`] (key-hash ranges a reader can read alone),
//!   [`encoding`] (zstd), [`aggregation`] (KPL records), [`offload`]
//!   (bodies stored in S3 by their hash).
//! - Shared mechanics: [`batch`] (limits, chunking, backoff), [`dynamo`] and
//!   [`kinesis`] (batch APIs with partial-failure retries), [`queue`]
//!   (draining dead-letter queues), [`invoke`] (the asynchronous
//!   self-invocation port), [`metrics`], [`time`] (slots), and at the bottom
//!   [`config`] and [`error`].
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
pub(crate) mod hit;
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
pub mod select;
pub mod slices;
pub mod status;
pub mod subscription;
pub mod time;
pub mod trace;
pub mod views;

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
