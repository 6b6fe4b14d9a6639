//! The archiver: complete slots into S3 as Parquet, against a real emulator
//! (moto: DynamoDB and S3), the objects read back by pyarrow, a reader
//! nobody here wrote.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::ops::ControlFlow;
use std::time::{Duration, Instant, SystemTime};

use common::{repo_root, TestEnv};
use event_store::archive::object::Bucket;
use event_store::archive::{anchor, audit, columns, manifest, store};
use event_store::archiver::Archiver;
use event_store::bookkeeping::slot_index::read_index;
use event_store::bookkeeping::Family;
use event_store::config::ArchiveConfig;
use event_store::config::PlaybackConfig;
use event_store::log::copies::RecentIds;
use event_store::log::reader::{Page, Reader, PAGES_AHEAD};
use event_store::log::tiers::Tiers;
use event_store::log::Window;
use event_store::playback::Playback;
use event_store::position::Checkpoint;
use event_store_emulator::runs::{self, deadline_in, run_scan, scan_config};
use serde_json::{json, Value};

/// Weeks before any run of these tests, at an hour's start (2026-09-21T18:00:00Z).
const T0: i64 = 1_790_013_600_000;
const EVENTS: i64 = 300;
const BUCKET: &str = "event-store-archive";

/// The slot of the burst: 40 items of one event each (as written before
/// chunks) beside event 250, so that a reader pages through one slot.
const BURST_SLOT: i64 = T0 + 250 * 36_000;
const BURST: i64 = 40;

/// Every event in `[start, end)`, in log order, read as readers read it
/// (from the event table, or from the archive before its boundary): (sort key, bytes).
async fn log(env: &TestEnv, archive: Option<Bucket>, start: i64, end: i64) -> Vec<(String, Vec<u8>)> {
    try_log(env, archive, start, end).await.unwrap()
}

fn archiver(env: &TestEnv, bucket: &Bucket) -> Archiver {
    Archiver {
        dynamo: env.dynamo.clone(),
        bucket: bucket.clone(),
        config: ArchiveConfig {
            bucket: BUCKET.into(),
            event_table: env.names.event_table.clone(),
            prefix: "events/".into(),
            hot_retention: Duration::ZERO,
            // Small, so that an hour is cut into several objects.
            object_bytes: 4 * 1024,
            min_slice_rows: event_store::config::DEFAULT_MIN_SLICE_ROWS,
            dedupe_window_ms: 0,
            deadline_margin: Duration::from_secs(1),
            lease: Duration::from_secs(60),
            max_continuations: 0,
            metrics_namespace: "EventStore/test".into(),
        },
    }
}

/// Everything about the cold tier on one emulator run: archiving, reading
/// across the tiers (also while the boundary moves), playback, the chain,
/// and pyarrow.
#[test]
fn complete_slots_move_to_s3_verified_chained_read_across_tiers_and_by_pyarrow() {
    // Unoptimized (the dev profile `make test` builds), the polls of the SDK's futures under the
    // readers' and the archiver's are deeper than a test thread's 2 MiB: the test runs on a thread
    // of its own with room for them (optimized builds, the Lambdas', need a fraction of it).
    common::on_a_large_stack(archive_read_and_verify);
}

async fn archive_read_and_verify() {
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
    let table = env.names.event_table.as_str();
    for k in 0..BURST {
        let data = json!({"n": 1000 + k}).to_string().into_bytes();
        let (data, encoding) = event_store::encoding::encode(&data);
        let buffered = event_store::buffer_item::BufferItem {
            id: format!("burst-{k}"),
            event_id: format!("shardId-000000000009:{}", 1000 + k),
            arrival: BURST_SLOT + 1 + k * 10,
            partition_key: format!("burst-{}", k % 3),
            data,
            encoding,
            buffered_at: None,
            count: None,
        };
        let item = buffered.to_event_item(1000).unwrap().to_item();
        env.dynamo.put_item().table_name(table).set_item(Some(item)).send().await.unwrap();
    }
    let all = (EVENTS + BURST) as usize;
    let end = T0 + 3 * 3_600_000;
    let stored = log(&env, None, T0, end).await;
    assert_eq!(stored.len(), all);

    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).build());
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    // The readers' client, built as the functions build theirs (the SDK's endpoint rules address moto by path).
    let bucket = Bucket::new(&env.sdk, BUCKET.into());
    let archiver = archiver(&env, &bucket);

    // The first hour and a half: the boundary lies inside the window.
    let half = T0 + 90 * 60_000;
    let first = archiver.run(half, Instant::now() + Duration::from_secs(120)).await.unwrap();
    assert_eq!((first.boundary, first.more, first.kept, first.busy), (half, false, 0, false), "{first:?}");
    // Every complete hour is copied at once (SQL sees it); only what is past the hot retention leaves the table.
    assert_eq!((first.copied_to, first.events), (end, all as u64), "{first:?}");
    let hot = env.scan_table(table).await;
    let hot_slots: Vec<i64> =
        hot.iter().filter_map(|i| i["slot"].as_n().ok()?.parse().ok()).filter(|s| *s >= 0).collect();
    assert!(hot_slots.iter().all(|slot| *slot >= half), "events 0..150 arrived before {half} and left the table");
    assert_eq!(hot_slots.len(), 150 + BURST as usize, "the copied hours after {half} stay in the table");
    assert_eq!(log(&env, Some(bucket.clone()), T0, end).await, stored, "across the tiers: every event once, in order");
    let no_archive = Tiers::new(None);
    let reader = Reader {
        dynamo: &env.dynamo,
        table,
        time_unit_ms: 1000,
        page_items: None,
        dedupe_window_ms: 0,
        window: &Window { start: T0, end },
        keys: event_store::slices::KeyRange::ALL,
        tiers: &no_archive,
    };
    let err = reader
        .each_event(
            read_index(&env.dynamo, table, T0, end).await.unwrap().0,
            Checkpoint::at_slot(T0),
            &mut RecentIds::new(0),
            |_, _, _| ControlFlow::Continue(()),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("ARCHIVE_BUCKET"), "a reader without the archive says so: {err}");

    // A playback of the three hours, across the tiers.
    let config = PlaybackConfig { archive_bucket: Some(BUCKET.into()), ..runs::playback_config(&env.names) };
    let request = json!({"start": event_store::time::format_ms(T0), "end": event_store::time::format_ms(end)});
    let runs = runs::run_playback(
        |invoker| {
            Playback::new(env.dynamo.clone(), env.kinesis.clone(), config, invoker).with_archive(Some(bucket.clone()))
        },
        request,
        deadline_in(Duration::from_secs(300)),
    )
    .await;
    assert_eq!(runs.into_iter().map(|r| r.unwrap().events).sum::<usize>(), all);
    let mut played = Vec::new();
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        let key = record.partition_key().unwrap();
        for (_, data) in event_store::aggregation::deaggregate(key, record.data().as_ref()).unwrap() {
            played.push(serde_json::from_slice::<event_store::log::PlayedEvent>(&data).unwrap());
        }
    }
    played.sort_by_key(|e| e.playback_seq);
    let played_ms: Vec<i64> = played.iter().map(|e| e.event_ms).collect();
    let stored_ms: Vec<i64> = stored.iter().map(|(key, _)| key[..13].parse().unwrap()).collect();
    assert_eq!(played_ms, stored_ms, "played once each, in the log's order, whichever tier");

    // The race: a reader pages through the burst's slot one item at a time,
    // and the archiver moves the boundary past it and deletes it meanwhile.
    let (slots, _) = read_index(&env.dynamo, table, half, end).await.unwrap();
    let window = Window { start: half, end };
    let tiers = Tiers::new(Some(bucket.clone()));
    let reader = Reader {
        dynamo: &env.dynamo,
        table,
        time_unit_ms: 1000,
        page_items: Some(1),
        dedupe_window_ms: 0,
        window: &window,
        keys: event_store::slices::KeyRange::ALL,
        tiers: &tiers,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<event_store::error::Result<Page>>(PAGES_AHEAD);
    let consume = async {
        let (mut read, mut archived_at, mut burst_pages_after) = (Vec::new(), None, 0);
        while let Some(page) = rx.recv().await {
            let page = page.unwrap();
            if page.slot == BURST_SLOT && archived_at.is_none() {
                let summary = archiver.run(end + 3_600_000, Instant::now() + Duration::from_secs(120)).await.unwrap();
                assert!(summary.boundary >= end && summary.kept == 0, "{summary:?}");
                archived_at = Some(read.len());
            } else if page.slot == BURST_SLOT {
                burst_pages_after += 1;
            }
            read.extend(page.events.into_iter().map(|e| {
                let bytes = e.bytes().unwrap();
                (e.sort_key, bytes)
            }));
        }
        (read, burst_pages_after)
    };
    let ((), (read, burst_pages_after)) =
        tokio::join!(reader.fetch_pages(slots, Checkpoint::at_slot(half), tx), consume);
    let from_half: Vec<_> =
        stored.iter().filter(|(key, _)| key[..13].parse::<i64>().unwrap() >= half).cloned().collect();
    let keys = |events: &[(String, Vec<u8>)]| events.iter().map(|(key, _)| key[..13].to_owned()).collect::<Vec<_>>();
    assert_eq!(keys(&read), keys(&from_half), "every event once, in order, while the boundary moved past the slot");
    assert!(read == from_half, "byte for byte");
    assert!(burst_pages_after >= 1, "the burst's slot was still being read when it was archived");
    let burst_left =
        env.scan_table(table).await.iter().filter(|i| i["slot"].as_n().unwrap() == &BURST_SLOT.to_string()).count();
    assert_eq!(burst_left, 0, "the race was real: the slot's items were deleted during the read");

    // The manifest is one chain over the objects as S3 holds them.
    let table = env.names.event_table.as_str();
    let entries = store::entries_from(&env.dynamo, table, 0).await.unwrap();
    assert!(entries.len() >= 6, "three hours, each cut by size: {}", entries.len());
    let boundary = store::boundary(&env.dynamo, table).await.unwrap();
    assert_eq!((boundary.archived_to, boundary.cleared_to), (entries.last().unwrap().end, entries.last().unwrap().end));
    let mut archived = Vec::new();
    let mut checked = Vec::new();
    for entry in &entries {
        let object = s3.get_object().bucket(BUCKET).key(&entry.key).send().await.unwrap();
        let bytes = object.body.collect().await.unwrap().into_bytes();
        let object = columns::open(bytes.clone()).unwrap();
        checked.push((entry, Some(object.facts(&bytes))));
        let rows = object.rows;
        let hour = chrono::DateTime::from_timestamp_millis(entry.start).unwrap().format("date=%Y-%m-%d/hour=%H/");
        assert!(entry.key.starts_with(&format!("events/{hour}")), "{}", entry.key);
        assert!(rows.iter().all(|r| r.slot >= entry.start && r.slot < entry.end), "{}", entry.key);
        archived.extend(rows.into_iter().map(|r| {
            let event = r.into_event();
            (event.sort_key.clone(), event.bytes().unwrap())
        }));
    }
    assert_eq!(manifest::verify(None, checked.into_iter()), Ok(entries.len() as u64));
    assert_eq!(archived, stored, "every event once, in order, byte for byte");

    // The archived slots left the event table; their index stays.
    let items = env.scan_table(table).await;
    let events_left = items.iter().filter(|i| i["slot"].as_n().unwrap().parse::<i64>().unwrap() >= 0).count();
    assert_eq!(events_left, 0);
    assert!(!read_index(&env.dynamo, table, T0, end).await.unwrap().0.is_empty());
    // One run at a time: while another holds the lease, a run does nothing.
    let now = event_store::time::now_ms();
    assert!(store::take_lease(&env.dynamo, table, "another-run", now, now + 60_000).await.unwrap());
    let busy = archiver.run(end + 3_600_000, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert!(busy.busy && busy.objects == 0, "{busy:?}");
    store::release_lease(&env.dynamo, table, "another-run").await.unwrap();
    let again = archiver.run(end + 3_600_000, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert_eq!((again.objects, again.boundary, again.busy), (0, boundary.archived_to, false), "nothing twice");
    let pointers = event_store::bookkeeping::query_in(
        &env.dynamo,
        table,
        Family::Archive,
        ("archive#object#".into(), "archive#object#~".into()),
    );
    assert_eq!(pointers.await.unwrap().0.len(), entries.len(), "a pointer per object, for readers");

    // A late event (a re-drive days later, say) into an archived slot: the scan marks the slot first,
    // the event stays in the table (objects are never rewritten), and readers merge both tiers.
    let late_at = T0 + 10 * 36_000 + 500;
    let late = [("user-late".to_owned(), json!({"n": 5000}).to_string().into_bytes(), late_at)];
    let event = common::kinesis_event_on(common::TEST_ARN, "shardId-000000000007", &late);
    assert!(common::pump(&env).handle(event).await.batch_item_failures.is_empty());
    let scan = event_store::config::ScanConfig { segments: 1, watermark_lag_ms: 0, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(60))).await
    {
        pass.unwrap();
    }
    let marked = event_store::bookkeeping::late_slots::in_range(&env.dynamo, table, T0, end).await.unwrap();
    assert_eq!(marked, std::collections::BTreeSet::from([T0 + 360_000]));
    let with_late = log(&env, Some(bucket.clone()), T0, end).await;
    assert_eq!(with_late.len(), all + 1, "the late event too");
    let at = with_late.iter().position(|(key, _)| key.starts_with(&format!("{late_at:013}"))).unwrap();
    assert!(with_late[at - 1].0.starts_with(&format!("{:013}", T0 + 360_000)), "right after event 10, its slot's");
    assert!(with_late.windows(2).all(|w| w[0].0 < w[1].0), "in sort-key order");
    assert_eq!(with_late.iter().filter(|(key, _)| !key.starts_with(&format!("{late_at:013}"))).count(), all);
    Box::pin(the_log_in_pages(&env, &bucket, &with_late)).await;

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
    assert_eq!(read["rows"], all);
    // The columns as the template's Glue table declares them (what Athena reads), in pyarrow's names.
    let template: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(repo_root().join("template.yaml")).unwrap()).unwrap();
    let input = &template["Resources"]["ArchiveTable"]["Properties"]["TableInput"];
    let arrow = |glue: &str| match glue {
        "timestamp" => "timestamp[ms, tz=UTC]",
        "boolean" => "bool",
        "bigint" => "int64",
        "int" => "int32",
        "string" => "string",
        "binary" => "binary",
        other => panic!("a Glue type the archive does not write: {other}"),
    };
    let mut declared = serde_json::Map::new();
    for column in input["StorageDescriptor"]["Columns"]
        .as_sequence()
        .unwrap()
        .iter()
        .chain(input["PartitionKeys"].as_sequence().unwrap())
    {
        declared.insert(column["Name"].as_str().unwrap().into(), json!(arrow(column["Type"].as_str().unwrap())));
    }
    assert_eq!(declared.len(), 25);
    assert_eq!(read["schema"], Value::Object(declared), "pyarrow reads the columns the Glue table declares");
    assert_eq!(read["hours"], json!([18, 19, 20]));
    let n: Vec<i64> = serde_json::from_value(read["n"].clone()).unwrap();
    let mut expected: Vec<(i64, i64)> = (0..EVENTS).filter(|i| *i != 7).map(|i| (T0 + i * 36_000, i)).collect();
    expected.extend((0..BURST).map(|k| (BURST_SLOT + 1 + k * 10, 1000 + k)));
    expected.sort();
    assert_eq!(n, expected.into_iter().map(|(_, n)| n).collect::<Vec<_>>());
    assert_eq!(read["not_json"], json!([hex::encode(b"\x00\xffnot json")]));

    // `event-store verify`'s check, against S3 as it is: whole, then an object altered, then removed.
    let verify = |from: i64| audit::verify(&env.dynamo, table, &bucket, from, end);
    let whole = verify(T0).await.unwrap();
    assert_eq!((whole.entries, whole.events, whole.first_break), (entries.len() as u64, all as u64, None));
    // Two objects reordered (each under the other's key): the break is at the first of them.
    let bytes_of = |key: String| {
        let s3 = s3.clone();
        async move { s3.get_object().bucket(BUCKET).key(key).send().await.unwrap().body.collect().await.unwrap() }
    };
    let (one, two) = (bytes_of(entries[0].key.clone()).await, bytes_of(entries[1].key.clone()).await);
    for (key, body) in [(&entries[0].key, two.clone()), (&entries[1].key, one.clone())] {
        s3.put_object().bucket(BUCKET).key(key).body(body.into_bytes().into()).send().await.unwrap();
    }
    let reordered = verify(T0).await.unwrap();
    let expected = format!("entry {}: object {} is not what was archived", entries[0].seq, entries[0].key);
    assert_eq!(reordered.entries, 0);
    assert!(reordered.first_break.as_deref().is_some_and(|b| b.starts_with(&expected)), "{reordered:?}");
    // Readers check each object against its entry before they hand out an event of it.
    let refused = try_log(&env, Some(bucket.clone()), T0, entries[1].end).await.unwrap_err();
    assert!(refused.to_string().contains("is not the object entry"), "{refused}");
    for (key, body) in [(&entries[0].key, one), (&entries[1].key, two)] {
        s3.put_object().bucket(BUCKET).key(key).body(body.into_bytes().into()).send().await.unwrap();
    }
    assert_eq!(verify(T0).await.unwrap().first_break, None, "put back in order");
    let victim = &entries[2];
    let victim_object = bytes_of(victim.key.clone()).await.into_bytes();
    s3.put_object().bucket(BUCKET).key(&victim.key).body(b"PAR1 not parquet".to_vec().into()).send().await.unwrap();
    let altered = verify(T0).await.unwrap();
    let expected = format!("entry {}: object {} is not what was archived", victim.seq, victim.key);
    assert_eq!(altered.entries, 2);
    assert!(altered.first_break.as_deref().is_some_and(|b| b.starts_with(&expected)), "{altered:?}");
    s3.delete_object().bucket(BUCKET).key(&victim.key).send().await.unwrap();
    let removed = verify(T0).await.unwrap();
    assert_eq!(removed.first_break, Some(format!("entry {}: object {} is missing", victim.seq, victim.key)));
    let after = verify(entries[3].start).await.unwrap();
    assert_eq!(
        (after.entries, after.first_break),
        (entries.len() as u64 - 3, None),
        "a range after the break verifies"
    );

    // Each entry is anchored in S3, once. The head rewritten with its object (another object's bytes,
    // an entry that links and matches them) is a chain that holds; its anchor says otherwise.
    for entry in &entries {
        assert_eq!(anchor::get(&bucket, entry.seq).await.unwrap().as_ref(), Some(entry), "anchored");
    }
    let (head, before) = (&entries[entries.len() - 1], &entries[entries.len() - 2]);
    let head_object = bytes_of(head.key.clone()).await.into_bytes();
    let forged_object = bytes_of(entries[3].key.clone()).await.into_bytes();
    let facts = columns::open(forged_object.clone()).unwrap().facts(&forged_object);
    let forged = manifest::Entry::next(Some(before), head.key.clone(), head.start, head.end, &facts);
    s3.put_object().bucket(BUCKET).key(&head.key).body(forged_object.into()).send().await.unwrap();
    let mut item: std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> =
        serde_dynamo::to_item(&forged).unwrap();
    item.extend(event_store::bookkeeping::key_in(Family::Archive, format!("archive#entry#{:012}", head.seq)));
    env.dynamo.put_item().table_name(table).set_item(Some(item)).send().await.unwrap();
    let chain: Vec<manifest::Entry> = store::entries_from(&env.dynamo, table, head.seq).await.unwrap();
    assert_eq!(chain, std::slice::from_ref(&forged), "the forged head is stored");
    let objects = [(&forged, Some(facts))];
    assert_eq!(manifest::verify(Some(before), objects), Ok(1), "the chain alone holds");
    let rewritten = verify(head.start).await.unwrap();
    let expected = format!("entry {}: it is not the entry its anchor {}", head.seq, anchor::key(head.seq));
    assert!(rewritten.first_break.as_deref().is_some_and(|b| b.starts_with(&expected)), "{rewritten:?}");
    // A reader does not follow it either: it reads the head's object only as its anchored entry says.
    let refused = try_log(&env, Some(bucket.clone()), head.start, head.end).await.unwrap_err();
    assert!(refused.to_string().contains("is not what its anchor"), "{refused}");
    let mut item: std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> =
        serde_dynamo::to_item(head).unwrap();
    item.extend(event_store::bookkeeping::key_in(Family::Archive, format!("archive#entry#{:012}", head.seq)));
    env.dynamo.put_item().table_name(table).set_item(Some(item)).send().await.unwrap();
    s3.put_object().bucket(BUCKET).key(&head.key).body(head_object.into()).send().await.unwrap();
    s3.put_object().bucket(BUCKET).key(&victim.key).body(victim_object.into()).send().await.unwrap();
    assert_eq!(verify(T0).await.unwrap().first_break, None, "put back");

    // Hours without events are archived without an object (the boundary jumps them). A late event
    // into such a slot is read from the table: a reader finds no object and nothing lost.
    let (quiet, busy) = (end + 30 * 60_000, end + 2 * 3_600_000 + 5 * 60_000);
    let shard = |n: u32| format!("shardId-00000000000{n}");
    let hot = [("user-hot".to_owned(), json!({"n": 6000}).to_string().into_bytes(), busy)];
    assert!(common::pump(&env)
        .handle(common::kinesis_event_on(common::TEST_ARN, &shard(8), &hot))
        .await
        .batch_item_failures
        .is_empty());
    let scan = || event_store::config::ScanConfig { segments: 1, watermark_lag_ms: 0, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan(), json!({}), deadline_in(Duration::from_secs(60))).await
    {
        pass.unwrap();
    }
    let jumped = archiver.run(end + 4 * 3_600_000, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert_eq!((jumped.objects, jumped.boundary), (1, end + 3 * 3_600_000), "{jumped:?}");
    assert!(store::object_at(&env.dynamo, table, quiet).await.unwrap().is_none(), "no object holds the quiet hour");
    let late = [("user-late".to_owned(), json!({"n": 7000}).to_string().into_bytes(), quiet)];
    assert!(common::pump(&env)
        .handle(common::kinesis_event_on(common::TEST_ARN, &shard(9), &late))
        .await
        .batch_item_failures
        .is_empty());
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan(), json!({}), deadline_in(Duration::from_secs(60))).await
    {
        pass.unwrap();
    }
    let read: Vec<String> = log(&env, Some(bucket.clone()), end, end + 3 * 3_600_000)
        .await
        .into_iter()
        .map(|(key, _)| key[..13].to_owned())
        .collect();
    assert_eq!(
        read,
        [format!("{quiet:013}"), format!("{busy:013}")],
        "the late event in the quiet hour, then the archived one"
    );

    // Boxed: the test's future would outgrow the test thread's stack.
    let run_at = end + 4 * 3_600_000;
    Box::pin(an_upgrade_moves_the_archive(&env, &bucket, &archiver, (end + 3 * 3_600_000, run_at))).await;
    Box::pin(a_late_event_after_the_copy_is_marked_when_its_hour_moves(&env, &bucket, &archiver, end + 5 * 3_600_000))
        .await;
    Box::pin(tamper_with_what_readers_follow(&env, &bucket)).await;
}

/// An hour is copied as soon as it is complete and moves out of the table only later. An event
/// written into it in between and left unmarked (by a scan that read the watermark before the hour
/// was complete) is kept when the hour moves, and its slot marked before readers stop reading the
/// table: they read it beside the object, and `verify` holds.
async fn a_late_event_after_the_copy_is_marked_when_its_hour_moves(
    env: &TestEnv,
    bucket: &Bucket,
    archiver: &Archiver,
    hour: i64,
) {
    let table = env.names.event_table.as_str();
    let at = hour + 10 * 60_000;
    let sent = [("user-copied".to_owned(), json!({"n": 8000}).to_string().into_bytes(), at)];
    let pump = common::pump(env);
    assert!(pump
        .handle(common::kinesis_event_on(common::TEST_ARN, "shardId-000000000011", &sent))
        .await
        .batch_item_failures
        .is_empty());
    let scan = event_store::config::ScanConfig { segments: 1, watermark_lag_ms: 0, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(60))).await
    {
        pass.unwrap();
    }
    // Copied, not moved: the hot retention has not passed for it.
    let copied = archiver.run(hour, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert!(copied.copied_to >= hour + 3_600_000 && copied.boundary <= hour, "{copied:?}");
    assert!(store::object_at(&env.dynamo, table, at).await.unwrap().is_some(), "its hour is in S3 for SQL");
    let late = event_store::buffer_item::BufferItem {
        id: "late-after-copy".into(),
        event_id: "shardId-000000000011:9".into(),
        arrival: at + 5_000,
        partition_key: "user-copied".into(),
        data: json!({"n": 8001}).to_string().into_bytes(),
        encoding: None,
        buffered_at: None,
        count: None,
    };
    // As the scan writes: the slot's index entry, then the event (this slot of the hour had none).
    let index = event_store::bookkeeping::slot_index::index_item(at + 5_000, 1);
    env.dynamo.put_item().table_name(table).set_item(Some(index)).send().await.unwrap();
    let item = late.to_event_item(1000).unwrap().to_item();
    env.dynamo.put_item().table_name(table).set_item(Some(item)).send().await.unwrap();
    let n = |events: Vec<(String, Vec<u8>)>| {
        events
            .iter()
            .map(|(_, b)| serde_json::from_slice::<Value>(b).unwrap()["n"].as_i64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(n(log(env, Some(bucket.clone()), hour, hour + 3_600_000).await), [8000, 8001], "read from the table");
    let moved = archiver.run(hour + 2 * 3_600_000, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert!(moved.boundary >= hour + 3_600_000 && moved.kept == 1, "{moved:?}");
    let marked = event_store::bookkeeping::late_slots::in_range(&env.dynamo, table, hour, hour + 3_600_000);
    // The first one's slot the scan marked (the watermark is the wall clock's, weeks past it).
    assert_eq!(marked.await.unwrap(), std::collections::BTreeSet::from([at, at + 5_000]), "marked as it moved");
    assert_eq!(n(log(env, Some(bucket.clone()), hour, hour + 3_600_000).await), [8000, 8001], "both tiers, once each");
    let verified = audit::verify(&env.dynamo, table, bucket, T0, hour + 3_600_000).await.unwrap();
    assert_eq!(verified.first_break, None);
}

/// The log as a reader over HTTP follows it (issue 50): pages of 7 from `T0`, each from the position
/// the one before named, across the archive's boundary, a burst slot read in pages and a late slot
/// read from both tiers: every event once, in log order, as `log` reads them. A filter selects
/// across pages; a position that is none of ours is refused.
async fn the_log_in_pages(env: &TestEnv, bucket: &Bucket, expected: &[(String, Vec<u8>)]) {
    use base64::Engine;
    use event_store::log::page::{LogEvent, LogReader};
    let tiers = Tiers::new(Some(bucket.clone()));
    let table = env.names.event_table.as_str();
    let reader = LogReader { dynamo: &env.dynamo, table, time_unit_ms: 1000, dedupe_window_ms: 0, tiers: &tiers };
    let far = || Instant::now() + Duration::from_secs(60);
    let as_sent = |e: &LogEvent| match (&e.data, &e.data_base64) {
        (Some(data), _) => (e.event_ms, data.clone()),
        (None, Some(b64)) => (e.event_ms, json!(b64)),
        (None, None) => panic!("an event without its data: {e:?}"),
    };
    let (mut read, mut from, mut pages) = (Vec::new(), event_store::time::format_ms(T0), 0);
    loop {
        let page = reader.page(&from, 7, &[], far()).await.unwrap();
        pages += 1;
        assert!(page.events.len() <= 7 && page.sealed_to_ms > T0 + 3 * 3_600_000, "{page:?}");
        read.extend(page.events.iter().map(as_sent));
        if page.at_end {
            assert!(reader.page(&page.next, 7, &[], far()).await.unwrap().events.is_empty(), "nothing after the end");
            break;
        }
        assert_eq!(page.events.last().map(|e| &e.position), Some(&page.next), "a full page ends after its last event");
        from = page.next;
    }
    let sent: Vec<(i64, Value)> = expected
        .iter()
        .map(|(key, bytes)| {
            let data = serde_json::from_slice::<Value>(bytes)
                .unwrap_or_else(|_| json!(base64::engine::general_purpose::STANDARD.encode(bytes)));
            (key[..13].parse().unwrap(), data)
        })
        .collect();
    assert_eq!(read, sent, "every event once, in log order, across tiers and pages");
    assert_eq!(pages, expected.len().div_ceil(7) + usize::from(expected.len().is_multiple_of(7)));
    let late = event_store::log::Filter { field: "/n".into(), equals: json!(5000) };
    let filtered = reader.page(&T0.to_string(), 7, &[late], far()).await.unwrap();
    assert_eq!(filtered.events.iter().map(as_sent).map(|e| e.1).collect::<Vec<_>>(), [json!({"n": 5000})]);
    assert!(filtered.at_end, "a filter reads on to the end of a page's worth of matches");
    // A page out of time stops where it is, not at the end: the next one goes on from there. With no
    // time at all, each page reads one event, and the pages still read each event once, in order.
    let (mut stepped, mut from) = (Vec::new(), T0.to_string());
    for _ in 0..20 {
        let page = reader.page(&from, 7, &[], Instant::now()).await.unwrap();
        assert!(!page.at_end && page.events.len() == 1, "{page:?}");
        stepped.extend(page.events.iter().map(as_sent));
        from = page.next;
    }
    assert_eq!(stepped, sent[..20]);
    let unmatched = event_store::log::Filter { field: "/n".into(), equals: json!(-7) };
    let nothing = reader.page(&T0.to_string(), 7, &[unmatched], Instant::now()).await.unwrap();
    assert!(nothing.events.is_empty() && !nothing.at_end, "a filter matching nothing stops in time: {nothing:?}");
    let refused = reader.page("not-a-position", 7, &[], far()).await.unwrap_err();
    assert!(matches!(refused, event_store::Error::BadInput(_)), "{refused}");
}

/// The stack upgraded from the version that kept every bookkeeping item in slot -2: readers read
/// the archive there until the archiver has moved its items to its own partition (or for good, if
/// archiving was turned off since), and it moves them once the old archiver's lease has lapsed.
async fn an_upgrade_moves_the_archive(env: &TestEnv, bucket: &Bucket, archiver: &Archiver, (to, run_at): (i64, i64)) {
    let table = env.names.event_table.as_str();
    let before = log(env, Some(bucket.clone()), T0, to).await;
    common::as_the_version_before(env, Family::Archive).await;
    let ours = || {
        let key = event_store::bookkeeping::key_in(Family::Archive, "archive#boundary".into());
        env.dynamo.get_item().table_name(table).set_key(Some(key)).send()
    };
    assert!(ours().await.unwrap().item().is_none(), "as the version before left it");
    assert_eq!(log(env, Some(bucket.clone()), T0, to).await, before, "read where it is");
    assert_eq!(audit::verify(&env.dynamo, table, bucket, T0, to).await.unwrap().first_break, None);
    common::an_old_lease(env, "archive#lease", event_store::time::now_ms() + 60_000).await;
    let busy = archiver.run(run_at, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert!(busy.busy && ours().await.unwrap().item().is_none(), "not while the old archiver may write: {busy:?}");
    common::an_old_lease(env, "archive#lease", event_store::time::now_ms() - 1).await;
    let moved = archiver.run(run_at, Instant::now() + Duration::from_secs(60)).await.unwrap();
    assert!(!moved.busy && moved.objects == 0, "{moved:?}");
    assert!(ours().await.unwrap().item().is_some(), "moved");
    assert_eq!(log(env, Some(bucket.clone()), T0, to).await, before, "read as before the upgrade");
    assert_eq!(audit::verify(&env.dynamo, table, bucket, T0, to).await.unwrap().first_break, None);
}

/// What readers follow besides the chain, tampered with as a role that may write the bookkeeping
/// partition could: each is an error for readers (never an empty range) and a break for verify.
async fn tamper_with_what_readers_follow(env: &TestEnv, bucket: &Bucket) {
    let table = env.names.event_table.as_str();
    let entries = store::entries_from(&env.dynamo, table, 0).await.unwrap();
    let last = entries.last().unwrap().clone();
    let whole = audit::verify(&env.dynamo, table, bucket, T0, last.end).await.unwrap();
    assert_eq!(whole.first_break, None);
    let bookkeeping = |sort_key: String| event_store::bookkeeping::key_in(Family::Archive, sort_key);
    // A pointer deleted: its range reads as an error, not as 55 events gone.
    let victim = &entries[4];
    let pointer_key = format!("archive#object#{:013}#{:012}", victim.start, victim.seq);
    let (saved, _) = event_store::bookkeeping::query_in(
        &env.dynamo,
        table,
        Family::Archive,
        (pointer_key.clone(), pointer_key.clone()),
    )
    .await
    .unwrap();
    env.dynamo.delete_item().table_name(table).set_key(Some(bookkeeping(pointer_key))).send().await.unwrap();
    let refused = try_log(env, Some(bucket.clone()), victim.start, victim.end).await.unwrap_err();
    assert!(refused.to_string().contains("no object holds it"), "{refused}");
    let broken = audit::verify(&env.dynamo, table, bucket, T0, last.end).await.unwrap().first_break.unwrap();
    assert!(broken.starts_with(&format!("entry {}: its pointer is missing", victim.seq)), "{broken}");
    env.dynamo.put_item().table_name(table).set_item(Some(saved[0].clone())).send().await.unwrap();
    assert_eq!(try_log(env, Some(bucket.clone()), victim.start, victim.end).await.unwrap().len() as u64, victim.count);
    // The boundary moved past the last entry: the slots after it would read as archived and empty.
    let boundary_key = || bookkeeping("archive#boundary".into());
    let moved = env.dynamo.update_item().table_name(table).set_key(Some(boundary_key()));
    let moved = moved.update_expression("SET archived_to = :to");
    let to = aws_sdk_dynamodb::types::AttributeValue::N((last.end + 3_600_000).to_string());
    moved.expression_attribute_values(":to", to).send().await.unwrap();
    let broken = audit::verify(&env.dynamo, table, bucket, T0, last.end).await.unwrap().first_break.unwrap();
    assert!(broken.starts_with("the archive's boundary is at"), "{broken}");
    let put_back = env.dynamo.update_item().table_name(table).set_key(Some(boundary_key()));
    let put_back = put_back.update_expression("SET archived_to = :to");
    let to = aws_sdk_dynamodb::types::AttributeValue::N(last.end.to_string());
    put_back.expression_attribute_values(":to", to).send().await.unwrap();
    // A late mark deleted: the late event in the archived slot would be passed over.
    // (The scan marked it, in its own partition.)
    let mark = event_store::bookkeeping::key(format!("late#{:013}", T0 + 360_000));
    env.dynamo.delete_item().table_name(table).set_key(Some(mark)).send().await.unwrap();
    let broken = audit::verify(&env.dynamo, table, bucket, T0, last.end).await.unwrap().first_break.unwrap();
    assert!(broken.contains("no late mark"), "{broken}");
    // The last entry and its pointer deleted (its object cannot be, by any role): its anchor gives it away.
    let last_key = bookkeeping(format!("archive#entry#{:012}", last.seq));
    env.dynamo.delete_item().table_name(table).set_key(Some(last_key)).send().await.unwrap();
    let last_pointer = bookkeeping(format!("archive#object#{:013}#{:012}", last.start, last.seq));
    env.dynamo.delete_item().table_name(table).set_key(Some(last_pointer)).send().await.unwrap();
    let before_last = &entries[entries.len() - 2];
    let broken = audit::verify(&env.dynamo, table, bucket, before_last.start, before_last.end).await.unwrap();
    let broken = broken.first_break.unwrap();
    assert!(broken.starts_with(&format!("entry {}: it is anchored", last.seq)), "{broken}");
}

/// [`log`], or the error a reader stopped with.
async fn try_log(
    env: &TestEnv,
    archive: Option<Bucket>,
    start: i64,
    end: i64,
) -> event_store::Result<Vec<(String, Vec<u8>)>> {
    read_keys(env, archive, (start, end), event_store::slices::KeyRange::ALL).await
}

/// [`try_log`] for a reader of `keys`.
async fn read_keys(
    env: &TestEnv,
    archive: Option<Bucket>,
    range: (i64, i64),
    keys: event_store::slices::KeyRange,
) -> event_store::Result<Vec<(String, Vec<u8>)>> {
    read_with(env, &Tiers::new(archive), range, keys).await
}

/// [`read_keys`] through `tiers` (shared with other readers).
async fn read_with(
    env: &TestEnv,
    tiers: &Tiers,
    (start, end): (i64, i64),
    keys: event_store::slices::KeyRange,
) -> event_store::Result<Vec<(String, Vec<u8>)>> {
    let table = env.names.event_table.as_str();
    let (slots, _) = read_index(&env.dynamo, table, start, end).await?;
    let window = Window { start, end };
    let reader = Reader {
        dynamo: &env.dynamo,
        table,
        time_unit_ms: 1000,
        page_items: None,
        dedupe_window_ms: 0,
        window: &window,
        keys,
        tiers,
    };
    let mut out = Vec::new();
    let keep = |event: &event_store::event_item::EventItem, _: Option<Value>, bytes: &[u8]| {
        out.push((event.sort_key.clone(), bytes.to_vec()));
        ControlFlow::Continue(())
    };
    reader.each_event(slots, Checkpoint::at_slot(start), &mut RecentIds::new(0), keep).await?;
    Ok(out)
}

/// A process that dies after `after` requests, counted across every client
/// it is given (DynamoDB and S3): each request from then on fails.
#[derive(Debug, Clone)]
struct DiesAfter {
    after: usize,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl aws_sdk_dynamodb::config::Intercept for DiesAfter {
    fn name(&self) -> &'static str {
        "DiesAfter"
    }

    fn read_before_transmit(
        &self,
        _: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        if self.seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= self.after {
            return Err("injected: the archiver died here".into());
        }
        Ok(())
    }
}

/// An archiver crash at every step, one after the other: each range of two
/// hours is archived by a run that dies after its `k`-th request (DynamoDB or
/// S3), then by a healthy run. After each, the events around the range are
/// read once each, in order, across the tiers; at the end the whole log is,
/// the chain is whole, one entry per object, and nothing archived is left in
/// the table.
#[test]
fn an_archiver_crash_at_any_step_repeats_it_and_never_loses_or_doubles_an_event() {
    // As above: a thread with room for unoptimized polls.
    common::on_a_large_stack(archiver_crashes);
}

async fn archiver_crashes() {
    const RANGE: i64 = 2 * 3_600_000;
    const RANGES: i64 = 80;
    const PER_RANGE: i64 = 4;
    let env = TestEnv::start(1).await;
    // Two events an hour, half an hour apart.
    let records: Vec<_> = (0..RANGES * PER_RANGE)
        .map(|i| (format!("user-{}", i % 3), json!({"n": i}).to_string().into_bytes(), T0 + i * 1_800_000 + 7))
        .collect();
    common::buffer_through_pump(&env, &records).await;
    let scan = event_store::config::ScanConfig { segments: 1, watermark_lag_ms: 0, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(600))).await
    {
        pass.unwrap();
    }
    let s3 = aws_sdk_s3::Client::from_conf(aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).build());
    s3.create_bucket().bucket(BUCKET).send().await.unwrap();
    let bucket = Bucket::new(&env.sdk, BUCKET.into());
    // The events of ranges `from..to` as a reader gets them, and as they were sent.
    let read = |(from, to): (i64, i64)| {
        let (env, bucket) = (&env, bucket.clone());
        async move {
            let read = log(env, Some(bucket), T0 + from * RANGE, T0 + to * RANGE).await;
            let n = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes).unwrap()["n"].as_i64().unwrap();
            read.iter().map(|(_, bytes)| n(bytes)).collect::<Vec<_>>()
        }
    };
    let sent = |(from, to): (i64, i64)| (from * PER_RANGE..to * PER_RANGE).collect::<Vec<_>>();
    assert_eq!(read((0, RANGES)).await, sent((0, RANGES)));

    // A lease that has lapsed by the next run: a dead run does not hold the archive up.
    let healthy = Archiver {
        config: ArchiveConfig { lease: Duration::from_millis(1), object_bytes: 256, ..archiver(&env, &bucket).config },
        ..archiver(&env, &bucket)
    };
    let mut survived_at = None;
    for k in 0..RANGES as usize {
        let range = k as i64;
        let range_end = T0 + (range + 1) * RANGE;
        // The range archived before, this one, and the next (hot).
        let around = ((range - 1).max(0), (range + 2).min(RANGES));
        let dies = DiesAfter { after: k, seen: Default::default() };
        let dynamo = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&env.sdk).interceptor(dies.clone()).build(),
        );
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).interceptor(dies.clone()).build(),
        );
        let crashing = Archiver { dynamo, bucket: Bucket { s3, name: BUCKET.into() }, config: healthy.config.clone() };
        let crashed = crashing.run(range_end, Instant::now() + Duration::from_secs(60)).await;
        assert_eq!(read(around).await, sent(around), "after a crash at request {k}");
        if crashed.is_ok() {
            survived_at = Some(k);
            break;
        }
        let repeated = healthy.run(range_end, Instant::now() + Duration::from_secs(60)).await.unwrap();
        assert_eq!((repeated.boundary, repeated.more), (range_end, false), "after a crash at request {k}");
        assert_eq!(read(around).await, sent(around), "after the run that repeated the step of request {k}");
    }
    let survived_at = survived_at.expect("a run that needed fewer requests than there are ranges");
    // The first run that lived needed `survived_at` requests: the ones before it died at each of them.
    assert!(survived_at >= 12, "a run of two objects is more steps than {survived_at} requests");
    assert_eq!(read((0, RANGES)).await, sent((0, RANGES)), "the whole log, across both tiers");

    let table = env.names.event_table.as_str();
    let boundary = T0 + (survived_at as i64 + 1) * RANGE;
    let verified = audit::verify(&env.dynamo, table, &bucket, T0, boundary).await.unwrap();
    let entries = store::entries_from(&env.dynamo, table, 0).await.unwrap();
    assert_eq!(verified.first_break, None);
    let archived_events = (survived_at as u64 + 1) * PER_RANGE as u64;
    let moved = entries.iter().filter(|e| e.start < boundary).count() as u64;
    assert_eq!((verified.entries, verified.events), (moved, archived_events));
    assert_eq!(entries.last().unwrap().end, T0 + RANGES * RANGE, "every complete hour copied, moved or not");
    let keys: std::collections::HashSet<&str> = entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys.len(), entries.len(), "no object archived twice");
    let archived_left = env
        .scan_table(table)
        .await
        .into_iter()
        .filter_map(|item| item.get("slot").and_then(|v| v.as_n().ok()).and_then(|n| n.parse::<i64>().ok()))
        .filter(|slot| (T0..boundary).contains(slot))
        .count();
    assert_eq!(archived_left, 0, "every archived slot left the event table");

    // Two more ranges of events, not copied yet: the runs above copied every complete hour there was.
    let more: Vec<_> = (RANGES * PER_RANGE..(RANGES + 2) * PER_RANGE)
        .map(|i| (format!("user-{}", i % 3), json!({"n": i}).to_string().into_bytes(), T0 + i * 1_800_000 + 7))
        .collect();
    common::buffer_through_pump(&env, &more).await;
    let scan = event_store::config::ScanConfig { segments: 1, watermark_lag_ms: 0, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(600))).await
    {
        pass.unwrap();
    }

    // Objects are written once. A crash right after an object's put, then a late event into its
    // first slot (on a shard of its own, so that its arrival stands), then the repeat, once the
    // move's cut has come inside that first attempt's object (the archiver down that long): the
    // repeat reads as far as that object, whole; the object misses the late event and is kept as it
    // is; the late event stays in the table and is read once, in its place.
    let next = T0 + RANGES * RANGE;
    let range = RANGES;
    let put = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dies = DiesAfterPut { put: put.clone() };
    let crashing = Archiver {
        dynamo: aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&env.sdk).interceptor(dies.clone()).build(),
        ),
        bucket: Bucket {
            s3: aws_sdk_s3::Client::from_conf(
                aws_sdk_s3::config::Builder::from(&env.sdk).force_path_style(true).interceptor(dies).build(),
            ),
            name: BUCKET.into(),
        },
        config: healthy.config.clone(),
    };
    assert!(crashing.run(next + RANGE, Instant::now() + Duration::from_secs(60)).await.is_err());
    assert!(put.load(std::sync::atomic::Ordering::SeqCst), "it died after putting an object");
    let late = [("user-9".to_owned(), json!({"n": -1}).to_string().into_bytes(), next + 500)];
    let pump = common::pump(&env);
    let pumped = pump.handle(common::kinesis_event_on(common::TEST_ARN, "shardId-000000000009", &late)).await;
    assert!(pumped.batch_item_failures.is_empty());
    let scan = event_store::config::ScanConfig { segments: 1, watermark_lag_ms: 0, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(600))).await
    {
        pass.unwrap();
    }
    // Any other object already at an object's key is not replaced: the repeat copies the range and
    // stops at the next one's key, with an error naming it, having moved nothing.
    let key = event_store::archive::object_key("events/", next + RANGE);
    s3.put_object().bucket(BUCKET).key(&key).body(b"not an object of ours".to_vec().into()).send().await.unwrap();
    let refused = healthy.run(next + 30 * 60_000, Instant::now() + Duration::from_secs(60)).await.unwrap_err();
    assert!(refused.to_string().starts_with(&format!("archive: {key} is already there")), "{refused}");
    assert_eq!(store::boundary(&env.dynamo, table).await.unwrap().archived_to, boundary);
    let kept = store::entries_from(&env.dynamo, table, 0).await.unwrap().into_iter().find(|e| e.start == next).unwrap();
    assert_eq!((kept.count, kept.end), (2, next + 1_801_000), "the first attempt's object, both its events");
    let first = range * PER_RANGE;
    assert_eq!(read((range, range + 1)).await, [first, -1, first + 1, first + 2, first + 3], "the late event once");
    let verified = audit::verify(&env.dynamo, table, &bucket, T0, next + RANGE).await.unwrap();
    assert_eq!(verified.first_break, None);

    // A damaged item (bytes that do not decode) is quarantined, not archived, and holds nothing back:
    // the archiver goes on, and status counts it.
    s3.delete_object().bucket(BUCKET).key(&key).send().await.unwrap();
    let (from, to) = (next + RANGE, next + 2 * RANGE);
    let mut items = env.scan_table(table).await;
    items.retain(|i| i["slot"].as_n().unwrap().parse::<i64>().is_ok_and(|slot| (from..to).contains(&slot)));
    let mut damaged = items.swap_remove(0);
    let slot = damaged["slot"].as_n().unwrap().parse::<i64>().unwrap();
    let lost: Vec<i64> = event_store::chunk::decode_item(slot, &damaged)
        .events
        .unwrap()
        .iter()
        .map(|e| serde_json::from_slice::<Value>(&e.bytes().unwrap()).unwrap()["n"].as_i64().unwrap())
        .collect();
    damaged.insert("data".into(), aws_sdk_dynamodb::types::AttributeValue::B(b"damaged".to_vec().into()));
    env.dynamo.put_item().table_name(table).set_item(Some(damaged)).send().await.unwrap();
    // And an item of one event (as written before chunks) whose bytes do not decode: an item that parses
    // is no less damaged for that (the archiver skipped its row and kept it, unmarked, before).
    let lone = event_store::event_item::EventItem {
        slot,
        sort_key: format!("{:013}#shardId-000000000042#0011", slot + 1),
        event_id: "shardId-000000000042:1".into(),
        arrival: slot + 1,
        partition_key: "user-lone".into(),
        data: Some(b"not zstd at all".to_vec()),
        encoding: Some("zstd".into()),
        payload: None,
        expires_at: None,
        moved_at: None,
    };
    env.dynamo.put_item().table_name(table).set_item(Some(lone.to_item())).send().await.unwrap();
    // Its S3 requests counted too: what the archive function asks is checked against its role below.
    let counted = Archiver {
        dynamo: env.dynamo.clone(),
        bucket: Bucket {
            s3: aws_sdk_s3::Client::from_conf(
                aws_sdk_s3::config::Builder::from(&env.sdk)
                    .force_path_style(true)
                    .interceptor(env.counter.clone())
                    .build(),
            ),
            name: BUCKET.into(),
        },
        config: healthy.config.clone(),
    };
    env.counter.reset();
    let went_on = counted.run(to, Instant::now() + Duration::from_secs(60)).await.unwrap();
    common::assert_allowed_by_the_template(&env.counter, "ArchiveFunction");
    assert_eq!((went_on.boundary, went_on.quarantined), (to, 2), "{went_on:?}");
    let expected: Vec<i64> = sent((range + 1, range + 2)).into_iter().filter(|n| !lost.contains(n)).collect();
    assert_eq!(read((range + 1, range + 2)).await, expected);
    let quarantine = aws_sdk_dynamodb::types::AttributeValue::N("-1".into());
    let mut quarantined: Vec<_> = env.scan_table(table).await.into_iter().filter(|i| i["slot"] == quarantine).collect();
    assert_eq!(quarantined.len(), 2);
    quarantined.retain(|q| q["original"].as_m().unwrap()["data"].as_b().unwrap().as_ref() == b"damaged");
    assert!(quarantined[0]["sort_key"].as_s().unwrap().starts_with(&format!("event#{slot}#")), "{quarantined:?}");
    assert!(quarantined[0]["reason"].as_s().unwrap().contains("does not"), "{quarantined:?}");
    let verified = audit::verify(&env.dynamo, table, &bucket, T0, to).await.unwrap();
    assert_eq!(verified.first_break, None);

    Box::pin(parallel_runs_across_the_tiers(&env, &bucket, &healthy, to)).await;
}

/// A window played by 4 runs at once, each the keys of its quarter of the key hashes, across both
/// tiers: the window's first half archived, its second half in the table cut into 4 slices. The run
/// with the most events is killed once it has put a batch, and its invocation's retry resumes it
/// from its own checkpoint while the others play on: every event once (the killed run's batch in
/// flight at most again), each key in order, each run passing over only the other keys of what it
/// had to read whole (the archive's objects).
async fn parallel_runs_across_the_tiers(env: &TestEnv, bucket: &Bucket, archiver: &Archiver, from: i64) {
    use event_store::slices::KeyRange;
    const N: i64 = 3_200;
    const PARTS: u32 = 4;
    let (start, end) = (from, from + 64_000);
    // 50 events a slot over 64 slots, 100 keys; arrivals after the boundary (behind the watermark:
    // late for it, in slots nothing archived yet).
    let records: Vec<_> = (0..N)
        .map(|i| {
            let arrival = start + (i / 50) * 1_000 + 10 + i % 50;
            (format!("visitor-{}", i % 100), json!({"n": 100_000 + i}).to_string().into_bytes(), arrival)
        })
        .collect();
    // On a shard of its own: arrivals before a shard's last one would be taken as that one's.
    let pump = common::pump(env);
    for batch in records.chunks(500) {
        let event = common::kinesis_event_on(common::TEST_ARN, "shardId-000000000012", batch);
        assert!(pump.handle(event).await.batch_item_failures.is_empty());
    }
    let scan =
        event_store::config::ScanConfig { segments: 1, watermark_lag_ms: 0, slices: 4, ..scan_config(&env.names) };
    for pass in
        run_scan(env.dynamo.clone(), env.kinesis.clone(), scan, json!({}), deadline_in(Duration::from_secs(600))).await
    {
        pass.unwrap();
    }
    let cold_end = start + 32_000;
    let archived = Archiver {
        // Objects of some hundreds of events, cut into slices as their slots were all the same.
        config: ArchiveConfig { object_bytes: 64 * 1024, min_slice_rows: 64, ..archiver.config.clone() },
        dynamo: archiver.dynamo.clone(),
        bucket: archiver.bucket.clone(),
    };
    let moved = archived.run(cold_end, Instant::now() + Duration::from_secs(120)).await.unwrap();
    assert_eq!(moved.boundary, cold_end, "{moved:?}");
    // The window as one reader of every key reads it: (key, n, cold) in log order.
    let key_of =
        |n: i64| if n >= 100_000 { format!("visitor-{}", (n - 100_000) % 100) } else { format!("user-{}", n % 3) };
    let expected: Vec<(String, i64, bool)> = log(env, Some(bucket.clone()), start, end)
        .await
        .iter()
        .map(|(sort_key, bytes)| {
            let n = serde_json::from_slice::<Value>(bytes).unwrap()["n"].as_i64().unwrap();
            (key_of(n), n, sort_key[..13].parse::<i64>().unwrap() < cold_end)
        })
        .collect();
    assert_eq!(expected.iter().filter(|(_, n, _)| *n >= 100_000).count() as i64, N);
    assert!(expected.iter().any(|e| e.2) && expected.iter().any(|e| !e.2), "both tiers");
    let in_part = |part: u32| expected.iter().filter(move |(key, _, _)| KeyRange::new(part, PARTS).holds(key));
    let killed = (0..PARTS).max_by_key(|&p| in_part(p).count()).unwrap();
    assert!(in_part(killed).count() > 600, "more than a batch to put after the first");

    let config = PlaybackConfig {
        archive_bucket: Some(BUCKET.into()),
        lease: Duration::from_secs(2),
        ..runs::playback_config(&env.names)
    };
    // 300 events a second each: a run of some 800 waits for the pace between its two puts.
    let request = |part: u32| {
        json!({"start": event_store::time::format_ms(start), "end": event_store::time::format_ms(end),
               "max_records_per_second": 1200, "keys": {"part": part, "parts": PARTS}})
    };
    let playback = |invoker| {
        Playback::new(env.dynamo.clone(), env.kinesis.clone(), config.clone(), invoker)
            .with_archive(Some(bucket.clone()))
    };
    let play = |part: u32| runs::run_playback(playback, request(part), deadline_in(Duration::from_secs(300)));
    let (invoker, _continuations) = event_store_emulator::invoke::LocalInvoker::channel();
    let dying = playback(std::sync::Arc::new(invoker));
    let payload = request(killed);
    let running =
        tokio::spawn(async move { dying.handle(payload, SystemTime::now() + Duration::from_secs(900)).await });
    let id = format!("{}-{killed}of{PARTS}", event_store::playback::run_id(&Window { start, end }, &[]));
    let kill = common::kill_playback_after(env, &id, 500, running);
    let others = futures::future::join_all((0..PARTS).filter(|&p| p != killed).map(play));
    let (others, ()) = tokio::join!(others, kill);
    let resumed = play(killed).await;
    let summary = |runs: Vec<event_store::Result<event_store::playback::PlaybackSummary>>| {
        event_store::playback::PlaybackSummary::total(&runs.into_iter().map(Result::unwrap).collect::<Vec<_>>())
    };
    let resumed = summary(resumed);
    assert_eq!(resumed.status, event_store::playback::Status::Complete, "{resumed:?}");
    assert_eq!(resumed.events, in_part(killed).count() - 500, "the resumed run starts after the killed one's put");
    // Each run read whole only the archived slots: it passed over the other keys there, and nowhere else.
    let parts: Vec<u32> = (0..PARTS).filter(|&p| p != killed).collect();
    for (part, runs) in parts.iter().zip(others) {
        let total = summary(runs);
        assert_eq!((total.status, total.events), (event_store::playback::Status::Complete, in_part(*part).count()));
        // Slots and objects alike cut into its slices: it read no other key's event.
        assert_eq!(total.other_keys, 0, "part {part}");
    }

    let mut played: Vec<(String, i64, KeyRange)> = Vec::new();
    for (_, record) in env.read_stream(&env.names.playback_stream).await {
        let key = record.partition_key().unwrap();
        for (_, data) in event_store::aggregation::deaggregate(key, record.data().as_ref()).unwrap() {
            let event = serde_json::from_slice::<event_store::log::PlayedEvent>(&data).unwrap();
            let n = event.data.as_ref().unwrap()["n"].as_i64().unwrap();
            played.push((event.partition_key, n, event.keys.expect("a parallel run's record says its part")));
        }
    }
    assert!(played.iter().all(|(key, _, keys)| keys.holds(key)), "each run played only its keys");
    assert!(played.len() <= expected.len() + 500, "at most the killed run's batch in flight again");
    let mut keys: Vec<&String> = expected.iter().map(|(key, _, _)| key).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let sent: Vec<i64> = expected.iter().filter(|(k, _, _)| k == key).map(|(_, n, _)| *n).collect();
        let mut first = Vec::new();
        for (_, n, _) in played.iter().filter(|(k, _, _)| k == key) {
            if !first.contains(n) {
                first.push(*n);
            }
        }
        assert_eq!(first, sent, "{key}: every event, in order, on its first delivery");
    }

    // Readers in one process (as the local stack runs many runners) share the pieces they need: 8
    // readers of 8 parts and 4 of 4 parts need the 4 slices' row groups of the first cold object, so
    // 4 pieces are fetched (2 ranged GETs each: footer, groups), not one for each reader.
    let ranged = RangedGets::default();
    let counted = Bucket {
        s3: aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&env.sdk).interceptor(ranged.clone()).build(),
        ),
        name: BUCKET.into(),
    };
    let pointer = store::object_at(&env.dynamo, &env.names.event_table, start).await.unwrap().unwrap();
    let entry = store::entries_from(&env.dynamo, &env.names.event_table, pointer.seq).await.unwrap().remove(0);
    let slices: std::collections::BTreeSet<u32> = entry.cut.as_ref().unwrap().groups.iter().map(|g| g.slice).collect();
    assert_eq!(slices.len(), 4, "rows of every slice: 4 pieces");
    let shared = Tiers::new(Some(counted));
    let ranges: Vec<KeyRange> =
        (0..8).map(|p| KeyRange::new(p, 8)).chain((0..4).map(|p| KeyRange::new(p, 4))).collect();
    let reads = ranges.iter().map(|keys| read_with(env, &shared, (pointer.start, pointer.end), *keys));
    let mut read = 0;
    for (keys, events) in ranges.iter().zip(futures::future::join_all(reads).await) {
        let n = |bytes: &[u8]| serde_json::from_slice::<Value>(bytes).unwrap()["n"].as_i64().unwrap();
        read += events.unwrap().iter().filter(|(_, bytes)| keys.holds(&key_of(n(bytes)))).count() as u64;
    }
    assert_eq!(read, pointer.count * 2, "every event of the object, once by each set of ranges");
    assert_eq!(ranged.0.load(std::sync::atomic::Ordering::SeqCst), 4 * 2, "each piece fetched once");
    // Read again slot by slot by the same 12 readers: every piece is kept, nothing fetched again.
    let again = ranges.iter().map(|keys| read_with(env, &shared, (pointer.start, pointer.end), *keys));
    assert!(futures::future::join_all(again).await.into_iter().all(|r| r.is_ok()));
    assert_eq!(ranged.0.load(std::sync::atomic::Ordering::SeqCst), 4 * 2, "kept for each range that read it");

    // What a reader of some keys fetches it checks: one row group of the cold half's first object
    // altered (its entry as it was), the readers of the other slices read on; its slice's is refused.
    let table = env.names.event_table.as_str();
    let pointer = store::object_at(&env.dynamo, table, start).await.unwrap().expect("the cold half's first object");
    let entry = store::entries_from(&env.dynamo, table, pointer.seq).await.unwrap().remove(0);
    let cut = entry.cut.clone().expect("cut by slice, as its slots were");
    assert_eq!(cut.slices, PARTS);
    let object = bucket.get(&entry.key).await.unwrap();
    let group = &cut.groups[0];
    let mut altered = object.to_vec();
    altered[(group.span.offset + group.span.length / 2) as usize] ^= 0xff;
    let put = |bytes: Vec<u8>| bucket.s3.put_object().bucket(BUCKET).key(&entry.key).body(bytes.into()).send();
    put(altered).await.unwrap();
    let range = (pointer.start, pointer.end);
    for part in 0..PARTS {
        let keys = KeyRange::new(part, PARTS);
        let read = read_keys(env, Some(bucket.clone()), range, keys).await;
        if part == group.slice {
            let refused = read.unwrap_err().to_string();
            assert!(refused.contains("is not the object entry"), "{refused}");
            continue;
        }
        let read = read.unwrap();
        let in_object: u64 = cut.groups.iter().filter(|g| g.slice == part).map(|g| g.rows).sum();
        assert_eq!(read.len() as u64, in_object, "part {part}: its slice's rows, from an object altered elsewhere");
        assert!(read.iter().all(|(_, bytes)| {
            let n = serde_json::from_slice::<Value>(bytes).unwrap()["n"].as_i64().unwrap();
            keys.holds(&key_of(n))
        }));
    }
    put(object.to_vec()).await.unwrap();

    // pyarrow finds the cut the entry records: the slice count in the file's metadata, each row
    // group's keys all of its slice (hashed as Python hashes them), its bytes where and as the entry says.
    let path = std::env::temp_dir().join(format!("event-store-cut-{}.parquet", std::process::id()));
    std::fs::write(&path, &object).unwrap();
    let script = r#"
import hashlib, json, sys
import pyarrow.parquet as pq
data = open(sys.argv[1], "rb").read()
f = pq.ParquetFile(sys.argv[1])
slices = int(f.metadata.metadata[b"event-store.slices"])
span = lambda start, end: {"offset": start, "length": end - start, "sha256": hashlib.sha256(data[start:end]).hexdigest()}
groups = []
for i in range(f.num_row_groups):
    keys = f.read_row_group(i, columns=["partition_key"]).column("partition_key").to_pylist()
    of = {int.from_bytes(hashlib.sha256(k.encode()).digest()[:8], "big") * slices >> 64 for k in keys}
    rg = f.metadata.row_group(i)
    chunks = [rg.column(c) for c in range(rg.num_columns)]
    starts = [c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in chunks]
    end = max(s + c.total_compressed_size for s, c in zip(starts, chunks))
    assert len(of) == 1, of
    groups.append({"slice": of.pop(), "rows": rg.num_rows, "span": span(min(starts), end)})
footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
print(json.dumps({"slices": slices, "footer": span(footer, len(data)), "groups": groups}))
"#;
    let python = repo_root().join(".venv/bin/python");
    let out = std::process::Command::new(&python).arg("-c").arg(script).arg(&path).output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(out.status.success(), "{}: {}", python.display(), String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen, serde_json::to_value(&cut).unwrap(), "pyarrow's view of the object is the entry's cut");
}

/// Counts S3 requests for part of an object (a `Range` header).
#[derive(Debug, Clone, Default)]
struct RangedGets(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl aws_sdk_s3::config::Intercept for RangedGets {
    fn name(&self) -> &'static str {
        "RangedGets"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_s3::config::RuntimeComponents,
        _: &mut aws_sdk_s3::config::ConfigBag,
    ) -> Result<(), aws_sdk_s3::error::BoxError> {
        if context.request().headers().get("range").is_some() {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A process that dies right after it puts an archive object: every request after it fails.
#[derive(Debug, Clone)]
struct DiesAfterPut {
    put: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl aws_sdk_dynamodb::config::Intercept for DiesAfterPut {
    fn name(&self) -> &'static str {
        "DiesAfterPut"
    }

    fn read_before_transmit(
        &self,
        context: &aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef<'_>,
        _: &aws_sdk_dynamodb::config::RuntimeComponents,
        _: &mut aws_sdk_dynamodb::config::ConfigBag,
    ) -> Result<(), aws_sdk_dynamodb::error::BoxError> {
        if self.put.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("injected: the archiver died here".into());
        }
        let request = context.request();
        if request.method() == "PUT" && request.uri().contains("/events/") {
            self.put.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}
