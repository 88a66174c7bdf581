//! Deterministic random streams, split per component.
//!
//! Draws come from `rand` with one pinned generator type, [`rand_chacha::ChaCha8Rng`]
//! (portable: the same seed gives the same numbers on every platform, and rand_chacha
//! promises value stability within a major version). What used to be the reason for a
//! hand-written generator, that a seed must not depend on a third-party algorithm choice,
//! is met by pinning the type and by `draws_are_pinned` below, which pins a few draws of
//! each stream and distribution by name: a dependency bump that moves values fails it.
//! Streams are derived from `(seed, name)` so adding a new consumer of randomness does not
//! shift the numbers any other component sees. [`mix64`] (SplitMix64's finaliser) stays as
//! the seeding mixer and as a hash for ids; it draws nothing.
//!
//! [`Rng`] implements [`rand::RngCore`], so every `rand_distr` distribution samples from it.

use rand::{Rng as _, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp1};

/// A seeded random stream (ChaCha8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    /// The 64-bit key this stream was seeded from (children derive from it).
    key: u64,
    inner: ChaCha8Rng,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a 64-bit bijective mixer, used for seeding and hashing.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over bytes, used only to turn a stream name into a number.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Rng {
    /// A stream from a raw seed.
    pub fn new(seed: u64) -> Self {
        let key = mix64(seed);
        Self {
            key,
            inner: ChaCha8Rng::seed_from_u64(key),
        }
    }

    /// The stream named `name` under `seed`: independent of every other name.
    pub fn stream(seed: u64, name: &str) -> Self {
        Self::new(mix64(seed) ^ fnv1a(name.as_bytes()))
    }

    /// A child stream `index` of this one (e.g. one per session), without advancing `self`.
    /// It depends on this stream's key, its position and `index`.
    pub fn child(&self, index: u64) -> Self {
        let pos = self.inner.get_word_pos() as u64;
        Self::new(self.key ^ mix64(pos) ^ mix64(index.wrapping_add(GOLDEN)))
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        self.inner.random::<f64>()
    }

    /// Uniform integer in [0, n). Returns 0 when `n == 0`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.inner.random_range(0..n)
    }

    /// Uniform integer in [lo, hi] (inclusive). `lo > hi` returns `lo`.
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        self.inner.random_range(lo..=hi)
    }

    /// True with probability `p` (clamped to [0, 1]; NaN is false).
    pub fn chance(&mut self, p: f64) -> bool {
        if p.is_nan() || p <= 0.0 {
            return false;
        }
        self.inner.random_bool(p.min(1.0))
    }

    /// Exponential with the given mean (`rand_distr::Exp1` scaled).
    pub fn exp(&mut self, mean: f64) -> f64 {
        let e: f64 = Exp1.sample(&mut self.inner);
        mean * e
    }
}

impl RngCore for Rng {
    fn next_u32(&mut self) -> u32 {
        self.inner.next_u32()
    }

    fn next_u64(&mut self) -> u64 {
        self.inner.next_u64()
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        self.inner.fill_bytes(dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_names_are_independent() {
        let mut a = Rng::stream(7, "arrivals");
        let mut b = Rng::stream(7, "arrivals");
        let mut c = Rng::stream(7, "images");
        let xa: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let xc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(xa, xb);
        assert_ne!(xa, xc);
    }

    const PINNED: (u64, f64, u64, u64, bool, f64) = (
        14114271601200312541,
        0.5911137462462599,
        66,
        14,
        true,
        0.7472109246621442,
    );
    const PINNED_CHILD: u64 = 0x1059_ef4b_0db0_3b1a;

    #[test]
    fn draws_are_pinned() {
        // Pinned so that a change of generator or a dependency bump that moves values is
        // caught by name: every deterministic output of the project depends on these.
        let mut r = Rng::stream(7, "arrivals");
        let got = (
            r.next_u64(),
            r.next_f64(),
            r.below(1000),
            r.range_inclusive(10, 20),
            r.chance(0.5),
            r.exp(2.0),
        );
        let mut c = Rng::stream(7, "sessions").child(3);
        let got_child = c.next_u64();
        // Floats within 1e-12 relative: the algorithm, not the last bit of a platform's libm.
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * b.abs();
        assert_eq!(
            (got.0, got.2, got.3, got.4),
            (PINNED.0, PINNED.2, PINNED.3, PINNED.4)
        );
        assert!(close(got.1, PINNED.1) && close(got.5, PINNED.5), "{got:?}");
        assert_eq!(got_child, PINNED_CHILD);
    }

    #[test]
    fn below_stays_in_range_and_f64_in_unit_interval() {
        let mut r = Rng::new(42);
        for n in [1u64, 2, 3, 10, 1 << 40] {
            for _ in 0..1000 {
                assert!(r.below(n) < n);
            }
        }
        assert_eq!(r.below(0), 0);
        for _ in 0..1000 {
            let x = r.next_f64();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
