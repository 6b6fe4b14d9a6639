// What both clients must do against a running stack (the TypeScript half; tests/client_scenario.py
// is the Python one, and tests/test_clients.py and tests/test_deploy.py run both): the seed
// article's Todo flow, an append retried by ids after its answer was lost, the other stream
// operations, typed errors, and the log followed until it has shown every event the scenario
// appended, each once and in order. ES_URL: the stack (behind a proxy that loses an answer on
// `POST /_cut-next-answer`); ES_SIGN=0 for an unsigned stack. Prints what the log showed as JSON.
import assert from "node:assert/strict";
import { randomBytes, randomUUID } from "node:crypto";
import { TraceFlags, context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BadRequest, Conflict, EventStore, Gone, NotFound } from "../src/index.js";

async function rejects(call: () => Promise<unknown>, error: Function): Promise<void> {
  await assert.rejects(call, (e: unknown) => e instanceof error);
}

async function main(): Promise<void> {
  const url = process.env.ES_URL ?? "http://127.0.0.1:3000";
  const store = new EventStore(url, { sign: process.env.ES_SIGN !== "0" });
  const tag = randomUUID().slice(0, 8);
  // The third name has the characters a path segment may carry as they are (`:`, `@`, `+`, `=`).
  const [todo, retried, other] = [`todo-ts-${tag}`, `cart-ts-${tag}`, `order:ts@${tag}+1=a`];
  const since = Date.now() - 1000; // the log from before the first append

  // The Todo flow: create once, update at the version read, conflict, delete, then gone. The create is
  // made within an OpenTelemetry span: the client sends its context, the store keeps it with the event.
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const [traceId, spanId] = [randomBytes(16).toString("hex"), randomBytes(8).toString("hex")];
  const span = trace.wrapSpanContext({ traceId, spanId, traceFlags: TraceFlags.SAMPLED });
  const created = await context.with(trace.setSpan(context.active(), span),
    () => store.append(todo, { type: "TodoCreated", data: { title: "milk" } }, { expected: "no_stream" }));
  assert.deepEqual([created.first, created.last], [0, 0]);
  await assert.rejects(store.append(todo, { type: "TodoCreated", data: {} }, { expected: "no_stream" }),
    (e: unknown) => e instanceof Conflict && e.currentVersion === 0);
  assert.deepEqual((await store.append(todo, { type: "TodoUpdated", data: { title: "oat milk" } }, { expected: 0 })).versions, [1]);
  await assert.rejects(store.append(todo, { type: "TodoUpdated", data: { title: "soy" } }, { expected: 0 }),
    (e: unknown) => e instanceof Conflict && e.currentVersion === 1);
  await store.delete(todo, 1);
  await rejects(() => store.append(todo, { type: "TodoUpdated", data: {} }), Gone);
  const types: string[] = [];
  for await (const event of store.events(todo)) types.push(event.type);
  assert.deepEqual(types, ["TodoCreated", "TodoUpdated", "StreamDeleted"]);

  // A lost answer: the store appended, the connection was cut before its answer; the client sends
  // the same ids again and is answered the original versions (If-None-Match: * no longer holds).
  assert.equal((await fetch(`${url}/_cut-next-answer`, { method: "POST" })).status, 204);
  const appended = await store.append(retried, [{ type: "ItemAdded", data: { sku: "a" } }, { type: "ItemAdded", data: { sku: "b" } }],
    { expected: "no_stream" });
  assert.deepEqual(appended.versions, [0, 1]);
  const page = await store.read(retried);
  assert.deepEqual([page.version, page.events.map((e) => (e.data as { sku: string }).sku)], [1, ["a", "b"]]);

  // Snapshot, state, metadata, an append across streams, the listing, a backward read.
  await store.saveSnapshot(retried, 1, { items: ["a", "b"] });
  const state = await store.state(retried);
  assert.deepEqual([state.snapshot, state.events], [{ version: 1, state: { items: ["a", "b"] } }, []]);
  assert.equal((await store.setMetadata(retried, { custom: { owner: "ts" } }, 0)).metadata_version, 1);
  assert.deepEqual((await store.metadata(retried)).metadata.custom, { owner: "ts" });
  const across = await store.appendAcross(
    [{ stream: other, expected_version: "no_stream", events: [{ type: "OrderPlaced", data: { cart: retried } }] }],
    [{ stream: retried, expected_version: 1 }]);
  assert.deepEqual(across.appends, [{ stream: other, first: 0, last: 0 }]);
  const listed: string[] = [];
  for await (const s of store.listStreams(`cart-ts-${tag}`)) listed.push(s.name);
  assert.deepEqual(listed, [retried]);
  assert.deepEqual((await store.read(retried, { backward: true, limit: 1 })).events.map((e) => e.version), [1]);
  const placed: string[] = [];
  for await (const event of store.events(other)) placed.push(event.type);
  assert.deepEqual(placed, ["OrderPlaced"], "a name with : @ + = read back");

  // Typed errors.
  await rejects(() => store.read(`nothing-${tag}`), NotFound);
  await rejects(() => store.log("no-such"), BadRequest);
  await rejects(() => store.view(`no-projection-${tag}`, "key"), NotFound);

  // The log: followed from before the first append until every appended event was seen.
  const wanted: Record<string, number[]> = { [todo]: [0, 1, 2], [retried]: [0, 1], [other]: [0] };
  const seen: Record<string, number[]> = {};
  const traced = new Map<string, string | undefined>();
  const positions = new Set<string>();
  const seconds = Number(process.env.ES_FOLLOW_SECONDS ?? 120);
  for await (const event of store.follow(since, { timeoutMs: seconds * 1000 })) {
    assert.ok(!positions.has(event.position), "an event answered twice");
    positions.add(event.position);
    const id = String((event.data as { id?: string } | undefined)?.id ?? "");
    const stream = id.slice(0, id.lastIndexOf("/"));
    if (stream in wanted) {
      (seen[stream] ??= []).push(Number(id.slice(id.lastIndexOf("/") + 1)));
      traced.set(id, (event.data as { trace?: { traceparent?: string } }).trace?.traceparent);
    }
    if (JSON.stringify(Object.keys(wanted).map((s) => seen[s])) === JSON.stringify(Object.values(wanted))) {
      assert.equal(traced.get(`${todo}/0`), `00-${traceId}-${spanId}-01`, "the create's trace context");
      traced.delete(`${todo}/0`);
      assert.deepEqual([...new Set(traced.values())], [undefined]);
      console.log(JSON.stringify(seen));
      return;
    }
  }
  throw new Error(`the log showed ${JSON.stringify(seen)} of ${JSON.stringify(wanted)} in ${seconds} s`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
