//! Mean and two-sided 95% confidence interval over seeds (Student's t with n - 1 degrees
//! of freedom: seeds are few, so the normal 1.96 would be too narrow).

/// t quantile at 0.975 for 1..=30 degrees of freedom.
const T975: [f64; 30] = [
    12.706_204_7,
    4.302_652_7,
    3.182_446_3,
    2.776_445_1,
    2.570_581_8,
    2.446_911_9,
    2.364_624_3,
    2.306_004_1,
    2.262_157_2,
    2.228_138_9,
    2.200_985_2,
    2.178_812_8,
    2.160_368_7,
    2.144_786_7,
    2.131_449_5,
    2.119_905_3,
    2.109_815_6,
    2.100_922_0,
    2.093_024_1,
    2.085_963_4,
    2.079_613_8,
    2.073_873_1,
    2.068_657_6,
    2.063_898_6,
    2.059_538_6,
    2.055_529_4,
    2.051_830_5,
    2.048_407_1,
    2.045_229_6,
    2.042_272_5,
];

/// The 0.975 quantile of Student's t with `df` degrees of freedom (exact table to 30,
/// a Cornish-Fisher expansion beyond, accurate to 1e-4).
pub fn t975(df: u64) -> f64 {
    if df == 0 {
        return f64::NAN;
    }
    if let Some(t) = T975.get(df as usize - 1) {
        return *t;
    }
    let z = 1.959_963_984_540_054_f64;
    let n = df as f64;
    let (z3, z5, z7) = (z.powi(3), z.powi(5), z.powi(7));
    z + (z3 + z) / (4.0 * n)
        + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * n * n)
        + (3.0 * z7 + 19.0 * z5 + 17.0 * z3 - 15.0 * z) / (384.0 * n * n * n)
}

/// Mean and 95% interval of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanCi {
    /// Sample size.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Half-width of the interval (`None` with fewer than two values).
    pub half: Option<f64>,
}

impl MeanCi {
    /// Summarise `xs` (summed in the order given, so equal inputs give equal bits).
    pub fn of(xs: &[f64]) -> Self {
        let n = xs.len();
        if n == 0 {
            return Self {
                n,
                mean: f64::NAN,
                half: None,
            };
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        let half = (n >= 2).then(|| {
            let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            t975(n as u64 - 1) * (var / n as f64).sqrt()
        });
        Self { n, mean, half }
    }

    /// Lower end of the interval.
    pub fn lo(&self) -> Option<f64> {
        self.half.map(|h| self.mean - h)
    }

    /// Upper end of the interval.
    pub fn hi(&self) -> Option<f64> {
        self.half.map(|h| self.mean + h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_join_the_table_smoothly_and_tend_to_the_normal() {
        assert!((t975(30) - 2.0423).abs() < 1e-4);
        assert!((t975(31) - 2.0395).abs() < 1e-4);
        assert!((t975(60) - 2.0003).abs() < 1e-4);
        assert!((t975(1_000_000) - 1.96).abs() < 1e-3);
        assert!(t975(0).is_nan());
    }

    #[test]
    fn mean_ci_of_a_small_sample() {
        let m = MeanCi::of(&[1.0, 2.0, 3.0]);
        assert_eq!(m.mean, 2.0);
        // s = 1, n = 3: half = 4.3027 / sqrt(3)
        assert!((m.half.unwrap() - 4.302_652_7 / 3f64.sqrt()).abs() < 1e-9);
        assert_eq!(MeanCi::of(&[5.0]).half, None);
        assert_eq!(MeanCi::of(&[5.0]).mean, 5.0);
    }
}
