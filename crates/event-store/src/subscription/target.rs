//! Delivering a partition's events to a subscription's target, in order.
//!
//! - **Kinesis**: as playback puts them ([`put_in_key_order`]: each key's
//!   records in order on first delivery; an ambiguous failure is read back
//!   from the stream). Records Kinesis keeps refusing mean the target is
//!   unavailable: the partition backs off and delivers the batch again later.
//! - **Lambda**: a synchronous `Invoke` with the batch, the way an event
//!   source mapping does it: a function error fails the batch; a
//!   `batchItemFailures` answer fails the batch from its lowest failed item
//!   (the items before it are done). A batch that keeps failing is
//!   bisected; a single event that still fails is handed back to be parked
//!   ([`deliver_in_order`], pure). An `Invoke` that does not reach the
//!   function (throttled, function gone, network) means unavailable, as for Kinesis.

use std::collections::{BTreeSet, VecDeque};
use std::future::Future;
use std::ops::Range;

use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::batch::Backoff;
use crate::error::{Error, Result};
use crate::event_item::EventItem;
use crate::kinesis::{events_stored_since, put_in_key_order, send_put_records, stored_since, OutgoingRecord};
use crate::log::record::{fits_one_record, kinesis_records_of};
use crate::log::{PlayedEvent, RecordFormat};
use crate::offload::OffloadRef;
pub use crate::position::Position;
use crate::readers::subscriptions::spec::Target;
use crate::readers::subscriptions::Parked;
use crate::time::now_ms;
use crate::views::ViewRef;

/// Attempts at one (sub-)batch before it is split, or its single event parked.
pub const ATTEMPTS_BEFORE_BISECT: u32 = 3;
/// The largest Lambda payload we send: under the 6 MB synchronous limit.
pub const LAMBDA_PAYLOAD_BYTES: usize = 5 * 1024 * 1024;

/// What a subscription's target receives for each event: the played
/// record (as playback puts it; `playback_seq` numbers the partition's
/// deliveries) with the subscription, the partition, and the event's
/// position in the log.
///
/// The consumer's rule (docs/subscriptions.md): per subscription id and
/// partition key, keep the highest `playback_seq` processed and drop an
/// event at or below it, unless it is `redriven`. A key's events reach the target in increasing
/// `playback_seq` on first delivery, and a copy repeats its number. Not per
/// partition: a partition's keys go to different shards of a Kinesis
/// target, read at different paces.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliveredEvent {
    pub subscription: String,
    /// The subscription's id: a subscription deleted and created again under
    /// its name is another one, numbering its deliveries from 0 again.
    pub subscription_id: String,
    pub partition: u32,
    pub position: Position,
    /// A parked event re-delivered (the `redrive` action): out of its key's order by
    /// nature (later events went on), never delivered before; take it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redriven: bool,
    #[serde(flatten)]
    pub event: PlayedEvent,
}

impl DeliveredEvent {
    /// The record delivered for `event`: the event whole or, where a Kinesis
    /// target could not take it in one record (it would refuse the whole
    /// request), a marker in its place, in order, with where its payload lies
    /// (as playback does).
    pub(crate) fn record(mut self, event: &EventItem, to: &Target, offloaded: Option<&OffloadRef>) -> Result<Vec<u8>> {
        let data = serde_json::to_vec(&self).map_err(|e| Error::encode("delivered event", e))?;
        if !matches!(to, Target::Kinesis(_)) || fits_one_record(&event.partition_key, data.len()) {
            return Ok(data);
        }
        tracing::warn!(sort_key = %event.sort_key, bytes = data.len(), "delivered event over the Kinesis record limit: a marker goes instead");
        self.event = PlayedEvent::too_large(event, data.len(), offloaded, self.event.playback_seq);
        serde_json::to_vec(&self).map_err(|e| Error::encode("delivered event", e))
    }
}

/// One event ready to go: its record (the JSON a consumer receives) and what identifies it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The partition's delivery sequence number of this event.
    pub seq: u64,
    pub slot: i64,
    pub sort_key: String,
    pub event_id: String,
    pub partition_key: String,
    /// The delivered event's JSON.
    pub data: Vec<u8>,
}

impl Delivery {
    /// The parked-list entry of this event for subscription `sub_id`'s `partition`, with why.
    pub(crate) fn parked(&self, sub_id: &str, partition: u32, error: String) -> Parked {
        Parked {
            sub_id: sub_id.to_owned(),
            partition,
            slot: self.slot,
            event_sort_key: self.sort_key.clone(),
            event_id: self.event_id.clone(),
            partition_key: self.partition_key.clone(),
            seq: self.seq,
            error,
            parked_at: crate::time::format_ms(now_ms()),
        }
    }
}

/// What one delivery attempt at a batch got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Every event is delivered.
    Delivered,
    /// The events before this index are delivered; it and the rest failed.
    FailedFrom(usize, String),
    /// The target could not be reached (throttled, gone, network): try later, nothing parked.
    Unavailable(String),
}

/// What delivering a batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The events before this index are delivered or parked: the checkpoint may pass them.
    pub done: usize,
    /// Events that kept failing alone (index, last error), to be parked.
    pub poison: Vec<(usize, String)>,
    /// Why delivery stopped before the end (target unavailable), if it did.
    pub unavailable: Option<String>,
    /// Requests made to the target.
    pub requests: usize,
    /// Stopped before the end because the run's time ran out.
    pub out_of_time: bool,
    /// Some events after `done` may be on the target already, put from this time (ms) on.
    pub ahead_since: Option<i64>,
}

/// Delivers the events of `batches` (consecutive ranges) in order by
/// calling `attempt` on ranges of them: a range that fails [`ATTEMPTS_BEFORE_BISECT`] times is split in two
/// (first half first), down to single events, which go to `poison`. With
/// `stop_at_poison`, delivery stops after the first one; once `out_of_time`
/// says so, before the next attempt (the caller saves what is done). Pure
/// apart from the closures and the backoff sleeps.
pub(crate) async fn deliver_in_order<F, Fut>(
    batches: Vec<Range<usize>>,
    backoff: &Backoff,
    (stop_at_poison, out_of_time): (bool, &(dyn Fn() -> bool + Sync)),
    mut attempt: F,
) -> Outcome
where
    F: FnMut(Range<usize>) -> Fut,
    Fut: Future<Output = Attempt>,
{
    let mut outcome = Outcome::default();
    let mut ranges = VecDeque::from(batches);
    while let Some(range) = ranges.pop_front() {
        let (mut start, mut failures, mut split) = (range.start, 0, false);
        while start < range.end {
            if outcome.requests > 0 && out_of_time() {
                outcome.done = start;
                outcome.out_of_time = true;
                return outcome;
            }
            outcome.requests += 1;
            let error = match attempt(start..range.end).await {
                Attempt::Delivered => break,
                Attempt::Unavailable(error) => {
                    outcome.done = start;
                    outcome.unavailable = Some(error);
                    return outcome;
                }
                Attempt::FailedFrom(index, error) => {
                    if index > 0 {
                        // Progress: what went through is done, the rest is retried afresh.
                        start = (start + index).min(range.end);
                        outcome.done = start;
                        failures = 0;
                        continue;
                    }
                    error
                }
            };
            failures += 1;
            if failures < ATTEMPTS_BEFORE_BISECT {
                tokio::time::sleep(backoff.delay(failures - 1, fastrand::f64())).await;
                continue;
            }
            if range.end - start > 1 {
                let middle = start + (range.end - start) / 2;
                ranges.push_front(middle..range.end);
                ranges.push_front(start..middle);
                split = true;
                break;
            }
            outcome.poison.push((start, error));
            start += 1;
            outcome.done = start;
            if stop_at_poison {
                return outcome;
            }
        }
        if !split {
            outcome.done = range.end;
        }
    }
    outcome
}

/// Puts `events` on a Kinesis stream in key order (see the module doc).
/// With `ahead_since` (an earlier delivery of these events was cut short
/// after storing some, putting from then on), those already on the stream
/// are read back first and not put again. When some records keep failing,
/// the events before the first failed one are done, and the outcome's
/// `ahead_since` says whether any after it may be stored.
pub(crate) async fn put_on_stream(
    (putter, reader): (&aws_sdk_kinesis::Client, &aws_sdk_kinesis::Client),
    stream: &str,
    events: &[Delivery],
    (format, ahead_since): (RecordFormat, Option<i64>),
    backoff: &Backoff,
) -> Outcome {
    let outgoing: Vec<OutgoingRecord> = events
        .iter()
        .map(|e| OutgoingRecord { partition_key: e.partition_key.clone(), data: e.data.clone() })
        .collect();
    // Read-backs start a little before the first send (Kinesis' clock is not ours).
    let since = now_ms() - 5_000;
    let stored = match ahead_since {
        Some(ahead) => match events_stored_since(reader, stream, ahead, &outgoing).await {
            Ok(stored) => stored,
            Err(err) => {
                let unavailable = Some(format!("kinesis {stream}: reading back what was stored: {err}"));
                return Outcome { unavailable, ahead_since, ..Outcome::default() };
            }
        },
        None => vec![false; events.len()],
    };
    // The events still to put (indices into `events`), and their records.
    let to_put: Vec<usize> = (0..events.len()).filter(|&i| !stored[i]).collect();
    let unsent: Vec<OutgoingRecord> = to_put.iter().map(|&i| outgoing[i].clone()).collect();
    let (records, carried): (Vec<OutgoingRecord>, Vec<Vec<usize>>) =
        kinesis_records_of(&unsent, format).into_iter().unzip();
    let stats = put_in_key_order(
        &records,
        backoff,
        |batch| async move { send_put_records(putter, stream, &batch).await },
        |batch| async move { stored_since(reader, stream, since, &batch).await },
    )
    .await;
    let failed: BTreeSet<usize> =
        stats.failures.iter().flat_map(|f| carried[f.index].iter().map(|&j| to_put[j])).collect();
    let Some(&first) = failed.first() else {
        return Outcome { done: events.len(), requests: stats.requests, ..Outcome::default() };
    };
    // Every event before the first failed one is stored (each key's go in order); some after it may be.
    let stored_after = (first + 1..events.len()).any(|i| !failed.contains(&i));
    Outcome {
        done: first,
        unavailable: Some(format!(
            "kinesis {stream}: {} records still failing ({})",
            stats.failures.len(),
            stats.failures[0].code
        )),
        requests: stats.requests,
        ahead_since: stored_after.then_some(ahead_since.unwrap_or(since)),
        ..Outcome::default()
    }
}

/// The payload a Lambda target receives: the subscription, the partition,
/// the view a projection's function writes (for a projection in the user's
/// code), and the events in order (their JSON as delivered).
pub(crate) fn lambda_payload(
    subscription: &str,
    (partition, view): (u32, Option<&ViewRef>),
    events: &[Delivery],
) -> Vec<u8> {
    let view = view.and_then(|v| serde_json::to_string(v).ok()).map(|v| format!("\"view\":{v},")).unwrap_or_default();
    let mut payload = format!(
        "{{\"subscription\":{},\"partition\":{partition},{view}\"events\":[",
        serde_json::to_string(subscription).unwrap_or_default()
    )
    .into_bytes();
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            payload.push(b',');
        }
        payload.extend_from_slice(&event.data);
    }
    payload.extend_from_slice(b"]}");
    payload
}

/// Reads a Lambda target's answer: `function_error` set fails the batch; a
/// `batchItemFailures` list fails it from the lowest listed event (an
/// identifier that names no event of the batch fails all of it, as for an
/// event source mapping); from a projection's function (`view`),
/// `{"unavailable": reason}` (it could not write its view: not the events'
/// fault) means unavailable; anything else delivers it.
pub(crate) fn read_answer(events: &[Delivery], function_error: Option<&str>, payload: &[u8], view: bool) -> Attempt {
    let text = || String::from_utf8_lossy(&payload[..payload.len().min(1_000)]).into_owned();
    if let Some(kind) = function_error {
        return Attempt::FailedFrom(0, format!("function error {kind}: {}", text()));
    }
    let answer: Value = serde_json::from_slice(payload).unwrap_or(Value::Null);
    if let Some(reason) = answer.get("unavailable").and_then(Value::as_str).filter(|_| view) {
        return Attempt::Unavailable(format!("the function could not go on: {reason}"));
    }
    let Some(failures) = answer.get("batchItemFailures").and_then(Value::as_array) else {
        return Attempt::Delivered;
    };
    if failures.is_empty() {
        return Attempt::Delivered;
    }
    let lowest = failures
        .iter()
        .map(|f| {
            f.get("itemIdentifier").and_then(Value::as_str).and_then(|id| events.iter().position(|e| e.event_id == id))
        })
        .try_fold(usize::MAX, |lowest, index| index.map(|i| lowest.min(i)));
    let index = lowest.unwrap_or(0);
    Attempt::FailedFrom(index, format!("batch item failure from event {}: {}", index, text()))
}

/// One synchronous `Invoke` of a Lambda target with `events`.
pub(crate) async fn invoke(
    lambda: &aws_sdk_lambda::Client,
    function: &str,
    (subscription, partition, view): (&str, u32, Option<&ViewRef>),
    events: &[Delivery],
) -> Attempt {
    let sent = lambda
        .invoke()
        .function_name(function)
        .invocation_type(InvocationType::RequestResponse)
        .payload(Blob::new(lambda_payload(subscription, (partition, view), events)))
        .send()
        .await;
    match sent {
        Ok(out) => {
            let payload = out.payload().map(|p| p.as_ref()).unwrap_or_default();
            read_answer(events, out.function_error(), payload, view.is_some())
        }
        Err(err) => Attempt::Unavailable(Error::invoke(err).to_string()),
    }
}

/// Checks that `function` exists and may be invoked (`Invoke` with `DryRun`: nothing runs).
pub(crate) async fn check_function(lambda: &aws_sdk_lambda::Client, function: &str) -> Result<()> {
    lambda
        .invoke()
        .function_name(function)
        .invocation_type(InvocationType::DryRun)
        .send()
        .await
        .map_err(|e| Error::BadInput(format!("target function {function:?}: {}", Error::invoke(e))))?;
    Ok(())
}

/// Checks that `stream` exists.
pub(crate) async fn check_stream(kinesis: &aws_sdk_kinesis::Client, stream: &str) -> Result<()> {
    kinesis.describe_stream_summary().stream_name(stream).send().await.map_err(|e| {
        Error::BadInput(format!("target stream {stream:?}: {}", Error::kinesis("DescribeStreamSummary", e)))
    })?;
    Ok(())
}

/// Splits `events` into batches of at most `max` events and [`LAMBDA_PAYLOAD_BYTES`].
pub(crate) fn lambda_batches(events: &[Delivery], max: usize) -> Vec<Range<usize>> {
    let sizes: Vec<usize> = events.iter().map(|e| e.data.len() + 1).collect();
    crate::batch::chunk_ranges(&sizes, max, LAMBDA_PAYLOAD_BYTES - 200)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::time::Duration;

    fn quick() -> Backoff {
        Backoff { base: Duration::from_millis(1), cap: Duration::from_millis(2), max_attempts: 3 }
    }

    fn events(n: usize) -> Vec<Delivery> {
        (0..n)
            .map(|i| Delivery {
                seq: i as u64,
                slot: 0,
                sort_key: format!("{i:04}"),
                event_id: format!("e{i}"),
                partition_key: "k".into(),
                data: format!("{{\"n\":{i}}}").into_bytes(),
            })
            .collect()
    }

    /// A target that refuses any batch holding one of `poison`, and records every event it accepted.
    async fn deliver_with_poison(n: usize, poison: &[usize], stop: bool) -> (Outcome, Vec<usize>) {
        let accepted = RefCell::new(Vec::new());
        let outcome = deliver_in_order(std::iter::once(0..n).collect(), &quick(), (stop, &|| false), |range| {
            let hit = range.clone().find(|i| poison.contains(i));
            let result = match hit {
                Some(_) => Attempt::FailedFrom(0, "refused".into()),
                None => {
                    accepted.borrow_mut().extend(range);
                    Attempt::Delivered
                }
            };
            async move { result }
        })
        .await;
        (outcome, accepted.into_inner())
    }

    #[tokio::test]
    async fn a_poison_event_is_bisected_out_and_the_rest_delivered_in_order() {
        let (outcome, accepted) = deliver_with_poison(10, &[6], false).await;
        assert_eq!(outcome.poison.iter().map(|p| p.0).collect::<Vec<_>>(), vec![6]);
        assert_eq!(outcome.done, 10);
        assert_eq!(accepted, vec![0, 1, 2, 3, 4, 5, 7, 8, 9], "everything else, in order");
        let (stopped, accepted) = deliver_with_poison(10, &[6], true).await;
        assert_eq!((stopped.done, stopped.poison.len()), (7, 1), "stops just after the parked event");
        assert_eq!(accepted, vec![0, 1, 2, 3, 4, 5]);
    }

    #[tokio::test]
    async fn partial_failures_keep_what_went_through_and_unavailable_stops_with_nothing_skipped() {
        // The first answer fails from item 4 once; then everything goes.
        let calls = RefCell::new(Vec::new());
        let outcome = deliver_in_order(std::iter::once(0..8).collect(), &quick(), (false, &|| false), |range| {
            calls.borrow_mut().push(range.clone());
            let result = if range.start == 0 { Attempt::FailedFrom(4, "partial".into()) } else { Attempt::Delivered };
            async move { result }
        })
        .await;
        assert_eq!(calls.into_inner(), vec![0..8, 4..8]);
        assert_eq!((outcome.done, outcome.poison.len()), (8, 0));

        let outcome = deliver_in_order(std::iter::once(0..8).collect(), &quick(), (false, &|| false), |range| {
            let result = if range.start == 0 {
                Attempt::FailedFrom(3, "partial".into())
            } else {
                Attempt::Unavailable("throttled".into())
            };
            async move { result }
        })
        .await;
        assert_eq!(outcome.done, 3, "the checkpoint may pass the three delivered, no more");
        assert_eq!(outcome.unavailable.as_deref(), Some("throttled"));
    }

    #[tokio::test]
    async fn out_of_time_it_stops_between_attempts_with_what_is_done() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let calls = AtomicUsize::new(0);
        let out_of_time = || calls.load(Ordering::SeqCst) >= 2;
        let outcome = deliver_in_order(vec![0..4, 4..8, 8..12], &quick(), (false, &out_of_time), |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Attempt::Delivered }
        })
        .await;
        assert_eq!((outcome.done, outcome.out_of_time, outcome.requests), (8, true, 2));
    }

    #[test]
    fn answers_are_read_as_an_event_source_mapping_reads_them() {
        let batch = events(5);
        assert_eq!(read_answer(&batch, None, b"null", false), Attempt::Delivered);
        assert_eq!(read_answer(&batch, None, br#"{"batchItemFailures": []}"#, false), Attempt::Delivered);
        let partial = br#"{"batchItemFailures": [{"itemIdentifier": "e3"}, {"itemIdentifier": "e2"}]}"#;
        assert!(matches!(read_answer(&batch, None, partial, false), Attempt::FailedFrom(2, _)));
        let unknown = br#"{"batchItemFailures": [{"itemIdentifier": "nope"}]}"#;
        assert!(
            matches!(read_answer(&batch, None, unknown, false), Attempt::FailedFrom(0, _)),
            "unknown id: all failed"
        );
        let outage = br#"{"unavailable": "dynamodb TransactWriteItems: throttled"}"#;
        assert!(matches!(read_answer(&batch, None, outage, true), Attempt::Unavailable(m) if m.contains("throttled")));
        assert_eq!(read_answer(&batch, None, outage, false), Attempt::Delivered, "only a view's function says that");
        assert!(
            matches!(read_answer(&batch, Some("Unhandled"), b"{}", false), Attempt::FailedFrom(0, m) if m.contains("Unhandled"))
        );
        let payload: Value = serde_json::from_slice(&lambda_payload("orders", (3, None), &batch[..2])).unwrap();
        assert_eq!(
            payload,
            serde_json::json!({"subscription": "orders", "partition": 3, "events": [{"n": 0}, {"n": 1}]})
        );
        let view = ViewRef { projection: "todos".into(), version: 2, buckets: 4, instance: None };
        let payload: Value =
            serde_json::from_slice(&lambda_payload("view.todos.v2", (0, Some(&view)), &batch[..1])).unwrap();
        assert_eq!(payload["view"], serde_json::json!({"projection": "todos", "version": 2, "buckets": 4}));
        assert_eq!(payload["events"], serde_json::json!([{"n": 0}]));
    }
}
