//! The Kinesis Producer Library's aggregated-record format, which the KCL,
//! AWS's deaggregation modules (Python `aws-kinesis-agg`, Node, Java) and
//! Lambda consumers using them read transparently: one Kinesis record
//! carrying many user records of one partition key.
//!
//! Layout: the 4 magic bytes `F3 89 9A C2`, a protobuf `AggregatedRecord`,
//! then the MD5 of the protobuf bytes. Playback puts one aggregated record
//! per partition key per request, so a key's events stay in order whatever
//! PutRecords does with the other records of the request, and small events
//! are not held to Kinesis' 1,000 records/s per shard.
//!
//! Written here because no maintained Rust crate implements the format; the
//! messages are derived with `prost`, and the tests check the output against
//! an aggregated record built by the reference (Python) library.

use md5::{Digest, Md5};
use prost::Message;

use crate::error::{Error, Result};

/// The first bytes of every aggregated record.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
const DIGEST_BYTES: usize = 16;
/// Kinesis' limit on one record: data and partition key together, 1 MiB.
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;

#[derive(Clone, PartialEq, Message)]
struct AggregatedRecord {
    #[prost(string, repeated, tag = "1")]
    partition_key_table: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    explicit_hash_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    records: Vec<UserRecord>,
}

#[derive(Clone, PartialEq, Message)]
struct UserRecord {
    #[prost(uint64, required, tag = "1")]
    partition_key_index: u64,
    #[prost(uint64, optional, tag = "2")]
    explicit_hash_key_index: Option<u64>,
    #[prost(bytes = "vec", required, tag = "3")]
    data: Vec<u8>,
    #[prost(message, repeated, tag = "4")]
    tags: Vec<Tag>,
}

#[derive(Clone, PartialEq, Message)]
struct Tag {
    #[prost(string, required, tag = "1")]
    key: String,
    #[prost(string, optional, tag = "2")]
    value: Option<String>,
}

/// Bytes one user record of `data_len` bytes adds to an aggregated record.
pub(crate) fn user_record_bytes(data_len: usize) -> usize {
    // partition_key_index 0 (tag and value: 2 bytes), then data (tag, length, bytes).
    let record = 2 + 1 + prost::encoding::encoded_len_varint(data_len as u64) + data_len;
    1 + prost::encoding::encoded_len_varint(record as u64) + record
}

/// Bytes of an aggregated record of `partition_key` with no user record yet.
pub(crate) fn empty_bytes(partition_key: &str) -> usize {
    let table = 1 + prost::encoding::encoded_len_varint(partition_key.len() as u64) + partition_key.len();
    MAGIC.len() + table + DIGEST_BYTES
}

/// One aggregated record holding `datas`, in order, all under `partition_key`.
pub(crate) fn aggregate<'a>(partition_key: &str, datas: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let message = AggregatedRecord {
        partition_key_table: vec![partition_key.to_owned()],
        explicit_hash_key_table: Vec::new(),
        records: datas
            .into_iter()
            .map(|data| UserRecord {
                partition_key_index: 0,
                explicit_hash_key_index: None,
                data: data.to_vec(),
                tags: Vec::new(),
            })
            .collect(),
    };
    let body = message.encode_to_vec();
    let mut out = Vec::with_capacity(MAGIC.len() + body.len() + DIGEST_BYTES);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&body);
    out.extend_from_slice(&Md5::digest(&body));
    out
}

/// The user records of a Kinesis record: `(partition key, data)` of each
/// when it is an aggregated record, else the record itself.
pub fn deaggregate(partition_key: &str, data: &[u8]) -> Result<Vec<(String, Vec<u8>)>> {
    let plain = || Ok(vec![(partition_key.to_owned(), data.to_vec())]);
    if data.len() < MAGIC.len() + DIGEST_BYTES || data[..MAGIC.len()] != MAGIC {
        return plain();
    }
    let (body, digest) = data[MAGIC.len()..].split_at(data.len() - MAGIC.len() - DIGEST_BYTES);
    // What the reference libraries do: a record whose checksum does not match is not an aggregate.
    if Md5::digest(body).as_slice() != digest {
        return plain();
    }
    let message = AggregatedRecord::decode(body).map_err(|e| Error::Malformed(format!("aggregated record: {e}")))?;
    message
        .records
        .into_iter()
        .map(|r| {
            let key = message.partition_key_table.get(r.partition_key_index as usize).ok_or_else(|| {
                Error::Malformed(format!("aggregated record: partition key index {}", r.partition_key_index))
            })?;
            Ok((key.clone(), r.data))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregates_read_back_in_order_and_sizes_are_exact() {
        let datas: Vec<Vec<u8>> = vec![b"{\"n\":1}".to_vec(), vec![0xff; 300], Vec::new(), vec![b'x'; 20_000]];
        let record = aggregate("user-7", datas.iter().map(Vec::as_slice));
        assert_eq!(record[..4], MAGIC);
        let expected: usize = empty_bytes("user-7") + datas.iter().map(|d| user_record_bytes(d.len())).sum::<usize>();
        assert_eq!(record.len(), expected, "the size bookkeeping matches the encoding");
        let back = deaggregate("user-7", &record).unwrap();
        assert_eq!(back, datas.into_iter().map(|d| ("user-7".to_string(), d)).collect::<Vec<_>>());
    }

    #[test]
    fn plain_records_and_broken_checksums_pass_through_as_one_record() {
        assert_eq!(deaggregate("k", b"{}").unwrap(), vec![("k".to_string(), b"{}".to_vec())]);
        let mut record = aggregate("k", [&b"a"[..], b"b"]);
        let last = record.len() - 1;
        record[last] ^= 1;
        assert_eq!(deaggregate("k", &record).unwrap().len(), 1, "not an aggregate: the checksum does not match");
    }

    /// Made with the reference implementation (Python `aws_kinesis_agg` 1.2.3):
    /// `RecordAggregator().add_user_record("pk", b"hello")`, then `b"world"`, then `clear_and_get().get_contents()`.
    #[test]
    fn the_encoding_matches_the_reference_library() {
        let reference = "f3899ac20a02706b1a0908001a0568656c6c6f1a0908001a05776f726c644747b0d63591c416fdae617529bdda27";
        assert_eq!(hex::encode(aggregate("pk", [&b"hello"[..], b"world"])), reference);
    }
}
