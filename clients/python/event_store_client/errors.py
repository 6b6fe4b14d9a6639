"""Typed errors: one class per answer a caller handles differently.

Each carries the HTTP status, the answer's JSON (or text) and, where the API
says it, the stream's current version or how long to wait."""

from typing import Any, Optional


class EventStoreError(Exception):
    """An answer outside 2xx, or no answer at all (`status` None)."""

    status: Optional[int] = None

    def __init__(self, message: str, status: Optional[int] = None, body: Any = None,
                 etag: Optional[str] = None, retry_after: Optional[float] = None):
        super().__init__(message)
        if status is not None:
            self.status = status
        self.body = body
        self.etag = etag
        self.retry_after = retry_after

    @property
    def current_version(self) -> Optional[int]:
        """The version the stream (or its metadata) is at, when the answer names it."""
        if isinstance(self.body, dict):
            for field in ("current_version", "metadata_version", "version"):
                if isinstance(self.body.get(field), int):
                    return self.body[field]
        if self.etag and self.etag.strip('"').isdigit():
            return int(self.etag.strip('"'))
        return None


class BadRequest(EventStoreError):
    """400: the request is malformed (a name, a parameter, the JSON); nothing was written."""
    status = 400


class Forbidden(EventStoreError):
    """403: the signature was refused, or the caller may not call this route."""
    status = 403


class NotFound(EventStoreError):
    """404: no such stream, view item or route."""
    status = 404


class Conflict(EventStoreError):
    """409: the stream is not at the expected version (`current_version`); nothing was written."""
    status = 409


class Gone(EventStoreError):
    """410: the stream is deleted, or the view item's subject forgotten."""
    status = 410


class PreconditionFailed(EventStoreError):
    """412: a precondition header did not hold."""
    status = 412


class PayloadTooLarge(EventStoreError):
    """413: an event, a batch or a snapshot over the store's limits."""
    status = 413


class PreconditionRequired(EventStoreError):
    """428: the request needs `If-Match` (a delete, a snapshot)."""
    status = 428


class TooManyRequests(EventStoreError):
    """429: throttled; `retry_after` seconds, when the answer said."""
    status = 429


class Unavailable(EventStoreError):
    """503 (or 502/504 from the gateway): try again; `retry_after` when said."""
    status = 503


class Unreachable(EventStoreError):
    """No answer: the connection failed or timed out after every retry."""


BY_STATUS = {cls.status: cls for cls in (BadRequest, Forbidden, NotFound, Conflict, Gone, PreconditionFailed,
                                         PayloadTooLarge, PreconditionRequired, TooManyRequests, Unavailable)}


def error_for(status: int, body: Any, etag: Optional[str] = None,
              retry_after: Optional[float] = None) -> EventStoreError:
    """The typed error for an answer's status (the base class for statuses without one of their own)."""
    cls = BY_STATUS.get(503 if status in (502, 504) else status, EventStoreError)
    message = body.get("error") or body.get("message") if isinstance(body, dict) else None
    return cls(f"{status}: {message or body or 'no message'}", status, body, etag, retry_after)
