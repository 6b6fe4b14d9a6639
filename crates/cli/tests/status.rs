//! `event-store status` as a user runs it: the binary, against a real
//! emulator on a free port (the local target) and against moto's
//! CloudFormation (the `--stack` target's lookups and its refusals).
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use event_store_emulator::free_port;
use event_store_emulator::runs::{deadline_in, run_scan, scan_config};
use serde_json::Value;

/// Runs `event-store args` with `env`, the user's own AWS settings cleared.
fn event_store(args: &[&str], env: &[(&str, String)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_event-store"));
    for name in [
        "AWS_ENDPOINT_URL",
        "AWS_PROFILE",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        // Where a CI machine's own role comes from (CodeBuild, ECS, EKS): not this test's.
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "EVENT_STORE_STACK",
        "STAGE",
        "EMULATOR_PORT",
    ] {
        command.env_remove(name);
    }
    command.args(args).envs(env.iter().map(|(k, v)| (k, v))).output().unwrap()
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stdout)))
}

#[tokio::test(flavor = "multi_thread")]
async fn status_names_what_is_stalled_and_says_healthy_when_nothing_is() {
    let stack = common::LocalStack::start().await;
    let moto = &stack.moto;
    let sdk = stack.sdk.clone();
    let (dynamo, kinesis, names) = (stack.dynamo.clone(), stack.kinesis.clone(), stack.names.clone());
    let local = [("EMULATOR_PORT", moto.port.to_string())];

    // A new stack: no scan pass yet.
    let fresh = event_store(&["status", "--json"], &local);
    assert_eq!(fresh.status.code(), Some(1), "{}", String::from_utf8_lossy(&fresh.stderr));
    let json = json_of(&fresh);
    assert!(json["verdict"]["problems"][0].as_str().unwrap().starts_with("no watermark yet"), "{json}");
    assert_eq!(json["shards"].as_array().unwrap().len(), 1);
    assert_eq!(json["target"], format!("local stack local (http://127.0.0.1:{})", moto.port));

    // A scan pass over an empty buffer and stream: the watermark is set, nothing is stalled.
    let scan = event_store::config::ScanConfig { segments: 1, ..scan_config(&names) };
    for pass in
        run_scan(dynamo.clone(), kinesis.clone(), scan, serde_json::json!({}), deadline_in(Duration::from_secs(60)))
            .await
    {
        pass.unwrap();
    }
    let healthy = event_store(&["status", "--json"], &local);
    let json = json_of(&healthy);
    assert_eq!(healthy.status.code(), Some(0), "{json}");
    assert_eq!(json["verdict"], serde_json::json!({"healthy": true, "problems": []}));
    assert!(json["watermark_lag_ms"].as_i64().unwrap() < 60_000, "{json}");
    let ingest = json["ingest_per_minute"].as_array().unwrap();
    assert_eq!((ingest.len(), ingest.iter().filter_map(Value::as_u64).sum::<u64>()), (60, 0), "an hour, nothing moved");
    let text = event_store(&["status"], &local);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.lines().last().unwrap().starts_with("verdict        healthy"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("ingest ") && l.ends_with("0 events in 60 min, per minute of arrival")));
    assert!(!text.contains('\x1b'), "no colour when stdout is not a terminal: {text}");

    // A subscription with a parked event (as its runner parks one the target refused): named, exit 1.
    let target = format!("kinesis:{}", names.playback_stream);
    let created = event_store(&["subscription", "create", "orders", "--target", &target, "--start", "now"], &local);
    assert_eq!(created.status.code(), Some(0), "{}", String::from_utf8_lossy(&created.stderr));
    let table = names.event_table.as_str();
    let orders = event_store::readers::subscriptions::get(&dynamo, table, "orders").await.unwrap().unwrap();
    let parked = event_store::readers::subscriptions::Parked {
        sub_id: orders.id.clone(),
        partition: 0,
        slot: 0,
        event_sort_key: "0001".into(),
        event_id: "shardId-000000000000:1".into(),
        partition_key: "k".into(),
        seq: 0,
        error: "the target refused it".into(),
        parked_at: event_store::time::format_ms(event_store::time::now_ms()),
    };
    event_store::readers::subscriptions::park(&dynamo, table, "orders", &parked).await.unwrap();
    let with_parked = event_store(&["status", "--json"], &local);
    let json = json_of(&with_parked);
    assert_eq!(with_parked.status.code(), Some(1), "{json}");
    assert_eq!(
        json["verdict"]["problems"],
        serde_json::json!(["subscription orders: 1 parked event (re-deliver them)"])
    );
    assert_eq!(
        (json["subscriptions"][0]["name"].as_str(), json["subscriptions"][0]["parked"].as_u64()),
        (Some("orders"), Some(1))
    );
    event_store::readers::subscriptions::unpark(&dynamo, table, "orders", &parked).await.unwrap();
    let deleted = event_store(&["subscription", "delete", "orders"], &local);
    assert_eq!(deleted.status.code(), Some(0), "{}", String::from_utf8_lossy(&deleted.stderr));

    // A record the pump has not buffered, older than the limit: the pump is named, and since when.
    kinesis
        .put_record()
        .stream_name(&names.event_stream)
        .partition_key("k")
        .data(aws_sdk_kinesis::primitives::Blob::new(br#"{"id":"x"}"#.to_vec()))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let stalled = event_store(&["status", "--json", "--stall-after", "1"], &local);
    let json = json_of(&stalled);
    assert_eq!(stalled.status.code(), Some(1), "{json}");
    let problems: Vec<&str> =
        json["verdict"]["problems"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(
        problems.iter().any(|p| p.starts_with("pump behind on shardId-") && p.contains("not buffered")),
        "{problems:?}"
    );
    assert!(json["shards"][0]["behind_ms"].as_i64().unwrap() >= 2000, "{json}");

    // Not a store: one line, exit 3, whatever the target.
    let aws = [
        ("AWS_ENDPOINT_URL", moto.endpoint.clone()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ACCESS_KEY_ID", "t".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "t".to_owned()),
    ];
    let unknown = event_store(&["--stack", "no-such-stack", "status"], &aws);
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert_eq!(unknown.status.code(), Some(3), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "error: stack no-such-stack not found in us-east-1 (check the name, AWS_REGION or AWS_PROFILE)"
    );
    let cloudformation = aws_sdk_cloudformation::Client::new(&sdk);
    let template =
        r#"{"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}, "Outputs": {"QueueUrl": {"Value": {"Ref": "Q"}}}}"#;
    cloudformation.create_stack().stack_name("a-website").template_body(template).send().await.unwrap();
    let other = event_store(&["--stack", "a-website", "status"], &aws);
    assert_eq!(other.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&other.stderr).trim(),
        "error: stack a-website is not an event store: it has no EventTableName output"
    );
    let nowhere = "/nonexistent/aws".to_owned();
    let no_credentials = [
        aws[0].clone(),
        aws[1].clone(),
        ("AWS_SHARED_CREDENTIALS_FILE", nowhere.clone()),
        ("AWS_CONFIG_FILE", nowhere),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
    ];
    let anonymous = event_store(&["--stack", "a-website", "status"], &no_credentials);
    assert_eq!(anonymous.status.code(), Some(3));
    assert_eq!(
        String::from_utf8_lossy(&anonymous.stderr).trim(),
        "error: no AWS credentials: configure them as for the AWS CLI (AWS_PROFILE, aws configure, or AWS_ACCESS_KEY_ID)"
    );
    let other_stage = event_store(
        &["--local", "status"],
        &[local[0].clone(), ("STAGE", "staging".into()), ("EVENT_STORE_STACK", "x".into())],
    );
    assert_eq!(other_stage.status.code(), Some(3), "--local wins over EVENT_STORE_STACK");
    assert_eq!(
        String::from_utf8_lossy(&other_stage.stderr).trim(),
        format!("error: the emulator on 127.0.0.1:{} has no table event-store-staging-event-table: is `make local` running with STAGE=staging?", moto.port)
    );
    let nothing = event_store(&["status"], &[("EMULATOR_PORT", free_port().to_string())]);
    assert_eq!(nothing.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&nothing.stderr).starts_with("error: no local stack answers on 127.0.0.1:"));
    assert!(nothing.stdout.is_empty());
}
