//! The tracking events every section sends, padded to a payload size, and base64 for Kinesis records.

use event_store::time::format_ms;

const WORDS: &[&str] = &[
    "home",
    "pricing",
    "docs",
    "blog",
    "signup",
    "checkout",
    "cart",
    "search",
    "product",
    "account",
    "settings",
    "click",
    "view",
    "scroll",
    "submit",
    "play",
    "pause",
    "share",
    "like",
    "download",
    "en-US",
    "de-DE",
    "fr-FR",
    "mobile",
    "desktop",
    "tablet",
    "chrome",
    "firefox",
    "safari",
    "edge",
    "newsletter",
    "campaign",
    "spring-sale",
];

/// A tracking event like the ones load produces (an envelope with query,
/// headers and a hashed IP), padded with a property bag drawn from a small
/// vocabulary, as real analytics events are; ids and hashes are random.
pub(crate) fn payload(n: usize, size: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(n as u64);
    let hex = |rng: &mut fastrand::Rng, len: usize| (0..len).map(|_| rng.digit(16)).collect::<String>();
    let word = |rng: &mut fastrand::Rng| WORDS[rng.usize(..WORDS.len())];
    let mut event = serde_json::json!({
        "id": hex(&mut rng, 32),
        "received_at": format_ms(1_795_240_724_000 + n as i64),
        "method": "GET",
        "path": "/track.gif",
        "query": {"EntityId": [format!("user-{}", n % 50)], "page": [format!("/{}/{}", word(&mut rng), word(&mut rng))]},
        "headers": {
            "user-agent": "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
            "accept-language": "en-US,en;q=0.9",
            "referer": format!("https://www.example.com/{}/{}", word(&mut rng), word(&mut rng)),
        },
        "ip": hex(&mut rng, 64),
        "props": {},
    });
    let mut i = 0;
    while serde_json::to_vec(&event).map_or(0, |v| v.len()) + 24 < size {
        event["props"][format!("{}_{i}", word(&mut rng))] = serde_json::json!(word(&mut rng));
        i += 1;
    }
    serde_json::to_vec(&event).unwrap_or_default()
}

pub(crate) fn base64(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}
