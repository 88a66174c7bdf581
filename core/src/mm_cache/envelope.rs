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
//!
//! Authentication (off by default; [`Envelope::auth`] absent and not serialized, so
//! default envelopes are byte-identical to those before it existed): a writer with a
//! tenant secret names how the image fingerprint was made ([`FpScheme`]) and may add a
//! [`EnvelopeMac`], a keyed BLAKE2b-256 over the envelope's fields and the blob
//! ([`mac_of`]). The frame checksum and the blob checksum detect corruption; only the
//! MAC detects tampering, since anyone can recompute a checksum.

use blake2::digest::consts::U8;
use blake2::{Blake2b, Digest};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

use crate::fingerprint::{Dtype, FpScheme, GridThw, ImageFp, ModelFp, ModelParts, TenantSecret};

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

/// MAC algorithm, named in the envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MacAlgo {
    /// BLAKE2b-256 keyed with the tenant's secret (RFC 7693 keyed mode).
    #[serde(rename = "blake2b_256_keyed")]
    Blake2b256Keyed,
}

/// A MAC over an envelope and its blob (serialized as 64 hex digits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvelopeMac {
    /// Algorithm.
    pub algo: MacAlgo,
    /// Tag.
    #[serde(with = "hex_32")]
    pub tag: [u8; 32],
}

/// How an envelope was authenticated by its writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// How the image fingerprint (the cache key) was made.
    pub fp: FpScheme,
    /// MAC over the envelope's fields and the blob; `None` when the writer keyed only
    /// its fingerprints.
    pub mac: Option<EnvelopeMac>,
}

mod hex_32 {
    use super::*;

    pub fn serialize<S: Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&ImageFp(*v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse::<ImageFp>()
            .map(|f| f.0)
            .map_err(serde::de::Error::custom)
    }
}

/// Domain tag of envelope MACs (the image fingerprint's key uses another).
const MAC_DOMAIN: &[u8] = b"moonagent.envelope-mac.v1";

/// The blob a MAC covers: its bytes, or only its length for a size-only pair.
#[derive(Debug, Clone, Copy)]
pub enum MacBlob<'a> {
    /// The blob's bytes.
    Bytes(&'a [u8]),
    /// A size-only blob of this many bytes (the simulator; no bytes exist).
    SizeOnly(u64),
}

/// The MAC of `env` (every field but `auth.mac`; `model_parts` through `model_fp`, which
/// readers compare with their own) and `blob`, under `secret`: keyed BLAKE2b-256 over a
/// domain tag and length-prefixed `(name, value)` fields, as the fingerprints encode.
pub fn mac_of(secret: &TenantSecret, env: &Envelope, blob: MacBlob<'_>) -> [u8; 32] {
    use blake2::digest::Mac;
    let mut h = secret.mac();
    let mut field = |name: &str, value: &[u8]| {
        h.update(&(name.len() as u64).to_le_bytes());
        h.update(name.as_bytes());
        h.update(&(value.len() as u64).to_le_bytes());
        h.update(value);
    };
    field("domain", MAC_DOMAIN);
    field(
        "schema_version",
        &u64::from(env.schema_version).to_le_bytes(),
    );
    field("fp", &env.fp.0);
    field(
        "fp_scheme",
        match env.auth.map(|a| a.fp) {
            Some(FpScheme::Keyed) => b"blake2b_256_keyed",
            _ => b"blake2b_256",
        },
    );
    field("tenant", env.tenant.as_bytes());
    field("model_fp", &env.model_fp.0);
    field("dtype", env.dtype.name().as_bytes());
    field("shape.tokens", &env.shape[0].to_le_bytes());
    field("shape.hidden", &env.shape[1].to_le_bytes());
    field("grid_thw", &env.grid_thw.to_le_bytes());
    field("byte_len", &env.byte_len.to_le_bytes());
    match env.checksum {
        Some(c) => {
            field("checksum.algo", c.algo.name().as_bytes());
            field("checksum.value", &c.value.to_le_bytes());
        }
        None => field("checksum.algo", b"none"),
    }
    match blob {
        MacBlob::Bytes(b) => field("blob", b),
        MacBlob::SizeOnly(n) => field("blob.size_only", &n.to_le_bytes()),
    }
    h.finalize().into_bytes().into()
}

/// Whether `tag` is the MAC of `env` and `blob` under `secret` (constant-time compare).
pub fn mac_verifies(
    secret: &TenantSecret,
    env: &Envelope,
    blob: MacBlob<'_>,
    tag: &[u8; 32],
) -> bool {
    let want = mac_of(secret, env, blob);
    // Constant time: no early exit on the first differing byte.
    want.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
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
    /// Authentication by a writer with a tenant secret; absent by default (and then not
    /// serialized at all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
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

/// The two lowercase hex digits of every byte (the same as `ImageFp`'s `Display`).
const HEX_PAIRS: [[u8; 2]; 256] = {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [DIGITS[i >> 4], DIGITS[i & 0xf]];
        i += 1;
    }
    t
};

/// An image fingerprint's 64 lowercase hex digits: its `Display` text, written without
/// the formatter. The hot path computes it once per call, for both keys and the
/// envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FpHex([u8; FP_HEX]);

impl FpHex {
    /// The hex of `fp`.
    pub(crate) fn of(fp: &ImageFp) -> Self {
        let mut out = [0u8; FP_HEX];
        for (pair, &b) in out.chunks_exact_mut(2).zip(&fp.0) {
            pair.copy_from_slice(&HEX_PAIRS[usize::from(b)]);
        }
        Self(out)
    }

    /// Append the digits to `out`.
    pub(crate) fn push_to(&self, out: &mut String) {
        match std::str::from_utf8(&self.0) {
            Ok(s) => out.push_str(s),
            // Not reached (only ASCII digits are written), and right regardless.
            Err(_) => out.extend(self.0.iter().map(|&b| char::from(b))),
        }
    }
}

/// How every body this build writes opens: serde writes the fields in declaration order,
/// so the image fingerprint's 64 hex digits follow at a fixed offset.
const FP_PREFIX: &[u8] = b"{\"schema_version\":1,\"fp\":\"";
/// Hex digits of an image fingerprint.
const FP_HEX: usize = 64;

/// The wire form of a family of envelopes that differ only in their image fingerprint.
///
/// Learned from one envelope ([`Template::learn`]): its encoded body, checked to hold the
/// fingerprint's hex at the fixed offset, and checked to decode back to that envelope.
/// Since the fingerprint is serialized on its own (`"fp":"<64 hex>"`) and nothing else
/// in the body depends on it, for any `fp`:
///
/// - [`Template::encode`] is byte-for-byte `Envelope { fp, ..learned }.encode()`;
/// - [`Template::recognize`] returns `Some(fp)` only for a frame that is exactly that
///   encoding (valid frame checksum, lowercase hex), whose [`Envelope::decode`] is
///   therefore `Ok(Envelope { fp, ..learned })`; every other input is `None` and must
///   take [`Envelope::decode`].
///
/// This is how the cache skips JSON on its hot path without changing a single result.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    env: Envelope,
    body: Box<[u8]>,
}

impl Template {
    /// The template of `env`'s family, or `None` when `env` does not encode to the
    /// expected shape or does not decode back to itself (then callers use the slow path).
    pub(crate) fn learn(env: &Envelope) -> Option<Self> {
        let frame = env.encode().ok()?;
        Self::from_frame(env, &frame)
    }

    /// [`Template::learn`] from `frame`, which must be `env.encode()`'s output.
    pub(crate) fn from_frame(env: &Envelope, frame: &[u8]) -> Option<Self> {
        let body = frame.get(HEADER_LEN..)?;
        let off = FP_PREFIX.len();
        let shaped = body.starts_with(FP_PREFIX)
            && body.get(off..off + FP_HEX) == Some(&FpHex::of(&env.fp).0[..])
            && body.get(off + FP_HEX) == Some(&b'"');
        if !shaped || Envelope::decode(frame).ok().as_ref() != Some(env) {
            return None;
        }
        Some(Self {
            env: env.clone(),
            body: body.into(),
        })
    }

    /// The envelope learned (its `fp` is the one it was learned from; the rest is the
    /// whole family's).
    pub(crate) fn envelope(&self) -> &Envelope {
        &self.env
    }

    /// The framed wire form of the family's envelope for the fingerprint whose hex is
    /// `fp`: identical to `Envelope { fp, ..self.envelope().clone() }.encode()`.
    pub(crate) fn encode(&self, fp: &FpHex) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.body.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[0u8; 8]);
        out.extend_from_slice(&self.body);
        let off = HEADER_LEN + FP_PREFIX.len();
        out[off..off + FP_HEX].copy_from_slice(&fp.0);
        let sum = xxh3_64(&out[HEADER_LEN..]);
        out[4..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
        out
    }

    /// Whether `bytes` is exactly the family's frame for some fingerprint `g` (valid
    /// frame checksum, lowercase hex), and then whether `g` is the one whose hex is `fp`:
    /// `Some(true)` means `Envelope::decode(bytes)` is `Ok(Envelope { fp, ..family })`,
    /// `Some(false)` that it is `Ok(Envelope { g, ..family })` with `g != fp`. `None`
    /// for everything else, valid or not: the caller decodes those.
    pub(crate) fn recognize(&self, bytes: &[u8], fp: &FpHex) -> Option<bool> {
        let magic = bytes.get(..4)?;
        let sum = bytes.get(4..HEADER_LEN)?;
        let body = bytes.get(HEADER_LEN..)?;
        if magic != MAGIC || body.len() != self.body.len() {
            return None;
        }
        let (off, end) = (FP_PREFIX.len(), FP_PREFIX.len() + FP_HEX);
        if body[..off] != self.body[..off] || body[end..] != self.body[end..] {
            return None;
        }
        let window = &body[off..end];
        let same = window == fp.0;
        if !same
            && !window
                .iter()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        let mut s = [0u8; 8];
        s.copy_from_slice(sum);
        if xxh3_64(body) != u64::from_le_bytes(s) {
            return None;
        }
        Some(same)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            auth: None,
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

    fn size_only_sample() -> Envelope {
        Envelope {
            checksum: None,
            ..sample()
        }
    }

    #[test]
    fn templates_are_learned_for_this_schema_with_or_without_checksum() {
        for env in [sample(), size_only_sample()] {
            let t = Template::learn(&env).expect("this build's envelopes have a template");
            let frame = env.encode().expect("encodes");
            assert_eq!(t.recognize(&frame, &FpHex::of(&env.fp)), Some(true));
            assert_eq!(
                t.recognize(&frame, &FpHex::of(&ImageFp([0; 32]))),
                Some(false)
            );
            assert_eq!(t.encode(&FpHex::of(&env.fp)), frame);
        }
        // Another schema version decodes to an error: never a template.
        let mut old = size_only_sample();
        old.schema_version = 0;
        assert!(Template::learn(&old).is_none());
    }

    #[test]
    fn fp_hex_is_the_display_text() {
        let fp = ImageFp(std::array::from_fn(|i| (i * 37 + 5) as u8));
        let mut s = String::from("x:");
        FpHex::of(&fp).push_to(&mut s);
        assert_eq!(s, format!("x:{fp}"));
    }

    /// One mutation of a frame.
    #[derive(Debug, Clone)]
    enum Mutation {
        /// XOR a byte.
        Flip(prop::sample::Index, u8),
        /// Cut the frame short.
        Truncate(prop::sample::Index),
        /// Insert a byte.
        Insert(prop::sample::Index, u8),
        /// Upper-case one of the fingerprint's hex digits.
        UpperFpDigit(prop::sample::Index),
        /// Overwrite one of the fingerprint's hex digits (hex of either case, or not).
        SetFpDigit(prop::sample::Index, prop::sample::Index),
        /// Recompute the frame checksum (so body edits reach the JSON parser).
        Reframe,
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            4 => (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, x)| Mutation::Flip(i, x)),
            1 => any::<prop::sample::Index>().prop_map(Mutation::Truncate),
            1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, x)| Mutation::Insert(i, x)),
            2 => any::<prop::sample::Index>().prop_map(Mutation::UpperFpDigit),
            3 => (any::<prop::sample::Index>(), any::<prop::sample::Index>())
                .prop_map(|(i, d)| Mutation::SetFpDigit(i, d)),
            3 => Just(Mutation::Reframe),
        ]
    }

    fn apply(frame: &mut Vec<u8>, m: &Mutation) {
        match m {
            Mutation::Flip(i, x) if !frame.is_empty() => {
                let i = i.index(frame.len());
                frame[i] ^= x;
            }
            Mutation::Truncate(i) => {
                let n = i.index(frame.len() + 1);
                frame.truncate(n);
            }
            Mutation::Insert(i, x) => {
                let i = i.index(frame.len() + 1);
                frame.insert(i, *x);
            }
            Mutation::UpperFpDigit(i) => {
                let at = HEADER_LEN + FP_PREFIX.len() + i.index(FP_HEX);
                if let Some(b) = frame.get_mut(at) {
                    *b = b.to_ascii_uppercase();
                }
            }
            Mutation::SetFpDigit(i, d) => {
                const DIGITS: &[u8] = b"0123456789abcdefABCDEFgz\" ";
                let at = HEADER_LEN + FP_PREFIX.len() + i.index(FP_HEX);
                if let Some(b) = frame.get_mut(at) {
                    *b = DIGITS[d.index(DIGITS.len())];
                }
            }
            Mutation::Reframe if frame.len() >= HEADER_LEN => {
                let sum = xxh3_64(&frame[HEADER_LEN..]);
                frame[4..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
            }
            _ => {}
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2048, failure_persistence: None, ..Default::default() })]

        /// The template path agrees with a fresh `Envelope::decode` on mutated frames:
        /// whenever it recognizes bytes, they decode to the family's envelope, with the
        /// probed fingerprint exactly when it says so; the unmutated frame it always
        /// recognizes. Recognizing twice gives the same answer (no state).
        #[test]
        fn template_agrees_with_decode_on_mutated_frames(
            fp in any::<[u8; 32]>(),
            other in any::<[u8; 32]>(),
            probe_other in any::<bool>(),
            with_sum in any::<bool>(),
            edits in proptest::collection::vec(mutation(), 0..5),
        ) {
            let base = if with_sum { sample() } else { size_only_sample() };
            // Learned from one fingerprint, used with another.
            let t = Template::learn(&Envelope { fp: ImageFp(other), ..base.clone() })
                .expect("template");
            let family = Envelope { fp: ImageFp(fp), ..base };
            let clean = family.encode().expect("encodes");
            prop_assert_eq!(&t.encode(&FpHex::of(&ImageFp(fp))), &clean);
            let mut frame = clean.clone();
            for m in &edits {
                apply(&mut frame, m);
            }
            let probe = ImageFp(if probe_other { other } else { fp });
            let hex = FpHex::of(&probe);
            let fresh = Envelope::decode(&frame);
            let first = t.recognize(&frame, &hex);
            prop_assert_eq!(first, t.recognize(&frame, &hex));
            match first {
                Some(true) => prop_assert_eq!(fresh, Ok(Envelope { fp: probe, ..family.clone() })),
                Some(false) => {
                    let env = fresh.expect("recognized frames decode");
                    prop_assert_ne!(env.fp, probe);
                    prop_assert_eq!(env.clone(), Envelope { fp: env.fp, ..family.clone() });
                }
                None => {}
            }
            if frame == clean {
                prop_assert_eq!(first, Some(probe == ImageFp(fp)));
            }
        }
    }

    #[test]
    fn blake2b64_matches_the_reference_digest() {
        // BLAKE2b with digest_size=8 of b"abc" (Python: hashlib.blake2b(b"abc", digest_size=8)).
        assert_eq!(
            format!("{:016x}", ChecksumAlgo::Blake2b64.compute(b"abc")),
            "d8bb14d833d59559"
        );
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut f = MAGIC.to_vec();
        f.extend_from_slice(&xxh3_64(body).to_le_bytes());
        f.extend_from_slice(body);
        f
    }

    /// A template splices a fingerprint's hex at the fixed offset, so it may only come
    /// from a frame in this build's exact shape: a frame that decodes to `env` but keeps
    /// the hex elsewhere would make [`Template::encode`] differ from `env.encode()`.
    #[test]
    fn from_frame_refuses_other_shapes_even_when_they_decode_to_env() {
        let env = sample();
        let canon = env.encode().expect("encodes");
        let body = &canon[HEADER_LEN..];
        let (off, end) = (FP_PREFIX.len(), FP_PREFIX.len() + FP_HEX);
        assert_eq!(&body[..off], FP_PREFIX);
        let (hex, rest) = (&body[off..end], &body[end + 1..]);
        assert_eq!(rest[0], b',');
        // `fp` first, padded so its hex still sits at the fixed offset and is followed
        // by its closing quote: only the prefix is wrong.
        let mut moved = b"{\"fp\":".to_vec();
        moved.resize(off - 1, b' ');
        moved.push(b'"');
        moved.extend_from_slice(hex);
        moved.push(b'"');
        moved.extend_from_slice(b",\"schema_version\":1");
        moved.extend_from_slice(rest);
        assert!(!moved.starts_with(FP_PREFIX));
        assert_eq!((&moved[off..end], moved[end]), (hex, b'"'));
        // Whitespace after the brace that puts the fp's opening quote where the closing
        // one belongs: neither the prefix nor the hex is in place, only a quote at `end`.
        let shift = end - (off - 1);
        let mut spaced = vec![b'{'];
        spaced.extend(std::iter::repeat_n(b' ', shift));
        spaced.extend_from_slice(&body[1..]);
        assert!(!spaced.starts_with(FP_PREFIX));
        assert_ne!(&spaced[off..end], hex);
        assert_eq!(spaced[end], b'"');
        for b in [moved, spaced] {
            let frame = framed(&b);
            assert_eq!(Envelope::decode(&frame), Ok(env.clone()), "still env");
            assert!(Template::from_frame(&env, &frame).is_none());
        }
        // The canonical frame does give one.
        assert!(Template::from_frame(&env, &canon).is_some());
    }

    /// In shape but not decoding back to itself (a field that fails validation): no
    /// template, so the reader's slow path reports the invalid field.
    #[test]
    fn from_frame_refuses_an_envelope_that_does_not_decode_back() {
        let mut env = sample();
        env.model_parts.patch_size = 0;
        let frame = env.encode().expect("encodes");
        assert!(frame[HEADER_LEN..].starts_with(FP_PREFIX), "in shape");
        assert!(matches!(
            Envelope::decode(&frame),
            Err(EnvelopeError::Invalid(_))
        ));
        assert!(Template::from_frame(&env, &frame).is_none());
        assert!(Template::learn(&env).is_none());
    }
}
