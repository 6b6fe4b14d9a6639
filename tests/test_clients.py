"""The Python and TypeScript clients (clients/) against `make local`'s stack: the local binary
on this session's moto, behind a proxy that can lose an answer. (tests/test_deploy.py runs the
same scenario against the template deployed into moto, every request's signature checked.)"""

import os
import subprocess
from urllib.parse import urlsplit

import pytest

import client_scenario
from conftest import BINARIES, free_port, wait_for_port
from event_store_client import EventStore
from gateways import Proxy


@pytest.fixture(scope="module")
def local_stack(moto_endpoint, tmp_path_factory):
    """`event-store-local local` (stage `clients`) with the template's settings, and a proxy in front."""
    port = free_port()
    env = {**os.environ, "EMULATOR_PORT": str(urlsplit(moto_endpoint).port), "PORT": str(port), "STAGE": "clients"}
    for name in ("AWS_ENDPOINT_URL", "SCAN_INTERVAL", "AWS_PROFILE"):
        env.pop(name, None)
    log = tmp_path_factory.mktemp("local") / "stack.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([str(BINARIES / "event-store-local"), "local"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=out)
    proxy = None
    try:
        wait_for_port(port, 120)
        proxy = Proxy(port)
        yield proxy
    finally:
        if proxy:
            proxy.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print(log.read_text()[-3000:])


def test_the_python_client_runs_the_scenario_on_the_local_stack(local_stack):
    url = f"http://127.0.0.1:{local_stack.port}"
    seen = client_scenario.run(EventStore(url, sign=False), url)
    assert local_stack.cut == 1, "the append's answer was lost once, and the retry answered"
    assert sorted(len(v) for v in seen.values()) == [1, 2, 3], seen
    print(f"python client: the log showed {seen}")


def test_the_typescript_client_s_unit_tests():
    out = subprocess.run(["node", "--test", str(client_scenario.typescript_built() / "unit.test.js")], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "# fail 0" in out.stdout, out.stdout + out.stderr


def test_the_typescript_client_runs_the_scenario_on_the_local_stack(local_stack):
    before = local_stack.cut
    seen = client_scenario.run_typescript(f"http://127.0.0.1:{local_stack.port}", {"ES_SIGN": "0"})
    assert local_stack.cut == before + 1, "the append's answer was lost once, and the retry answered"
    assert sorted(len(v) for v in seen.values()) == [1, 2, 3], seen
    print(f"typescript client: the log showed {seen}")
