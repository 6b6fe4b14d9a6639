// The client's pure parts: retry decisions, backoff, typed errors, ids, preconditions (node --test).
import assert from "node:assert/strict";
import { test } from "node:test";
import { expectation, regionOf, withIds } from "../src/client.js";
import { Conflict, EventStoreError, Gone, TooManyRequests, Unavailable, errorFor } from "../src/errors.js";
import { backoff, parseRetryAfter, shouldRetry } from "../src/retry.js";

test("only what is safe to repeat is sent again", () => {
  assert.ok(shouldRetry(503, true) && shouldRetry(undefined, true) && shouldRetry(502, true));
  assert.ok(!shouldRetry(503, false), "a delete the store may have done is not repeated");
  assert.ok(!shouldRetry(undefined, false), "nor one whose connection was cut after it was sent");
  assert.ok(shouldRetry(undefined, false, false), "one that never left is");
  assert.ok(shouldRetry(429, false), "a throttled request was not acted on");
  for (const status of [400, 404, 409, 410, 412, 413, 428]) assert.ok(!shouldRetry(status, true), String(status));
});

test("backoff is jittered below a doubling cap and never sooner than Retry-After", () => {
  for (let attempt = 0; attempt < 10; attempt++) {
    const wait = backoff(attempt);
    assert.ok(wait >= 0 && wait <= Math.min(5, 0.1 * 2 ** attempt), `${attempt}: ${wait}`);
  }
  const first = Array.from({ length: 200 }, () => backoff(0));
  assert.ok(Math.max(...first) <= 0.1 && new Set(first).size > 100, "drawn, not fixed");
  assert.equal(backoff(0, 2), 2);
  assert.deepEqual([parseRetryAfter("1"), parseRetryAfter("Wed, 21 Oct 2026 07:28:00 GMT"), parseRetryAfter(null)], [1, undefined, undefined]);
});

test("answers become typed errors with the current version", () => {
  const conflict = errorFor(409, { error: "version", current_version: 4 }, '"4"');
  assert.ok(conflict instanceof Conflict && conflict.currentVersion === 4 && conflict.status === 409);
  assert.equal(conflict.name, "Conflict");
  assert.equal(errorFor(409, undefined, '"7"').currentVersion, 7);
  assert.ok(errorFor(410, { error: "deleted" }) instanceof Gone);
  const throttled = errorFor(429, { message: "Too Many Requests" }, undefined, 1);
  assert.ok(throttled instanceof TooManyRequests && throttled.retryAfter === 1);
  const gateway = errorFor(504, "Endpoint request timed out");
  assert.ok(gateway instanceof Unavailable && gateway.status === 504);
  const other = errorFor(418, "teapot");
  assert.ok(other.constructor === EventStoreError && other.status === 418 && other.message.includes("418"));
});

test("events get ids once and keep their own", () => {
  const events = withIds([{ type: "A" }, { type: "B", id: "5f0c8f5e-8a7b-4c2e-9a57-1f2d3c4b5a69" }]);
  assert.equal(events[0].id?.length, 36);
  assert.equal(events[1].id, "5f0c8f5e-8a7b-4c2e-9a57-1f2d3c4b5a69");
  assert.deepEqual(withIds(events), events, "a retry sends the same ids");
});

test("expectations are preconditions", () => {
  assert.deepEqual(expectation(undefined), {});
  assert.deepEqual(expectation("no_stream"), { "if-none-match": "*" });
  assert.deepEqual(expectation(3), { "if-match": '"3"' });
  for (const bad of [-1, 1.5, "3"]) assert.throws(() => expectation(bad as never), TypeError);
});

test("the region comes from an execute-api host", () => {
  assert.equal(regionOf("https://abc123.execute-api.eu-west-1.amazonaws.com"), "eu-west-1");
  assert.equal(regionOf("http://127.0.0.1:3000"), undefined);
});
