//! Deterministic random streams, split per component.
//!
//! We carry our own small generator instead of depending on `rand` so that a seed gives
//! the same numbers across dependency upgrades: results that must be byte-identical for a
//! seed cannot depend on a third-party algorithm choice. The generator is SplitMix64
//! (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush, and splits cheaply.
//! Streams are derived from `(seed, name)` so adding a new consumer of randomness does not
//! shift the numbers any other component sees.

/// A seeded SplitMix64 stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function; also a good 64-bit mixer on its own.
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
        Self { state: mix64(seed) }
    }

    /// The stream named `name` under `seed`: independent of every other name.
    pub fn stream(seed: u64, name: &str) -> Self {
        Self::new(mix64(seed) ^ fnv1a(name.as_bytes()))
    }

    /// A child stream `index` of this one (e.g. one per session), without advancing `self`.
    pub fn child(&self, index: u64) -> Self {
        Self::new(self.state ^ mix64(index.wrapping_add(GOLDEN)))
    }

    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix64(self.state)
    }

    /// Uniform in [0, 1) with 53 bits of precision.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n). Returns 0 when `n == 0`. Lemire's multiply-shift
    /// (bias below 2^-32 for the ranges we use, and no division).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform integer in [lo, hi] (inclusive). `lo > hi` returns `lo`.
    pub fn range_inclusive(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `p` (clamped to [0, 1]).
    pub fn chance(&mut self, p: f64) -> bool {
        self.next_f64() < p
    }

    /// Exponential with the given mean (inverse transform).
    pub fn exp(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.next_f64()).ln()
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

    #[test]
    fn known_answer_pins_the_algorithm() {
        // Pinned so that an accidental change of generator is caught: every
        // deterministic output of the project depends on these numbers.
        let mut r = Rng::new(0);
        assert_eq!(r.next_u64(), 0xe220_a839_7b1d_cdaf);
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
