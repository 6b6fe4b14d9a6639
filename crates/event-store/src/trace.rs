//! W3C trace context (`traceparent`, `tracestate`) kept with an event, so a
//! consumer can tie what it does to the request that caused the event. It
//! names a trace, not a person, so it stays in the clear beside sealed parts.
//! Pure: parsed from plain values, no HTTP types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The header, query parameter or posted field that carries each part.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";
/// W3C caps what a vendor must keep of `tracestate` at 512 characters.
const MAX_TRACESTATE_CHARS: usize = 512;
/// `00-<32 hex>-<16 hex>-<2 hex>`.
const TRACEPARENT_CHARS: usize = 55;

/// An event's trace context, as the W3C Trace Context recommendation
/// defines it: `traceparent` checked, `tracestate` kept as sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceContext {
    pub traceparent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context of these values, or `None` when `traceparent` is absent or
    /// not valid (the recommendation says to ignore an invalid one, and its
    /// `tracestate` with it, rather than refuse the request). A later version's
    /// `traceparent` is kept as its first 55 characters, the part this version
    /// of the recommendation defines (so a context is never larger than that
    /// and 512 characters of `tracestate`). A `tracestate` over 512 characters
    /// or with other than printable ASCII is dropped.
    pub(crate) fn parse(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = traceparent?.trim();
        if !valid_traceparent(traceparent) {
            return None;
        }
        let traceparent = &traceparent[..TRACEPARENT_CHARS];
        let tracestate = tracestate
            .map(str::trim)
            .filter(|s| {
                !s.is_empty() && s.len() <= MAX_TRACESTATE_CHARS && s.bytes().all(|b| (0x20..0x7f).contains(&b))
            })
            .map(str::to_owned);
        Some(Self { traceparent: traceparent.to_owned(), tracestate })
    }

    /// The 32 hex digits of the trace id (for logs, and X-Ray's `1-xxxxxxxx-xxxx…` form).
    pub(crate) fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The context an ingested event carries: the posted event's own fields
    /// first (a batch's events may come from different traces), then the
    /// query (a pixel, which cannot send headers), then the request's
    /// headers. The pair it is taken from is taken out of the body or the
    /// query (so it is stored once, in the clear); anything else the client
    /// sent under those names (not a string, not valid, not the one chosen)
    /// stays where it was, as the event's own data.
    pub(crate) fn take(
        query: &mut BTreeMap<String, Vec<String>>,
        body: Option<&mut Value>,
        header: impl Fn(&str) -> Option<String>,
    ) -> Option<Self> {
        let mut fields = match body {
            Some(Value::Object(fields)) => Some(fields),
            _ => None,
        };
        let in_body = |name: &str, fields: &Option<&mut serde_json::Map<String, Value>>| {
            fields.as_ref()?.get(name)?.as_str().map(str::to_owned)
        };
        let in_query = |name: &str| query.get(name).and_then(|values| values.first()).cloned();
        let from_body = Self::parse(in_body(TRACEPARENT, &fields).as_deref(), in_body(TRACESTATE, &fields).as_deref());
        if let (Some(context), Some(fields)) = (&from_body, fields.as_mut()) {
            fields.remove(TRACEPARENT);
            fields.remove(TRACESTATE);
            return Some(context.clone());
        }
        let from_query = Self::parse(in_query(TRACEPARENT).as_deref(), in_query(TRACESTATE).as_deref());
        if from_query.is_some() {
            query.remove(TRACEPARENT);
            query.remove(TRACESTATE);
            return from_query;
        }
        Self::parse(header(TRACEPARENT).as_deref(), header(TRACESTATE).as_deref())
    }

    /// Bytes it adds to what is stored (the limits count it).
    pub(crate) fn size(&self) -> usize {
        self.traceparent.len() + self.tracestate.as_ref().map_or(0, String::len)
    }
}

/// `version-traceid-parentid-flags`: two hex digits each side of a 32-digit
/// trace id and a 16-digit parent id, lowercase, neither all zeros; version
/// `ff` is invalid; version `00` is exactly 55 characters, a later version
/// may carry more after a dash.
fn valid_traceparent(text: &str) -> bool {
    let hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    if text.len() < 55 || !text.is_ascii() {
        return false;
    }
    let (version, trace_id, parent_id, flags) = (&text[0..2], &text[3..35], &text[36..52], &text[53..55]);
    let dashes = [2, 35, 52].iter().all(|&i| text.as_bytes()[i] == b'-');
    let rest_ok = match version {
        "00" => text.len() == 55,
        _ => text.len() == 55 || text.as_bytes()[55] == b'-',
    };
    dashes
        && rest_ok
        && version != "ff"
        && [version, trace_id, parent_id, flags].iter().all(|s| hex(s))
        && nonzero(trace_id)
        && nonzero(parent_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_kept_and_an_invalid_one_ignored() {
        let context = TraceContext::parse(Some(PARENT), Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", // version 00 is exactly 55
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",       // a zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",       // a zero parent id
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",       // version ff
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",       // uppercase
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::parse(Some(bad), Some("a=b")), None, "{bad:?}");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let kept = TraceContext::parse(Some(later), None).unwrap();
        assert_eq!(kept.traceparent, &later[..55], "a later version may carry more; its known part is kept");
        let long_state = "a=".to_owned() + &"b".repeat(511);
        assert_eq!(TraceContext::parse(Some(PARENT), Some(&long_state)).unwrap().tracestate, None);
        assert_eq!(TraceContext::parse(None, Some("a=b")), None);
    }

    #[test]
    fn the_context_is_taken_out_of_the_body_then_the_query_then_the_headers() {
        let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let mut query = BTreeMap::from([
            (TRACEPARENT.to_owned(), vec![other.to_owned()]),
            ("page".to_owned(), vec!["/".to_owned()]),
        ]);
        let mut body = serde_json::json!({"type": "signup", TRACEPARENT: PARENT, TRACESTATE: "k=v"});
        let header = |name: &str| (name == TRACEPARENT).then(|| other.to_owned());
        let taken = TraceContext::take(&mut query, Some(&mut body), header).unwrap();
        assert_eq!((taken.traceparent.as_str(), taken.tracestate.as_deref()), (PARENT, Some("k=v")));
        assert_eq!(body, serde_json::json!({"type": "signup"}), "stored once: out of the body");
        assert_eq!(query.keys().collect::<Vec<_>>(), ["page", TRACEPARENT], "the query's, not chosen, stays");

        let mut query = BTreeMap::from([(TRACEPARENT.to_owned(), vec![other.to_owned()])]);
        let taken = TraceContext::take(&mut query, None, |_| None).unwrap();
        assert!(query.is_empty(), "taken out of the query it came from");
        assert_eq!(taken.traceparent, other, "a pixel's query parameter");
        let taken = TraceContext::take(&mut BTreeMap::new(), None, header).unwrap();
        assert_eq!(taken.traceparent, other, "a post's header");
        let mut junk = BTreeMap::from([(TRACEPARENT.to_owned(), vec!["junk".to_owned()])]);
        let mut own = serde_json::json!({TRACEPARENT: 7, TRACESTATE: "the event's own"});
        let taken = TraceContext::take(&mut junk, Some(&mut own), header).unwrap();
        assert_eq!(taken.traceparent, other, "invalid ones and another type are passed over");
        assert_eq!(junk[TRACEPARENT], ["junk"], "and left where they were, as the event's own data");
        assert_eq!(own, serde_json::json!({TRACEPARENT: 7, TRACESTATE: "the event's own"}));
        assert_eq!(TraceContext::take(&mut BTreeMap::new(), None, |_| None), None);
    }
}
