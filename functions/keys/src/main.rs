//! `keys` Lambda: `{"subject": "<hash>"}` makes a data subject's key when it
//! needs one and answers the generation to seal under. The writers invoke it
//! rather than write the key table themselves; all logic is in
//! `event_store::privacy::manage::make_key`.

use event_store::config::{KeysConfig, DEFAULT_KEY_CACHE};
use event_store::privacy::{self, KeyStore, Making};
use lambda_runtime::{run, service_fn, Error, LambdaEvent};
use serde_json::Value;

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let config = KeysConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let keys = privacy::key_store(
        &aws,
        KeyStore { table: config.key_table, making: Making::Kms(config.kms_key), cache: DEFAULT_KEY_CACHE },
    );
    let keys = &*keys;
    run(service_fn(move |event: LambdaEvent<Value>| async move {
        Ok::<_, Error>(event_store::privacy::manage::make_key(keys, event.payload).await?)
    }))
    .await
}
