//! The meta envelope: the versioned record stored under `mc:mmmeta:{fp}`.
//!
//! The meta object is the commit marker of a cached embedding and the description a reader
//! validates before trusting the blob: schema version, image fingerprint, tenant, model
//! fingerprint and parts, dtype, shape `[visual_tokens, hidden]`, `grid_thw`, byte length
//! and the blob checksum, with its algorithm named ([`ChecksumAlgo`]).
//!
//! Wire form (a *frame*): 4 magic bytes `MMEV`, 8 bytes XXH3-64 (little-endian) of the
//! body, then the body as JSON. JSON keeps the envelope human-debuggable; the frame
//! checksum makes any corruption of the stored meta a decode error ([`EnvelopeError`])
//! instead of a plausible-looking envelope with one changed digit. [`Envelope::decode`]
//! never panics on arbitrary bytes: every malformed input is an error with a reason.
//! An envelope of another schema version decodes to [`EnvelopeError::SchemaMismatch`]
//! (a plain miss), everything else that fails is corruption.

use blake2::digest::consts::U8;
use blake2::{Blake2b, Digest};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

use crate::fingerprint::{Dtype, GridThw, ImageFp, ModelFp, ModelParts};

/// The schema version this build writes and accepts.
pub const SCHEMA_VERSION: u32 = 1;
/// Frame magic.
pub const MAGIC: [u8; 4] = *b"MMEV";
/// Frame header length: magic and body checksum.
pub const HEADER_LEN: usize = 12;
/// Largest meta object a reader accepts; a bigger one is corrupt.
pub const MAX_META_BYTES: usize = 64 * 1024;

/// BLAKE2b with an 8-byte digest (the seed's reference checksum).
type Blake2b64 = Blake2b<U8>;

/// Blob checksum algorithm, named in the envelope so readers verify with the writer's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ChecksumAlgo {
    /// XXH3-64: the fast default for the hot path (corruption detection, not security).
    #[serde(rename = "xxh3_64")]
    Xxh3_64,
    /// Unkeyed BLAKE2b with an 8-byte digest, as in the seed (corruption detection only).
    #[serde(rename = "blake2b_64")]
    Blake2b64,
}

impl ChecksumAlgo {
    /// Checksum of `bytes`. The value's big-endian hex equals the usual hex digest
    /// (`xxhsum -H3`, Python's `blake2b(digest_size=8).hexdigest()`).
    pub fn compute(self, bytes: &[u8]) -> u64 {
        match self {
            ChecksumAlgo::Xxh3_64 => xxh3_64(bytes),
            ChecksumAlgo::Blake2b64 => {
                let d: [u8; 8] = Blake2b64::digest(bytes).into();
                u64::from_be_bytes(d)
            }
        }
    }

    /// Stable name (as serialized).
    pub fn name(self) -> &'static str {
        match self {
            ChecksumAlgo::Xxh3_64 => "xxh3_64",
            ChecksumAlgo::Blake2b64 => "blake2b_64",
        }
    }
}

/// A blob checksum: algorithm and value (serialized as 16 hex digits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checksum {
    /// Algorithm.
    pub algo: ChecksumAlgo,
    /// Value.
    #[serde(with = "hex_u64")]
    pub value: u64,
}

impl Checksum {
    /// The checksum of `bytes` under `algo`.
    pub fn of(algo: ChecksumAlgo, bytes: &[u8]) -> Self {
        Self {
            algo,
            value: algo.compute(bytes),
        }
    }

    /// Whether `bytes` match.
    pub fn verify(&self, bytes: &[u8]) -> bool {
        self.algo.compute(bytes) == self.value
    }
}

mod hex_u64 {
    use super::*;

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("{v:016x}"))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(serde::de::Error::custom("checksum: expected 16 hex digits"));
        }
        u64::from_str_radix(&s, 16).map_err(serde::de::Error::custom)
    }
}

/// The meta envelope of one cached embedding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Schema version ([`SCHEMA_VERSION`] when written by this build).
    pub schema_version: u32,
    /// Image fingerprint (must equal the key's).
    pub fp: ImageFp,
    /// Tenant.
    pub tenant: String,
    /// Model fingerprint.
    pub model_fp: ModelFp,
    /// The parts the model fingerprint was computed from.
    pub model_parts: ModelParts,
    /// Embedding element type.
    pub dtype: Dtype,
    /// `[visual_tokens, hidden]`, row-major.
    pub shape: [u64; 2],
    /// The image's `grid_thw`.
    pub grid_thw: GridThw,
    /// Blob length in bytes.
    pub byte_len: u64,
    /// Blob checksum; `None` when the pair was committed size-only (no bytes to check).
    pub checksum: Option<Checksum>,
}

/// Why bytes are not a valid envelope.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvelopeError {
    /// Shorter than the frame header.
    #[error("envelope: {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    TooShort {
        /// Length seen.
        len: usize,
    },
    /// Longer than [`MAX_META_BYTES`].
    #[error("envelope: {len} bytes, over the {MAX_META_BYTES}-byte limit")]
    TooLarge {
        /// Length seen.
        len: usize,
    },
    /// The frame does not start with [`MAGIC`].
    #[error("envelope: bad magic")]
    BadMagic,
    /// The body does not match the frame checksum.
    #[error("envelope: body checksum mismatch")]
    FrameChecksum,
    /// The body is not a valid envelope of this schema.
    #[error("envelope: malformed body: {0}")]
    Malformed(String),
    /// A well-formed envelope of another schema version.
    #[error("envelope: schema version {found}, expected {SCHEMA_VERSION}")]
    SchemaMismatch {
        /// Version found.
        found: u32,
    },
    /// A field holds an invalid value.
    #[error("envelope: invalid field: {0}")]
    Invalid(String),
    /// Serialization failed (not expected for this type).
    #[error("envelope: encode failed: {0}")]
    Encode(String),
}

#[derive(Deserialize)]
struct VersionOnly {
    schema_version: u32,
}

impl Envelope {
    /// The framed wire form.
    pub fn encode(&self) -> Result<Vec<u8>, EnvelopeError> {
        let mut out = Vec::with_capacity(1024);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[0u8; 8]);
        serde_json::to_writer(&mut out, self).map_err(|e| EnvelopeError::Encode(e.to_string()))?;
        let sum = xxh3_64(&out[HEADER_LEN..]);
        out[4..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Decode and check a frame. Never panics; every failure says why.
    pub fn decode(bytes: &[u8]) -> Result<Self, EnvelopeError> {
        if bytes.len() > MAX_META_BYTES {
            return Err(EnvelopeError::TooLarge { len: bytes.len() });
        }
        let (Some(magic), Some(sum), Some(body)) = (
            bytes.get(..4),
            bytes.get(4..HEADER_LEN),
            bytes.get(HEADER_LEN..),
        ) else {
            return Err(EnvelopeError::TooShort { len: bytes.len() });
        };
        if magic != MAGIC {
            return Err(EnvelopeError::BadMagic);
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(sum);
        if xxh3_64(body) != u64::from_le_bytes(s) {
            return Err(EnvelopeError::FrameChecksum);
        }
        match serde_json::from_slice::<Envelope>(body) {
            Ok(env) => {
                if env.schema_version != SCHEMA_VERSION {
                    return Err(EnvelopeError::SchemaMismatch {
                        found: env.schema_version,
                    });
                }
                env.model_parts
                    .validate()
                    .map_err(|e| EnvelopeError::Invalid(e.to_string()))?;
                Ok(env)
            }
            // Another version may have another shape: read only its version to tell a
            // stale writer (a miss) from corruption.
            Err(e) => match serde_json::from_slice::<VersionOnly>(body) {
                Ok(v) if v.schema_version != SCHEMA_VERSION => Err(EnvelopeError::SchemaMismatch {
                    found: v.schema_version,
                }),
                _ => Err(EnvelopeError::Malformed(e.to_string())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Envelope {
        let parts = ModelParts::example("t");
        let model_fp = parts.fingerprint().expect("valid");
        Envelope {
            schema_version: SCHEMA_VERSION,
            fp: ImageFp([7; 32]),
            tenant: "t".into(),
            model_fp,
            model_parts: parts,
            dtype: Dtype::Bf16,
            shape: [4, 8],
            grid_thw: GridThw::new(1, 4, 4),
            byte_len: 64,
            checksum: Some(Checksum::of(ChecksumAlgo::Xxh3_64, b"abc")),
        }
    }

    #[test]
    fn round_trip_and_every_single_byte_flip_is_rejected() {
        let env = sample();
        let bytes = env.encode().expect("encodes");
        assert_eq!(Envelope::decode(&bytes).expect("decodes"), env);
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(Envelope::decode(&b).is_err(), "flip at {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(
                Envelope::decode(&bytes[..n]).is_err(),
                "truncation to {n} accepted"
            );
        }
    }

    #[test]
    fn other_schema_versions_are_schema_mismatch_not_corruption() {
        let mut env = sample();
        env.schema_version = 0;
        let bytes = env.encode().expect("encodes");
        assert_eq!(
            Envelope::decode(&bytes),
            Err(EnvelopeError::SchemaMismatch { found: 0 })
        );
        // A future version with an unknown shape is still recognised by its version.
        let body = br#"{"schema_version":9,"something":"else"}"#;
        let mut framed = MAGIC.to_vec();
        framed.extend_from_slice(&xxh3_64(body).to_le_bytes());
        framed.extend_from_slice(body);
        assert_eq!(
            Envelope::decode(&framed),
            Err(EnvelopeError::SchemaMismatch { found: 9 })
        );
    }

    #[test]
    fn blake2b64_matches_the_reference_digest() {
        // BLAKE2b with digest_size=8 of b"abc" (Python: hashlib.blake2b(b"abc", digest_size=8)).
        assert_eq!(
            format!("{:016x}", ChecksumAlgo::Blake2b64.compute(b"abc")),
            "d8bb14d833d59559"
        );
    }
}
