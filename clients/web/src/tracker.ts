/**
 * The event store's tracker: one script tag, no dependency, no cookie.
 *
 *   <script defer src="https://API/et-1.0.2.js" data-consent="pending" data-dnt="respect"></script>
 *
 * It sends page views (also on single-page-app navigation) and `es.track(type, props)` to the
 * stack's `POST /events`, each event with its own `EventId` (the store keeps a retry of it as one
 * event for a day), batched, flushed when the page is hidden, and retried with backoff from a
 * bounded queue in localStorage, waiting out a 429's `Retry-After`. Anonymous unless the page
 * gives a visitor id (`data-entity-id`); docs/clients.md says what each choice means. A page
 * rendered within a trace (`<meta name="traceparent" content="00-…">`, W3C Trace Context) has
 * its events carry it, so a consumer of the log can tie them to the request that made the page.
 */

interface Sent {
  EventId: string;
  type: string;
  path: string;
  referrer?: string;
  props?: unknown;
  client_time: number;
  bot?: true;
  EntityId?: string;
  traceparent?: string;
  tracestate?: string;
  [utm: `utm_${string}`]: string;
}

interface Api {
  track(type: string, props?: unknown): void;
  consent(granted: boolean): void;
  flush(): void;
}

declare global {
  interface Window {
    es?: Api;
  }
  interface Navigator {
    globalPrivacyControl?: boolean;
  }
}

/** The store drops a retry as a copy for a day (`CLIENT_ID_RETENTION_SECS`): older events are not sent. */
const MAX_AGE_MS = 23 * 3600 * 1000;
/** Events kept while the store cannot be reached; the oldest go first. */
const MAX_QUEUED = 500;
/** Events one request carries: within the store's 100, and a keepalive request's 64 KiB. */
const BATCH = 40;
/**
 * Bytes of an event's own fields: the store takes 2 KiB an event with the request's headers
 * (user agent, language), and refuses the whole request for one larger event.
 */
const MAX_FIELD = 200;
const MAX_PROPS = 600;
const KEY = "es:queue";
const AFTER = "es:after";
const UTM = ["source", "medium", "campaign", "term", "content"];

const bytes = (text: string) => new TextEncoder().encode(text).length;
const cut = (text: string) => {
  while (bytes(text) > MAX_FIELD) text = text.slice(0, -8);
  return text;
};

function start() {
  const script = document.currentScript as HTMLScriptElement | null;
  const option = (name: string) => script?.getAttribute(`data-${name}`) ?? undefined;
  const endpoint = option("endpoint") ?? new URL("events", script?.src || location.href).href;
  const entityId = option("entity-id");
  const optedOut =
    option("dnt") === "respect" && (navigator.doNotTrack === "1" || navigator.globalPrivacyControl === true);
  let consented = option("consent") !== "pending";
  const bot = /bot|crawl|spider|slurp|headless|lighthouse/i.test(navigator.userAgent);

  /** Until consent is given, events stay in memory only. */
  let held: Sent[] = [];
  /** The queue once localStorage cannot be written (private modes, a full quota). */
  let memory: Sent[] | undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let due = Infinity;
  let sending = false;
  let failures = 0;
  /** One event a request after a refused batch, until the queue is empty: the refused one is found alone. */
  let size = BATCH;

  const read = (key: string) => {
    try {
      return localStorage.getItem(key);
    } catch {
      return null;
    }
  };
  const stored = (): Sent[] => {
    let queue = memory;
    if (!queue) {
      try {
        queue = JSON.parse(read(KEY) ?? "[]") as Sent[];
      } catch {
        queue = [];
      }
    }
    return queue.filter((e) => Date.now() - e.client_time < MAX_AGE_MS);
  };
  const store = (queue: Sent[]) => {
    const kept = queue.slice(-MAX_QUEUED);
    if (!memory) {
      try {
        localStorage.setItem(KEY, JSON.stringify(kept));
        return;
      } catch {
        // Written no more: the queue lives in memory from now on.
      }
    }
    memory = kept;
  };
  /** When the store may be asked again (a `Retry-After`, a backoff), shared by the site's pages. */
  let after = 0;
  const notBefore = () => Math.max(after, Number(read(AFTER)) || 0);
  const wait = (ms: number) => {
    after = Date.now() + ms;
    try {
      localStorage.setItem(AFTER, String(after));
    } catch {
      // Kept for this page only.
    }
  };

  const id = () =>
    crypto.randomUUID?.() ??
    Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");

  const event = (type: string, props?: unknown): Sent => {
    const sent: Sent = { EventId: id(), type: cut(String(type)), path: cut(location.pathname), client_time: Date.now() };
    const query = new URLSearchParams(location.search);
    for (const field of UTM) {
      const value = query.get(`utm_${field}`);
      if (value) sent[`utm_${field}`] = cut(value);
    }
    if (document.referrer) {
      const host = new URL(document.referrer).host;
      if (host !== location.host) sent.referrer = cut(host);
    }
    try {
      // Larger props, or props that are not JSON (a cycle, a BigInt), are left out: never an error in the page.
      const text = props === undefined ? undefined : JSON.stringify(props);
      if (text && bytes(text) <= MAX_PROPS) sent.props = props;
    } catch {
      // Left out.
    }
    if (bot) sent.bot = true;
    if (entityId) sent.EntityId = cut(entityId);
    // The page's trace context, whole or not at all (a cut one would name another trace).
    const meta = (name: string) => document.querySelector<HTMLMetaElement>(`meta[name="${name}"]`)?.content ?? "";
    const [parent, state] = [meta("traceparent"), meta("tracestate")];
    if (parent && bytes(parent) <= MAX_FIELD) sent.traceparent = parent;
    if (parent && state && bytes(state) <= MAX_FIELD) sent.tracestate = state;
    return sent;
  };

  /** A send in `ms` (or when the store may be asked again), unless one is due sooner. */
  const schedule = (ms: number) => {
    const at = Math.max(Date.now() + ms, notBefore());
    if (at >= due) return;
    clearTimeout(timer);
    due = at;
    timer = setTimeout(() => {
      due = Infinity;
      void send();
    }, at - Date.now());
  };

  /**
   * Sends the oldest events. A 2xx takes them off the queue, and so does a refusal (400, 413) of
   * a single event (sending it again would not help; a refused batch is sent again one event at
   * a time, to find it); anything else, or no answer, leaves them queued for a retry with
   * backoff, never before a 429's or 503's `Retry-After`. `leaving`: the page is going, so the
   * request must outlive it, and goes even while another is in flight (the store keeps one copy).
   */
  async function send(leaving = false) {
    if ((sending && !leaving) || !consented || optedOut) return;
    // Too soon (a timer set before a backoff was): again once the store may be asked.
    if (Date.now() < notBefore()) return schedule(0);
    const batch = stored().slice(0, leaving ? BATCH : size);
    if (!batch.length) return;
    sending = true;
    let status = 0;
    let retryAfter = 0;
    try {
      const answer = await fetch(endpoint, {
        method: "POST",
        // A simple request: no preflight, and what navigator.sendBeacon would send.
        headers: { "content-type": "text/plain" },
        body: JSON.stringify(batch),
        // Outlives the page (64 KiB at most in flight: BATCH events of bounded size).
        keepalive: true,
        // The page's URL (and its query) is not sent: `path` is what is kept.
        referrerPolicy: "no-referrer",
      });
      status = answer.status;
      retryAfter = Number(answer.headers.get("retry-after")) * 1000 || 0;
    } catch {
      // Offline, or the store unreachable: the events wait in the queue.
    }
    sending = false;
    const refused = status === 400 || status === 413;
    if (refused && batch.length > 1) {
      size = 1;
      schedule(0);
    } else if ((status >= 200 && status < 300) || refused) {
      const done = new Set(batch.map((e) => e.EventId));
      const left = stored().filter((e) => !done.has(e.EventId));
      store(left);
      failures = 0;
      if (left.length) schedule(0);
      else size = BATCH;
    } else {
      failures++;
      const backoff = Math.min(60_000, 500 * 2 ** Math.min(failures, 7)) * (0.5 + Math.random() / 2);
      wait(Math.max(retryAfter, backoff));
      schedule(0);
    }
  }

  const add = (sent: Sent) => {
    if (optedOut) return;
    if (!consented) {
      held.push(sent);
      return;
    }
    store([...stored(), sent]);
    schedule(1000);
  };

  let shown = "";
  const pageView = () => {
    if (location.pathname + location.search === shown) return;
    shown = location.pathname + location.search;
    add(event("pageview"));
  };

  const push = history.pushState;
  history.pushState = function (...args: Parameters<History["pushState"]>) {
    push.apply(this, args);
    pageView();
  };
  addEventListener("popstate", pageView);
  // Hidden or leaving: what is queued goes now, with a request that outlives the page (a response
  // that never comes leaves the events queued; the next page sends them again, and the store keeps one).
  const leave = () => void send(true);
  addEventListener("pagehide", leave);
  document.addEventListener("visibilitychange", () => document.visibilityState === "hidden" && leave());
  addEventListener("online", () => schedule(0));

  if (optedOut) store([]);
  window.es = {
    track: (type, props) => add(event(type, props)),
    consent: (granted) => {
      consented = granted;
      // Withdrawn: what waits is dropped too, not sent should consent come back.
      store(granted ? [...stored(), ...held] : []);
      held = [];
      schedule(0);
    },
    flush: () => schedule(0),
  };
  pageView();
  schedule(0);
}

// Loaded twice (two tags, a tag and a bundle): the first one counts.
if (!window.es) start();

export {};
