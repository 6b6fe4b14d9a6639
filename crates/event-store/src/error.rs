//! One error type for the whole crate. AWS errors keep their source (so
//! `Error::source()` reaches the SDK's error and its request id), and
//! throttling has a variant of its own: it is the one failure a caller should
//! answer by slowing down rather than by reporting a fault.

use std::error::Error as StdError;
use std::fmt::Write as _;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;

/// An error from below us, kept whole.
pub type Source = Box<dyn StdError + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required environment variable is missing or unparseable.
    #[error("configuration: {0}")]
    Config(String),
    /// The caller sent something we cannot act on; the message is safe to show them.
    #[error("bad input: {0}")]
    BadInput(String),
    /// AWS kept answering "slow down" after the SDK's own retries.
    #[error("{service} {operation} throttled: {}", chain(source.as_ref()))]
    Throttled { service: &'static str, operation: &'static str, source: Source },
    /// A DynamoDB call failed after the SDK's own retries.
    #[error("dynamodb {operation}: {}", chain(source.as_ref()))]
    Dynamo { operation: &'static str, source: Source },
    /// A Kinesis call failed after the SDK's own retries.
    #[error("kinesis {operation}: {}", chain(source.as_ref()))]
    Kinesis { operation: &'static str, source: Source },
    /// Records that Kinesis kept rejecting after our retries.
    #[error("kinesis {operation}: {failed} records still failing after retries ({code})")]
    KinesisPartial { operation: &'static str, failed: usize, code: String },
    /// An SQS call (draining a dead-letter queue) failed.
    #[error("sqs {operation}: {}", chain(source.as_ref()))]
    Sqs { operation: &'static str, source: Source },
    /// An S3 call (the archive) failed after the SDK's own retries.
    #[error("s3 {operation}: {}", chain(source.as_ref()))]
    S3 { operation: &'static str, source: Source },
    /// An archive step could not finish (the next run repeats it).
    #[error("archive: {0}")]
    Archive(String),
    /// An offloaded payload is missing or not what the log names: the event
    /// cannot be read (readers count or park it, as an undecodable one).
    #[error("payload: {0}")]
    Payload(String),
    /// A subject's data key could not be had (KMS refused or failed, or the
    /// key table lacks it): not the event's fault, so readers stop and try
    /// again later rather than skip it (`docs/privacy.md`).
    #[error("subject key: {0}")]
    Key(String),
    /// A KMS call failed after the SDK's own retries (a disabled key, no permission).
    #[error("kms {operation}: {}", chain(source.as_ref()))]
    Kms { operation: &'static str, source: Source },
    /// The asynchronous self-invocation (fork / continuation) could not be sent.
    #[error("invoke: {}", chain(source.as_ref()))]
    Invoke { source: Source },
    /// A request to AWS could not be built (a required field was missing).
    #[error("building a request: {0}")]
    Build(#[from] aws_sdk_dynamodb::error::BuildError),
    /// A value of ours could not be serialized: a bug, never the caller's input.
    #[error("encoding {what}: {source}")]
    Encode { what: &'static str, source: Source },
    /// A stored item does not have the shape this code writes.
    #[error("malformed item: {0}")]
    Malformed(String),
    /// Stored data in a format, version or dictionary this code does not
    /// know: a newer version of the store wrote it (during a deploy the old
    /// code runs on for up to 15 minutes; an older CLI reads a newer stack).
    /// Not the data's fault, so never unreadable: readers stop where they
    /// are and go on once upgraded.
    #[error("written by a newer version of the event store ({0}): upgrade this reader")]
    Newer(String),
    /// Another runner took over the lease of this work (this one was too
    /// slow, or presumed crashed): this one stops without writing progress.
    #[error("lease lost: {0}")]
    LeaseLost(String),
}

/// Error codes AWS uses for "slow down" (the SDK's own retry classifier list,
/// plus DynamoDB's and Kinesis' provisioned-throughput codes).
const THROTTLING_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "LimitExceededException",
    "SlowDown",
];

/// True for an AWS error code that means "slow down".
pub(crate) fn is_throttling(code: &str) -> bool {
    THROTTLING_CODES.contains(&code)
}

impl Error {
    /// A failed AWS call, classified by the error code the service sent.
    fn aws<E>(service: &'static str, operation: &'static str, err: E, other: fn(&'static str, Source) -> Self) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        if err.code().is_some_and(is_throttling) {
            return Error::Throttled { service, operation, source: Box::new(err) };
        }
        other(operation, Box::new(err))
    }

    pub(crate) fn dynamo<E>(operation: &'static str, err: E) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        Self::aws("dynamodb", operation, err, |operation, source| Error::Dynamo { operation, source })
    }

    pub(crate) fn kinesis<E>(operation: &'static str, err: E) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        Self::aws("kinesis", operation, err, |operation, source| Error::Kinesis { operation, source })
    }

    pub(crate) fn s3<E>(operation: &'static str, err: E) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        Self::aws("s3", operation, err, |operation, source| Error::S3 { operation, source })
    }

    pub(crate) fn kms<E>(operation: &'static str, err: E) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        Self::aws("kms", operation, err, |operation, source| Error::Kms { operation, source })
    }

    pub(crate) fn invoke<E>(err: E) -> Self
    where
        E: ProvideErrorMetadata + StdError + Send + Sync + 'static,
    {
        Self::aws("lambda", "Invoke", err, |_, source| Error::Invoke { source })
    }

    pub(crate) fn encode(what: &'static str, err: impl StdError + Send + Sync + 'static) -> Self {
        Error::Encode { what, source: Box::new(err) }
    }

    /// True when the service refused the call to slow us down: nothing was applied.
    pub(crate) fn is_throttled(&self) -> bool {
        matches!(self, Error::Throttled { .. })
    }

    /// The name Lambda reports as the error type.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Error::Config(_) => "ConfigError",
            Error::BadInput(_) => "BadInput",
            Error::Throttled { .. } => "Throttled",
            Error::Dynamo { .. } => "DynamoDbError",
            Error::Kinesis { .. } | Error::KinesisPartial { .. } => "KinesisError",
            Error::Invoke { .. } => "InvokeError",
            Error::Sqs { .. } => "SqsError",
            Error::S3 { .. } => "S3Error",
            Error::Archive(_) => "ArchiveError",
            Error::Build(_) | Error::Encode { .. } => "InternalError",
            Error::Malformed(_) => "MalformedItem",
            Error::Payload(_) => "PayloadError",
            Error::Key(_) | Error::Kms { .. } => "SubjectKeyError",
            Error::LeaseLost(_) => "LeaseLost",
            Error::Newer(_) => "NewerFormat",
        }
    }

    /// True when the event itself cannot be read (it does not decode, or its
    /// offloaded payload is missing or altered): trying again will not help,
    /// so readers count or park it where it stands.
    pub fn is_unreadable(&self) -> bool {
        matches!(self, Error::Malformed(_) | Error::Payload(_))
    }

    /// True when a newer version of the store wrote what this code read ([`Error::Newer`]).
    pub fn is_newer(&self) -> bool {
        matches!(self, Error::Newer(_))
    }
}

/// An error and its sources, `: `-separated: an SDK error's own `Display`
/// says only "service error"; the cause is in its sources.
fn chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut next = err.source();
    while let Some(source) = next {
        let _ = write!(text, ": {source}");
        next = source.source();
    }
    text
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::operation::put_item::PutItemError;

    use super::*;

    fn service_error(code: &str) -> PutItemError {
        PutItemError::generic(ErrorMetadata::builder().code(code).message("slow down, please").build())
    }

    #[test]
    fn throttling_has_its_own_variant_and_keeps_its_source() {
        let err = Error::dynamo("PutItem", service_error("ProvisionedThroughputExceededException"));
        assert!(matches!(err, Error::Throttled { service: "dynamodb", operation: "PutItem", .. }), "{err:?}");
        assert_eq!(err.kind(), "Throttled");
        assert!(StdError::source(&err).is_some(), "the SDK error is kept as the source");
        assert!(err.to_string().contains("slow down, please"), "{err}");

        let other = Error::dynamo("PutItem", service_error("ValidationException"));
        assert!(matches!(other, Error::Dynamo { operation: "PutItem", .. }), "{other:?}");
        assert!(is_throttling("ThrottlingException") && !is_throttling("ResourceNotFoundException"));
    }
}
