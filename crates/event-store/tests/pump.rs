//! pump → buffer table, against a real emulator (moto_server, or dynalite + kinesalite with EMULATOR=strict).
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::collections::HashMap;

use common::{kinesis_event, sample_event, TestEnv};
use event_store::buffer_item::BufferItem;
use event_store::chunk::ChunkEvent;
use event_store::config::PumpConfig;
use event_store::pump::Pump;

fn pump(env: &TestEnv, table: &str) -> Pump {
    Pump::new(env.dynamo.clone(), env.kinesis.clone(), PumpConfig::new(table, env.names.event_table.clone()))
}

/// The buffer table's items (chunks), by id.
async fn buffer_items(env: &TestEnv) -> HashMap<String, BufferItem> {
    env.scan_table(&env.names.buffer_table)
        .await
        .into_iter()
        .map(|item| BufferItem::from_item(item).unwrap())
        .map(|b| (b.id.clone(), b))
        .collect()
}

/// The records the buffer holds, by Kinesis event id (a record held twice would be one entry: counted by `buffered_count`).
async fn buffer(env: &TestEnv) -> HashMap<String, ChunkEvent> {
    let events: Vec<ChunkEvent> = buffer_items(env).await.into_values().flat_map(|b| b.events().unwrap()).collect();
    let count = events.len();
    let by_id: HashMap<String, ChunkEvent> = events.into_iter().map(|e| (e.event_id.clone(), e)).collect();
    assert_eq!(by_id.len(), count, "a record buffered twice");
    by_id
}

/// Puts `n` records `{"n": i}` on the event stream in one request, under `keys` partition keys `user-<i % keys>`.
async fn put_on_event_stream(env: &TestEnv, n: usize, keys: usize) {
    let entries: Vec<_> = (0..n)
        .map(|i| {
            aws_sdk_kinesis::types::PutRecordsRequestEntry::builder()
                .partition_key(format!("user-{}", i % keys))
                .data(aws_sdk_kinesis::primitives::Blob::new(format!("{{\"n\":{i}}}")))
                .build()
                .unwrap()
        })
        .collect();
    env.kinesis.put_records().stream_name(&env.names.event_stream).set_records(Some(entries)).send().await.unwrap();
}

/// The event table's quarantine partition (slot -1).
async fn quarantine(env: &TestEnv) -> Vec<HashMap<String, aws_sdk_dynamodb::types::AttributeValue>> {
    let quarantine = aws_sdk_dynamodb::types::AttributeValue::N("-1".into());
    env.scan_table(&env.names.event_table).await.into_iter().filter(|i| i["slot"] == quarantine).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn records_from_the_stream_are_buffered_once_even_when_redelivered() {
    let env = TestEnv::start(2).await;
    let arn = env.stream_arn(&env.names.event_stream).await;
    put_on_event_stream(&env, 60, 7).await;

    let batches = env.event_source_batches().await;
    let pump = pump(&env, &env.names.buffer_table);
    for batch in &batches {
        assert!(pump.handle(batch.clone()).await.batch_item_failures.is_empty());
    }
    let events = buffer(&env).await;
    assert_eq!(events.len(), 60);
    for record in batches.iter().flat_map(|b| &b.records) {
        let event = &events[record.event_id.as_deref().unwrap()];
        assert_eq!(event.data, record.kinesis.data.0, "raw bytes, not base64 text");
        assert_eq!(event.partition_key, record.kinesis.partition_key);
        assert_eq!(event.arrival, record.kinesis.approximate_arrival_timestamp.timestamp_millis());
    }
    let first = buffer_items(&env).await;
    assert!(first.len() < 60, "packed: {} items for 60 records", first.len());
    assert!(first.values().all(|b| b.id.len() == 64 && b.count.is_some()), "chunks under sha256 keys");
    let _ = arn;

    // The event source retries a whole batch (and a bisected half of it): same keys, no new items.
    for batch in &batches {
        let mut half = batch.clone();
        half.records.truncate(batch.records.len() / 2);
        assert!(pump.handle(batch.clone()).await.batch_item_failures.is_empty());
        assert!(pump.handle(half).await.batch_item_failures.is_empty());
    }
    // Only the pump's write time differs.
    let unstamped = |items: HashMap<String, BufferItem>| -> HashMap<String, BufferItem> {
        items.into_iter().map(|(k, b)| (k, BufferItem { buffered_at: None, ..b })).collect()
    };
    assert_eq!(unstamped(buffer_items(&env).await), unstamped(first), "redelivery overwrote, did not duplicate");
}

#[tokio::test(flavor = "multi_thread")]
async fn sample_event_is_buffered_with_json_and_binary_data() {
    let env = TestEnv::start(1).await;
    let event =
        event_store::pump::parse_kinesis_event(serde_json::from_str(&sample_event("pump.json")).unwrap()).unwrap();
    let response = pump(&env, &env.names.buffer_table).handle(event).await;
    assert!(response.batch_item_failures.is_empty());
    let items = buffer(&env).await;
    let mut data: Vec<Vec<u8>> = items.values().map(|e| e.data.clone()).collect();
    data.sort();
    assert_eq!(data, vec![b"\x00\xff\x10not json".to_vec(), br#"{"id":"1b4e8c60","path":"/track.gif"}"#.to_vec()]);
    assert!(items.values().all(|b| b.arrival == 1_793_512_724_123 || b.arrival == 1_793_512_724_456));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_of_500_is_packed_into_one_chunk_one_request_and_two_for_the_shard_position() {
    let env = TestEnv::start(1).await;
    let records: Vec<_> =
        (0..500).map(|i| (format!("pk-{}", i % 10), vec![b'x'; 200], 1_795_327_124_000 + i)).collect();
    // From the stack's event stream: the only one the pump's role may read (its shards, when it asks).
    let stream = env.stream_arn(&env.names.event_stream).await;
    // A shard's first batch also looks where an upgraded stack kept its position (slot -2): counted is the next.
    let first = kinesis_event(&stream, &records[..1]);
    assert!(pump(&env, &env.names.buffer_table).handle(first).await.batch_item_failures.is_empty());
    env.counter.reset();
    let event = kinesis_event(&stream, &records[1..]);
    let response = pump(&env, &env.names.buffer_table).handle(event).await;
    assert!(response.batch_item_failures.is_empty());
    let requests = env.counter.service_total("DynamoDB");
    common::assert_only_declared_actions(&env.counter, event_store::pump::AWS_ACTIONS);
    common::assert_allowed_by_the_template(&env.counter, "PumpFunction");
    println!("pump: {requests} DynamoDB requests for 500 events = {:.3} per event", requests as f64 / 500.0);
    assert_eq!(buffer(&env).await.len(), 500);
    assert_eq!(buffer_items(&env).await.len(), 2, "one shard, one slot: one chunk a batch");
    // One BatchWriteItem, and the shard position read and moved once per batch.
    assert!(requests <= 3, "{requests} requests");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_record_that_cannot_be_buffered_is_quarantined_with_its_place_and_the_shard_goes_on() {
    let env = TestEnv::start(1).await;
    let mut records: Vec<_> = (0..30).map(|i| ("pk".to_string(), vec![b'a'; 10], 1_795_327_124_000 + i)).collect();
    let mut rng = fastrand::Rng::with_seed(7);
    records[7].1 = (0..420 * 1024).map(|_| rng.u8(..)).collect(); // random: over DynamoDB's 400 KB item limit even compressed
    let event = kinesis_event("arn:aws:kinesis:us-east-1:123456789012:stream/s", &records);
    // Reported as failed, it would block its shard until the record age limit (hours, with retries
    // without a count limit): it is quarantined instead, and everything else is buffered.
    let response = pump(&env, &env.names.buffer_table).handle(event.clone()).await;
    assert!(response.batch_item_failures.is_empty(), "{:?}", response.batch_item_failures);
    assert_eq!(buffer(&env).await.len(), 29);
    let quarantined = quarantine(&env).await;
    assert_eq!(quarantined.len(), 1);
    let original = quarantined[0]["original"].as_m().unwrap();
    assert_eq!(original["sequence"].as_s().unwrap(), &event.records[7].kinesis.sequence_number);
    assert_eq!(original["bytes"].as_n().unwrap(), &(420 * 1024).to_string());

    // A record without an event id is not one an event source delivers: quarantined, never dropped.
    let mut event = kinesis_event("arn:aws:kinesis:us-east-1:123456789012:stream/s", &records[..3]);
    event.records[1].event_id = None;
    let response = pump(&env, &env.names.buffer_table).handle(event.clone()).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(quarantine(&env).await.len(), 2);

    // A missing table fails every record, by name: nothing is reported as written.
    let event = kinesis_event("arn:aws:kinesis:us-east-1:123456789012:stream/s", &records[..3]);
    let response = pump(&env, "no-such-table").handle(event).await;
    assert_eq!(response.batch_item_failures.len(), 3);
}

/// Why the suite also runs on dynalite: it refuses a 26-item batch as
/// DynamoDB does, where moto accepts it. Our code never sends one (the batch
/// tests count requests), and in strict mode it could not get away with it.
#[tokio::test(flavor = "multi_thread")]
async fn the_strict_emulator_refuses_what_aws_refuses() {
    use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
    let env = TestEnv::start(1).await;
    let writes: Vec<WriteRequest> = (0..26)
        .map(|i| {
            let item = std::collections::HashMap::from([("id".to_string(), AttributeValue::S(format!("k{i}")))]);
            WriteRequest::builder().put_request(PutRequest::builder().set_item(Some(item)).build().unwrap()).build()
        })
        .collect();
    let result = env.dynamo.batch_write_item().request_items(&env.names.buffer_table, writes).send().await;
    let strict = std::env::var("EMULATOR").as_deref() == Ok("strict");
    assert_eq!(result.is_err(), strict, "strict: refused; moto: accepted ({result:?})");
}

#[tokio::test(flavor = "multi_thread")]
async fn arrivals_never_decrease_along_a_shard_even_across_batches() {
    let env = TestEnv::start(1).await;
    let pump = pump(&env, &env.names.buffer_table);
    let t = 1_795_327_124_000;
    let record = |n: i64, arrival: i64| (format!("pk-{}", n % 2), format!("{{\"n\":{n}}}").into_bytes(), arrival);
    // Kinesis does not promise increasing arrival times: 1 and 4 come stamped earlier than their predecessors.
    let first = kinesis_event(common::TEST_ARN, &[record(0, t + 1_000), record(1, t + 990), record(2, t + 1_010)]);
    let second = kinesis_event(common::TEST_ARN, &[record(3, t + 1_020), record(4, t + 1_005)]);
    let sequences: Vec<String> =
        first.records.iter().chain(&second.records).map(|r| r.kinesis.sequence_number.clone()).collect();
    assert!(pump.handle(first.clone()).await.batch_item_failures.is_empty());
    // Upgraded between the batches from the version that kept shard positions in slot -2: the
    // position there still covers what it covered.
    common::as_the_version_before(&env, event_store::bookkeeping::Family::Pump).await;
    env.counter.reset();
    assert!(pump.handle(first.clone()).await.batch_item_failures.is_empty());
    assert_eq!(env.counter.get("DynamoDB.BatchWriteItem"), 0, "delivered again: covered by the old position");
    assert!(pump.handle(second).await.batch_item_failures.is_empty());
    let by_sequence: HashMap<String, i64> = buffer(&env)
        .await
        .into_values()
        .map(|e| (e.event_id.rsplit_once(':').unwrap().1.to_owned(), e.arrival))
        .collect();
    let stored: Vec<i64> = sequences.iter().map(|s| by_sequence[s] - t).collect();
    assert_eq!(stored, vec![1_000, 1_000, 1_010, 1_020, 1_020], "stored order is sequence order");

    // A batch the event source delivers again is already buffered: skipped, nothing rewritten.
    env.counter.reset();
    assert!(pump.handle(first).await.batch_item_failures.is_empty());
    assert_eq!(env.counter.get("DynamoDB.BatchWriteItem"), 0);
}

/// A batch the event source gave up on (its failure record names a shard
/// and a sequence range) is read back from the stream and buffered again,
/// though the shard's position has moved past it; then the scan moves it.
#[tokio::test(flavor = "multi_thread")]
async fn a_batch_given_up_on_is_re_driven_from_its_dead_letter_record() {
    use event_store::pump::rebuffer::{self, DeadLetter, KinesisBatchInfo};
    let env = TestEnv::start(1).await;
    put_on_event_stream(&env, 30, 3).await;
    let delivered = env.event_source_batches().await.remove(0);
    let records = delivered.records.clone();
    let batch = |range: std::ops::Range<usize>| {
        let mut event = delivered.clone();
        event.records = records[range].to_vec();
        event
    };
    // Records 10..20 failed until the record age limit and went to the dead-letter queue;
    // the batches around them were buffered, so the shard's position is past them.
    let pump = pump(&env, &env.names.buffer_table);
    assert!(pump.handle(batch(0..10)).await.batch_item_failures.is_empty());
    assert!(pump.handle(batch(20..30)).await.batch_item_failures.is_empty());
    assert!(pump.handle(batch(10..20)).await.batch_item_failures.is_empty());
    assert_eq!(buffer(&env).await.len(), 20, "the normal path skips them: the position covers them");
    let sequence = |i: usize| records[i].kinesis.sequence_number.clone();
    let letter = DeadLetter {
        batch: KinesisBatchInfo {
            shard_id: records[10].event_id.as_deref().unwrap().split(':').next().unwrap().to_owned(),
            start_sequence_number: sequence(10),
            end_sequence_number: sequence(19),
            stream_arn: env.stream_arn(&env.names.event_stream).await,
            batch_size: Some(10),
        },
    };
    let body = serde_json::json!({
        "requestContext": {"condition": "RecordAgeExceeded", "approximateInvokeCount": 120},
        "version": "1.0",
        "timestamp": "2026-11-22T05:00:00.000Z",
        "KinesisBatchInfo": letter.batch,
    })
    .to_string();
    if std::env::var("EMULATOR").as_deref() == Ok("strict") {
        // No SQS beside dynalite and kinesalite: the message as the command would read it.
        let redriven = rebuffer::rebuffer(&env.kinesis, &pump, &DeadLetter::parse(&body).unwrap()).await.unwrap();
        assert_eq!((redriven.records, redriven.failed.len()), (10, 0));
    } else {
        let sqs = aws_sdk_sqs::Client::from_conf(aws_sdk_sqs::config::Builder::from(&env.sdk).build());
        let queue = sqs.create_queue().queue_name("pump-dlq").send().await.unwrap().queue_url.unwrap();
        sqs.send_message().queue_url(&queue).message_body(&body).send().await.unwrap();
        sqs.send_message().queue_url(&queue).message_body("{\"not\": \"a failure record\"}").send().await.unwrap();
        let drained = rebuffer::drain_queue(&sqs, &queue, &env.kinesis, &pump).await.unwrap();
        assert_eq!((drained.messages, drained.records, drained.left), (1, 10, 1), "{drained:?}");
    }
    assert_eq!(buffer(&env).await.len(), 30, "all buffered, none twice");
    let scan_config = event_store_emulator::runs::scan_config(&env.names);
    let schedule = serde_json::from_str(&sample_event("scan.json")).unwrap();
    let deadline = event_store_emulator::runs::deadline_in(std::time::Duration::from_secs(900));
    let runs =
        event_store_emulator::runs::run_scan(env.dynamo.clone(), env.kinesis.clone(), scan_config, schedule, deadline);
    assert_eq!(runs.await.into_iter().map(|r| r.unwrap().moved).sum::<usize>(), 30);
}

/// Item 15 of issue 13 supposed that records redelivered after a partial
/// batch failure are counted late. They are not: until the shard's position
/// passes the first failed record, the scan's look at the stream holds the
/// watermark at that record's arrival, and every record after it (already
/// buffered and moved, or not) arrives no earlier.
#[tokio::test(flavor = "multi_thread")]
async fn records_redelivered_after_a_partial_batch_failure_are_not_counted_late() {
    let env = TestEnv::start(1).await;
    // One record a request, so that (with 1 ms slots in the pump) each is a chunk of its own, and
    // 60 chunks take three BatchWriteItem requests.
    for i in 0..60 {
        let data = aws_sdk_kinesis::primitives::Blob::new(format!("{{\"n\":{i}}}"));
        let put = env.kinesis.put_record().stream_name(&env.names.event_stream);
        put.partition_key(format!("user-{}", i % 3)).data(data).send().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let delivered = env.event_source_batches().await.remove(0);
    let arn = env.stream_arn(&env.names.event_stream).await;
    let events = delivered
        .records
        .iter()
        .map(|r| event_store::pump::chunk_event(r, r.kinesis.approximate_arrival_timestamp.timestamp_millis()))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let (chunks, _) = event_store::pump::buffer_chunks(&arn, events, 1, 0);
    assert_eq!(chunks.len(), 60, "arrivals a millisecond apart at least");
    let first_key = chunks[0].0.id.clone();
    // The request holding the first record fails: the other 35 records are written, all 60 are redelivered.
    let failing = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk)
            .interceptor(common::FailRequests::new(move |body, _| {
                body.windows(first_key.len()).any(|w| w == first_key.as_bytes())
            }))
            .build(),
    );
    let config = PumpConfig {
        time_unit_ms: 1,
        ..PumpConfig::new(env.names.buffer_table.clone(), env.names.event_table.clone())
    };
    let fast = event_store::batch::Backoff {
        base: std::time::Duration::from_millis(1),
        cap: std::time::Duration::from_millis(2),
        max_attempts: 2,
    };
    let partial = Pump::new(failing, env.kinesis.clone(), config).with_backoff(fast);
    assert_eq!(partial.handle(delivered.clone()).await.batch_item_failures.len(), 60);
    assert_eq!(buffer(&env).await.len(), 35);
    let scan = || {
        let schedule = serde_json::from_str(&sample_event("scan.json")).unwrap();
        let deadline = event_store_emulator::runs::deadline_in(std::time::Duration::from_secs(900));
        let config = event_store_emulator::runs::scan_config(&env.names);
        event_store_emulator::runs::run_scan(env.dynamo.clone(), env.kinesis.clone(), config, schedule, deadline)
    };
    let first: Vec<_> = scan().await.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(first.iter().map(|s| s.moved).sum::<usize>(), 35, "the records after the failure are moved");
    // The event source delivers the batch again; this time it is written, then moved.
    let config = PumpConfig {
        time_unit_ms: 1,
        ..PumpConfig::new(env.names.buffer_table.clone(), env.names.event_table.clone())
    };
    let pump = Pump::new(env.dynamo.clone(), env.kinesis.clone(), config);
    assert!(pump.handle(delivered).await.batch_item_failures.is_empty());
    let second: Vec<_> = scan().await.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(second.iter().map(|s| s.moved).sum::<usize>(), 60);
    assert_eq!(first.iter().chain(&second).map(|s| s.late).sum::<usize>(), 0, "nothing counted late");
}

/// Copies of entity events (a relay put that was applied but answered with an
/// error, two relays racing on one stream) are dropped by the pump by stream
/// and version, however late they come: an hour later, in another batch, the
/// buffer still holds each version once, and the stream's logged position
/// says how far it got (issue 26, item 1).
#[tokio::test(flavor = "multi_thread")]
async fn the_pump_drops_copies_of_entity_versions_however_late_they_come() {
    use event_store::envelope::{entity_event_id, entity_key};
    let env = TestEnv::start(1).await;
    let pump = common::pump(&env);
    let record = |stream: &str, version: u64, arrival: i64| {
        let data = serde_json::json!({"id": entity_event_id(stream, version), "received_at": "t", "method": "POST",
                                      "body": {"stream": stream, "version": version}});
        (entity_key(stream), data.to_string().into_bytes(), arrival)
    };
    let hour = 3_600_000;
    let t = 1_795_000_000_000;
    let batches = [
        vec![record("a", 0, t), record("a", 1, t + 1), record("b", 0, t + 2), record("a", 1, t + 3)],
        // An hour later: copies of versions already logged, among new ones; an ingest event alike.
        vec![
            record("a", 0, t + hour),
            record("a", 2, t + hour + 1),
            record("b", 0, t + hour + 2),
            record("b", 1, t + hour + 3),
        ],
        vec![("user-1".to_owned(), br#"{"id": "x/1", "method": "GET"}"#.to_vec(), t + hour + 4)],
    ];
    for batch in &batches {
        let response = pump.handle(kinesis_event(common::TEST_ARN, batch)).await;
        assert!(response.batch_item_failures.is_empty(), "{response:?}");
    }
    let mut versions: Vec<(String, u64)> = buffer(&env)
        .await
        .into_values()
        .filter_map(|e| {
            let value: serde_json::Value = serde_json::from_slice(&e.data).ok()?;
            let body = value.get("body")?;
            Some((body["stream"].as_str()?.to_owned(), body["version"].as_u64()?))
        })
        .collect();
    versions.sort();
    let expected = [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1)].map(|(s, v)| (s.to_owned(), v));
    assert_eq!(versions, expected, "each version once");
    assert_eq!(common::buffered_events(&env).await, 6, "the five versions and the ingest event");
    let logged =
        event_store::bookkeeping::entity_positions::Positions::new(env.dynamo.clone(), env.names.entity_table.clone())
            .logged(&["a", "b"])
            .await
            .unwrap();
    assert_eq!(logged, HashMap::from([("a".to_owned(), 2), ("b".to_owned(), 1)]));
}

/// A delivery whose shard position was not saved comes again: its entity
/// versions are logged by then, yet the pump keeps the records it kept the
/// first time, so the chunk it writes again under the same key still holds
/// them (before, it dropped them as copies and the chunk lost them).
#[tokio::test(flavor = "multi_thread")]
async fn a_delivery_made_again_after_its_position_was_lost_keeps_its_entity_events() {
    use event_store::envelope::{entity_event_id, entity_key};
    let env = TestEnv::start(1).await;
    let t = 1_795_000_000_000;
    let hit = |n: u64, arrival: i64| ("user-1".to_owned(), format!("{{\"n\":{n}}}").into_bytes(), arrival);
    let entity = |version: u64, arrival: i64| {
        let data = serde_json::json!({"id": entity_event_id("a", version), "received_at": "t", "method": "POST",
                                      "body": {"stream": "a", "version": version}});
        (entity_key("a"), data.to_string().into_bytes(), arrival)
    };
    let event = kinesis_event(common::TEST_ARN, &[hit(0, t), entity(0, t + 1), entity(1, t + 2), hit(1, t + 3)]);
    // The chunk is written and the versions logged; the shard position's update fails.
    let failing = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk)
            .interceptor(common::FailRequests::new(|body, _| body.windows(16).any(|w| w == b"sequence_key < :")))
            .build(),
    );
    let config = PumpConfig {
        entity_table: Some(env.names.entity_table.clone()),
        ..PumpConfig::new(env.names.buffer_table.clone(), env.names.event_table.clone())
    };
    let first = Pump::new(failing, env.kinesis.clone(), config).handle(event.clone()).await;
    assert_eq!(first.batch_item_failures.len(), 4, "handed back whole");
    assert_eq!(common::buffered_events(&env).await, 4);
    let second = common::pump(&env).handle(event.clone()).await;
    assert!(second.batch_item_failures.is_empty(), "{second:?}");
    assert_eq!(common::buffered_events(&env).await, 4, "the chunk written again still holds both versions");
    // Once the position is saved, a later copy of a logged version is still dropped.
    let copy = kinesis_event(common::TEST_ARN, &[entity(1, t + 4), hit(2, t + 5)]);
    assert!(common::pump(&env).handle(copy).await.batch_item_failures.is_empty());
    assert_eq!(common::buffered_events(&env).await, 5, "the copy of version 1 dropped, the hit kept");
}

/// Waits until the event stream is active again (after a split or a merge) and returns its shards.
async fn shards_when_active(env: &TestEnv) -> Vec<aws_sdk_kinesis::types::Shard> {
    for _ in 0..100 {
        let summary = env.kinesis.describe_stream_summary().stream_name(&env.names.event_stream).send().await.unwrap();
        let status = summary.stream_description_summary().unwrap().stream_status().clone();
        if status == aws_sdk_kinesis::types::StreamStatus::Active {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    event_store::kinesis::list_shards(&env.kinesis, &env.names.event_stream).await.unwrap()
}

/// The arrival each record (by its data) was buffered with.
async fn buffered_arrivals(env: &TestEnv) -> HashMap<String, i64> {
    buffer(env).await.into_values().map(|e| (String::from_utf8(e.data).unwrap(), e.arrival)).collect()
}

/// Issue 27, item 11: a key's first record in a child shard never sorts
/// before its last record in the parent, however Kinesis' arrival clock
/// went: a child starts from its parents' positions (both, after a merge).
#[tokio::test(flavor = "multi_thread")]
async fn a_child_shard_goes_on_from_its_parents_arrivals_after_a_split_and_a_merge() {
    let env = TestEnv::start(1).await;
    let arn = env.stream_arn(&env.names.event_stream).await;
    let pump = common::pump(&env);
    let t = 1_790_000_000_000;
    let record = |data: &str, at: i64| ("k".to_owned(), data.as_bytes().to_vec(), t + at);
    let parent = "shardId-000000000000";
    // The parent's last record came with an earlier arrival than the one before it: stored at t + 100.
    let batch = common::kinesis_event_on(&arn, parent, &[record("p0", 100), record("p1", 40)]);
    assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    env.kinesis
        .split_shard()
        .stream_name(&env.names.event_stream)
        .shard_to_split(parent)
        .new_starting_hash_key("170141183460469231731687303715884105728")
        .send()
        .await
        .unwrap();
    let children: Vec<String> = shards_when_active(&env)
        .await
        .iter()
        .filter(|s| s.parent_shard_id() == Some(parent))
        .map(|s| s.shard_id().to_owned())
        .collect();
    assert_eq!(children.len(), 2, "a split makes two children");
    // The key's first record in its child arrived (by the clock) before the parent's last was stored.
    let batch = common::kinesis_event_on(&arn, &children[0], &[record("c0", 60), record("c1", 200)]);
    assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    let batch = common::kinesis_event_on(&arn, &children[1], &[record("d0", 90)]);
    assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    let arrivals = buffered_arrivals(&env).await;
    assert_eq!((arrivals["p0"], arrivals["p1"]), (t + 100, t + 100));
    assert_eq!((arrivals["c0"], arrivals["c1"], arrivals["d0"]), (t + 100, t + 200, t + 100), "{arrivals:?}");
    let (p1, c0) = (arrivals["p1"], arrivals["c0"]);
    assert!(p1 < c0 || (p1 == c0 && parent < children[0].as_str()), "the sort key orders child after parent");

    // Merged again: the new shard goes on from the later of its two parents.
    env.kinesis
        .merge_shards()
        .stream_name(&env.names.event_stream)
        .shard_to_merge(&children[0])
        .adjacent_shard_to_merge(&children[1])
        .send()
        .await
        .unwrap();
    let merged = shards_when_active(&env)
        .await
        .into_iter()
        .find(|s| s.adjacent_parent_shard_id().is_some())
        .expect("the merged shard names both parents");
    let batch = common::kinesis_event_on(&arn, merged.shard_id(), &[record("m0", 150)]);
    assert!(pump.handle(batch).await.batch_item_failures.is_empty());
    assert_eq!(buffered_arrivals(&env).await["m0"], t + 200, "the later parent's last arrival is the floor");
}

/// Issue 27, item 12: records the event source gave up on and a re-drive
/// buffers again get the arrivals (so the sort keys) they were first given,
/// so one stored ahead of the failure is the same event to readers, not a second.
#[tokio::test(flavor = "multi_thread")]
async fn re_driven_records_get_the_arrivals_they_were_first_stored_with() {
    let env = TestEnv::start(1).await;
    let t = 1_790_000_000_000;
    let record = |data: &str, at: i64| ("k".to_owned(), data.as_bytes().to_vec(), t + at);
    let pump = common::pump(&env);
    let first = kinesis_event(common::TEST_ARN, &[record("a0", 1_000)]);
    assert!(pump.handle(first).await.batch_item_failures.is_empty());
    // The next batch's records came with earlier arrivals (stored at t + 1000), and the buffer
    // table refuses their writes: the event source gets them back, and later gives them up.
    let handed_back = kinesis_event(common::TEST_ARN, &[record("b0", 50), record("b1", 2_000), record("b2", 60)]);
    let buffer_table = env.names.buffer_table.clone();
    let writes_to_buffer = move |body: &[u8], _| body.windows(buffer_table.len()).any(|w| w == buffer_table.as_bytes());
    let failing = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&env.sdk)
            .interceptor(common::FailRequests::new(writes_to_buffer))
            .build(),
    );
    let fast = event_store::batch::Backoff {
        base: std::time::Duration::from_millis(1),
        cap: std::time::Duration::from_millis(2),
        max_attempts: 2,
    };
    let config = PumpConfig::new(env.names.buffer_table.clone(), env.names.event_table.clone());
    let refused = Pump::new(failing, env.kinesis.clone(), config).with_backoff(fast);
    assert_eq!(refused.handle(handed_back.clone()).await.batch_item_failures.len(), 3);
    // Later records of the shard are buffered: its position moves past the ones given up on.
    let later = kinesis_event(common::TEST_ARN, &[record("c0", 3_000)]);
    assert!(pump.handle(later).await.batch_item_failures.is_empty());
    assert!(pump.buffer_again(handed_back).await.is_empty());
    let arrivals = buffered_arrivals(&env).await;
    assert_eq!(
        (arrivals["b0"], arrivals["b1"], arrivals["b2"]),
        (t + 1_000, t + 2_000, t + 2_000),
        "as the pump first gave them: {arrivals:?}"
    );
}
