//! `scan` Lambda: scheduled and self-invoked, buffer table → event table.
//! All logic is in `event_store::scan`; forks go through the Lambda `Invoke` API.

use std::sync::Arc;

use event_store::config::ScanConfig;
use event_store::invoke::LambdaInvoker;
use event_store::scan::Scan;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = ScanConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let myself = std::env::var("AWS_LAMBDA_FUNCTION_NAME")?;
    let invoker = Arc::new(LambdaInvoker::new(aws_sdk_lambda::Client::new(&aws), myself));
    let scan = Scan::new(aws_sdk_dynamodb::Client::new(&aws), aws_sdk_kinesis::Client::new(&aws), config, invoker);
    let scan = &scan;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        scan.handle(event.payload, event.context.deadline()).await
    }))
    .await
}
