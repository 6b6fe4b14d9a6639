//! Counting AWS requests by operation, as an SDK interceptor: the figures
//! "requests per event" in the tests, the local stack's status and the
//! benchmark come from here. It counts transmissions, so SDK retries count too.
//! It also adds up the DynamoDB capacity units the responses report (the
//! code asks for `ReturnConsumedCapacity=TOTAL` on every read and write).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::config::interceptors::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;

use crate::iam::IamRecorder;

#[derive(Debug, Clone, Default)]
pub struct RequestCounter {
    counts: Arc<Mutex<BTreeMap<String, u64>>>,
    capacity: Arc<Mutex<BTreeMap<String, f64>>>,
    /// What IAM sees of each request, when asked to record it (the tests).
    iam: Option<IamRecorder>,
}

impl RequestCounter {
    /// A counter that also records what IAM sees of each request ([`crate::iam`]).
    pub fn recording(iam: IamRecorder) -> Self {
        Self { iam: Some(iam), ..Self::default() }
    }

    /// The requests recorded since the last reset, as IAM authorizes them (none unless [`Self::recording`]).
    pub fn iam_requests(&self) -> Vec<crate::iam::IamRequest> {
        self.iam.as_ref().map(IamRecorder::requests).unwrap_or_default()
    }

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

    /// DynamoDB capacity units consumed so far, by operation.
    pub fn capacity(&self) -> BTreeMap<String, f64> {
        self.capacity.lock().map(|c| c.clone()).unwrap_or_default()
    }

    pub fn reset(&self) {
        if let Ok(mut counts) = self.counts.lock() {
            counts.clear();
        }
        if let Ok(mut capacity) = self.capacity.lock() {
            capacity.clear();
        }
        if let Some(iam) = &self.iam {
            iam.reset();
        }
    }
}

/// The capacity units a DynamoDB response reports, if it is one that can.
fn consumed_units(
    output: &aws_smithy_runtime_api::client::interceptors::context::Output,
) -> Option<(&'static str, f64)> {
    use aws_sdk_dynamodb::operation as op;
    use aws_sdk_dynamodb::types::ConsumedCapacity;
    let total = |c: Option<&ConsumedCapacity>| c.and_then(ConsumedCapacity::capacity_units).unwrap_or(0.0);
    if let Some(out) = output.downcast_ref::<op::batch_write_item::BatchWriteItemOutput>() {
        let units = out.consumed_capacity().iter().filter_map(ConsumedCapacity::capacity_units).sum();
        return Some(("DynamoDB.BatchWriteItem", units));
    }
    if let Some(out) = output.downcast_ref::<op::scan::ScanOutput>() {
        return Some(("DynamoDB.Scan", total(out.consumed_capacity())));
    }
    if let Some(out) = output.downcast_ref::<op::query::QueryOutput>() {
        return Some(("DynamoDB.Query", total(out.consumed_capacity())));
    }
    if let Some(out) = output.downcast_ref::<op::update_item::UpdateItemOutput>() {
        return Some(("DynamoDB.UpdateItem", total(out.consumed_capacity())));
    }
    if let Some(out) = output.downcast_ref::<op::get_item::GetItemOutput>() {
        return Some(("DynamoDB.GetItem", total(out.consumed_capacity())));
    }
    None
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
        if let Some(iam) = &self.iam {
            iam.record(context);
        }
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some((operation, units)) = context.output_or_error().ok().and_then(consumed_units) {
            if let Ok(mut capacity) = self.capacity.lock() {
                *capacity.entry(operation.to_owned()).or_default() += units;
            }
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
