"""The event store's HTTP API from Python: `EventStore` and its typed errors."""

from .client import EventStore
from .errors import (BadRequest, Conflict, EventStoreError, Forbidden, Gone, NotFound, PayloadTooLarge,
                     PreconditionFailed, PreconditionRequired, TooManyRequests, Unavailable, Unreachable)

__all__ = ["EventStore", "EventStoreError", "BadRequest", "Forbidden", "NotFound", "Conflict", "Gone",
           "PreconditionFailed", "PayloadTooLarge", "PreconditionRequired", "TooManyRequests", "Unavailable",
           "Unreachable"]
