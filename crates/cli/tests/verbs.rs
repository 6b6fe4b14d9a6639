//! `event-store subscription …` and `event-store tail` as a user runs them:
//! the binary against a real emulator on a free port, on events that went
//! through the pump and the scan like any other.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use aws_sdk_kinesis::types::ShardIteratorType;
use event_store::config::{PumpConfig, ScanConfig};
use event_store::pump::Pump;
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
async fn subscriptions_are_managed_and_the_sealed_log_is_followed_from_the_command_line() {
    let stack = common::LocalStack::start().await;
    let moto = &stack.moto;
    let (dynamo, kinesis, names) = (stack.dynamo.clone(), stack.kinesis.clone(), stack.names.clone());

    // Four events through the event stream, the pump and a scan pass: three clicks and a view.
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
    // Past the events' slot, so the pass seals it.
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
    for (args, expected) in [
        (vec!["tail", "--from", "someday"], "--from \"someday\""),
        (vec!["subscription", "create", "x", "--target", &target, "--partitions", "65"], "partitions must be 1 to 64"),
        (vec!["subscription", "create", "x", "--target", &target, "--start", "2999-01-01T00:00:00Z"], "future"),
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
}
