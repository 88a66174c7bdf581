//! The CPU backend's building blocks: GEMM (through `matrixmultiply`), linear layers,
//! norms, activations, rotary embedding, one attention row, weight initialisation.

use half::bf16;
use moonagent_core::rng::Rng;

use super::ComputeError;

/// `c = a * b` for row-major `a` (m x k), `b` (k x n), `c` (m x n); `c` is overwritten.
pub(crate) fn matmul(a: &[f32], m: usize, k: usize, b: &[f32], n: usize, c: &mut [f32]) {
    // The lengths are the GEMM's memory safety; they hold by construction (every caller
    // sizes its buffers from the same dimensions), so a mismatch is a bug here.
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "matmul shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: `a` holds m*k, `b` k*n and `c` m*n f32 values (checked above), row-major
    // with the strides given; `c` does not alias `a` or `b` (a `&mut` borrow).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            a.as_ptr(),
            k as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Where the dense layers' GEMMs run: the host (`matrixmultiply`) or a device.
pub(crate) trait LinearExec {
    /// `rows` rows of `x` through `layer`: rows x `layer.dout`.
    fn linear(&self, layer: &Linear, x: &[f32], rows: usize) -> Result<Vec<f32>, ComputeError>;
}

/// GEMMs on the host through `matrixmultiply`.
pub(crate) struct Host;

impl LinearExec for Host {
    fn linear(&self, layer: &Linear, x: &[f32], rows: usize) -> Result<Vec<f32>, ComputeError> {
        Ok(layer.forward(x, rows))
    }
}

/// A dense layer `y = x W (+ b)`, `W` stored `din x dout` row-major.
#[derive(Debug, Clone)]
pub(crate) struct Linear {
    pub din: usize,
    pub dout: usize,
    w: Vec<f32>,
    b: Option<Vec<f32>>,
}

impl Linear {
    /// Random N(0, 0.02) weights (and bias if `bias`) from the stream `name` under `seed`.
    pub fn random(seed: u64, name: &str, din: usize, dout: usize, bias: bool) -> Self {
        let mut rng = Rng::stream(seed, name);
        let w = normal(&mut rng, din * dout);
        let b = bias.then(|| normal(&mut rng, dout));
        Self { din, dout, w, b }
    }

    /// A bias-free layer with the given weights (`din x dout` row-major).
    pub fn from_weights(din: usize, dout: usize, w: Vec<f32>) -> Self {
        Self {
            din,
            dout,
            w,
            b: None,
        }
    }

    /// The weights, `din x dout` row-major.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn weights(&self) -> &[f32] {
        &self.w
    }

    /// Add the bias (if any) to each `dout`-wide row of `y`.
    pub fn add_bias(&self, y: &mut [f32]) {
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(self.dout) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
    }

    /// `rows` rows of `x` (rows x din) through the layer: rows x dout.
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0.0; rows * self.dout];
        matmul(x, rows, self.din, &self.w, self.dout, &mut y);
        self.add_bias(&mut y);
        y
    }
}

/// Standard deviation of every random weight.
const INIT_STD: f64 = 0.02;

/// `n` values N(0, 0.02) (Box-Muller over the stream's uniforms).
pub(crate) fn normal(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let u1 = 1.0 - rng.next_f64(); // (0, 1]
        let u2 = rng.next_f64();
        let r = (-2.0 * u1.ln()).sqrt() * INIT_STD;
        let t = std::f64::consts::TAU * u2;
        out.push((r * t.cos()) as f32);
        if out.len() < n {
            out.push((r * t.sin()) as f32);
        }
    }
    out
}

/// RMSNorm of each `dim`-wide row of `x` with scale `w` (eps 1e-6), into a new buffer.
pub(crate) fn rms_norm(x: &[f32], dim: usize, w: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for (o, row) in out.chunks_exact_mut(dim).zip(x.chunks_exact(dim)) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let inv = 1.0 / (ms + 1e-6).sqrt();
        for ((o, v), s) in o.iter_mut().zip(row).zip(w) {
            *o = v * inv * s;
        }
    }
    out
}

/// `x += y`, elementwise.
pub(crate) fn add_into(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation.
#[inline]
pub(crate) fn gelu(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

/// Gated SiLU over rows of `[gate | up]` (each `inter` wide): rows x inter.
pub(crate) fn swiglu(gate_up: &[f32], inter: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(gate_up.len() / 2);
    for row in gate_up.chunks_exact(2 * inter) {
        let (g, u) = row.split_at(inter);
        out.extend(g.iter().zip(u).map(|(g, u)| silu(*g) * u));
    }
    out
}

/// Rotary embedding (rotate-half convention) of one head vector at the angles whose
/// cosines and sines are `cos`, `sin` (each `head_dim / 2`).
#[inline]
pub(crate) fn rope(v: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = v.len() / 2;
    let (a, b) = v.split_at_mut(half);
    for i in 0..half {
        let (x, y) = (a[i], b[i]);
        a[i] = x * cos[i] - y * sin[i];
        b[i] = y * cos[i] + x * sin[i];
    }
}

/// Dot product with eight running sums (vectorisable, and a fixed order).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Attention of one query row over the first `n` keys and values (each `n x head_dim`,
/// position-major), scaled by `1/sqrt(head_dim)`, written to `out` (`head_dim`).
/// `scores` is scratch. The result depends only on `q` and those `n` keys and values.
pub(crate) fn attend_row(
    q: &[f32],
    keys: &[f32],
    vals: &[f32],
    n: usize,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let hd = q.len();
    let scale = 1.0 / (hd as f32).sqrt();
    scores.clear();
    scores.extend(keys[..n * hd].chunks_exact(hd).map(|k| dot(q, k) * scale));
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (p, v) in scores.iter().zip(vals[..n * hd].chunks_exact(hd)) {
        let p = p * inv;
        for (o, x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
}

/// f32 values as bf16 little-endian bytes.
pub(crate) fn to_bf16_bytes(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() * 2);
    for v in x {
        out.extend_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes());
    }
    out
}

/// bf16 little-endian bytes as f32 values, appended to `out`.
pub(crate) fn extend_from_bf16_bytes(out: &mut Vec<f32>, bytes: &[u8]) {
    out.extend(
        bytes
            .chunks_exact(2)
            .map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
    );
}
