/** The event store's HTTP API: entity streams, the sealed log, projections' views. One `EventStore`
 * per base URL (the stack's `ApiUrl` output, or `make local`'s `http://127.0.0.1:3000`). */

import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { Sha256 } from "@aws-crypto/sha256-js";
import { defaultProvider } from "@aws-sdk/credential-provider-node";
import { SignatureV4 } from "@smithy/signature-v4";
import { EventStoreError, Unreachable, errorFor } from "./errors.js";
import { backoff, parseRetryAfter, shouldRetry } from "./retry.js";

type Credentials = ConstructorParameters<typeof SignatureV4>[0]["credentials"];

export interface Options {
  /** SigV4-sign every request for `execute-api` (the deployed API's `AWS_IAM` authorization); default true. */
  sign?: boolean;
  /** Default: the URL's, for an `execute-api` host, else `AWS_REGION`. */
  region?: string;
  /** Default: the AWS SDK's credential chain (environment, profile, SSO, container or instance role). */
  credentials?: Credentials;
  /** How many times a request is sent at most (default 6). */
  attempts?: number;
  /** Per request; a long poll answers within 25 s (default 35,000). */
  timeoutMs?: number;
}

/** An event to append; without an `id` it gets a random UUID before the first attempt. */
export interface NewEvent {
  type: string;
  data?: unknown;
  metadata?: unknown;
  id?: string;
  schema_version?: number;
}

/** An append's expectation: any version (undefined), `"no_stream"` (`If-None-Match: *`) or a version (`If-Match`). */
export type Expected = undefined | "no_stream" | number;

export interface Appended { stream: string; first: number; last: number; versions: number[] }
export interface StreamEvent {
  version: number; type: string; data: unknown; metadata: unknown; id: string; time: string; stream: string;
  schema_version?: number; forgotten?: unknown;
}
export interface StreamPage { stream: string; version: number; deleted: boolean; events: StreamEvent[]; next: string | null }
export interface StreamState {
  version: number; deleted: boolean; snapshot: { version: number; state: unknown } | null; events: StreamEvent[];
}
export interface LogEvent {
  position: string; event_time: string; event_ms: number; event_id: string; partition_key: string;
  data?: unknown; data_base64?: string; too_large?: unknown;
}
export interface LogPage { events: LogEvent[]; next: string; sealed_to: string | null; sealed_to_ms: number | null; at_end: boolean }
/** Where the log starts: a position, a time (RFC 3339 or a `Date`) or ms since the epoch. */
export type LogStart = string | number | Date | undefined;
export interface LogOptions { limit?: number; wait?: number; filters?: Record<string, string> }

type Query = Array<[string, string | number | undefined]>;

/** A client of one stack; keeps its connections and may be shared. */
export class EventStore {
  private readonly base: string;
  private readonly signer?: SignatureV4;
  private readonly attempts: number;
  private readonly timeoutMs: number;

  constructor(url: string, options: Options = {}) {
    this.base = url.replace(/\/+$/, "");
    this.attempts = Math.max(1, options.attempts ?? 6);
    this.timeoutMs = options.timeoutMs ?? 35_000;
    if (options.sign ?? true) {
      const region = options.region ?? regionOf(this.base) ?? process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION;
      if (!region) throw new Error("no region to sign for: pass region, or set AWS_REGION");
      this.signer = new SignatureV4({
        service: "execute-api", region, sha256: Sha256, credentials: options.credentials ?? defaultProvider(),
      });
    }
  }

  // ---- entity streams ----------------------------------------------------------------------

  /** Appends `events` atomically. A retry after a lost answer sends the same ids and is answered
   * the original versions. `Conflict` names the stream's `currentVersion`; `Gone` a deleted stream. */
  append(stream: string, events: NewEvent | NewEvent[], options: { expected?: Expected } = {}): Promise<Appended> {
    const batch = withIds(Array.isArray(events) ? events : [events]);
    return this.call("POST", streamPath(stream), { body: batch, headers: expectation(options.expected), safe: true });
  }

  /** Appends to several streams in one transaction, all or none, with conditions on others. */
  appendAcross(
    appends: Array<{ stream: string; expected_version?: number | "no_stream" | "any"; events: NewEvent[] }>,
    conditions: Array<{ stream: string; expected_version: number | "no_stream" | "exists" }> = [],
  ): Promise<{ appends: Array<{ stream: string; first: number; last: number }> }> {
    const body: Record<string, unknown> = { appends: appends.map((a) => ({ ...a, events: withIds(a.events) })) };
    if (conditions.length) body.conditions = conditions;
    return this.call("POST", "/streams", { body, safe: true });
  }

  /** One page of a stream's events. */
  read(stream: string, options: { from?: number; limit?: number; backward?: boolean } = {}): Promise<StreamPage> {
    return this.call("GET", streamPath(stream), {
      query: [["from", options.from], ["limit", options.limit], ["direction", options.backward ? "backward" : undefined]],
    });
  }

  /** Every event of a stream from `from`, page after page. */
  async *events(stream: string, options: { from?: number; backward?: boolean } = {}): AsyncGenerator<StreamEvent> {
    let page = await this.read(stream, options);
    for (;;) {
      yield* page.events;
      if (!page.next || page.events.length === 0) return;
      page = await this.call<StreamPage>("GET", page.next, { link: true });
    }
  }

  /** The snapshot and the events after it. */
  state(stream: string): Promise<StreamState> {
    return this.call("GET", `${streamPath(stream)}/state`);
  }

  /** Stores `state` as folded up to `version`; sent again safely (the same write). */
  saveSnapshot(stream: string, version: number, state: unknown): Promise<unknown> {
    return this.call("PUT", `${streamPath(stream)}/snapshot`, { body: state, headers: expectation(version), safe: true });
  }

  /** Appends `StreamDeleted` if the stream is at `expected`; not sent again once it may have reached the store. */
  delete(stream: string, expected: number): Promise<unknown> {
    return this.call("DELETE", streamPath(stream), { headers: expectation(expected) });
  }

  metadata(stream: string): Promise<{ stream: string; metadata_version: number; metadata: Record<string, unknown> }> {
    return this.call("GET", `${streamPath(stream)}/metadata`);
  }

  /** Sets the stream's metadata, if its metadata is at version `expected` when given. */
  setMetadata(stream: string, metadata: Record<string, unknown>, expected?: number): Promise<{ stream: string; metadata_version: number }> {
    return this.call("PUT", `${streamPath(stream)}/metadata`, { body: metadata, headers: expectation(expected) });
  }

  /** One page of stream names in name order. */
  streams(options: { prefix?: string; after?: string; limit?: number } = {}): Promise<{ streams: Array<{ name: string; version: number; deleted: boolean }>; next: string | null }> {
    return this.call("GET", "/streams", { query: [["prefix", options.prefix], ["after", options.after], ["limit", options.limit]] });
  }

  /** Every stream within `prefix`, page after page. */
  async *listStreams(prefix?: string): AsyncGenerator<{ name: string; version: number; deleted: boolean }> {
    let after: string | undefined;
    for (;;) {
      const page = await this.streams({ prefix, after });
      yield* page.streams;
      if (!page.next) return;
      after = page.next;
    }
  }

  // ---- the sealed log -------------------------------------------------------------------------

  /** One page of the complete log from `from` (default the log's start); each event with its own position. */
  log(from?: LogStart, options: LogOptions & { signal?: AbortSignal } = {}): Promise<LogPage> {
    const query: Query = [["from", from instanceof Date ? from.getTime() : from], ["limit", options.limit], ["wait", options.wait]];
    for (const [pointer, value] of Object.entries(options.filters ?? {})) query.push(["filter", `${pointer}=${value}`]);
    return this.call("GET", "/log", { query, signal: options.signal });
  }

  /** The log's events from `from`, then each new one as it is sealed (a long poll of `wait` seconds,
   * default 20, at the end), until `signal` aborts or `timeoutMs` passes. Keep the last event's
   * `position` to resume from it. */
  async *follow(from?: LogStart, options: LogOptions & { timeoutMs?: number; signal?: AbortSignal } = {}): AsyncGenerator<LogEvent> {
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    let position = from;
    while (Date.now() < deadline && !options.signal?.aborted) {
      const wait = Math.max(0, Math.min(options.wait ?? 20, Math.floor((deadline - Date.now()) / 1000)));
      let page: LogPage;
      try {
        page = await this.log(position, { ...options, wait });
      } catch (error) {
        if (options.signal?.aborted) return;
        throw error;
      }
      if (options.signal?.aborted) return;
      yield* page.events;
      position = page.next;
      // No long poll to wait in: do not ask again at once.
      if (page.events.length === 0 && page.at_end && wait === 0) await sleep(500);
    }
  }

  // ---- read models ----------------------------------------------------------------------------

  /** A view's item; `atLeastVersion` waits (up to 5 s) until the item's stream is at that version
   * (`Unavailable` if it is not yet: not asked again). */
  view(projection: string, key: string, atLeastVersion?: number): Promise<{ item: unknown; version: number; position: unknown }> {
    return this.call("GET", `/views/${encodeURIComponent(projection)}/${encodeURIComponent(key)}`, {
      query: [["at_least_version", atLeastVersion]], safe: atLeastVersion === undefined,
    });
  }

  /** One page of a view's items in key order. */
  views(projection: string, options: { prefix?: string; after?: string; limit?: number } = {}): Promise<{ items: unknown[]; next: string | null }> {
    return this.call("GET", `/views/${encodeURIComponent(projection)}`, {
      query: [["prefix", options.prefix], ["after", options.after], ["limit", options.limit]],
    });
  }

  // ---- sending --------------------------------------------------------------------------------

  /** Sends the request, again while `shouldRetry` says so: the answer's JSON, or its typed error.
   * `link`: `path` is one of the store's own links (`next`), from the origin. */
  private async call<T>(method: string, path: string, request: {
    query?: Query; body?: unknown; headers?: Record<string, string>; safe?: boolean; link?: boolean; signal?: AbortSignal;
  } = {}): Promise<T> {
    const safe = request.safe ?? method === "GET";
    const query = (request.query ?? []).filter((pair): pair is [string, string | number] => pair[1] !== undefined);
    const search = query.map(([k, v]) => `${rfc3986(k)}=${rfc3986(String(v))}`).join("&");
    const target = request.link ? new URL(path, this.base).href : this.base + path;
    const url = new URL(target + (search ? (path.includes("?") ? "&" : "?") + search : ""));
    const body = request.body === undefined ? undefined : JSON.stringify(request.body);
    const headers: Record<string, string> = { ...request.headers, ...(await traceHeaders()) };
    if (body !== undefined) headers["content-type"] = "application/json";
    let failure: EventStoreError | undefined;
    for (let attempt = 0; attempt < this.attempts; attempt++) {
      if (attempt) await sleep(backoff(attempt - 1, failure?.retryAfter) * 1000);
      const signed = await this.signed(method, url, headers, body); // outside the try: a credentials error is not "no answer"
      const timeout = AbortSignal.timeout(this.timeoutMs);
      let status: number, etag: string | null, retryAfter: string | null, text: string;
      try {
        const answer = await fetch(url, {
          method, body, headers: signed, redirect: "manual",
          signal: request.signal ? AbortSignal.any([request.signal, timeout]) : timeout,
        });
        [status, etag, retryAfter] = [answer.status, answer.headers.get("etag"), answer.headers.get("retry-after")];
        text = await answer.text();
        if (!(answer.headers.get("content-type") ?? "").includes("json")) text = JSON.stringify(text);
      } catch (cut) {
        if (request.signal?.aborted) throw cut;
        failure = new Unreachable(`${method} ${path}: no answer (${describe(cut)})`);
        if (shouldRetry(undefined, safe, !neverSent(cut))) continue;
        throw failure;
      }
      const result = parsed(text);
      if ((status >= 200 && status < 300) || status === 304) return result as T;
      failure = errorFor(status, result, etag ?? undefined, parseRetryAfter(retryAfter));
      if (!shouldRetry(status, safe)) throw failure;
    }
    throw failure;
  }

  /** The headers with a fresh SigV4 signature (a retry is signed again: a signature has a time). */
  private async signed(method: string, url: URL, headers: Record<string, string>, body?: string): Promise<Record<string, string>> {
    if (!this.signer) return headers;
    const query: Record<string, string | string[]> = {};
    for (const [k, v] of url.searchParams) query[k] = k in query ? [...[query[k]].flat(), v] : v;
    // Trace headers are left unsigned, as botocore leaves them: a hop may rewrite them.
    const signed = await this.signer.sign({
      method, protocol: url.protocol, hostname: url.hostname, port: url.port ? Number(url.port) : undefined,
      path: url.pathname, query, headers: { ...headers, host: url.host }, body,
    }, { unsignableHeaders: new Set(["traceparent", "tracestate", "baggage"]) });
    const { host: _, ...rest } = signed.headers; // fetch sets Host itself, to the same value
    return rest;
  }
}

/** A stream's path: a name is one path segment as it is (its characters, `A-Z a-z 0-9 - _ . : @ + = ~`,
 * need no escape there); anything else is escaped, and the store refuses it. */
function streamPath(stream: string): string {
  return `/streams/${stream.replace(/[^A-Za-z0-9\-_.:@+=~]/g, (c) => encodeURIComponent(c))}`;
}

/** An answer's text as JSON (a non-JSON answer was made a JSON string), or the text itself. */
function parsed(text: string): unknown {
  try {
    return text ? JSON.parse(text) : undefined;
  } catch {
    return text;
  }
}

/** An expectation as a precondition header. */
export function expectation(expected: Expected): Record<string, string> {
  if (expected === undefined) return {};
  if (expected === "no_stream") return { "if-none-match": "*" };
  if (Number.isInteger(expected) && expected >= 0) return { "if-match": `"${expected}"` };
  throw new TypeError(`expected is undefined, "no_stream" or a version (0 or more), not ${JSON.stringify(expected)}`);
}

/** The events, each with an `id`: its own, or a new random UUID. */
export function withIds(events: NewEvent[]): NewEvent[] {
  return events.map((e) => (e.id ? { ...e } : { ...e, id: randomUUID() }));
}

/** The region of an `execute-api` host (`ID.execute-api.REGION.amazonaws.com`). */
export function regionOf(url: string): string | undefined {
  const parts = new URL(url).hostname.split(".");
  return parts.length > 3 && parts[1] === "execute-api" ? parts[2] : undefined;
}

/** Percent-encoding as SigV4 canonicalizes it (RFC 3986: `encodeURIComponent` leaves `!'()*`). */
function rfc3986(text: string): string {
  return encodeURIComponent(text).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/** Whether a failed fetch never reached the store (nothing listened). */
function neverSent(error: unknown): boolean {
  const code = (error as { cause?: { code?: string } })?.cause?.code;
  return code === "ECONNREFUSED" || code === "ENOTFOUND" || code === "EAI_AGAIN";
}

function describe(error: unknown): string {
  const cause = (error as { cause?: { message?: string } })?.cause?.message;
  return cause ?? String(error);
}

let propagation: Promise<((carrier: Record<string, string>) => void) | undefined> | undefined;

/** The current OpenTelemetry context as `traceparent`/`tracestate`, when the process has one
 * (`@opentelemetry/api` installed and a context active). */
async function traceHeaders(): Promise<Record<string, string>> {
  propagation ??= import("@opentelemetry/api" as string).then(
    (otel) => (carrier: Record<string, string>) => otel.propagation.inject(otel.context.active(), carrier),
    () => undefined,
  );
  const inject = await propagation;
  if (!inject) return {};
  const carrier: Record<string, string> = {};
  inject(carrier);
  return Object.fromEntries(Object.entries(carrier).filter(([k]) => k === "traceparent" || k === "tracestate"));
}
