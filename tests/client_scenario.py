"""What both clients must do against a running stack (the Python half; the TypeScript client runs
the same steps in clients/typescript/test/scenario.ts): the seed article's Todo flow, an append
retried by ids after its answer was lost, the other stream operations, typed errors, and the log
followed until it has shown every event the scenario appended, each once and in order."""

import json
import os
import subprocess
import time
import urllib.request
import uuid

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from conftest import ROOT
from event_store_client import BadRequest, Conflict, EventStore, Gone, NotFound


def run(store: EventStore, proxy_url: str, follow_seconds: float = 120) -> dict:
    """Runs the scenario; returns what the log showed (stream -> versions seen, in log order)."""
    tag = uuid.uuid4().hex[:8]
    # The third name has the characters a path segment may carry as they are (`:`, `@`, `+`, `=`).
    todo, retried, other = f"todo-py-{tag}", f"cart-py-{tag}", f"order:py@{tag}+1=a"
    since = int(time.time() * 1000) - 1000  # the log from before the first append

    # The Todo flow: create once, update at the version read, conflict, delete, then gone. The create is
    # made within an OpenTelemetry span: the client sends its context, the store keeps it with the event.
    trace_id, span_id = uuid.uuid4().int, uuid.uuid4().int >> 64
    span = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    with trace.use_span(span):
        created = store.append(todo, {"type": "TodoCreated", "data": {"title": "milk"}}, expected="no_stream")
    assert (created["first"], created["last"]) == (0, 0), created
    try:
        store.append(todo, {"type": "TodoCreated", "data": {"title": "again"}}, expected="no_stream")
        raise AssertionError("a second create was appended")
    except Conflict as conflict:
        assert conflict.current_version == 0, conflict.body
    assert store.append(todo, {"type": "TodoUpdated", "data": {"title": "oat milk"}}, expected=0)["versions"] == [1]
    try:
        store.append(todo, {"type": "TodoUpdated", "data": {"title": "soy"}}, expected=0)
        raise AssertionError("a stale update was appended")
    except Conflict as conflict:
        assert conflict.current_version == 1, conflict.body
    store.delete(todo, expected=1)
    try:
        store.append(todo, {"type": "TodoUpdated", "data": {}})
        raise AssertionError("an append to a deleted stream was taken")
    except Gone:
        pass
    assert [e["type"] for e in store.events(todo)] == ["TodoCreated", "TodoUpdated", "StreamDeleted"]

    # A lost answer: the store appended, the connection was cut before its answer; the client sends
    # the same ids again and is answered the original versions (If-None-Match: * no longer holds).
    urllib.request.urlopen(urllib.request.Request(proxy_url + "/_cut-next-answer", method="POST")).close()
    appended = store.append(retried, [{"type": "ItemAdded", "data": {"sku": "a"}},
                                      {"type": "ItemAdded", "data": {"sku": "b"}}], expected="no_stream")
    assert appended["versions"] == [0, 1], appended
    page = store.read(retried)
    assert (page["version"], [e["data"]["sku"] for e in page["events"]]) == (1, ["a", "b"]), page

    # Snapshot, state, metadata, an append across streams, the listing, a backward read.
    store.save_snapshot(retried, 1, {"items": ["a", "b"]})
    state = store.state(retried)
    assert (state["snapshot"], state["events"]) == ({"version": 1, "state": {"items": ["a", "b"]}}, []), state
    assert store.set_metadata(retried, {"custom": {"owner": "py"}}, expected=0)["metadata_version"] == 1
    assert store.metadata(retried)["metadata"]["custom"] == {"owner": "py"}
    across = store.append_across([{"stream": other, "expected_version": "no_stream",
                                   "events": [{"type": "OrderPlaced", "data": {"cart": retried}}]}],
                                 conditions=[{"stream": retried, "expected_version": 1}])
    assert across["appends"] == [{"stream": other, "first": 0, "last": 0}], across
    listed = [s["name"] for s in store.list_streams(prefix=f"cart-py-{tag}")]
    assert listed == [retried], listed
    assert [e["version"] for e in store.read(retried, backward=True, limit=1)["events"]] == [1]
    assert [e["type"] for e in store.events(other)] == ["OrderPlaced"], "a name with : @ + = read back"

    # Typed errors.
    for call, error in ((lambda: store.read(f"nothing-{tag}"), NotFound), (lambda: store.log(start="no-such"), BadRequest),
                        (lambda: store.view(f"no-projection-{tag}", "key"), NotFound)):
        try:
            call()
            raise AssertionError(f"no {error.__name__}")
        except error:
            pass

    # The log: followed from before the first append until every appended event was seen.
    wanted = {todo: [0, 1, 2], retried: [0, 1], other: [0]}
    seen: dict = {}
    traced = {}
    positions = set()
    for event in store.follow(start=since, timeout=follow_seconds):
        data = event.get("data") if isinstance(event.get("data"), dict) else {}  # not `too_large` or `data_base64`
        stream, _, version = str(data.get("id", "")).rpartition("/")
        assert event["position"] not in positions, "an event answered twice"
        positions.add(event["position"])
        if stream in wanted:
            seen.setdefault(stream, []).append(int(version))
            traced[(stream, int(version))] = (data.get("trace") or {}).get("traceparent")
        if seen == wanted:
            assert traced.pop((todo, 0)) == f"00-{trace_id:032x}-{span_id:016x}-01", "the create's trace context"
            assert set(traced.values()) == {None}, traced
            return seen
    raise AssertionError(f"the log showed {seen} of {wanted} in {follow_seconds} s")


TYPESCRIPT = ROOT / "clients" / "typescript"


def typescript_built():
    """Compiles clients/typescript (its pinned tsc, installed by the Makefile) into its dist/."""
    tsc = TYPESCRIPT / "node_modules" / ".bin" / "tsc"
    assert tsc.exists(), "install its dependencies first: make tools-clients (make test does)"
    out = subprocess.run([str(tsc), "-p", str(TYPESCRIPT)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return TYPESCRIPT / "dist" / "test"


def run_typescript(url, env):
    """clients/typescript/test/scenario.ts against `url`: what the log showed."""
    out = subprocess.run(["node", str(typescript_built() / "scenario.js")], env={**os.environ, **env, "ES_URL": url},
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])
