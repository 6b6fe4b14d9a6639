//! The archiver: sealed slots into S3 as Parquet, against a real emulator
//! (moto: DynamoDB and S3), the objects read back by pyarrow, a reader
//! nobody here wrote.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use common::{repo_root, TestEnv};
use event_store::archive::{columns, manifest, store};
use event_store::archiver::{ArchiveConfig, Archiver};
use event_store::bookkeeping::slot_index::read_index;
use event_store::dedupe::RecentIds;
use event_store::playback::reader::Reader;
use event_store::playback::Window;
use event_store::position::Checkpoint;
use event_store_emulator::runs::{deadline_in, run_scan, scan_config};
use serde_json::{json, Value};

/// Weeks before any run of these tests, at an hour's start (2026-09-21T18:00:00Z).
const T0: i64 = 1_790_013_600_000;
const EVENTS: i64 = 300;
const BUCKET: &str = "event-store-archive";

/// Every event of the event table in `[start, end)`, in log order: (sort key, bytes).
async fn log(env: &TestEnv, start: i64, end: i64) -> Vec<(String, Vec<u8>)> {
    let table = env.names.event_table.as_str();
    let (slots, _) = read_index(&env.dynamo, table, start, end).await.unwrap();
    let window = Window { start, end };
    let reader = Reader {
        dynamo: &env.dynamo,
        table,
        time_unit_ms: 1000,
        page_items: None,
        dedupe_window_ms: 0,
        window: &window,
    };
    let mut out = Vec::new();
    let keep = |event: &event_store::event_item::EventItem, _: Option<Value>, bytes: &[u8]| {
        out.push((event.sort_key.clone(), bytes.to_vec()));
        ControlFlow::Continue(())
    };
    reader.each_event(slots, Checkpoint::at_slot(start), &mut RecentIds::new(0), keep).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn sealed_slots_move_to_s3_verified_chained_and_readable_by_pyarrow() {
    let env = TestEnv::start(1).await;
    // Three hours of events, 36 s apart, one of them not JSON.
    let records: Vec<_> = (0..EVENTS)
        .map(|i| {
            let data = if i == 7 {
                b"\x00\xffnot json".to_vec()
            } else {
                json!({"n": i, "pad": "x".repeat(64)}).to_string().into_bytes()
            };
            (format!("user-{}", i % 5), data, T0 + i * 36_000)
        })
        .collect();
    common::buffer_through_pump(&env, &records).await;
    let scan = event_store::config::ScanConfig { segments: 2, watermark_lag_ms: 0, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(300))).await
    {
        pass.unwrap();
    }
    let end = T0 + 3 * 3_600_000;
    let stored = log(&env, T0, end).await;
    assert_eq!(stored.len(), EVENTS as usize);

    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).build());
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let archiver = Archiver {
        dynamo: env.dynamo.clone(),
        s3: s3.clone(),
        config: ArchiveConfig {
            event_table: env.names.event_table.clone(),
            bucket: BUCKET.into(),
            prefix: "events/".into(),
            hot_retention: Duration::ZERO,
            // Small, so that an hour is cut into several objects.
            object_bytes: 4 * 1024,
            dedupe_window_ms: 0,
            deadline_margin: Duration::from_secs(1),
        },
    };
    let now = event_store::time::now_ms();
    let summary = archiver.run(now, Instant::now() + Duration::from_secs(120)).await.unwrap();
    assert_eq!((summary.events, summary.more), (EVENTS as u64, false), "{summary:?}");
    assert!(summary.objects >= 6, "three hours, each cut by size: {summary:?}");

    // The manifest is one chain over the objects as S3 holds them.
    let table = env.names.event_table.as_str();
    let entries = store::entries_from(&env.dynamo, table, 0).await.unwrap();
    assert_eq!(entries.len() as u64, summary.objects);
    assert_eq!(summary.boundary, entries.last().unwrap().end);
    let mut archived = Vec::new();
    let mut checked = Vec::new();
    for entry in &entries {
        let object = s3.get_object().bucket(BUCKET).key(&entry.key).send().await.unwrap();
        let bytes = object.body.collect().await.unwrap().into_bytes();
        let rows = columns::read(bytes.clone()).unwrap();
        let keys: Vec<&str> = rows.iter().map(|r| r.sort_key.as_str()).collect();
        checked.push((entry, Some(manifest::Facts::of(&bytes, &keys))));
        let hour = chrono::DateTime::from_timestamp_millis(entry.start).unwrap().format("date=%Y-%m-%d/hour=%H/");
        assert!(entry.key.starts_with(&format!("events/{hour}")), "{}", entry.key);
        assert!(rows.iter().all(|r| r.slot >= entry.start && r.slot < entry.end), "{}", entry.key);
        archived.extend(rows.into_iter().map(|r| {
            let event = r.into_event();
            (event.sort_key.clone(), event.bytes().unwrap())
        }));
    }
    assert_eq!(manifest::verify(None, checked.into_iter()), Ok(summary.objects));
    assert_eq!(archived, stored, "every event once, in order, byte for byte");

    // The archived slots left the event table; their index stays.
    let items = env.scan_table(table).await;
    let events_left = items.iter().filter(|i| i["slot"].as_n().unwrap().parse::<i64>().unwrap() >= 0).count();
    assert_eq!(events_left, 0);
    assert!(!read_index(&env.dynamo, table, T0, end).await.unwrap().0.is_empty());
    let again = archiver.run(now, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert_eq!((again.objects, again.boundary), (0, summary.boundary), "nothing twice");
    let pointers =
        event_store::bookkeeping::query_range(&env.dynamo, table, "archive#object#".into(), "archive#object#~".into());
    assert_eq!(pointers.await.unwrap().0.len(), entries.len(), "a pointer per object, for readers");

    // pyarrow reads the objects as a hive-partitioned dataset, with the declared columns.
    let dir = std::env::temp_dir().join(format!("event-store-archive-{}", std::process::id()));
    for entry in &entries {
        let object = s3.get_object().bucket(BUCKET).key(&entry.key).send().await.unwrap();
        let path = dir.join(&entry.key);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, object.body.collect().await.unwrap().into_bytes()).unwrap();
    }
    let script = r#"
import json, sys
import pyarrow.dataset as ds
table = ds.dataset(sys.argv[1], format="parquet", partitioning="hive").to_table().sort_by("sort_key")
print(json.dumps({
    "rows": table.num_rows,
    "schema": {f.name: str(f.type) for f in table.schema},
    "hours": sorted(set(table.column("hour").to_pylist())),
    "not_json": [b.hex() for b in table.filter(ds.field("payload").is_null()).column("payload_bytes").to_pylist()],
    "n": [json.loads(p)["n"] for p in table.column("payload").to_pylist() if p is not None],
}))
"#;
    let python = repo_root().join(".venv/bin/python");
    let out = std::process::Command::new(&python).arg("-c").arg(script).arg(dir.join("events")).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}: {}", python.display(), String::from_utf8_lossy(&out.stderr));
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read["rows"], EVENTS);
    let time = "timestamp[ms, tz=UTC]";
    assert_eq!(
        read["schema"],
        json!({"arrival": time, "event_time": time, "slot": "int64", "sort_key": "string", "partition_key": "string",
               "event_id": "string", "source": "string", "stream": "string", "version": "int64", "payload": "string",
               "payload_bytes": "binary", "expires_at": "int64", "date": "string", "hour": "int32"})
    );
    assert_eq!(read["hours"], json!([18, 19, 20]));
    let n: Vec<i64> = serde_json::from_value(read["n"].clone()).unwrap();
    assert_eq!(n, (0..EVENTS).filter(|i| *i != 7).collect::<Vec<_>>());
    assert_eq!(read["not_json"], json!([hex::encode(b"\x00\xffnot json")]));
}
