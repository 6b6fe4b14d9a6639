//! The pixel in a real web page: headless Chromium opens the local stack's
//! demo page (which loads the pixel), clicks the button (which posts an
//! event), and both events must reach the event table with the page's
//! referer and the browser's user agent.
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
async fn page_view_and_button_click_reach_the_event_table() {
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
    browser.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(answer.starts_with("202"), "the button's post was answered {answer:?}");

    // Both events, moved by the stack's scan into the event table.
    let sdk = sdk_config(&emulator.endpoint).await;
    let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
    let started = Instant::now();
    let envelopes = loop {
        let out = dynamo.scan().table_name("event-store-browsertest-event-table").send().await.unwrap();
        let envelopes: Vec<Envelope> = out
            .items()
            .iter()
            // Events are stored in chunks: decode each item of a time slot into its events.
            .filter(|i| i.get("slot").and_then(|v| v.as_n().ok()).is_some_and(|n| !n.starts_with('-')))
            .filter_map(|i| event_store::chunk::decode_item(0, i).events.ok())
            .flatten()
            .filter_map(|e: EventItem| e.json())
            .filter_map(|p| serde_json::from_value(p).ok())
            .collect();
        if envelopes.len() >= 2 || started.elapsed() > Duration::from_secs(30) {
            break envelopes;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
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
}
