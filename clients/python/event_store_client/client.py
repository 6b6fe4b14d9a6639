"""The event store's HTTP API: entity streams, the sealed log, projections' views.

One `EventStore` per base URL (the stack's `ApiUrl` output, or `make local`'s
`http://127.0.0.1:3000`); it keeps its connections and may be shared by threads."""

import json
import os
import time
import uuid
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Union
from urllib.parse import quote, urlencode, urlsplit

import urllib3

from .errors import EventStoreError, Unreachable, error_for
from .retry import backoff, parse_retry_after, should_retry

Expected = Union[None, int, str]
"""An append's expectation: None (any version), "no_stream" (`If-None-Match: *`) or a version (`If-Match`)."""

#: A long poll answers within 25 s (`wait` is at most 20): the read timeout is above that.
READ_TIMEOUT = 35.0
#: Characters of a stream name sent as they are: the store takes a name as one path segment as it is.
NAME_CHARACTERS = "-_.:@+=~"
_NO_BODY = object()


class EventStore:
    """A client of one stack.

    `sign`: SigV4-sign every request for `execute-api` (the deployed API's `AWS_IAM`
    authorization) with `credentials` (botocore's), by default boto3's credential chain
    (environment, profile, SSO, container or instance role) in `region` (by default the
    URL's, for an `execute-api` host, else boto3's). `make local` takes unsigned requests.
    `attempts`: how many times a request is sent at most (retries wait with full jitter,
    never less than a `Retry-After`)."""

    def __init__(self, url: str, *, sign: bool = True, region: Optional[str] = None, credentials: Any = None,
                 attempts: int = 6, timeout: float = READ_TIMEOUT, session: Any = None):
        self.base = url.rstrip("/")
        parts = urlsplit(self.base)
        self.origin = f"{parts.scheme}://{parts.netloc}"  # what the store's own links (`next`) are relative to
        self.attempts = max(1, attempts)
        self._http = urllib3.PoolManager(retries=False, maxsize=10,
                                         timeout=urllib3.Timeout(connect=5.0, read=timeout))
        self._signer = None
        if sign:
            import boto3
            from botocore.auth import SigV4Auth
            session = session or boto3.Session()
            region = region or _region_of(self.base) or session.region_name or os.environ.get("AWS_REGION")
            if not region:
                raise ValueError("no region to sign for: pass region=, or set AWS_REGION")
            credentials = credentials or session.get_credentials()
            if credentials is None:
                raise ValueError("no AWS credentials found to sign with (boto3's credential chain found none)")
            self._signer = lambda: SigV4Auth(_frozen(credentials), "execute-api", region)

    # ---- entity streams -------------------------------------------------------------------

    def append(self, stream: str, events: Union[Mapping, List[Mapping]], expected: Expected = None) -> Dict:
        """Appends `events` atomically: `{"stream", "first", "last", "versions"}`. Events without
        an `id` get a random UUID before the first attempt, so a retry after a lost answer is
        answered the original versions instead of appending twice. `Conflict` names the
        stream's `current_version`; `Gone` a deleted stream; `NotFound` an unknown one (`If-Match`)."""
        batch = _with_ids([events] if isinstance(events, Mapping) else events)
        return self._call("POST", _stream_path(stream), body=batch, headers=_expectation(expected), safe=True)

    def append_across(self, appends: Iterable[Mapping], conditions: Iterable[Mapping] = ()) -> Dict:
        """Appends to several streams in one transaction (`{"appends": [{"stream", "expected_version"?,
        "events"}]}`), all or none, with conditions on others; retried safely by event ids."""
        body: Dict[str, Any] = {"appends": [{**a, "events": _with_ids(a["events"])} for a in appends]}
        if conditions:
            body["conditions"] = list(conditions)
        return self._call("POST", "/streams", body=body, safe=True)

    def read(self, stream: str, start: Optional[int] = None, limit: Optional[int] = None,
             backward: bool = False) -> Dict:
        """One page of a stream's events: `{"stream", "version", "deleted", "events", "next"}`."""
        query = {"from": start, "limit": limit, "direction": "backward" if backward else None}
        return self._call("GET", _stream_path(stream), query=query)

    def events(self, stream: str, start: Optional[int] = None, backward: bool = False) -> Iterator[Dict]:
        """Every event of a stream from `start`, page after page."""
        page = self.read(stream, start, backward=backward)
        while True:
            yield from page["events"]
            if not page.get("next") or not page["events"]:
                return
            page = self._call("GET", page["next"], link=True)

    def state(self, stream: str) -> Dict:
        """`{"version", "deleted", "snapshot", "events"}`: the snapshot and the events after it."""
        return self._call("GET", _stream_path(stream) + "/state")

    def save_snapshot(self, stream: str, version: int, state: Any) -> Dict:
        """Stores `state` as folded up to `version` (`If-Match`); sent again safely (the same write)."""
        return self._call("PUT", _stream_path(stream) + "/snapshot", body=state,
                          headers=_expectation(version), safe=True)

    def delete(self, stream: str, expected: int) -> Dict:
        """Appends `StreamDeleted` if the stream is at `expected`; later appends are `Gone`.
        Not sent again once it may have reached the store (a second one would be refused)."""
        return self._call("DELETE", _stream_path(stream), headers=_expectation(expected))

    def metadata(self, stream: str) -> Dict:
        """`{"stream", "metadata_version", "metadata"}`."""
        return self._call("GET", _stream_path(stream) + "/metadata")

    def set_metadata(self, stream: str, metadata: Mapping, expected: Optional[int] = None) -> Dict:
        """Sets the stream's metadata (`max_age`, `max_count`, `truncate_before`, `custom`), if its
        metadata is at version `expected` when given; `Conflict` names the current one."""
        return self._call("PUT", _stream_path(stream) + "/metadata", body=dict(metadata),
                          headers=_expectation(expected))

    def streams(self, prefix: Optional[str] = None, after: Optional[str] = None,
                limit: Optional[int] = None) -> Dict:
        """One page of stream names in name order: `{"streams": [{"name", "version", "deleted"}], "next"}`."""
        return self._call("GET", "/streams", query={"prefix": prefix, "after": after, "limit": limit})

    def list_streams(self, prefix: Optional[str] = None) -> Iterator[Dict]:
        """Every stream within `prefix`, page after page."""
        after = None
        while True:
            page = self.streams(prefix, after)
            yield from page["streams"]
            after = page.get("next")
            if not after:
                return

    # ---- the sealed log ----------------------------------------------------------------------

    def log(self, start: Union[None, str, int] = None, limit: Optional[int] = None, wait: Optional[int] = None,
            filters: Optional[Mapping[str, str]] = None) -> Dict:
        """One page of the complete log from `start` (a position, an RFC 3339 time or ms since the
        epoch; default the log's start): `{"events", "next", "sealed_to", "at_end"}`, each event
        with its own `position`. `wait` (0 to 20 s): how long to wait at the end for new events.
        `filters`: JSON pointer to value, all of which an event matches."""
        query: List = [("from", start), ("limit", limit), ("wait", wait)]
        query += [("filter", f"{pointer}={value}") for pointer, value in (filters or {}).items()]
        return self._call("GET", "/log", query=query)

    def follow(self, start: Union[None, str, int] = None, filters: Optional[Mapping[str, str]] = None,
               wait: int = 20, limit: Optional[int] = None, timeout: Optional[float] = None) -> Iterator[Dict]:
        """The log's events from `start`, then each new one as it is sealed (a long poll of `wait`
        seconds at the end), until `timeout` seconds have passed (None: forever). Keep the last
        event's `position` to resume from it."""
        position = start
        deadline = None if timeout is None else time.monotonic() + timeout
        while deadline is None or time.monotonic() < deadline:
            left = wait if deadline is None else max(0, min(wait, int(deadline - time.monotonic())))
            page = self.log(position, limit=limit, wait=left, filters=filters)
            yield from page["events"]
            position = page["next"]
            if not page["events"] and page["at_end"] and left == 0:
                time.sleep(0.5)  # no long poll to wait in: do not ask again at once

    # ---- read models -------------------------------------------------------------------------

    def view(self, projection: str, key: str, at_least_version: Optional[int] = None) -> Dict:
        """A view's item: `{"item", "version", "position"}`; `at_least_version` waits (up to 5 s)
        until the item's stream is at that version (`Unavailable` if it is not yet: not asked again)."""
        path = f"/views/{quote(projection, safe='')}/{quote(key, safe='')}"
        return self._call("GET", path, query={"at_least_version": at_least_version}, safe=at_least_version is None)

    def views(self, projection: str, prefix: Optional[str] = None, after: Optional[str] = None,
              limit: Optional[int] = None) -> Dict:
        """One page of a view's items in key order: `{"items", "next"}`."""
        query = {"prefix": prefix, "after": after, "limit": limit}
        return self._call("GET", f"/views/{quote(projection, safe='')}", query=query)

    # ---- sending -----------------------------------------------------------------------------

    def _call(self, method: str, path: str, query: Any = None, body: Any = _NO_BODY,
              headers: Optional[Dict[str, str]] = None, safe: Optional[bool] = None, link: bool = False) -> Any:
        """Sends the request, again while `should_retry` says so; the answer's JSON, or its typed error.
        GETs are always safe to repeat. `link`: `path` is one of the store's links (from its origin)."""
        safe = method == "GET" if safe is None else safe
        pairs = query.items() if isinstance(query, Mapping) else (query or [])
        pairs = [(k, str(v)) for k, v in pairs if v is not None]
        # Encoded as SigV4 canonicalizes a query (RFC 3986), so the signed and the sent query agree.
        url = (self.origin if link else self.base) + path
        url += "?" + urlencode(pairs, quote_via=quote, safe="-_.~") if pairs else ""
        data = json.dumps(body).encode() if body is not _NO_BODY else None
        headers = {**(headers or {}), **_trace_headers()}
        if data is not None:
            headers["content-type"] = "application/json"
        failure: Optional[EventStoreError] = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(backoff(attempt - 1, failure.retry_after if failure else None))
            try:
                answer = self._http.request(method, url, body=data, headers=self._signed(method, url, data, headers),
                                            redirect=False)
            except urllib3.exceptions.HTTPError as cut:
                failure = Unreachable(f"{method} {path}: no answer ({cut})")
                sent = not isinstance(cut, urllib3.exceptions.NewConnectionError)
                if should_retry(None, safe, sent):
                    continue
                raise failure from cut
            result = _decode(answer)
            if 200 <= answer.status < 300 or answer.status == 304:
                return result
            failure = error_for(answer.status, result, answer.headers.get("etag"),
                                parse_retry_after(answer.headers.get("retry-after")))
            if not should_retry(answer.status, safe):
                raise failure
        assert failure is not None
        raise failure

    def _signed(self, method: str, url: str, data: Optional[bytes], headers: Dict[str, str]) -> Dict[str, str]:
        """The headers with a fresh SigV4 signature (a retry is signed again: a signature has a time)."""
        if self._signer is None:
            return headers
        from botocore.awsrequest import AWSRequest
        request = AWSRequest(method=method, url=url, data=data, headers=headers)
        self._signer().add_auth(request)
        return dict(request.headers.items())


def _stream_path(stream: str) -> str:
    return "/streams/" + quote(stream, safe=NAME_CHARACTERS)


def _expectation(expected: Expected) -> Dict[str, str]:
    if expected is None:
        return {}
    if expected == "no_stream":
        return {"if-none-match": "*"}
    if isinstance(expected, int) and not isinstance(expected, bool) and expected >= 0:
        return {"if-match": f'"{expected}"'}
    raise ValueError(f"expected must be None, 'no_stream' or a version (0 or more), not {expected!r}")


def _with_ids(events: Iterable[Mapping]) -> List[Dict]:
    """The events, each with an `id`: its own, or a new random UUID."""
    return [dict(e) if e.get("id") else {**e, "id": str(uuid.uuid4())} for e in events]


def _decode(answer: "urllib3.BaseHTTPResponse") -> Any:
    text = answer.data.decode("utf-8", "replace")
    if "json" in (answer.headers.get("content-type") or ""):
        try:
            return json.loads(text) if text else None
        except ValueError:
            return text
    return text


def _region_of(url: str) -> Optional[str]:
    """The region of an `execute-api` host (`ID.execute-api.REGION.amazonaws.com`)."""
    parts = (urlsplit(url).hostname or "").split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "execute-api" else None


def _frozen(credentials: Any) -> Any:
    """Credentials as of now (a role's refresh when due), as botocore's signer wants them."""
    getter = getattr(credentials, "get_frozen_credentials", None)
    return getter() if getter else credentials


def _trace_headers() -> Dict[str, str]:
    """The current OpenTelemetry context as `traceparent`/`tracestate`, when the process has one."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: Dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}
