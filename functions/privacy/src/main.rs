//! `privacy` Lambda: `{"action": "forget", "subject": ...}` destroys a data
//! subject's keys. All logic is in `event_store::privacy::manage`; who may
//! invoke it is who may forget.

use event_store::config::PrivacyConfig;
use event_store::privacy::manage::Privacy;
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = PrivacyConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let privacy = Privacy::new(
        event_store::privacy::key_store(&aws, event_store::privacy::KeyStore::reading(config.key_table.clone())),
        &config,
    )
    .with_views(aws_sdk_dynamodb::Client::new(&aws), &config);
    let privacy = &privacy;
    run(service_fn(
        move |event: LambdaEvent<Value>| async move { Ok::<_, Error>(privacy.handle(event.payload).await?) },
    ))
    .await
}
