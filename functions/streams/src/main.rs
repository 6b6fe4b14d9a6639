//! `streams` Lambda: the `/streams/{name}` entity API. All logic is in `event_store::entity`.

use event_store::archive::object::Bucket;
use event_store::config::StreamsConfig;
use event_store::entity::http::StreamsApi;
use event_store::entity::EntityStore;
use event_store::privacy::Subjects;
use lambda_http::{run, service_fn, Error, Request};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let config = StreamsConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let bucket = config.archive_bucket.clone().map(|name| Bucket::new(&aws, name));
    let subjects = Subjects::configured(&aws, config.subjects.as_ref())?;
    let store = EntityStore::new(aws_sdk_dynamodb::Client::new(&aws), config.entity_table)
        .with_archive(bucket, config.inline_max_bytes)
        .with_subjects(subjects);
    let api = StreamsApi::new(store);
    let api = &api;
    run(service_fn(move |request: Request| async move { Ok::<_, Error>(api.handle(request).await) })).await
}
