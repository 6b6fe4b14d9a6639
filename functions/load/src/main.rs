//! `load` Lambda: API Gateway / function URL → event stream. All logic is in `event_store::load`.

use event_store::archive::object::Bucket;
use event_store::config::LoadConfig;
use event_store::load::Load;
use event_store::privacy::Subjects;
use lambda_http::{run, service_fn, Error, Request};

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let config = LoadConfig::from_env()?;
    let aws = event_store::aws_config().await;
    let bucket = config.archive_bucket.clone().map(|name| Bucket::new(&aws, name));
    let subjects = Subjects::configured(&aws, config.subjects.as_ref())?;
    let load = Load::new(aws_sdk_kinesis::Client::new(&aws), config).with_archive(bucket).with_subjects(subjects);
    let load = &load;
    run(service_fn(move |request: Request| async move { Ok::<_, Error>(load.handle(request).await) })).await
}
