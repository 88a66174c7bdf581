//! The CPU backend's building blocks: GEMM (through `matrixmultiply`), linear layers,
//! norms, activations, rotary embedding, attention as two GEMMs, weight initialisation.

use half::bf16;
use moonagent_core::rng::Rng;

use super::ComputeError;

/// `c = a * b` for row-major `a` (m x k), `b` (k x n), `c` (m x n); `c` is overwritten.
pub(crate) fn matmul(a: &[f32], m: usize, k: usize, b: &[f32], n: usize, c: &mut [f32]) {
    sgemm(a, m, k, b, (n as isize, 1), n, c, "matmul shapes");
}

/// `c = a * b^T` for row-major `a` (m x k), `b` (n x k), `c` (m x n); `c` is overwritten.
pub(crate) fn matmul_bt(a: &[f32], m: usize, k: usize, b: &[f32], n: usize, c: &mut [f32]) {
    // `b` read as its transpose (k x n): row stride 1, column stride k.
    sgemm(a, m, k, b, (1, k as isize), n, c, "matmul_bt shapes");
}

/// `c = a * B` where `B` (k x n) is `b` read with `(row, column)` strides `b_strides`.
#[allow(clippy::too_many_arguments)]
fn sgemm(
    a: &[f32],
    m: usize,
    k: usize,
    b: &[f32],
    b_strides: (isize, isize),
    n: usize,
    c: &mut [f32],
    what: &str,
) {
    // The lengths are the GEMM's memory safety; they hold by construction (every caller
    // sizes its buffers from the same dimensions), so a mismatch is a bug here. `b` holds
    // k*n values either way.
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "{what}"
    );
    if m == 0 || n == 0 {
        crate::cores::checkpoint();
        return;
    }
    // Tiles of about CHECKPOINT_MACS multiply-adds, each after an operator boundary where
    // a step sharing the host's cores may hand its core over: the hand-over granularity is
    // then a fraction of a millisecond whatever the layer's size, the same for every kind
    // of step (with whole GEMMs as boundaries the ViT's, several ms each, would hold a core
    // far longer than a decode iteration's). Tiles are at least TILE_ROWS x TILE_COLS, so
    // packing (sgemm packs the A rows and B columns of each call) stays a small part of a
    // call's work. Every element's result is that of one call over the whole matrices:
    // sgemm computes each element of C from its row of A, its column of B and the same
    // k-blocks, whatever the tile.
    let (rows_per, cols_per) = if m * k * n <= CHECKPOINT_MACS {
        (m, n)
    } else {
        let rows = TILE_ROWS.min(m);
        let cols = (CHECKPOINT_MACS / (rows * k).max(1))
            .max(TILE_COLS)
            .next_multiple_of(16);
        (rows, cols.min(n))
    };
    for r0 in (0..m).step_by(rows_per) {
        let rows = rows_per.min(m - r0);
        for c0 in (0..n).step_by(cols_per) {
            let cols = cols_per.min(n - c0);
            crate::cores::checkpoint();
            // SAFETY: `a` holds m*k values (row-major, strides k, 1), `b` k*n values read
            // with `b_strides` (row-major B: (n, 1); B = b^T of an n x k `b`: (1, k)), `c`
            // m*n values (strides n, 1), all checked above; rows `r0..r0 + rows` of A and
            // C and columns `c0..c0 + cols` of B and C are inside them; `c` does not alias
            // `a` or `b` (a `&mut` borrow).
            unsafe {
                matrixmultiply::sgemm(
                    rows,
                    k,
                    cols,
                    1.0,
                    a.as_ptr().add(r0 * k),
                    k as isize,
                    1,
                    b.as_ptr().offset(c0 as isize * b_strides.1),
                    b_strides.0,
                    b_strides.1,
                    0.0,
                    c.as_mut_ptr().add(r0 * n + c0),
                    n as isize,
                    1,
                );
            }
        }
    }
}

/// About the most multiply-adds one sgemm call does between two operator boundaries
/// ([`crate::cores::checkpoint`]): 2^22, ~0.1-0.2 ms on one core of the 2-core VM.
const CHECKPOINT_MACS: usize = 1 << 22;
/// The smallest tile of a split GEMM: rows of A and C ...
const TILE_ROWS: usize = 128;
/// ... and columns of B and C.
const TILE_COLS: usize = 128;

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

/// Load the first value of every 64-byte line of `v`, in pieces of [`TOUCH_PIECE`] values,
/// while `go` holds (asked before each piece): the lines are then recently used in the
/// caches. Reads only. Returns the bytes covered and the loads' sum (which the caller
/// keeps, so the loads are not optimised away).
pub(crate) fn touch(v: &[f32], go: &dyn Fn() -> bool) -> (u64, f32) {
    let (mut bytes, mut sum) = (0u64, 0f32);
    for piece in v.chunks(TOUCH_PIECE) {
        if !go() {
            break;
        }
        sum += piece.iter().step_by(16).sum::<f32>();
        bytes += std::mem::size_of_val(piece) as u64;
    }
    (bytes, sum)
}

/// Values [`touch`] reads between two checks of its `go` (256 KiB of f32).
pub(crate) const TOUCH_PIECE: usize = 1 << 16;

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

    /// `f` on the weights, then the bias if any.
    pub fn tensors(&self, f: &mut dyn FnMut(&[f32])) {
        f(&self.w);
        if let Some(b) = &self.b {
            f(b);
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

/// `2^x` for `x <= 0` (softmax exponents in base 2), branch-free so a loop of it
/// vectorises: Cephes' `expf` range reduction and polynomial (about 2 ulp), with `x`
/// clamped below at -125 (whose power, 2.4e-38, is negligible beside the row maximum's 1).
#[inline(always)]
fn exp2_neg(x: f32) -> f32 {
    // 1.5 * 2^23: adding it rounds to an integer, held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.max(-125.0);
    let t = x + MAGIC;
    let n = t - MAGIC;
    // e^r with r = (x - n) ln 2 in [-ln2/2, ln2/2].
    let r = (x - n) * std::f32::consts::LN_2;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * r * r + r + 1.0;
    // 2^n from the integer in t's mantissa (n in [-125, 0]).
    let bits = (t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32 + 127) << 23;
    e * f32::from_bits(bits as u32)
}

/// Query rows per attention GEMM (a block of a long prefill's rows): the block's scores
/// (`rows x keys` f32) stay in cache.
pub(crate) const ATTN_ROWS: usize = 256;

/// Scratch of [`attention`], grown to the largest call and reused (no allocation per row).
#[derive(Debug, Default)]
pub(crate) struct AttnScratch {
    /// Keys of one head, position-major (`keys x head_dim`), f32.
    pub k: Vec<f32>,
    /// Values of one head, position-major (`keys x head_dim`), f32.
    pub v: Vec<f32>,
    /// Query rows (`rows x head_dim`).
    pub q: Vec<f32>,
    /// Scores, then probabilities (`rows x keys`).
    s: Vec<f32>,
    /// Output rows (`rows x head_dim`), after [`attention`].
    pub o: Vec<f32>,
    /// Each row's 1 / (sum of its softmax numerators).
    inv: Vec<f32>,
}

/// Attention of the `rows` query rows in `sc.q` over the first `keys` keys and values in
/// `sc.k`, `sc.v` (each `head_dim` wide), as two GEMMs, in the manner of a fused
/// attention kernel: the queries are scaled by `log2(e) / sqrt(head_dim)`; `S = Q K^T`
/// (sgemm); per row the mask (row `r` sees keys `0..visible(r)`, at least one and at most
/// `keys`) and a max-subtracted softmax numerator `2^(s - max)` in f32; `O = P V` (sgemm)
/// into `sc.o` (`rows x head_dim`), each row then divided by its sum.
///
/// A row's result depends only on its query and its visible keys and values, not on
/// `rows`, `keys` or the other rows: sgemm computes each score as the same dot product
/// whatever the matrix shape (`head_dim` is one k-block; edge tiles run the same kernel
/// into a buffer), masked probabilities are exact zeros, and `P V` sums over keys in
/// k-blocks at fixed offsets from key 0 (`matrixmultiply`'s `kc`, 256), sequentially
/// within a block, so the zeros past a row's last visible key add nothing.
pub(crate) fn attention(
    sc: &mut AttnScratch,
    rows: usize,
    head_dim: usize,
    keys: usize,
    visible: impl Fn(usize) -> usize,
) {
    sc.s.resize(rows * keys, 0.0);
    sc.o.resize(rows * head_dim, 0.0);
    sc.inv.clear();
    if rows == 0 || keys == 0 {
        return;
    }
    let scale = std::f32::consts::LOG2_E / (head_dim as f32).sqrt();
    for v in &mut sc.q[..rows * head_dim] {
        *v *= scale;
    }
    matmul_bt(&sc.q, rows, head_dim, &sc.k, keys, &mut sc.s);
    for (r, row) in sc.s.chunks_exact_mut(keys).enumerate() {
        if r % 64 == 63 {
            // An operator boundary inside a long softmax (the ViT's full attention).
            crate::cores::checkpoint();
        }
        let (seen, masked) = row.split_at_mut(visible(r).clamp(1, keys));
        masked.fill(0.0);
        sc.inv.push(1.0 / softmax_numerator(seen));
    }
    matmul(&sc.s, rows, keys, &sc.v, head_dim, &mut sc.o);
    for (o, inv) in sc.o.chunks_exact_mut(head_dim).zip(&sc.inv) {
        for v in o {
            *v *= inv;
        }
    }
}

/// `x <- 2^(x - max x)`; returns the sum. On x86-64 with AVX2 the same code is compiled
/// for 8-wide vectors: the same IEEE operations lane by lane (Rust never fuses a multiply
/// and an add), so the same bits as the baseline 4-wide build.
fn softmax_numerator(x: &mut [f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { softmax_numerator_avx2(x) };
    }
    softmax_numerator_generic(x)
}

/// [`softmax_numerator`] compiled for AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_numerator_avx2(x: &mut [f32]) -> f32 {
    softmax_numerator_generic(x)
}

/// [`softmax_numerator`]: eight running maxima and sums (vectorisable, and a fixed order).
#[inline(always)]
fn softmax_numerator_generic(x: &mut [f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = x.chunks_exact(8);
    let mut max = chunks
        .remainder()
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    for c in chunks {
        for (m, v) in lanes.iter_mut().zip(c) {
            *m = m.max(*v);
        }
    }
    max = lanes.iter().copied().fold(max, f32::max);
    let mut sums = [0.0f32; 8];
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        for (s, v) in sums.iter_mut().zip(c.iter_mut()) {
            *v = exp2_neg(*v - max);
            *s += *v;
        }
    }
    let mut sum: f32 = sums.iter().sum();
    for v in chunks.into_remainder() {
        *v = exp2_neg(*v - max);
        sum += *v;
    }
    sum
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass covers every piece while `go` holds and stops at the first one it refuses;
    /// the sum is of every 16th value (one per 64-byte line).
    #[test]
    fn touch_stops_at_the_first_refused_piece() {
        let v = vec![1f32; 2 * TOUCH_PIECE + 5];
        assert_eq!(
            touch(&v, &|| true),
            (4 * v.len() as u64, v.len().div_ceil(16) as f32)
        );
        let asked = std::cell::Cell::new(0);
        let one = || {
            asked.set(asked.get() + 1);
            asked.get() == 1
        };
        assert_eq!(
            touch(&v, &one),
            (4 * TOUCH_PIECE as u64, (TOUCH_PIECE / 16) as f32)
        );
        assert_eq!(asked.get(), 2, "asked before each piece, up to the refusal");
        assert_eq!(touch(&v, &|| false), (0, 0.0));
    }

    #[test]
    fn exp2_neg_is_close_to_exp2() {
        for i in 0..=130_000 {
            let x = -(i as f32) * 1e-3;
            let (got, want) = (exp2_neg(x), x.exp2());
            if x >= -125.0 {
                assert!((got - want).abs() <= 4e-7 * want, "{x}: {got} vs {want}");
            } else {
                assert!(got < 3e-38, "{x}: {got}");
            }
        }
        assert_eq!(exp2_neg(0.0), 1.0);
        assert!(exp2_neg(f32::NEG_INFINITY) < 3e-38);
    }

    /// A GEMM done in tiles between checkpoints gives the bits of one sgemm call over the
    /// whole matrices, for shapes split into several tiles (ragged last ones) and not.
    #[test]
    fn a_gemm_in_tiles_is_the_same_bits_as_one_call() {
        let mut rng = Rng::stream(3, "row blocks");
        for (m, k, n) in [
            (1000, 192, 576),
            (257, 256, 384),
            (300, 704, 4000),
            (5, 64, 64),
        ] {
            assert_eq!(m * k * n > CHECKPOINT_MACS, m > 5, "{m}x{k}x{n}");
            let a = normal(&mut rng, m * k);
            let b = normal(&mut rng, k * n);
            let mut blocks = vec![0.0; m * n];
            matmul(&a, m, k, &b, n, &mut blocks);
            let mut whole = vec![0.0; m * n];
            // SAFETY: the buffers are sized m*k, k*n and m*n, row-major.
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
                    whole.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&blocks) == bits(&whole), "{m}x{k}x{n}");
            // The same through `matmul_bt`, with B given transposed (n x k).
            let mut bt = vec![0.0; n * k];
            for (i, row) in b.chunks_exact(n).enumerate() {
                for (j, v) in row.iter().enumerate() {
                    bt[j * k + i] = *v;
                }
            }
            let mut tiles_bt = vec![0.0; m * n];
            matmul_bt(&a, m, k, &bt, n, &mut tiles_bt);
            assert!(bits(&tiles_bt) == bits(&whole), "bt {m}x{k}x{n}");
        }
    }

    /// The AVX2 build of the softmax gives the baseline build's bits.
    #[test]
    fn softmax_is_the_same_bits_in_every_build() {
        let mut rng = Rng::stream(2, "softmax test");
        for n in [1, 7, 8, 9, 64, 301] {
            let x: Vec<f32> = normal(&mut rng, n).iter().map(|v| v * 400.0).collect();
            let (mut a, mut b) = (x.clone(), x);
            let (sa, sb) = (softmax_numerator(&mut a), softmax_numerator_generic(&mut b));
            assert_eq!(sa.to_bits(), sb.to_bits());
            assert_eq!(a, b);
        }
    }

    /// GEMM attention against a direct f64 evaluation, with a causal-style mask.
    #[test]
    fn attention_matches_a_direct_evaluation() {
        let (rows, hd, keys) = (37, 32, 300);
        let mut rng = Rng::stream(1, "attention test");
        let mut sc = AttnScratch {
            k: normal(&mut rng, keys * hd)
                .iter()
                .map(|v| v * 50.0)
                .collect(),
            v: normal(&mut rng, keys * hd)
                .iter()
                .map(|v| v * 50.0)
                .collect(),
            ..AttnScratch::default()
        };
        let q: Vec<f32> = normal(&mut rng, rows * hd)
            .iter()
            .map(|v| v * 50.0)
            .collect();
        sc.q = q.clone();
        let visible = |r: usize| keys - rows + 1 + r;
        attention(&mut sc, rows, hd, keys, visible);
        for r in 0..rows {
            let qr = &q[r * hd..(r + 1) * hd];
            let n = visible(r);
            let s: Vec<f64> = (0..n)
                .map(|j| {
                    let k = &sc.k[j * hd..(j + 1) * hd];
                    let d: f64 = qr
                        .iter()
                        .zip(k)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum();
                    d / (hd as f64).sqrt()
                })
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            for d in 0..hd {
                let want: f64 = (0..n)
                    .map(|j| e[j] * f64::from(sc.v[j * hd + d]))
                    .sum::<f64>()
                    / sum;
                let got = f64::from(sc.o[r * hd + d]);
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{r} {d}: {got} vs {want}"
                );
            }
        }
    }
}
