//! Test support: a real moto_server on a free 127.0.0.1 port (stopped by PID
//! when the test ends), SDK clients pointed at it through the standard
//! endpoint setting, and helpers to read streams and tables back.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::PathBuf;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_lambda_events::event::kinesis::KinesisEvent;
use aws_sdk_dynamodb::config::Credentials;
use aws_sdk_dynamodb::types::AttributeValue;
use event_store_emulator::request_counter::RequestCounter;
use event_store_emulator::resources::{create_streams, create_tables, Names};
use event_store_emulator::watchdog::Watchdog;
use event_store_emulator::{moto_server, Emulator};

pub const REGION: &str = "us-east-1";

/// Sequence numbers of synthetic records: increasing across calls, like a shard's.
static SEQUENCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A sample event file from `events/`, the same files `sam local invoke` and `cargo lambda invoke` use.
pub fn sample_event(name: &str) -> String {
    let path = repo_root().join("events").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The emulators behind the tests: moto_server for both services (default), or
/// with `EMULATOR=strict` dynalite (DynamoDB) and kinesalite (Kinesis), which
/// reject what AWS rejects (26-item batches, unused expression values, > 1 MiB records).
struct Emulators {
    dynamo: Emulator,
    kinesis: Option<Emulator>,
    _watchdog: Watchdog,
}

impl Emulators {
    fn start() -> Self {
        let root = repo_root();
        if std::env::var("EMULATOR").as_deref() == Ok("strict") {
            let bin = root.join(".node/node_modules/.bin");
            let dynamo = Emulator::start_node_on_free_port(&bin.join("dynalite")).expect("dynalite (run `make test`)");
            let kinesis =
                Emulator::start_node_on_free_port(&bin.join("kinesalite")).expect("kinesalite (run `make test`)");
            let watchdog = Watchdog::start([&dynamo, &kinesis].iter().filter_map(|e| e.diagnostics()).collect());
            return Self { dynamo, kinesis: Some(kinesis), _watchdog: watchdog };
        }
        let moto = Emulator::start_on_free_port(&moto_server(&root)).expect("moto_server (run `make test`)");
        let watchdog = Watchdog::start(moto.diagnostics().into_iter().collect());
        Self { dynamo: moto, kinesis: None, _watchdog: watchdog }
    }

    fn kinesis(&self) -> &Emulator {
        self.kinesis.as_ref().unwrap_or(&self.dynamo)
    }
}

/// One test's world: its own emulators, clients that count their requests, and resource names.
pub struct TestEnv {
    emulators: Emulators,
    /// Where Kinesis requests go (for tests that put a proxy in front of it).
    pub kinesis_endpoint: String,
    pub sdk: SdkConfig,
    pub counter: RequestCounter,
    pub dynamo: aws_sdk_dynamodb::Client,
    pub kinesis: aws_sdk_kinesis::Client,
    pub names: Names,
}

impl TestEnv {
    pub async fn start(shards: i32) -> Self {
        let emulators = Emulators::start();
        let kinesis_endpoint = emulators.kinesis().endpoint.clone();
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .endpoint_url(&emulators.dynamo.endpoint)
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
            .load()
            .await;
        let names = Names::for_stack("event-store-test");
        // Each table's partition key, for the IAM requests the counter records (`dynamodb:LeadingKeys`).
        let hash_keys = std::collections::HashMap::from([
            (names.event_table.clone(), event_store::event_item::HASH_KEY.to_owned()),
            (names.buffer_table.clone(), event_store::buffer_item::HASH_KEY.to_owned()),
            (names.entity_table.clone(), event_store::bookkeeping::entity_positions::HASH_KEY.to_owned()),
            (names.key_table.clone(), event_store::privacy::keys::HASH_KEY.to_owned()),
            (names.view_table.clone(), event_store::views::HASH_KEY.to_owned()),
        ]);
        let counter = RequestCounter::recording(event_store_emulator::iam::IamRecorder::new(hash_keys));
        let dynamo = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk).interceptor(counter.clone()).build(),
        );
        let kinesis = aws_sdk_kinesis::Client::from_conf(
            aws_sdk_kinesis::config::Builder::from(&sdk)
                .endpoint_url(&kinesis_endpoint)
                .interceptor(counter.clone())
                .build(),
        );
        create_tables(&dynamo, &names).await.expect("tables");
        create_streams(&kinesis, &names, shards).await.expect("streams");
        counter.reset();
        Self { emulators, kinesis_endpoint, sdk, counter, dynamo, kinesis, names }
    }

    /// Where DynamoDB requests go (for tests that put a proxy in front of it).
    pub fn dynamo_endpoint(&self) -> String {
        self.emulators.dynamo.endpoint.clone()
    }

    pub async fn stream_arn(&self, stream: &str) -> String {
        let out = self.kinesis.describe_stream_summary().stream_name(stream).send().await.expect("describe");
        out.stream_description_summary().expect("summary").stream_arn().to_owned()
    }

    /// Every record of a stream, shard by shard, each shard in sequence order.
    pub async fn read_stream(&self, stream: &str) -> Vec<(String, aws_sdk_kinesis::types::Record)> {
        event_store_emulator::resources::read_stream(&self.kinesis, stream).await.expect("read the stream")
    }

    /// The event stream's records as the Lambda event source would deliver them, one event per shard.
    pub async fn event_source_batches(&self) -> Vec<KinesisEvent> {
        let arn = self.stream_arn(&self.names.event_stream).await;
        let records = self.read_stream(&self.names.event_stream).await;
        let mut by_shard: Vec<(String, Vec<aws_sdk_kinesis::types::Record>)> = Vec::new();
        for (shard, record) in records {
            match by_shard.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, list)) => list.push(record),
                None => by_shard.push((shard, vec![record])),
            }
        }
        by_shard
            .iter()
            .map(|(shard, records)| event_store_emulator::event_source::kinesis_event(&arn, shard, REGION, records))
            .collect()
    }

    pub async fn scan_table(&self, table: &str) -> Vec<HashMap<String, AttributeValue>> {
        let mut items = Vec::new();
        let mut start = None;
        loop {
            let out = self.dynamo.scan().table_name(table).set_exclusive_start_key(start).send().await.expect("scan");
            items.extend(out.items().iter().cloned());
            start = out.last_evaluated_key().cloned();
            if start.is_none() {
                return items;
            }
        }
    }
}

/// A Kinesis event as the event source mapping delivers it, with chosen
/// arrival times: `(partition key, data, arrival ms)`, sequence numbers in order.
pub fn kinesis_event(stream_arn: &str, records: &[(String, Vec<u8>, i64)]) -> KinesisEvent {
    kinesis_event_on(stream_arn, SYNTHETIC_SHARD, records)
}

/// [`kinesis_event`] from shard `shard` of the stream (a real one, for tests of resharding).
pub fn kinesis_event_on(stream_arn: &str, shard: &str, records: &[(String, Vec<u8>, i64)]) -> KinesisEvent {
    let records: Vec<serde_json::Value> = records
        .iter()
        .map(|(pk, data, arrival)| {
            let sequence = format!("4959{:052}", SEQUENCE.fetch_add(1, std::sync::atomic::Ordering::SeqCst));
            serde_json::json!({
                "kinesis": {
                    "kinesisSchemaVersion": "1.0",
                    "partitionKey": pk,
                    "sequenceNumber": sequence,
                    "data": base64(data),
                    "approximateArrivalTimestamp": *arrival as f64 / 1000.0,
                },
                "eventSource": "aws:kinesis",
                "eventVersion": "1.0",
                "eventID": format!("{shard}:{sequence}"),
                "eventName": "aws:kinesis:record",
                "awsRegion": REGION,
                "eventSourceARN": stream_arn,
            })
        })
        .collect();
    event_store::pump::parse_kinesis_event(serde_json::json!({ "Records": records })).expect("kinesis event")
}

fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// The shard of synthetic records: not a shard of the test's event stream,
/// whose shards the scan asks Kinesis about.
pub const SYNTHETIC_SHARD: &str = "shardId-synthetic000";

pub const TEST_ARN: &str = "arn:aws:kinesis:us-east-1:123456789012:stream/event-store-test-stream";

/// The pump of the test's tables.
pub fn pump(env: &TestEnv) -> event_store::pump::Pump {
    use event_store::config::PumpConfig;
    let config = PumpConfig {
        entity_table: Some(env.names.entity_table.clone()),
        ..PumpConfig::new(env.names.buffer_table.clone(), env.names.event_table.clone())
    };
    event_store::pump::Pump::new(env.dynamo.clone(), env.kinesis.clone(), config)
}

/// A Kinesis client of the test whose requests go through a fault proxy
/// (started in front of the test's Kinesis emulator, stopped when dropped).
pub async fn through_faults(
    env: &TestEnv,
    config: event_store_fault_proxy::Config,
) -> (aws_sdk_kinesis::Client, event_store_fault_proxy::FaultProxy) {
    let proxy = event_store_fault_proxy::FaultProxy::start(&env.kinesis_endpoint, config).await.unwrap();
    let client = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(&env.sdk).endpoint_url(&proxy.endpoint).build(),
    );
    (client, proxy)
}

/// Puts `records` (partition key, data, arrival ms) into the buffer table through the real pump.
pub async fn buffer_through_pump(env: &TestEnv, records: &[(String, Vec<u8>, i64)]) {
    let pump = pump(env);
    for chunk in records.chunks(500) {
        let event = kinesis_event(TEST_ARN, chunk);
        assert!(pump.handle(event).await.batch_item_failures.is_empty());
    }
}

/// Puts `records` (arrivals a millisecond apart at least) into the buffer
/// table through the real pump grouping by 1 ms slots: each event a chunk of
/// its own, many small items (for tests of paging, which count items).
pub async fn buffer_one_by_one(env: &TestEnv, records: &[(String, Vec<u8>, i64)]) {
    use event_store::config::PumpConfig;
    assert!(records.windows(2).all(|w| w[0].2 < w[1].2), "arrivals must differ");
    let config = PumpConfig { time_unit_ms: 1, ..PumpConfig::new(&env.names.buffer_table, &env.names.event_table) };
    let pump = event_store::pump::Pump::new(env.dynamo.clone(), env.kinesis.clone(), config);
    for chunk in records.chunks(500) {
        let event = kinesis_event(TEST_ARN, chunk);
        assert!(pump.handle(event).await.batch_item_failures.is_empty());
    }
}

/// The events the event table holds (chunks decoded; not the bookkeeping or
/// quarantine partitions), each with its slot.
pub async fn stored_events(env: &TestEnv) -> Vec<event_store::event_item::EventItem> {
    env.scan_table(&env.names.event_table)
        .await
        .into_iter()
        .filter_map(|item| {
            let storage: i64 = item["slot"].as_n().ok()?.parse().ok()?;
            (storage >= 0).then(|| event_store::chunk::decode_item(storage - storage.rem_euclid(1000), &item))
        })
        .flat_map(|decoded| decoded.events.expect("a readable item"))
        .collect()
}

/// How many records the buffer table holds (in all its chunks).
pub async fn buffered_events(env: &TestEnv) -> usize {
    env.scan_table(&env.names.buffer_table)
        .await
        .into_iter()
        .map(|item| event_store::buffer_item::BufferItem::from_item(item).unwrap().events().unwrap().len())
        .sum()
}

/// Runs `test` on a multi-threaded runtime, blocked on from a thread with a
/// 16 MiB stack (a test thread has 2 MiB), for tests whose unoptimized
/// futures poll deeper than that.
/// A stack upgraded from the version before each bookkeeping family had a
/// partition of its own: `family`'s items where that version kept them
/// (slot -2, every family's then), none in their own partition yet.
#[allow(dead_code)]
pub async fn as_the_version_before(env: &TestEnv, family: event_store::bookkeeping::Family) {
    let table = env.names.event_table.as_str();
    // Its partition, and any keys of its own under it (a subscription partition's: -600000 - n).
    let own = family.slot().to_string();
    let theirs = |item: &HashMap<String, AttributeValue>| item["slot"].as_n().is_ok_and(|slot| slot.starts_with(&own));
    for item in env.scan_table(table).await.into_iter().filter(theirs) {
        let mut old = item.clone();
        old.insert("slot".into(), AttributeValue::N("-2".into()));
        env.dynamo.put_item().table_name(table).set_item(Some(old)).send().await.expect("put");
        let key = HashMap::from([
            ("slot".to_owned(), item["slot"].clone()),
            ("sort_key".to_owned(), item["sort_key"].clone()),
        ]);
        env.dynamo.delete_item().table_name(table).set_key(Some(key)).send().await.expect("delete");
    }
}

/// Kills a playback `running` under `id` once its checkpoint counts `events`
/// put: no error, no release, its lease stays (as a crashed invocation leaves it).
pub async fn kill_playback_after(
    env: &TestEnv,
    id: &str,
    events: u64,
    running: tokio::task::JoinHandle<event_store::Result<event_store::playback::PlaybackSummary>>,
) {
    loop {
        let stored = event_store::readers::playbacks::load(&env.dynamo, &env.names.event_table, id).await.unwrap();
        if stored.and_then(|s| s.checkpoint).is_some_and(|c| c.events >= events) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    running.abort();
    assert!(running.await.unwrap_err().is_cancelled());
}

/// Sets the lease of the bookkeeping item `sort_key` in slot -2 to `until` (ms), held by a runner of the version before.
#[allow(dead_code)]
pub async fn an_old_lease(env: &TestEnv, sort_key: &str, until: i64) {
    let key = HashMap::from([
        ("slot".to_owned(), AttributeValue::N("-2".into())),
        ("sort_key".to_owned(), AttributeValue::S(sort_key.into())),
    ]);
    let update = env.dynamo.update_item().table_name(&env.names.event_table).set_key(Some(key));
    let update = update.update_expression("SET lease_owner = :old, lease_until = :until");
    let update = update.expression_attribute_values(":old", AttributeValue::S("a-runner-of-the-version-before".into()));
    update.expression_attribute_values(":until", AttributeValue::N(until.to_string())).send().await.expect("update");
}

pub fn on_a_large_stack<F: std::future::Future<Output = ()> + 'static>(test: fn() -> F) {
    let thread = std::thread::Builder::new().stack_size(16 << 20).spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_stack_size(16 << 20)
            .build()
            .expect("a runtime");
        runtime.block_on(Box::pin(test()));
    });
    if let Err(panic) = thread.expect("a thread").join() {
        std::panic::resume_unwind(panic);
    }
}

/// Every request counted so far, as IAM authorizes it (its action, resource
/// and condition keys: `event_store_emulator::iam`), is allowed by the
/// policies template.yaml gives `function` (a logical id), as AWS's policy
/// logic evaluates them (`tests/iam/simulate.cjs`).
pub fn assert_allowed_by_the_template(counter: &RequestCounter, function: &str) {
    // The stack has one bucket, which the tests name their own way (locally it needs no account and region).
    let bucket = format!("arn:aws:s3:::event-store-test-archive-{}-{}", event_store_emulator::iam::ACCOUNT, REGION);
    let requests: Vec<_> = counter
        .iam_requests()
        .into_iter()
        .map(|mut r| {
            if let Some(path) = r.resource.strip_prefix("arn:aws:s3:::") {
                r.resource = path.split_once('/').map_or(bucket.clone(), |(_, key)| format!("{bucket}/{key}"));
            }
            r
        })
        .collect();
    assert!(!requests.is_empty(), "no request recorded");
    let policies = template_policies(function);
    let cases: Vec<_> = requests.iter().map(|r| (policies.clone(), r.clone())).collect();
    let results = event_store_emulator::iam::evaluate(&repo_root(), &cases).expect("the IAM simulator");
    let refused: Vec<_> = requests.iter().zip(&results).filter(|(_, result)| *result != "Allowed").collect();
    assert!(refused.is_empty(), "{function}'s role would refuse what its code asks: {refused:#?}");
}

/// `function`'s policies in template.yaml, resolved for the tests' stack (`event-store-test`).
pub fn template_policies(function: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(repo_root().join("template.yaml")).expect("template.yaml");
    let template: serde_yaml::Value = serde_yaml::from_str(&text).expect("template.yaml parses");
    let stack = event_store_emulator::iam::Stack {
        service: "event-store".into(),
        stage: "test".into(),
        physical: std::collections::HashMap::new(),
    };
    event_store_emulator::iam::policies(&template, function, &stack)
}

/// Every AWS operation counted so far is one the stage declares in its
/// `AWS_ACTIONS` (which the template grants): the declaration is checked
/// against what the code really calls (a transaction by its parts' actions).
pub fn assert_only_declared_actions(counter: &RequestCounter, declared: &[&str]) {
    for operation in counter.snapshot().keys() {
        let (service, op) = operation.split_once('.').unwrap();
        let action = format!("{}:{op}", service.to_ascii_lowercase());
        if action == "dynamodb:TransactWriteItems" {
            continue; // No IAM action of its own: its parts' (checked against the template by `assert_allowed_by_the_template`).
        }
        assert!(declared.contains(&action.as_str()), "called {action}, which is not in {declared:?}");
    }
    assert!(!counter.snapshot().is_empty(), "nothing was called");
}

/// An SDK interceptor that fails the requests `fails` picks (by body, and the
/// count of requests seen before): a process dying at a chosen point.
/// Decides from a request's body and the number of requests before it.
type FailRule = Box<dyn Fn(&[u8], usize) -> bool + Send + Sync>;

pub struct FailRequests {
    fails: FailRule,
    seen: std::sync::atomic::AtomicUsize,
}

impl FailRequests {
    pub fn new(fails: impl Fn(&[u8], usize) -> bool + Send + Sync + 'static) -> Self {
        Self { fails: Box::new(fails), seen: Default::default() }
    }
}

impl std::fmt::Debug for FailRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FailRequests")
    }
}

impl aws_sdk_dynamodb::config::Intercept for FailRequests {
    fn name(&self) -> &'static str {
        "FailRequests"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        let seen = self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if (self.fails)(context.request().body().bytes().unwrap_or_default(), seen) {
            return Err("injected: the process died here".into());
        }
        Ok(())
    }
}
