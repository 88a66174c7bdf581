//! `KvArena`: KV pages in host memory, stored as bf16.

use half::bf16;
use moonagent_models::ModelSpec;

use super::{ComputeError, KvPages};

/// `pages` fixed-size KV pages in host memory, each `page_tokens * kv_bytes_per_token`
/// bytes of bf16.
///
/// The arena never chooses pages: a sequence is addressed by its page table (page ids from
/// the core's block pool, like a vLLM block table) and its length. Inside a page the layout
/// is `[layer][K, V][slot][kv_head][head_dim]`, bf16 little-endian in the byte views, so a
/// whole page moves between workers and to the store as one blob of
/// [`KvPages::page_bytes`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvArena {
    layers: usize,
    kv_dim: usize,
    page_tokens: u32,
    pages: u32,
    /// bf16 bit patterns, `pages * page_elems`.
    data: Vec<u16>,
}

impl KvArena {
    /// An arena of `pages` zeroed pages of `page_tokens` tokens for `spec`'s KV layout.
    pub fn new(spec: &ModelSpec, pages: u32, page_tokens: u32) -> Result<Self, ComputeError> {
        if spec.dtype_bytes() != 2 {
            return Err(ComputeError::Unsupported {
                model: spec.name.clone(),
                reason: format!(
                    "KV pages are stored as bf16 (2 bytes); the spec's dtype is {} bytes",
                    spec.dtype_bytes()
                ),
            });
        }
        if page_tokens == 0 {
            return Err(ComputeError::Unsupported {
                model: spec.name.clone(),
                reason: "pages of 0 tokens".into(),
            });
        }
        let layers = spec.llm.num_hidden_layers as usize;
        let kv_dim = (u64::from(spec.llm.num_key_value_heads) * spec.head_dim()) as usize;
        let total = (pages as usize)
            .checked_mul(page_tokens as usize)
            .and_then(|t| t.checked_mul(2 * layers))
            .and_then(|t| t.checked_mul(kv_dim))
            .ok_or(ComputeError::TooLarge { what: "KV arena" })?;
        Ok(Self {
            layers,
            kv_dim,
            page_tokens,
            pages,
            data: vec![0; total],
        })
    }

    /// KV bytes per token of this arena's layout (`2 * layers * kv_heads * head_dim * 2`).
    pub fn kv_bytes_per_token(&self) -> u64 {
        (2 * self.layers * self.kv_dim * 2) as u64
    }

    /// (layers, kv_heads * head_dim) of the layout.
    pub(crate) fn layout(&self) -> (usize, usize) {
        (self.layers, self.kv_dim)
    }

    /// bf16 elements per page.
    fn page_elems(&self) -> usize {
        self.page_tokens as usize * 2 * self.layers * self.kv_dim
    }

    fn check_page(&self, page: u32) -> Result<(), ComputeError> {
        if page >= self.pages {
            return Err(ComputeError::PageOutOfRange {
                page,
                pages: self.pages,
            });
        }
        Ok(())
    }

    /// Check that `table` covers `tokens` tokens and that the pages it uses exist.
    pub(crate) fn check_table(&self, table: &[u32], tokens: u64) -> Result<(), ComputeError> {
        let pt = u64::from(self.page_tokens);
        let need = tokens.div_ceil(pt);
        if need > table.len() as u64 {
            return Err(ComputeError::PageTableTooShort {
                tokens,
                need,
                page_tokens: self.page_tokens,
                have: table.len(),
            });
        }
        for &p in &table[..need as usize] {
            self.check_page(p)?;
        }
        Ok(())
    }

    /// Element offset of (page table, position, layer, K=0/V=1); the table is checked.
    #[inline]
    fn offset(&self, table: &[u32], pos: usize, layer: usize, kind: usize) -> usize {
        let pt = self.page_tokens as usize;
        let page = table[pos / pt] as usize;
        page * self.page_elems() + ((layer * 2 + kind) * pt + pos % pt) * self.kv_dim
    }

    /// Store the K (`kind` 0) or V (1) vector of one token, rounding to bf16.
    #[inline]
    pub(crate) fn store(
        &mut self,
        table: &[u32],
        pos: usize,
        layer: usize,
        kind: usize,
        v: &[f32],
    ) {
        let o = self.offset(table, pos, layer, kind);
        for (d, x) in self.data[o..o + self.kv_dim].iter_mut().zip(v) {
            *d = bf16::from_f32(*x).to_bits();
        }
    }

    /// Gather the K (`kind` 0) or V (1) columns `cols` (one head: `head * head_dim..`) for
    /// positions `0..len` into `out` (`len * cols.len()` values, position-major).
    pub(crate) fn gather(
        &self,
        table: &[u32],
        len: usize,
        layer: usize,
        kind: usize,
        cols: std::ops::Range<usize>,
        out: &mut Vec<f32>,
    ) {
        out.clear();
        for pos in 0..len {
            let o = self.offset(table, pos, layer, kind);
            // bf16 -> f32 is exact: the bits shifted into the high half (vectorises;
            // unlike `half`, a signalling NaN stays signalling).
            out.extend(
                self.data[o + cols.start..o + cols.end]
                    .iter()
                    .map(|b| f32::from_bits(u32::from(*b) << 16)),
            );
        }
    }

    /// The K/V bytes of a sequence's first `len` tokens, independent of its page ids:
    /// `[layer][K, V][position][kv_head][head_dim]` bf16 little-endian,
    /// `len * kv_bytes_per_token` bytes.
    pub fn read_tokens(&self, table: &[u32], len: u32) -> Result<Vec<u8>, ComputeError> {
        self.check_table(table, u64::from(len))?;
        let mut out = Vec::with_capacity(len as usize * self.kv_bytes_per_token() as usize);
        for layer in 0..self.layers {
            for kind in 0..2 {
                for pos in 0..len as usize {
                    let o = self.offset(table, pos, layer, kind);
                    for b in &self.data[o..o + self.kv_dim] {
                        out.extend_from_slice(&b.to_le_bytes());
                    }
                }
            }
        }
        Ok(out)
    }

    /// Write a sequence's first `bytes.len() / kv_bytes_per_token` tokens of K/V in the
    /// layout [`Self::read_tokens`] produces (the inverse: what a KV handoff delivers).
    pub fn write_tokens(&mut self, table: &[u32], bytes: &[u8]) -> Result<(), ComputeError> {
        let per = self.kv_bytes_per_token() as usize;
        if bytes.len() % per != 0 {
            return Err(ComputeError::PageSize {
                expected: bytes.len() / per * per,
                found: bytes.len(),
            });
        }
        let len = bytes.len() / per;
        self.check_table(table, len as u64)?;
        let mut src = bytes.chunks_exact(2);
        for layer in 0..self.layers {
            for kind in 0..2 {
                for pos in 0..len {
                    let o = self.offset(table, pos, layer, kind);
                    for (d, b) in self.data[o..o + self.kv_dim].iter_mut().zip(&mut src) {
                        *d = u16::from_le_bytes([b[0], b[1]]);
                    }
                }
            }
        }
        Ok(())
    }

    /// Copy page `src` onto page `dst` (a real copy of its bytes).
    pub fn copy_page(&mut self, src: u32, dst: u32) -> Result<(), ComputeError> {
        self.check_page(src)?;
        self.check_page(dst)?;
        let n = self.page_elems();
        let (s, d) = (src as usize * n, dst as usize * n);
        self.data.copy_within(s..s + n, d);
        Ok(())
    }
}

impl KvPages for KvArena {
    fn pages(&self) -> u32 {
        self.pages
    }

    fn read_tokens(&self, table: &[u32], len: u32) -> Result<Vec<u8>, ComputeError> {
        KvArena::read_tokens(self, table, len)
    }

    fn write_tokens(&mut self, table: &[u32], bytes: &[u8]) -> Result<(), ComputeError> {
        KvArena::write_tokens(self, table, bytes)
    }

    fn kv_bytes_per_token(&self) -> u64 {
        KvArena::kv_bytes_per_token(self)
    }

    fn grow(&mut self, pages: u32) -> Result<(), ComputeError> {
        if pages <= self.pages {
            return Ok(());
        }
        let total = (pages as usize)
            .checked_mul(self.page_elems())
            .ok_or(ComputeError::TooLarge { what: "KV arena" })?;
        self.data.resize(total, 0);
        self.pages = pages;
        Ok(())
    }

    fn page_tokens(&self) -> u32 {
        self.page_tokens
    }

    fn page_bytes(&self) -> usize {
        self.page_elems() * 2
    }

    fn read_page(&self, page: u32, out: &mut [u8]) -> Result<(), ComputeError> {
        self.check_page(page)?;
        if out.len() != self.page_bytes() {
            return Err(ComputeError::PageSize {
                expected: self.page_bytes(),
                found: out.len(),
            });
        }
        let n = self.page_elems();
        let src = &self.data[page as usize * n..(page as usize + 1) * n];
        for (o, b) in out.chunks_exact_mut(2).zip(src) {
            o.copy_from_slice(&b.to_le_bytes());
        }
        Ok(())
    }

    fn write_page(&mut self, page: u32, bytes: &[u8]) -> Result<(), ComputeError> {
        self.check_page(page)?;
        if bytes.len() != self.page_bytes() {
            return Err(ComputeError::PageSize {
                expected: self.page_bytes(),
                found: bytes.len(),
            });
        }
        let n = self.page_elems();
        let dst = &mut self.data[page as usize * n..(page as usize + 1) * n];
        for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
            *d = u16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    }
}
