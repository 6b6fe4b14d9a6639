//! Part of an archive object decoded: the row groups a reader of some keys
//! fetched, with the footer, through a Parquet reader that is handed only
//! those bytes ([`super::cut`] says where they lie and checks them first).

use std::ops::Range;

use bytes::{Buf, Bytes};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

use super::columns::{decoded, parquet_error, Row};
use crate::error::{Error, Result};

/// The rows of row groups `groups` of an object of `len` bytes, decoded from
/// its `footer` and the bytes from `at` that hold those groups (checked by
/// the caller against the cut), in log order.
pub(crate) fn read_groups(len: u64, footer: Bytes, (at, span): (u64, Bytes), groups: Range<usize>) -> Result<Vec<Row>> {
    let footer_at =
        len.checked_sub(footer.len() as u64).ok_or_else(|| Error::Malformed("a footer past the start".into()))?;
    let fetched = Fetched { len, pieces: [(footer_at, footer), (at, span)] };
    let reader = ParquetRecordBatchReaderBuilder::try_new(fetched)
        .map_err(parquet_error)?
        .with_row_groups(groups.collect())
        .build()
        .map_err(parquet_error)?;
    let mut rows = decoded(reader)?;
    rows.sort_by(|a, b| a.sort_key.cmp(&b.sort_key));
    Ok(rows)
}

/// The parts of an object a reader fetched (its footer, its row groups),
/// for the Parquet reader: asking for any other byte is an error.
struct Fetched {
    len: u64,
    pieces: [(u64, Bytes); 2],
}

impl Fetched {
    fn piece(&self, start: u64, length: u64) -> parquet::errors::Result<Bytes> {
        self.pieces
            .iter()
            .find(|(at, bytes)| *at <= start && start + length <= at + bytes.len() as u64)
            .map(|(at, bytes)| bytes.slice((start - at) as usize..(start - at + length) as usize))
            .ok_or_else(|| ParquetError::General(format!("bytes {start}+{length} of the object were not fetched")))
    }
}

impl Length for Fetched {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Fetched {
    type T = bytes::buf::Reader<Bytes>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        let (at, bytes) = self
            .pieces
            .iter()
            .find(|(at, bytes)| *at <= start && start < at + bytes.len() as u64)
            .ok_or_else(|| ParquetError::General(format!("byte {start} of the object was not fetched")))?;
        Ok(self.piece(start, at + bytes.len() as u64 - start)?.reader())
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        self.piece(start, length as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::columns::tests::event;
    use crate::archive::columns::{open, write};
    use crate::slices::KeyRange;

    #[test]
    fn a_reader_of_some_keys_decodes_only_the_row_groups_of_their_slices() {
        let rows: Vec<Row> = (0..400)
            .map(|n| Row::of(&event(n, format!("{{\"n\":{n}}}").as_bytes(), &format!("k{}", n % 37))).unwrap())
            .collect();
        let file = Bytes::from(write(&rows, 4).unwrap());
        let object = open(file.clone()).unwrap();
        assert_eq!(object.rows, rows, "read whole: every row, in log order");
        let cut = object.cut.clone().expect("cut by slice");
        assert_eq!((cut.slices, cut.groups.len()), (4, 4));
        assert_eq!(cut.groups.iter().map(|g| g.slice).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(cut.groups.iter().map(|g| g.rows).sum::<u64>(), 400);
        assert_eq!(cut.footer.offset + cut.footer.length, file.len() as u64);
        let footer = file.slice(cut.footer.offset as usize..);
        for part in 0..2 {
            let keys = KeyRange::new(part, 2);
            let groups = cut.groups_of(keys);
            let span = cut.span_of(groups.clone());
            let bytes = file.slice(span.start as usize..span.end as usize);
            assert!(span.end - span.start < file.len() as u64 / 2, "about half the object");
            assert!(cut.holds(&footer, span.start, &bytes, groups.clone()));
            let read = read_groups(file.len() as u64, footer.clone(), (span.start, bytes), groups).unwrap();
            let expected: Vec<Row> = rows.iter().filter(|r| keys.holds(&r.partition_key)).cloned().collect();
            assert_eq!(read, expected, "part {part}: its keys' rows, in log order");
        }
        // Any byte outside what was fetched is refused, not read as zeros.
        let groups = cut.groups_of(KeyRange::new(0, 2));
        let short = file.slice(cut.groups[0].span.offset as usize..cut.groups[1].span.offset as usize);
        assert!(read_groups(file.len() as u64, footer, (cut.groups[0].span.offset, short), groups).is_err());
        let facts = object.facts(&file);
        assert_eq!((facts.cut, facts.count), (Some(cut), 400));
    }
}
