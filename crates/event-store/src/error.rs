//! One error type for the whole crate. SDK errors are flattened to text with
//! `DisplayErrorContext` at the point they happen, because the plain `Display`
//! of an SDK error says only "service error".

use aws_sdk_dynamodb::error::DisplayErrorContext;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required environment variable is missing or unparseable.
    #[error("configuration: {0}")]
    Config(String),
    /// The caller sent something we cannot act on; the message is safe to show them.
    #[error("bad input: {0}")]
    BadInput(String),
    /// A DynamoDB call failed after the SDK's own retries.
    #[error("dynamodb {operation}: {message}")]
    Dynamo { operation: &'static str, message: String },
    /// A Kinesis call failed after the SDK's own retries.
    #[error("kinesis {operation}: {message}")]
    Kinesis { operation: &'static str, message: String },
    /// Records that Kinesis kept rejecting after our retries.
    #[error("kinesis {operation}: {failed} records still failing after retries ({code})")]
    KinesisPartial { operation: &'static str, failed: usize, code: String },
    /// The asynchronous self-invocation (fork / continuation) could not be sent.
    #[error("invoke: {0}")]
    Invoke(String),
    /// A stored item does not have the shape this code writes.
    #[error("malformed item: {0}")]
    Malformed(String),
}

impl Error {
    pub(crate) fn dynamo<E: std::error::Error>(operation: &'static str, err: E) -> Self {
        Error::Dynamo { operation, message: DisplayErrorContext(&err).to_string() }
    }

    pub(crate) fn kinesis<E: std::error::Error>(operation: &'static str, err: E) -> Self {
        Error::Kinesis { operation, message: DisplayErrorContext(&err).to_string() }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
