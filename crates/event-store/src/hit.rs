//! What a web hit says about the page it came from: its type, the page's
//! path, the referrer's host, the UTM fields and the bot flag. The tracker
//! (`clients/web`) sends them as fields of the posted event; a pixel as query
//! parameters, or not at all: its page is then the one that shows it, its
//! `Referer` header. Read by the `count` views and the archive's analyst
//! columns alike, so both count the same page. Pure.

use serde_json::Value;

/// The UTM fields' names, after `utm_`.
pub(crate) const UTM: [&str; 5] = ["source", "medium", "campaign", "term", "content"];
/// User agents of crawlers and headless browsers (as the tracker flags them).
const BOTS: [&str; 6] = ["bot", "crawl", "spider", "slurp", "headless", "lighthouse"];

/// An envelope (as JSON), read as a hit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hit<'a>(pub &'a Value);

impl<'a> Hit<'a> {
    /// A field of the posted event, else the hit's query parameter of that name.
    fn field(self, name: &str) -> Option<&'a str> {
        let body = self.0.get("body").and_then(|b| b.get(name)).and_then(Value::as_str);
        body.or_else(|| self.0.get("query")?.get(name)?.as_array()?.first()?.as_str())
    }

    /// The page that shows a pixel (or made a post): its `Referer` header.
    fn referer(self) -> Option<url::Url> {
        url::Url::parse(self.0.get("headers")?.get("referer")?.as_str()?).ok()
    }

    /// The event's `type` field.
    pub(crate) fn event_type(self) -> Option<&'a str> {
        self.field("type")
    }

    /// The page's path, without query or fragment: the event's `page` or
    /// `path` field (a path or a URL), else the `Referer` header's path.
    pub(crate) fn page_path(self) -> Option<String> {
        match self.field("page").or_else(|| self.field("path")) {
            Some(page) => Some(path_of(page)),
            None => self.referer().map(|page| page.path().to_owned()),
        }
    }

    /// The referrer's host (lower case): the event's `referrer` field, a host
    /// or a URL. Never the `Referer` header: that is the page, not where its
    /// visitor came from.
    pub(crate) fn referrer_host(self) -> Option<String> {
        let given = self.field("referrer")?;
        let host = match url::Url::parse(given) {
            Ok(url) => url.host_str()?.to_owned(),
            Err(_) => given.split(['/', '?', '#']).next()?.to_owned(),
        };
        (!host.is_empty()).then(|| host.to_ascii_lowercase())
    }

    /// `utm_<name>`: the event's field, else the page's query parameter (a
    /// pixel on a landing page).
    pub(crate) fn utm(self, name: &str) -> Option<String> {
        let name = format!("utm_{name}");
        if let Some(value) = self.field(&name) {
            return Some(value.to_owned());
        }
        let page = self.referer()?;
        let found = page.query_pairs().find(|(key, _)| *key == name).map(|(_, value)| value.into_owned());
        found
    }

    /// Whether a crawler or a headless browser sent it: flagged by the
    /// tracker, or by its user agent; `None` when neither says.
    pub(crate) fn bot(self) -> Option<bool> {
        let flagged = self.0.get("body").and_then(|b| b.get("bot")).and_then(Value::as_bool) == Some(true);
        let agent = self.0.get("headers").and_then(|h| h.get("user_agent")).and_then(Value::as_str);
        match agent.map(str::to_ascii_lowercase) {
            Some(agent) => Some(flagged || BOTS.iter().any(|bot| agent.contains(bot))),
            None => flagged.then_some(true),
        }
    }
}

/// A URL's or a path's path, without query or fragment.
fn path_of(page: &str) -> String {
    match url::Url::parse(page) {
        Ok(url) => url.path().to_owned(),
        Err(_) => page.split(['?', '#']).next().unwrap_or_default().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tracker_event_says_it_in_its_own_fields() {
        let sent = json!({"path": "/events", "query": {}, "headers": {"user_agent": "Mozilla/5.0", "referer": "https://shop.example/x?utm_source=no"},
            "body": {"type": "pageview", "path": "/pricing?plan=a", "referrer": "News.Example.org", "utm_source": "mail"}});
        let hit = Hit(&sent);
        assert_eq!(hit.event_type(), Some("pageview"));
        assert_eq!(hit.page_path().as_deref(), Some("/pricing"), "the page's, not the API route's nor the Referer's");
        assert_eq!(hit.referrer_host().as_deref(), Some("news.example.org"), "a bare host");
        assert_eq!((hit.utm("source").as_deref(), hit.utm("medium")), (Some("mail"), None), "its own field first");
        assert_eq!(hit.bot(), Some(false));
    }

    #[test]
    fn a_pixel_hit_takes_its_page_from_the_referer_header() {
        let hit = json!({"path": "/track.gif", "query": {"type": ["signup"], "referrer": ["https://www.Google.com/search?q=a"]},
            "headers": {"user_agent": "Googlebot/2.1", "referer": "https://shop.example/landing/a?utm_source=ads&utm_medium=cpc#top"}});
        let hit = Hit(&hit);
        assert_eq!((hit.event_type(), hit.page_path().as_deref()), (Some("signup"), Some("/landing/a")));
        assert_eq!(hit.referrer_host().as_deref(), Some("www.google.com"));
        assert_eq!((hit.utm("source").as_deref(), hit.utm("medium").as_deref()), (Some("ads"), Some("cpc")));
        assert_eq!(hit.bot(), Some(true), "by its user agent");
        let bare = json!({"headers": {"referer": "https://shop.example/"}});
        assert_eq!(Hit(&bare).referrer_host(), None, "the Referer is the page, not its referrer");
        let flagged = json!({"body": {"page": "https://a.example/b?c#d", "bot": true}});
        assert_eq!((Hit(&flagged).page_path().as_deref(), Hit(&flagged).bot()), (Some("/b"), Some(true)));
        assert_eq!(Hit(&json!({})).bot(), None);
    }
}
