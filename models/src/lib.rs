//! moonagent-models: hardware profiles, model specs, cost models and their calibration.
//!
//! The simulator asks this crate how long every piece of work takes: a vision-encoder
//! batch, a prefill chunk with a cached prefix, a decode iteration, a transfer over a link,
//! a content fingerprint on the host CPU. Inputs are data, not code: [`HardwareProfile`]s
//! (B200, H200, H100, a CPU host) and [`ModelSpec`]s (Qwen2.5-VL 3B, 7B, 72B) are TOML files
//! embedded in the binary and also loadable from a user path, validated on load (an
//! unknown field or an impossible value is an error naming the field). Costs are
//! rooflines with named efficiency factors and overheads ([`cost`]); outputs are integer
//! nanoseconds, computed without allocation and identically on every machine.
//! [`calibrate()`] fits the factors from measured samples by least squares and reports the
//! fit error overall, per group and per sample.
//!
//! ```
//! use moonagent_models::{CostModel, HardwareProfile, ModelSpec};
//! let hw = HardwareProfile::by_name("h200").unwrap();
//! let model = ModelSpec::by_name("qwen2.5-vl-7b").unwrap();
//! assert_eq!(model.kv_bytes_per_token(), 57_344);
//! let cost = CostModel::new(&hw, &model, 1).unwrap();
//! let step = cost.decode_iter_time_ns(1, 4096);
//! assert!(step > 1_000_000 && step < 10_000_000); // a few ms
//! ```

pub mod calibrate;
mod catalog;
pub mod cost;
pub mod error;
pub mod hardware;
mod lsq;
pub mod model;

pub use calibrate::{
    calibrate, calibrate_select, Calibration, CalibrationError, CalibrationReport, FittedParam,
    FormFit, Group, GroupFit, Param, Residual, Sample,
};
pub use cost::{
    decode_iter_time_ns, encoder_time_ns, fingerprint_time_ns, prefill_time_ns, transfer_time_ns,
    CostModel, Work,
};
pub use error::ModelError;
pub use hardware::{
    shared_core_rates, CoreWeights, DecodeContention, Efficiency, Flow, HardwareProfile, Host,
    Link, LinkKind, Links, Overheads, Roofline, Rooflines, StepScale,
};
pub use model::{Dtype, LlmSpec, ModelSpec, VisionSpec};

/// Round a non-negative time in ns up to a whole ns; NaN and negatives give 0, huge
/// values saturate at `u64::MAX`.
#[inline]
pub(crate) fn to_ns(x: f64) -> u64 {
    if x > 0.0 {
        // `x.ceil() as u64` without libm's `ceil` (a call on baseline x86-64, once per
        // priced step): the truncation, plus one when it dropped a fraction. Equal for
        // every positive `x` (a test compares them), saturating alike.
        let t = x as u64;
        if (t as f64) < x {
            t.saturating_add(1)
        } else {
            t
        }
    } else {
        0
    }
}

#[cfg(test)]
mod to_ns_tests {
    use super::to_ns;

    fn reference(x: f64) -> u64 {
        if x > 0.0 {
            x.ceil() as u64
        } else {
            0
        }
    }

    /// `to_ns` is `x.ceil() as u64` (0 for NaN and non-positive), edges and a sweep of
    /// bit patterns included.
    #[test]
    fn to_ns_is_ceil() {
        let edges = [
            0.0,
            -0.0,
            -1.5,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MIN_POSITIVE,
            1e-300,
            0.5,
            1.0,
            1.0 + f64::EPSILON,
            2.5,
            4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1.8446744073709552e19,
            1.844_674_407_370_955e19,
            1e30,
        ];
        for x in edges {
            assert_eq!(to_ns(x), reference(x), "{x:e}");
        }
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..1_000_000 {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let x = f64::from_bits(s >> 1); // positive (and NaN) bit patterns
            assert_eq!(to_ns(x), reference(x), "{x:e}");
            let y = (s >> 11) as f64 / 1024.0; // times of a few ns to days
            assert_eq!(to_ns(y), reference(y), "{y:e}");
        }
    }
}
