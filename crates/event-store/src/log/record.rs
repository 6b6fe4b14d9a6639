//! The record a consumer of the playback stream receives: the event and
//! where it came from. Pure: a serde shape and its constructor.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::aggregation;
use crate::event_item::EventItem;
use crate::kinesis::{indices_by_key, OutgoingRecord};
use crate::offload::OffloadRef;
use crate::slices::KeyRange;
use crate::time::format_ms;

/// How played events become Kinesis records (see [`crate::aggregation`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordFormat {
    /// Many events of one partition key in one record, for consumers with a
    /// KPL deaggregator (the KCL, `aws-kinesis-agg`): past 1,000 records/s per shard.
    #[default]
    Aggregated,
    /// One record per event, for any consumer; a key's events go one request after another.
    Plain,
}

impl RecordFormat {
    pub(crate) fn is_default(&self) -> bool {
        *self == RecordFormat::default()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlayedEvent {
    /// Position in this playback, from 0; a record seen again with a number
    /// already seen is a duplicate. With parallel runs, each run's keys
    /// ([`PlayedEvent::keys`]) are numbered on their own.
    pub playback_seq: u64,
    /// Which of several runs played it (`--parallel`): part `part` of `parts` of the keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyRange>,
    /// The event's arrival time (Kinesis approximate arrival), ISO 8601 and ms.
    pub event_time: String,
    pub event_ms: i64,
    pub event_id: String,
    pub partition_key: String,
    /// The event itself when it is JSON...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// ...else its bytes, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_base64: Option<String>,
    /// Instead of the event (neither `data` nor `data_base64`): it was too
    /// large for a Kinesis record; read it from the log at this place (or its
    /// offloaded payload at `payload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub too_large: Option<TooLarge>,
}

/// Where an event too large to play lies in the event table, and how large its record would have been.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TooLarge {
    pub slot: i64,
    pub sort_key: String,
    pub bytes: usize,
    /// `s3://…` of the event's offloaded payload, when it has one ([`crate::offload`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

impl PlayedEvent {
    pub fn new(event: &EventItem, json: Option<Value>, bytes: &[u8], seq: u64) -> Self {
        use base64::Engine;
        let data_base64 = json.is_none().then(|| base64::engine::general_purpose::STANDARD.encode(bytes));
        Self {
            playback_seq: seq,
            keys: None,
            event_time: format_ms(event.arrival),
            event_ms: event.arrival,
            event_id: event.event_id.clone(),
            partition_key: event.partition_key.clone(),
            data: json,
            data_base64,
            too_large: None,
        }
    }

    /// The marker put in place of an event whose record would be `bytes`
    /// long, with where its payload is when it was offloaded.
    pub(crate) fn too_large(event: &EventItem, bytes: usize, payload: Option<&OffloadRef>, seq: u64) -> Self {
        let payload = payload.map(OffloadRef::location);
        let place = TooLarge { slot: event.slot, sort_key: event.sort_key.clone(), bytes, payload };
        Self { too_large: Some(place), ..Self::new(event, None, &[], seq) }.without_data()
    }

    fn without_data(self) -> Self {
        Self { data: None, data_base64: None, ..self }
    }
}

/// True when an event's played record (`data_len` bytes) fits one Kinesis
/// record in either format: alone in an aggregated record, with its
/// partition key, under 1 MiB.
pub(crate) fn fits_one_record(partition_key: &str, data_len: usize) -> bool {
    let aggregated = aggregation::empty_bytes(partition_key) + aggregation::user_record_bytes(data_len);
    partition_key.len() + aggregated.max(data_len) <= aggregation::MAX_RECORD_BYTES
}

/// The Kinesis records for a batch of played events: each event its own
/// record (`plain`), or each partition key's events, in order, packed into
/// as few aggregated records as the 1 MiB record limit allows (`aggregated`).
pub fn kinesis_records(events: Vec<OutgoingRecord>, format: RecordFormat) -> Vec<OutgoingRecord> {
    kinesis_records_of(&events, format).into_iter().map(|(record, _)| record).collect()
}

/// [`kinesis_records`], each record with the indices of the events it carries.
pub(crate) fn kinesis_records_of(events: &[OutgoingRecord], format: RecordFormat) -> Vec<(OutgoingRecord, Vec<usize>)> {
    if format == RecordFormat::Plain {
        return events.iter().cloned().enumerate().map(|(i, record)| (record, vec![i])).collect();
    }
    let mut out = Vec::new();
    for group in indices_by_key(events) {
        let key = &events[group[0]].partition_key;
        let limit = aggregation::MAX_RECORD_BYTES - key.len();
        let mut packed: Vec<usize> = Vec::new();
        let mut size = aggregation::empty_bytes(key);
        let record = |packed: &[usize]| OutgoingRecord {
            partition_key: key.clone(),
            data: aggregation::aggregate(key, packed.iter().map(|&i| events[i].data.as_slice())),
        };
        for &i in &group {
            let more = aggregation::user_record_bytes(events[i].data.len());
            if !packed.is_empty() && size + more > limit {
                out.push((record(&packed), std::mem::take(&mut packed)));
                size = aggregation::empty_bytes(key);
            }
            size += more;
            packed.push(i);
        }
        out.push((record(&packed), packed));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event_item::sort_key;

    #[test]
    fn played_records_carry_time_sequence_and_the_event() {
        let event = EventItem {
            slot: 1_000,
            sort_key: sort_key(1_234, "shardId-000000000000:7"),
            event_id: "shardId-000000000000:7".into(),
            arrival: 1_234,
            partition_key: "user-1".into(),
            data: None,
            encoding: None,
            payload: None,
            expires_at: None,
            moved_at: None,
        };
        let json = PlayedEvent::new(&event, Some(serde_json::json!({"a": 1})), b"{\"a\":1}", 41);
        let value = serde_json::to_value(&json).unwrap();
        assert_eq!(value["playback_seq"], 41);
        assert_eq!(value["event_time"], "1970-01-01T00:00:01.234Z");
        assert_eq!(value["data"], serde_json::json!({"a": 1}));
        assert!(value.get("data_base64").is_none());
        let binary = PlayedEvent::new(&event, None, &[0xff, 0x00], 42);
        assert_eq!(binary.data_base64.as_deref(), Some("/wA="));
    }

    fn event(key: &str, n: u8, len: usize) -> OutgoingRecord {
        OutgoingRecord { partition_key: key.into(), data: vec![n; len] }
    }

    #[test]
    fn aggregated_records_hold_each_keys_events_in_order_within_the_record_limit() {
        let events = vec![event("a", 1, 10), event("b", 2, 10), event("a", 3, 10), event("a", 4, 1_048_530)];
        assert_eq!(kinesis_records(events.clone(), RecordFormat::Plain), events);
        let records = kinesis_records(events.clone(), RecordFormat::Aggregated);
        // a: [1, 3] then 4 (which would push the first past 1 MiB); b: [2].
        let unpacked: Vec<(String, Vec<u8>)> = records
            .iter()
            .map(|r| {
                assert!(r.size() <= aggregation::MAX_RECORD_BYTES);
                let inner = aggregation::deaggregate(&r.partition_key, &r.data).unwrap();
                (r.partition_key.clone(), inner.iter().map(|(_, d)| d[0]).collect())
            })
            .collect();
        assert_eq!(unpacked, vec![("a".into(), vec![1, 3]), ("a".into(), vec![4]), ("b".into(), vec![2])]);
        let big: Vec<OutgoingRecord> = (0..4).map(|i| event("k", i, 400_000)).collect();
        assert_eq!(kinesis_records(big, RecordFormat::Aggregated).len(), 2, "two 400 KB events per 1 MiB record");
    }
}
