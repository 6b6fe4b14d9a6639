//! `pump` Lambda: Kinesis event source → buffer table. All logic is in `event_store::pump`.

use aws_lambda_events::event::kinesis::KinesisEvent;
use event_store::config::PumpConfig;
use event_store::pump::Pump;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = PumpConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let pump = Pump::new(aws_sdk_dynamodb::Client::new(&aws), config);
    let pump = &pump;
    run(service_fn(move |event: LambdaEvent<KinesisEvent>| async move {
        Ok::<_, Error>(pump.handle(event.payload).await)
    }))
    .await
}
