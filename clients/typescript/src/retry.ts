/** When to send a request again, and after how long: pure, so tested without a network. */

/** Answers that may succeed when sent again: throttled, the store failing or unavailable, its gateway too. */
export const RETRIED_STATUSES = [429, 500, 502, 503, 504];

/** Whether to send again after `status` (undefined: no answer). A request `safe` to repeat (a read,
 * an append whose events carry ids, a snapshot) is sent again after any of these; one that is not
 * (a delete, metadata) only when the store surely did not act on it: it never left (`sent` false)
 * or was throttled (429). */
export function shouldRetry(status: number | undefined, safe: boolean, sent = true): boolean {
  if (status === undefined) return safe || !sent;
  if (status === 429) return true;
  return safe && RETRIED_STATUSES.includes(status);
}

/** Seconds to wait before attempt `attempt` + 1 (0-based): "full jitter", a uniform draw below
 * base * 2^attempt capped at `cap`, so clients that failed together do not retry together; never
 * sooner than the answer's `Retry-After`. */
export function backoff(attempt: number, retryAfter?: number, base = 0.1, cap = 5, random = Math.random): number {
  const ceiling = Math.min(cap, base * 2 ** attempt);
  return Math.max(random() * ceiling, retryAfter ?? 0);
}

/** `Retry-After` in seconds (the API sends seconds; an HTTP date is ignored). */
export function parseRetryAfter(value: string | null | undefined): number | undefined {
  if (value == null || value.trim() === "") return undefined;
  const seconds = Number(value);
  return Number.isFinite(seconds) && seconds >= 0 && seconds <= 3600 ? seconds : undefined;
}
