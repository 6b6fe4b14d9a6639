//! `subscriptions` Lambda: on its schedule, the tick (lag metrics, a runner
//! for every idle partition); `{"run": ...}`, a partition's runner;
//! `{"action": ...}`, management; through its `tick` alias, the tick alone. All logic is in `event_store::subscription`;
//! runners and continuations go through the Lambda `Invoke` API, as do Lambda targets.

use std::sync::Arc;

use event_store::archive::object::Bucket;
use event_store::config::SubscriptionConfig;
use event_store::invoke::LambdaInvoker;
use event_store::privacy::{self, KeyStore};
use event_store::subscription::{metrics, Answer, Subscriptions};
use event_store::time::now_ms;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = SubscriptionConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let lambda = aws_sdk_lambda::Client::new(&aws);
    let myself = std::env::var("AWS_LAMBDA_FUNCTION_NAME")?;
    let invoker = Arc::new(LambdaInvoker::new(lambda.clone(), myself));
    let namespace = config.metrics_namespace.clone();
    let archive = config.archive_bucket.clone().map(|name| Bucket::new(&aws, name));
    let keys = config.subjects.as_ref().map(|c| privacy::key_store(&aws, KeyStore::configured(c)));
    let subscriptions = Subscriptions::new(
        aws_sdk_dynamodb::Client::new(&aws),
        aws_sdk_kinesis::Client::new(&aws),
        lambda,
        config,
        invoker,
    )
    .with_archive(archive)
    .with_keys(keys)
    .with_metrics();
    let (subscriptions, namespace) = (&subscriptions, namespace.as_str());
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        let (arn, deadline) = (&event.context.invoked_function_arn, event.context.deadline());
        let answer = subscriptions.handle_invoked(arn, event.payload, deadline).await?;
        if let Answer::Ticked(tick) = &answer {
            // Embedded metric format: CloudWatch reads the lag metrics from these log lines.
            for line in metrics::lag_lines(namespace, tick, now_ms()) {
                println!("{line}");
            }
        }
        answer.to_json()
    }))
    .await
}
