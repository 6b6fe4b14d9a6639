//! The local stack's page in a real browser: headless Chromium opens it
//! (which loads the pixel), clicks the button (which posts an event); both
//! events must reach the event table with the page's referer and the
//! browser's user agent, and the page's chart and list of complete events
//! must show them, then two entity appends sent with `event-store streams`.
#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod common;
#[path = "common/gate.rs"]
mod gate;

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

    tracker_script_on_another_site(&browser, (&root, http_port), &sdk).await;
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

/// The tracker script (issue 49) on a page of another origin (to a browser, `localhost` is not
/// `127.0.0.1`), loaded from the stack with its integrity checked, sending through a gate the test
/// cuts, throttles and makes lose an answer: every event reaches the event table once (by
/// `EventId`), in order, a 429's `Retry-After` is waited out, and a page that withholds consent
/// sends nothing until it grants it.
async fn tracker_script_on_another_site(
    browser: &fantoccini::Client,
    (root, http_port): (&std::path::Path, u16),
    sdk: &aws_config::SdkConfig,
) {
    use base64::Engine;
    use gate::{Gate, Mode};
    use sha2::Digest;

    let gate = Gate::start(http_port).await;
    let name = event_store::load::TRACKER_SCRIPT;
    let built = std::fs::read(root.join("clients/web/dist").join(name)).unwrap();
    let integrity =
        format!("sha384-{}", base64::engine::general_purpose::STANDARD.encode(sha2::Sha384::digest(&built)));
    let through_gate = format!("s.dataset.endpoint = 'http://127.0.0.1:{}/events';", gate.port);
    let load = |extra: &str| {
        format!(
            "const s = document.createElement('script'); s.src = {:?}; s.integrity = {integrity:?}; \
             s.crossOrigin = 'anonymous'; {extra} document.head.appendChild(s);",
            format!("http://127.0.0.1:{http_port}/{name}"),
        )
    };
    let run = |script: String| async move { browser.execute(&script, vec![]).await.unwrap() };
    let queued = || async { run("return (JSON.parse(localStorage.getItem('es:queue') || '[]')).length".into()).await };

    browser.goto(&format!("http://localhost:{http_port}/")).await.unwrap();
    run("localStorage.clear();".into()).await;
    run(load(&through_gate)).await;
    delivered_at_least(&gate, 1, "the page view").await;
    // The signup happens on a page rendered within a trace: it carries the page's W3C trace context.
    let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = format!(
        "const m = document.createElement('meta'); m.name = 'traceparent'; m.content = {trace:?}; \
         document.head.appendChild(m); es.track('signup', {{plan: 'pro'}}); m.remove();"
    );
    run("history.pushState({}, '', '/a'); history.pushState({}, '', '/b');".into()).await;
    run(traced).await;
    delivered_at_least(&gate, 4, "two navigations and a custom event").await;

    // The network cut: events wait in the queue.
    gate.set(Mode::Cut);
    run("es.track('offline'); history.pushState({}, '', '/c');".into()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(queued().await, json!(2), "{:?}", gate.passed());
    assert!(gate.passed().iter().any(|p| p.status == 0), "a send was tried while cut");
    // Back, but the first answer is lost: sent again, and the store keeps one.
    gate.set(Mode::LoseOneAnswer);
    run("es.flush();".into()).await;
    let mut sent = 0;
    for _ in 0..300 {
        sent = gate.passed().iter().filter(|p| p.status == 202).count();
        if queued().await == json!(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(queued().await, json!(0), "{:?}", gate.passed());
    assert!(gate.passed().iter().any(|p| p.status == 503), "an answer was lost");
    assert!(sent >= 3, "the lost batch was sent again");

    // Throttled: each 429's Retry-After (2 s, longer than the first backoffs) is waited out.
    gate.set(Mode::Throttled(2));
    run("es.track('throttled');".into()).await;
    delivered_at_least(&gate, 7, "the throttled event").await;
    let passed = gate.passed();
    let from = passed.iter().position(|p| p.status == 429).unwrap();
    for pair in passed[from..].windows(2).take(2) {
        let waited = pair[1].at - pair[0].at;
        assert!(waited >= Duration::from_millis(1950), "{waited:?} after a 429: {passed:?}");
    }

    // Consent withheld: nothing is sent (nor stored) until the page grants it.
    browser.goto(&format!("http://localhost:{http_port}/?consent")).await.unwrap();
    run(load(&format!("{through_gate} s.dataset.consent = 'pending';"))).await;
    run("es.track('before-consent');".into()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(delivered(&gate).len(), 7, "nothing before consent");
    assert_eq!(queued().await, json!(0), "held in memory only");
    run("es.consent(true);".into()).await;
    delivered_at_least(&gate, 9, "the consented events").await;
    // Without data-endpoint: `events` beside the script, the stack's own CORS answering the page.
    browser.goto(&format!("http://localhost:{http_port}/?direct")).await.unwrap();
    run(load("")).await;
    run("es.track('direct');".into()).await;

    // In the event table: each once, in the order the page made them.
    let ids = delivered(&gate);
    let dynamo = aws_sdk_dynamodb::Client::new(sdk);
    let started = Instant::now();
    let envelopes: Vec<Envelope> = loop {
        let out = dynamo.scan().table_name("event-store-browsertest-event-table").send().await.unwrap();
        let envelopes: Vec<Envelope> = out
            .items()
            .iter()
            .filter(|i| i.get("slot").and_then(|v| v.as_n().ok()).is_some_and(|n| !n.starts_with('-')))
            .filter_map(|i| event_store::chunk::decode_item(0, i).events.ok())
            .flatten()
            .filter_map(|e| serde_json::from_slice::<Envelope>(&e.bytes().ok()?).ok())
            .filter(|e| e.body.as_ref().is_some_and(|b| b.get("client_time").is_some()))
            .collect();
        if envelopes.len() >= ids.len() + 2 || started.elapsed() > Duration::from_secs(60) {
            break envelopes;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut stored: Vec<&Envelope> = envelopes.iter().collect();
    stored.sort_by_key(|e| (e.received_at.clone(), e.body.as_ref().unwrap()["client_time"].as_u64()));
    let stored_ids: Vec<&str> = stored.iter().filter_map(|e| e.event_id.as_deref()).collect();
    assert_eq!(stored_ids.len(), ids.len() + 2, "each event once: {stored_ids:?}");
    assert_eq!(stored_ids[..ids.len()], ids.iter().map(String::as_str).collect::<Vec<_>>(), "in the order sent");
    let seen: Vec<(String, String)> = stored
        .iter()
        .map(|e| {
            let body = e.body.as_ref().unwrap();
            (body["type"].as_str().unwrap().to_owned(), body["path"].as_str().unwrap().to_owned())
        })
        .collect();
    let expected = [
        ("pageview", "/"),
        ("pageview", "/a"),
        ("pageview", "/b"),
        ("signup", "/b"),
        ("offline", "/b"),
        ("pageview", "/c"),
        ("throttled", "/c"),
        ("pageview", "/"),
        ("before-consent", "/"),
        ("pageview", "/"),
        ("direct", "/"),
    ];
    assert_eq!(seen, expected.map(|(t, p)| (t.to_owned(), p.to_owned())));
    let signup = stored[3].body.as_ref().unwrap();
    assert_eq!(signup["props"], json!({"plan": "pro"}));
    assert_eq!(signup["bot"], json!(true), "headless Chromium is flagged, not dropped");
    let traced: Vec<_> = stored.iter().filter_map(|e| e.trace.as_ref().map(|t| (&e.body, &t.traceparent))).collect();
    assert_eq!(traced.len(), 1, "only the signup was made within the trace: {traced:?}");
    assert_eq!((traced[0].0.as_ref().unwrap()["type"].as_str(), traced[0].1.as_str()), (Some("signup"), trace));
    assert!(stored.iter().all(|e| e.subject.is_none() && e.sealed.is_none()), "anonymous: nothing sealed");
}

/// The `EventId`s the gate let reach the stack (answered 202, or forwarded and the answer lost), first time each.
fn delivered(gate: &gate::Gate) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for passed in gate.passed().iter().filter(|p| p.status == 202 || p.status == 503) {
        for id in &passed.ids {
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
    }
    ids
}

async fn delivered_at_least(gate: &gate::Gate, count: usize, what: &str) {
    let started = Instant::now();
    while delivered(gate).len() < count {
        assert!(started.elapsed() < Duration::from_secs(30), "waited 30 s for {what}: {:?}", gate.passed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(delivered(gate).len(), count, "{what}: {:?}", gate.passed());
}
