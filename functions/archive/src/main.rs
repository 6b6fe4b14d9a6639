//! `archive` Lambda: scheduled and self-continued, complete slots older than
//! the hot retention → Parquet objects in S3. All logic is in
//! `event_store::archiver`; continuations go through the Lambda `Invoke` API.

use std::sync::Arc;

use event_store::archive::object::Bucket;
use event_store::archiver::Archiver;
use event_store::config::ArchiveConfig;
use event_store::invoke::LambdaInvoker;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = ArchiveConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let myself = std::env::var("AWS_LAMBDA_FUNCTION_NAME")?;
    let invoker = Arc::new(LambdaInvoker::new(aws_sdk_lambda::Client::new(&aws), myself));
    let bucket = Bucket::new(&aws, config.bucket.clone());
    let archiver = Archiver { dynamo: aws_sdk_dynamodb::Client::new(&aws), bucket, config };
    let (archiver, invoker) = (&archiver, invoker.as_ref());
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        archiver.handle(event.payload, event.context.deadline(), invoker).await
    }))
    .await
}
