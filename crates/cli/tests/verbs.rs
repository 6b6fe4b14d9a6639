//! `event-store playback`, `subscription …` and `tail` as a user runs them:
//! the binary against a real emulator on a free port, on events that went
//! through the pump and the scan like any other.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;
use event_store::archiver::Archiver;
use event_store::config::{ArchiveConfig, PumpConfig, ScanConfig};
use event_store::crypto::subject_hash;
use event_store::privacy::keys::Keys;
use event_store::privacy::maker::Maker;
use event_store::pump::Pump;
use event_store_emulator::resources::{create_subject_key, LOCAL_SUBJECT_HASH_KEY};
use event_store_emulator::runs::{deadline_in, run_scan, scan_config};
use serde_json::{json, Value};

/// Runs `event-store args` against the local stack on `port`, the user's own AWS settings cleared.
fn event_store(args: &[&str], port: u16) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_event-store"));
    for name in ["AWS_ENDPOINT_URL", "AWS_PROFILE", "EVENT_STORE_STACK", "STAGE", "TIME_UNIT"] {
        command.env_remove(name);
    }
    command.args(args).env("EMULATOR_PORT", port.to_string()).output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).trim().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn subscriptions_are_managed_and_the_complete_log_is_followed_from_the_command_line() {
    let stack = common::LocalStack::start().await;
    let moto = &stack.moto;
    let (dynamo, kinesis, names) = (stack.dynamo.clone(), stack.kinesis.clone(), stack.names.clone());

    // Four events through the event stream, the pump and a scan pass: three clicks and a view.
    let before = event_store::time::format_ms(event_store::time::now_ms() - 1000);
    for (i, kind) in ["click", "view", "click", "click"].iter().enumerate() {
        let data = serde_json::to_vec(&json!({"kind": kind, "n": i})).unwrap();
        let put = kinesis.put_record().stream_name(&names.event_stream).partition_key(format!("k{i}"));
        put.data(aws_sdk_kinesis::primitives::Blob::new(data)).send().await.unwrap();
    }
    let summary = kinesis.describe_stream_summary().stream_name(&names.event_stream).send().await.unwrap();
    let arn = summary.stream_description_summary().unwrap().stream_arn().to_owned();
    let shard = "shardId-000000000000";
    let iterator = kinesis
        .get_shard_iterator()
        .stream_name(&names.event_stream)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .unwrap();
    let read = event_store::kinesis::get_records(&kinesis, iterator.shard_iterator().unwrap().to_owned(), 100);
    let records = read.await.unwrap().records().to_vec();
    assert_eq!(records.len(), 4);
    let pump = Pump::new(dynamo.clone(), kinesis.clone(), PumpConfig::new(&names.buffer_table, &names.event_table));
    let answer = pump.handle(event_store::kinesis::lambda_event(&arn, shard, "us-east-1", &records)).await;
    assert!(answer.batch_item_failures.is_empty());
    // Past the events' slot, so the pass completes it.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let scan = ScanConfig { segments: 1, ..scan_config(&names) };
    for pass in run_scan(dynamo.clone(), kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(60))).await {
        pass.unwrap();
    }

    // tail: the clicks, in arrival order, one played record a line; --count ends it.
    let tail = event_store(&["tail", "--from", "beginning", "--filter", "/kind=click", "--count", "3"], moto.port);
    assert_eq!(tail.status.code(), Some(0), "{}", stderr(&tail));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&tail.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ns: Vec<i64> = lines.iter().map(|l| l["data"]["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, [0, 2, 3], "{lines:?}");
    assert!(stderr(&tail).ends_with("3 events"), "{}", stderr(&tail));

    // playback: the window up to the complete end, onto the stage's playback stream, then said done.
    let watermark = event_store::bookkeeping::watermark::read(&dynamo, &names.event_table).await.unwrap();
    let sealed = event_store::time::format_ms(watermark.complete_end(1000).unwrap());
    let window = ["--start", before.as_str(), "--end", sealed.as_str(), "--filter", "/kind=click"];
    let played = event_store(&[&["playback"], &window[..]].concat(), moto.port);
    assert_eq!(played.status.code(), Some(0), "{}", stderr(&played));
    let said = String::from_utf8_lossy(&played.stdout);
    assert!(said.starts_with("played back 3 events from "), "{said}");
    assert!(said.contains("events per 1 s") && said.contains('█'), "the sparkline: {said}");
    let on_stream: usize = read_all(&kinesis, &names.playback_stream).await;
    assert_eq!(on_stream, 3, "the three clicks on the playback stream");
    let again = event_store(&[&["--json", "playback"], &window[..]].concat(), moto.port);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    let again: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!((again["status"].as_str(), again["events"].as_u64()), (Some("already_done"), Some(3)), "{again}");
    let two_days_on = event_store::time::format_ms(event_store::time::now_ms() + 48 * 3_600_000);
    let future = event_store(&["playback", "--start", &before, "--end", &two_days_on], moto.port);
    assert_eq!(future.status.code(), Some(2), "over PLAYBACK_MAX_HOURS: {}", stderr(&future));
    let incomplete = event_store::time::format_ms(event_store::time::now_ms() + 3_600_000);
    let waiting = event_store(&["playback", "--start", &before, "--end", &incomplete], moto.port);
    assert_eq!(waiting.status.code(), Some(1), "past the watermark: {}", stderr(&waiting));
    assert!(String::from_utf8_lossy(&waiting.stdout).contains("is not complete yet"));

    // subscription: create, list, pause, delete, as the function's actions answer them.
    let target = format!("kinesis:{}", names.playback_stream);
    let created = event_store(
        &["subscription", "create", "clicks", "--target", &target, "--start", "beginning", "--partitions", "2"],
        moto.port,
    );
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    let list = || -> Value {
        let listed = event_store(&["subscription", "list"], moto.port);
        serde_json::from_slice::<Value>(&listed.stdout).unwrap()["subscriptions"].clone()
    };
    let listed = list();
    let names_listed: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names_listed, ["clicks"], "{listed}");
    assert_eq!(listed[0]["partitions"].as_array().map(Vec::len), Some(2), "{listed}");
    let paused = event_store(&["subscription", "pause", "clicks"], moto.port);
    assert_eq!(paused.status.code(), Some(0), "{}", stderr(&paused));
    let listed = list();
    assert_eq!(listed[0]["state"], "paused", "{listed}");

    // Bad input: one line each, exit 2 before the store is asked (nothing created), or the
    // store's refusal with exit 4.
    for (args, expected) in [
        (
            vec!["subscription", "create", "x", "--target", "sqs:q"],
            "error: a target is kinesis:<stream> or lambda:<function>, not \"sqs:q\"",
        ),
        (
            vec!["subscription", "create", "x", "--target", &target, "--on-poison", "skip"],
            "error: --on-poison is park or stop, not \"skip\"",
        ),
        (
            vec!["tail", "--filter", "kind"],
            "error: bad input: a filter is POINTER=VALUE, e.g. /path=/track.gif, not \"kind\"",
        ),
    ] {
        let refused = event_store(&args, moto.port);
        assert_eq!((refused.status.code(), stderr(&refused).as_str()), (Some(2), expected), "{args:?}");
    }
    let hour_on = event_store::time::format_ms(event_store::time::now_ms() + 3_600_000);
    for (args, expected) in [
        (vec!["tail", "--from", "someday"], "--from \"someday\""),
        (
            vec!["subscription", "create", "x", "--target", &target, "--partitions", "1025"],
            "partitions must be 1 to 1024",
        ),
        (vec!["subscription", "create", "x", "--target", &target, "--start", &hour_on], "future"),
        (vec!["subscription", "reset", "clicks", "--to", "someday"], "someday"),
    ] {
        let refused = event_store(&args, moto.port);
        let said = stderr(&refused);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.starts_with("error: ") && said.contains(expected) && said.lines().count() == 1,
            "{args:?}: {said}"
        );
    }
    let unknown = event_store(&["subscription", "pause", "no-such"], moto.port);
    assert_eq!(unknown.status.code(), Some(4), "{}", stderr(&unknown));
    assert_eq!(stderr(&unknown).lines().count(), 1, "{}", stderr(&unknown));
    let listed = list();
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "nothing created by a refused create: {listed}");

    let deleted = event_store(&["subscription", "delete", "clicks"], moto.port);
    assert_eq!(deleted.status.code(), Some(0), "{}", stderr(&deleted));
    let listed = list();
    assert_eq!(listed, json!([]));

    // projection and view: a projection is created, listed, queried and deleted; its
    // subscription is not the user's to delete; bad options are refused before the store is asked.
    let created = event_store(&["projection", "create", "kinds", "--kind", "count", "--by", "type"], moto.port);
    assert_eq!(created.status.code(), Some(0), "{}", stderr(&created));
    let created: Value = serde_json::from_slice(&created.stdout).unwrap();
    assert_eq!(created["subscription"], "view.kinds.v1", "{created}");
    let projections: Value = serde_json::from_slice(&event_store(&["projection", "list"], moto.port).stdout).unwrap();
    assert_eq!(projections["projections"][0]["projection"]["name"], "kinds", "{projections}");
    let page = event_store(&["view", "kinds", "--prefix", "day/"], moto.port);
    assert_eq!(page.status.code(), Some(0), "{}", stderr(&page));
    let page: Value = serde_json::from_slice(&page.stdout).unwrap();
    assert_eq!((page["items"].clone(), page["version"].clone()), (json!([]), json!(1)), "{page}");
    assert!(page["position"]["partitions"].is_array(), "{page}");
    let one: Value = serde_json::from_slice(&event_store(&["view", "kinds", "day/x/click"], moto.port).stdout).unwrap();
    assert_eq!(one["item"], Value::Null, "{one}");
    let alone = event_store(&["subscription", "delete", "view.kinds.v1"], moto.port);
    assert_eq!(alone.status.code(), Some(4), "{}", stderr(&alone));
    assert!(stderr(&alone).contains("projection"), "{}", stderr(&alone));
    for args in [vec!["projection", "create", "x", "--kind", "count"], vec!["view", "kinds", "k", "--limit", "5"]] {
        let refused = event_store(&args, moto.port);
        assert_eq!(refused.status.code(), Some(2), "{args:?}: {}", stderr(&refused));
    }
    let deleted = event_store(&["projection", "delete", "kinds"], moto.port);
    assert_eq!(deleted.status.code(), Some(0), "{}", stderr(&deleted));
    let gone = event_store(&["view", "kinds"], moto.port);
    assert_eq!(gone.status.code(), Some(4), "{}", stderr(&gone));
    assert_eq!(list(), json!([]), "the projection's subscription went with it");

    // redrive: a failure record for the four records (buffered again under the same keys) and a
    // message that is none; the local stack has no queue of its own, so it is named.
    let sqs = aws_sdk_sqs::Client::new(&stack.sdk);
    let queue = sqs.create_queue().queue_name("pump-dlq").send().await.unwrap().queue_url.unwrap();
    let letter = json!({
        "requestContext": {"condition": "RecordAgeExceeded", "approximateInvokeCount": 120},
        "version": "1.0",
        "timestamp": "2026-11-27T05:00:00.000Z",
        "KinesisBatchInfo": {
            "shardId": shard, "startSequenceNumber": records[0].sequence_number(),
            "endSequenceNumber": records[3].sequence_number(), "streamArn": arn, "batchSize": 4,
        },
    });
    sqs.send_message().queue_url(&queue).message_body(letter.to_string()).send().await.unwrap();
    sqs.send_message().queue_url(&queue).message_body("{\"not\": \"a failure record\"}").send().await.unwrap();
    let unnamed = event_store(&["redrive", "--pump"], moto.port);
    assert_eq!(unnamed.status.code(), Some(2), "{}", stderr(&unnamed));
    assert!(stderr(&unnamed).contains("--queue"), "{}", stderr(&unnamed));
    let whose = event_store(&["redrive", "--queue", &queue], moto.port);
    assert_eq!(whose.status.code(), Some(2), "{}", stderr(&whose));
    let redriven = event_store(&["redrive", "--pump", "--queue", &queue], moto.port);
    let said = String::from_utf8_lossy(&redriven.stdout);
    assert_eq!(redriven.status.code(), Some(1), "one message left: {said} {}", stderr(&redriven));
    assert_eq!(
        said.trim(),
        "pump dead-letter queue: drained 1 messages (4 records buffered again); 1 left in the queue"
    );
    let scan = ScanConfig { segments: 1, ..scan_config(&names) };
    let moved: usize = run_scan(dynamo.clone(), kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(60)))
        .await
        .into_iter()
        .map(|pass| pass.unwrap().moved)
        .sum();
    assert_eq!(moved, 4, "buffered again, moved again under the same keys");
    let all = event_store(&["--json", "playback", "--start", &before], moto.port);
    assert_eq!(all.status.code(), Some(0), "{}", stderr(&all));
    let all: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert_eq!(all["events"].as_u64(), Some(4), "still four events, none twice: {all}");

    // The cold tier: the four events archived to the stage's bucket; tail reads them from there, and
    // verify checks the chain against S3, then finds the object altered (exit 1).
    let bucket = event_store::archive::object::Bucket::new(&stack.sdk, names.archive_bucket.clone());
    let nothing = event_store(&["verify"], moto.port);
    let said = String::from_utf8_lossy(&nothing.stdout);
    assert_eq!(nothing.status.code(), Some(0), "{said} {}", stderr(&nothing));
    assert!(said.contains("nothing is archived yet") && !said.contains("intact"), "{said}");
    let mut config = ArchiveConfig::for_names(names.event_table.clone(), bucket.name.clone()).unwrap();
    config.hot_retention = Duration::from_millis(1);
    let archiver = Archiver { dynamo: dynamo.clone(), bucket: bucket.clone(), config };
    let now = event_store::time::now_ms();
    let archived = archiver.run(now, std::time::Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert_eq!((archived.objects, archived.events), (1, 4), "{archived:?}");
    let tail = event_store(&["tail", "--from", "beginning", "--filter", "/kind=click", "--count", "3"], moto.port);
    assert_eq!(tail.status.code(), Some(0), "{}", stderr(&tail));
    let ns: Vec<i64> = String::from_utf8_lossy(&tail.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap()["data"]["n"].as_i64().unwrap())
        .collect();
    assert_eq!(ns, [0, 2, 3], "the same clicks, now from S3");
    let verified = event_store(&["verify"], moto.port);
    let said = String::from_utf8_lossy(&verified.stdout);
    assert_eq!(verified.status.code(), Some(0), "{said} {}", stderr(&verified));
    assert!(said.contains(": 1 objects (4 events) for ") && said.trim_end().ends_with("the chain is intact"), "{said}");
    let entry = event_store::archive::store::entries_from(&dynamo, &names.event_table, 0).await.unwrap().remove(0);
    let s3 = &bucket.s3;
    s3.put_object().bucket(&bucket.name).key(&entry.key).body(b"altered".to_vec().into()).send().await.unwrap();
    let broken = event_store(&["verify", "--from", "beginning", "--to", "now"], moto.port);
    let said = String::from_utf8_lossy(&broken.stdout);
    assert_eq!(broken.status.code(), Some(1), "{said} {}", stderr(&broken));
    assert!(
        said.contains(&format!("BROKEN after 0 good objects: entry 0: object {} is not what was archived", entry.key)),
        "{said}"
    );
    let backwards = event_store(&["verify", "--from", "now", "--to", "beginning"], moto.port);
    assert_eq!(backwards.status.code(), Some(2), "{}", stderr(&backwards));

    // forget: a subject with a key (made as load makes one) is forgotten once, then says so; one
    // never seen is bad usage and writes nothing; who asked is recorded under its hash.
    let kms = aws_sdk_kms::Client::new(&stack.sdk);
    let kms_key = create_subject_key(&kms, &names.subject_key_alias).await.unwrap();
    let keys = Keys::new(dynamo.clone(), kms, names.key_table.clone()).made_by(Some(Maker::Kms(kms_key)));
    let subject = subject_hash(LOCAL_SUBJECT_HASH_KEY.as_bytes(), "user-1");
    assert_eq!(keys.sealing_generation(&subject).await.unwrap(), 0);
    let unknown = event_store(&["forget", "nobody"], moto.port);
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr(&unknown));
    assert!(String::from_utf8_lossy(&unknown.stdout).contains("nothing to forget"));
    let forgot = event_store(&["forget", "user-1"], moto.port);
    assert_eq!(forgot.status.code(), Some(0), "{}", stderr(&forgot));
    assert!(String::from_utf8_lossy(&forgot.stdout).contains("1 key generation(s) destroyed"), "{forgot:?}");
    let again = event_store(&["--json", "forget", "user-1"], moto.port);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    let answer: Value = serde_json::from_slice(&again.stdout).unwrap();
    // The stream of that name too, under the streams' own hash.
    let stream = event_store::crypto::stream_subject_hash(LOCAL_SUBJECT_HASH_KEY.as_bytes(), "user-1");
    let expected = json!({"subject": subject, "stream_subject": stream, "forgotten": "already", "generations": 0,
        "view_items": 0});
    assert_eq!(answer, expected, "no projection: no view item");
    let items = dynamo.scan().table_name(&names.key_table).send().await.unwrap();
    let record: Vec<_> = items.items().iter().filter(|i| i["item"].as_s().unwrap().starts_with("forgot#")).collect();
    assert_eq!(record.len(), 1);
    assert!(record[0]["by"].as_s().unwrap().starts_with("local:"));
    assert!(items.items().iter().all(|i| i["subject"].as_s().unwrap() == &subject && !i.contains_key("wrapped")));
    assert_eq!(event_store(&["forget", " "], moto.port).status.code(), Some(2), "an empty subject");
}

/// Events on `stream` (aggregated records unpacked), all shards from their start.
async fn read_all(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> usize {
    let mut events = 0;
    for shard in event_store::kinesis::list_shards(kinesis, stream).await.unwrap() {
        let iterator = kinesis
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(shard.shard_id())
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap();
        let read = event_store::kinesis::get_records(kinesis, iterator.shard_iterator().unwrap().to_owned(), 1000);
        for record in read.await.unwrap().records() {
            let key = record.partition_key().unwrap();
            events += event_store::aggregation::deaggregate(key, record.data().as_ref()).unwrap().len();
        }
    }
    events
}
