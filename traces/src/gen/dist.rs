//! Samplers over [`moonagent_core::rng::Rng`] from `rand_distr`: normal, Gamma, Weibull,
//! exponential, inter-arrival processes scaled to a mean, and discrete distributions given
//! as `{value: probability}` tables (`rand::distr::weighted::WeightedIndex`). The values a
//! seed gives are pinned by `draws_are_pinned` here and in `core::rng`.

use moonagent_core::rng::Rng;
use rand::distr::weighted::WeightedIndex;
use rand_distr::{Distribution, StandardNormal};

use crate::error::ValueError;

/// Standard normal (`rand_distr::StandardNormal`).
pub fn std_normal(rng: &mut Rng) -> f64 {
    StandardNormal.sample(rng)
}

/// Gamma(shape, scale) (`rand_distr::Gamma`); 0 when a parameter is not positive.
pub fn gamma(rng: &mut Rng, shape: f64, scale: f64) -> f64 {
    match rand_distr::Gamma::new(shape, scale) {
        Ok(d) if shape > 0.0 && scale > 0.0 => d.sample(rng),
        _ => 0.0,
    }
}

/// Weibull(shape, scale) (`rand_distr::Weibull`); 0 when a parameter is not positive.
pub fn weibull(rng: &mut Rng, shape: f64, scale: f64) -> f64 {
    match rand_distr::Weibull::new(scale, shape) {
        Ok(d) if shape > 0.0 && scale > 0.0 => d.sample(rng),
        _ => 0.0,
    }
}

/// The Gamma function for positive arguments (Lanczos, g = 7, n = 9).
pub fn gamma_fn(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        return std::f64::consts::PI / ((std::f64::consts::PI * x).sin() * gamma_fn(1.0 - x));
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    (std::f64::consts::TAU).sqrt() * t.powf(x + 0.5) * (-t).exp() * a
}

/// The shape of an inter-arrival distribution; its scale is set from the mean gap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InterArrival {
    /// Exponential gaps (a Poisson process).
    Exponential,
    /// Gamma gaps with this shape (CV = 1/sqrt(shape)).
    Gamma {
        /// Shape parameter k.
        shape: f64,
    },
    /// Weibull gaps with this shape.
    Weibull {
        /// Shape parameter k.
        shape: f64,
    },
}

impl InterArrival {
    /// One gap in seconds with mean `mean_s`.
    pub fn sample(&self, rng: &mut Rng, mean_s: f64) -> f64 {
        match *self {
            InterArrival::Exponential => rng.exp(mean_s),
            InterArrival::Gamma { shape } => gamma(rng, shape, mean_s / shape),
            InterArrival::Weibull { shape } => {
                weibull(rng, shape, mean_s / gamma_fn(1.0 + 1.0 / shape))
            }
        }
    }
}

/// Seconds to integer nanoseconds (rounded, saturating).
pub fn secs_to_ns(s: f64) -> u64 {
    if s.is_nan() || s <= 0.0 {
        0
    } else if s >= u64::MAX as f64 / 1e9 {
        u64::MAX
    } else {
        (s * 1e9).round() as u64
    }
}

/// A discrete distribution over integers (`rand`'s `WeightedIndex` over the values).
#[derive(Debug, Clone, PartialEq)]
pub struct Discrete {
    values: Vec<u64>,
    weights: Vec<f64>,
    index: WeightedIndex<f64>,
}

impl Discrete {
    /// From `(value, weight)` pairs; weights need not sum to 1. `None` if empty or all zero.
    pub fn new(pairs: &[(u64, f64)]) -> Option<Self> {
        let (values, weights): (Vec<u64>, Vec<f64>) = pairs
            .iter()
            .filter(|(_, w)| w.is_finite() && *w > 0.0)
            .copied()
            .unzip();
        let index = WeightedIndex::new(&weights).ok()?;
        Some(Self {
            values,
            weights,
            index,
        })
    }

    /// One sample.
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        self.values[self.index.sample(rng)]
    }

    /// The mean.
    pub fn mean(&self) -> f64 {
        let total: f64 = self.weights.iter().sum();
        let m: f64 = self
            .values
            .iter()
            .zip(&self.weights)
            .map(|(v, w)| *v as f64 * w)
            .sum();
        m / total
    }
}

/// Parse a Python-style dict of `{int: probability}` (ServeGen's dataset cells).
pub fn parse_py_dict(s: &str) -> Result<Vec<(u64, f64)>, ValueError> {
    let t = s.trim();
    let inner = t
        .strip_prefix('{')
        .and_then(|x| x.strip_suffix('}'))
        .ok_or_else(|| {
            ValueError::expected("a {value: probability} dict", format!("{:?}", short(t)))
        })?;
    let mut out = Vec::new();
    if inner.trim().is_empty() {
        return Ok(out);
    }
    for item in inner.split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item.split_once(':').ok_or_else(|| {
            ValueError::expected("`value: probability`", format!("{:?}", short(item)))
        })?;
        let k = k.trim();
        let key: u64 = match k.parse::<u64>() {
            Ok(x) => x,
            Err(_) => {
                // Accept integral floats such as `3.0`.
                let f: f64 = k.parse().map_err(|_| {
                    ValueError::expected("an integer key", format!("{:?}", short(k)))
                })?;
                if f.fract() != 0.0 || f < 0.0 || !f.is_finite() {
                    return Err(ValueError::expected("a non-negative integer key", k));
                }
                f as u64
            }
        };
        let p: f64 = v
            .trim()
            .parse()
            .map_err(|_| ValueError::expected("a probability", format!("{:?}", short(v.trim()))))?;
        if !(p.is_finite() && p >= 0.0) {
            return Err(ValueError::expected(
                "a non-negative probability",
                p.to_string(),
            ));
        }
        out.push((key, p));
    }
    Ok(out)
}

fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mean_cv(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let m = xs.iter().sum::<f64>() / n;
        let v = xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
        (m, v.sqrt() / m)
    }

    #[test]
    fn interarrival_samplers_hit_mean_and_cv() {
        let mut rng = Rng::new(1);
        for (ia, want_cv) in [
            (InterArrival::Exponential, 1.0),
            (InterArrival::Gamma { shape: 4.0 }, 0.5),
            (InterArrival::Gamma { shape: 0.5 }, 2f64.sqrt()),
            (InterArrival::Weibull { shape: 1.0 }, 1.0),
        ] {
            let xs: Vec<f64> = (0..200_000).map(|_| ia.sample(&mut rng, 2.0)).collect();
            let (m, cv) = mean_cv(&xs);
            assert!((m - 2.0).abs() < 0.03, "{ia:?} mean {m}");
            assert!((cv - want_cv).abs() < 0.03, "{ia:?} cv {cv}");
        }
    }

    const PINNED: [f64; 6] = [
        -0.47520591685382263,
        1.7085804489027254,
        1.4622270570732088,
        3.0693402442767472,
        2.0665058998270007,
        4.316509062242052,
    ];
    const PINNED_DISCRETE: [u64; 4] = [1, 1, 1, 5];

    #[test]
    fn draws_are_pinned() {
        // A dependency bump that moves any distribution's values fails here by name.
        let mut r = Rng::stream(7, "dist");
        let got = [
            std_normal(&mut r),
            gamma(&mut r, 0.5, 2.0),
            gamma(&mut r, 4.0, 0.5),
            weibull(&mut r, 1.5, 2.0),
            InterArrival::Exponential.sample(&mut r, 2.0),
            InterArrival::Weibull { shape: 0.7 }.sample(&mut r, 2.0),
        ];
        let d = Discrete::new(&[(1, 0.5), (5, 0.3), (9, 0.2)]).unwrap();
        let disc = [0; 4].map(|_| d.sample(&mut r));
        // Within 1e-12 relative: the algorithm, not the last bit of a platform's libm.
        for (g, p) in got.iter().zip(PINNED) {
            assert!((g - p).abs() <= 1e-12 * p.abs(), "{got:?}");
        }
        assert_eq!(disc, PINNED_DISCRETE);
    }

    #[test]
    fn gamma_fn_known_values() {
        assert!((gamma_fn(5.0) - 24.0).abs() < 1e-9);
        assert!((gamma_fn(0.5) - std::f64::consts::PI.sqrt()).abs() < 1e-9);
    }

    #[test]
    fn py_dict_parses_and_samples() {
        let d = parse_py_dict("{136: 0.25, 372: 7.5e-01}").unwrap();
        assert_eq!(d, vec![(136, 0.25), (372, 0.75)]);
        let disc = Discrete::new(&d).unwrap();
        assert!((disc.mean() - (136.0 * 0.25 + 372.0 * 0.75)).abs() < 1e-9);
        assert!(parse_py_dict("{}").unwrap().is_empty());
        assert!(parse_py_dict("[1]").is_err());
        assert!(parse_py_dict("{a: 1}").is_err());
    }
}
