//! `relay` Lambda: the entity table's DynamoDB stream → the event stream. All logic is in `event_store::entity::relay`.

use aws_lambda_events::event::dynamodb::Event;
use event_store::config::RelayConfig;
use event_store::entity::relay::Relay;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = RelayConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let relay = Relay::new(
        aws_sdk_kinesis::Client::new(&aws),
        aws_sdk_dynamodb::Client::new(&aws),
        aws_sdk_sqs::Client::new(&aws),
        config,
    );
    let relay = &relay;
    run(service_fn(move |event: LambdaEvent<Event>| async move { Ok::<_, Error>(relay.handle(event.payload).await) }))
        .await
}
