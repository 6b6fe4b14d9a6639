//! An archive object's content: the events of a time range as one Apache
//! Parquet file (`arrow`/`parquet`), a row per event, grouped by key slice
//! ([`super::cut`]) and in log order within each slice. Its columns are what
//! a user queries (Athena through the Glue table, pyarrow, DuckDB) and what
//! a reader needs to hand each event out again exactly as it was stored.
//! Pure: bytes in, bytes out.

use std::ops::Range;
use std::sync::Arc;

use arrow_array::builder::{BinaryBuilder, Int64Builder, StringBuilder, TimestampMillisecondBuilder};
use arrow_array::{Array, ArrayRef, BinaryArray, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use bytes::Bytes;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::{KeyValue, ParquetMetaData};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use super::analyst::Analyst;
use super::cut::{Cut, Group, Span};
use super::manifest::sha256_hex;
use crate::error::{Error, Result};
use crate::event_item::EventItem;
use crate::slices::{check_slices, key_hash, part_of};

/// Rows per row group, at most: a reader can fetch and decode groups independently.
pub const ROW_GROUP_ROWS: usize = 64 * 1024;
/// The file's key-value metadata naming its slice count: an object without
/// it was written before objects were cut by slice (its rows in log order).
const SLICES_KEY: &str = "event-store.slices";
/// The columns with statistics (min and max per row group): what queries
/// filter on. The others have none, which keeps the footer (every reader of
/// part of an object fetches it) to some 100 bytes a column and row group.
const QUERIED: [&str; 6] = ["arrival", "event_time", "slot", "partition_key", "source", "stream"];

/// Where an event came from.
pub const SOURCE_INGEST: &str = "ingest";
pub const SOURCE_ENTITY: &str = "entity";

/// One archived event: a row of the Parquet file.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// When it reached the event stream (ms): the log's order.
    pub arrival: i64,
    /// When it was received by the API or appended (`received_at`), when the event says.
    pub event_time: Option<i64>,
    pub slot: i64,
    pub sort_key: String,
    pub partition_key: String,
    pub event_id: String,
    /// [`SOURCE_INGEST`] (pixel hits, posts) or [`SOURCE_ENTITY`] (entity stream appends).
    pub source: &'static str,
    /// The entity stream and version, for an entity event.
    pub stream: Option<String>,
    pub version: Option<i64>,
    /// The event's bytes when they are JSON text (as sent, not re-serialized)...
    pub payload: Option<String>,
    /// ...else the bytes themselves.
    pub payload_bytes: Option<Vec<u8>>,
    /// The retention's TTL (epoch seconds) when one is set: the archive keeps it.
    pub expires_at: Option<i64>,
}

impl Row {
    /// The row of a stored event.
    pub(crate) fn of(event: &EventItem) -> Result<Row> {
        let bytes = event.bytes()?;
        let json = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
        // The relay keys an entity event `streams/<name>` and names its version in the body.
        let stream = event.partition_key.strip_prefix("streams/").filter(|_| json.is_some());
        let version = json.as_ref().and_then(|j| j["body"]["version"].as_i64());
        let event_time = json
            .as_ref()
            .and_then(|j| j["received_at"].as_str())
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_millis());
        let (payload, payload_bytes) = match (json.is_some(), String::from_utf8(bytes)) {
            (true, Ok(text)) => (Some(text), None),
            (_, Ok(text)) => (None, Some(text.into_bytes())),
            (_, Err(err)) => (None, Some(err.into_bytes())),
        };
        Ok(Row {
            arrival: event.arrival,
            event_time,
            slot: event.slot,
            sort_key: event.sort_key.clone(),
            partition_key: event.partition_key.clone(),
            event_id: event.event_id.clone(),
            source: if stream.is_some() { SOURCE_ENTITY } else { SOURCE_INGEST },
            stream: stream.map(str::to_owned),
            version: stream.and(version),
            payload,
            payload_bytes,
            expires_at: event.expires_at,
        })
    }

    /// The event again, as a reader of the event table gets it (bytes as sent, uncompressed).
    pub fn into_event(self) -> EventItem {
        let data = self.payload.map(String::into_bytes).or(self.payload_bytes);
        EventItem {
            slot: self.slot,
            sort_key: self.sort_key,
            event_id: self.event_id,
            arrival: self.arrival,
            partition_key: self.partition_key,
            data,
            encoding: None,
            payload: None,
            expires_at: self.expires_at,
            moved_at: None,
        }
    }
}

/// The columns, as the Glue table in `template.yaml` declares them: the
/// row's, then the analyst's ([`Analyst`], derived and never read back).
pub(crate) fn schema() -> SchemaRef {
    let time = DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into()));
    let row = [
        Field::new("arrival", time.clone(), false),
        Field::new("event_time", time, true),
        Field::new("slot", DataType::Int64, false),
        Field::new("sort_key", DataType::Utf8, false),
        Field::new("partition_key", DataType::Utf8, false),
        Field::new("event_id", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("stream", DataType::Utf8, true),
        Field::new("version", DataType::Int64, true),
        Field::new("payload", DataType::Utf8, true),
        Field::new("payload_bytes", DataType::Binary, true),
        Field::new("expires_at", DataType::Int64, true),
    ];
    Arc::new(Schema::new(row.into_iter().chain(Analyst::fields()).collect::<Vec<_>>()))
}

/// What an object is, for S3's `Content-Type`.
pub(crate) const CONTENT_TYPE: &str = "application/vnd.apache.parquet";

/// The Parquet file of `rows` (in log order) cut into `slices` slices: each
/// slice's rows, in log order, in row groups of their own, slice after slice
/// (zstd, statistics per column chunk, so a query on arrival or partition
/// key skips row groups it does not need).
pub(crate) fn write(rows: &[Row], slices: u32) -> Result<Vec<u8>> {
    let slices = check_slices(slices)?;
    let properties = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
        // Fixed: the same rows make the same bytes, so a repeat after a crash finds its own first attempt.
        .set_created_by("event-store archive v2".to_owned())
        .set_key_value_metadata(Some(vec![KeyValue::new(SLICES_KEY.to_owned(), slices.to_string())]))
        .set_statistics_enabled(EnabledStatistics::None)
        .set_offset_index_disabled(true);
    let properties = QUERIED
        .iter()
        .fold(properties, |p, column| {
            p.set_column_statistics_enabled(ColumnPath::from(*column), EnabledStatistics::Chunk)
        })
        .build();
    let mut by_slice: Vec<Vec<&Row>> = vec![Vec::new(); slices as usize];
    for row in rows {
        by_slice[part_of(key_hash(&row.partition_key), slices) as usize].push(row);
    }
    let mut out = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut out, schema(), Some(properties)).map_err(parquet_error)?;
    for slice in by_slice {
        for group in slice.chunks(ROW_GROUP_ROWS) {
            writer.write(&batch(group)?).map_err(parquet_error)?;
            // Each slice's rows in row groups of their own.
            writer.flush().map_err(parquet_error)?;
        }
    }
    writer.close().map_err(parquet_error)?;
    Ok(out)
}

fn batch(rows: &[&Row]) -> Result<RecordBatch> {
    let n = rows.len();
    let mut arrival = TimestampMillisecondBuilder::with_capacity(n).with_timezone("UTC");
    let mut event_time = TimestampMillisecondBuilder::with_capacity(n).with_timezone("UTC");
    let (mut slot, mut version) = (Int64Builder::with_capacity(n), Int64Builder::with_capacity(n));
    let mut expires_at = Int64Builder::with_capacity(n);
    let strings = || StringBuilder::with_capacity(n, n * 32);
    let (mut sort_key, mut partition_key, mut event_id) = (strings(), strings(), strings());
    let (mut source, mut stream, mut payload) = (strings(), strings(), strings());
    let mut payload_bytes = BinaryBuilder::new();
    for row in rows {
        arrival.append_value(row.arrival);
        event_time.append_option(row.event_time);
        slot.append_value(row.slot);
        sort_key.append_value(&row.sort_key);
        partition_key.append_value(&row.partition_key);
        event_id.append_value(&row.event_id);
        source.append_value(row.source);
        stream.append_option(row.stream.as_deref());
        version.append_option(row.version);
        payload.append_option(row.payload.as_deref());
        payload_bytes.append_option(row.payload_bytes.as_deref());
        expires_at.append_option(row.expires_at);
    }
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(arrival.finish()),
        Arc::new(event_time.finish()),
        Arc::new(slot.finish()),
        Arc::new(sort_key.finish()),
        Arc::new(partition_key.finish()),
        Arc::new(event_id.finish()),
        Arc::new(source.finish()),
        Arc::new(stream.finish()),
        Arc::new(version.finish()),
        Arc::new(payload.finish()),
        Arc::new(payload_bytes.finish()),
        Arc::new(expires_at.finish()),
    ];
    let analyst: Vec<Analyst> =
        rows.iter().map(|row| Analyst::of(row.payload.as_deref(), row.source == SOURCE_ENTITY)).collect();
    columns.extend(Analyst::columns(&analyst));
    RecordBatch::try_new(schema(), columns).map_err(|e| Error::Malformed(format!("archive rows: {e}")))
}

/// The rows of a Parquet file this module wrote, in log order.
pub(crate) fn read(bytes: Bytes) -> Result<Vec<Row>> {
    Ok(open(bytes)?.rows)
}

/// An archive object read whole: its rows, and how it is cut.
#[derive(Debug, Clone, PartialEq)]
pub struct Object {
    /// In log order (sort-key order).
    pub rows: Vec<Row>,
    /// How the object is cut by slice, as its bytes say; `None` for an
    /// object written before objects were cut (one slice, in log order).
    pub cut: Option<Cut>,
}

impl Object {
    /// What the object's `bytes` (these rows) are, for its manifest entry.
    pub fn facts(&self, bytes: &[u8]) -> super::manifest::Facts {
        let keys: Vec<&str> = self.rows.iter().map(|r| r.sort_key.as_str()).collect();
        super::manifest::Facts { cut: self.cut.clone(), ..super::manifest::Facts::of(bytes, &keys) }
    }
}

/// A Parquet file this module wrote, read whole: its rows in log order, and
/// its cut, checked (each row group's rows of one slice, the groups in slice
/// order, one after the other) and hashed from its bytes.
pub fn open(bytes: Bytes) -> Result<Object> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).map_err(parquet_error)?;
    let metadata = builder.metadata().clone();
    let mut rows = decoded(builder.build().map_err(parquet_error)?)?;
    let slices = metadata
        .file_metadata()
        .key_value_metadata()
        .and_then(|pairs| pairs.iter().find(|pair| pair.key == SLICES_KEY))
        .map(|pair| pair.value.as_deref().unwrap_or_default().parse::<u32>())
        .transpose()
        .map_err(|e| Error::Malformed(format!("archive object: its slice count: {e}")))?;
    let cut = slices.map(|slices| cut_of(&bytes, &metadata, check_slices(slices)?, &rows)).transpose()?;
    // Stable, and a no-op for an object in log order already.
    rows.sort_by(|a, b| a.sort_key.cmp(&b.sort_key));
    Ok(Object { rows, cut })
}

/// The cut of an object (`bytes`, described by `metadata`) whose `rows` are in file order.
fn cut_of(bytes: &[u8], metadata: &ParquetMetaData, slices: u32, rows: &[Row]) -> Result<Cut> {
    let malformed = |what: &str| Error::Malformed(format!("archive object: {what}"));
    let span = |range: Range<u64>| {
        let piece =
            bytes.get(range.start as usize..range.end as usize).ok_or_else(|| malformed("a span past its end"))?;
        Ok::<_, Error>(Span { offset: range.start, length: range.end - range.start, sha256: sha256_hex(piece) })
    };
    let len = bytes.len() as u64;
    let tail = bytes.len().checked_sub(8).and_then(|at| bytes.get(at..at + 4)).ok_or_else(|| malformed("no footer"))?;
    let metadata_len = u64::from(u32::from_le_bytes(tail.try_into().map_err(|_| malformed("no footer"))?));
    let footer = span(len.checked_sub(metadata_len + 8).ok_or_else(|| malformed("a footer past its start"))?..len)?;
    // Column chunks one after the other from the magic number on, and the footer right after the
    // last: no byte a reader of some row groups is handed that no hash covers.
    let (mut groups, mut at, mut end) = (Vec::new(), 0usize, 4u64);
    for group in metadata.row_groups() {
        let start = end;
        for column in group.columns() {
            let first = column.dictionary_page_offset().unwrap_or(i64::MAX).min(column.data_page_offset());
            let (first, size) = (u64::try_from(first), u64::try_from(column.compressed_size()));
            end = match (first, size) {
                (Ok(first), Ok(size)) if first == end => first.checked_add(size),
                _ => None,
            }
            .ok_or_else(|| malformed("column chunks not one after the other"))?;
        }
        let count = usize::try_from(group.num_rows()).unwrap_or(0);
        let of_group = rows.get(at..at + count).ok_or_else(|| malformed("fewer rows than its row groups say"))?;
        let slice = of_group.first().map_or(0, |row| part_of(key_hash(&row.partition_key), slices));
        let one_slice = of_group.iter().all(|row| part_of(key_hash(&row.partition_key), slices) == slice);
        if !one_slice || groups.last().is_some_and(|last: &Group| last.slice > slice) {
            return Err(malformed("row groups not cut by slice, in slice order"));
        }
        groups.push(Group { slice, rows: count as u64, span: span(start..end)? });
        at += count;
    }
    if end != footer.offset || at != rows.len() {
        return Err(malformed("bytes or rows outside its row groups"));
    }
    Ok(Cut { slices, footer, groups })
}

pub(super) fn decoded(reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader) -> Result<Vec<Row>> {
    let batches = reader.map(|batch| rows_of(&batch.map_err(|e| Error::Malformed(format!("archive object: {e}")))?));
    Ok(batches.collect::<Result<Vec<_>>>()?.concat())
}

fn rows_of(batch: &RecordBatch) -> Result<Vec<Row>> {
    fn column<'a, T: 'static>(batch: &'a RecordBatch, name: &str) -> Result<&'a T> {
        batch
            .column_by_name(name)
            .and_then(|c| c.as_any().downcast_ref::<T>())
            .ok_or_else(|| Error::Malformed(format!("archive object: no column {name} of the expected type")))
    }
    let arrival = column::<TimestampMillisecondArray>(batch, "arrival")?;
    let event_time = column::<TimestampMillisecondArray>(batch, "event_time")?;
    let slot = column::<Int64Array>(batch, "slot")?;
    let version = column::<Int64Array>(batch, "version")?;
    let sort_key = column::<StringArray>(batch, "sort_key")?;
    let partition_key = column::<StringArray>(batch, "partition_key")?;
    let event_id = column::<StringArray>(batch, "event_id")?;
    let source = column::<StringArray>(batch, "source")?;
    let stream = column::<StringArray>(batch, "stream")?;
    let payload = column::<StringArray>(batch, "payload")?;
    let payload_bytes = column::<BinaryArray>(batch, "payload_bytes")?;
    let expires_at = column::<Int64Array>(batch, "expires_at")?;
    let text = |a: &StringArray, i: usize| (!a.is_null(i)).then(|| a.value(i).to_owned());
    Ok((0..batch.num_rows())
        .map(|i| Row {
            arrival: arrival.value(i),
            event_time: (!event_time.is_null(i)).then(|| event_time.value(i)),
            slot: slot.value(i),
            sort_key: sort_key.value(i).to_owned(),
            partition_key: partition_key.value(i).to_owned(),
            event_id: event_id.value(i).to_owned(),
            source: if source.value(i) == SOURCE_ENTITY { SOURCE_ENTITY } else { SOURCE_INGEST },
            stream: text(stream, i),
            version: (!version.is_null(i)).then(|| version.value(i)),
            payload: text(payload, i),
            payload_bytes: (!payload_bytes.is_null(i)).then(|| payload_bytes.value(i).to_vec()),
            expires_at: (!expires_at.is_null(i)).then(|| expires_at.value(i)),
        })
        .collect())
}

pub(super) fn parquet_error(err: parquet::errors::ParquetError) -> Error {
    Error::Malformed(format!("archive object: {err}"))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::archive) fn event(n: i64, data: &[u8], key: &str) -> EventItem {
        EventItem {
            slot: 1_795_000_000_000,
            sort_key: crate::event_item::sort_key(1_795_000_000_000 + n, &format!("shardId-000000000000:{n}")),
            event_id: format!("shardId-000000000000:{n}"),
            arrival: 1_795_000_000_000 + n,
            partition_key: key.into(),
            data: Some(data.to_vec()),
            encoding: None,
            payload: None,
            expires_at: None,
            moved_at: Some(1),
        }
    }

    #[test]
    fn events_round_trip_through_parquet_exactly_as_stored() {
        let entity = br#"{"id":"todo-1/3","received_at":"2026-11-27T06:00:00.250Z","path":"/streams/todo-1","method":"POST","body":{"version":3,"type":"TodoDone"}}"#;
        let events = [
            event(1, br#"{"path": "/track.gif",  "received_at": "2026-11-27T05:59:59.999Z"}"#, "visitor-1"),
            event(2, b"\x00\xffnot json", "visitor-2"),
            event(3, entity, "streams/todo-1"),
            event(4, b"plain text, valid UTF-8 but not JSON", "k"),
        ];
        let rows: Vec<Row> = events.iter().map(Row::of).collect::<Result<_>>().unwrap();
        assert_eq!(
            rows[0].payload.as_deref(),
            Some(r#"{"path": "/track.gif",  "received_at": "2026-11-27T05:59:59.999Z"}"#)
        );
        assert_eq!((rows[0].event_time, rows[0].source), (Some(1_795_759_199_999), SOURCE_INGEST));
        assert_eq!(
            (rows[1].payload.as_deref(), rows[1].payload_bytes.as_deref()),
            (None, Some(&b"\x00\xffnot json"[..]))
        );
        assert_eq!(
            (rows[2].source, rows[2].stream.as_deref(), rows[2].version),
            (SOURCE_ENTITY, Some("todo-1"), Some(3))
        );
        assert_eq!(rows[3].payload, None, "text that is not JSON is kept as bytes");

        let file = write(&rows, 1).unwrap();
        assert_eq!(&file[..4], b"PAR1");
        assert_eq!(write(&rows, 1).unwrap(), file, "the same rows, the same bytes");
        let back = read(Bytes::from(file)).unwrap();
        assert_eq!(back, rows);
        let again: Vec<EventItem> = back.into_iter().map(Row::into_event).collect();
        for (stored, archived) in events.iter().zip(&again) {
            assert_eq!(archived.bytes().unwrap(), stored.bytes().unwrap());
            assert_eq!((&archived.sort_key, archived.arrival), (&stored.sort_key, stored.arrival));
        }
    }

    #[test]
    fn large_files_are_cut_into_row_groups() {
        let rows: Vec<Row> = (0..ROW_GROUP_ROWS as i64 + 10).map(|n| Row::of(&event(n, b"{}", "k")).unwrap()).collect();
        let file = Bytes::from(write(&rows, 1).unwrap());
        let metadata = ParquetRecordBatchReaderBuilder::try_new(file.clone()).unwrap().metadata().clone();
        assert_eq!(metadata.num_row_groups(), 2);
        assert_eq!(read(file).unwrap().len(), rows.len());
    }

    #[test]
    fn an_object_written_before_objects_were_cut_reads_whole_as_before() {
        // As the version before wrote it: no slice count in its metadata, default statistics.
        let rows: Vec<Row> = (0..50).map(|n| Row::of(&event(n, b"{}", &format!("k{n}"))).unwrap()).collect();
        let mut file = Vec::new();
        let mut writer = ArrowWriter::try_new(&mut file, schema(), None).unwrap();
        writer.write(&batch(&rows.iter().collect::<Vec<_>>()).unwrap()).unwrap();
        writer.close().unwrap();
        let file = Bytes::from(file);
        let object = open(file.clone()).unwrap();
        assert_eq!((object.cut.as_ref(), &object.rows), (None, &rows));
        let slots = (1_795_000_000_000, 1_795_000_001_000);
        let facts = object.facts(&file);
        let entry = super::super::manifest::Entry::next(None, "events/0.parquet".into(), slots.0, slots.1, &facts);
        assert!(entry.cut.is_none() && serde_json::to_value(&entry).unwrap().get("cut").is_none(), "a v1 entry");
        assert!(super::super::vouch::check_object(&entry, &file, &object).is_ok());
    }

    #[test]
    fn a_file_whose_row_groups_mix_slices_is_not_cut_by_them() {
        let rows: Vec<Row> = (0..400).map(|n| Row::of(&event(n, b"{}", &format!("k{}", n % 37))).unwrap()).collect();
        // Written as one slice, taken as 4.
        let whole = Bytes::from(write(&rows, 1).unwrap());
        let metadata = ParquetRecordBatchReaderBuilder::try_new(whole.clone()).unwrap().metadata().clone();
        assert!(cut_of(&whole, &metadata, 4, &rows).is_err());
        assert_eq!(cut_of(&whole, &metadata, 1, &rows).unwrap().groups.len(), 1);
        assert!(cut_of(&whole, &metadata, 1, &rows[1..]).is_err(), "rows the groups do not hold");
    }
}
