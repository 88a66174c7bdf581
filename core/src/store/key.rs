//! Store keys: how a [`Store`](super::Store)'s `&str` keys map to a [`MemStore`]'s key type.
//!
//! [`StoreKey`] is a compact form of the keys the simulator writes (prefix-KV blocks
//! `kv:<decimal u64>`, embedding-cache `mc:mmmeta:<64 hex>` / `mc:mmblob:<64 hex>`) that
//! needs no heap allocation and hashes a few words instead of a 74-byte string. It is an
//! exact bijection with strings: [`StoreKey::parse`] takes every string to one key, and
//! [`Display`](fmt::Display) writes that string back, byte for byte. A string not exactly
//! in a compact form (a leading zero, a sign, a value past `u64::MAX`, uppercase or a
//! wrong number of hex digits, ...) is kept as is in [`StoreKey::Other`], so a
//! `MemStore<StoreKey>` behaves exactly as a `MemStore<String>` given the same strings.
//!
//! [`StrKey`] is what the [`Store`](super::Store) impl of `MemStore<K>` needs from `K`:
//! `String` and `StoreKey` implement it.
//!
//! [`MemStore`]: super::MemStore

use std::borrow::Borrow;
use std::fmt;
use std::hash::Hash;

/// Prefix of prefix-KV block keys (`kv:<decimal u64>`).
pub const KV_PREFIX: &str = "kv:";
/// Prefix of embedding-cache meta keys (`mm_cache::META_PREFIX`).
pub const MM_META_PREFIX: &str = "mc:mmmeta:";
/// Prefix of embedding-cache blob keys (`mm_cache::BLOB_PREFIX`).
pub const MM_BLOB_PREFIX: &str = "mc:mmblob:";

/// A store key; the compact forms stand for exactly one string each (see the module docs).
///
/// `repr(u64)`: the tag is a whole word and every variant's data starts at offset 8, so a
/// key moves as whole words. With a one-byte tag, moving a key copied its bytes 1..8
/// with odd-sized loads that straddled the stores that wrote them, a store-forwarding
/// stall on every put of the simulator's hot path (issue 15). Same size (40 bytes).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum StoreKey {
    /// `kv:` and the canonical decimal of the value (no sign, no leading zero but `0`).
    Kv(u64),
    /// `mc:mmmeta:` and the 64 lowercase hex digits of the bytes.
    MmMeta([u8; 32]),
    /// `mc:mmblob:` and the 64 lowercase hex digits of the bytes.
    MmBlob([u8; 32]),
    /// Any other string.
    Other(OtherKey),
}

/// A string in none of [`StoreKey`]'s compact forms. Only [`StoreKey::parse`] makes one, so
/// two equal strings never become two different keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OtherKey(Box<str>);

impl OtherKey {
    /// The string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl StoreKey {
    /// The key of `s` (allocates only for [`StoreKey::Other`]).
    pub fn parse(s: &str) -> Self {
        let b = s.as_bytes();
        if let Some(d) = b.strip_prefix(KV_PREFIX.as_bytes()) {
            if let Some(v) = parse_dec(d) {
                return StoreKey::Kv(v);
            }
        } else if let Some(h) = b.strip_prefix(MM_META_PREFIX.as_bytes()) {
            if let Some(fp) = parse_hex32(h) {
                return StoreKey::MmMeta(fp);
            }
        } else if let Some(h) = b.strip_prefix(MM_BLOB_PREFIX.as_bytes()) {
            if let Some(fp) = parse_hex32(h) {
                return StoreKey::MmBlob(fp);
            }
        }
        StoreKey::Other(OtherKey(s.into()))
    }
}

impl From<&str> for StoreKey {
    fn from(s: &str) -> Self {
        Self::parse(s)
    }
}

impl fmt::Display for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreKey::Kv(v) => write!(f, "{KV_PREFIX}{v}"),
            StoreKey::MmMeta(fp) => write_hex_key(f, MM_META_PREFIX, fp),
            StoreKey::MmBlob(fp) => write_hex_key(f, MM_BLOB_PREFIX, fp),
            StoreKey::Other(s) => f.write_str(s.as_str()),
        }
    }
}

/// The canonical decimal of a `u64`: digits only, no leading zero unless exactly `0`.
fn parse_dec(d: &[u8]) -> Option<u64> {
    if d.is_empty() || (d.len() > 1 && d[0] == b'0') {
        return None;
    }
    d.iter().try_fold(0u64, |v, &c| {
        let digit = c.checked_sub(b'0').filter(|&x| x < 10)?;
        v.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Value of each byte as a lowercase hex digit; `0xff` for every other byte.
const HEX_VALUE: [u8; 256] = {
    let mut t = [0xffu8; 256];
    let mut i = 0;
    while i < 10 {
        t[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        t[b'a' as usize + i] = 10 + i as u8;
        i += 1;
    }
    t
};

/// Exactly 64 lowercase hex digits. Branch-free over the digits (the embedding cache's
/// every store call parses one).
fn parse_hex32(h: &[u8]) -> Option<[u8; 32]> {
    if h.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    let mut bad = 0u8;
    for (o, pair) in out.iter_mut().zip(h.chunks_exact(2)) {
        let (hi, lo) = (
            HEX_VALUE[usize::from(pair[0])],
            HEX_VALUE[usize::from(pair[1])],
        );
        bad |= hi | lo;
        *o = (hi << 4) | lo;
    }
    // A digit is at most 0x0f; any other byte set the high bits.
    (bad & 0xf0 == 0).then_some(out)
}

fn write_hex_key(f: &mut fmt::Formatter<'_>, prefix: &str, fp: &[u8; 32]) -> fmt::Result {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 64];
    for (pair, &b) in buf.chunks_exact_mut(2).zip(fp) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    f.write_str(prefix)?;
    // Only ASCII hex digits were written.
    f.write_str(std::str::from_utf8(&buf).map_err(|_| fmt::Error)?)
}

/// A key type a `MemStore` can serve [`Store`](super::Store)'s `&str` keys with.
pub trait StrKey: Hash + Eq + Clone + Borrow<<Self as StrKey>::Lookup> {
    /// What a lookup borrows: `str` for `String`, the parsed key for [`StoreKey`].
    type Lookup: Hash + Eq + ?Sized;
    /// The owned key of `key` (for puts).
    fn owned(key: &str) -> Self;
    /// Run `f` on the lookup form of `key`.
    fn with_lookup<R>(key: &str, f: impl FnOnce(&Self::Lookup) -> R) -> R;
    /// The key of a typed key: exactly `Self::owned(&key.to_string())`.
    fn of_store_key(key: &StoreKey) -> Self {
        Self::owned(&key.to_string())
    }
    /// Run `f` on the lookup form of a typed key.
    fn with_store_key<R>(key: &StoreKey, f: impl FnOnce(&Self::Lookup) -> R) -> R {
        Self::with_lookup(&key.to_string(), f)
    }
    /// The hash (FxHash, as the store files keys) of a typed key's form, when it is cheap
    /// to get (no string formatted): for prefetch hints, which skip the others.
    fn cheap_hash(_key: &StoreKey) -> Option<u64> {
        None
    }
}

impl StrKey for String {
    type Lookup = str;
    fn owned(key: &str) -> Self {
        key.to_owned()
    }
    #[inline]
    fn with_lookup<R>(key: &str, f: impl FnOnce(&str) -> R) -> R {
        f(key)
    }
}

impl StrKey for StoreKey {
    type Lookup = StoreKey;
    fn owned(key: &str) -> Self {
        Self::parse(key)
    }
    #[inline]
    fn of_store_key(key: &StoreKey) -> Self {
        key.clone()
    }
    #[inline]
    fn with_store_key<R>(key: &StoreKey, f: impl FnOnce(&StoreKey) -> R) -> R {
        f(key)
    }
    #[inline]
    fn cheap_hash(key: &StoreKey) -> Option<u64> {
        use std::hash::BuildHasher;
        Some(rustc_hash::FxBuildHasher.hash_one(key))
    }
    #[inline]
    fn with_lookup<R>(key: &str, f: impl FnOnce(&StoreKey) -> R) -> R {
        f(&Self::parse(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_the_embedding_cache() {
        assert_eq!(MM_META_PREFIX, crate::mm_cache::META_PREFIX);
        assert_eq!(MM_BLOB_PREFIX, crate::mm_cache::BLOB_PREFIX);
    }

    #[test]
    fn keys_of_the_simulator_are_compact() {
        let fp = crate::fingerprint::ImageFp([0xa5; 32]);
        assert_eq!(
            StoreKey::parse(&crate::mm_cache::meta_key(&fp)),
            StoreKey::MmMeta([0xa5; 32])
        );
        assert_eq!(
            StoreKey::parse(&crate::mm_cache::blob_key(&fp)),
            StoreKey::MmBlob([0xa5; 32])
        );
        for b in [0u64, 7, 10, 4_096, 1 << 40, u64::MAX] {
            assert_eq!(StoreKey::parse(&format!("kv:{b}")), StoreKey::Kv(b));
            assert_eq!(StoreKey::Kv(b).to_string(), format!("kv:{b}"));
        }
    }
}
