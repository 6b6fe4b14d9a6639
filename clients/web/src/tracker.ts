/**
 * The event store's tracker: one script tag, no dependency, no cookie.
 *
 *   <script defer src="https://API/et-1.js" data-consent="pending" data-dnt="respect"></script>
 *
 * It sends page views (also on single-page-app navigation) and `es.track(type, props)` to the
 * stack's `POST /events`, each event with its own `EventId` (the store keeps a retry of it as one
 * event for a day), batched, flushed when the page is hidden, and retried with backoff from a
 * bounded queue in localStorage, waiting out a 429's `Retry-After`. Anonymous unless the page
 * gives a visitor id (`data-entity-id`); docs/clients.md says what each choice means.
 */

interface Sent {
  EventId: string;
  type: string;
  path: string;
  referrer?: string;
  props?: Record<string, unknown>;
  client_time: number;
  bot?: true;
  EntityId?: string;
  [utm: `utm_${string}`]: string;
}

interface Api {
  track(type: string, props?: Record<string, unknown>): void;
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
/** Events one request carries (the store takes up to 100). */
const BATCH = 50;
const KEY = "es:queue";
const MAX_PROPS = 1000;
const UTM = ["source", "medium", "campaign", "term", "content"];

const script = document.currentScript as HTMLScriptElement | null;
const option = (name: string) => script?.getAttribute(`data-${name}`) ?? undefined;
const endpoint = option("endpoint") ?? new URL("events", script?.src ?? location.href).href;
const entityId = option("entity-id");
const optedOut =
  option("dnt") === "respect" && (navigator.doNotTrack === "1" || navigator.globalPrivacyControl === true);
let consented = option("consent") !== "pending";
const bot = /bot|crawl|spider|slurp|headless|lighthouse/i.test(navigator.userAgent);

/** Until consent is given, events stay in memory only. */
let held: Sent[] = [];
/** The queue when localStorage cannot be used (private modes, a full quota). */
let memory: Sent[] = [];
let timer: ReturnType<typeof setTimeout> | undefined;
let sending = false;
let failures = 0;

const stored = (): Sent[] => {
  try {
    const queue = JSON.parse(localStorage.getItem(KEY) ?? "[]") as Sent[];
    return queue.filter((e) => Date.now() - e.client_time < MAX_AGE_MS);
  } catch {
    return memory;
  }
};

const store = (queue: Sent[]) => {
  const kept = queue.slice(-MAX_QUEUED);
  try {
    localStorage.setItem(KEY, JSON.stringify(kept));
  } catch {
    memory = kept;
  }
};

const id = () =>
  crypto.randomUUID?.() ?? Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16)).join("");

const event = (type: string, props?: Record<string, unknown>): Sent => {
  const sent: Sent = { EventId: id(), type, path: location.pathname, client_time: Date.now() };
  const query = new URLSearchParams(location.search);
  for (const field of UTM) {
    const value = query.get(`utm_${field}`);
    if (value) sent[`utm_${field}`] = value;
  }
  if (document.referrer) {
    const host = new URL(document.referrer).host;
    if (host !== location.host) sent.referrer = host;
  }
  // The store takes 2 KiB an event, its request headers included: larger props are left out,
  // so that one event does not get its whole batch refused.
  if (props && JSON.stringify(props).length <= MAX_PROPS) sent.props = props;
  if (bot) sent.bot = true;
  if (entityId) sent.EntityId = entityId;
  return sent;
};

const schedule = (ms: number) => {
  clearTimeout(timer);
  timer = setTimeout(send, ms);
};

/**
 * Sends the oldest batch. A 2xx takes it off the queue, and so does a refusal of the request
 * itself (400, 413: sending it again would not help); anything else, or no answer, leaves it
 * queued for a retry with backoff, or after a 429's `Retry-After`.
 */
async function send(keepalive = false) {
  if (sending || !consented) return;
  const batch = stored().slice(0, BATCH);
  if (!batch.length) return;
  sending = true;
  let retryAfter = 0;
  let done = false;
  try {
    const answer = await fetch(endpoint, {
      method: "POST",
      // A simple request: no preflight, and what navigator.sendBeacon would send.
      headers: { "content-type": "text/plain" },
      body: JSON.stringify(batch),
      keepalive,
    });
    done = answer.ok || answer.status === 400 || answer.status === 413;
    retryAfter = Number(answer.headers.get("retry-after")) * 1000 || 0;
  } catch {
    // Offline, or the store unreachable: the events wait in the queue.
  }
  sending = false;
  if (done) {
    const sent = new Set(batch.map((e) => e.EventId));
    store(stored().filter((e) => !sent.has(e.EventId)));
    failures = 0;
    if (stored().length) schedule(0);
  } else {
    failures++;
    const backoff = Math.min(60_000, 500 * 2 ** Math.min(failures, 7)) * (0.5 + Math.random() / 2);
    schedule(Math.max(retryAfter, backoff));
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

window.es = {
  track: (type, props) => add(event(type, props)),
  consent: (granted) => {
    consented = granted;
    if (granted) store([...stored(), ...held]);
    held = [];
    schedule(0);
  },
  flush: () => schedule(0),
};
pageView();
schedule(0);

export {};
