//! Per-subject encryption, the pure part ([`crate::privacy`]): a data
//! subject's id as a keyed hash (what the log may keep in the clear), and
//! AES-256-GCM sealing of a payload under the subject's data key, bound by
//! associated data to where it is stored. Below every shape that carries a
//! sealed block (the envelope, entity items); keys and KMS are in `privacy`.

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::error::{Error, Result};

/// The wire format's version.
pub const SEALED_VERSION: u8 = 1;

/// A subject's id as the log keeps it: HMAC-SHA256 under the store's secret
/// key, hex. The same id gives the same hash (events of one subject can be
/// found and forgotten), and without the key it cannot be reversed or guessed
/// from a list of ids.
pub fn subject_hash(secret: &[u8], subject: &str) -> String {
    hex::encode(hmac(secret, subject.as_bytes()))
}

/// An entity stream's subject as the log keeps it, beside the stream's name
/// (which stays in the clear): HMAC-SHA256 under a key derived from the
/// store's secret for streams alone. So a record pairs a name with a hash
/// that no other record carries: it tells nothing of [`subject_hash`] of
/// the same id (a pixel's hashed partition key, say), which a pair of the
/// name and that hash would let anyone look up. `forget` hashes an id both ways.
pub fn stream_subject_hash(secret: &[u8], stream: &str) -> String {
    hex::encode(hmac(&hmac(secret, STREAMS_DOMAIN), stream.as_bytes()))
}

/// What derives the streams' key from the store's secret.
const STREAMS_DOMAIN: &[u8] = b"event-store: entity streams as data subjects, v1";

fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as hmac::KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// A payload sealed under one generation of a subject's data key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// [`SEALED_VERSION`].
    pub v: u8,
    /// The generation of the subject's key (a subject forgotten and written
    /// again gets a new one).
    pub g: u64,
    /// The 96-bit nonce, base64.
    pub n: String,
    /// Ciphertext and tag, base64.
    pub c: String,
    /// `zstd` when the plaintext was compressed before sealing (ciphertext
    /// does not compress: the store's own compression of chunks no longer
    /// reaches sealed parts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub z: Option<String>,
}

/// Seals `plaintext` under `key` (generation `generation`), bound to `aad`
/// (where it is stored: opening it anywhere else fails). A fresh random
/// nonce each time: a key seals far fewer than 2^32 payloads.
pub(crate) fn seal(key: &[u8; 32], generation: u64, aad: &[u8], plaintext: &[u8]) -> Result<Sealed> {
    let cipher = Aes256Gcm::new(key.into());
    let nonce = Nonce::generate();
    let sealed =
        cipher.encrypt(&nonce, Payload { msg: plaintext, aad }).map_err(|_| Error::Payload("sealing failed".into()))?;
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok(Sealed { v: SEALED_VERSION, g: generation, n: b64.encode(nonce.as_slice()), c: b64.encode(sealed), z: None })
}

/// Opens what [`seal`] made with the same key and associated data; fails if
/// anything was changed, or the key or the place is another.
pub(crate) fn open(key: &[u8; 32], aad: &[u8], sealed: &Sealed) -> Result<Vec<u8>> {
    let bad = |what: &str| Error::Payload(format!("a sealed payload {what}"));
    if sealed.v != SEALED_VERSION {
        return Err(Error::Newer(format!("a sealed payload of version {}", sealed.v)));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let nonce = b64.decode(&sealed.n).map_err(|_| bad("with a nonce that is not base64"))?;
    let nonce = Nonce::try_from(nonce.as_slice()).map_err(|_| bad("with a nonce that is not 12 bytes"))?;
    let ciphertext = b64.decode(&sealed.c).map_err(|_| bad("that is not base64"))?;
    let cipher = Aes256Gcm::new(key.into());
    cipher
        .decrypt(&nonce, Payload { msg: &ciphertext, aad })
        .map_err(|_| bad("that does not open with this key here (altered, or another key or place)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    #[test]
    fn a_subject_hash_is_keyed_stable_and_hex() {
        let one = subject_hash(b"secret", "user-42");
        assert_eq!(one, subject_hash(b"secret", "user-42"));
        assert_ne!(one, subject_hash(b"secret", "user-43"));
        assert_ne!(one, subject_hash(b"other secret", "user-42"), "without the key it cannot be recomputed");
        let stream = stream_subject_hash(b"secret", "user-42");
        assert_eq!(stream, stream_subject_hash(b"secret", "user-42"));
        assert_ne!(stream, one, "a stream's hash is not the same id's subject hash");
        assert_ne!(stream, stream_subject_hash(b"other secret", "user-42"));
        assert_eq!(stream.len(), 64);
        assert!(one.len() == 64 && one.bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn sealed_payloads_open_only_with_their_key_and_place() {
        let sealed = seal(&KEY, 3, b"v1|event-1", b"{\"page\":\"/a\"}").unwrap();
        assert_eq!((sealed.v, sealed.g), (SEALED_VERSION, 3));
        assert_eq!(open(&KEY, b"v1|event-1", &sealed).unwrap(), b"{\"page\":\"/a\"}");
        assert!(open(&[8; 32], b"v1|event-1", &sealed).is_err(), "another key");
        assert!(open(&KEY, b"v1|event-2", &sealed).is_err(), "moved to another event");
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut bytes = b64.decode(&sealed.c).unwrap();
        bytes[0] ^= 1;
        let altered = Sealed { c: b64.encode(bytes), ..sealed.clone() };
        assert!(matches!(open(&KEY, b"v1|event-1", &altered), Err(Error::Payload(m)) if m.contains("altered")));
        assert!(open(&KEY, b"v1|event-1", &Sealed { v: 2, ..sealed.clone() }).is_err());
        assert!(open(&KEY, b"v1|event-1", &Sealed { n: "AAAA".into(), ..sealed }).is_err(), "a short nonce");
    }

    #[test]
    fn each_seal_takes_a_fresh_nonce() {
        let nonces: std::collections::HashSet<String> =
            (0..100).map(|_| seal(&KEY, 0, b"", b"same").unwrap().n).collect();
        assert_eq!(nonces.len(), 100);
    }
}
