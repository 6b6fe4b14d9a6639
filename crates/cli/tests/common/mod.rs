//! What the CLI's tests share: a local stack's tables and streams on moto, on a free port.
#![allow(clippy::unwrap_used, dead_code)]

use std::path::PathBuf;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::Credentials;
use event_store_emulator::resources::{create_bucket, create_streams, create_tables, Names};
use event_store_emulator::watchdog::Watchdog;
use event_store_emulator::{moto_server, Emulator};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// moto with the `local` stage's tables and a one-shard event stream, as `make local` makes them.
pub struct LocalStack {
    pub moto: Emulator,
    _watchdog: Watchdog,
    pub sdk: SdkConfig,
    pub dynamo: aws_sdk_dynamodb::Client,
    pub kinesis: aws_sdk_kinesis::Client,
    pub names: Names,
}

impl LocalStack {
    pub async fn start() -> Self {
        let moto = Emulator::start_on_free_port(&moto_server(&root())).unwrap();
        let watchdog = Watchdog::start(moto.diagnostics().into_iter().collect());
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(&moto.endpoint)
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("t", "t", None, None, "test"))
            .load()
            .await;
        let (dynamo, kinesis) = (aws_sdk_dynamodb::Client::new(&sdk), aws_sdk_kinesis::Client::new(&sdk));
        let names = Names::for_stage("local");
        create_tables(&dynamo, &names).await.unwrap();
        create_streams(&kinesis, &names, 1).await.unwrap();
        let s3 = event_store::archive::object::Bucket::new(&sdk, names.archive_bucket.clone());
        create_bucket(&s3.s3, &s3.name).await.unwrap();
        Self { moto, _watchdog: watchdog, sdk, dynamo, kinesis, names }
    }
}
