//! Counting AWS requests by operation, as an SDK interceptor: the figures
//! "requests per event" in the tests, the local stack's status and the
//! benchmark come from here. It counts transmissions, so SDK retries count too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;

#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl RequestCounter {
    /// Requests so far by operation, named like `DynamoDB.BatchWriteItem`.
    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Requests so far of one operation.
    pub fn get(&self, operation: &str) -> u64 {
        self.snapshot().get(operation).copied().unwrap_or(0)
    }

    /// Requests so far to one service (`DynamoDB`, `Kinesis`).
    pub fn service_total(&self, service: &str) -> u64 {
        let prefix = format!("{service}.");
        self.snapshot().iter().filter(|(k, _)| k.starts_with(&prefix)).map(|(_, v)| v).sum()
    }

    pub fn reset(&self) {
        if let Ok(mut counts) = self.counts.lock() {
            counts.clear();
        }
    }
}

/// `DynamoDB_20120810.Query` → `DynamoDB.Query`, `Kinesis_20131202.PutRecords` → `Kinesis.PutRecords`.
fn operation_name(target: &str) -> String {
    match target.split_once('.') {
        Some((service, op)) => format!("{}.{op}", service.split('_').next().unwrap_or(service)),
        None => target.to_owned(),
    }
}

impl Intercept for RequestCounter {
    fn name(&self) -> &'static str {
        "RequestCounter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // DynamoDB and Kinesis speak JSON protocols that name the operation in X-Amz-Target.
        let operation = context.request().headers().get("x-amz-target").map(operation_name).unwrap_or_else(|| {
            let path = context.request().uri();
            format!("HTTP {path}")
        });
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(operation).or_default() += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_drop_the_api_version() {
        assert_eq!(operation_name("DynamoDB_20120810.BatchWriteItem"), "DynamoDB.BatchWriteItem");
        assert_eq!(operation_name("Kinesis_20131202.PutRecords"), "Kinesis.PutRecords");
    }
}
