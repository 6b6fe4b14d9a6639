//! `pump` Lambda: Kinesis event source → buffer table. All logic is in `event_store::pump`.

use std::sync::Arc;

use event_store::config::PumpConfig;
use event_store::invoke::{Invoker, LambdaInvoker};
use event_store::pump::{parse_kinesis_event, Pump};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = PumpConfig::from_env()?;
    let aws = event_store::aws_config().await;
    // The scan, woken when a batch buffered records (SCAN_FUNCTION).
    let scan = config
        .scan_function
        .clone()
        .map(|function| Arc::new(LambdaInvoker::new(aws_sdk_lambda::Client::new(&aws), function)) as Arc<dyn Invoker>);
    let pump =
        Pump::new(aws_sdk_dynamodb::Client::new(&aws), aws_sdk_kinesis::Client::new(&aws), config).with_scan(scan);
    let pump = &pump;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        Ok::<_, event_store::Error>(pump.handle(parse_kinesis_event(event.payload)?).await)
    }))
    .await
}
