//! Content-and-configuration fingerprints for the embedding cache.
//!
//! A cached visual embedding is only reusable by a reader whose encoder would have
//! produced the same bytes. The *model fingerprint* ([`ModelParts::fingerprint`]) binds
//! every runtime factor that can change an encoder output: tenant, the resolved 40-hex
//! model snapshot, processor version, dtype, quantization, visual adapter, spatial-merge
//! and patch size, pixel limits, encoder parallel layout, storage and tensor layout. The
//! *image fingerprint* ([`ImageHasher`], [`image_fingerprint`]) hashes the model
//! fingerprint, `grid_thw` and the processed pixel tensor's shape, dtype and bytes, so a
//! bare image hash can never hit across tenant, dtype, quantization or revision.
//!
//! Both are BLAKE2b with a 32-byte digest over a canonical encoding: a domain tag, then
//! every field as `(name, value)` with both length-prefixed (u64 little-endian), integers
//! as u64 little-endian. The encoding does not depend on JSON key order or on field
//! order in a struct literal, and no two different part sets encode to the same bytes.
//! Pixel bytes are streamed ([`ImageHasher::update`]) without copying the tensor.
//!
//! Keyed fingerprints (off by default): [`ImageHasher::new_keyed`] computes the same
//! encoding with the domain tag `moonagent.image-fp.keyed.v1` under BLAKE2b-256 keyed with
//! a [`TenantSecret`] (RFC 7693 keyed mode, Python's `blake2b(key=..., digest_size=32)`).
//! The plain image fingerprint is a public function of the image and the model parts, so
//! any tenant that can name another's model parts can compute its keys and probe the store
//! for them; a keyed one needs the owner's secret.

use std::fmt;
use std::str::FromStr;

use blake2::digest::consts::U32;
use blake2::digest::{KeyInit, Mac};
use blake2::{Blake2b, Blake2bMac, Digest};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// BLAKE2b with a 32-byte digest (same compression function as BLAKE2b-512).
type Blake2b256 = Blake2b<U32>;

/// Keyed BLAKE2b with a 32-byte digest.
type Blake2bMac256 = Blake2bMac<U32>;

const MODEL_DOMAIN: &[u8] = b"moonagent.model-fp.v1";
const IMAGE_DOMAIN: &[u8] = b"moonagent.image-fp.v1";
const KEYED_IMAGE_DOMAIN: &[u8] = b"moonagent.image-fp.keyed.v1";

/// A tenant's secret: the key of its keyed image fingerprints and of its envelope MACs
/// (each under its own domain tag). 32 bytes; `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantSecret([u8; 32]);

impl TenantSecret {
    /// A secret from its 32 bytes (draw them from a CSPRNG or a KMS, never derive them
    /// from the tenant's name).
    pub const fn new(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// A BLAKE2b-256 MAC keyed with this secret.
    pub(crate) fn mac(&self) -> Blake2bMac256 {
        // BLAKE2b takes keys of 1..=64 bytes, so a 32-byte key cannot be refused. No
        // fallback key: a MAC under any other key than the secret would be a silent hole.
        <Blake2bMac256 as KeyInit>::new_from_slice(&self.0)
            .expect("a 32-byte key is a valid BLAKE2b key")
    }
}

impl fmt::Debug for TenantSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TenantSecret(..)")
    }
}

/// How an image fingerprint was made; named in authenticated envelopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FpScheme {
    /// Plain BLAKE2b-256 (anyone who knows the model parts and the image can compute it).
    #[serde(rename = "blake2b_256")]
    Plain,
    /// BLAKE2b-256 keyed with the tenant's secret.
    #[serde(rename = "blake2b_256_keyed")]
    Keyed,
}

/// The two hashers a fingerprint can run on; the encoding is the same.
#[derive(Clone)]
enum FpHash {
    Plain(Blake2b256),
    Keyed(Blake2bMac256),
}

impl FpHash {
    #[inline]
    fn update(&mut self, bytes: &[u8]) {
        match self {
            FpHash::Plain(h) => Digest::update(h, bytes),
            FpHash::Keyed(h) => Mac::update(h, bytes),
        }
    }

    fn finish(self) -> [u8; 32] {
        match self {
            FpHash::Plain(h) => h.finalize().into(),
            FpHash::Keyed(h) => h.finalize().into_bytes().into(),
        }
    }
}

/// A fingerprint input that is invalid; names the field and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FingerprintError {
    /// A field failed validation.
    #[error("{field}: expected {expected}, got {got:?}")]
    InvalidField {
        /// Field name (as in configs).
        field: &'static str,
        /// What a valid value looks like.
        expected: &'static str,
        /// The value given (possibly shortened).
        got: String,
    },
    /// The streamed pixel bytes do not match the declared shape and dtype.
    #[error("pixel bytes: expected {expected} (shape x dtype size), got {got}")]
    PixelLength {
        /// Bytes implied by shape and dtype.
        expected: u64,
        /// Bytes streamed.
        got: u64,
    },
    /// A hex fingerprint string could not be parsed.
    #[error("fingerprint: expected 64 hex characters, got {0:?}")]
    BadHex(String),
}

/// Element type of a tensor (pixels or embeddings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    F32,
    /// FP8 E4M3.
    Fp8E4m3,
    /// FP8 E5M2.
    Fp8E5m2,
}

impl Dtype {
    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            Dtype::U8 | Dtype::I8 | Dtype::Fp8E4m3 | Dtype::Fp8E5m2 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
        }
    }

    /// Stable snake_case name (hashed into fingerprints; never change one).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "u8",
            Dtype::I8 => "i8",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::Fp8E4m3 => "fp8_e4m3",
            Dtype::Fp8E5m2 => "fp8_e5m2",
        }
    }
}

/// A vision grid in patches: temporal, height, width (Qwen2-VL's `grid_thw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridThw {
    /// Temporal patches.
    pub t: u64,
    /// Height in patches.
    pub h: u64,
    /// Width in patches.
    pub w: u64,
}

impl GridThw {
    /// A grid from its three sizes.
    pub const fn new(t: u64, h: u64, w: u64) -> Self {
        Self { t, h, w }
    }

    /// Pixel patches (`t * h * w`); `None` on overflow.
    pub fn patches(&self) -> Option<u64> {
        self.t.checked_mul(self.h)?.checked_mul(self.w)
    }

    /// Visual tokens after spatial merge (`t * (h/m) * (w/m)`); `None` when `m` is zero,
    /// `h` or `w` is not a multiple of `m`, or on overflow.
    pub fn visual_tokens(&self, merge: u64) -> Option<u64> {
        if merge == 0 || self.h % merge != 0 || self.w % merge != 0 {
            return None;
        }
        self.t
            .checked_mul(self.h / merge)?
            .checked_mul(self.w / merge)
    }

    /// The grid as little-endian u64s (the form hashed into image fingerprints).
    pub fn to_le_bytes(&self) -> [u8; 24] {
        let mut out = [0u8; 24];
        out[..8].copy_from_slice(&self.t.to_le_bytes());
        out[8..16].copy_from_slice(&self.h.to_le_bytes());
        out[16..].copy_from_slice(&self.w.to_le_bytes());
        out
    }
}

/// Encoder parallel layout (tensor- and data-parallel degree of the vision encoder).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelLayout {
    /// Tensor-parallel degree.
    pub tp: u32,
    /// Data-parallel degree.
    pub dp: u32,
}

/// Every runtime factor that can change an encoder output (the model fingerprint's parts).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelParts {
    /// Tenant (cache isolation domain).
    pub tenant: String,
    /// Resolved model snapshot: a 40-hex commit SHA (either case; hashed lowercase).
    pub model_snapshot: String,
    /// Image processor version.
    pub processor_version: String,
    /// Encoder compute dtype.
    pub dtype: Dtype,
    /// Quantization scheme (`"none"` when unquantized).
    pub quantization: String,
    /// Visual adapter (e.g. a LoRA id; `"none"` when absent).
    pub visual_adapter: String,
    /// Spatial-merge size (tokens = patches / merge^2).
    pub spatial_merge_size: u32,
    /// Vision patch size in pixels.
    pub patch_size: u32,
    /// Processor's minimum pixel count.
    pub min_pixels: u64,
    /// Processor's maximum pixel count.
    pub max_pixels: u64,
    /// Encoder parallel layout.
    pub parallel: ParallelLayout,
    /// How the blob is laid out in the store (e.g. `"contiguous"`).
    pub storage_layout: String,
    /// Tensor layout of the blob (e.g. `"row_major(visual_tokens,hidden)"`).
    pub tensor_layout: String,
}

impl ModelParts {
    /// Qwen2.5-VL-7B-like parts for `tenant` (examples, tests, demos).
    pub fn example(tenant: &str) -> Self {
        Self {
            tenant: tenant.to_owned(),
            model_snapshot: "cc594898137f460bfe9f0759e9844b3ce807cfb5".to_owned(),
            processor_version: "qwen2_vl_image_processor/4.51.3".to_owned(),
            dtype: Dtype::Bf16,
            quantization: "none".to_owned(),
            visual_adapter: "none".to_owned(),
            spatial_merge_size: 2,
            patch_size: 14,
            min_pixels: 3136,
            max_pixels: 12_845_056,
            parallel: ParallelLayout { tp: 1, dp: 1 },
            storage_layout: "contiguous".to_owned(),
            tensor_layout: "row_major(visual_tokens,hidden)".to_owned(),
        }
    }

    /// Check every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), FingerprintError> {
        let s = &self.model_snapshot;
        if s.len() != 40 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("model_snapshot", "exactly 40 hex characters", s));
        }
        if self.spatial_merge_size == 0 {
            return Err(invalid("spatial_merge_size", ">= 1", "0"));
        }
        if self.patch_size == 0 {
            return Err(invalid("patch_size", ">= 1", "0"));
        }
        if self.min_pixels > self.max_pixels {
            return Err(invalid(
                "min_pixels",
                "<= max_pixels",
                &format!("{} > {}", self.min_pixels, self.max_pixels),
            ));
        }
        if self.parallel.tp == 0 {
            return Err(invalid("parallel.tp", ">= 1", "0"));
        }
        if self.parallel.dp == 0 {
            return Err(invalid("parallel.dp", ">= 1", "0"));
        }
        Ok(())
    }

    /// A validated copy with the snapshot lowercased, so that the same SHA in either case
    /// gives the same fingerprint and compares equal in envelopes.
    pub fn normalized(&self) -> Result<Self, FingerprintError> {
        self.validate()?;
        let mut p = self.clone();
        p.model_snapshot.make_ascii_lowercase();
        Ok(p)
    }

    /// The model fingerprint: BLAKE2b-256 over the canonical encoding of every part.
    pub fn fingerprint(&self) -> Result<ModelFp, FingerprintError> {
        let p = self.normalized()?;
        let mut h = FpHash::Plain(Blake2b256::new());
        h.update(MODEL_DOMAIN);
        field(&mut h, "tenant", p.tenant.as_bytes());
        field(&mut h, "model_snapshot", p.model_snapshot.as_bytes());
        field(&mut h, "processor_version", p.processor_version.as_bytes());
        field(&mut h, "dtype", p.dtype.name().as_bytes());
        field(&mut h, "quantization", p.quantization.as_bytes());
        field(&mut h, "visual_adapter", p.visual_adapter.as_bytes());
        field_u64(&mut h, "spatial_merge_size", p.spatial_merge_size.into());
        field_u64(&mut h, "patch_size", p.patch_size.into());
        field_u64(&mut h, "min_pixels", p.min_pixels);
        field_u64(&mut h, "max_pixels", p.max_pixels);
        field_u64(&mut h, "parallel.tp", p.parallel.tp.into());
        field_u64(&mut h, "parallel.dp", p.parallel.dp.into());
        field(&mut h, "storage_layout", p.storage_layout.as_bytes());
        field(&mut h, "tensor_layout", p.tensor_layout.as_bytes());
        Ok(ModelFp(h.finish()))
    }
}

fn invalid(field: &'static str, expected: &'static str, got: &str) -> FingerprintError {
    let got: String = got.chars().take(80).collect();
    FingerprintError::InvalidField {
        field,
        expected,
        got,
    }
}

/// Length-prefixed `(name, value)`: unambiguous whatever the values contain.
fn field(h: &mut FpHash, name: &str, value: &[u8]) {
    field_head(h, name, value.len() as u64);
    h.update(value);
}

/// A field's name and value length; the caller hashes the value bytes after it.
fn field_head(h: &mut FpHash, name: &str, value_len: u64) {
    h.update(&(name.len() as u64).to_le_bytes());
    h.update(name.as_bytes());
    h.update(&value_len.to_le_bytes());
}

fn field_u64(h: &mut FpHash, name: &str, value: u64) {
    field(h, name, &value.to_le_bytes());
}

macro_rules! fp_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub [u8; 32]);

        impl $name {
            /// The raw digest.
            pub fn as_bytes(&self) -> &[u8; 32] {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_hex(f, &self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}(", stringify!($name))?;
                write_hex(f, &self.0)?;
                write!(f, ")")
            }
        }

        impl FromStr for $name {
            type Err = FingerprintError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                parse_hex32(s).map($name)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

fp_type!(
    /// A model fingerprint (BLAKE2b-256 over [`ModelParts`]). Displays as 64 lowercase hex.
    ModelFp
);
fp_type!(
    /// An image fingerprint: the cache key. Displays as 64 lowercase hex.
    ImageFp
);

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 64];
    for (i, b) in bytes.iter().take(32).enumerate() {
        buf[2 * i] = HEX[usize::from(b >> 4)];
        buf[2 * i + 1] = HEX[usize::from(b & 0xf)];
    }
    let n = 2 * bytes.len().min(32);
    // Only ASCII hex digits were written.
    f.write_str(std::str::from_utf8(&buf[..n]).map_err(|_| fmt::Error)?)
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn parse_hex32(s: &str) -> Result<[u8; 32], FingerprintError> {
    let bad = || FingerprintError::BadHex(s.chars().take(80).collect());
    let b = s.as_bytes();
    if b.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks_exact(2).enumerate() {
        let hi = hex_val(pair[0]).ok_or_else(bad)?;
        let lo = hex_val(pair[1]).ok_or_else(bad)?;
        out[i] = (hi << 4) | lo;
    }
    Ok(out)
}

/// Streaming image fingerprint: feed the processed pixel tensor in chunks, in order.
///
/// The header (model fingerprint, grid, shape, dtype, byte count) is hashed at
/// construction; [`ImageHasher::finish`] checks that exactly `shape x dtype` bytes came.
#[derive(Clone)]
pub struct ImageHasher {
    h: FpHash,
    expected: u64,
    seen: u64,
}

impl ImageHasher {
    /// Start hashing a pixel tensor of `shape` and `dtype` for `model` and `grid`.
    pub fn new(
        model: &ModelFp,
        grid: GridThw,
        shape: &[u64],
        dtype: Dtype,
    ) -> Result<Self, FingerprintError> {
        Self::start(
            FpHash::Plain(Blake2b256::new()),
            IMAGE_DOMAIN,
            model,
            grid,
            shape,
            dtype,
        )
    }

    /// [`ImageHasher::new`] keyed with `secret` (see the module docs): only holders of the
    /// secret can compute the fingerprint, so only they can find or probe the entry.
    pub fn new_keyed(
        secret: &TenantSecret,
        model: &ModelFp,
        grid: GridThw,
        shape: &[u64],
        dtype: Dtype,
    ) -> Result<Self, FingerprintError> {
        let h = FpHash::Keyed(secret.mac());
        Self::start(h, KEYED_IMAGE_DOMAIN, model, grid, shape, dtype)
    }

    fn start(
        mut h: FpHash,
        domain: &[u8],
        model: &ModelFp,
        grid: GridThw,
        shape: &[u64],
        dtype: Dtype,
    ) -> Result<Self, FingerprintError> {
        let expected = shape
            .iter()
            .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| invalid("shape", "a product that fits in u64 bytes", "overflow"))?;
        h.update(domain);
        field(&mut h, "model_fp", &model.0);
        field(&mut h, "grid_thw", &grid.to_le_bytes());
        field_head(&mut h, "shape", (shape.len() as u64).saturating_mul(8));
        for d in shape {
            h.update(&d.to_le_bytes());
        }
        field(&mut h, "dtype", dtype.name().as_bytes());
        // The pixel field's length prefix is the declared size; finish() checks it.
        field_head(&mut h, "pixels", expected);
        Ok(Self {
            h,
            expected,
            seen: 0,
        })
    }

    /// Hash the next chunk of pixel bytes (no copy is kept).
    #[inline]
    pub fn update(&mut self, chunk: &[u8]) {
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        self.h.update(chunk);
    }

    /// The image fingerprint; an error when the bytes streamed differ from the declared size.
    pub fn finish(self) -> Result<ImageFp, FingerprintError> {
        if self.seen != self.expected {
            return Err(FingerprintError::PixelLength {
                expected: self.expected,
                got: self.seen,
            });
        }
        Ok(ImageFp(self.h.finish()))
    }
}

/// One-shot image fingerprint over a contiguous pixel tensor.
pub fn image_fingerprint(
    model: &ModelFp,
    grid: GridThw,
    shape: &[u64],
    dtype: Dtype,
    pixels: &[u8],
) -> Result<ImageFp, FingerprintError> {
    let mut h = ImageHasher::new(model, grid, shape, dtype)?;
    h.update(pixels);
    h.finish()
}

/// [`image_fingerprint`] keyed with `secret` ([`ImageHasher::new_keyed`]).
pub fn image_fingerprint_keyed(
    secret: &TenantSecret,
    model: &ModelFp,
    grid: GridThw,
    shape: &[u64],
    dtype: Dtype,
    pixels: &[u8],
) -> Result<ImageFp, FingerprintError> {
    let mut h = ImageHasher::new_keyed(secret, model, grid, shape, dtype)?;
    h.update(pixels);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_bad_input() {
        let fp = ModelParts::example("t").fingerprint().expect("valid parts");
        let s = fp.to_string();
        assert_eq!(s.len(), 64);
        assert_eq!(s.parse::<ModelFp>().expect("parses"), fp);
        assert_eq!(s.to_uppercase().parse::<ModelFp>().expect("parses"), fp);
        assert!("zz".parse::<ModelFp>().is_err());
        assert!(s[..63].parse::<ModelFp>().is_err());
        let json = serde_json::to_string(&fp).expect("serializes");
        assert_eq!(json, format!("\"{s}\""));
        let back: ModelFp = serde_json::from_str(&json).expect("deserializes");
        assert_eq!(back, fp);
    }

    #[test]
    fn streaming_equals_one_shot_and_length_is_checked() {
        let m = ModelParts::example("t").fingerprint().expect("valid parts");
        let grid = GridThw::new(1, 4, 4);
        let px: Vec<u8> = (0..16 * 6 * 2).map(|i| i as u8).collect();
        let one = image_fingerprint(&m, grid, &[16, 6], Dtype::Bf16, &px).expect("ok");
        let mut h = ImageHasher::new(&m, grid, &[16, 6], Dtype::Bf16).expect("ok");
        for c in px.chunks(7) {
            h.update(c);
        }
        assert_eq!(h.finish().expect("ok"), one);
        let short = image_fingerprint(&m, grid, &[16, 6], Dtype::Bf16, &px[1..]);
        assert!(matches!(short, Err(FingerprintError::PixelLength { .. })));
    }

    #[test]
    fn grid_tokens_need_divisible_sides() {
        assert_eq!(GridThw::new(1, 4, 6).visual_tokens(2), Some(6));
        assert_eq!(GridThw::new(2, 4, 6).patches(), Some(48));
        assert_eq!(GridThw::new(1, 5, 6).visual_tokens(2), None);
        assert_eq!(GridThw::new(1, 4, 6).visual_tokens(0), None);
    }
}
