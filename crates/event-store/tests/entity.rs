//! Entity streams against a real emulator (moto_server: transactions and
//! DynamoDB Streams): the HTTP contract through the same handler Lambda runs,
//! optimistic concurrency under concurrent writers, long streams read in
//! pages, snapshots, and the relay into the time-ordered log with faults.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_sdk_dynamodb::types::{PutRequest, WriteRequest};
use aws_sdk_dynamodbstreams::types::OperationType;
use common::TestEnv;
use event_store::config::{PlaybackConfig, RelayConfig, ScanConfig};
use event_store::entity::http::StreamsApi;
use event_store::entity::model::{batch_key, prepare, Batch, Limits, Tip, TIP};
use event_store::entity::relay::Relay;
use event_store::entity::{Direction, EntityError, EntityStore, Expected, NewEvent, StreamMetadata};
use event_store::log::PlayedEvent;
use event_store::playback::{Playback, Status};
use event_store::time::{format_ms, now_ms};
use event_store_emulator::invoke::LocalInvoker;
use event_store_emulator::runs::{self, deadline_in, run_scan};
use event_store_emulator::table_stream::{deliver_all, TableStreamReader};
use event_store_fault_proxy::{Config as FaultConfig, Fault};
use lambda_http::aws_lambda_events::query_map::QueryMap;
use lambda_http::http::{header, StatusCode};
use lambda_http::{Body, RequestExt};
use serde_json::{json, Value};

fn store(env: &TestEnv) -> EntityStore {
    EntityStore::new(env.dynamo.clone(), env.names.entity_table.clone())
}

/// An HTTP request as API Gateway hands it to the function.
fn request(method: &str, target: &str, headers: &[(&str, &str)], body: Option<Value>) -> lambda_http::Request {
    let mut builder = lambda_http::http::Request::builder().method(method).uri(target);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let body = body.map_or(Body::Empty, |b| Body::Text(b.to_string()));
    let query: QueryMap = target.split_once('?').map_or("", |(_, q)| q).parse().unwrap_or_default();
    builder.body(body).unwrap().with_query_string_parameters(query)
}

struct Answer {
    status: StatusCode,
    etag: Option<String>,
    location: Option<String>,
    body: Value,
}

async fn call(api: &StreamsApi, req: lambda_http::Request) -> Answer {
    let response = api.handle(req).await;
    let text = |name: header::HeaderName| response.headers().get(name).map(|v| v.to_str().unwrap().to_owned());
    Answer {
        status: response.status(),
        etag: text(header::ETAG),
        location: text(header::LOCATION),
        body: serde_json::from_slice(response.body().as_ref()).unwrap_or(Value::Null),
    }
}

fn todo(kind: &str, title: &str) -> Value {
    json!({"type": kind, "data": {"title": title}})
}

#[tokio::test(flavor = "multi_thread")]
async fn the_todo_flow_counter_and_every_precondition_answer() {
    let env = TestEnv::start(1).await;
    let api = StreamsApi::new(store(&env));
    let todo_id = "todo-7f3a";
    let path = format!("/streams/{todo_id}");

    // The article's Todo flow, step by step.
    let created =
        call(&api, request("POST", &path, &[("if-none-match", "*")], Some(todo("TodoCreated", "milk")))).await;
    assert_eq!((created.status, created.etag.as_deref()), (StatusCode::CREATED, Some("\"0\"")));
    assert_eq!(created.location.as_deref(), Some("/streams/todo-7f3a?from=0"));
    assert_eq!(created.body["versions"], json!([0]));
    let again = call(&api, request("POST", &path, &[("if-none-match", "*")], Some(todo("TodoCreated", "milk")))).await;
    assert_eq!((again.status, again.body["current_version"].as_u64()), (StatusCode::CONFLICT, Some(0)));
    let updated =
        call(&api, request("POST", &path, &[("if-match", "\"0\"")], Some(todo("TodoUpdated", "oat milk")))).await;
    assert_eq!((updated.status, updated.etag.as_deref()), (StatusCode::CREATED, Some("\"1\"")));
    let stale = call(&api, request("POST", &path, &[("if-match", "\"0\"")], Some(todo("TodoUpdated", "soy")))).await;
    assert_eq!((stale.status, stale.etag.as_deref()), (StatusCode::CONFLICT, Some("\"1\"")));
    assert_eq!(stale.body["current_version"], json!(1));
    let unknown =
        call(&api, request("POST", "/streams/todo-nope", &[("if-match", "\"0\"")], Some(todo("TodoUpdated", "x"))))
            .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    let deleted = call(&api, request("DELETE", &path, &[("if-match", "\"1\"")], None)).await;
    assert_eq!((deleted.status, deleted.etag.as_deref()), (StatusCode::CREATED, Some("\"2\"")));
    let read = call(&api, request("GET", &path, &[], None)).await;
    assert_eq!((read.status, read.etag.as_deref()), (StatusCode::OK, Some("\"2\"")));
    let types: Vec<&str> =
        read.body["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["TodoCreated", "TodoUpdated", "StreamDeleted"]);
    let versions: Vec<u64> =
        read.body["events"].as_array().unwrap().iter().map(|e| e["version"].as_u64().unwrap()).collect();
    assert_eq!(versions, [0, 1, 2]);
    assert_eq!(read.body["events"][1]["data"], json!({"title": "oat milk"}));
    assert!(read.body["events"][0]["id"].as_str().unwrap().len() == 36 && read.body["events"][0]["time"].is_string());
    // After the delete: appends are gone (410), reads keep the history, a retried DELETE is the same 201.
    let gone = call(&api, request("POST", &path, &[("if-match", "\"2\"")], Some(todo("TodoUpdated", "x")))).await;
    assert_eq!(gone.status, StatusCode::GONE);
    assert_eq!(call(&api, request("POST", &path, &[], Some(todo("TodoUpdated", "x")))).await.status, StatusCode::GONE);
    let redelete = call(&api, request("DELETE", &path, &[("if-match", "\"1\"")], None)).await;
    assert_eq!((redelete.status, redelete.etag.as_deref()), (StatusCode::CREATED, Some("\"2\"")));
    let cached = call(&api, request("GET", &path, &[("if-none-match", "\"2\"")], None)).await;
    assert_eq!((cached.status, cached.etag.as_deref()), (StatusCode::NOT_MODIFIED, Some("\"2\"")));

    // The article's Counter: a fold over what the store gives back.
    let counter = store(&env);
    let steps = ["Increment", "Increment", "Increment", "Decrement"];
    for (i, step) in steps.iter().enumerate() {
        let expected = if i == 0 { Expected::NoStream } else { Expected::Version(i as u64 - 1) };
        counter.append("counter-1", expected, vec![NewEvent::new(*step, json!({}))]).await.unwrap();
    }
    let page = counter.read("counter-1", None, 100, Direction::Forward).await.unwrap();
    let value: i64 = page.events.iter().map(|e| if e.event_type == "Increment" { 1 } else { -1 }).sum();
    assert_eq!(value, 2);

    // Bad input: a short message, nothing written.
    let long = format!("/streams/{}", "a".repeat(257));
    let bad: Vec<(lambda_http::Request, StatusCode)> = vec![
        (request("POST", &long, &[], Some(todo("T", "x"))), StatusCode::BAD_REQUEST),
        (request("POST", "/streams/a%20b", &[], Some(todo("T", "x"))), StatusCode::BAD_REQUEST),
        (request("POST", "/streams/bad-1", &[], Some(json!(vec![todo("T", "x"); 101]))), StatusCode::PAYLOAD_TOO_LARGE),
        (
            request("POST", "/streams/bad-1", &[], Some(json!({"type": "T", "data": "x".repeat(70_000)}))),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (request("POST", "/streams/bad-1", &[("if-match", "\"one\"")], Some(todo("T", "x"))), StatusCode::BAD_REQUEST),
        (request("POST", "/streams/bad-1", &[], Some(json!({"data": 1}))), StatusCode::BAD_REQUEST),
        (request("DELETE", &path, &[], None), StatusCode::PRECONDITION_REQUIRED),
        (request("PUT", "/streams/bad-1/snapshot", &[], Some(json!({}))), StatusCode::PRECONDITION_REQUIRED),
        (request("GET", "/streams/bad-1?limit=0", &[], None), StatusCode::BAD_REQUEST),
        (request("GET", "/streams/bad-1?direction=sideways", &[], None), StatusCode::BAD_REQUEST),
        (request("PATCH", &path, &[], None), StatusCode::METHOD_NOT_ALLOWED),
    ];
    for (req, status) in bad {
        let target = req.uri().to_string();
        let answer = call(&api, req).await;
        assert_eq!(answer.status, status, "{target}: {}", answer.body);
        assert!(answer.body["error"].as_str().is_some_and(|m| !m.is_empty() && m.len() < 200), "{}", answer.body);
    }
    let malformed = lambda_http::http::Request::builder()
        .method("POST")
        .uri("/streams/bad-1")
        .body(Body::Text("{\"type\": ".into()))
        .unwrap();
    assert_eq!(call(&api, malformed).await.status, StatusCode::BAD_REQUEST);
    assert!(matches!(store(&env).read("bad-1", None, 10, Direction::Forward).await, Err(EntityError::NotFound)));

    // Schema versions (issue 48): an event says its data's schema version (1 when absent); the
    // HTTP API answers events as stored, a store given upcasters reads them as the current schema.
    let v1 = json!({"type": "TodoCreated", "data": {"text": "bread"}});
    let v2 = json!({"type": "TodoCreated", "data": {"title": "jam"}, "schema_version": 2});
    let made = call(&api, request("POST", "/streams/todo-schemas", &[], Some(json!([v1, v2])))).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let stored = call(&api, request("GET", "/streams/todo-schemas", &[], None)).await;
    let as_stored: Vec<(Value, Value)> = stored.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["data"].clone(), e["schema_version"].clone()))
        .collect();
    assert_eq!(as_stored, vec![(json!({"text": "bread"}), Value::Null), (json!({"title": "jam"}), json!(2))]);
    let zero = json!({"type": "TodoCreated", "data": {}, "schema_version": 0});
    assert_eq!(
        call(&api, request("POST", "/streams/todo-schemas", &[], Some(zero))).await.status,
        StatusCode::BAD_REQUEST
    );
    let upcasters = event_store::entity::upcast::Upcasters::new()
        .register("TodoCreated", 1, |data| Ok(json!({"title": data["text"]})));
    let upcasting = store(&env).with_upcasters(upcasters);
    let read = upcasting.read("todo-schemas", None, 10, Direction::Forward).await.unwrap();
    let current: Vec<(Value, Option<u32>)> = read.events.iter().map(|e| (e.data.clone(), e.schema_version)).collect();
    assert_eq!(current, vec![(json!({"title": "bread"}), Some(2)), (json!({"title": "jam"}), Some(2))]);
    let state = upcasting.state("todo-schemas").await.unwrap();
    assert_eq!(state.events[0].data, json!({"title": "bread"}), "state reads upcast too");
    // Written by a store that knows the type's current schema, a new event is at it: not upcast again.
    let tea = vec![NewEvent::new("TodoCreated", json!({"title": "tea"}))];
    upcasting.append("todo-schemas", Expected::Version(1), tea).await.unwrap();
    let raw = store(&env).read("todo-schemas", Some(2), 1, Direction::Forward).await.unwrap();
    assert_eq!((&raw.events[0].data, raw.events[0].schema_version), (&json!({"title": "tea"}), Some(2)));
    let read = upcasting.read("todo-schemas", Some(2), 1, Direction::Forward).await.unwrap();
    assert_eq!(read.events[0].data, json!({"title": "tea"}));

    // Listing (issue 48): 23 order streams (one deleted) beside the todo and the counter, in name
    // order within a prefix, paged, with versions, from the name index: no Scan, no event read.
    for i in (0..23).rev() {
        let events = (0..=i % 3).map(|_| NewEvent::new("Placed", json!({}))).collect();
        counter.append(&format!("order-{i:02}"), Expected::NoStream, events).await.unwrap();
    }
    counter.delete("order-05", 2).await.unwrap();
    let before = |operation: &str| env.counter.get(operation);
    let (scans, gets, queries) = (before("DynamoDB.Scan"), before("DynamoDB.BatchGetItem"), before("DynamoDB.Query"));
    let (mut listed, mut after, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let target = match &after {
            Some(after) => format!("/streams?prefix=order-&limit=10&after={after}"),
            None => "/streams?prefix=order-&limit=10".to_owned(),
        };
        let page = call(&api, request("GET", &target, &[], None)).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        pages += 1;
        listed.extend(page.body["streams"].as_array().unwrap().iter().cloned());
        match page.body["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3, "10, 10 and 3");
    let names: Vec<String> = (0..23).map(|i| format!("order-{i:02}")).collect();
    assert_eq!(listed.iter().map(|s| s["name"].as_str().unwrap().to_owned()).collect::<Vec<_>>(), names);
    for (i, stream) in listed.iter().enumerate() {
        let (version, deleted) = if i == 5 { (3, true) } else { (i as u64 % 3, false) };
        assert_eq!(
            (stream["version"].as_u64(), stream["deleted"].as_bool()),
            (Some(version), Some(deleted)),
            "{stream}"
        );
    }
    assert_eq!(env.counter.get("DynamoDB.Scan"), scans, "no scan");
    assert_eq!(env.counter.get("DynamoDB.BatchGetItem") - gets, 3, "one read of the tips per page");
    assert_eq!(env.counter.get("DynamoDB.Query") - queries, 3 * 16, "a query per shard of the name index per page");
    let everything = store(&env).list_streams("", None, 100).await.unwrap();
    let all: Vec<&str> = everything.streams.iter().map(|s| s.name.as_str()).collect();
    let ends = (all.len(), all[0], all[23], all[24], all[25], everything.next);
    assert_eq!(ends, (26, "counter-1", "order-22", "todo-7f3a", "todo-schemas", None));
    let after_all = store(&env).list_streams("order-", Some("order-22"), 5).await.unwrap();
    assert_eq!((after_all.streams.len(), after_all.next), (0, None));
    let bad_limit = call(&api, request("GET", "/streams?limit=101", &[], None)).await;
    assert_eq!(bad_limit.status, StatusCode::BAD_REQUEST, "{}", bad_limit.body);
    let long = format!("/streams?prefix={}", "a".repeat(1100));
    let long_prefix = call(&api, request("GET", &long, &[], None)).await;
    assert_eq!(long_prefix.status, StatusCode::BAD_REQUEST, "not a name, not a retry: {}", long_prefix.body);

    // A transaction is authorized by the actions of its parts (UpdateItem, PutItem, ConditionCheckItem).
    let declared: Vec<&str> =
        event_store::entity::AWS_ACTIONS.iter().copied().chain(["dynamodb:TransactWriteItems"]).collect();
    common::assert_only_declared_actions(&env.counter, &declared);
    common::assert_allowed_by_the_template(&env.counter, "StreamsFunction");
}

#[tokio::test(flavor = "multi_thread")]
async fn appends_are_atomic_idempotent_and_cost_one_request() {
    let env = TestEnv::start(1).await;
    let store = store(&env);
    let with_ids = |n: usize, kind: &str| -> Vec<NewEvent> {
        (0..n).map(|i| NewEvent { id: Some(uuid::Uuid::new_v4()), ..NewEvent::new(kind, json!({"i": i})) }).collect()
    };
    env.counter.reset();
    let first = store.append("order-1", Expected::NoStream, with_ids(1, "Placed")).await.unwrap();
    assert_eq!((first.first, first.last, first.replayed), (0, 0, false));
    assert_eq!(env.counter.service_total("DynamoDB"), 1, "one event appended with one request");

    // 100 events in one request: one item, all versions, visible together.
    let batch = with_ids(100, "Line");
    let done = store.append("order-1", Expected::Version(0), batch.clone()).await.unwrap();
    assert_eq!((done.first, done.last), (1, 100));
    // The same request again (a client retry after a lost answer): the original answer, nothing written.
    env.counter.reset();
    let replay = store.append("order-1", Expected::Version(0), batch.clone()).await.unwrap();
    assert_eq!((replay.first, replay.last, replay.replayed), (1, 100, true));
    assert_eq!(env.counter.get("DynamoDB.TransactWriteItems"), 1, "the retry's write was refused, not repeated");
    // Without a precondition, a retry right after is recognized too.
    let loose = with_ids(2, "Note");
    let a = store.append("order-1", Expected::Any, loose.clone()).await.unwrap();
    let b = store.append("order-1", Expected::Any, loose).await.unwrap();
    assert_eq!((a.first, a.last, b.first, b.last, b.replayed), (101, 102, 101, 102, true));
    // A retry after another writer appended (the first answer lost, then someone else's
    // append, then the retry): still the original answer, nothing written (issue 26, item 4).
    let lost = with_ids(2, "Note");
    let original = store.append("order-1", Expected::Any, lost.clone()).await.unwrap();
    store.append("order-1", Expected::Any, with_ids(1, "Other")).await.unwrap();
    let retry = store.append("order-1", Expected::Any, lost.clone()).await.unwrap();
    assert_eq!((retry.first, retry.last, retry.replayed), (original.first, original.last, true));
    let pinned = store.append("order-1", Expected::Version(105), lost).await.unwrap();
    assert_eq!((pinned.first, pinned.replayed), (103, true), "with a precondition too");
    // Other events under the stale version conflict, they do not replay.
    let other = store.append("order-1", Expected::Version(0), with_ids(100, "Line")).await;
    assert!(matches!(other, Err(EntityError::Conflict { current: 105 })), "{other:?}");

    let page = store.read("order-1", None, 1000, Direction::Forward).await.unwrap();
    assert_eq!(page.events.len(), 106);
    assert_eq!(page.events.iter().map(|e| e.version).collect::<Vec<_>>(), (0..106).collect::<Vec<_>>());
    let ids: HashSet<&str> = page.events.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), 106, "no event stored twice");
    let items = env.scan_table(&env.names.entity_table).await;
    let kinds: Vec<&str> = items.iter().map(|i| i["item"].as_s().unwrap().as_str()).collect();
    let count = |prefix: &str| kinds.iter().filter(|k| k.starts_with(prefix)).count();
    assert_eq!(
        (count("tip"), count("e0"), count("_req#"), count("_relay")),
        (1, 5, 5, 1),
        "the tip, a batch and a request record per append applied, the relay position from the first"
    );
    // A new stream's name leaves room for `streams/` in a Kinesis partition key.
    let long = store.append(&"n".repeat(249), Expected::NoStream, with_ids(1, "A")).await;
    assert!(matches!(long, Err(EntityError::Invalid(_))), "{long:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn eight_concurrent_writers_lose_no_update() {
    let env = TestEnv::start(1).await;
    // moto applies concurrent transactions without a lock; DynamoDB serializes writes to an item.
    let serial =
        event_store_fault_proxy::FaultProxy::start_one_at_a_time(env.sdk.endpoint_url().unwrap()).await.unwrap();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk).endpoint_url(&serial.endpoint).build(),
    );
    let api = Arc::new(StreamsApi::new(EntityStore::new(dynamo, env.names.entity_table.clone())));
    let path = "/streams/hot-counter";
    assert_eq!(
        call(&api, request("POST", path, &[("if-none-match", "*")], Some(json!({"type": "Opened", "data": {}}))))
            .await
            .status,
        StatusCode::CREATED
    );
    let started = std::time::Instant::now();
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let api = api.clone();
            tokio::spawn(async move {
                let (mut conflicts, mut other) = (0, Vec::new());
                for n in 0..20 {
                    loop {
                        // The current version: the ETag of the cheapest read (the last event).
                        let latest = "/streams/hot-counter?direction=backward&limit=1";
                        let etag = call(&api, request("GET", latest, &[], None)).await.etag.unwrap();
                        let event = json!({"type": "Added", "data": {"writer": w, "n": n}, "id": uuid::Uuid::new_v4()});
                        let answer = call(&api, request("POST", path, &[("if-match", &etag)], Some(event))).await;
                        match answer.status {
                            StatusCode::CREATED => break,
                            StatusCode::CONFLICT => conflicts += 1,
                            status => other.push(format!("{status}: {}", answer.body)),
                        }
                    }
                }
                (conflicts, other)
            })
        })
        .collect();
    let mut conflicts = 0;
    for writer in writers {
        let (c, other) = writer.await.unwrap();
        assert!(other.is_empty(), "every refusal is a 409: {other:?}");
        conflicts += c;
    }
    let elapsed = started.elapsed();
    let page = store(&env).read("hot-counter", None, 1000, Direction::Forward).await.unwrap();
    assert_eq!(page.version, 160);
    assert_eq!(page.events.iter().map(|e| e.version).collect::<Vec<_>>(), (0..=160).collect::<Vec<_>>(), "no gaps");
    let mut per_writer: HashMap<u64, Vec<u64>> = HashMap::new();
    for event in &page.events[1..] {
        per_writer.entry(event.data["writer"].as_u64().unwrap()).or_default().push(event.data["n"].as_u64().unwrap());
    }
    for (writer, ns) in &per_writer {
        assert_eq!(ns, &(0..20).collect::<Vec<_>>(), "writer {writer}: every append once, in its order");
    }
    println!(
        "one hot stream, 8 writers: 160 appends, {conflicts} conflicts (409), {:.0} appends/s",
        160.0 / elapsed.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_of_100000_events_reads_back_forward_and_backward_in_pages() {
    let env = TestEnv::start(1).await;
    let store = store(&env);
    // 99,000 events as the appends would have stored them (990 batch items of 100 and the tip),
    // written with BatchWriteItem: moto copies the whole table for every transaction, so 1,000
    // appends take minutes there. The last 1,000 events are real appends on top.
    let at = now_ms();
    let mut items: Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> = (0..990u64)
        .map(|b| {
            let events = (0..100).map(|i| NewEvent::new("Tick", json!({"n": b * 100 + i}))).collect();
            let batch = Batch {
                stream: "long-1".into(),
                item: batch_key(b * 100),
                first: b * 100,
                at,
                events: prepare(events, Limits::INLINE).unwrap(),
            };
            serde_dynamo::to_item(&batch).unwrap()
        })
        .collect();
    let tip = Tip {
        stream: "long-1".into(),
        item: TIP.into(),
        version: 98_999,
        deleted: false,
        last_request: None,
        last_first: None,
        updated_at: at,
        meta_version: None,
        retention: None,
        trimmed: None,
    };
    items.push(serde_dynamo::to_item(&tip).unwrap());
    for chunk in items.chunks(25) {
        let writes = chunk
            .iter()
            .map(|item| {
                WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(item.clone())).build().unwrap())
                    .build()
            })
            .collect();
        let out = env.dynamo.batch_write_item().request_items(&env.names.entity_table, writes).send().await.unwrap();
        assert!(out.unprocessed_items().is_none_or(|u| u.is_empty()));
    }
    let started = std::time::Instant::now();
    for append in 990..1000u64 {
        let events = (0..100).map(|i| NewEvent::new("Tick", json!({"n": append * 100 + i}))).collect();
        store.append("long-1", Expected::Version(append * 100 - 1), events).await.unwrap();
    }
    println!("the last 1,000 events appended in 10 requests: {:.1} s", started.elapsed().as_secs_f64());
    for (direction, limit) in [(Direction::Forward, 1000), (Direction::Backward, 700)] {
        let started = std::time::Instant::now();
        let (mut from, mut seen, mut pages) = (None, Vec::with_capacity(100_000), 0);
        loop {
            let page = store.read("long-1", from, limit, direction).await.unwrap();
            assert_eq!(page.version, 99_999);
            assert!(page.events.len() <= limit);
            seen.extend(page.events.iter().map(|e| e.data["n"].as_u64().unwrap()));
            pages += 1;
            match page.next {
                Some(next) => from = Some(next),
                None => break,
            }
        }
        let expected: Vec<u64> = match direction {
            Direction::Forward => (0..100_000).collect(),
            Direction::Backward => (0..100_000).rev().collect(),
        };
        assert!(seen == expected, "{direction:?}: {} events, in order", seen.len());
        println!("{direction:?}: 100,000 events in {pages} pages, {:.1} s", started.elapsed().as_secs_f64());
    }
    // From the middle of a batch, both ways.
    let middle = store.read("long-1", Some(150), 7, Direction::Forward).await.unwrap();
    assert_eq!(middle.events.iter().map(|e| e.version).collect::<Vec<_>>(), (150..157).collect::<Vec<_>>());
    assert_eq!(middle.next, Some(157));
    let back = store.read("long-1", Some(150), 3, Direction::Backward).await.unwrap();
    assert_eq!(back.events.iter().map(|e| e.version).collect::<Vec<_>>(), vec![150, 149, 148]);
    let past_end = store.read("long-1", Some(100_000), 10, Direction::Forward).await.unwrap();
    assert!(past_end.events.is_empty() && past_end.next.is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_snapshot_loads_in_one_request_and_never_moves_back() {
    let env = TestEnv::start(1).await;
    let store = store(&env);
    let api = StreamsApi::new(store.clone());
    for v in 0..50u64 {
        let expected = if v == 0 { Expected::NoStream } else { Expected::Version(v - 1) };
        store.append("cart-9", expected, vec![NewEvent::new("Added", json!({"sku": v}))]).await.unwrap();
    }
    // No snapshot: everything, folded from the start (more than one page).
    let cold = store.state("cart-9").await.unwrap();
    assert_eq!((cold.version, cold.events.len(), cold.snapshot.is_none()), (49, 50, true));
    assert!(cold.requests > 1);

    let put =
        |version: &str, state: Value| request("PUT", "/streams/cart-9/snapshot", &[("if-match", version)], Some(state));
    assert_eq!(call(&api, put("\"45\"", json!({"items": 46}))).await.status, StatusCode::OK);
    for v in 50..53u64 {
        store
            .append("cart-9", Expected::Version(v - 1), vec![NewEvent::new("Added", json!({"sku": v}))])
            .await
            .unwrap();
    }
    env.counter.reset();
    let warm = store.state("cart-9").await.unwrap();
    assert_eq!(warm.requests, 1);
    assert_eq!(env.counter.service_total("DynamoDB"), 1, "loading with a fresh snapshot is one request");
    assert_eq!(warm.snapshot.as_ref().map(|s| (s.version, s.state.clone())), Some((45, json!({"items": 46}))));
    assert_eq!(warm.events.iter().map(|e| e.version).collect::<Vec<_>>(), (46..53).collect::<Vec<_>>());

    let state = call(&api, request("GET", "/streams/cart-9/state", &[], None)).await;
    assert_eq!((state.status, state.etag.as_deref()), (StatusCode::OK, Some("\"52\"")));
    assert_eq!(state.body["snapshot"]["version"], json!(45));
    assert_eq!(state.body["events"].as_array().unwrap().len(), 7);
    // Older than the stored one, or beyond the stream: refused. The same version again: fine.
    assert_eq!(call(&api, put("\"40\"", json!({}))).await.status, StatusCode::CONFLICT);
    assert_eq!(call(&api, put("\"99\"", json!({}))).await.status, StatusCode::CONFLICT);
    assert_eq!(call(&api, put("\"45\"", json!({"items": 46}))).await.status, StatusCode::OK);
    let unknown = request("PUT", "/streams/nobody/snapshot", &[("if-match", "\"0\"")], Some(json!({})));
    assert_eq!(call(&api, unknown).await.status, StatusCode::NOT_FOUND);
    assert_eq!(call(&api, request("GET", "/streams/nobody/state", &[], None)).await.status, StatusCode::NOT_FOUND);
}

/// Entity events through the whole log: relay (its Kinesis requests through a
/// fault proxy that also applies requests and then answers 500), pump, scan,
/// playback. Each (stream, version) is played once, each stream in version order.
#[tokio::test(flavor = "multi_thread")]
async fn relayed_entity_events_play_back_once_in_version_order_despite_faults() {
    let env = TestEnv::start(2).await;
    let store = store(&env);
    let window_start = now_ms() - 1;
    let mut expected: HashMap<String, u64> = HashMap::new();
    for round in 0..12u64 {
        for s in 0..5 {
            let name = format!("account-{s}");
            let size = 1 + (round + s) % 3;
            let events = (0..size).map(|i| NewEvent::new("Moved", json!({"round": round, "i": i}))).collect();
            let at = expected.get(&name).copied();
            let expectation = at.map_or(Expected::NoStream, |v| Expected::Version(v - 1));
            let done = store.append(&name, expectation, events).await.unwrap();
            expected.insert(name, done.last + 1);
        }
    }
    let faults = FaultConfig {
        rate: 0.3,
        seed: 11,
        only: Some(&[Fault::AppliedThenInternalError, Fault::PartialPutRecords, Fault::ProvisionedThroughputExceeded]),
    };
    let (kinesis, proxy) = common::through_faults(&env, faults).await;
    let relay = relay(&env, kinesis);
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    let mut pending = VecDeque::new();
    // Small batches: more requests, more faults.
    let relayed = deliver_all(&mut reader, &mut pending, 10, 50, |event| relay.handle(event)).await.unwrap();
    assert!(relayed >= 60, "every append's stream record was relayed: {relayed}");
    assert!(
        !proxy.applied_then_failed().is_empty(),
        "a relay batch was retried after it was applied: {:?}",
        proxy.counts()
    );
    let on_stream = env.read_stream(&env.names.event_stream).await.len() as u64;
    let total: u64 = expected.values().sum();
    assert!(on_stream > total, "copies reached the event stream ({on_stream} records for {total} events)");

    let played = played_versions(&env, window_start, event_store::config::DEFAULT_DEDUPE_WINDOW_MS, total).await;
    for (name, count) in &expected {
        assert_eq!(played.get(name), Some(&(0..*count).collect::<Vec<_>>()), "{name}: each version once, in order");
    }
}

/// The log as readers see it: the event stream pumped, scanned and played
/// back from `window_start` (playback dropping copies within
/// `dedupe_window_ms`); each entity stream's versions in the order played.
async fn played_versions(
    env: &TestEnv,
    window_start: i64,
    dedupe_window_ms: u64,
    events: u64,
) -> HashMap<String, Vec<u64>> {
    let pump = common::pump(env);
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
    let done = now_ms();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let scan = ScanConfig { segments: 2, watermark_lag_ms: 0, ..runs::scan_config(&env.names) };
    for result in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(900))).await
    {
        result.unwrap();
    }
    let (invoker, _rx) = LocalInvoker::channel();
    let config = PlaybackConfig { dedupe_window_ms, ..runs::playback_config(&env.names) };
    let playback = Playback::new(env.dynamo.clone(), env.kinesis.clone(), config, Arc::new(invoker));
    let window = json!({"start": format_ms(window_start), "end": format_ms(done)});
    let summary = playback.handle(window, SystemTime::now() + Duration::from_secs(900)).await.unwrap();
    assert_eq!(summary.status, Status::Complete, "{summary:?}");

    let mut played: HashMap<String, Vec<u64>> = HashMap::new();
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        let key = record.partition_key().unwrap();
        for (_, data) in event_store::aggregation::deaggregate(key, record.data().as_ref()).unwrap() {
            let event: PlayedEvent = serde_json::from_slice(&data).unwrap();
            let body = &event.data.as_ref().unwrap()["body"];
            let stream = body["stream"].as_str().unwrap();
            assert_eq!(event.partition_key, log_key(stream), "keyed by the entity stream");
            played.entry(stream.to_owned()).or_default().push(body["version"].as_u64().unwrap());
        }
    }
    assert_eq!(summary.events as u64, events, "{summary:?}: {played:?}");
    played
}

fn log_key(stream: &str) -> String {
    event_store::envelope::entity_key(stream)
}

/// The relay as its Lambda runs it, its puts through `kinesis`.
fn relay(env: &TestEnv, kinesis: aws_sdk_kinesis::Client) -> Relay {
    let config = RelayConfig {
        event_stream: env.names.event_stream.clone(),
        entity_table: env.names.entity_table.clone(),
        dead_letter_queue: None,
        hold_after: Duration::from_secs(300),
    };
    Relay::new(kinesis, env.dynamo.clone(), aws_sdk_sqs::Client::new(&env.sdk), config)
}

/// One stream's key refused by Kinesis (a hot shard) for far longer than the
/// readers' dedupe window while the other stream's records are stored: the
/// relay batch is delivered again and again, and readers still see each
/// version of both streams once, in order (issue 26, item 1).
#[tokio::test(flavor = "multi_thread")]
async fn a_key_refused_longer_than_the_dedupe_window_leaves_no_copy_in_the_log() {
    let env = TestEnv::start(2).await;
    let store = store(&env);
    let window_start = now_ms() - 1;
    let (held, free) = ("held-a", "free-b");
    for version in 0..12u64 {
        for name in [held, free] {
            let expected = if version == 0 { Expected::NoStream } else { Expected::Version(version - 1) };
            store.append(name, expected, vec![NewEvent::new("Counted", json!({"n": version}))]).await.unwrap();
        }
    }
    let (kinesis, proxy) = common::through_faults(&env, FaultConfig { seed: 1, rate: 0.0, only: Some(&[]) }).await;
    proxy.refuse_partition_key(&log_key(held));
    let relay = relay(&env, kinesis);
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    let mut pending = VecDeque::new();
    // Readers below remember 300 ms of envelope ids; the key stays refused for
    // several deliveries of the batch, each seconds apart.
    let dedupe_window_ms = 300;
    let mut deliveries = 0;
    while deliveries < 3 {
        let result = deliver_all(&mut reader, &mut pending, 100, 0, |event| relay.handle(event)).await;
        assert!(result.is_err(), "the refused key's records are not relayed");
        deliveries += 1;
        tokio::time::sleep(Duration::from_millis(2 * dedupe_window_ms)).await;
    }
    assert!(proxy.counts().get("RefusedKey").copied().unwrap_or(0) >= 3, "{:?}", proxy.counts());
    proxy.accept_partition_key(&log_key(held));
    deliver_all(&mut reader, &mut pending, 100, 20, |event| relay.handle(event)).await.unwrap();

    let played = played_versions(&env, window_start, dedupe_window_ms, 24).await;
    for name in [held, free] {
        println!("{name} as playback delivered it, after {deliveries} deliveries of the batch: {:?}", played.get(name));
        assert_eq!(played.get(name), Some(&(0..12).collect::<Vec<_>>()), "{name}: each version once, in order");
    }
}

/// The entity events on the event stream, per stream, in stream order: what the pump will read.
async fn on_event_stream(env: &TestEnv) -> HashMap<String, Vec<u64>> {
    let mut versions: HashMap<String, Vec<u64>> = HashMap::new();
    for (_, record) in env.read_stream(&env.names.event_stream).await {
        let envelope: Value = serde_json::from_slice(record.data().as_ref()).unwrap();
        let body = &envelope["body"];
        versions
            .entry(body["stream"].as_str().unwrap().to_owned())
            .or_default()
            .push(body["version"].as_u64().unwrap());
    }
    versions
}

fn one_event(version: u64) -> Vec<NewEvent> {
    vec![NewEvent::new("Counted", json!({"n": version}))]
}

/// DynamoDB Streams orders changes per item, and every append is a new item:
/// the stream records of one entity stream may come in any order (other
/// shards). Whatever order they are delivered in, the event stream gets the
/// versions in order, each once (issue 26, item 3).
#[tokio::test(flavor = "multi_thread")]
async fn stream_records_delivered_out_of_order_still_relay_in_version_order() {
    let env = TestEnv::start(1).await;
    let store = store(&env);
    for version in 0..4u64 {
        let expected = if version == 0 { Expected::NoStream } else { Expected::Version(version - 1) };
        store.append("order-9", expected, one_event(version)).await.unwrap();
    }
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    let records = reader.poll().await.unwrap();
    let batches: Vec<_> = records.iter().filter(|r| r.event_name() == Some(&OperationType::Insert)).collect();
    let batch_records: Vec<aws_sdk_dynamodbstreams::types::Record> = batches
        .into_iter()
        .filter(|r| {
            r.dynamodb()
                .and_then(|d| d.keys())
                .and_then(|k| k.get("item"))
                .and_then(|v| v.as_s().ok())
                .is_some_and(|k| k.starts_with('e'))
        })
        .cloned()
        .collect();
    assert_eq!(batch_records.len(), 4);
    let relay = relay(&env, env.kinesis.clone());
    // v2 first (from "another shard"), then v3 and v0 together, then v1.
    for order in [vec![2], vec![3, 0], vec![1]] {
        let delivery: Vec<_> = order.iter().map(|&i| batch_records[i].clone()).collect();
        let response = relay.handle(reader.lambda_event(&delivery)).await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
    }
    assert_eq!(on_event_stream(&env).await.remove("order-9"), Some(vec![0, 1, 2, 3]));

    // A stream relayed before positions existed (no `_relay` item): its history is on the
    // event stream already, so the relay starts at what is delivered, not at version 0.
    for version in 0..3u64 {
        let expected = if version == 0 { Expected::NoStream } else { Expected::Version(version - 1) };
        store.append("legacy-1", expected, one_event(version)).await.unwrap();
    }
    // Read before the position goes (the local reader takes an insert whose item is gone for a phantom).
    let records = reader.poll().await.unwrap();
    let position = HashMap::from([
        ("stream".to_owned(), aws_sdk_dynamodb::types::AttributeValue::S("legacy-1".into())),
        (
            "item".to_owned(),
            aws_sdk_dynamodb::types::AttributeValue::S(event_store::bookkeeping::entity_positions::RELAY_ITEM.into()),
        ),
    ]);
    env.dynamo.delete_item().table_name(&env.names.entity_table).set_key(Some(position)).send().await.unwrap();
    let key_of = |r: &aws_sdk_dynamodbstreams::types::Record, name: &str| {
        r.dynamodb().and_then(|d| d.keys()).and_then(|k| k.get(name)).and_then(|v| v.as_s().ok()).cloned()
    };
    let last = records
        .iter()
        .find(|r| key_of(r, "stream").as_deref() == Some("legacy-1") && key_of(r, "item") == Some(batch_key(2)))
        .cloned()
        .unwrap();
    assert!(relay.handle(reader.lambda_event(&[last])).await.batch_item_failures.is_empty());
    assert_eq!(on_event_stream(&env).await.remove("legacy-1"), Some(vec![2]), "not its whole history again");
}

/// A stream whose puts keep failing is held after the hold limit, without
/// holding up the others; its later appends are not relayed before the
/// held ones, and a re-drive of the dead-letter queue relays them all from the
/// table, in order: no hole, no inversion, no copy (issue 26, item 2).
#[tokio::test(flavor = "multi_thread")]
async fn a_stream_that_cannot_be_relayed_is_held_then_redriven_in_order_from_the_table() {
    let env = TestEnv::start(2).await;
    let store = store(&env);
    let window_start = now_ms() - 1;
    let (held, free) = ("held-c", "free-d");
    let append_round = |from: u64, to: u64| {
        let store = store.clone();
        async move {
            for version in from..to {
                for name in [held, free] {
                    let expected = if version == 0 { Expected::NoStream } else { Expected::Version(version - 1) };
                    store.append(name, expected, one_event(version)).await.unwrap();
                }
            }
        }
    };
    append_round(0, 3).await;
    let sqs = aws_sdk_sqs::Client::new(&env.sdk);
    let queue = sqs.create_queue().queue_name("relay-dlq").send().await.unwrap().queue_url.unwrap();
    let (kinesis, proxy) = common::through_faults(&env, FaultConfig { seed: 1, rate: 0.0, only: Some(&[]) }).await;
    proxy.refuse_partition_key(&log_key(held));
    let config = RelayConfig {
        event_stream: env.names.event_stream.clone(),
        entity_table: env.names.entity_table.clone(),
        dead_letter_queue: Some(queue.clone()),
        hold_after: Duration::ZERO,
    };
    let relay = Relay::new(kinesis, env.dynamo.clone(), sqs.clone(), config);
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    let mut pending = VecDeque::new();
    // Held at once (a zero hold limit): the delivery succeeds and the other stream moves on.
    deliver_all(&mut reader, &mut pending, 100, 0, |event| relay.handle(event)).await.unwrap();
    // Later appends of both: the held stream's are left for the re-drive, even once Kinesis takes them.
    append_round(3, 6).await;
    proxy.accept_partition_key(&log_key(held));
    deliver_all(&mut reader, &mut pending, 100, 0, |event| relay.handle(event)).await.unwrap();
    let stream = on_event_stream(&env).await;
    assert_eq!(stream.get(free), Some(&(0..6).collect::<Vec<_>>()), "the other stream was never held up");
    assert_eq!(stream.get(held), None, "nothing of the held stream, not even its later versions");
    let position =
        event_store::bookkeeping::entity_positions::Positions::new(env.dynamo.clone(), env.names.entity_table.clone());
    let at = position.relay_position(held).await.unwrap();
    assert!(at.held() && at.relayed.is_none(), "{at:?}");

    // The alarm's queue names the stream; its re-drive relays v0..v5 from the table.
    let relay = &relay;
    let drain = || async {
        event_store::queue::drain_with(&sqs, &queue, |body| async move {
            relay.rerelay_message(&body).await.map(|done| done.versions)
        })
        .await
        .unwrap()
    };
    let drained = drain().await;
    assert_eq!((drained.messages, drained.records, drained.left), (1, 6, 0));
    assert!(!position.relay_position(held).await.unwrap().held());
    // A stream whose records the event source gave up on (never delivered here): its
    // failure record names shards, not streams, and its re-drive relays every stream
    // behind its tip, this one only.
    let lost = "lost-e";
    for version in 0..3u64 {
        let expected = if version == 0 { Expected::NoStream } else { Expected::Version(version - 1) };
        store.append(lost, expected, one_event(version)).await.unwrap();
    }
    let gave_up = json!({"requestContext": {"condition": "RecordAgeExceeded"},
                         "DDBStreamBatchInfo": {"shardId": "shardId-1", "startSequenceNumber": "1", "endSequenceNumber": "2"}});
    sqs.send_message().queue_url(&queue).message_body(gave_up.to_string()).send().await.unwrap();
    let drained = drain().await;
    assert_eq!((drained.messages, drained.records, drained.left), (1, 3, 0), "only the lost stream was behind");
    // Appends after the re-drive are relayed as usual; the lost stream's records, delivered late, are skipped.
    append_round(6, 7).await;
    deliver_all(&mut reader, &mut pending, 100, 0, |event| relay.handle(event)).await.unwrap();
    let played = played_versions(&env, window_start, event_store::config::DEFAULT_DEDUPE_WINDOW_MS, 17).await;
    for name in [held, free] {
        assert_eq!(played.get(name), Some(&(0..7).collect::<Vec<_>>()), "{name}: each version once, in order");
    }
    assert_eq!(played.get(lost), Some(&vec![0, 1, 2]), "{lost}: each version once, in order");
}

/// The sample events of `events/` (what `sam local invoke` and `cargo lambda invoke` send):
/// an API Gateway v2 append, and the DynamoDB stream event of a batch item and a tip.
#[tokio::test(flavor = "multi_thread")]
async fn the_sample_events_append_and_relay() {
    let env = TestEnv::start(1).await;
    let api = StreamsApi::new(store(&env));
    let append = || lambda_http::request::from_str(&common::sample_event("streams-append.json")).unwrap();
    let first = call(&api, append()).await;
    assert_eq!((first.status, first.etag.as_deref()), (StatusCode::CREATED, Some("\"1\"")));
    assert_eq!(first.location.as_deref(), Some("/streams/todo-e2e?from=0"));
    let again = call(&api, append()).await;
    assert_eq!(
        (again.status, again.etag.as_deref()),
        (StatusCode::CREATED, Some("\"1\"")),
        "its ids make it idempotent"
    );

    let event: aws_lambda_events::event::dynamodb::Event =
        serde_json::from_str(&common::sample_event("relay.json")).unwrap();
    let response = relay(&env, env.kinesis.clone()).handle(event).await;
    assert!(response.batch_item_failures.is_empty());
    let relayed: Vec<(String, Value)> = env
        .read_stream(&env.names.event_stream)
        .await
        .into_iter()
        .map(|(_, r)| (r.partition_key().unwrap().to_owned(), serde_json::from_slice(r.data().as_ref()).unwrap()))
        .collect();
    let ids: Vec<(&str, &str)> = relayed.iter().map(|(key, e)| (key.as_str(), e["id"].as_str().unwrap())).collect();
    assert_eq!(
        ids,
        [("streams/todo-e2e", "todo-e2e/0"), ("streams/todo-e2e", "todo-e2e/1")],
        "the tip's change is not an event"
    );
    assert_eq!(relayed[1].1["body"]["data"], json!({"title": "buy oat milk"}));

    // Into the log (pump and scan), then read over HTTP with the same API and auth (issue 50): `GET /log`
    // a page of one event at a time, each from the position the one before named.
    pump_all(&env).await;
    // A second on, their slot is complete and the scan seals it.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let scan = || ScanConfig { segments: 1, watermark_lag_ms: 0, ..runs::scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan(), json!({}), deadline_in(Duration::from_secs(60))).await
    {
        pass.unwrap();
    }
    let tiers = event_store::log::tiers::Tiers::new(None);
    let log = event_store::log::http::LogApi {
        dynamo: env.dynamo.clone(),
        event_table: env.names.event_table.clone(),
        dedupe_window_ms: 30_000,
        tiers,
    };
    let api = api.with_log(Some(log));
    env.counter.reset();
    let (mut ids, mut from) = (Vec::new(), "0".to_owned());
    let end = loop {
        let page = call(&api, request("GET", &format!("/log?from={from}&limit=1"), &[], None)).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        ids.extend(
            page.body["events"].as_array().unwrap().iter().map(|e| e["data"]["id"].as_str().unwrap().to_owned()),
        );
        from = page.body["next"].as_str().unwrap().to_owned();
        if page.body["at_end"] == json!(true) {
            break from;
        }
    };
    assert_eq!(ids, ["todo-e2e/0", "todo-e2e/1"], "each event once, in log order");
    common::assert_allowed_by_the_template(&env.counter, "StreamsFunction");
    for bad in ["/log?from=yesterday", "/log?limit=1001", "/log?wait=21", "/log?filter=nopointer"] {
        assert_eq!(call(&api, request("GET", bad, &[], None)).await.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    // At the end, a request waits (a long poll) and answers the next sealed event once the scan seals it.
    let started = std::time::Instant::now();
    let waited = call(&api, request("GET", &format!("/log?from={end}&wait=1"), &[], None)).await;
    assert!(waited.body["events"].as_array().unwrap().is_empty() && started.elapsed() >= Duration::from_millis(900));
    let waiting = call(&api, request("GET", &format!("/log?from={end}&wait=20"), &[], None));
    let arrives = async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let hit = json!({"id": "hit-1", "path": "/track.gif"}).to_string().into_bytes();
        let event = common::kinesis_event_on(common::TEST_ARN, "shardId-000000000000", &[("v".into(), hit, now_ms())]);
        assert!(common::pump(&env).handle(event).await.batch_item_failures.is_empty());
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        for pass in
            run_scan(env.dynamo.clone(), env.kinesis.clone(), scan(), json!({}), deadline_in(Duration::from_secs(60)))
                .await
        {
            pass.unwrap();
        }
        std::time::Instant::now()
    };
    let (answered, sealed_at) = tokio::join!(waiting, arrives);
    let events = answered.body["events"].as_array().unwrap().clone();
    assert_eq!(
        events.iter().map(|e| e["data"]["id"].clone()).collect::<Vec<_>>(),
        [json!("hit-1")],
        "{}",
        answered.body
    );
    println!("GET /log answered {:?} after the scan sealed the event", std::time::Instant::now() - sealed_at);
}

/// The test aggregate for the cqrs-es adapter: a bank account, as in the
/// cqrs-es book, with a business rule to refuse a command by.
mod bank {
    use cqrs_es::event_sink::EventSink;
    use cqrs_es::{Aggregate, DomainEvent};
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Default, Serialize, Deserialize)]
    pub struct Account {
        pub opened: bool,
        pub balance: i64,
    }

    #[derive(Debug)]
    pub enum Command {
        Open,
        Deposit(i64),
        Withdraw(i64),
    }

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    pub enum Event {
        Opened,
        Deposited { amount: i64 },
        Withdrew { amount: i64 },
    }

    impl DomainEvent for Event {
        fn event_type(&self) -> String {
            match self {
                Event::Opened => "Opened",
                Event::Deposited { .. } => "Deposited",
                Event::Withdrew { .. } => "Withdrew",
            }
            .to_owned()
        }
        fn event_version(&self) -> String {
            "1.0".to_owned()
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    pub struct Refused(pub &'static str);

    impl Aggregate for Account {
        const TYPE: &'static str = "account";
        type Command = Command;
        type Event = Event;
        type Error = Refused;
        type Services = ();

        async fn handle(&mut self, command: Command, _: &(), sink: &EventSink<Self>) -> Result<(), Refused> {
            let event = match command {
                Command::Open if self.opened => return Err(Refused("already open")),
                Command::Open => Event::Opened,
                _ if !self.opened => return Err(Refused("not open")),
                Command::Deposit(amount) => Event::Deposited { amount },
                Command::Withdraw(amount) if amount > self.balance => return Err(Refused("insufficient funds")),
                Command::Withdraw(amount) => Event::Withdrew { amount },
            };
            sink.write(event, self).await;
            Ok(())
        }

        fn apply(&mut self, event: Event) {
            match event {
                Event::Opened => self.opened = true,
                Event::Deposited { amount } => self.balance += amount,
                Event::Withdrew { amount } => self.balance -= amount,
            }
        }
    }
}

/// cqrs-es on entity streams: commands through `CqrsFramework` in its three
/// modes, the events readable by any client of the stream, a conflicting
/// commit refused, the aggregate stored with its events, and a replay of all.
#[tokio::test(flavor = "multi_thread")]
async fn cqrs_es_aggregates_live_in_entity_streams() {
    use bank::{Account, Command, Event};
    use cqrs_es::persist::{PersistedEventRepository, PersistedEventStore};
    use cqrs_es::{AggregateError, CqrsFramework, EventStore};
    use event_store::entity::cqrs::EntityRepository;

    let env = TestEnv::start(1).await;
    let store = store(&env);
    let repository = EntityRepository::new(store.clone());
    let event_store = || PersistedEventStore::<_, Account>::new_event_store(repository.clone());

    let cqrs = CqrsFramework::new(event_store(), vec![], ());
    cqrs.execute("a1", Command::Open).await.unwrap();
    cqrs.execute("a1", Command::Deposit(100)).await.unwrap();
    let metadata = HashMap::from([("user".to_owned(), "ann".to_owned())]);
    cqrs.execute_with_metadata("a1", Command::Withdraw(30), metadata).await.unwrap();
    let refused = cqrs.execute("a1", Command::Withdraw(500)).await;
    assert!(matches!(refused, Err(AggregateError::UserError(_))), "{refused:?}");

    // The same events, as any reader of the entity stream sees them.
    let page = store.read("account:a1", None, 100, Direction::Forward).await.unwrap();
    let seen: Vec<_> = page.events.iter().map(|e| (e.version, e.event_type.as_str())).collect();
    assert_eq!(seen, vec![(0, "Opened"), (1, "Deposited"), (2, "Withdrew")]);
    assert_eq!(page.events[1].data, json!({"Deposited": {"amount": 100}}));
    assert_eq!(page.events[2].metadata, Some(json!({"event_version": "1.0", "metadata": {"user": "ann"}})));

    // Loaded back; then two commands that loaded the same version: the second commit conflicts.
    let loaded = event_store().load_aggregate("a1").await.unwrap();
    assert_eq!((loaded.aggregate.balance, loaded.current_sequence), (70, 3));
    let (first, second) =
        (event_store().load_aggregate("a1").await.unwrap(), event_store().load_aggregate("a1").await.unwrap());
    event_store().commit(vec![Event::Deposited { amount: 1 }], first, HashMap::new()).await.unwrap();
    let lost = event_store().commit(vec![Event::Deposited { amount: 2 }], second, HashMap::new()).await;
    assert!(matches!(lost, Err(AggregateError::AggregateConflict)), "{lost:?}");
    assert_eq!(store.tip("account:a1").await.unwrap().unwrap().version, 3, "the conflicting commit wrote nothing");

    // Aggregate-store and snapshot modes. cqrs-es 0.5.0's `CqrsFramework::execute`
    // folds a command's events into the stored aggregate twice in these modes
    // (`EventSink::write` applies each event, then `commit` applies them again:
    // a 5 + 7 deposit is stored as 24, whatever the repository), so these
    // commits go through its `EventStore` directly: load, then commit events.
    async fn commit_each(store: &PersistedEventStore<EntityRepository, Account>, id: &str, events: Vec<Event>) {
        for event in events {
            let context = store.load_aggregate(id).await.unwrap();
            store.commit(vec![event], context, HashMap::new()).await.unwrap();
        }
    }
    // Aggregate store: each commit stores the aggregate in the same transaction
    // as its events, and loading is the snapshot alone.
    let aggregate_store = PersistedEventStore::<_, Account>::new_aggregate_store(repository.clone());
    let deposits = vec![Event::Opened, Event::Deposited { amount: 5 }, Event::Deposited { amount: 7 }];
    commit_each(&aggregate_store, "b2", deposits).await;
    let snapshot = store.latest_snapshot("account:b2").await.unwrap().unwrap();
    assert_eq!(snapshot.version, 2);
    assert_eq!((&snapshot.state["aggregate"]["balance"], &snapshot.state["snapshot"]), (&json!(12), &json!(3)));
    env.counter.reset();
    let loaded = aggregate_store.load_aggregate("b2").await.unwrap();
    assert_eq!((loaded.aggregate.balance, loaded.current_sequence), (12, 3));
    assert_eq!(env.counter.service_total("DynamoDB"), 1, "one GetItem");

    // Snapshot store (every 2 events): the snapshot plus the events after it.
    let snapshot_store = PersistedEventStore::<_, Account>::new_snapshot_store(repository.clone(), 2);
    let events = [Event::Opened, Event::Deposited { amount: 10 }, Event::Deposited { amount: 20 }];
    commit_each(
        &snapshot_store,
        "c3",
        [&events[..], &[Event::Withdrew { amount: 5 }, Event::Deposited { amount: 1 }]].concat(),
    )
    .await;
    let loaded = snapshot_store.load_aggregate("c3").await.unwrap();
    assert_eq!((loaded.aggregate.balance, loaded.current_sequence), (26, 5));
    let snapshot = store.latest_snapshot("account:c3").await.unwrap().unwrap();
    assert_eq!((snapshot.version, &snapshot.state["aggregate"]["balance"]), (3, &json!(25)));
    let after = store.read("account:c3", Some(4), 10, Direction::Forward).await.unwrap();
    assert_eq!(after.events.len(), 1, "loading read the snapshot and the one event after it");

    // A replay of every account (what rebuilds a read model): each in sequence order.
    let mut all = repository.stream_all_events::<Account>().await.unwrap();
    let mut replayed: HashMap<String, Vec<usize>> = HashMap::new();
    while let Some(envelope) = all.next::<Account>(&[]).await {
        let envelope = envelope.unwrap();
        replayed.entry(envelope.aggregate_id).or_default().push(envelope.sequence);
    }
    let expected: HashMap<String, Vec<usize>> =
        [("a1", 4), ("b2", 3), ("c3", 5)].into_iter().map(|(id, n)| (id.to_owned(), (1..=n).collect())).collect();
    assert_eq!(replayed, expected);

    // Issue 48: cqrs-es's own upcasters work through this backend, which keeps each event's
    // `event_version`: deposits recorded at 1.0 load as 2.0's, amounts in cents.
    use cqrs_es::persist::SemanticVersionEventUpcaster;
    let cents = SemanticVersionEventUpcaster::new(
        "Deposited",
        "2.0",
        Box::new(|mut payload: Value| {
            let amount = payload["Deposited"]["amount"].as_i64().unwrap_or(0);
            payload["Deposited"]["amount"] = json!(amount * 100);
            payload
        }),
    );
    let upcasting = event_store().with_upcasters(vec![Box::new(cents)]);
    let loaded = upcasting.load_aggregate("a1").await.unwrap();
    assert_eq!(loaded.aggregate.balance, 100 * 100 - 30 + 100, "the two deposits in cents, the withdrawal as stored");
    assert_eq!(event_store().load_aggregate("a1").await.unwrap().aggregate.balance, 71, "stored as they were");

    // Stream metadata: an aggregate loads from a snapshot at or after the cut; one that would be
    // folded over events the metadata hides is refused, not loaded wrong (nor taken for a new one).
    let truncate = StreamMetadata { truncate_before: Some(4), ..Default::default() };
    store.set_metadata("account:c3", None, &truncate).await.unwrap();
    let loaded = snapshot_store.load_aggregate("c3").await.unwrap();
    assert_eq!((loaded.aggregate.balance, loaded.current_sequence), (26, 5));
    let last_two = StreamMetadata { max_count: Some(2), ..Default::default() };
    store.set_metadata("account:a1", None, &last_two).await.unwrap();
    let refused = event_store().load_aggregate("a1").await.err();
    assert!(matches!(refused, Some(AggregateError::UnexpectedError(_))), "{refused:?}");
}

/// moto emits a stream record for the put of a transaction it then cancels
/// (the put ran before the failed condition was found) into the table it
/// replaces with a copy; a reader following its old iterator saw that
/// phantom append (a demo run stored one event too many). DynamoDB emits
/// nothing for a cancelled transaction, and the local reader must not either.
#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_append_never_reaches_the_table_stream() {
    let env = TestEnv::start(1).await;
    let store = store(&env);
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    store.append("real", Expected::NoStream, vec![NewEvent::new("Made", json!({}))]).await.unwrap();
    // Each record as (stream, item): the tip's and the batch's, per append.
    let keys = |records: Vec<aws_sdk_dynamodbstreams::types::Record>| -> Vec<(String, String)> {
        records
            .iter()
            .filter_map(|r| {
                let keys = r.dynamodb()?.keys()?;
                Some((keys.get("stream")?.as_s().ok()?.clone(), keys.get("item")?.as_s().ok()?.clone()))
            })
            .collect()
    };
    let mut seen = Vec::new();
    for _ in 0..20 {
        seen.extend(keys(reader.poll().await.unwrap()));
        if seen.iter().any(|(_, item)| item.starts_with('e')) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The stream's items, and its name in the index that lists streams.
    assert!(seen.iter().all(|(stream, item)| stream == "real" || item == "_real"), "{seen:?}");
    // The reader now follows the iterator its last read returned. A stream that does not exist: 404.
    let missing = store.append("ghost", Expected::Version(0), vec![NewEvent::new("Boo", json!({}))]).await;
    assert!(matches!(missing, Err(EntityError::NotFound)), "{missing:?}");
    store.append("real", Expected::Version(0), vec![NewEvent::new("Made", json!({}))]).await.unwrap();
    let mut later = Vec::new();
    for _ in 0..5 {
        later.extend(keys(reader.poll().await.unwrap()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(later.iter().any(|(stream, item)| stream == "real" && item == "e000000000001"), "{later:?}");
    assert!(later.iter().all(|(stream, _)| stream == "real"), "no phantom of the cancelled append: {later:?}");
}

/// Every write to a table gets its own table-stream record and sequence
/// number, however many clients write at once (the relay saves its streams'
/// positions concurrently). moto numbered a record by the count of records
/// before it, unlocked: two concurrent writes could share a number, and a
/// reader asking for the records after that number was handed the second of
/// them for ever (CI's hang in the held-stream test). Its launcher now locks
/// the append; the local reader stops on a number that does not increase.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_writes_each_get_their_own_table_stream_sequence_number() {
    const WRITERS: usize = 16;
    const WRITES: usize = 40;
    let env = TestEnv::start(1).await;
    let mut writers = tokio::task::JoinSet::new();
    for writer in 0..WRITERS {
        let (dynamo, table) = (env.dynamo.clone(), env.names.entity_table.clone());
        writers.spawn(async move {
            for write in 0..WRITES {
                dynamo
                    .put_item()
                    .table_name(&table)
                    .item("stream", aws_sdk_dynamodb::types::AttributeValue::S(format!("race-{writer}")))
                    .item("item", aws_sdk_dynamodb::types::AttributeValue::S(format!("_w{}", write % 4)))
                    // Sizeable images: moto's window between numbering and storing a record.
                    .item("data", aws_sdk_dynamodb::types::AttributeValue::S(format!("{write:0>20000}")))
                    .send()
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = writers.join_next().await {
        done.unwrap();
    }
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams.clone(), &env.names.entity_table, common::REGION).await.unwrap();
    // The stream as stored, read once from its start.
    let arn = reader.stream_arn.clone();
    let description = streams.describe_stream().stream_arn(&arn).send().await.unwrap();
    let mut numbers = Vec::new();
    for shard in description.stream_description().unwrap().shards() {
        let mut iterator = streams
            .get_shard_iterator()
            .stream_arn(&arn)
            .shard_id(shard.shard_id().unwrap())
            .shard_iterator_type(aws_sdk_dynamodbstreams::types::ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator
            .unwrap();
        loop {
            let out = streams.get_records().shard_iterator(&iterator).limit(1000).send().await.unwrap();
            if out.records().is_empty() {
                break;
            }
            numbers.extend(out.records().iter().filter_map(|r| r.dynamodb()?.sequence_number().map(str::to_owned)));
            let Some(next) = out.next_shard_iterator() else { break };
            iterator = next.to_owned();
        }
    }
    let distinct: HashSet<&String> = numbers.iter().collect();
    assert_eq!((numbers.len(), distinct.len()), (WRITERS * WRITES, WRITERS * WRITES), "one number per write");
    // The reader delivers each once, and ends.
    let mut pending = VecDeque::new();
    let delivered = deliver_all(&mut reader, &mut pending, 100, 0, |_| async { Default::default() }).await.unwrap();
    assert_eq!(delivered, WRITERS * WRITES);
}

/// The pump over everything on the event stream (it drops the copies it has buffered).
async fn pump_all(env: &TestEnv) {
    let pump = common::pump(env);
    for batch in env.event_source_batches().await {
        assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    }
}

/// The versions of the batch items a stream has in the table (their first versions).
async fn stored_batches(env: &TestEnv, stream: &str) -> Vec<u64> {
    let out = env
        .dynamo
        .query()
        .table_name(&env.names.entity_table)
        .key_condition_expression("#s = :s AND begins_with(#i, :e)")
        .expression_attribute_names("#s", "stream")
        .expression_attribute_names("#i", "item")
        .expression_attribute_values(":s", aws_sdk_dynamodb::types::AttributeValue::S(stream.into()))
        .expression_attribute_values(":e", aws_sdk_dynamodb::types::AttributeValue::S("e".into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    out.items().iter().map(|item| item["first"].as_n().unwrap().parse().unwrap()).collect()
}

fn versions_of(body: &Value) -> Vec<u64> {
    body["events"].as_array().unwrap().iter().map(|e| e["version"].as_u64().unwrap()).collect()
}

/// Stream metadata (issue 48): `max_count`, `truncate_before` and `max_age`
/// hide history from every read at once (versions keep their numbers, the
/// stream's version does not move, an older snapshot stays usable); the
/// relay, as its table stream drives it, then removes the hidden batches from
/// the table (a batch straddling the cut stays whole), after putting every
/// version on the log; a stale `If-Match` on the metadata is a 409.
#[tokio::test(flavor = "multi_thread")]
async fn stream_metadata_hides_history_at_once_and_the_relay_removes_it_from_the_table() {
    let env = TestEnv::start(1).await;
    let store = store(&env);
    let api = StreamsApi::new(store.clone());
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    let mut pending = VecDeque::new();
    let relay = relay(&env, env.kinesis.clone());
    // 25 events: 13 appends of one (0..=12), one of four (13..=16, straddling the cut at 15), 8 of one.
    let sizes = [vec![1; 13], vec![4], vec![1; 8]].concat();
    let mut version = None;
    for size in sizes {
        let events = (0..size).map(|i| NewEvent::new("Posted", json!({"i": i}))).collect();
        let expected = version.map_or(Expected::NoStream, Expected::Version);
        version = Some(store.append("ledger-1", expected, events).await.unwrap().last);
    }
    assert_eq!(version, Some(24));
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    // Buffered by the pump: only then may the table's copy go.
    pump_all(&env).await;

    let meta = call(&api, request("GET", "/streams/ledger-1/metadata", &[], None)).await;
    assert_eq!((meta.status, meta.etag.as_deref()), (StatusCode::OK, Some("\"0\"")), "{}", meta.body);
    let set = |body: Value, if_match: Option<&str>| {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(if_match.map(|v| ("if-match", v)));
        request("PUT", "/streams/ledger-1/metadata", &headers, Some(body))
    };
    let done = call(&api, set(json!({"max_count": 10, "custom": {"owner": "ops"}}), Some("\"0\""))).await;
    assert_eq!((done.status, done.etag.as_deref()), (StatusCode::OK, Some("\"1\"")), "{}", done.body);
    let stale = call(&api, set(json!({"max_count": 5}), Some("\"0\""))).await;
    assert_eq!((stale.status, stale.etag.as_deref()), (StatusCode::CONFLICT, Some("\"1\"")), "{}", stale.body);
    let typo = call(&api, set(json!({"maxCount": 5}), None)).await;
    assert_eq!(typo.status, StatusCode::BAD_REQUEST, "{}", typo.body);
    let missing = request("PUT", "/streams/nobody/metadata", &[("content-type", "application/json")], Some(json!({})));
    assert_eq!(call(&api, missing).await.status, StatusCode::NOT_FOUND);
    let meta = call(&api, request("GET", "/streams/ledger-1/metadata", &[], None)).await;
    assert_eq!(meta.body["metadata"], json!({"max_count": 10, "custom": {"owner": "ops"}}));

    // Reads honour it at once, before any cleanup: the last 10, with their own versions.
    let page = call(&api, request("GET", "/streams/ledger-1?limit=100", &[], None)).await;
    assert_eq!(versions_of(&page.body), (15..=24).collect::<Vec<_>>());
    assert_eq!((page.etag.as_deref(), &page.body["version"]), (Some("\"24\""), &json!(24)), "the version stays");
    let cached = call(&api, request("GET", "/streams/ledger-1", &[("if-none-match", "\"24\"")], None)).await;
    assert_eq!(cached.status, StatusCode::OK, "with metadata, no 304: what is shown changes at the same version");
    let back = call(&api, request("GET", "/streams/ledger-1?direction=backward&limit=4", &[], None)).await;
    assert_eq!(versions_of(&back.body), vec![24, 23, 22, 21]);
    let back = call(&api, request("GET", "/streams/ledger-1?from=16&direction=backward", &[], None)).await;
    assert_eq!((versions_of(&back.body), &back.body["next"]), (vec![16, 15], &Value::Null));
    let state = store.state("ledger-1").await.unwrap();
    assert_eq!(state.events.iter().map(|e| e.version).collect::<Vec<_>>(), (15..=24).collect::<Vec<_>>());
    // A snapshot older than the cut stays usable: the events after it start at the cut.
    store.save_snapshot("ledger-1", 12, &json!({"posted": 13})).await.unwrap();
    let state = call(&api, request("GET", "/streams/ledger-1/state", &[], None)).await;
    assert_eq!((state.body["snapshot"]["version"].as_u64(), versions_of(&state.body)[0]), (Some(12), 15));
    assert_eq!(stored_batches(&env, "ledger-1").await.len(), 22, "nothing removed yet");

    // The relay cleans up after the metadata's change: every batch wholly below 15 leaves the table.
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    let kept = stored_batches(&env, "ledger-1").await;
    assert_eq!(kept, [vec![13], (17..=24).collect()].concat(), "13..=16 straddles the cut: kept whole");
    assert_eq!(store.tip("ledger-1").await.unwrap().unwrap().trimmed, None, "one step: nothing to go on from");
    assert_eq!(store.state("ledger-1").await.unwrap().snapshot.map(|s| s.version), Some(12), "snapshots stay");
    // The log kept every version.
    let logged = env.read_stream(&env.names.event_stream).await.len();
    assert_eq!(logged, 25, "each version put on the log once, before its batch was removed");

    // truncate_before replaces it (If-Match of the metadata's version); the next append cleans up too.
    assert_eq!(call(&api, set(json!({"truncate_before": 20}), Some("\"1\""))).await.status, StatusCode::OK);
    let page = call(&api, request("GET", "/streams/ledger-1", &[], None)).await;
    assert_eq!(versions_of(&page.body), (20..=24).collect::<Vec<_>>());
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    assert_eq!(stored_batches(&env, "ledger-1").await, (20..=24).collect::<Vec<_>>());

    // max_age: once the stream's events are older, none is shown; an append after is.
    assert_eq!(call(&api, set(json!({"max_age": 1}), Some("\"2\""))).await.status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let page = call(&api, request("GET", "/streams/ledger-1", &[], None)).await;
    assert_eq!((versions_of(&page.body), &page.body["version"]), (vec![], &json!(24)));
    store.append("ledger-1", Expected::Version(24), vec![NewEvent::new("Posted", json!({}))]).await.unwrap();
    let page = call(&api, request("GET", "/streams/ledger-1?direction=backward", &[], None)).await;
    assert_eq!((versions_of(&page.body), &page.body["next"]), (vec![25], &Value::Null), "no link into the hidden part");
    assert_eq!(versions_of(&call(&api, request("GET", "/streams/ledger-1/state", &[], None)).await.body), vec![25]);
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    assert_eq!(stored_batches(&env, "ledger-1").await, vec![25]);
    assert_eq!(env.read_stream(&env.names.event_stream).await.len(), 26);
    // Cleared: everything the table still holds is shown again (what was removed is gone).
    // The cleanup goes by the metadata as it is when it runs, not by the change that woke it:
    // truncated, then cleared before the relay saw the first change, nothing goes.
    for v in 0..5u64 {
        let expected = v.checked_sub(1).map_or(Expected::NoStream, Expected::Version);
        store.append("ledger-3", expected, vec![NewEvent::new("Posted", json!({}))]).await.unwrap();
    }
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    pump_all(&env).await;
    let truncate = StreamMetadata { truncate_before: Some(3), ..Default::default() };
    store.set_metadata("ledger-3", Some(0), &truncate).await.unwrap();
    store.set_metadata("ledger-3", Some(1), &StreamMetadata::default()).await.unwrap();
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    assert_eq!(stored_batches(&env, "ledger-3").await, (0..5).collect::<Vec<_>>());
    // A cleanup longer than one step (100 batches) continues from its own change of the tip.
    for v in 0..105u64 {
        let expected = v.checked_sub(1).map_or(Expected::NoStream, Expected::Version);
        store.append("ledger-2", expected, vec![NewEvent::new("Posted", json!({}))]).await.unwrap();
    }
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    let one = StreamMetadata { max_count: Some(1), ..Default::default() };
    assert_eq!(store.set_metadata("ledger-2", None, &one).await.unwrap(), 1);
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    assert_eq!(stored_batches(&env, "ledger-2").await.len(), 105, "relayed, not yet buffered: all kept");
    pump_all(&env).await;
    // The next change of the tip (here the same metadata again) cleans up.
    assert_eq!(store.set_metadata("ledger-2", None, &one).await.unwrap(), 2);
    deliver_all(&mut reader, &mut pending, 100, 10, |event| relay.handle(event)).await.unwrap();
    assert_eq!(stored_batches(&env, "ledger-2").await, vec![104]);
    assert_eq!(store.tip("ledger-2").await.unwrap().unwrap().trimmed, Some(100), "the first step stopped at 100");
    // Without If-Match: whatever version it is at.
    assert_eq!(call(&api, set(json!({}), None)).await.status, StatusCode::OK);
    assert_eq!(store.metadata("ledger-1").await.unwrap().0, 4);
    assert!(store.tip("ledger-1").await.unwrap().unwrap().retention.is_none());
}

/// Appends across streams (issue 48): 8 concurrent writers each move 5
/// "transfers" as one request appending to two streams on their versions,
/// conditioned on a third stream's version and a fourth's absence. Every
/// acknowledged transfer is in both streams, none in one only; a failed
/// condition is a 409 naming its stream and version; a retry by ids is the
/// original answer; the log plays each stream's events once, in version order.
#[tokio::test(flavor = "multi_thread")]
async fn appends_across_streams_are_all_or_nothing_under_concurrent_writers() {
    let env = TestEnv::start(2).await;
    let window_start = now_ms() - 1;
    // moto applies concurrent transactions without a lock; DynamoDB serializes writes to an item.
    let serial =
        event_store_fault_proxy::FaultProxy::start_one_at_a_time(env.sdk.endpoint_url().unwrap()).await.unwrap();
    let dynamo = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk).endpoint_url(&serial.endpoint).build(),
    );
    let store = EntityStore::new(dynamo, env.names.entity_table.clone());
    let api = Arc::new(StreamsApi::new(store.clone()));
    for (stream, events) in [("acct-a", 1), ("acct-b", 1), ("rules", 8)] {
        let events = (0..events).map(|i| NewEvent::new("Opened", json!({"i": i}))).collect();
        store.append(stream, Expected::NoStream, events).await.unwrap();
    }
    let json = [("content-type", "application/json")];
    let transfer = |a: u64, b: u64, rules: u64, (w, n): (u64, u64), ids: (uuid::Uuid, uuid::Uuid)| {
        json!({
            "appends": [
                {"stream": "acct-a", "expected_version": a, "events": [{"id": ids.0, "type": "Debited", "data": {"w": w, "n": n}}]},
                {"stream": "acct-b", "expected_version": b, "events": [{"id": ids.1, "type": "Credited", "data": {"w": w, "n": n}}]},
            ],
            "conditions": [{"stream": "rules", "expected_version": rules}, {"stream": "nobody", "expected_version": "no_stream"}],
        })
    };
    let writers: Vec<_> = (0..8u64)
        .map(|w| {
            let (api, store) = (api.clone(), store.clone());
            tokio::spawn(async move {
                let (mut acknowledged, mut refused, mut other) = (Vec::new(), 0, Vec::new());
                for n in 0..5u64 {
                    let ids = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
                    loop {
                        let version = |s: &'static str| {
                            let store = store.clone();
                            async move { store.tip(s).await.unwrap().unwrap().version }
                        };
                        let (a, b, rules) = (version("acct-a").await, version("acct-b").await, version("rules").await);
                        let body = transfer(a, b, rules, (w, n), ids);
                        let answer = call(&api, request("POST", "/streams", &json, Some(body.clone()))).await;
                        match answer.status {
                            StatusCode::CREATED => {
                                acknowledged.push((body, answer.body));
                                break;
                            }
                            StatusCode::CONFLICT
                                if ["acct-a", "acct-b", "rules"].contains(&answer.body["stream"].as_str().unwrap())
                                    && answer.body["current_version"].is_u64() =>
                            {
                                refused += 1
                            }
                            status => other.push(format!("{status}: {}", answer.body)),
                        }
                    }
                }
                (acknowledged, refused, other)
            })
        })
        .collect();
    // The third stream moves while they write: conditions on its old version are refused.
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.append("rules", Expected::Version(7), vec![NewEvent::new("Changed", json!({}))]).await.unwrap();
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for writer in writers {
        let (acks, r, other) = writer.await.unwrap();
        assert!(other.is_empty(), "every refusal is a 409 naming a stream and its version: {other:?}");
        acknowledged.extend(acks);
        refused += r;
    }
    assert_eq!(acknowledged.len(), 40);
    println!("8 writers, 40 appends across two streams: {refused} refused (409)");
    // All or nothing: each stream holds exactly the acknowledged transfers, at the versions answered.
    for (index, stream) in ["acct-a", "acct-b"].iter().enumerate() {
        let page = store.read(stream, Some(1), 1000, Direction::Forward).await.unwrap();
        assert_eq!(page.version, 40, "{stream}: one event per acknowledged transfer, no gaps");
        let stored: HashMap<u64, (u64, u64)> = page
            .events
            .iter()
            .map(|e| (e.version, (e.data["w"].as_u64().unwrap(), e.data["n"].as_u64().unwrap())))
            .collect();
        for (body, answer) in &acknowledged {
            let data = &body["appends"][index]["events"][0]["data"];
            let at = answer["appends"][index]["first"].as_u64().unwrap();
            assert_eq!(answer["appends"][index]["stream"], json!(stream));
            assert_eq!(stored[&at], (data["w"].as_u64().unwrap(), data["n"].as_u64().unwrap()), "{stream} at {at}");
        }
    }
    // A retry by ids, whatever was appended since, is the original answer; nothing is written.
    let (body, answer) = &acknowledged[3];
    let retry = call(&api, request("POST", "/streams", &json, Some(body.clone()))).await;
    assert_eq!((retry.status, &retry.body), (StatusCode::CREATED, answer));
    assert_eq!(store.tip("acct-a").await.unwrap().unwrap().version, 40);
    // A stale condition names its stream and version; a deleted stream is a 410.
    let ids = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let stale = call(&api, request("POST", "/streams", &json, Some(transfer(40, 40, 7, (9, 9), ids)))).await;
    assert_eq!(
        (stale.status, &stale.body["stream"], &stale.body["current_version"]),
        (StatusCode::CONFLICT, &json!("rules"), &json!(8))
    );
    store.delete("acct-b", 40).await.unwrap();
    let gone = call(&api, request("POST", "/streams", &json, Some(transfer(40, 41, 8, (9, 9), ids)))).await;
    assert_eq!((gone.status, &gone.body["stream"]), (StatusCode::GONE, &json!("acct-b")), "{}", gone.body);
    assert_eq!(store.tip("acct-a").await.unwrap().unwrap().version, 40, "nothing of a refused request is written");

    // With "any" (the default), a retry after a condition's stream moved on is still the original
    // answer (refused by the tips before writing: the record says it was applied).
    let ids = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let any = json!({
        "appends": [
            {"stream": "acct-a", "events": [{"id": ids.0, "type": "Debited", "data": {"w": 9, "n": 9}}]},
            {"stream": "acct-c", "events": [{"id": ids.1, "type": "Credited", "data": {"w": 9, "n": 9}}]},
        ],
        "conditions": [{"stream": "rules", "expected_version": 8}],
    });
    let first = call(&api, request("POST", "/streams", &json, Some(any.clone()))).await;
    assert_eq!((first.status, &first.body["appends"][1]["first"]), (StatusCode::CREATED, &json!(0)), "{}", first.body);
    store.append("rules", Expected::Version(8), vec![NewEvent::new("Changed", json!({}))]).await.unwrap();
    let again = call(&api, request("POST", "/streams", &json, Some(any))).await;
    assert_eq!((again.status, &again.body), (StatusCode::CREATED, &first.body));

    // Without client ids, a transaction applied and then answered with a 500 (retried by the SDK,
    // and so cancelled) is recognized by the tips that name it, not appended again.
    let faults = FaultConfig { rate: 0.3, seed: 5, only: Some(&[Fault::AppliedThenInternalError]) };
    let proxy = event_store_fault_proxy::FaultProxy::start(env.sdk.endpoint_url().unwrap(), faults).await.unwrap();
    let retrying = aws_sdk_dynamodb::config::Builder::from(&env.sdk)
        .endpoint_url(&proxy.endpoint)
        .retry_config(
            aws_sdk_dynamodb::config::retry::RetryConfig::standard()
                .with_max_attempts(12)
                .with_initial_backoff(Duration::from_millis(5)),
        )
        .build();
    let faulty = EntityStore::new(aws_sdk_dynamodb::Client::from_conf(retrying), env.names.entity_table.clone());
    for n in 0..20 {
        let appends = ["u-a", "u-b"]
            .map(|stream| event_store::entity::StreamAppend {
                stream: stream.into(),
                expected: Expected::Any,
                events: vec![NewEvent::new("Moved", json!({"n": n}))],
            })
            .to_vec();
        let done = faulty.append_across(appends, vec![]).await.unwrap();
        assert_eq!((done[0].first, done[1].first), (n, n), "append {n}: once, at its place");
    }
    let applied = proxy.applied_then_failed();
    assert!(applied.iter().any(|a| a.operation.ends_with("TransactWriteItems")), "{applied:?}");
    for stream in ["u-a", "u-b"] {
        assert_eq!(store.tip(stream).await.unwrap().unwrap().version, 19, "{stream}: 20 appends, no copy");
    }

    // The log: each stream's events once, in version order.
    let relay = relay(&env, env.kinesis.clone());
    let streams = aws_sdk_dynamodbstreams::Client::new(&env.sdk);
    let mut reader =
        TableStreamReader::open(&env.dynamo, streams, &env.names.entity_table, common::REGION).await.unwrap();
    deliver_all(&mut reader, &mut VecDeque::new(), 100, 10, |event| relay.handle(event)).await.unwrap();
    let total = 42 + 42 + 10 + 1 + 20 + 20;
    let played = played_versions(&env, window_start, event_store::config::DEFAULT_DEDUPE_WINDOW_MS, total).await;
    for (stream, count) in [("acct-a", 42), ("acct-b", 42), ("rules", 10), ("acct-c", 1), ("u-a", 20), ("u-b", 20)] {
        assert_eq!(played.get(stream), Some(&(0..count).collect::<Vec<_>>()), "{stream}: each version once, in order");
    }

    // Listing 1,000 streams under three prefixes (created 24 at a time, the most one request may
    // touch, in no order): pages in name order, each one query per index shard and one read of tips.
    let mut names: Vec<String> = (0..1000).map(|i| format!("{}-{i:04}", ["alpha", "beta", "gamma"][i % 3])).collect();
    let mut shuffled = names.clone();
    shuffled.sort_by_key(|name| format!("{:x}", scatter(name)));
    for chunk in shuffled.chunks(event_store::entity::MAX_STREAMS_ACROSS) {
        let appends = chunk
            .iter()
            .map(|name| event_store::entity::StreamAppend {
                stream: name.clone(),
                expected: Expected::NoStream,
                events: vec![NewEvent { id: Some(uuid::Uuid::new_v4()), ..NewEvent::new("Created", json!({})) }],
            })
            .collect();
        store.append_across(appends, vec![]).await.unwrap();
    }
    names.sort();
    let lister = self::store(&env);
    let requests = |operation: &str| env.counter.get(operation);
    for (prefix, pages_expected) in [("beta-", 4), ("", 11)] {
        let (queries, gets) = (requests("DynamoDB.Query"), requests("DynamoDB.BatchGetItem"));
        let (mut listed, mut after, mut pages) = (Vec::new(), None::<String>, 0);
        loop {
            let page = lister.list_streams(prefix, after.as_deref(), 100).await.unwrap();
            pages += 1;
            listed.extend(page.streams.into_iter().map(|s| s.name));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let mut wanted: Vec<String> = names.iter().filter(|n| n.starts_with(prefix)).cloned().collect();
        if prefix.is_empty() {
            wanted.extend(["acct-a", "acct-b", "acct-c", "rules", "u-a", "u-b"].map(String::from));
            wanted.sort();
        }
        assert_eq!(listed, wanted, "{prefix:?}: every name once, in name order");
        assert_eq!(pages, pages_expected, "{prefix:?}: pages of 100");
        assert_eq!(requests("DynamoDB.Query") - queries, 16 * pages, "{prefix:?}: a query per shard per page");
        assert_eq!(requests("DynamoDB.BatchGetItem") - gets, pages, "{prefix:?}: one read of the tips per page");
    }
    // Streams created before the index existed (their index items removed here) are listed once
    // the backfill has run; it adds only what is missing.
    let unindexed = ["alpha-0000", "gamma-0998"];
    for item in env.scan_table(&env.names.entity_table).await {
        let name = item["item"].as_s().unwrap().trim_start_matches('_').to_owned();
        if item["stream"].as_s().unwrap().starts_with("~streams#") && unindexed.contains(&name.as_str()) {
            let key = HashMap::from([
                ("stream".to_owned(), item["stream"].clone()),
                ("item".to_owned(), item["item"].clone()),
            ]);
            env.dynamo.delete_item().table_name(&env.names.entity_table).set_key(Some(key)).send().await.unwrap();
        }
    }
    let listed = |prefix: &'static str| {
        let lister = lister.clone();
        async move {
            lister
                .list_streams(prefix, None, 100)
                .await
                .unwrap()
                .streams
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
        }
    };
    assert!(!listed("alpha-000").await.contains(&"alpha-0000".to_owned()));
    assert_eq!(lister.index_streams().await.unwrap(), 2);
    assert_eq!(listed("alpha-000").await[0], "alpha-0000");
    assert!(listed("gamma-099").await.contains(&"gamma-0998".to_owned()));
    assert_eq!(lister.index_streams().await.unwrap(), 0, "nothing more to add");
}

/// A stable scatter of names (FNV-1a): the listing test creates its streams in no name order.
fn scatter(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}
