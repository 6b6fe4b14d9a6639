//! How an event's bytes are stored: zstd-compressed when that makes them
//! smaller, marked by an `encoding` attribute. DynamoDB bills writes per
//! started KB of item, and every event is written three times (buffer put,
//! buffer delete, event put), so a 3 KB JSON event compressed under 1 KB
//! costs 3 write units instead of 9.

use crate::error::{Error, Result};

/// The value of the `encoding` attribute for zstd-compressed data.
pub const ZSTD: &str = "zstd";
/// zstd level: on events of a few KB, higher levels gain little and cost CPU.
const LEVEL: i32 = 3;
/// Largest decoded event accepted: Kinesis' 1 MiB record limit. A stored
/// frame claiming more is refused rather than inflated.
pub const MAX_DECODED_BYTES: usize = 1024 * 1024;
/// What the `encoding` attribute costs in an item ("encoding" + "zstd").
const ATTRIBUTE_BYTES: usize = "encoding".len() + ZSTD.len();

/// The bytes to store and their encoding: compressed only when that saves
/// more than the attribute that says so.
pub fn encode(raw: &[u8]) -> (Vec<u8>, Option<String>) {
    match zstd::bulk::compress(raw, LEVEL) {
        Ok(packed) if packed.len() + ATTRIBUTE_BYTES < raw.len() => (packed, Some(ZSTD.to_owned())),
        _ => (raw.to_vec(), None),
    }
}

/// The original bytes of stored data.
pub(crate) fn decode(stored: &[u8], encoding: Option<&str>) -> Result<Vec<u8>> {
    decode_up_to(stored, encoding, MAX_DECODED_BYTES)
}

/// The `encoding` of one event's parts compressed on their own with
/// [`DICTIONARY`] (a sealed block: encrypted, it cannot share the chunk's
/// compression). The dictionary behind a name never changes: a new one gets a new name.
pub const ZSTD_DICTIONARY_1: &str = "zstd-d1";

/// The encodings of a single event's bytes this code knows (none: as sent);
/// any other was written by a newer version ([`Error::Newer`]).
pub(crate) fn known(encoding: Option<&str>) -> bool {
    matches!(encoding, None | Some(ZSTD | ZSTD_DICTIONARY_1))
}

/// The prefix of the encoding a reader gives a stored item that does not decode: its bytes are an error.
pub(crate) const UNREADABLE: &str = "unreadable ";
/// What pixel hits and analytics events have in common (header values, field
/// names): a kilobyte compressed alone finds little to refer back to.
const DICTIONARY: &[u8] = include_bytes!("pixel-dictionary.txt");

thread_local! {
    // Made once per thread: loading the dictionary for every event would cost more than the event.
    static WITH_DICTIONARY: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static OPENING_WITH_DICTIONARY: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// Like [`encode`], for bytes compressed alone: with [`DICTIONARY`].
pub(crate) fn encode_alone(raw: &[u8]) -> (Vec<u8>, Option<String>) {
    let packed = WITH_DICTIONARY.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.is_none() {
            *cell = zstd::bulk::Compressor::with_dictionary(LEVEL, DICTIONARY).ok();
        }
        cell.as_mut().and_then(|compressor| compressor.compress(raw).ok())
    });
    match packed {
        Some(packed) if packed.len() + ATTRIBUTE_BYTES < raw.len() => (packed, Some(ZSTD_DICTIONARY_1.to_owned())),
        _ => (raw.to_vec(), None),
    }
}

/// [`decode`], refusing to inflate past `max` bytes.
pub(crate) fn decode_up_to(stored: &[u8], encoding: Option<&str>, max: usize) -> Result<Vec<u8>> {
    let bad = |e: std::io::Error| Error::Malformed(format!("zstd data that does not decode: {e}"));
    match encoding {
        None => Ok(stored.to_vec()),
        Some(ZSTD) => zstd::bulk::decompress(stored, max).map_err(bad),
        Some(ZSTD_DICTIONARY_1) => OPENING_WITH_DICTIONARY.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(zstd::bulk::Decompressor::with_dictionary(DICTIONARY).map_err(bad)?);
            }
            let decompressor = cell.as_mut().ok_or_else(|| Error::Malformed("no zstd decompressor".into()))?;
            decompressor.decompress(stored, max).map_err(bad)
        }),
        // What the log's readers hand on for a chunk that does not decode (`log::reader`).
        Some(other) if other.starts_with(UNREADABLE) => Err(Error::Malformed(format!("{other}: does not decode"))),
        Some(other) => Err(Error::Newer(format!("encoding {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_compressed_and_comes_back_exactly() {
        let json = br#"{"path":"/track.gif","headers":{"user-agent":"Mozilla/5.0 (X11; Linux x86_64)","accept":"image/avif,image/webp,*/*"},"query":{"page":"/products/42","ref":"/products/41"}}"#.repeat(4);
        let (stored, encoding) = encode(&json);
        assert_eq!(encoding.as_deref(), Some(ZSTD));
        assert!(stored.len() < json.len() / 2, "{} of {}", stored.len(), json.len());
        assert_eq!(decode(&stored, encoding.as_deref()).unwrap(), json);
    }

    #[test]
    fn small_or_random_bytes_are_kept_as_they_are() {
        let mut rng = fastrand::Rng::with_seed(7);
        for raw in [b"{}".to_vec(), (0..200).map(|_| rng.u8(..)).collect()] {
            let (stored, encoding) = encode(&raw);
            assert_eq!((stored.as_slice(), encoding), (raw.as_slice(), None));
            assert_eq!(decode(&stored, None).unwrap(), raw);
        }
    }

    #[test]
    fn the_dictionary_behind_its_name_never_changes() {
        // Raw-content frames carry no dictionary id: other bytes would open every sealed block compressed
        // with it to an error, or to something else. A new dictionary is a new encoding name.
        use sha2::{Digest, Sha256};
        assert_eq!(
            hex::encode(Sha256::digest(DICTIONARY)),
            "10f89fbc52faf3f842eeb45c271974274b8d73c900baaf7be7c4e419034c71b6",
            "{ZSTD_DICTIONARY_1}'s dictionary changed"
        );
    }

    #[test]
    fn a_pixel_hit_alone_compresses_further_with_the_dictionary_and_comes_back_exactly() {
        let hit = br#"{"query":{"EntityId":["u-81"],"page":["/pricing"]},"headers":{"user_agent":"Mozilla/5.0 (iPhone; CPU iPhone OS 18_1 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/18.1 Mobile/15E148 Safari/604.1","referer":"https://www.google.com/","accept_language":"de-DE,de;q=0.9,en-US;q=0.8,en;q=0.7"}}"#;
        let (plain, _) = encode(hit);
        let (alone, encoding) = encode_alone(hit);
        assert_eq!(encoding.as_deref(), Some(ZSTD_DICTIONARY_1));
        assert!(alone.len() * 2 < plain.len(), "{} with the dictionary, {} without", alone.len(), plain.len());
        assert_eq!(decode(&alone, encoding.as_deref()).unwrap(), hit);
        assert!(matches!(decode(&alone, Some(ZSTD)), Err(Error::Malformed(_))), "the dictionary is needed");
        let bomb = encode_alone(&vec![b'a'; 5000]).0;
        assert!(matches!(decode_up_to(&bomb, Some(ZSTD_DICTIONARY_1), 4999), Err(Error::Malformed(_))));
    }

    #[test]
    fn bad_frames_unknown_encodings_and_bombs_are_errors() {
        assert!(matches!(decode(b"not zstd", Some(ZSTD)), Err(Error::Malformed(_))));
        assert!(matches!(decode(b"x", Some("gzip")), Err(Error::Newer(_))), "a newer version's encoding");
        assert!(matches!(decode(b"x", Some("unreadable chunk1")), Err(Error::Malformed(_))));
        let bomb = zstd::bulk::compress(&vec![0u8; MAX_DECODED_BYTES + 1], LEVEL).unwrap();
        assert!(bomb.len() < 1000);
        assert!(matches!(decode(&bomb, Some(ZSTD)), Err(Error::Malformed(_))));
    }
}
