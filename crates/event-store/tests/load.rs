//! load → event stream, against a real emulator (moto_server, or dynalite + kinesalite with EMULATOR=strict).
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use common::{sample_event, TestEnv};
use event_store::config::{IpMode, LoadConfig, DEFAULT_MAX_EVENT_BYTES};
use event_store::envelope::Envelope;
use event_store::load::{Load, PIXEL};
use lambda_http::http::StatusCode;
use lambda_http::Body;
use serde_json::{json, Value};

fn load(env: &TestEnv, stream: &str) -> Load {
    let config = LoadConfig { max_events_per_post: 100, ..LoadConfig::new(stream) };
    Load::new(env.kinesis.clone(), config)
}

fn request(file: &str) -> lambda_http::Request {
    lambda_http::request::from_str(&sample_event(file)).expect("sample event parses")
}

fn body_json(response: &lambda_http::Response<Body>) -> Value {
    serde_json::from_slice(response.body().as_ref()).expect("json body")
}

#[tokio::test(flavor = "multi_thread")]
async fn pixel_hit_answers_the_gif_and_puts_one_envelope() {
    let env = TestEnv::start(2).await;
    let load = load(&env, &env.names.event_stream);

    let response = load.handle(request("load.json")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "image/gif");
    assert_eq!(response.headers()["cache-control"], "no-cache, no-store, must-revalidate");
    assert_eq!(response.body().as_ref(), &PIXEL[..]);
    let sequence = response.headers()["x-sequence-number"].to_str().unwrap().to_owned();
    common::assert_only_declared_actions(&env.counter, event_store::load::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "LoadFunction");

    let records = env.read_stream(&env.names.event_stream).await;
    assert_eq!(records.len(), 1);
    let record = &records[0].1;
    assert_eq!(record.sequence_number(), sequence);
    assert_eq!(record.partition_key(), Some("user-42"), "EntityId from the query is the partition key");
    let envelope: Envelope = serde_json::from_slice(record.data().as_ref()).unwrap();
    assert_eq!(envelope.method, "GET");
    assert_eq!(envelope.path, "/track.gif");
    assert_eq!(envelope.query["tag"], vec!["a", "b"], "repeated keys are kept");
    assert_eq!(envelope.query["page"], vec!["home"]);
    assert_eq!(envelope.headers.referer.as_deref(), Some("https://example.com/home"));
    assert!(envelope.headers.user_agent.as_deref().unwrap().contains("Firefox"));
    assert_eq!(envelope.headers.accept_language.as_deref(), Some("en-GB,en;q=0.9"));
    assert_eq!(envelope.source_ip.as_deref(), Some("203.0.113.9"));
    assert!(envelope.received_at.ends_with('Z') && envelope.received_at.len() == 24, "{}", envelope.received_at);
    assert!(envelope.body.is_none());
    assert_eq!(env.counter.get("Kinesis.PutRecord"), 1);

    // A hit naming an entity stream's key is refused: it can never pass for that stream's event.
    let mut forged: Value = serde_json::from_str(&sample_event("load.json")).unwrap();
    forged["rawQueryString"] = json!("EntityId=streams%2Ftodo-e2e&page=home");
    forged["queryStringParameters"] = json!({"EntityId": "streams/todo-e2e", "page": "home"});
    let refused = load.handle(lambda_http::request::from_str(&forged.to_string()).unwrap()).await;
    assert_eq!(refused.status(), StatusCode::BAD_REQUEST);
    assert_eq!(env.read_stream(&env.names.event_stream).await.len(), 1, "nothing put under the entity key");
}

/// Pixel hits answered at once, all on one shard: every hit is on the
/// stream under the sequence number it was told. moto numbers a shard's
/// records from one unlocked read, so two puts at once could get the same
/// number and one record was gone though both were answered 200 (a pixel
/// hit lost in the faults test); the emulator launcher locks that, and
/// this shows it holds.
#[tokio::test(flavor = "multi_thread")]
async fn concurrent_pixel_hits_are_each_stored_under_the_sequence_number_they_were_told() {
    use futures::StreamExt;
    let env = TestEnv::start(1).await;
    let load = std::sync::Arc::new(load(&env, &env.names.event_stream));
    let answers: Vec<_> = futures::stream::iter(0..600)
        .map(|_| {
            let load = load.clone();
            async move { load.handle(request("load.json")).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let told: std::collections::HashSet<String> = answers
        .iter()
        .map(|answer| {
            assert_eq!(answer.status(), StatusCode::OK);
            answer.headers()["x-sequence-number"].to_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(told.len(), 600, "each hit told a sequence number of its own");
    let stored: std::collections::HashSet<String> = env
        .read_stream(&env.names.event_stream)
        .await
        .iter()
        .map(|(_, record)| record.sequence_number().to_owned())
        .collect();
    assert_eq!(stored, told, "every hit answered 200 is on the stream");
}

#[tokio::test(flavor = "multi_thread")]
async fn rest_api_events_work_behind_a_stage_and_anonymous_hits_get_random_keys() {
    let env = TestEnv::start(1).await;
    let load = load(&env, &env.names.event_stream);
    for _ in 0..2 {
        let response = load.handle(request("load-track-gif-v1.json")).await;
        assert_eq!(response.status(), StatusCode::OK);
    }
    let records = env.read_stream(&env.names.event_stream).await;
    assert_eq!(records.len(), 2);
    let envelopes: Vec<Envelope> =
        records.iter().map(|(_, r)| serde_json::from_slice(r.data().as_ref()).unwrap()).collect();
    assert_eq!(envelopes[0].source_ip.as_deref(), Some("198.51.100.7"));
    assert_eq!(envelopes[0].query["campaign"], vec!["winter"]);
    assert_ne!(records[0].1.partition_key(), records[1].1.partition_key());
    assert_eq!(records[0].1.partition_key(), Some(envelopes[0].id.as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn posted_events_go_out_one_request_per_event_of_the_busiest_entity() {
    let env = TestEnv::start(2).await;
    let load = load(&env, &env.names.event_stream);
    let response = load.handle(request("load-post-events.json")).await;
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    assert_eq!(body_json(&response), json!({"accepted": 3}));
    // order-1's "paid" goes only once its "created" is stored (PutRecords keeps no order within a request).
    assert_eq!(env.counter.get("Kinesis.PutRecords"), 2);
    common::assert_only_declared_actions(&env.counter, event_store::load::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "LoadFunction");

    let records = env.read_stream(&env.names.event_stream).await;
    assert_eq!(records.len(), 3);
    let mut order_events: Vec<Envelope> = records
        .iter()
        .filter(|(_, r)| r.partition_key() == Some("order-1"))
        .map(|(_, r)| serde_json::from_slice(r.data().as_ref()).unwrap())
        .collect();
    assert_eq!(order_events.len(), 2, "EntityId in the body is the partition key");
    let first = order_events.remove(0);
    assert_eq!(first.body, Some(json!({"EntityId": "order-1", "type": "created", "total": 42.5})));
    assert_eq!(first.method, "POST");
    assert_eq!(order_events[0].body.as_ref().unwrap()["type"], "paid", "same key keeps order");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_event_at_the_size_limit_is_accepted_and_one_byte_more_is_refused() {
    let env = TestEnv::start(1).await;
    let load = load(&env, &env.names.event_stream);
    let post = |pad: usize| {
        let mut event: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
        event["body"] = json!(json!({"EntityId": "big", "pad": "p".repeat(pad)}).to_string());
        lambda_http::request::from_str(&event.to_string()).unwrap()
    };
    // Find the padding that makes the envelope exactly MAX_EVENT_BYTES (the envelope adds a fixed overhead).
    let probe = load.handle(post(1000)).await;
    assert_eq!(probe.status(), StatusCode::ACCEPTED);
    let records = env.read_stream(&env.names.event_stream).await;
    let overhead = records[0].1.data().as_ref().len() - 1000;
    let at_limit = load.handle(post(DEFAULT_MAX_EVENT_BYTES - overhead)).await;
    assert_eq!(at_limit.status(), StatusCode::ACCEPTED);
    let records = env.read_stream(&env.names.event_stream).await;
    assert_eq!(records[1].1.data().as_ref().len(), DEFAULT_MAX_EVENT_BYTES);
    let over = load.handle(post(DEFAULT_MAX_EVENT_BYTES - overhead + 1)).await;
    assert_eq!(over.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gets_a_short_4xx_and_an_unavailable_stream_a_503() {
    let env = TestEnv::start(1).await;
    let load = load(&env, &env.names.event_stream);
    let post = |body: &str, content_type: &str| {
        let mut event: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
        event["body"] = json!(body);
        event["headers"]["content-type"] = json!(content_type);
        lambda_http::request::from_str(&event.to_string()).unwrap()
    };

    let malformed = load.handle(post("{\"a\": ", "application/json")).await;
    assert_eq!(malformed.status(), StatusCode::BAD_REQUEST);
    assert!(body_json(&malformed)["error"].as_str().unwrap().starts_with("malformed JSON"));

    let wrong_type = load.handle(post("{}", "application/x-www-form-urlencoded")).await;
    assert_eq!(wrong_type.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);

    let big = json!({"blob": "x".repeat(DEFAULT_MAX_EVENT_BYTES)}).to_string();
    assert_eq!(load.handle(post(&big, "application/json")).await.status(), StatusCode::PAYLOAD_TOO_LARGE);

    let too_many = format!("[{}]", vec!["{}"; 501].join(","));
    assert_eq!(load.handle(post(&too_many, "application/json")).await.status(), StatusCode::PAYLOAD_TOO_LARGE);

    let mut unknown: Value = serde_json::from_str(&sample_event("load.json")).unwrap();
    unknown["rawPath"] = json!("/admin");
    let not_found = load.handle(lambda_http::request::from_str(&unknown.to_string()).unwrap()).await;
    assert_eq!(not_found.status(), StatusCode::NOT_FOUND);

    let mut invalid_utf8: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
    invalid_utf8["body"] = json!("/w==");
    invalid_utf8["isBase64Encoded"] = json!(true);
    let invalid_utf8 = load.handle(lambda_http::request::from_str(&invalid_utf8.to_string()).unwrap()).await;
    assert_eq!(invalid_utf8.status(), StatusCode::BAD_REQUEST);
    assert_eq!(body_json(&invalid_utf8)["error"], "body is not valid UTF-8");

    // A pixel hit with a huge query string or header makes an envelope over the limit
    // (API Gateway itself stops request lines and headers over 10 KB; a URI over 64 KB
    // cannot even be represented, so 40 KB against a 16 KiB limit shows the rule).
    let small = Load::new(
        env.kinesis.clone(),
        LoadConfig {
            max_event_bytes: 16 * 1024,
            ip_mode: IpMode::None,
            max_events_per_post: 100,
            ..LoadConfig::new(env.names.event_stream.clone())
        },
    );
    let mut huge_query: Value = serde_json::from_str(&sample_event("load.json")).unwrap();
    huge_query["rawQueryString"] = json!(format!("page={}", "q".repeat(40_000)));
    let huge_query = small.handle(lambda_http::request::from_str(&huge_query.to_string()).unwrap()).await;
    assert_eq!(huge_query.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let mut huge_header: Value = serde_json::from_str(&sample_event("load.json")).unwrap();
    huge_header["headers"]["user-agent"] = json!("u".repeat(40_000));
    let huge_header = small.handle(lambda_http::request::from_str(&huge_header.to_string()).unwrap()).await;
    assert_eq!(huge_header.status(), StatusCode::PAYLOAD_TOO_LARGE);

    assert!(env.read_stream(&env.names.event_stream).await.is_empty(), "nothing was put for bad input");

    let missing_stream = self::load(&env, "no-such-stream");
    let unavailable = missing_stream.handle(request("load.json")).await;
    assert_eq!(unavailable.status(), StatusCode::SERVICE_UNAVAILABLE);
    let message = body_json(&unavailable)["error"].as_str().unwrap().to_owned();
    assert_eq!(message, "event stream unavailable, retry later", "no internals leak");
}

#[tokio::test(flavor = "multi_thread")]
async fn posted_arrays_keep_each_entitys_order_when_puts_are_throttled() {
    use event_store_fault_proxy::{Config, Fault};
    let env = TestEnv::start(2).await;
    let only: &'static [Fault] = &[Fault::PartialPutRecords, Fault::ProvisionedThroughputExceeded];
    let (faulty, proxy) = common::through_faults(&env, Config { seed: 11, rate: 0.5, only: Some(only) }).await;
    let config = LoadConfig {
        max_events_per_post: 100,
        ip_mode: IpMode::None,
        ..LoadConfig::new(env.names.event_stream.clone())
    };
    let load = Load::new(faulty, config);
    let mut accepted = 0;
    for post in 0..20 {
        let events: Vec<Value> =
            (0..30).map(|i| json!({"EntityId": format!("order-{}", i % 3), "n": post * 30 + i})).collect();
        let mut event: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
        event["body"] = json!(Value::Array(events).to_string());
        let response = load.handle(lambda_http::request::from_str(&event.to_string()).unwrap()).await;
        accepted += body_json(&response)["accepted"].as_u64().unwrap();
    }
    println!("faults: {:?}; {accepted} of 600 accepted", proxy.counts());
    assert!(proxy.counts().get("faults").copied().unwrap_or(0) > 0);
    let mut by_entity: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for (_, record) in env.read_stream(&env.names.event_stream).await {
        let envelope: Envelope = serde_json::from_slice(record.data().as_ref()).unwrap();
        let body = envelope.body.unwrap();
        by_entity.entry(record.partition_key().unwrap().to_owned()).or_default().push(body["n"].as_i64().unwrap());
    }
    assert_eq!(by_entity.values().map(Vec::len).sum::<usize>() as u64, accepted, "what was accepted, once");
    for (entity, ns) in by_entity {
        let mut sorted = ns.clone();
        sorted.sort();
        assert_eq!(ns, sorted, "{entity}: stored in the order posted");
    }
}

/// Event ids and partition keys of the events the buffer table holds: what the log will hold.
async fn buffered_ids(env: &TestEnv) -> Vec<String> {
    let mut ids = Vec::new();
    for item in env.scan_table(&env.names.buffer_table).await {
        for event in event_store::buffer_item::BufferItem::from_item(item).unwrap().events().unwrap() {
            let envelope: Envelope = serde_json::from_slice(&event.data).unwrap();
            let client = envelope.query.get("EventId").and_then(|v| v.first()).cloned();
            let client = client.or_else(|| envelope.body.as_ref()?.get("EventId")?.as_str().map(str::to_owned));
            ids.push(client.unwrap_or_else(|| format!("n={}", envelope.body.as_ref().unwrap()["n"])));
        }
    }
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_post_answers_429_naming_what_was_not_stored_and_a_retry_by_event_id_is_one_event() {
    use event_store_fault_proxy::{Config, Fault};
    let env = TestEnv::start(2).await;
    let none: &'static [Fault] = &[];
    let (faulty, proxy) = common::through_faults(&env, Config { seed: 5, rate: 0.0, only: Some(none) }).await;
    let config = LoadConfig { ip_mode: IpMode::None, ..LoadConfig::new(env.names.event_stream.clone()) };
    let load = Load::new(faulty, config);
    let post = |events: Value| {
        let mut event: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
        event["body"] = json!(events.to_string());
        lambda_http::request::from_str(&event.to_string()).unwrap()
    };
    let pixel = |id: &str| {
        let mut event: Value = serde_json::from_str(&sample_event("load.json")).unwrap();
        event["rawQueryString"] = json!(format!("EventId={id}&page=home"));
        event["queryStringParameters"] = json!({"EventId": id, "page": "home"});
        lambda_http::request::from_str(&event.to_string()).unwrap()
    };
    let pump_all = || async {
        let pump = common::pump(&env);
        for batch in env.event_source_batches().await {
            assert!(pump.handle(batch).await.batch_item_failures.is_empty());
        }
    };

    // One key's shard refuses: the post says which events were not stored and when to come back.
    proxy.refuse_partition_key("hot");
    let events = json!([
        {"EventId": "evt-1", "EntityId": "hot", "n": 1},
        {"EventId": "evt-2", "EntityId": "cool", "n": 2},
        {"EventId": "evt-3", "n": 3},
        {"n": 4},
    ]);
    // The hot key's second event is held back behind its first (NotSent): still a 429.
    let two_hot =
        load.handle(post(json!([{"EventId": "h-1", "EntityId": "hot"}, {"EventId": "h-2", "EntityId": "hot"}])));
    let two_hot = two_hot.await;
    assert_eq!(two_hot.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body_json(&two_hot)["failed"][1]["error"], "NotSent");
    let refused = load.handle(post(events.clone())).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(refused.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() >= 1);
    let body = body_json(&refused);
    assert_eq!(body["accepted"], 3);
    assert_eq!(
        body["failed"],
        json!([{"index": 0, "EventId": "evt-1", "error": "ProvisionedThroughputExceededException"}]),
        "{body}"
    );
    // Copies before the pump runs (one delivery holds both) and a pixel hit with its id.
    for _ in 0..2 {
        assert_eq!(load.handle(post(json!([{"EventId": "evt-5", "n": 5}]))).await.status(), StatusCode::ACCEPTED);
    }
    assert_eq!(load.handle(pixel("px-1")).await.status(), StatusCode::OK);
    pump_all().await;
    assert_eq!(buffered_ids(&env).await, ["evt-2", "evt-3", "evt-5", "n=4", "px-1"]);

    // The client retries the whole post (and the pixel) later: what was stored is not stored again.
    proxy.accept_partition_key("hot");
    let events = json!([events[0], events[1], events[2]]);
    let retried = load.handle(post(events)).await;
    assert_eq!((retried.status(), body_json(&retried)), (StatusCode::ACCEPTED, json!({"accepted": 3})));
    assert_eq!(load.handle(pixel("px-1")).await.status(), StatusCode::OK);
    assert_eq!(env.read_stream(&env.names.event_stream).await.len(), 10, "the stream holds every copy");
    pump_all().await;
    pump_all().await; // a delivery again: the same records, the same items
    assert_eq!(buffered_ids(&env).await, ["evt-1", "evt-2", "evt-3", "evt-5", "n=4", "px-1"], "each id once");
    // A retry's record that the pump gave up on and a re-drive buffers later is still a copy.
    let pump = common::pump(&env);
    for mut batch in env.event_source_batches().await {
        let mut seen = std::collections::HashSet::new();
        batch.records.retain(|r| {
            let envelope: Envelope = serde_json::from_slice(&r.kinesis.data).unwrap();
            envelope.event_id.is_some() && !seen.insert(envelope.id)
        });
        assert!(pump.buffer_again(batch).await.is_empty());
    }
    assert_eq!(buffered_ids(&env).await, ["evt-1", "evt-2", "evt-3", "evt-5", "n=4", "px-1"], "re-driven");

    // An id in the query of a post would name every event in it: refused.
    let mut in_query: Value = serde_json::from_str(&sample_event("load-post-events.json")).unwrap();
    in_query["rawQueryString"] = json!("EventId=all");
    in_query["queryStringParameters"] = json!({"EventId": "all"});
    let in_query = load.handle(lambda_http::request::from_str(&in_query.to_string()).unwrap()).await;
    assert_eq!(in_query.status(), StatusCode::BAD_REQUEST);
    // A malformed id is refused, never stored under a name the client did not mean.
    for bad in
        [json!({"EventId": ""}), json!({"EventId": 7}), json!({"EventId": "a/b"}), json!({"EventId": "x".repeat(65)})]
    {
        assert_eq!(load.handle(post(bad.clone())).await.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
}
