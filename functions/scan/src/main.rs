//! `scan` Lambda: scheduled and self-invoked, buffer table → event table.
//! All logic is in `event_store::scan`; forks go through the Lambda `Invoke` API.

use std::sync::Arc;

use event_store::config::ScanConfig;
use event_store::invoke::{Invoker, LambdaInvoker};
use event_store::metrics;
use event_store::scan::Scan;
use event_store::time::now_ms;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = ScanConfig::from_env()?;
    let namespace = config.metrics_namespace.clone();
    let aws = event_store::aws_config().await;
    let lambda = aws_sdk_lambda::Client::new(&aws);
    let myself = std::env::var("AWS_LAMBDA_FUNCTION_NAME")?;
    let invoker = Arc::new(LambdaInvoker::new(lambda.clone(), myself));
    // The subscriptions' tick, started by awake runs when the watermark moved (SUBSCRIPTIONS_TICK, a tick-only alias).
    let subscriptions = config
        .subscriptions_tick
        .clone()
        .map(|function| Arc::new(LambdaInvoker::new(lambda, function)) as Arc<dyn Invoker>);
    let scan = Scan::new(aws_sdk_dynamodb::Client::new(&aws), aws_sdk_kinesis::Client::new(&aws), config, invoker)
        .with_subscriptions(subscriptions);
    let (scan, namespace) = (&scan, namespace.as_str());
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        let summary = scan.handle(event.payload, event.context.deadline()).await?;
        // Embedded metric format: CloudWatch reads the watermark's lag from this log line, written
        // by each segment's pass as it ends: how far behind now the watermark (all segments) is
        // then (seconds while it works; a stalled pump, a stuck item or a failing segment grows it).
        if let Some(watermark) = summary.complete_to {
            println!("{}", metrics::watermark_lag_line(namespace, watermark, now_ms()));
        }
        Ok::<_, event_store::Error>(summary)
    }))
    .await
}
