/** Typed errors: one class per answer a caller handles differently. Each carries the HTTP status,
 * the answer's JSON (or text) and, where the API says it, the stream's version or how long to wait. */

export class EventStoreError extends Error {
  constructor(
    message: string,
    /** The answer's status; undefined when nothing answered. */
    readonly status?: number,
    readonly body?: unknown,
    readonly etag?: string,
    /** Seconds to wait, from `Retry-After`. */
    readonly retryAfter?: number,
  ) {
    super(message);
    this.name = new.target.name;
  }

  /** The version the stream (or its metadata) is at, when the answer names it. */
  get currentVersion(): number | undefined {
    if (this.body && typeof this.body === "object") {
      const body = this.body as Record<string, unknown>;
      for (const field of ["current_version", "metadata_version", "version"]) {
        if (Number.isInteger(body[field])) return body[field] as number;
      }
    }
    const tag = this.etag?.replace(/"/g, "");
    return tag && /^\d+$/.test(tag) ? Number(tag) : undefined;
  }
}

/** 400: the request is malformed (a name, a parameter, the JSON); nothing was written. */
export class BadRequest extends EventStoreError {}
/** 403: the signature was refused, or the caller may not call this route. */
export class Forbidden extends EventStoreError {}
/** 404: no such stream, view item or route. */
export class NotFound extends EventStoreError {}
/** 409: the stream is not at the expected version (`currentVersion`); nothing was written. */
export class Conflict extends EventStoreError {}
/** 410: the stream is deleted, or the view item's subject forgotten. */
export class Gone extends EventStoreError {}
/** 412: a precondition header did not hold. */
export class PreconditionFailed extends EventStoreError {}
/** 413: an event, a batch or a snapshot over the store's limits. */
export class PayloadTooLarge extends EventStoreError {}
/** 428: the request needs `If-Match` (a delete, a snapshot). */
export class PreconditionRequired extends EventStoreError {}
/** 429: throttled; `retryAfter` seconds when the answer said. */
export class TooManyRequests extends EventStoreError {}
/** 503 (or 502/504 from the gateway): try again; `retryAfter` when said. */
export class Unavailable extends EventStoreError {}
/** No answer: the connection failed or timed out after every retry. */
export class Unreachable extends EventStoreError {}

const BY_STATUS: Record<number, typeof EventStoreError> = {
  400: BadRequest, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone, 412: PreconditionFailed,
  413: PayloadTooLarge, 428: PreconditionRequired, 429: TooManyRequests, 502: Unavailable, 503: Unavailable,
  504: Unavailable,
};

/** The typed error for an answer's status (the base class for statuses without one of their own). */
export function errorFor(status: number, body: unknown, etag?: string, retryAfter?: number): EventStoreError {
  const Class = BY_STATUS[status] ?? EventStoreError;
  const said = body && typeof body === "object" ? (body as Record<string, unknown>) : undefined;
  const message = said?.error ?? said?.message ?? body ?? "no message";
  return new Class(`${status}: ${typeof message === "string" ? message : JSON.stringify(message)}`, status, body, etag, retryAfter);
}
