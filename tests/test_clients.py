"""The Python and TypeScript clients (clients/) against `make local`'s stack: the local binary
on this session's moto, behind a proxy that can lose an answer. (tests/test_deploy.py runs the
same scenario against the template deployed into moto, every request's signature checked.)"""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlsplit

import pytest

import client_scenario
from conftest import BINARIES, free_port, wait_for_port
from event_store_client import EventStore
from gateways import Proxy


class LocalStack:
    """`event-store-local local` (stage `clients`) with the template's settings on this session's moto,
    its server on one port for good (a restart binds it again), a proxy in front (`proxy`)."""

    def __init__(self, moto_endpoint, log):
        self.port, self.log = free_port(), log
        self.env = {**os.environ, "EMULATOR_PORT": str(urlsplit(moto_endpoint).port), "PORT": str(self.port),
                    "STAGE": "clients", "RUST_LOG": "info"}
        for name in ("AWS_ENDPOINT_URL", "SCAN_INTERVAL", "AWS_PROFILE"):
            self.env.pop(name, None)
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = None
        self.start()
        self.proxy = Proxy(self.port)

    def start(self):
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([str(BINARIES / "event-store-local"), "local"], env=self.env,
                                            stdout=subprocess.DEVNULL, stderr=out)
        wait_for_port(self.port, 120)

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def close(self):
        self.proxy.close()
        self.stop()


@pytest.fixture(scope="module")
def local_stack(moto_endpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("local") / "stack.log"
    stack = LocalStack(moto_endpoint, log)
    try:
        yield stack
    finally:
        stack.close()
        print(log.read_text()[-3000:])


def test_the_python_client_runs_the_scenario_on_the_local_stack(local_stack):
    url = f"http://127.0.0.1:{local_stack.proxy.port}"
    before = local_stack.proxy.cut
    seen = client_scenario.run(EventStore(url, sign=False), url)
    assert local_stack.proxy.cut == before + 1, "the append's answer was lost once, and the retry answered"
    print(f"python client: the log showed {seen}")


def test_the_typescript_client_s_unit_tests():
    out = subprocess.run(["node", "--test", str(client_scenario.typescript_built() / "unit.test.js")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "# fail 0" in out.stdout, out.stdout + out.stderr


def test_the_typescript_client_runs_the_scenario_on_the_local_stack(local_stack):
    before = local_stack.proxy.cut
    seen = client_scenario.run_typescript(f"http://127.0.0.1:{local_stack.proxy.port}", {"ES_SIGN": "0"})
    assert local_stack.proxy.cut == before + 1, "the append's answer was lost once, and the retry answered"
    print(f"typescript client: the log showed {seen}")


def server_sent_events(url, last_event_id=None):
    """The events of a `text/event-stream` answer as they come: (id, data as JSON), until closed; a
    comment (the keep-alive) as (None, None), so a reader can give up in time."""
    headers = {"accept": "text/event-stream", **({"last-event-id": last_event_id} if last_event_id else {})}
    answer = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60)
    assert answer.headers["content-type"] == "text/event-stream", answer.headers
    event_id, data = None, []
    with answer:
        for line in answer:
            line = line.decode().rstrip("\n")
            if line.startswith(":"):
                yield None, None
            elif line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and data:
                yield event_id, json.loads("\n".join(data))
                event_id, data = None, []


def test_the_log_resumes_after_the_server_restarts_from_a_page_s_next_and_from_last_event_id(local_stack):
    """Pages resume from their `next`, and the event stream from `Last-Event-ID`, across a restart of the
    local server: every event after the point once, none before it again."""
    store = EventStore(local_stack.url, sign=False)
    stream = f"restart-{uuid.uuid4().hex[:8]}"
    since = int(time.time() * 1000) - 1000

    def ours(events):
        return [(e["position"], int(e["data"]["id"].rpartition("/")[2])) for e in events
                if e["data"].get("id", "").startswith(stream + "/")]

    def read(start, want, stream_from=None):
        """(pages' events of ours, `next`) or (the event stream's events of ours, last id) until `want` were seen."""
        # After the restart the stopped server's awake scan still holds its lease (30 s): new events wait for
        # the scan's schedule, a minute, as they would after a crash in AWS.
        got, deadline = [], time.time() + 150
        if stream_from is None:
            while len(got) < want:
                page = store.log(start, limit=2, wait=5)
                got += ours(page["events"])
                start = page["next"]
                assert time.time() < deadline, got
            return got, start
        last = None
        for event_id, event in server_sent_events(f"{local_stack.url}/log?from={since}", stream_from):
            assert time.time() < deadline, got
            if event is None:
                continue
            assert event_id == event["position"], "each event's id is its position"
            got += ours([event])
            last = event_id
            if len(got) == want:
                return got, last
        raise AssertionError(f"the stream ended after {got}")

    for version in range(3):
        store.append(stream, {"type": "Counted", "data": {"n": version}})
    before_pages, next_page = read(since, 3)
    before_stream, last_id = read(None, 3, stream_from="")
    assert [v for _, v in before_pages] == [v for _, v in before_stream] == [0, 1, 2]

    # A start that is no position of the log's is refused before a stream begins (an EventSource would
    # reconnect to it for ever).
    try:
        next(server_sent_events(f"{local_stack.url}/log", "not-a-position"))
        raise AssertionError("a stream from nowhere")
    except urllib.error.HTTPError as refused:
        assert refused.code == 400, refused

    local_stack.stop()
    local_stack.start()
    for version in range(3, 6):
        store.append(stream, {"type": "Counted", "data": {"n": version}})
    after_pages, _ = read(next_page, 3)
    after_stream, _ = read(None, 3, stream_from=last_id)
    assert [v for _, v in after_pages] == [v for _, v in after_stream] == [3, 4, 5], (after_pages, after_stream)
    assert {p for p, _ in after_stream}.isdisjoint(p for p, _ in before_stream), "nothing repeated"
    print(f"the log across a restart: {before_pages + after_pages}")
