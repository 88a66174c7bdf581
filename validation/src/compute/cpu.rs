//! `CpuCompute`: the operators of a [`ModelSpec`] on the CPU, f32 compute over
//! `matrixmultiply`'s sgemm, bf16 storage.

use moonagent_core::rng::Rng;
use moonagent_models::ModelSpec;

use super::kv::KvArena;
use super::ops::{
    add_into, attention, extend_from_bf16_bytes, gelu, normal, rms_norm, rope, swiglu,
    to_bf16_bytes, AttnScratch, Host, Linear, LinearExec, ATTN_ROWS,
};
use rayon::prelude::*;

use super::{
    text_token, Compute, ComputeError, DecodeSeq, ImageInput, KvPages, PrefillChunk, Rows,
};

/// Largest model (LLM + ViT parameters) the CPU backend builds: 2^28 parameters, 1 GiB of
/// f32 weights. The real checkpoints' specs are refused instead of exhausting memory.
pub const MAX_PARAMS: u64 = 1 << 28;

/// `f` with this thread's attention scratch: a parallel attention task reuses its thread's
/// buffers (a fresh `rows x keys` score matrix per task costs more in page faults and
/// zeroing than the task's GEMMs).
fn with_scratch<T>(f: impl FnOnce(&mut AttnScratch) -> T) -> T {
    thread_local! {
        static SCRATCH: std::cell::RefCell<AttnScratch> = Default::default();
    }
    SCRATCH.with_borrow_mut(f)
}

/// RoPE base of Qwen2.5 (`rope_theta`).
const ROPE_THETA: f64 = 1_000_000.0;

#[derive(Debug, Clone)]
struct LlmLayer {
    ln1: Vec<f32>,
    /// Fused q, k, v projection (`hidden -> q_dim + 2 kv_dim`), bias if `qkv_bias`.
    qkv: Linear,
    o: Linear,
    ln2: Vec<f32>,
    /// Fused gate and up projections (`hidden -> 2 intermediate`).
    gate_up: Linear,
    down: Linear,
}

#[derive(Debug, Clone)]
struct VitBlock {
    ln1: Vec<f32>,
    /// Fused q, k, v (`hidden -> 3 hidden`, bias).
    qkv: Linear,
    proj: Linear,
    ln2: Vec<f32>,
    gate_up: Linear,
    down: Linear,
    /// Whether the block attends over the whole image (else within windows).
    full: bool,
}

/// The CPU implementation of [`Compute`]: deterministic random weights for a spec, f32
/// compute, bf16 KV pages in a host [`KvArena`]. Single-threaded per call; share one
/// instance between worker threads (it is immutable).
#[derive(Debug, Clone)]
pub struct CpuCompute {
    spec: ModelSpec,
    seed: u64,
    /// Whether one call's attention heads run on the host's cores at once (rayon), not one
    /// by one on the calling thread ([`CpuCompute::with_parallel_attention`]).
    parallel_attention: bool,
    // LLM.
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
    embed: Vec<f32>,
    layers: Vec<LlmLayer>,
    final_norm: Vec<f32>,
    lm_head: Linear,
    inv_freq: Vec<f64>,
    // ViT.
    v_hidden: usize,
    v_heads: usize,
    v_inter: usize,
    patch_len: usize,
    merge: usize,
    window: usize,
    patch_embed: Linear,
    blocks: Vec<VitBlock>,
    merger_ln: Vec<f32>,
    merger_fc1: Linear,
    merger_fc2: Linear,
}

/// One sequence's rows in a stacked LLM batch.
struct SeqRows<'a> {
    pages: &'a [u32],
    /// Position of its first new row (tokens already cached).
    start: usize,
    /// New rows.
    n: usize,
    /// Index of its first row in the stacked batch.
    row0: usize,
}

impl CpuCompute {
    /// Build `spec` with weights drawn under `seed` (streams named
    /// `<spec name>/<tensor>`). Fails on an invalid spec, a dtype other than 2 bytes, an
    /// odd head dimension (RoPE), or a model above [`MAX_PARAMS`] parameters.
    pub fn new(spec: &ModelSpec, seed: u64) -> Result<Self, ComputeError> {
        Self::with_max_params(spec, seed, MAX_PARAMS)
    }

    /// This model with each call's attention spread over the host's cores (one task per
    /// sequence and KV head, or per ViT window and head), for a backend whose GEMMs run
    /// elsewhere (the CUDA one) and whose host is otherwise idle. The results are the same
    /// bits as one head after another. The CPU backend keeps it off: its workers already
    /// share the cores, one thread each, as its profile's contention fit assumes.
    pub fn with_parallel_attention(mut self, on: bool) -> Self {
        self.parallel_attention = on;
        self
    }

    /// [`CpuCompute::new`] with another ceiling on the parameter count (a GPU backend
    /// whose host has the memory for a real checkpoint's shapes: 4 bytes a parameter).
    pub fn with_max_params(
        spec: &ModelSpec,
        seed: u64,
        max_params: u64,
    ) -> Result<Self, ComputeError> {
        spec.validate()?;
        let unsupported = |reason: String| ComputeError::Unsupported {
            model: spec.name.clone(),
            reason,
        };
        if spec.dtype_bytes() != 2 {
            return Err(unsupported(format!(
                "KV and encoder outputs are stored as bf16 (2 bytes); the spec's dtype is {} bytes",
                spec.dtype_bytes()
            )));
        }
        if spec.head_dim() % 2 != 0 {
            return Err(unsupported(format!(
                "rotary embedding needs an even head_dim, found {}",
                spec.head_dim()
            )));
        }
        let params = spec.llm_params().saturating_add(spec.vision_params());
        if params > max_params {
            return Err(unsupported(format!(
                "{params} parameters; this backend builds at most {max_params} \
                 (use a scaled spec such as qwen2.5-vl-tiny)"
            )));
        }
        let l = &spec.llm;
        let v = &spec.vision;
        let name = |t: &str| format!("{}/{t}", spec.name);
        let ones = |n: usize| vec![1.0f32; n];
        let hidden = l.hidden_size as usize;
        let heads = l.num_attention_heads as usize;
        let kv_heads = l.num_key_value_heads as usize;
        let head_dim = spec.head_dim() as usize;
        let inter = l.intermediate_size as usize;
        let vocab = l.vocab_size as usize;
        let q_dim = heads * head_dim;
        let kv_dim = kv_heads * head_dim;

        // Every tensor draws from a stream of its own name, so building them on all cores
        // at once gives the same weights as one by one (a real checkpoint's shapes take
        // minutes on one core).
        let (embed, layers) = rayon::join(
            || {
                normal(
                    &mut Rng::stream(seed, &name("llm.embed_tokens")),
                    vocab * hidden,
                )
            },
            || {
                (0..l.num_hidden_layers as usize)
                    .into_par_iter()
                    .map(|i| {
                        let t = |s: &str| name(&format!("llm.layers.{i}.{s}"));
                        LlmLayer {
                            ln1: ones(hidden),
                            qkv: Linear::random(
                                seed,
                                &t("qkv"),
                                hidden,
                                q_dim + 2 * kv_dim,
                                l.qkv_bias,
                            ),
                            o: Linear::random(seed, &t("o_proj"), q_dim, hidden, false),
                            ln2: ones(hidden),
                            gate_up: Linear::random(seed, &t("gate_up"), hidden, 2 * inter, false),
                            down: Linear::random(seed, &t("down_proj"), inter, hidden, false),
                        }
                    })
                    .collect::<Vec<_>>()
            },
        );
        let lm_head = if l.tie_word_embeddings {
            // The head is the embedding table, transposed to hidden x vocab.
            let mut w = vec![0.0; hidden * vocab];
            for (t, row) in embed.chunks_exact(hidden).enumerate() {
                for (d, x) in row.iter().enumerate() {
                    w[d * vocab + t] = *x;
                }
            }
            Linear::from_weights(hidden, vocab, w)
        } else {
            Linear::random(seed, &name("llm.lm_head"), hidden, vocab, false)
        };
        let half = head_dim / 2;
        let inv_freq = (0..half)
            .map(|i| ROPE_THETA.powf(-2.0 * i as f64 / head_dim as f64))
            .collect();

        let v_hidden = v.hidden_size as usize;
        let v_inter = v.intermediate_size as usize;
        let p = v.patch_size as usize;
        let patch_len = v.in_channels as usize * v.temporal_patch_size as usize * p * p;
        let merge = spec.patches_per_visual_token() as usize;
        let blocks = (0..v.depth as usize)
            .into_par_iter()
            .map(|i| {
                let t = |s: &str| name(&format!("visual.blocks.{i}.{s}"));
                VitBlock {
                    ln1: ones(v_hidden),
                    qkv: Linear::random(seed, &t("qkv"), v_hidden, 3 * v_hidden, true),
                    proj: Linear::random(seed, &t("proj"), v_hidden, v_hidden, true),
                    ln2: ones(v_hidden),
                    gate_up: Linear::random(seed, &t("gate_up"), v_hidden, 2 * v_inter, true),
                    down: Linear::random(seed, &t("down_proj"), v_inter, v_hidden, true),
                    full: v.fullatt_block_indexes.contains(&(i as u32)),
                }
            })
            .collect();
        let m = merge * v_hidden;
        Ok(Self {
            spec: spec.clone(),
            seed,
            parallel_attention: false,
            hidden,
            heads,
            kv_heads,
            head_dim,
            inter,
            vocab,
            embed,
            layers,
            final_norm: ones(hidden),
            lm_head,
            inv_freq,
            v_hidden,
            v_heads: v.num_heads as usize,
            v_inter,
            patch_len,
            merge,
            window: spec.vision_window_patches().max(1) as usize,
            patch_embed: Linear::random(
                seed,
                &name("visual.patch_embed"),
                patch_len,
                v_hidden,
                false,
            ),
            blocks,
            merger_ln: ones(v_hidden),
            merger_fc1: Linear::random(seed, &name("visual.merger.mlp.0"), m, m, true),
            merger_fc2: Linear::random(
                seed,
                &name("visual.merger.mlp.2"),
                m,
                v.out_hidden_size as usize,
                true,
            ),
        })
    }

    /// `f` on every tensor a step reads whole: each LLM layer's, the final norm and LM
    /// head, the ViT's blocks, patch embedding and merger. Not the token embedding table,
    /// of which a step reads only its tokens' rows.
    fn tensors(&self, f: &mut dyn FnMut(&[f32])) {
        // A transformer block's tensors, LLM layer or ViT block alike.
        let mut block =
            |ln1: &[f32], qkv: &Linear, out: &Linear, ln2: &[f32], mlp: [&Linear; 2]| {
                f(ln1);
                qkv.tensors(f);
                out.tensors(f);
                f(ln2);
                mlp.iter().for_each(|l| l.tensors(f));
            };
        for l in &self.layers {
            block(&l.ln1, &l.qkv, &l.o, &l.ln2, [&l.gate_up, &l.down]);
        }
        for b in &self.blocks {
            block(&b.ln1, &b.qkv, &b.proj, &b.ln2, [&b.gate_up, &b.down]);
        }
        f(&self.final_norm);
        self.lm_head.tensors(f);
        self.patch_embed.tensors(f);
        f(&self.merger_ln);
        self.merger_fc1.tensors(f);
        self.merger_fc2.tensors(f);
    }

    /// The seed the weights were drawn under.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn check_arena(&self, kv: &KvArena) -> Result<(), ComputeError> {
        let expected = self.spec.kv_bytes_per_token();
        if kv.layout() != (self.layers.len(), self.kv_heads * self.head_dim) {
            return Err(ComputeError::ArenaMismatch {
                expected,
                found: kv.kv_bytes_per_token(),
            });
        }
        Ok(())
    }

    /// The processed pixels of one image: `patches x patch_len` values in [-1, 1).
    fn pixels(&self, img: &ImageInput, out: &mut Vec<f32>) {
        let n = img.visual_tokens as usize * self.merge * self.patch_len;
        let mut rng = Rng::stream(img.seed, "moonagent/compute/pixels");
        out.extend((0..n).map(|_| (rng.next_f64() * 2.0 - 1.0) as f32));
    }

    /// Attention of head `head` of the patches `s..e` among themselves (one window, or one
    /// whole image): `S = Q K^T` and `O = P V` as GEMMs over the window's rows, the result
    /// in `sc.o` (`(e - s) x head_dim`).
    fn vit_head(&self, qkv: &[f32], s: usize, e: usize, head: usize, sc: &mut AttnScratch) {
        let h = self.v_hidden;
        let hd = h / self.v_heads;
        let n = e - s;
        let cols = head * hd..(head + 1) * hd;
        sc.q.clear();
        sc.k.clear();
        sc.v.clear();
        for row in qkv[s * 3 * h..e * 3 * h].chunks_exact(3 * h) {
            sc.q.extend_from_slice(&row[cols.clone()]);
            sc.k.extend_from_slice(&row[h + cols.start..h + cols.end]);
            sc.v.extend_from_slice(&row[2 * h + cols.start..2 * h + cols.end]);
        }
        attention(sc, n, hd, n, |_| n);
    }

    /// Every head's attention within each of `wins` (patch ranges), into `attn`
    /// (`patches x v_hidden`): on the calling thread, or with parallel attention one task
    /// per window and head (the same arithmetic, so the same bits).
    fn vit_attention(&self, qkv: &[f32], wins: &[(usize, usize)], attn: &mut [f32]) {
        let h = self.v_hidden;
        let hd = h / self.v_heads;
        let mut put = |(s, e): (usize, usize), head: usize, o: &[f32]| {
            for (r, o) in (s..e).zip(o.chunks_exact(hd)) {
                attn[r * h + head * hd..r * h + (head + 1) * hd].copy_from_slice(o);
            }
        };
        if self.parallel_attention {
            let tasks: Vec<_> = wins
                .iter()
                .flat_map(|&w| (0..self.v_heads).map(move |head| (w, head)))
                .collect();
            let outs: Vec<Vec<f32>> = tasks
                .par_iter()
                .map(|&((s, e), head)| {
                    with_scratch(|sc| {
                        self.vit_head(qkv, s, e, head, sc);
                        sc.o.clone()
                    })
                })
                .collect();
            for (&(w, head), o) in tasks.iter().zip(&outs) {
                put(w, head, o);
            }
        } else {
            let mut sc = AttnScratch::default();
            for &w in wins {
                for head in 0..self.v_heads {
                    self.vit_head(qkv, w.0, w.1, head, &mut sc);
                    put(w, head, &sc.o);
                }
            }
        }
    }

    /// Causal attention of sequence `s`'s new tokens `i0..i1` for the query heads of KV
    /// head `g`, with that head's keys and values of (at least) positions
    /// `0..s.start + i1` already in `sc.k`, `sc.v`; the output (`tokens x group *
    /// head_dim`, rows of a token's `group` heads) is left in `sc.o`.
    fn attend_block(
        &self,
        qkv: &[f32],
        s: &SeqRows<'_>,
        g: usize,
        (i0, i1): (usize, usize),
        sc: &mut AttnScratch,
    ) {
        let hd = self.head_dim;
        let width = (self.heads + 2 * self.kv_heads) * hd;
        let group = self.heads / self.kv_heads;
        let gw = group * hd;
        sc.q.clear();
        for r in s.row0 + i0..s.row0 + i1 {
            sc.q.extend_from_slice(&qkv[r * width + g * gw..r * width + (g + 1) * gw]);
        }
        // Causal: position start + i sees keys 0..=start + i, so the block needs keys
        // 0..start + i1.
        let first = s.start + i0 + 1;
        attention(sc, (i1 - i0) * group, hd, s.start + i1, |row| {
            first + row / group
        });
    }

    /// KV head `g`'s keys (`kind` 0) and values (1) of `s`'s positions `0..len` in layer
    /// `l`, into `sc`.
    fn gather_head(
        &self,
        kv: &KvArena,
        l: usize,
        s: &SeqRows<'_>,
        g: usize,
        len: usize,
        sc: &mut AttnScratch,
    ) {
        let cols = g * self.head_dim..(g + 1) * self.head_dim;
        kv.gather(s.pages, len, l, 0, cols.clone(), &mut sc.k);
        kv.gather(s.pages, len, l, 1, cols, &mut sc.v);
    }

    /// The LLM over stacked input rows `x` (rows x hidden) of `seqs`: writes each new
    /// row's K/V, returns each sequence's next token (argmax at its last row).
    fn forward(
        &self,
        exec: &dyn LinearExec,
        kv: &mut KvArena,
        mut x: Vec<f32>,
        seqs: &[SeqRows<'_>],
    ) -> Result<Vec<u32>, ComputeError> {
        let (h, hd) = (self.hidden, self.head_dim);
        let rows = x.len() / h;
        let q_dim = self.heads * hd;
        let kv_dim = self.kv_heads * hd;
        let width = q_dim + 2 * kv_dim;
        let group = self.heads / self.kv_heads;
        let half = hd / 2;
        // cos / sin of every row's position.
        let mut cos = vec![0.0f32; rows * half];
        let mut sin = vec![0.0f32; rows * half];
        for s in seqs {
            for i in 0..s.n {
                let r = s.row0 + i;
                let pos = (s.start + i) as f64;
                for (j, f) in self.inv_freq.iter().enumerate() {
                    let (sn, cs) = (pos * f).sin_cos();
                    cos[r * half + j] = cs as f32;
                    sin[r * half + j] = sn as f32;
                }
            }
        }
        // Query tokens per attention GEMM: their `group` heads are the GEMM's rows.
        let tile = (ATTN_ROWS / group).max(1);
        let gw = group * hd;
        let mut sc = AttnScratch::default();
        for (l, layer) in self.layers.iter().enumerate() {
            let xn = rms_norm(&x, h, &layer.ln1);
            let mut qkv = exec.linear(&layer.qkv, &xn, rows)?;
            for r in 0..rows {
                let (c, sn) = (
                    &cos[r * half..(r + 1) * half],
                    &sin[r * half..(r + 1) * half],
                );
                let row = &mut qkv[r * width..r * width + q_dim + kv_dim];
                for head in row.chunks_exact_mut(hd) {
                    rope(head, c, sn);
                }
            }
            for s in seqs {
                for i in 0..s.n {
                    let row = &qkv[(s.row0 + i) * width..(s.row0 + i + 1) * width];
                    kv.store(s.pages, s.start + i, l, 0, &row[q_dim..q_dim + kv_dim]);
                    kv.store(s.pages, s.start + i, l, 1, &row[q_dim + kv_dim..]);
                }
            }
            let mut attn = vec![0.0f32; rows * q_dim];
            let mut put = |s: &SeqRows<'_>, g: usize, i0: usize, o: &[f32]| {
                for (r, o) in (s.row0 + i0..).zip(o.chunks_exact(gw)) {
                    attn[r * q_dim + g * gw..r * q_dim + (g + 1) * gw].copy_from_slice(o);
                }
            };
            // Blocks of `tile` new tokens: rows are (token, query head of the group).
            let blocks = |n: usize| (0..n).step_by(tile).map(move |i0| (i0, (i0 + tile).min(n)));
            let kv_ro: &KvArena = kv;
            if self.parallel_attention {
                // One task per block of each sequence and KV head, each gathering the keys
                // its block sees.
                let tasks: Vec<_> = seqs
                    .iter()
                    .flat_map(|s| {
                        (0..self.kv_heads).flat_map(move |g| blocks(s.n).map(move |b| (s, g, b)))
                    })
                    .collect();
                let outs: Vec<Vec<f32>> = tasks
                    .par_iter()
                    .map(|&(s, g, b)| {
                        with_scratch(|sc| {
                            self.gather_head(kv_ro, l, s, g, s.start + b.1, sc);
                            self.attend_block(&qkv, s, g, b, sc);
                            sc.o.clone()
                        })
                    })
                    .collect();
                for (&(s, g, (i0, _)), o) in tasks.iter().zip(&outs) {
                    put(s, g, i0, o);
                }
            } else {
                for s in seqs {
                    for g in 0..self.kv_heads {
                        // The sequence's keys and values of this KV head, f32, once.
                        self.gather_head(kv_ro, l, s, g, s.start + s.n, &mut sc);
                        for b in blocks(s.n) {
                            self.attend_block(&qkv, s, g, b, &mut sc);
                            put(s, g, b.0, &sc.o);
                        }
                    }
                }
            }
            add_into(&mut x, &exec.linear(&layer.o, &attn, rows)?);
            let xn = rms_norm(&x, h, &layer.ln2);
            let act = swiglu(&exec.linear(&layer.gate_up, &xn, rows)?, self.inter);
            add_into(&mut x, &exec.linear(&layer.down, &act, rows)?);
        }
        // The LM head on each sequence's last row only.
        let mut last = Vec::with_capacity(seqs.len() * h);
        for s in seqs {
            let r = s.row0 + s.n - 1;
            last.extend_from_slice(&x[r * h..(r + 1) * h]);
        }
        let last = rms_norm(&last, h, &self.final_norm);
        Ok(exec
            .linear(&self.lm_head, &last, seqs.len())?
            .chunks_exact(self.vocab)
            .map(|row| {
                let mut best = 0;
                for (t, v) in row.iter().enumerate() {
                    if *v > row[best] {
                        best = t;
                    }
                }
                best as u32
            })
            .collect())
    }

    /// Every dense layer, in a fixed order (a device backend uploads these).
    #[cfg(feature = "cuda")]
    pub(crate) fn linears(&self) -> Vec<&Linear> {
        let mut out = vec![
            &self.lm_head,
            &self.patch_embed,
            &self.merger_fc1,
            &self.merger_fc2,
        ];
        for l in &self.layers {
            out.extend([&l.qkv, &l.o, &l.gate_up, &l.down]);
        }
        for b in &self.blocks {
            out.extend([&b.qkv, &b.proj, &b.gate_up, &b.down]);
        }
        out
    }

    fn embed_row(&self, token: usize, x: &mut Vec<f32>) {
        x.extend_from_slice(&self.embed[token * self.hidden..(token + 1) * self.hidden]);
    }
}

impl Compute for CpuCompute {
    type Kv = KvArena;

    fn spec(&self) -> &ModelSpec {
        &self.spec
    }

    /// Every tensor a step reads whole ([`CpuCompute::tensors`]), one load per cache line.
    fn touch_weights(&self, go: &dyn Fn() -> bool) -> u64 {
        let (mut sum, mut bytes) = (0f32, 0u64);
        self.tensors(&mut |v| {
            let (b, s) = super::ops::touch(v, go);
            sum += s;
            bytes += b;
        });
        std::hint::black_box(sum);
        bytes
    }

    fn shared_cores(&self) -> Option<f64> {
        std::thread::available_parallelism()
            .ok()
            .map(|n| n.get() as f64)
    }

    fn new_kv(&self, pages: u32, page_tokens: u32) -> Result<KvArena, ComputeError> {
        KvArena::new(&self.spec, pages, page_tokens)
    }

    fn encode(&self, images: &[ImageInput]) -> Result<Vec<Vec<u8>>, ComputeError> {
        self.encode_with(&Host, images)
    }

    fn prefill(
        &self,
        kv: &mut KvArena,
        chunks: &[PrefillChunk<'_>],
    ) -> Result<Vec<u32>, ComputeError> {
        self.prefill_with(&Host, kv, chunks)
    }

    fn decode(&self, kv: &mut KvArena, batch: &[DecodeSeq<'_>]) -> Result<Vec<u32>, ComputeError> {
        self.decode_with(&Host, kv, batch)
    }

    fn copy_pages(&self, kv: &mut KvArena, src: &[u32], dst: &[u32]) -> Result<(), ComputeError> {
        Self::copy_pages_host(kv, src, dst)
    }
}

impl CpuCompute {
    /// [`Compute::encode`] with the GEMMs of `exec`.
    pub(crate) fn encode_with(
        &self,
        exec: &dyn LinearExec,
        images: &[ImageInput],
    ) -> Result<Vec<Vec<u8>>, ComputeError> {
        let tokens: u64 = images.iter().map(|i| u64::from(i.visual_tokens)).sum();
        let patches = usize::try_from(tokens)
            .ok()
            .and_then(|t| t.checked_mul(self.merge))
            .filter(|p| {
                p.checked_mul(self.patch_len.max(self.merge * self.v_hidden))
                    .is_some()
            })
            .ok_or(ComputeError::TooLarge {
                what: "encoder batch",
            })?;
        let h = self.v_hidden;
        let mut pixels = Vec::with_capacity(patches * self.patch_len);
        for img in images {
            self.pixels(img, &mut pixels);
        }
        let mut x = exec.linear(&self.patch_embed, &pixels, patches)?;
        drop(pixels);
        // Each image's patches: [start, end) in the stacked batch.
        let mut spans = Vec::with_capacity(images.len());
        let mut at = 0;
        for img in images {
            let n = img.visual_tokens as usize * self.merge;
            spans.push((at, at + n));
            at += n;
        }
        for blk in &self.blocks {
            let xn = rms_norm(&x, h, &blk.ln1);
            let qkv = exec.linear(&blk.qkv, &xn, patches)?;
            let mut attn = vec![0.0f32; patches * h];
            // Full-attention blocks attend over the image; the others within windows of
            // `window` consecutive patches (see the module docs).
            let mut wins = Vec::new();
            for &(s, e) in &spans {
                let step = if blk.full {
                    (e - s).max(1)
                } else {
                    self.window
                };
                let mut w = s;
                while w < e {
                    let we = (w + step).min(e);
                    wins.push((w, we));
                    w = we;
                }
            }
            self.vit_attention(&qkv, &wins, &mut attn);
            add_into(&mut x, &exec.linear(&blk.proj, &attn, patches)?);
            let xn = rms_norm(&x, h, &blk.ln2);
            let act = swiglu(&exec.linear(&blk.gate_up, &xn, patches)?, self.v_inter);
            add_into(&mut x, &exec.linear(&blk.down, &act, patches)?);
        }
        // Merger: norm each patch, then `merge` consecutive patches are one row.
        let xn = rms_norm(&x, h, &self.merger_ln);
        let tokens = patches / self.merge;
        let mut mid = exec.linear(&self.merger_fc1, &xn, tokens)?;
        for v in &mut mid {
            *v = gelu(*v);
        }
        let out = exec.linear(&self.merger_fc2, &mid, tokens)?;
        let oh = self.merger_fc2.dout;
        let mut outputs = Vec::with_capacity(images.len());
        let mut t = 0;
        for img in images {
            let n = img.visual_tokens as usize;
            outputs.push(to_bf16_bytes(&out[t * oh..(t + n) * oh]));
            t += n;
        }
        Ok(outputs)
    }

    /// [`Compute::prefill`] with the GEMMs of `exec`.
    pub(crate) fn prefill_with(
        &self,
        exec: &dyn LinearExec,
        kv: &mut KvArena,
        chunks: &[PrefillChunk<'_>],
    ) -> Result<Vec<u32>, ComputeError> {
        self.check_arena(kv)?;
        let row_bytes = self.hidden * 2;
        let mut rows = 0u64;
        for (ci, c) in chunks.iter().enumerate() {
            let new: u64 = c.inputs.iter().map(Rows::len).sum();
            if new == 0 {
                return Err(ComputeError::EmptyChunk { chunk: ci });
            }
            kv.check_table(c.pages, u64::from(c.cached) + new)?;
            for input in c.inputs {
                match *input {
                    Rows::Text { .. } => {}
                    Rows::Tokens(ids) => {
                        if let Some(&t) = ids.iter().find(|&&t| t as usize >= self.vocab) {
                            return Err(ComputeError::TokenOutOfVocab {
                                token: t,
                                vocab: self.vocab as u32,
                            });
                        }
                    }
                    Rows::Image {
                        encoder_output,
                        first,
                        count,
                    } => {
                        if encoder_output.len() % row_bytes != 0 {
                            return Err(ComputeError::EncoderOutputShape {
                                bytes: encoder_output.len(),
                                row_bytes,
                            });
                        }
                        let have = encoder_output.len() / row_bytes;
                        let end = u64::from(first) + u64::from(count);
                        if end > have as u64 {
                            return Err(ComputeError::ImageRows {
                                first: first.into(),
                                end,
                                rows: have,
                            });
                        }
                    }
                }
            }
            rows += new;
        }
        let rows = usize::try_from(rows)
            .ok()
            .filter(|r| r.checked_mul(self.hidden.max(self.vocab)).is_some())
            .ok_or(ComputeError::TooLarge {
                what: "prefill batch",
            })?;
        let mut x = Vec::with_capacity(rows * self.hidden);
        let mut seqs = Vec::with_capacity(chunks.len());
        let mut row0 = 0;
        for c in chunks {
            let start = c.cached as usize;
            let mut pos = start;
            for input in c.inputs {
                match *input {
                    Rows::Text { seed, count } => {
                        for _ in 0..count {
                            let t = text_token(seed, pos as u64, self.vocab as u32);
                            self.embed_row(t as usize, &mut x);
                            pos += 1;
                        }
                    }
                    Rows::Tokens(ids) => {
                        for &t in ids {
                            self.embed_row(t as usize, &mut x);
                        }
                        pos += ids.len();
                    }
                    Rows::Image {
                        encoder_output,
                        first,
                        count,
                    } => {
                        let (f, n) = (first as usize, count as usize);
                        extend_from_bf16_bytes(
                            &mut x,
                            &encoder_output[f * row_bytes..(f + n) * row_bytes],
                        );
                        pos += n;
                    }
                }
            }
            let n = pos - start;
            seqs.push(SeqRows {
                pages: c.pages,
                start,
                n,
                row0,
            });
            row0 += n;
        }
        self.forward(exec, kv, x, &seqs)
    }

    /// [`Compute::decode`] with the GEMMs of `exec`.
    pub(crate) fn decode_with(
        &self,
        exec: &dyn LinearExec,
        kv: &mut KvArena,
        batch: &[DecodeSeq<'_>],
    ) -> Result<Vec<u32>, ComputeError> {
        self.check_arena(kv)?;
        let mut x = Vec::with_capacity(batch.len() * self.hidden);
        let mut seqs = Vec::with_capacity(batch.len());
        for (i, s) in batch.iter().enumerate() {
            if s.token as usize >= self.vocab {
                return Err(ComputeError::TokenOutOfVocab {
                    token: s.token,
                    vocab: self.vocab as u32,
                });
            }
            kv.check_table(s.pages, u64::from(s.len) + 1)?;
            self.embed_row(s.token as usize, &mut x);
            seqs.push(SeqRows {
                pages: s.pages,
                start: s.len as usize,
                n: 1,
                row0: i,
            });
        }
        self.forward(exec, kv, x, &seqs)
    }

    /// [`Compute::copy_pages`] on a host arena.
    pub(crate) fn copy_pages_host(
        kv: &mut KvArena,
        src: &[u32],
        dst: &[u32],
    ) -> Result<(), ComputeError> {
        if src.len() != dst.len() {
            return Err(ComputeError::CopyLengths {
                src: src.len(),
                dst: dst.len(),
            });
        }
        for p in src.iter().chain(dst) {
            if *p >= kv.pages() {
                return Err(ComputeError::PageOutOfRange {
                    page: *p,
                    pages: kv.pages(),
                });
            }
        }
        for (s, d) in src.iter().zip(dst) {
            kv.copy_page(*s, *d)?;
        }
        Ok(())
    }
}
