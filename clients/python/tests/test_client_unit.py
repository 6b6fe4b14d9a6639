"""The client's pure parts: retry decisions, backoff, typed errors, ids, preconditions."""

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package beside, not installed

from event_store_client import Conflict, EventStoreError, Gone, TooManyRequests, Unavailable
from event_store_client.client import _expectation, _region_of, _with_ids
from event_store_client.errors import error_for
from event_store_client.retry import backoff, parse_retry_after, should_retry


def test_only_what_is_safe_to_repeat_is_sent_again():
    assert should_retry(503, safe=True) and should_retry(None, safe=True) and should_retry(502, safe=True)
    assert not should_retry(503, safe=False), "a delete the store may have done is not repeated"
    assert not should_retry(None, safe=False), "nor one whose connection was cut after it was sent"
    assert should_retry(None, safe=False, sent=False), "one that never left is"
    assert should_retry(429, safe=False), "a throttled request was not acted on"
    assert not any(should_retry(s, safe=True) for s in (400, 404, 409, 410, 412, 413, 428))


def test_backoff_is_jittered_below_a_doubling_cap_and_never_sooner_than_retry_after():
    rng = random.Random(7)
    waits = [backoff(attempt, rng=rng) for attempt in range(10) for _ in range(50)]
    assert all(0 <= w <= 5.0 for w in waits)
    first = [backoff(0, rng=rng) for _ in range(200)]
    assert max(first) <= 0.1 and len(set(first)) > 100, "drawn, not fixed"
    assert backoff(0, retry_after=2.0, rng=rng) == 2.0
    assert (parse_retry_after("1"), parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT"), parse_retry_after(None)) \
        == (1.0, None, None)


def test_answers_become_typed_errors_with_the_current_version():
    conflict = error_for(409, {"error": "version", "current_version": 4}, etag='"4"')
    assert isinstance(conflict, Conflict) and conflict.current_version == 4 and conflict.status == 409
    assert error_for(409, None, etag='"7"').current_version == 7
    assert isinstance(error_for(410, {"error": "deleted"}), Gone)
    throttled = error_for(429, {"message": "Too Many Requests"}, retry_after=1.0)
    assert isinstance(throttled, TooManyRequests) and throttled.retry_after == 1.0
    gateway = error_for(504, "Endpoint request timed out")
    assert isinstance(gateway, Unavailable) and gateway.status == 504
    other = error_for(418, "teapot")
    assert type(other) is EventStoreError and other.status == 418 and "418" in str(other)


def test_events_get_ids_once_and_keep_their_own():
    events = _with_ids([{"type": "A"}, {"type": "B", "id": "5f0c8f5e-8a7b-4c2e-9a57-1f2d3c4b5a69"}])
    assert len(events[0]["id"]) == 36 and events[1]["id"] == "5f0c8f5e-8a7b-4c2e-9a57-1f2d3c4b5a69"
    assert _with_ids(events) == events, "a retry sends the same ids"


def test_expectations_are_preconditions():
    assert _expectation(None) == {} and _expectation("no_stream") == {"if-none-match": "*"}
    assert _expectation(3) == {"if-match": '"3"'}
    for bad in (-1, True, "3", 1.5):
        with pytest.raises(ValueError):
            _expectation(bad)


def test_the_region_comes_from_an_execute_api_host():
    assert _region_of("https://abc123.execute-api.eu-west-1.amazonaws.com") == "eu-west-1"
    assert _region_of("http://127.0.0.1:3000") is None
