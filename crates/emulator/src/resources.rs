//! Creating the tables and streams where no CloudFormation does it (the
//! local stack, the tests), with the keys and settings of `template.yaml`.
//! Creating what already exists is not an error.

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, StreamSpecification,
    StreamViewType,
};

use aws_sdk_dynamodb::error::DisplayErrorContext;
use event_store::privacy::keys;
use event_store::{buffer_item, entity, event_item, views};

use crate::process::Error;

type Result<T> = std::result::Result<T, Error>;

fn failed(operation: &str, err: impl std::error::Error) -> Error {
    Error(format!("{operation}: {}", DisplayErrorContext(&err)))
}

/// Names of one deployment's resources.
#[derive(Debug, Clone)]
pub struct Names {
    pub buffer_table: String,
    pub event_table: String,
    /// Entity streams; its DynamoDB stream (new images) feeds `relay`.
    pub entity_table: String,
    pub event_stream: String,
    pub playback_stream: String,
    /// Not in the template (users bring their own targets): the local stack's demo subscription target.
    pub subscription_stream: String,
    /// The local stack's archive bucket (a deployed stack's is named by its `ArchiveBucketName` output).
    pub archive_bucket: String,
    /// Subjects' data keys, wrapped ([`event_store::privacy::keys`]).
    pub key_table: String,
    /// Projections' views ([`event_store::views`]).
    pub view_table: String,
    /// The KMS key that wraps them, by its alias.
    pub subject_key_alias: String,
}

/// The local stack's secret of subjects' keyed hashes (`SUBJECT_HASH_KEY`): not a secret.
pub const LOCAL_SUBJECT_HASH_KEY: &str = "local-stack-subject-hash-key-not-a-secret";

/// Service name in resource names: `<service>-<stage>-...`, as in template.yaml.
pub const SERVICE: &str = "event-store";

impl Names {
    /// The names the template gives stage `stage` (`Stage` parameter).
    pub fn for_stage(stage: &str) -> Self {
        Self::for_stack(&format!("{SERVICE}-{stage}"))
    }

    /// The names the template gives a stack `<service>-<stage>`.
    pub fn for_stack(prefix: &str) -> Self {
        Self {
            buffer_table: format!("{prefix}-buffer-table"),
            event_table: format!("{prefix}-event-table"),
            entity_table: format!("{prefix}-entity-table"),
            event_stream: format!("{prefix}-stream"),
            playback_stream: format!("{prefix}-playback"),
            subscription_stream: format!("{prefix}-sub-demo"),
            archive_bucket: format!("{prefix}-archive"),
            key_table: format!("{prefix}-key-table"),
            view_table: format!("{prefix}-view-table"),
            subject_key_alias: format!("alias/{prefix}-subjects"),
        }
    }
}

fn key(name: &str, kind: KeyType) -> Result<KeySchemaElement> {
    KeySchemaElement::builder().attribute_name(name).key_type(kind).build().map_err(|e| failed("CreateTable", e))
}

fn attribute(name: &str, kind: ScalarAttributeType) -> Result<AttributeDefinition> {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .map_err(|e| failed("CreateTable", e))
}

/// Buffer table: hash key `id` (S); event table: `slot` (N) + `sort_key` (S);
/// entity table: `stream` (S) + `item` (S), with a stream of new images; key
/// table: `subject` (S) + `item` (S); view table: `view` (S) + `key` (S). On-demand.
pub async fn create_tables(client: &aws_sdk_dynamodb::Client, names: &Names) -> Result<()> {
    let tables = [
        (&names.buffer_table, vec![(buffer_item::HASH_KEY, KeyType::Hash, ScalarAttributeType::S)]),
        (
            &names.event_table,
            vec![
                (event_item::HASH_KEY, KeyType::Hash, ScalarAttributeType::N),
                (event_item::RANGE_KEY, KeyType::Range, ScalarAttributeType::S),
            ],
        ),
        (
            &names.entity_table,
            vec![
                (entity::model::HASH_KEY, KeyType::Hash, ScalarAttributeType::S),
                (entity::model::RANGE_KEY, KeyType::Range, ScalarAttributeType::S),
            ],
        ),
        (
            &names.key_table,
            vec![
                (keys::HASH_KEY, KeyType::Hash, ScalarAttributeType::S),
                (keys::RANGE_KEY, KeyType::Range, ScalarAttributeType::S),
            ],
        ),
        (
            &names.view_table,
            vec![
                (views::HASH_KEY, KeyType::Hash, ScalarAttributeType::S),
                (views::RANGE_KEY, KeyType::Range, ScalarAttributeType::S),
            ],
        ),
    ];
    for (table, keys) in tables {
        let mut request = client.create_table().table_name(table.as_str()).billing_mode(BillingMode::PayPerRequest);
        if table == &names.entity_table {
            let stream = StreamSpecification::builder()
                .stream_enabled(true)
                .stream_view_type(StreamViewType::NewImage)
                .build()
                .map_err(|e| failed("CreateTable", e))?;
            request = request.stream_specification(stream);
        }
        for (name, kind, scalar) in keys {
            request = request.key_schema(key(name, kind)?).attribute_definitions(attribute(name, scalar)?);
        }
        match request.send().await {
            Ok(_) => {}
            Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {}
            Err(e) => return Err(failed("CreateTable", e)),
        }
    }
    Ok(())
}

/// The archive's bucket, unless it exists.
pub async fn create_bucket(client: &aws_sdk_s3::Client, name: &str) -> Result<()> {
    match client.create_bucket().bucket(name).send().await {
        Ok(_) => Ok(()),
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_bucket_already_owned_by_you() || s.is_bucket_already_exists()) =>
        {
            Ok(())
        }
        Err(e) => Err(failed("CreateBucket", e)),
    }
}

/// The KMS key subjects' data keys are wrapped by, under `alias` (made
/// unless the alias exists); its key id.
pub async fn create_subject_key(kms: &aws_sdk_kms::Client, alias: &str) -> Result<String> {
    let aliases = kms.list_aliases().send().await.map_err(|e| failed("ListAliases", e))?;
    if let Some(key) = aliases.aliases().iter().find(|a| a.alias_name() == Some(alias)).and_then(|a| a.target_key_id())
    {
        return Ok(key.to_owned());
    }
    let made = kms
        .create_key()
        .description("event store: wraps data subjects' keys")
        .send()
        .await
        .map_err(|e| failed("CreateKey", e))?;
    let key = made.key_metadata().map(|m| m.key_id().to_owned()).ok_or_else(|| Error("CreateKey: no key id".into()))?;
    kms.create_alias().alias_name(alias).target_key_id(&key).send().await.map_err(|e| failed("CreateAlias", e))?;
    Ok(key)
}

/// Both streams with `shards` shards each; waits until they are active.
pub async fn create_streams(client: &aws_sdk_kinesis::Client, names: &Names, shards: i32) -> Result<()> {
    // The demo subscription's target needs one shard (and kinesalite allows 10 per account).
    let streams = [(&names.event_stream, shards), (&names.playback_stream, shards), (&names.subscription_stream, 1)];
    for (stream, shards) in streams {
        match client.create_stream().stream_name(stream.as_str()).shard_count(shards).send().await {
            Ok(_) => {}
            Err(e) if e.as_service_error().is_some_and(|s| s.is_resource_in_use_exception()) => {}
            Err(e) => return Err(failed("CreateStream", e)),
        }
        for _ in 0..100 {
            let summary = client
                .describe_stream_summary()
                .stream_name(stream.as_str())
                .send()
                .await
                .map_err(|e| failed("DescribeStreamSummary", e))?;
            let active = summary
                .stream_description_summary()
                .is_some_and(|d| d.stream_status() == &aws_sdk_kinesis::types::StreamStatus::Active);
            if active {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Every record of a stream, shard by shard, each shard from its start
/// (`TRIM_HORIZON`) in sequence order, with its shard id: what a test or the
/// local stack reads back from the emulator.
pub async fn read_stream(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
) -> Result<Vec<(String, aws_sdk_kinesis::types::Record)>> {
    let shards = client.list_shards().stream_name(stream).send().await.map_err(|e| failed("ListShards", e))?;
    let mut all = Vec::new();
    for shard in shards.shards() {
        let mut iterator = client
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(aws_sdk_kinesis::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .map_err(|e| failed("GetShardIterator", e))?
            .shard_iterator;
        while let Some(it) = iterator {
            let out = client
                .get_records()
                .shard_iterator(it)
                .limit(10_000)
                .send()
                .await
                .map_err(|e| failed("GetRecords", e))?;
            all.extend(out.records().iter().map(|r| (shard.shard_id().to_owned(), r.clone())));
            iterator = if out.records().is_empty() { None } else { out.next_shard_iterator };
        }
    }
    Ok(all)
}
