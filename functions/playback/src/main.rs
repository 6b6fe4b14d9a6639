//! `playback` Lambda: invoked on demand with `{start, end}`, event table →
//! playback stream. All logic is in `event_store::playback`; continuations
//! go through the Lambda `Invoke` API.

use std::sync::Arc;

use event_store::archive::object::Bucket;
use event_store::config::PlaybackConfig;
use event_store::invoke::LambdaInvoker;
use event_store::playback::Playback;
use event_store::privacy::{self, KeyStore};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = PlaybackConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let myself = std::env::var("AWS_LAMBDA_FUNCTION_NAME")?;
    let invoker = Arc::new(LambdaInvoker::new(aws_sdk_lambda::Client::new(&aws), myself));
    let archive = config.archive_bucket.clone().map(|name| Bucket::new(&aws, name));
    let keys = config.subjects.as_ref().map(|c| privacy::key_store(&aws, KeyStore::configured(c)));
    let playback =
        Playback::new(aws_sdk_dynamodb::Client::new(&aws), aws_sdk_kinesis::Client::new(&aws), config, invoker)
            .with_archive(archive)
            .with_keys(keys);
    let playback = &playback;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        playback.handle(event.payload, event.context.deadline()).await
    }))
    .await
}
