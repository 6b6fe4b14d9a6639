"""Fixtures for the deployment tests: a moto_server of our own on a free
127.0.0.1 port (stopped by PID at the end) and boto3 clients pointed at it."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

ROOT = Path(__file__).resolve().parent.parent
REGION = "us-east-1"
# The Python client (clients/python), as a user's `pip install` would make it importable.
sys.path.insert(0, str(ROOT / "clients" / "python"))
# The workspace's binaries: `cargo test` builds them in target/debug (EVENT_STORE_BINARIES: elsewhere).
BINARIES = Path(os.environ.get("EVENT_STORE_BINARIES", ROOT / "target" / "debug"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, seconds: float = 30) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing answered on 127.0.0.1:{port}")


@pytest.fixture(scope="session")
def moto_endpoint():
    port = free_port()
    binary = os.environ.get("MOTO_SERVER", str(Path(sys.executable).parent / "moto-server"))
    process = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def aws(moto_endpoint):
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)
    return lambda service: session.client(service, endpoint_url=moto_endpoint)
