//! The faults: the service and operation a request names, what AWS can answer to it, and each error answer.

use hyper::StatusCode;
use serde_json::{json, Value};

/// The faults the proxy can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// 400 `ProvisionedThroughputExceededException`, request not applied.
    ProvisionedThroughputExceeded,
    /// 400 `ThrottlingException`, request not applied.
    Throttling,
    /// 400 `RequestLimitExceeded` (DynamoDB), request not applied.
    RequestLimitExceeded,
    /// 500 internal error, request not applied.
    InternalServerError,
    /// 503, request not applied.
    ServiceUnavailable,
    /// The request *was* applied, then the answer is a 500: DynamoDB writes
    /// (retries must be idempotent) and Kinesis puts (a retry stores the records again).
    AppliedThenInternalError,
    /// `BatchWriteItem`: part of the items left in `UnprocessedItems`.
    PartialBatchWrite,
    /// `PutRecords`: part of the records failed with `ProvisionedThroughputExceededException`.
    PartialPutRecords,
    /// The connection is closed without an answer, request not applied.
    ConnectionReset,
    /// The answer comes 300 ms late.
    Slow,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::ProvisionedThroughputExceeded => "ProvisionedThroughputExceeded",
            Fault::Throttling => "Throttling",
            Fault::RequestLimitExceeded => "RequestLimitExceeded",
            Fault::InternalServerError => "InternalServerError",
            Fault::ServiceUnavailable => "ServiceUnavailable",
            Fault::AppliedThenInternalError => "AppliedThenInternalError",
            Fault::PartialBatchWrite => "PartialBatchWrite",
            Fault::PartialPutRecords => "PartialPutRecords",
            Fault::ConnectionReset => "ConnectionReset",
            Fault::Slow => "Slow",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    DynamoDb,
    Kinesis,
    /// KMS (`TrentService.*`): only [`FaultProxy::disable_kms_keys`](crate::FaultProxy::disable_kms_keys) touches it.
    Kms,
    Other,
}

/// The service and operation named by a JSON-protocol request's `X-Amz-Target`.
pub fn target(header: Option<&str>) -> (Service, String) {
    let Some((prefix, operation)) = header.and_then(|h| h.split_once('.')) else {
        return (Service::Other, String::new());
    };
    let service = if prefix.starts_with("DynamoDB") {
        Service::DynamoDb
    } else if prefix.starts_with("Kinesis") {
        Service::Kinesis
    } else if prefix == "TrentService" {
        Service::Kms
    } else {
        Service::Other
    };
    (service, operation.to_owned())
}

/// The faults that make sense for an operation: what AWS can answer to it.
pub fn applicable(service: Service, operation: &str) -> Vec<Fault> {
    use Fault::*;
    let mut faults = match service {
        Service::DynamoDb => vec![
            ProvisionedThroughputExceeded,
            Throttling,
            RequestLimitExceeded,
            InternalServerError,
            ServiceUnavailable,
            AppliedThenInternalError,
        ],
        Service::Kinesis => vec![ProvisionedThroughputExceeded, Throttling, InternalServerError, ServiceUnavailable],
        Service::Kms | Service::Other => return vec![],
    };
    faults.extend([ConnectionReset, Slow]);
    match operation {
        "BatchWriteItem" => faults.push(PartialBatchWrite),
        "PutRecords" => faults.extend([PartialPutRecords, AppliedThenInternalError]),
        "PutRecord" => faults.push(AppliedThenInternalError),
        _ => {}
    }
    faults
}

/// Error answer in the service's JSON protocol.
pub(crate) fn error_answer(service: Service, fault: Fault) -> (StatusCode, Value) {
    let (status, code) = match fault {
        Fault::Throttling => (StatusCode::BAD_REQUEST, "ThrottlingException"),
        Fault::RequestLimitExceeded => (StatusCode::BAD_REQUEST, "RequestLimitExceeded"),
        Fault::InternalServerError | Fault::AppliedThenInternalError => match service {
            Service::Kinesis => (StatusCode::INTERNAL_SERVER_ERROR, "InternalFailure"),
            _ => (StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError"),
        },
        Fault::ServiceUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable"),
        _ => (StatusCode::BAD_REQUEST, "ProvisionedThroughputExceededException"),
    };
    let error_type = match service {
        Service::DynamoDb => format!("com.amazonaws.dynamodb.v20120810#{code}"),
        _ => code.to_owned(),
    };
    (status, json!({ "__type": error_type, "message": format!("injected fault: {}", fault.name()) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_service_and_operation() {
        assert_eq!(target(Some("DynamoDB_20120810.BatchWriteItem")), (Service::DynamoDb, "BatchWriteItem".into()));
        assert_eq!(target(Some("Kinesis_20131202.PutRecords")), (Service::Kinesis, "PutRecords".into()));
        assert_eq!(target(None).0, Service::Other);
        assert_eq!(target(Some("TrentService.Decrypt")), (Service::Kms, "Decrypt".into()));
        assert!(applicable(Service::Kms, "Decrypt").is_empty(), "KMS only answers as a disabled key, when told");
    }

    #[test]
    fn faults_fit_the_operation() {
        assert!(applicable(Service::DynamoDb, "BatchWriteItem").contains(&Fault::PartialBatchWrite));
        assert!(!applicable(Service::DynamoDb, "Scan").contains(&Fault::PartialBatchWrite));
        assert!(applicable(Service::Kinesis, "PutRecords").contains(&Fault::PartialPutRecords));
        // The ambiguous failure that duplicates a Kinesis put, and only on puts.
        assert!(applicable(Service::Kinesis, "PutRecord").contains(&Fault::AppliedThenInternalError));
        assert!(applicable(Service::Kinesis, "PutRecords").contains(&Fault::AppliedThenInternalError));
        assert!(!applicable(Service::Kinesis, "GetRecords").contains(&Fault::AppliedThenInternalError));
        assert!(applicable(Service::Other, "").is_empty());
    }
}
