//! The local stack's page in a real browser: headless Chromium opens it
//! (which loads the pixel), clicks the button (which posts an event); both
//! events must reach the event table with the page's referer and the
//! browser's user agent, and the page's chart and list of complete events
//! must show them, then two entity appends sent with `event-store streams`.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{sdk_config, start_local_stack, wait_for_port, Process};
use event_store::envelope::Envelope;
use event_store::event_item::EventItem;
use event_store_emulator::{free_port, moto_server, Emulator};
use fantoccini::{ClientBuilder, Locator};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn hits_and_appends_reach_the_event_table_and_the_page_shows_them() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let emulator = Emulator::start_on_free_port(&moto_server(&root)).unwrap();
    let _watchdog = event_store_emulator::watchdog::Watchdog::start(emulator.diagnostics().into_iter().collect());
    let http_port = free_port();
    let _stack = start_local_stack(emulator.port, http_port, "browsertest", &[("IP_MODE", "full")]);

    let driver_port = free_port();
    let chromedriver = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    let _driver = Process(
        Command::new(&chromedriver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{chromedriver}: {e} (make test installs chromium-driver)")),
    );
    wait_for_port(driver_port, "chromedriver");
    let profile = std::env::temp_dir().join(format!("event-store-chromium-{}", std::process::id()));
    let capabilities = json!({
        "goog:chromeOptions": {
            "binary": std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     format!("--user-data-dir={}", profile.display())]
        }
    });
    let browser = ClientBuilder::rustls()
        .unwrap()
        .capabilities(capabilities.as_object().unwrap().clone())
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .unwrap();
    let page = format!("http://127.0.0.1:{http_port}/");
    browser.goto(&page).await.unwrap();
    browser.find(Locator::Id("send")).await.unwrap().click().await.unwrap();
    let started = Instant::now();
    let answer = loop {
        let text = browser.find(Locator::Id("result")).await.unwrap().text().await.unwrap();
        if text.starts_with("202") || started.elapsed() > Duration::from_secs(20) {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let user_agent = browser.execute("return navigator.userAgent", vec![]).await.unwrap();
    let user_agent = user_agent.as_str().unwrap().to_owned();
    assert!(answer.starts_with("202"), "the button's post was answered {answer:?}");

    // Both events, moved by the stack's scan into the event table.
    let sdk = sdk_config(&emulator.endpoint).await;
    let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
    let started = Instant::now();
    let stored = loop {
        let out = dynamo.scan().table_name("event-store-browsertest-event-table").send().await.unwrap();
        let stored: Vec<EventItem> = out
            .items()
            .iter()
            // Events are stored in chunks: decode each item of a time slot into its events.
            .filter(|i| i.get("slot").and_then(|v| v.as_n().ok()).is_some_and(|n| !n.starts_with('-')))
            .filter_map(|i| event_store::chunk::decode_item(0, i).events.ok())
            .flatten()
            .collect();
        if stored.len() >= 2 || started.elapsed() > Duration::from_secs(30) {
            break stored;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    // The pixel hit has a subject (its EntityId): stored sealed, opened with the stack's keys.
    let raw: Vec<Vec<u8>> = stored.iter().map(|e| e.bytes().unwrap()).collect();
    assert!(raw.iter().all(|r| !String::from_utf8_lossy(r).contains("demo-visitor")), "sealed in the table");
    let keys = event_store::privacy::key_store(
        &sdk,
        event_store::privacy::KeyStore::reading("event-store-browsertest-key-table".into()),
    );
    let tiers = event_store::log::tiers::Tiers::new(None).with_keys(Some(keys));
    let mut envelopes: Vec<Envelope> = Vec::new();
    for event in &stored {
        envelopes.push(serde_json::from_slice(&tiers.bytes(event).await.unwrap().bytes).unwrap());
    }
    assert_eq!(envelopes.len(), 2, "{envelopes:#?}");
    let pixel = envelopes.iter().find(|e| e.path == "/track.gif").expect("the pixel event");
    let click = envelopes.iter().find(|e| e.path == "/events").expect("the button event");
    assert_eq!(pixel.query["page"], vec!["/"]);
    assert_eq!(pixel.query["EntityId"], vec!["demo-visitor"]);
    assert_eq!(click.body.as_ref().unwrap()["type"], "button-click");
    for event in [pixel, click] {
        assert_eq!(event.headers.referer.as_deref(), Some(page.as_str()), "{event:?}");
        assert_eq!(event.headers.user_agent.as_deref(), Some(user_agent.as_str()));
        assert_eq!(event.source_ip.as_deref(), Some("127.0.0.1"));
    }

    // The page is the store at a glance: its chart counts both hits, and its list shows them as their slots complete.
    let (total, recent) = glance(&browser, 2).await;
    assert_eq!(total, 2, "the ingest chart: {recent:?}");
    assert!(recent.iter().any(|l| l.contains("\"path\":\"/track.gif\"")), "{recent:?}");
    assert!(recent.iter().any(|l| l.contains("button-click")), "{recent:?}");

    // Entity appends count like any source: two, through `event-store streams` (the CLI, as a user
    // runs it against `make local`), the relay, the pump and the scan, onto the same chart.
    let cli = std::path::Path::new(env!("CARGO_BIN_EXE_event-store-local")).with_file_name("event-store");
    assert!(cli.exists(), "{}: build the workspace first (make test does)", cli.display());
    let events = r#"[{"type":"TodoCreated","data":{"title":"milk"}},{"type":"TodoDone","data":{}}]"#;
    let run = |args: &[&str]| {
        let out = Command::new(&cli)
            .args(args)
            .env("EMULATOR_PORT", emulator.port.to_string())
            .env("PORT", http_port.to_string())
            .env("STAGE", "browsertest")
            .env_remove("EVENT_STORE_STACK")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, said, err) = run(&["--json", "streams", "append", "todo-browser", "--new", events]);
    assert_eq!(code, Some(0), "{said} {err}");
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    assert_eq!((said["status"].as_u64(), said["version"].as_str()), (Some(201), Some("1")), "{said}");
    let (code, _, err) = run(&["streams", "append", "todo-browser", "--new", events]);
    assert_eq!((code, err.trim()), (Some(1), "409 Conflict, version 1"), "the stream exists: nothing appended");
    let (code, said, _) = run(&["streams", "read", "todo-browser"]);
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    let types: Vec<&str> = said["events"].as_array().unwrap().iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!((code, types), (Some(0), vec!["TodoCreated", "TodoDone"]));
    let (code, said, _) = run(&["streams", "list", "--prefix", "todo-"]);
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    let listed = serde_json::json!([{"name": "todo-browser", "version": 1, "deleted": false}]);
    assert_eq!((code, &said["streams"], &said["next"]), (Some(0), &listed, &serde_json::Value::Null), "{said}");
    // Stream metadata: the last event only, read at once; the log (the chart below) keeps both.
    let (code, said, err) =
        run(&["streams", "metadata", "todo-browser", "--set", r#"{"max_count":1}"#, "--expect", "0"]);
    assert_eq!(code, Some(0), "{said} {err}");
    let (code, said, _) = run(&["streams", "read", "todo-browser"]);
    let said: serde_json::Value = serde_json::from_str(&said).unwrap();
    let versions: Vec<u64> = said["events"].as_array().unwrap().iter().filter_map(|e| e["version"].as_u64()).collect();
    assert_eq!((code, versions), (Some(0), vec![1]));
    // An append across streams: a new stream, on the condition that the first is still at version 1.
    let across = r#"{"appends": [{"stream": "todo-browser-2", "expected_version": "no_stream",
        "events": [{"type": "TodoCreated", "data": {"title": "bread"}}]}],
        "conditions": [{"stream": "todo-browser", "expected_version": 1}]}"#;
    let (code, said, err) = run(&["streams", "append-across", across]);
    assert_eq!(code, Some(0), "{said} {err}");
    let (code, _, err) =
        run(&["streams", "append-across", &across.replace("\"expected_version\": 1", "\"expected_version\": 0")]);
    assert_eq!((code, err.trim()), (Some(1), "409 Conflict"), "a stale condition: nothing appended");
    let (total, recent) = glance(&browser, 5).await;
    assert_eq!(total, 5, "{recent:?}");
    assert_eq!(recent.iter().filter(|l| l.contains(" streams/todo-browser ")).count(), 2, "{recent:?}");
    let bars = "return [...document.querySelectorAll('#ingest rect')].map(r => +r.dataset.count)";
    let bars: Vec<u64> = serde_json::from_value(browser.execute(bars, vec![]).await.unwrap()).unwrap();
    assert_eq!((bars.len(), bars.iter().sum::<u64>()), (60, 5), "a bar a minute, the hour's events in them");
    let verdict = browser.find(Locator::Id("verdict")).await.unwrap().text().await.unwrap();
    assert_eq!(verdict, "healthy");
    browser.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&profile);
}

/// The page's event total once it reaches `want` (or 60 s passed), and its list of complete events.
async fn glance(browser: &fantoccini::Client, want: u64) -> (u64, Vec<String>) {
    let started = Instant::now();
    loop {
        let total = browser.find(Locator::Id("ingest-total")).await.unwrap().attr("data-total").await.unwrap();
        let total: u64 = total.and_then(|t| t.parse().ok()).unwrap_or(0);
        let recent = "return [...document.querySelectorAll('#recent li')].map(li => li.textContent)";
        let recent: Vec<String> = serde_json::from_value(browser.execute(recent, vec![]).await.unwrap()).unwrap();
        let listed = recent.iter().filter(|l| l.contains("\"id\":")).count() as u64;
        if (total >= want && listed >= want) || started.elapsed() > Duration::from_secs(60) {
            return (total, recent);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
