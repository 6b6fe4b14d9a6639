//! Per-subject encryption and `forget` against a real emulator (moto:
//! Kinesis, DynamoDB, S3, KMS): an ingested event with a subject is sealed
//! before it reaches the stream, no copy of it anywhere holds its plaintext,
//! every reader opens it, and once its subject is forgotten every reader
//! shows it as `forgotten`, in order, while other subjects read as before.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::AttributeValue;
use common::{sample_event, TestEnv};
use event_store::archive::columns;
use event_store::archive::object::Bucket;
use event_store::archiver::Archiver;
use event_store::bookkeeping::slot_index::read_index;
use event_store::config::{ArchiveConfig, LoadConfig, RelayConfig, ScanConfig, SubjectsConfig};
use event_store::crypto;
use event_store::entity::relay::Relay;
use event_store::entity::{Direction, EntityStore, Expected, NewEvent};
use event_store::load::Load;
use event_store::log::copies::RecentIds;
use event_store::log::reader::Reader;
use event_store::log::tiers::Tiers;
use event_store::log::{PlayedEvent, Window};
use event_store::playback::{Playback, Status};
use event_store::position::Checkpoint;
use event_store::privacy::keys::{Forgot, Keys};
use event_store::privacy::maker::Maker;
use event_store::privacy::Subjects;
use event_store::subscription::Subscriptions;
use event_store::time::{format_ms, now_ms};
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::resources::create_subject_key;
use event_store_emulator::runs::{self, deadline_in, run_scan};
use event_store_emulator::table_stream::{deliver_all, TableStreamReader};
use event_store_fault_proxy::{Config, FaultProxy};
use lambda_http::http::StatusCode;
use serde_json::{json, Value};

const BUCKET: &str = "event-store-privacy";
const HASH_KEY: &str = "a test secret of at least 32 bytes, not for use";
/// What must never rest in the clear: alice's id and what she did.
const SECRETS: [&str; 3] = ["alice-42", "alice-secret", ALICE_IP];
/// The address alice's events come from (the anonymous hit comes from the sample's).
const ALICE_IP: &str = "198.51.100.42";

fn post(events: &Value) -> lambda_http::Request {
    post_from(events, "203.0.113.10")
}

fn post_from(events: &Value, ip: &str) -> lambda_http::Request {
    let mut request: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
    request["body"] = json!(events.to_string());
    request["requestContext"]["http"]["sourceIp"] = json!(ip);
    request["headers"]["x-forwarded-for"] = json!(ip);
    lambda_http::request::from_str(&request.to_string()).unwrap()
}

fn in_the_clear(bytes: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(bytes);
    SECRETS.into_iter().find(|secret| text.contains(secret))
}

fn keys(env: &TestEnv, kms: &aws_sdk_kms::Client, cache: Duration) -> Arc<Keys> {
    Arc::new(Keys::new(env.dynamo.clone(), kms.clone(), env.names.key_table.clone()).cached_for(cache))
}

/// Every event of the log in `[start, end)` as readers get it.
async fn log(env: &TestEnv, tiers: &Tiers, start: i64, end: i64) -> event_store::Result<Vec<Value>> {
    let table = env.names.event_table.as_str();
    let first_slot = start - start.rem_euclid(1000);
    let (slots, _) = read_index(&env.dynamo, table, first_slot, end).await.unwrap();
    let window = Window { start, end };
    let reader = Reader {
        dynamo: &env.dynamo,
        table,
        time_unit_ms: 1000,
        page_items: None,
        dedupe_window_ms: 0,
        window: &window,
        keys: event_store::slices::KeyRange::ALL,
        tiers,
    };
    let mut out = Vec::new();
    reader
        .each_event(slots, Checkpoint::at_slot(first_slot), &mut RecentIds::new(0), |_, json, _| {
            out.push(json.unwrap());
            ControlFlow::Continue(())
        })
        .await?;
    Ok(out)
}

/// The log's new events: pumped, then sealed by a scan; a time after them all (the scan has sealed it).
async fn into_the_log(env: &TestEnv, pumped: &mut usize) -> i64 {
    let pump = common::pump(env);
    let batches = env.event_source_batches().await;
    for mut batch in batches {
        // The stream is read from its start each time: only what was not pumped yet.
        let skip = (*pumped).min(batch.records.len());
        batch.records.drain(..skip);
        *pumped += batch.records.len();
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    // Nothing the pump wrote holds alice in the clear.
    for item in env.scan_table(&env.names.buffer_table).await {
        for event in event_store::buffer_item::BufferItem::from_item(item).unwrap().events().unwrap() {
            assert_eq!(in_the_clear(&event.data), None, "the buffer table");
        }
    }
    let done = now_ms();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let scan = ScanConfig { segments: 1, watermark_lag_ms: 0, ..runs::scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(120))).await
    {
        pass.unwrap();
    }
    done
}

/// Subjects as the template's default: a hit's `EntityId` (the visitor id), and `user-` streams.
fn visitors_are_subjects(env: &TestEnv) -> SubjectsConfig {
    SubjectsConfig {
        key_table: env.names.key_table.clone(),
        key_function: None,
        kms_key: Some(env.names.subject_key_alias.clone()),
        hash_key: Some(HASH_KEY.into()),
        subject_from: Some("EntityId".into()),
        stream_subjects: Some("prefix:user-".into()),
        cache: Duration::from_secs(60),
    }
}

const BEFORE: [&str; 4] = ["/alice-secret/1", "/alice-secret/2", "/bob/1", "/public"];
const AFTER: [&str; 5] = ["/alice-secret/3", "/bob/1", "/public", "forgotten", "forgotten"];

#[tokio::test(flavor = "multi_thread")]
async fn a_forgotten_subject_reads_as_forgotten_everywhere_and_nothing_of_it_rests_in_the_clear() {
    let env = TestEnv::start(1).await;
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).build());
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let bucket = Bucket::new(&env.sdk, BUCKET.into());
    let kms = aws_sdk_kms::Client::new(&env.sdk);
    let kms_key = create_subject_key(&kms, &env.names.subject_key_alias).await.unwrap();
    let subjects_config = visitors_are_subjects(&env);
    let writer_keys = Arc::new(
        Keys::new(env.dynamo.clone(), kms.clone(), env.names.key_table.clone())
            .made_by(Some(Maker::Kms(kms_key.clone()))),
    );
    let subjects = Subjects::new(writer_keys.clone(), &subjects_config).unwrap();
    let alice = crypto::subject_hash(HASH_KEY.as_bytes(), "alice-42");
    assert_eq!(subjects.hash("alice-42"), alice);
    let config = LoadConfig { archive_bucket: Some(BUCKET.into()), ..LoadConfig::new(env.names.event_stream.clone()) };
    let load = Load::new(env.kinesis.clone(), LoadConfig { max_event_bytes: 1 << 20, ..config })
        .with_archive(Some(bucket.clone()))
        .with_subjects(Some(subjects));
    let start = now_ms() - 1;

    // Alice's events (one large enough to be offloaded, sealed) and bob's from alice's address, then an
    // anonymous hit (alice's second comes after bob's: each key's events are put in order, one a round).
    let a1 = json!({"EntityId": "alice-42", "page": "/alice-secret/1"});
    // Incompressible (sealed parts are compressed first), so that its sealed block is offloaded.
    let noise: String = (0..6000).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect();
    let a2 = json!({"EntityId": "alice-42", "page": "/alice-secret/2", "pad": noise});
    let b1 = json!({"EntityId": "bob-7", "page": "/bob/1"});
    let anonymous = json!({"page": "/public"});
    let answer = load.handle(post_from(&json!([a1, b1, a2]), ALICE_IP)).await;
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    assert_eq!(load.handle(post(&json!([anonymous]))).await.status(), StatusCode::ACCEPTED);
    // A new subject's key is made wrapped (its maker never sees it), then unwrapped to seal with.
    assert_eq!(writer_keys.kms_requests(), 4, "two KMS requests per subject's new key, not one per event");

    // On the stream: sealed, alice's partition key her hash, nothing of her in the clear.
    let records = env.read_stream(&env.names.event_stream).await;
    assert_eq!(records.len(), 4);
    for (_, record) in &records {
        assert_eq!(in_the_clear(record.data().as_ref()), None, "the event stream");
    }
    let keys_on_stream: Vec<&str> = records.iter().map(|(_, r)| r.partition_key().unwrap()).collect();
    assert_eq!(keys_on_stream[0], alice);
    let sealed: Value = serde_json::from_slice(records[0].1.data().as_ref()).unwrap();
    assert_eq!((sealed["subject"].as_str(), sealed["sealed"]["g"].as_u64()), (Some(alice.as_str()), Some(0)));
    assert!(sealed.get("body").is_none() && sealed["query"] == json!({}));
    let offloaded: Value = serde_json::from_slice(records[2].1.data().as_ref()).unwrap();
    assert!(offloaded["sealed_ref"]["key"].is_string() && offloaded.get("sealed").is_none(), "{offloaded}");
    let anonymous_record: Value = serde_json::from_slice(records[3].1.data().as_ref()).unwrap();
    assert_eq!(anonymous_record["body"], anonymous, "no subject, nothing sealed");

    let mut pumped = 0;
    let done = into_the_log(&env, &mut pumped).await;

    // Every reader with the keys gets the events as sent; without them it says what it lacks.
    let reader_keys = keys(&env, &kms, Duration::ZERO);
    let tiers = Tiers::new(Some(bucket.clone())).with_keys(Some(reader_keys.clone()));
    let read = log(&env, &tiers, start, done).await.unwrap();
    assert_eq!(read.iter().map(|e| &e["body"]).collect::<Vec<_>>(), [&a1, &b1, &a2, &anonymous], "as sent, in order");
    assert_eq!(read[0]["source_ip"], ALICE_IP, "the address too, sealed and put back");
    assert_eq!(read[0]["subject"], alice.as_str());
    let failed = log(&env, &Tiers::new(Some(bucket.clone())), start, done).await.unwrap_err();
    assert!(failed.to_string().contains("KEY_TABLE"), "{failed}");

    // Playback and a subscription before the forget.
    let playback = |id: &str, done: i64| {
        let (invoker, _rx) = LocalInvoker::channel();
        let playback = Playback::new(
            env.dynamo.clone(),
            env.kinesis.clone(),
            runs::playback_config(&env.names),
            Arc::new(invoker),
        )
        .with_archive(Some(bucket.clone()))
        .with_keys(Some(keys(&env, &kms, Duration::ZERO)));
        let window = json!({"start": format_ms(start), "end": format_ms(done), "id": id});
        async move { playback.handle(window, SystemTime::now() + Duration::from_secs(300)).await.unwrap() }
    };
    let summary = playback("before", done).await;
    assert_eq!((summary.status, summary.events), (Status::Complete, 4), "{summary:?}");
    let played_before = played(&env).await;
    assert_eq!(sorted_pages(&played_before, &alice), BEFORE);
    let subscriptions_with = |kms: &aws_sdk_kms::Client| {
        let keys = keys(&env, kms, Duration::ZERO);
        let (env, bucket) = (&env, bucket.clone());
        move |invoker| {
            let lambda = aws_sdk_lambda::Client::new(&env.sdk);
            let config = runs::subscription_config(&env.names);
            Subscriptions::new(env.dynamo.clone(), env.kinesis.clone(), lambda, config, invoker)
                .with_archive(Some(bucket))
                .with_keys(Some(keys))
        }
    };
    let target = json!({"kinesis": env.names.subscription_stream});
    let create = json!({"action": "create", "name": "audit", "start": format_ms(start), "target": target});
    let (invoker, _rx) = LocalInvoker::channel();
    subscriptions_with(&kms)(Arc::new(invoker))
        .handle(create, SystemTime::now() + Duration::from_secs(60))
        .await
        .unwrap();
    let tick = json!({"source": "aws.events"});
    for answer in
        runs::run_subscriptions(subscriptions_with(&kms), tick.clone(), deadline_in(Duration::from_secs(300))).await
    {
        answer.unwrap();
    }
    let delivered_before = delivered(&env).await;
    assert_eq!(sorted_pages(&delivered_before, &alice), BEFORE);

    // Forget alice: idempotent; an unknown subject is no error and writes nothing.
    let forgetting = keys(&env, &kms, Duration::from_secs(60));
    assert_eq!(
        forgetting.forget(&alice, "arn:aws:iam::123456789012:user/dpo").await.unwrap(),
        Forgot::Done { generations: 1 }
    );
    assert_eq!(forgetting.forget(&alice, "arn:aws:iam::123456789012:user/dpo").await.unwrap(), Forgot::Already);
    let unknown = crypto::subject_hash(HASH_KEY.as_bytes(), "nobody");
    let items_before = env.scan_table(&env.names.key_table).await.len();
    assert_eq!(forgetting.forget(&unknown, "someone").await.unwrap(), Forgot::Unknown);
    assert_eq!(env.scan_table(&env.names.key_table).await.len(), items_before);
    // A forget that stopped after marking the head forgotten: the next one destroys what it left, and says so.
    let carol = crypto::subject_hash(HASH_KEY.as_bytes(), "carol");
    env.counter.reset();
    event_store::privacy::manage::make_key(&writer_keys, json!({"subject": carol})).await.unwrap();
    common::assert_allowed_by_the_template(&env.counter, "KeysFunction");
    let head = HashMap::from([
        ("subject".to_owned(), AttributeValue::S(carol.clone())),
        ("item".to_owned(), AttributeValue::S("head".into())),
    ]);
    env.dynamo
        .update_item()
        .table_name(&env.names.key_table)
        .set_key(Some(head))
        .update_expression("SET #state = :forgotten")
        .expression_attribute_names("#state", "state")
        .expression_attribute_values(":forgotten", AttributeValue::S("forgotten".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(forgetting.forget(&carol, "dpo").await.unwrap(), Forgot::Done { generations: 1 });
    assert_eq!(forgetting.forget(&carol, "dpo").await.unwrap(), Forgot::Already);
    // Who forgot whom and when, without alice's id.
    let key_items = env.scan_table(&env.names.key_table).await;
    let record: Vec<&HashMap<String, AttributeValue>> =
        key_items.iter().filter(|i| i["item"].as_s().unwrap().starts_with("forgot#")).collect();
    assert_eq!(record.len(), 1, "{key_items:?}");
    assert_eq!(record[0]["by"].as_s().unwrap(), "arn:aws:iam::123456789012:user/dpo");
    assert!(key_items.iter().all(|i| !format!("{i:?}").contains("alice")), "the key table holds hashes only");
    assert!(key_items.iter().all(|i| !i.contains_key("wrapped") || *i["subject"].as_s().unwrap() != alice));

    // A warm writer seals under the key it holds for up to KEY_CACHE_SECONDS after a forget (what
    // docs/privacy.md promises); one that reads the key table after it makes a new generation.
    assert_eq!(writer_keys.sealing_generation(&alice).await.unwrap(), 0, "the forget window");
    let fresh = Arc::new(
        Keys::new(env.dynamo.clone(), kms.clone(), env.names.key_table.clone()).made_by(Some(Maker::Kms(kms_key))),
    );
    assert_eq!(fresh.sealing_generation(&alice).await.unwrap(), 1, "a new key after the forget");
    let load = Load::new(env.kinesis.clone(), LoadConfig::new(env.names.event_stream.clone()))
        .with_subjects(Some(Subjects::new(fresh, &subjects_config).unwrap()));
    let a3 = json!({"EntityId": "alice-42", "page": "/alice-secret/3"});
    assert_eq!(load.handle(post(&json!([a3.clone()]))).await.status(), StatusCode::ACCEPTED);
    let done = into_the_log(&env, &mut pumped).await;

    // Every reader now: alice's old events as `forgotten`, in place; the rest as sent.
    let read = log(&env, &tiers, start, done).await.unwrap();
    assert_eq!(pages(&read, &alice), ["forgotten", "/bob/1", "forgotten", "/public", "/alice-secret/3"], "in place");
    let summary = playback("after", done).await;
    assert_eq!((summary.status, summary.events, summary.unreadable), (Status::Complete, 5, 0), "{summary:?}");
    let played_after: Vec<Value> = played(&env).await.split_off(4);
    assert_eq!(sorted_pages(&played_after, &alice), AFTER);
    // The subscription goes on with alice's new event; one made now reads the forgotten ones.
    for answer in
        runs::run_subscriptions(subscriptions_with(&kms), tick.clone(), deadline_in(Duration::from_secs(300))).await
    {
        answer.unwrap();
    }
    let create = json!({"action": "create", "name": "late", "start": format_ms(start), "target": {"kinesis": env.names.subscription_stream}});
    let (invoker, _rx) = LocalInvoker::channel();
    subscriptions_with(&kms)(Arc::new(invoker))
        .handle(create, SystemTime::now() + Duration::from_secs(60))
        .await
        .unwrap();
    for answer in
        runs::run_subscriptions(subscriptions_with(&kms), tick.clone(), deadline_in(Duration::from_secs(300))).await
    {
        answer.unwrap();
    }
    let delivered_all = delivered(&env).await;
    assert_eq!(pages(&delivered_all[4..5], &alice), ["/alice-secret/3"], "the first subscription: alice's new event");
    assert_eq!(sorted_pages(&delivered_all[5..], &alice), AFTER);

    // The KMS key disabled (as KMS answers it: moto keeps using a disabled key): readers fail
    // clearly, not skipping anything; a subscription stays where it was, and goes on once it is enabled.
    let a4 = json!({"EntityId": "alice-42", "page": "/alice-secret/4"});
    assert_eq!(load.handle(post(&json!([a4]))).await.status(), StatusCode::ACCEPTED);
    let done = into_the_log(&env, &mut pumped).await;
    let endpoint = env.sdk.endpoint_url().unwrap().to_owned();
    let proxy = FaultProxy::start(&endpoint, Config { seed: 0, rate: 0.0, only: Some(&[]) }).await.unwrap();
    let through_proxy = aws_sdk_kms::Client::from_conf(
        aws_sdk_kms::config::Builder::from(&env.sdk).endpoint_url(&proxy.endpoint).build(),
    );
    proxy.disable_kms_keys(true);
    let disabled = Tiers::new(Some(bucket.clone())).with_keys(Some(keys(&env, &through_proxy, Duration::ZERO)));
    let failed = log(&env, &disabled, start, done).await.unwrap_err();
    assert!(matches!(failed, event_store::Error::Kms { .. }) && !failed.is_unreadable(), "{failed:?}");
    assert!(failed.to_string().contains("DisabledException"), "{failed}");
    // load, without a key for a new subject, stores nothing and says to retry.
    let blocked = Keys::new(env.dynamo.clone(), through_proxy.clone(), env.names.key_table.clone())
        .made_by(Some(Maker::Kms(env.names.subject_key_alias.clone())));
    let blocked = Load::new(env.kinesis.clone(), LoadConfig::new(env.names.event_stream.clone()))
        .with_subjects(Some(Subjects::new(Arc::new(blocked), &subjects_config).unwrap()));
    let on_stream = env.read_stream(&env.names.event_stream).await.len();
    let carol = json!({"EntityId": "carol-1", "page": "/carol"});
    assert_eq!(blocked.handle(post(&json!([carol]))).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(env.read_stream(&env.names.event_stream).await.len(), on_stream, "nothing stored unsealed");
    let delivered_so_far = delivered(&env).await.len();
    let answers = runs::run_subscriptions(
        subscriptions_with(&through_proxy),
        tick.clone(),
        deadline_in(Duration::from_secs(300)),
    )
    .await;
    assert!(
        answers.iter().any(|a| a.as_ref().is_err_and(|e| e.to_string().contains("DisabledException"))),
        "{answers:?}"
    );
    assert_eq!(delivered(&env).await.len(), delivered_so_far, "nothing delivered, nothing skipped");
    proxy.disable_kms_keys(false);
    for answer in
        runs::run_subscriptions(subscriptions_with(&through_proxy), tick, deadline_in(Duration::from_secs(300))).await
    {
        answer.unwrap();
    }
    let resumed = delivered(&env).await.split_off(delivered_so_far);
    assert_eq!(pages(&resumed, &alice), ["/alice-secret/4", "/alice-secret/4"], "each subscription, once");
    let read = log(&env, &disabled, start, done).await.unwrap();
    assert_eq!(pages(&read, &alice).last().map(String::as_str), Some("/alice-secret/4"));

    // Archived: the Parquet rows hold alice's events sealed, and every reader reads them from S3 as before.
    let archiver = Archiver {
        dynamo: env.dynamo.clone(),
        bucket: bucket.clone(),
        config: ArchiveConfig {
            bucket: BUCKET.into(),
            event_table: env.names.event_table.clone(),
            prefix: "events/".into(),
            hot_retention: Duration::ZERO,
            object_bytes: 16 * 1024,
            min_slice_rows: event_store::config::DEFAULT_MIN_SLICE_ROWS,
            dedupe_window_ms: 0,
            deadline_margin: Duration::from_secs(1),
            lease: Duration::from_secs(60),
            max_continuations: 0,
            metrics_namespace: "EventStore/test".into(),
        },
    };
    let archived = archiver.run(now_ms(), std::time::Instant::now() + Duration::from_secs(120)).await.unwrap();
    assert_eq!(archived.events, 6, "{archived:?}");
    assert!(common::stored_events(&env).await.is_empty(), "the table holds none of them now");
    let objects = s3.list_objects_v2().bucket(BUCKET).prefix("events/").send().await.unwrap();
    let mut rows = Vec::new();
    for object in objects.contents() {
        rows.extend(columns::open(bucket.get(object.key().unwrap()).await.unwrap()).unwrap().rows);
    }
    assert_eq!(rows.len(), 6);
    for row in &rows {
        let text = row.payload.clone().unwrap_or_default();
        assert_eq!(in_the_clear(text.as_bytes()), None, "the archive");
        assert_eq!(row.payload_bytes.as_deref().and_then(in_the_clear), None, "the archive");
        assert_eq!(text.contains("\"sealed"), !text.contains("/public"), "all but the anonymous hit, sealed");
    }
    let read = log(&env, &tiers, start, done).await.unwrap();
    let expected = ["forgotten", "/bob/1", "forgotten", "/public", "/alice-secret/3", "/alice-secret/4"];
    assert_eq!(pages(&read, &alice), expected, "from the archive, in place");

    // Nothing of alice rests in the clear: the stream, the tables, the bucket.
    for (_, record) in env.read_stream(&env.names.event_stream).await {
        assert_eq!(in_the_clear(record.data().as_ref()), None, "the event stream");
    }
    for event in common::stored_events(&env).await {
        assert_eq!(in_the_clear(&event.bytes().unwrap()), None, "the event table");
    }
    let objects = s3.list_objects_v2().bucket(BUCKET).send().await.unwrap();
    assert!(!objects.contents().is_empty());
    for object in objects.contents() {
        let got = s3.get_object().bucket(BUCKET).key(object.key().unwrap()).send().await.unwrap();
        assert_eq!(in_the_clear(&got.body.collect().await.unwrap().into_bytes()), None, "the bucket");
    }
}

/// Each event's page as read, or `forgotten` (with generation 0, alice's,
/// its ids kept) for a forgotten one.
fn pages(events: &[Value], alice: &str) -> Vec<String> {
    let page = |event: &Value| {
        if event.get("forgotten").is_none() {
            return event["body"]["page"].as_str().unwrap_or("?").to_owned();
        }
        assert_eq!((event["subject"].as_str(), &event["forgotten"]["generation"]), (Some(alice), &json!(0)));
        assert!(event["forgotten"]["at"].is_string() && event.get("body").is_none() && event.get("sealed").is_none());
        assert!(event["id"].is_string() && event["received_at"].is_string(), "{event}");
        "forgotten".to_owned()
    };
    events.iter().map(page).collect()
}

/// As [`pages`], in any order (playback and subscriptions keep each key's order, not the log's across keys).
fn sorted_pages(events: &[Value], alice: &str) -> Vec<String> {
    let mut pages = pages(events, alice);
    pages.sort();
    pages
}

/// What the playback stream holds, in order, each event's record.
async fn played(env: &TestEnv) -> Vec<Value> {
    let mut out = Vec::new();
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        for (_, data) in
            event_store::aggregation::deaggregate(record.partition_key().unwrap(), record.data().as_ref()).unwrap()
        {
            out.push(serde_json::from_slice::<PlayedEvent>(&data).unwrap().data.unwrap());
        }
    }
    out
}

/// What the subscription target holds, in order, each event's record.
async fn delivered(env: &TestEnv) -> Vec<Value> {
    let mut out = Vec::new();
    for (_, record) in env.read_stream(&env.names.subscription_stream).await {
        for (_, data) in
            event_store::aggregation::deaggregate(record.partition_key().unwrap(), record.data().as_ref()).unwrap()
        {
            out.push(serde_json::from_slice::<Value>(&data).unwrap()["data"].clone());
        }
    }
    out
}

/// An entity stream that is a data subject (`STREAM_SUBJECTS=prefix:user-`): its events' data and
/// its snapshot are sealed in the entity table, on the stream and in the event table; reads open
/// them; forgotten, every read shows `forgotten` and the snapshot is gone. Another stream is untouched.
#[tokio::test(flavor = "multi_thread")]
async fn a_subjects_entity_stream_is_sealed_and_forgotten() {
    let env = TestEnv::start(1).await;
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).build());
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let bucket = Bucket::new(&env.sdk, BUCKET.into());
    let kms = aws_sdk_kms::Client::new(&env.sdk);
    let kms_key = create_subject_key(&kms, &env.names.subject_key_alias).await.unwrap();
    let config = SubjectsConfig {
        key_table: env.names.key_table.clone(),
        key_function: None,
        kms_key: Some(kms_key.clone()),
        hash_key: Some(HASH_KEY.into()),
        subject_from: None,
        stream_subjects: Some("prefix:user-".into()),
        cache: Duration::from_secs(60),
    };
    let writer = Arc::new(
        Keys::new(env.dynamo.clone(), kms.clone(), env.names.key_table.clone()).made_by(Some(Maker::Kms(kms_key))),
    );
    let store = EntityStore::new(env.dynamo.clone(), env.names.entity_table.clone())
        .with_archive(Some(bucket.clone()), 64 * 1024)
        .with_subjects(Some(Subjects::new(writer, &config).unwrap()));
    let start = now_ms() - 1;
    let small = json!({"note": "alice-secret/profile"});
    let large = json!({"note": "alice-secret/history", "pad": "h".repeat(100 * 1024)});
    let events = vec![NewEvent::new("Registered", small.clone()), NewEvent::new("Imported", large.clone())];
    let state = json!({"seen": "alice-secret/state"});
    store.append_with_snapshot("user-7", Expected::NoStream, events, &state).await.unwrap();
    store.append("order-1", Expected::NoStream, vec![NewEvent::new("Placed", json!({"n": 1}))]).await.unwrap();
    for item in env.scan_table(&env.names.entity_table).await {
        assert_eq!(in_the_clear(format!("{item:?}").as_bytes()), None, "the entity table");
    }
    let read = store.read("user-7", None, 10, Direction::Forward).await.unwrap();
    assert_eq!((read.events[0].data.clone(), read.events[1].data.clone()), (small.clone(), large.clone()));
    assert_eq!(store.state("user-7").await.unwrap().snapshot.unwrap().state, state);

    // Relayed, pumped and scanned: sealed on the stream and in the log; every log reader opens them.
    let relay_config = RelayConfig {
        event_stream: env.names.event_stream.clone(),
        entity_table: env.names.entity_table.clone(),
        dead_letter_queue: None,
        hold_after: Duration::from_secs(300),
    };
    let relay = Relay::new(env.kinesis.clone(), env.dynamo.clone(), aws_sdk_sqs::Client::new(&env.sdk), relay_config);
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut table_stream =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    env.counter.reset();
    deliver_all(&mut table_stream, &mut VecDeque::new(), 10, 50, |event| relay.handle(event)).await.unwrap();
    common::assert_allowed_by_the_template(&env.counter, "RelayFunction");
    let records = env.read_stream(&env.names.event_stream).await;
    assert_eq!(records.len(), 3);
    assert!(records.iter().all(|(_, r)| in_the_clear(r.data().as_ref()).is_none()), "the event stream");
    let done = into_the_log(&env, &mut 0).await;
    let tiers = Tiers::new(Some(bucket.clone())).with_keys(Some(keys(&env, &kms, Duration::ZERO)));
    let logged = log(&env, &tiers, start, done).await.unwrap();
    let of = |logged: &[Value], stream: &str| -> Vec<Value> {
        logged.iter().filter(|e| e["body"]["stream"] == stream).map(|e| e["body"].clone()).collect()
    };
    let user = of(&logged, "user-7");
    assert_eq!((&user[0]["data"], &user[1]["data"]), (&small, &large), "opened, in version order");
    assert_eq!(of(&logged, "order-1")[0]["data"], json!({"n": 1}));
    // The name stays in the clear, so no record pairs it with the subject hash of that id (what a
    // pixel's hashed partition key for the id would be): the stream's events carry a hash of its own.
    let id_hash = crypto::subject_hash(HASH_KEY.as_bytes(), "user-7");
    let subject = crypto::stream_subject_hash(HASH_KEY.as_bytes(), "user-7");
    assert!(user.iter().all(|e| e["subject"] == subject.as_str()), "{user:?}");
    let raw: Vec<String> =
        records.iter().map(|(_, r)| String::from_utf8_lossy(r.data().as_ref()).into_owned()).collect();
    let entity_items = format!("{:?}", env.scan_table(&env.names.entity_table).await);
    assert!(!raw.iter().any(|r| r.contains(&id_hash)) && !entity_items.contains(&id_hash), "{raw:?}");
    assert!(logged.iter().all(|e| !e.to_string().contains(&id_hash)));

    // A subscription selecting the `order` category (by the key, in the clear) gets exactly order-1's
    // event; user-7's sealed events, one of them offloaded, are never opened: its keys and payloads
    // are reached only through a proxy, which sees no request at all.
    let endpoint = env.sdk.endpoint_url().unwrap().to_owned();
    let proxy = FaultProxy::start(&endpoint, Config { seed: 0, rate: 0.0, only: Some(&[]) }).await.unwrap();
    let proxied = env.sdk.to_builder().endpoint_url(&proxy.endpoint).build();
    let proxied_s3 = aws_sdk_s3::config::Builder::from(&proxied).force_path_style(true).build();
    let proxied_bucket = Bucket { s3: aws_sdk_s3::Client::from_conf(proxied_s3), name: BUCKET.into() };
    let proxied_keys = Arc::new(Keys::new(
        aws_sdk_dynamodb::Client::new(&proxied),
        aws_sdk_kms::Client::new(&proxied),
        env.names.key_table.clone(),
    ));
    let selecting = |invoker| {
        let lambda = aws_sdk_lambda::Client::new(&env.sdk);
        Subscriptions::new(
            env.dynamo.clone(),
            env.kinesis.clone(),
            lambda,
            runs::subscription_config(&env.names),
            invoker,
        )
        .with_archive(Some(proxied_bucket.clone()))
        .with_keys(Some(proxied_keys.clone()))
    };
    let target = json!({"kinesis": env.names.subscription_stream});
    let create = json!({"action": "create", "name": "orders", "start": format_ms(start), "target": target,
                        "select": {"categories": ["order"]}});
    let (invoker, _rx) = LocalInvoker::channel();
    selecting(Arc::new(invoker)).handle(create, SystemTime::now() + Duration::from_secs(60)).await.unwrap();
    let tick = json!({"source": "aws.events"});
    let runs = runs::run_subscriptions(selecting, tick, deadline_in(Duration::from_secs(300))).await;
    let filtered: u64 = runs.into_iter().map(|r| r.unwrap()).filter_map(|a| a["filtered_out"].as_u64()).sum();
    assert_eq!(filtered, 2, "user-7's two events passed over");
    let orders: Vec<Value> = delivered(&env).await;
    assert_eq!(orders.iter().map(|e| e["body"]["stream"].clone()).collect::<Vec<_>>(), [json!("order-1")]);
    assert_eq!(orders[0]["body"]["data"], json!({"n": 1}));
    assert_eq!(
        proxy.counts().get("requests").copied().unwrap_or(0),
        0,
        "no key and no payload fetched: {:?}",
        proxy.counts()
    );
    drop(proxy);

    // A state view of both categories (issue 47), kept by runners that open the events.
    let viewing = |invoker| {
        let lambda = aws_sdk_lambda::Client::new(&env.sdk);
        let config = runs::subscription_config(&env.names);
        Subscriptions::new(env.dynamo.clone(), env.kinesis.clone(), lambda, config, invoker)
            .with_archive(Some(bucket.clone()))
            .with_keys(Some(keys(&env, &kms, Duration::ZERO)))
    };
    let manage = |action: Value| {
        let (invoker, rx) = LocalInvoker::channel();
        let subs = viewing(Arc::new(invoker));
        async move {
            let answer = subs.handle(action, SystemTime::now() + Duration::from_secs(60)).await.unwrap();
            drop(rx);
            answer.to_json().unwrap()
        }
    };
    let project =
        || runs::run_subscriptions(viewing, json!({"source": "aws.events"}), deadline_in(Duration::from_secs(300)));
    manage(json!({"action": "create_projection", "name": "people", "kind": "state", "category": ["user", "order"],
        "start": format_ms(start)}))
    .await;
    project().await;
    let item = |key: &'static str| manage(json!({"action": "view", "name": "people", "key": key}));
    let before = item("user-7").await;
    assert_eq!(
        before["item"]["state"]["note"], "alice-secret/history",
        "merged in version order: {}",
        before["item"]["stream_version"]
    );
    assert_eq!(item("order-1").await["item"]["state"], json!({"n": 1}));

    // Forgotten by the stream's name (the privacy function hashes it both ways): reads, the state,
    // the log and the state view show it forgotten, in place.
    let config = event_store::config::PrivacyConfig {
        key_table: env.names.key_table.clone(),
        hash_key: HASH_KEY.into(),
        view_table: Some(env.names.view_table.clone()),
    };
    let privacy = event_store::privacy::manage::Privacy::new(keys(&env, &kms, Duration::ZERO), &config)
        .with_views(env.dynamo.clone(), &config);
    env.counter.reset();
    let forgot = privacy.handle(json!({"action": "forget", "subject": "user-7", "by": "dpo"})).await.unwrap();
    common::assert_allowed_by_the_template(&env.counter, "PrivacyFunction");
    assert_eq!((forgot["forgotten"].as_str(), forgot["generations"].as_u64()), (Some("done"), Some(1)), "{forgot}");
    assert_eq!(forgot["view_items"], 1, "user-7's item in the state view: {forgot}");
    let gone = item("user-7").await;
    assert!(gone["forgotten"]["at"].is_string() && gone.get("item").is_none(), "{gone}");
    assert_eq!(item("order-1").await["item"]["state"], json!({"n": 1}), "another stream's item, untouched");
    for view in env.scan_table(&env.names.view_table).await {
        assert_eq!(in_the_clear(format!("{view:?}").as_bytes()), None, "the views table");
    }
    // Rebuilt after the forget: the events reach the new version as forgotten, so it holds the marker too.
    manage(json!({"action": "rebuild_projection", "name": "people"})).await;
    project().await;
    project().await;
    let rebuilt = manage(json!({"action": "view", "name": "people", "key": "user-7"})).await;
    assert_eq!(rebuilt["forgotten"]["generation"], 0, "the forgotten events' marker: {rebuilt}");
    let order = manage(json!({"action": "view", "name": "people", "key": "order-1"})).await;
    assert_eq!((order["version"].as_u64(), &order["item"]["state"]), (Some(2), &json!({"n": 1})));
    for view in env.scan_table(&env.names.view_table).await {
        assert_eq!(in_the_clear(format!("{view:?}").as_bytes()), None, "the views table, rebuilt");
    }
    assert_eq!(forgot["stream_subject"], subject.as_str());
    let reader = EntityStore::new(env.dynamo.clone(), env.names.entity_table.clone())
        .with_archive(Some(bucket.clone()), 64 * 1024)
        .with_keys(Some(keys(&env, &kms, Duration::ZERO)));
    let read = reader.read("user-7", None, 10, Direction::Forward).await.unwrap();
    assert!(read.events.iter().all(|e| e.data.is_null() && e.forgotten.as_ref().is_some_and(|f| f["generation"] == 0)));
    assert_eq!(read.events.iter().map(|e| e.event_type.as_str()).collect::<Vec<_>>(), ["Registered", "Imported"]);
    let snapshot = reader.state("user-7").await.unwrap().snapshot.unwrap();
    assert_eq!((snapshot.version, &snapshot.state["forgotten"]["generation"]), (1, &json!(0)), "the state is gone");
    assert_eq!(reader.read("order-1", None, 10, Direction::Forward).await.unwrap().events[0].data, json!({"n": 1}));
    let logged = log(&env, &tiers, start, done).await.unwrap();
    let user = of(&logged, "user-7");
    assert!(user.iter().all(|e| e["forgotten"]["at"].is_string() && e["data"].is_null()), "{user:?}");
    assert_eq!(user.iter().map(|e| e["version"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(of(&logged, "order-1")[0]["data"], json!({"n": 1}), "another stream, untouched");

    // A forget that raced a new key's making leaves the head on a destroyed generation: the next
    // writer makes another one rather than failing for ever.
    let fresh = Keys::new(env.dynamo.clone(), kms.clone(), env.names.key_table.clone())
        .made_by(Some(Maker::Kms(env.names.subject_key_alias.clone())));
    assert_eq!(fresh.sealing_generation(&subject).await.unwrap(), 1);
    let destroy = env
        .dynamo
        .update_item()
        .table_name(&env.names.key_table)
        .update_expression("REMOVE #w")
        .expression_attribute_names("#w", "wrapped");
    let destroy = destroy
        .key("subject", AttributeValue::S(subject.clone()))
        .key("item", AttributeValue::S("g#0000000001".into()));
    destroy.send().await.unwrap();
    let next = Keys::new(env.dynamo.clone(), kms.clone(), env.names.key_table.clone())
        .made_by(Some(Maker::Kms(env.names.subject_key_alias.clone())));
    assert_eq!(next.sealing_generation(&subject).await.unwrap(), 2, "failed before: the same forgotten key five times");
}

/// The click stream in SQL within the hour (issue 49): the tracker's page views, anonymous and of
/// identified visitors (an `EntityId`: their subject), over five past hours and the current one,
/// through load, the pump and the scan. The archiver copies every complete hour to S3 with the
/// analyst's columns and moves out of DynamoDB only the hours past the hot retention. DuckDB,
/// reading the objects as a user would, counts the anonymous page views per page and hour as they
/// were sent, the hot hours included, and finds the columns empty for the identified visitors,
/// whose page views a `count` view counts instead; the archive verifies.
#[tokio::test(flavor = "multi_thread")]
async fn the_click_stream_is_in_sql_within_the_hour_and_the_identified_visitors_pages_are_not() {
    const HOUR: i64 = 3_600_000;
    let env = TestEnv::start(1).await;
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).build());
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let bucket = Bucket::new(&env.sdk, BUCKET.into());
    let kms = aws_sdk_kms::Client::new(&env.sdk);
    let kms_key = create_subject_key(&kms, &env.names.subject_key_alias).await.unwrap();
    let writer =
        Keys::new(env.dynamo.clone(), kms.clone(), env.names.key_table.clone()).made_by(Some(Maker::Kms(kms_key)));
    let subjects = Subjects::new(Arc::new(writer), &visitors_are_subjects(&env)).unwrap();
    let load =
        Load::new(env.kinesis.clone(), LoadConfig::new(env.names.event_stream.clone())).with_subjects(Some(subjects));

    // What the tracker sends (clients/web): each event's own fields; the page's query is the tracker's to drop,
    // sent here to show the column drops it too. Hour 5 is the current one.
    // The test takes seconds and its hours are the wall clock's: it starts well inside an hour, so the
    // current hour stays the current one until it ends (and its events have arrived before now).
    let into = now_ms().rem_euclid(HOUR);
    if !(5_000..HOUR - 60_000).contains(&into) {
        tokio::time::sleep(Duration::from_millis((HOUR - into + 5_000).rem_euclid(HOUR) as u64)).await;
    }
    let current = now_ms().div_euclid(HOUR) * HOUR;
    let hour_of = |h: i64| current - (5 - h) * HOUR;
    let anonymous_pages = ["/", "/pricing", "/docs/start"];
    let mut sent = Vec::new();
    let mut anonymous: BTreeMap<(String, i64), i64> = BTreeMap::new();
    let mut identified: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for h in 0..6 {
        for (p, page) in anonymous_pages.iter().enumerate() {
            for _ in 0..(h + p as i64) % 4 + 1 {
                sent.push((
                    h,
                    json!({"type": "pageview", "path": format!("{page}?ref=x"), "referrer": "news.example",
                    "utm_source": "mail", "utm_campaign": "launch"}),
                ));
                *anonymous.entry((page.to_string(), h)).or_default() += 1;
            }
        }
        sent.push((h, json!({"type": "signup", "path": "/pricing", "props": {"plan": "team"}})));
        for visitor in ["visitor-1", "visitor-2"] {
            sent.push((h, json!({"type": "pageview", "path": "/account", "EntityId": visitor, "utm_source": "mail"})));
            *identified.entry(("/account".to_owned(), h)).or_default() += 1;
        }
    }
    // Hour 0's signup (anonymous) and visitor-1's first page view carry the W3C trace context of their page:
    // it names a trace, not a person, and is a column for both.
    let anonymous_trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let visitor_trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let first = |sent: &[(i64, Value)], pick: &dyn Fn(&Value) -> bool| sent.iter().position(|(_, e)| pick(e)).unwrap();
    let signup = first(&sent, &|e| e["type"] == "signup");
    let visitor = first(&sent, &|e| e["EntityId"] == "visitor-1");
    sent[signup].1["traceparent"] = json!(anonymous_trace);
    sent[visitor].1["traceparent"] = json!(visitor_trace);
    // Arrivals: each event's planned hour, in the order sent (on one shard, so they stand).
    let mut arrival_of = HashMap::new();
    for (i, (h, event)) in sent.iter_mut().enumerate() {
        let id = format!("click-{i}");
        event["EventId"] = json!(id);
        arrival_of.insert(id, if *h == 5 { current + i as i64 } else { hour_of(*h) + 60_000 + i as i64 * 1_000 });
    }
    for batch in sent.chunks(40) {
        let events: Vec<&Value> = batch.iter().map(|(_, e)| e).collect();
        assert_eq!(load.handle(post(&json!(events))).await.status(), StatusCode::ACCEPTED);
    }
    let mut records: Vec<(String, Vec<u8>, i64)> = env
        .read_stream(&env.names.event_stream)
        .await
        .into_iter()
        .map(|(_, record)| {
            let data = record.data().as_ref().to_vec();
            let id = serde_json::from_slice::<Value>(&data).unwrap()["event_id"].as_str().unwrap().to_owned();
            (record.partition_key().unwrap().to_owned(), data, arrival_of[&id])
        })
        .collect();
    assert_eq!(records.len(), sent.len());
    records.sort_by_key(|r| r.2);
    let pump = common::pump(&env);
    assert!(pump
        .handle(common::kinesis_event_on(common::TEST_ARN, "shardId-000000000003", &records))
        .await
        .batch_item_failures
        .is_empty());
    let scan = ScanConfig { segments: 1, watermark_lag_ms: 0, ..runs::scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(120))).await
    {
        pass.unwrap();
    }

    // A hot retention of three hours: hours 0 and 1 (and hour 2 up to now - 3 h) leave the table, the
    // later ones stay hot; every complete hour is copied.
    let archiver = Archiver {
        dynamo: env.dynamo.clone(),
        bucket: bucket.clone(),
        config: ArchiveConfig {
            hot_retention: Duration::from_secs(3 * 3_600),
            object_bytes: 16 * 1024,
            deadline_margin: Duration::from_secs(1),
            ..ArchiveConfig::for_names(env.names.event_table.clone(), BUCKET.into()).unwrap()
        },
    };
    let run = archiver.run(now_ms(), std::time::Instant::now() + Duration::from_secs(120)).await.unwrap();
    assert_eq!(run.copied_to, current, "every hour but the current one copied: {run:?}");
    assert!(run.boundary <= now_ms() - 3 * HOUR && run.boundary >= hour_of(2), "{run:?}");
    let hot = common::stored_events(&env).await;
    assert!(
        hot.iter().any(|e| e.slot >= hour_of(3) && e.slot < current),
        "the copied hours after the retention stay hot"
    );
    assert!(hot.iter().all(|e| e.slot >= run.boundary), "the earlier ones left the table");

    // DuckDB over the objects as S3 holds them (its S3 extension is fetched from a host these machines
    // cannot reach: the objects are read through the SDK into files, under their keys).
    let dir = std::env::temp_dir().join(format!("event-store-sql-{}", std::process::id()));
    let objects = s3.list_objects_v2().bucket(BUCKET).prefix("events/").send().await.unwrap();
    for object in objects.contents() {
        let key = object.key().unwrap();
        let path = dir.join(key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, bucket.get(key).await.unwrap()).unwrap();
    }
    let visitors: Vec<String> = records.iter().filter(|r| !r.0.starts_with("click-")).map(|r| r.0.clone()).collect();
    let script = r#"
import json, sys
import duckdb
duckdb.sql("SET TimeZone = 'UTC'")
events = f"read_parquet('{sys.argv[1]}/**/*.parquet', hive_partitioning = true, union_by_name = true)"
views = duckdb.sql(f"""
    SELECT page_path, hour(arrival) AS hour, count(*) AS n FROM {events}
    WHERE type = 'pageview' GROUP BY ALL ORDER BY ALL""").fetchall()
visitors = json.loads(sys.argv[2])
identified = duckdb.sql(f"""
    SELECT count(*), count(type), count(page_path), count(referrer_host), count(utm_source), count(bot)
    FROM {events} WHERE list_contains($visitors, partition_key)""", params={"visitors": visitors}).fetchall()[0]
partitions = duckdb.sql(f"SELECT DISTINCT hour FROM {events} WHERE hour(arrival) <> hour ORDER BY 1").fetchall()
traced = duckdb.sql(f"""
    SELECT traceparent, list_contains($visitors, partition_key) FROM {events}
    WHERE traceparent IS NOT NULL ORDER BY 1""", params={"visitors": visitors}).fetchall()
print(json.dumps({"views": views, "identified": identified, "misplaced": partitions, "traced": traced}))
"#;
    let python = common::repo_root().join(".venv/bin/python");
    let out = std::process::Command::new(&python)
        .arg("-c")
        .arg(script)
        .arg(dir.join("events"))
        .arg(serde_json::to_string(&visitors).unwrap())
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}: {}", python.display(), String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    let utc_hour = |h: i64| hour_of(h).div_euclid(HOUR) % 24;
    let mut expected: Vec<Value> =
        anonymous.iter().filter(|((_, h), _)| *h < 5).map(|((page, h), n)| json!([page, utc_hour(*h), n])).collect();
    expected.sort_by_key(|v| v.to_string());
    let mut counted: Vec<Value> = answer["views"].as_array().unwrap().clone();
    counted.sort_by_key(|v| v.to_string());
    assert_eq!(counted, expected, "the anonymous page views per page and hour, as sent, all but the current hour");
    let identified_rows = identified.iter().filter(|((_, h), _)| *h < 5).map(|(_, n)| n).sum::<i64>();
    assert_eq!(answer["identified"], json!([identified_rows, 0, 0, 0, 0, 0]), "their columns empty");
    assert_eq!(answer["misplaced"], json!([]), "each row under its own hour's partition");
    assert_eq!(
        answer["traced"],
        json!([[anonymous_trace, false], [visitor_trace, true]]),
        "each traced event's context in its column, the identified visitor's too"
    );
    let verified =
        event_store::archive::audit::verify(&env.dynamo, &env.names.event_table, &bucket, 0, now_ms()).await.unwrap();
    let copied = sent.iter().filter(|(h, _)| *h < 5).count() as u64;
    assert_eq!((verified.first_break, verified.events), (None, copied), "the chain holds every copied event");

    // The identified visitors' page views, per page and hour, from a `count` view: an aggregate
    // with no subject in it, kept from the log with the keys.
    let subscriptions = |invoker| {
        let keys = keys(&env, &kms, Duration::ZERO);
        let lambda = aws_sdk_lambda::Client::new(&env.sdk);
        Subscriptions::new(
            env.dynamo.clone(),
            env.kinesis.clone(),
            lambda,
            runs::subscription_config(&env.names),
            invoker,
        )
        .with_archive(Some(bucket.clone()))
        .with_keys(Some(keys))
    };
    let create = json!({"action": "create_projection", "name": "pages", "kind": "count", "by": "page",
        "start": format_ms(hour_of(0))});
    let (invoker, _rx) = LocalInvoker::channel();
    subscriptions(Arc::new(invoker)).handle(create, SystemTime::now() + Duration::from_secs(60)).await.unwrap();
    for answer in
        runs::run_subscriptions(subscriptions, json!({"source": "aws.events"}), deadline_in(Duration::from_secs(300)))
            .await
    {
        answer.unwrap();
    }
    let (invoker, _rx) = LocalInvoker::channel();
    let page = json!({"action": "view", "name": "pages", "prefix": "hour/", "limit": 1000});
    let view =
        subscriptions(Arc::new(invoker)).handle(page, SystemTime::now() + Duration::from_secs(60)).await.unwrap();
    let view = view.to_json().unwrap();
    let counts: BTreeMap<String, i64> = view["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| (item["key"].as_str().unwrap().to_owned(), item["count"].as_i64().unwrap()))
        .collect();
    for ((page, h), n) in &identified {
        let key = format!(
            "hour/{}/{page}",
            chrono::DateTime::from_timestamp_millis(hour_of(*h)).unwrap().format("%Y-%m-%dT%H")
        );
        assert_eq!(counts.get(&key), Some(n), "{key}: the identified visitors' views, counted by the view");
    }
}
