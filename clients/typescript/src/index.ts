export { EventStore } from "./client.js";
export type {
  Appended, Expected, LogEvent, LogOptions, LogPage, LogStart, NewEvent, Options, StreamEvent, StreamPage, StreamState,
} from "./client.js";
export {
  BadRequest, Conflict, EventStoreError, Forbidden, Gone, NotFound, PayloadTooLarge, PreconditionFailed,
  PreconditionRequired, TooManyRequests, Unavailable, Unreachable,
} from "./errors.js";
