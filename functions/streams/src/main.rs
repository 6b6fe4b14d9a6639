//! `streams` Lambda: the `/streams/{name}` entity API, and projections' `/views` and the log's `/log` beside
//! it. All logic is in `event_store::entity`, `event_store::views` and `event_store::log`.

use event_store::archive::object::Bucket;
use event_store::config::StreamsConfig;
use event_store::entity::http::StreamsApi;
use event_store::entity::EntityStore;
use event_store::log::http::LogApi;
use event_store::log::tiers::Tiers;
use event_store::privacy::{self, KeyStore, Subjects};
use event_store::views::http::ViewsApi;
use lambda_http::{run, service_fn, Error, Request};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let config = StreamsConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let bucket = config.archive_bucket.clone().map(|name| Bucket::new(&aws, name));
    let subjects = Subjects::configured(&aws, config.subjects.as_ref())?;
    let dynamo = aws_sdk_dynamodb::Client::new(&aws);
    let views = config.view_table.map(|table| ViewsApi::new(dynamo.clone(), table));
    let keys = config.subjects.as_ref().map(|c| privacy::key_store(&aws, KeyStore::configured(c)));
    let log = config.event_table.map(|event_table| LogApi {
        dynamo: dynamo.clone(),
        event_table,
        dedupe_window_ms: config.dedupe_window_ms,
        tiers: Tiers::new(bucket.clone()).with_keys(keys),
    });
    let store = EntityStore::new(dynamo, config.entity_table)
        .with_archive(bucket, config.inline_max_bytes)
        .with_subjects(subjects);
    let api = StreamsApi::new(store).with_views(views).with_log(log);
    let api = &api;
    run(service_fn(move |request: Request| async move { Ok::<_, Error>(api.handle(request).await) })).await
}
