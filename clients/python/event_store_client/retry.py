"""When to send a request again, and after how long: pure, so tested without a network."""

import random
from typing import Optional

#: Answers that may succeed when sent again: throttled, the store failing or unavailable, its gateway too.
RETRIED_STATUSES = (429, 500, 502, 503, 504)


def should_retry(status: Optional[int], safe: bool, sent: bool = True) -> bool:
    """Whether to send again after `status` (None: no answer).

    A request that is `safe` to repeat (a read, an append whose events carry ids, a snapshot)
    is sent again after any of these. One that is not (a delete, metadata) only when the store
    surely did not act on it: it never left (`sent` False) or was throttled (429)."""
    if status is None:
        return safe or not sent
    if status == 429:
        return True
    return safe and status in RETRIED_STATUSES


def backoff(attempt: int, retry_after: Optional[float] = None, base: float = 0.1, cap: float = 5.0,
            rng: random.Random = random) -> float:
    """Seconds to wait before attempt `attempt` + 1 (0-based): "full jitter", a uniform draw below
    base * 2^attempt capped at `cap`, so clients that failed together do not retry together; never
    sooner than the answer's `Retry-After`."""
    ceiling = min(cap, base * (2 ** attempt))
    wait = rng.uniform(0, ceiling)
    return max(wait, retry_after or 0.0)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """`Retry-After` in seconds (the API sends seconds; an HTTP date is ignored)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds <= 3600 else None
