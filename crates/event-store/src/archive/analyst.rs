//! The columns an analyst groups by ([`crate::hit`]: the event type, the
//! page's path, the referrer's host, the UTM fields, the bot flag), filled
//! for an event without a subject. An event with one leaves them empty: what
//! lies in the clear beside the subject's keyed hash survives `forget`
//! (`docs/privacy.md#what-an-analyst-sees`), so its fields stay sealed; the
//! `count` views count those. Derived from the payload and never read back:
//! the row is the event, these are a view of it. The event's W3C trace
//! context (`traceparent`, `tracestate`) is filled for every event that
//! carries one, a subject's and an entity event's too: it names a trace, not
//! a person, and is kept in the clear ([`crate::trace`]). Pure.

use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, StringBuilder};
use arrow_array::ArrayRef;
use arrow_schema::{DataType, Field};
use serde_json::Value;

use crate::hit::{Hit, UTM};

/// A column's text is cut to this many bytes (at a character boundary): the
/// tracker sends at most 200 a field, a pixel's query may carry more.
const MAX_TEXT: usize = 512;

/// An event's analyst columns.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Analyst {
    pub r#type: Option<String>,
    pub page_path: Option<String>,
    pub referrer_host: Option<String>,
    /// `utm_source`, `utm_medium`, `utm_campaign`, `utm_term`, `utm_content`.
    pub utm: [Option<String>; 5],
    pub bot: Option<bool>,
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
}

impl Analyst {
    /// The columns of an event whose bytes are `payload` (an envelope as
    /// JSON): empty for an entity event, an event with a subject, or anything
    /// that is not an envelope.
    pub(crate) fn of(payload: Option<&str>, entity: bool) -> Analyst {
        let Some(envelope) = payload.and_then(|p| serde_json::from_str::<Value>(p).ok()).filter(Value::is_object)
        else {
            return Analyst::default();
        };
        let trace = |part: &str| envelope.pointer(&format!("/trace/{part}")).and_then(Value::as_str).map(clip);
        let traced =
            Analyst { traceparent: trace("traceparent"), tracestate: trace("tracestate"), ..Analyst::default() };
        if entity || ["subject", "sealed", "sealed_ref"].iter().any(|k| envelope.get(k).is_some()) {
            return traced;
        }
        let hit = Hit(&envelope);
        Analyst {
            r#type: hit.event_type().map(clip),
            page_path: hit.page_path().map(clip),
            referrer_host: hit.referrer_host().map(clip),
            utm: UTM.map(|name| hit.utm(name).map(clip)),
            bot: hit.bot(),
            ..traced
        }
    }

    /// The columns' fields, after the row's own (`archive::columns::schema`).
    pub(crate) fn fields() -> Vec<Field> {
        let text = |name: String| Field::new(name, DataType::Utf8, true);
        let mut fields: Vec<Field> = ["type", "page_path", "referrer_host"].map(|n| text(n.to_owned())).into();
        fields.extend(UTM.iter().map(|name| text(format!("utm_{name}"))));
        fields.push(Field::new("bot", DataType::Boolean, true));
        fields.extend(["traceparent", "tracestate"].map(|n| text(n.to_owned())));
        fields
    }

    /// The columns of `rows`, in the order of [`Analyst::fields`].
    pub(crate) fn columns(rows: &[Analyst]) -> Vec<ArrayRef> {
        let text = |get: &dyn Fn(&Analyst) -> Option<&str>| -> ArrayRef {
            let mut column = StringBuilder::new();
            rows.iter().for_each(|row| column.append_option(get(row)));
            Arc::new(column.finish())
        };
        let mut columns = vec![
            text(&|a| a.r#type.as_deref()),
            text(&|a| a.page_path.as_deref()),
            text(&|a| a.referrer_host.as_deref()),
        ];
        columns.extend((0..UTM.len()).map(|i| text(&|a: &Analyst| a.utm[i].as_deref())));
        let mut bot = BooleanBuilder::new();
        rows.iter().for_each(|row| bot.append_option(row.bot));
        columns.push(Arc::new(bot.finish()));
        columns.push(text(&|a| a.traceparent.as_deref()));
        columns.push(text(&|a| a.tracestate.as_deref()));
        columns
    }
}

fn clip(text: impl AsRef<str>) -> String {
    let text = text.as_ref();
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_anonymous_hit_fills_them_and_a_subjects_event_an_entity_event_or_no_envelope_does_not() {
        let sent = r#"{"id":"x","path":"/events","query":{},"headers":{"user_agent":"Mozilla/5.0"},
            "body":{"EventId":"e1","type":"pageview","path":"/pricing","referrer":"news.example","utm_campaign":"launch"}}"#;
        let columns = Analyst::of(Some(sent), false);
        assert_eq!(columns.page_path.as_deref(), Some("/pricing"));
        assert_eq!((columns.utm[2].as_deref(), columns.bot), (Some("launch"), Some(false)));
        let sealed = r#"{"id":"x","path":"/events","query":{},"headers":{},"subject":"ab","sealed":{"g":1}}"#;
        assert_eq!(Analyst::of(Some(sealed), false), Analyst::default());
        assert_eq!(Analyst::of(Some(sent), true), Analyst::default(), "an entity event");
        // The trace context is every event's, a subject's and an entity event's too.
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced_sealed =
            sealed.replace(r#""subject""#, &format!(r#""trace":{{"traceparent":"{parent}"}},"subject""#));
        let columns = Analyst::of(Some(&traced_sealed), false);
        assert_eq!((columns.traceparent.as_deref(), columns.page_path), (Some(parent), None));
        let traced_entity = format!(r#"{{"id":"t/0","trace":{{"traceparent":"{parent}","tracestate":"k=v"}}}}"#);
        let columns = Analyst::of(Some(&traced_entity), true);
        assert_eq!((columns.traceparent.as_deref(), columns.tracestate.as_deref()), (Some(parent), Some("k=v")));
        assert_eq!(columns.r#type, None);
        assert_eq!(Analyst::of(Some("not json"), false), Analyst::default());
        assert_eq!(Analyst::of(Some("[1]"), false), Analyst::default());
        assert_eq!(Analyst::of(None, false), Analyst::default());
        let long = format!(r#"{{"body":{{"type":"{}é"}}}}"#, "a".repeat(MAX_TEXT - 1));
        assert_eq!(Analyst::of(Some(&long), false).r#type.map(|t| t.len()), Some(MAX_TEXT - 1), "cut whole");
    }
}
