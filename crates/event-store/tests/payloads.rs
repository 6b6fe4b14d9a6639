//! Large payloads against a real emulator (moto: Kinesis, DynamoDB and its
//! streams, S3): posted events and entity event data over `INLINE_MAX_BYTES`
//! go to S3 once, under their content hash; the log carries references; every
//! reader puts the payload back, and a played record too large for Kinesis
//! names where the payload is.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::collections::{BTreeSet, VecDeque};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::{sample_event, TestEnv};
use event_store::archive::object::Bucket;
use event_store::bookkeeping::slot_index::read_index;
use event_store::config::{LoadConfig, RelayConfig, ScanConfig};
use event_store::entity::relay::Relay;
use event_store::entity::{Direction, EntityError, EntityStore, Expected, Invalid, NewEvent};
use event_store::load::Load;
use event_store::log::copies::RecentIds;
use event_store::log::reader::Reader;
use event_store::log::tiers::Tiers;
use event_store::log::{PlayedEvent, Window};
use event_store::offload::{OffloadRef, KEY_PREFIX, MAX_LARGE_EVENT_BYTES};
use event_store::playback::{Playback, Status};
use event_store::position::Checkpoint;
use event_store::subscription::Subscriptions;
use event_store::time::{format_ms, now_ms};
use event_store::trace::TraceContext;
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::lambda_target::LambdaTarget;
use event_store_emulator::runs::{self, deadline_in, run_scan};
use event_store_emulator::table_stream::{deliver_all, TableStreamReader};
use lambda_http::http::StatusCode;
use serde_json::{json, Value};

const BUCKET: &str = "event-store-payloads";
const INLINE: usize = 64 * 1024;

fn post(events: &Value) -> lambda_http::Request {
    let mut request: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
    request["body"] = json!(events.to_string());
    lambda_http::request::from_str(&request.to_string()).unwrap()
}

/// Every event of the log in `[start, end)` as readers get it, with `tiers`.
async fn log(env: &TestEnv, tiers: &Tiers, start: i64, end: i64) -> event_store::Result<Vec<Value>> {
    let table = env.names.event_table.as_str();
    // From the slot that holds `start` (a window's start need not be a slot's).
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
    let keep = |_: &event_store::event_item::EventItem, json: Option<Value>, _: &[u8]| {
        out.push(json.unwrap());
        ControlFlow::Continue(())
    };
    reader.each_event(slots, Checkpoint::at_slot(first_slot), &mut RecentIds::new(0), keep).await?;
    Ok(out)
}

/// The trace context a hit was posted with, and the one an entity append was made with.
const HIT_TRACE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const APPEND_TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn append_trace() -> TraceContext {
    TraceContext { traceparent: APPEND_TRACE.into(), tracestate: Some("congo=t61rcWkgMzE".into()) }
}

/// The `traceparent`s of these events' envelopes, where they have one, sorted (the hit's first).
fn traces<'a>(envelopes: impl Iterator<Item = &'a Value>) -> Vec<String> {
    let mut found: Vec<String> =
        envelopes.filter_map(|e| e["trace"]["traceparent"].as_str()).map(str::to_owned).collect();
    found.sort();
    found
}

async fn payload_keys(s3: &aws_sdk_s3::Client) -> BTreeSet<String> {
    let listed = s3.list_objects_v2().bucket(BUCKET).prefix(KEY_PREFIX).send().await.unwrap();
    listed.contents().iter().map(|o| o.key().unwrap().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn large_payloads_are_stored_once_in_s3_and_every_reader_puts_them_back() {
    let env = TestEnv::start(1).await;
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).build());
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let bucket = Bucket::new(&env.sdk, BUCKET.into());
    let window_start = now_ms() - 1;

    // Ingest: a small event, one of 300 KB (over the inline limit, under a Kinesis record), one of 2 MB.
    // The small one carries the W3C trace context of the page that sent it (its `traceparent` field).
    let config = LoadConfig {
        max_event_bytes: MAX_LARGE_EVENT_BYTES,
        archive_bucket: Some(BUCKET.into()),
        ..LoadConfig::new(env.names.event_stream.clone())
    };
    let load = Load::new(env.kinesis.clone(), config).with_archive(Some(bucket.clone()));
    let small = json!({"EntityId": "doc", "n": 1});
    let medium = json!({"EntityId": "doc", "n": 2, "pad": "m".repeat(300 * 1024)});
    let large = json!({"EntityId": "doc", "n": 3, "pad": "l".repeat(2 << 20)});
    let small_sent = json!({"EntityId": "doc", "n": 1, "traceparent": HIT_TRACE});
    let answer = load.handle(post(&json!([small_sent, medium, large]))).await;
    assert_eq!(answer.status(), StatusCode::ACCEPTED);
    let records = env.read_stream(&env.names.event_stream).await;
    let envelopes: Vec<Value> =
        records.iter().map(|(_, r)| serde_json::from_slice(r.data().as_ref()).unwrap()).collect();
    assert_eq!(envelopes[0]["body"], small, "the trace context taken out of the body");
    assert_eq!(envelopes[0]["trace"], json!({"traceparent": HIT_TRACE}), "into the envelope, once");
    for (envelope, body) in envelopes[1..].iter().zip([&medium, &large]) {
        let named: OffloadRef = serde_json::from_value(envelope["body_ref"].clone()).unwrap();
        assert!(envelope.get("body").is_none(), "the body is in S3, not on the stream");
        assert_eq!(named, OffloadRef::of(BUCKET, &serde_json::to_vec(body).unwrap()));
        let stored = s3.get_object().bucket(BUCKET).key(&named.key).send().await.unwrap();
        let stored: Value = serde_json::from_slice(&stored.body.collect().await.unwrap().into_bytes()).unwrap();
        assert_eq!(&stored, body);
    }
    let small_records = records.iter().all(|(_, r)| r.data().as_ref().len() < 2048);
    assert!(small_records, "every record on the stream is small");
    // The same content again is the same object; over 4 MiB is refused.
    assert_eq!(load.handle(post(&large)).await.status(), StatusCode::ACCEPTED);
    assert_eq!(payload_keys(&s3).await.len(), 2);
    let over = json!({"pad": "o".repeat(MAX_LARGE_EVENT_BYTES)});
    assert_eq!(load.handle(post(&over)).await.status(), StatusCode::PAYLOAD_TOO_LARGE);

    // Entity streams: data over the inline limit is stored in S3 on append and read back in place.
    let store =
        EntityStore::new(env.dynamo.clone(), env.names.entity_table.clone()).with_archive(Some(bucket.clone()), INLINE);
    let drafted = json!({"text": "d".repeat(512 * 1024)});
    let titled = NewEvent { trace: Some(append_trace()), ..NewEvent::new("Titled", json!({"title": "t"})) };
    let events = vec![NewEvent::new("Drafted", drafted.clone()), titled];
    store.append("doc-1", Expected::NoStream, events).await.unwrap();
    let page = store.read("doc-1", None, 10, Direction::Forward).await.unwrap();
    assert_eq!((page.events[0].data.clone(), page.events[0].data_ref.is_none()), (drafted.clone(), true));
    assert_eq!((&page.events[1].data, &page.events[1].trace), (&json!({"title": "t"}), &Some(append_trace())));
    assert_eq!(store.state("doc-1").await.unwrap().events[0].data, drafted);
    let items = env.scan_table(&env.names.entity_table).await;
    let item_bytes = |item: &std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue>| {
        item.values().map(|v| v.as_s().map_or(16, String::len)).sum::<usize>()
    };
    assert!(items.iter().all(|item| item_bytes(item) < 4096), "the batch item holds a reference, not the data");
    assert_eq!(payload_keys(&s3).await.len(), 3);
    // Without a bucket: 64 KiB is the limit, and offloaded data cannot be read.
    let inline_only = EntityStore::new(env.dynamo.clone(), env.names.entity_table.clone());
    let refused =
        inline_only.append("doc-2", Expected::NoStream, vec![NewEvent::new("Drafted", drafted.clone())]).await;
    assert!(matches!(refused, Err(EntityError::Invalid(Invalid::TooLarge(_)))), "{refused:?}");
    let unreadable = inline_only.read("doc-1", None, 10, Direction::Forward).await;
    assert!(
        matches!(&unreadable, Err(EntityError::Store(e)) if e.to_string().contains("ARCHIVE_BUCKET")),
        "{unreadable:?}"
    );

    // The relay puts the reference in the log, not the data.
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
    deliver_all(&mut table_stream, &mut VecDeque::new(), 10, 50, |event| relay.handle(event)).await.unwrap();
    let records = env.read_stream(&env.names.event_stream).await;
    let relayed: Vec<Value> = records
        .iter()
        .filter(|(_, r)| r.partition_key().unwrap().starts_with("streams/"))
        .map(|(_, r)| serde_json::from_slice(r.data().as_ref()).unwrap())
        .collect();
    assert_eq!(relayed.len(), 2);
    assert!(
        relayed[0]["body"]["data"].is_null() && relayed[0]["body"]["data_ref"]["key"].is_string(),
        "{:?}",
        relayed[0]["body"]
    );
    assert_eq!(relayed[1]["trace"], serde_json::to_value(append_trace()).unwrap(), "the append's trace, relayed");
    assert!(relayed[1]["body"].get("trace").is_none(), "once, in the envelope");
    assert!(records.iter().all(|(_, r)| r.data().as_ref().len() < 2048));

    // Into the log; every reader of it gets the events whole.
    let pump = common::pump(&env);
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let done = now_ms();
    // Past the window's last slot: the scan completes it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let scan = ScanConfig { segments: 1, watermark_lag_ms: 0, ..runs::scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(120))).await
    {
        pass.unwrap();
    }
    let tiers = Tiers::new(Some(bucket.clone()));
    let read = log(&env, &tiers, window_start, done).await.unwrap();
    let bodies: Vec<&Value> = read.iter().map(|e| &e["body"]).collect();
    assert_eq!(read.len(), 6, "three posted, the large one again, two entity events");
    for body in [&small, &medium, &large] {
        assert!(bodies.contains(&body), "{} read back whole", body["n"]);
    }
    assert!(read.iter().all(|e| e.get("body_ref").is_none()));
    let entity: Vec<&Value> = bodies.iter().copied().filter(|b| b.get("stream").is_some()).collect();
    assert_eq!((entity[0]["data"].clone(), entity[0].get("data_ref")), (drafted.clone(), None));
    // A reader with no bucket says what it lacks.
    let failed = log(&env, &Tiers::new(None), window_start, done).await.unwrap_err();
    assert!(failed.to_string().contains("ARCHIVE_BUCKET"), "{failed}");

    // Playback: what fits a Kinesis record is played whole; the 2 MB events are markers naming their payload.
    let (invoker, _rx) = LocalInvoker::channel();
    let playback =
        Playback::new(env.dynamo.clone(), env.kinesis.clone(), runs::playback_config(&env.names), Arc::new(invoker))
            .with_archive(Some(bucket.clone()));
    let window = json!({"start": format_ms(window_start), "end": format_ms(done)});
    let summary = playback.handle(window.clone(), SystemTime::now() + Duration::from_secs(300)).await.unwrap();
    assert_eq!((summary.status, summary.events, summary.oversized), (Status::Complete, 6, 2), "{summary:?}");
    let mut played = Vec::new();
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        for (_, data) in
            event_store::aggregation::deaggregate(record.partition_key().unwrap(), record.data().as_ref()).unwrap()
        {
            played.push(serde_json::from_slice::<PlayedEvent>(&data).unwrap());
        }
    }
    let large_at = OffloadRef::of(BUCKET, &serde_json::to_vec(&large).unwrap()).location();
    let markers: Vec<_> = played.iter().filter_map(|p| p.too_large.as_ref()).collect();
    assert_eq!(markers.len(), 2);
    assert!(
        markers.iter().all(|m| m.payload.as_deref() == Some(large_at.as_str()) && m.bytes > 2 << 20),
        "{markers:?}"
    );
    let whole: Vec<&Value> = played.iter().filter_map(|p| p.data.as_ref()).map(|d| &d["body"]).collect();
    assert!(whole.contains(&&medium) && whole.iter().any(|b| b["data"] == drafted), "played whole");
    assert_eq!(traces(played.iter().filter_map(|p| p.data.as_ref())), [HIT_TRACE, APPEND_TRACE], "played");

    // A subscription onto a Kinesis target, and one onto a Lambda function: the same, as delivered events.
    let consumer = LambdaTarget::start(&["consumer"]).await.unwrap();
    let subscriptions = |invoker| {
        let lambda = aws_sdk_lambda::Client::from_conf(
            aws_sdk_lambda::config::Builder::from(&env.sdk).endpoint_url(&consumer.endpoint).build(),
        );
        let config = runs::subscription_config(&env.names);
        Subscriptions::new(env.dynamo.clone(), env.kinesis.clone(), lambda, config, invoker)
            .with_archive(Some(bucket.clone()))
    };
    let (invoker, _rx) = LocalInvoker::channel();
    let target = json!({"kinesis": env.names.subscription_stream});
    let create = json!({"action": "create", "name": "big", "start": format_ms(window_start), "target": target});
    subscriptions(Arc::new(invoker)).handle(create, SystemTime::now() + Duration::from_secs(60)).await.unwrap();
    let (invoker, _rx) = LocalInvoker::channel();
    let create =
        json!({"action": "create", "name": "fn", "start": format_ms(window_start), "target": {"lambda": "consumer"}});
    subscriptions(Arc::new(invoker)).handle(create, SystemTime::now() + Duration::from_secs(60)).await.unwrap();
    let tick = json!({"source": "aws.events"});
    for answer in runs::run_subscriptions(subscriptions, tick, deadline_in(Duration::from_secs(300))).await {
        answer.unwrap();
    }
    let mut delivered = Vec::new();
    for (_, record) in env.read_stream(&env.names.subscription_stream).await {
        for (_, data) in
            event_store::aggregation::deaggregate(record.partition_key().unwrap(), record.data().as_ref()).unwrap()
        {
            delivered.push(serde_json::from_slice::<Value>(&data).unwrap());
        }
    }
    assert_eq!(delivered.len(), 6, "{delivered:?}");
    let markers: Vec<&Value> = delivered.iter().filter_map(|e| e.get("too_large")).collect();
    assert!(markers.len() == 2 && markers.iter().all(|m| m["payload"] == large_at.as_str()), "{markers:?}");
    assert!(delivered.iter().any(|e| e["data"]["body"] == medium), "delivered whole");
    assert_eq!(traces(delivered.iter().map(|e| &e["data"])), [HIT_TRACE, APPEND_TRACE], "delivered");
    let batch = consumer.taken();
    assert_eq!(batch.len(), 6, "{batch:?}");
    assert_eq!(traces(batch.iter().map(|e| &e["data"])), [HIT_TRACE, APPEND_TRACE], "in the Lambda target's batch");

    // A payload altered in S3 no longer matches its hash: that event is unreadable (counted, not played), the rest go on.
    let medium_key = OffloadRef::of(BUCKET, &serde_json::to_vec(&medium).unwrap()).key;
    s3.put_object().bucket(BUCKET).key(&medium_key).body(b"{\"n\":666}".to_vec().into()).send().await.unwrap();
    let read = log(&env, &Tiers::new(Some(bucket.clone())), window_start, done).await.unwrap();
    assert_eq!(read.len(), 5);
    assert!(read.iter().all(|e| e["body"]["n"] != 666 && e["body"] != medium));
    let (invoker, _rx) = LocalInvoker::channel();
    let again = json!({"start": format_ms(window_start), "end": format_ms(done), "id": "again"});
    let playback =
        Playback::new(env.dynamo.clone(), env.kinesis.clone(), runs::playback_config(&env.names), Arc::new(invoker))
            .with_archive(Some(bucket.clone()));
    let summary = playback.handle(again, SystemTime::now() + Duration::from_secs(300)).await.unwrap();
    assert_eq!((summary.status, summary.events, summary.unreadable), (Status::Complete, 5, 1), "{summary:?}");
    // And one removed: the same (S3 answers 404 to a reader that may list the bucket, as the template grants).
    s3.delete_object().bucket(BUCKET).key(&medium_key).send().await.unwrap();
    assert_eq!(log(&env, &Tiers::new(Some(bucket.clone())), window_start, done).await.unwrap().len(), 5);

    // Pages of large events end before what would not fit one answer (4 MiB put back); the state says to page.
    let chapter = |c: char| NewEvent::new("Chapter", json!({"text": c.to_string().repeat(3 << 20)}));
    store.append("book", Expected::NoStream, vec![chapter('a'), chapter('b')]).await.unwrap();
    let first = store.read("book", None, 10, Direction::Forward).await.unwrap();
    assert_eq!((first.events.len(), first.next), (1, Some(1)), "one 3 MiB event a page");
    let second = store.read("book", first.next, 10, Direction::Forward).await.unwrap();
    assert_eq!((second.events[0].data["text"].as_str().unwrap().len(), second.next), (3 << 20, None));
    let backward = store.read("book", None, 10, Direction::Backward).await.unwrap();
    assert_eq!((backward.events[0].version, backward.next), (1, Some(0)));
    let state = store.state("book").await;
    assert!(matches!(state, Err(EntityError::Invalid(Invalid::TooLarge(m))) if m.contains("pages")));
    // With INLINE_MAX_BYTES above 64 KiB an entity event still stays within its item: data of 100 KB goes to S3.
    let roomy = EntityStore::new(env.dynamo.clone(), env.names.entity_table.clone())
        .with_archive(Some(bucket.clone()), 200 * 1024);
    let hundred = json!({"text": "h".repeat(100 * 1024)});
    roomy.append("roomy", Expected::NoStream, vec![NewEvent::new("Big", hundred.clone())]).await.unwrap();
    assert_eq!(roomy.read("roomy", None, 1, Direction::Forward).await.unwrap().events[0].data, hundred);
    assert_eq!(payload_keys(&s3).await.len(), 5, "two chapters and the 100 KB event added (the medium one removed)");
}
