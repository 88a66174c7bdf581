//! A toy KV memory and decoder, to check that forking changes no token.
//!
//! [`ToyKv`] is a reference driver: it stores one token id per KV slot, executes the
//! pool's [`CopyAction`]s and reads a sequence back through its block table, so a wrong
//! share, a missed copy or a write into a shared page shows up as a wrong token.
//! [`toy_next_token`] is a deterministic "model": the next token is a hash of the visible
//! tokens and the branch's sampler seed. Neither is used on a hot path.

use super::table::{CopyAction, PoolConfig};
use crate::rng::mix64;

/// The next token of a sequence whose visible tokens are `visible`, sampled with `seed`,
/// in a vocabulary of `vocab` ids (0 when `vocab` is 0).
pub fn toy_next_token(visible: &[u32], seed: u64, vocab: u32) -> u32 {
    let mut h = mix64(seed ^ 0x746f_795f_6465_636f);
    for &t in visible {
        h = mix64(h ^ u64::from(t));
    }
    if vocab == 0 {
        0
    } else {
        (h % u64::from(vocab)) as u32
    }
}

/// One token id per KV slot of every page; [`ToyKv::EMPTY`] where nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToyKv {
    block_size: usize,
    slots: Vec<u32>,
}

impl ToyKv {
    /// Marker of a slot never written.
    pub const EMPTY: u32 = u32::MAX;

    /// Memory for every page of a pool built with `cfg`.
    pub fn new(cfg: &PoolConfig) -> Self {
        let block_size = cfg.block_size_tokens.max(1) as usize;
        Self {
            block_size,
            slots: vec![Self::EMPTY; block_size * cfg.capacity_pages as usize],
        }
    }

    fn slot(&self, table: &[u32], pos: u64) -> Option<usize> {
        let page = *table.get((pos / self.block_size as u64) as usize)?;
        let i = page as usize * self.block_size + (pos % self.block_size as u64) as usize;
        (i < self.slots.len()).then_some(i)
    }

    /// Executes a copy; `false` if it names a page out of range.
    pub fn apply(&mut self, c: &CopyAction) -> bool {
        let (bs, n) = (self.block_size, c.tokens as usize);
        let (src, dst) = (c.src as usize * bs, c.dst as usize * bs);
        if n > bs || src + bs > self.slots.len() || dst + bs > self.slots.len() {
            return false;
        }
        self.slots.copy_within(src..src + n, dst);
        true
    }

    /// Writes `token` at position `pos` of the sequence with block table `table`; `false`
    /// if the table does not cover `pos`.
    pub fn write(&mut self, table: &[u32], pos: u64, token: u32) -> bool {
        match self.slot(table, pos) {
            Some(i) => {
                self.slots[i] = token;
                true
            }
            None => false,
        }
    }

    /// The first `len` tokens of the sequence with block table `table`, `None` if the
    /// table does not cover them.
    pub fn read(&self, table: &[u32], len: u64) -> Option<Vec<u32>> {
        (0..len)
            .map(|p| self.slot(table, p).map(|i| self.slots[i]))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toy_decoder_depends_on_tokens_and_seed() {
        let a = toy_next_token(&[1, 2, 3], 7, 1000);
        assert_eq!(a, toy_next_token(&[1, 2, 3], 7, 1000));
        let others = [
            toy_next_token(&[1, 2, 4], 7, 1 << 30),
            toy_next_token(&[1, 2, 3], 8, 1 << 30),
            toy_next_token(&[1, 2], 7, 1 << 30),
        ];
        let base = toy_next_token(&[1, 2, 3], 7, 1 << 30);
        assert!(others.iter().all(|&o| o != base));
        assert_eq!(toy_next_token(&[1], 1, 0), 0);
    }

    #[test]
    fn toy_kv_copies_and_reads_through_tables() {
        let cfg = PoolConfig::new(4, 2, 1);
        let mut kv = ToyKv::new(&cfg);
        assert!(kv.write(&[3, 1], 0, 10));
        assert!(kv.write(&[3, 1], 2, 12));
        assert!(!kv.write(&[3, 1], 4, 14));
        assert_eq!(kv.read(&[3, 1], 3), Some(vec![10, ToyKv::EMPTY, 12]));
        assert!(kv.apply(&CopyAction {
            src: 1,
            dst: 0,
            tokens: 1,
            bytes: 1
        }));
        assert_eq!(kv.read(&[0], 1), Some(vec![12]));
        assert!(!kv.apply(&CopyAction {
            src: 9,
            dst: 0,
            tokens: 1,
            bytes: 1
        }));
        assert_eq!(kv.read(&[3], 3), None);
    }

    /// The token-identity tests see a wrong share or a missed copy only as a changed
    /// token, so the toy model must react to every bit of the seed and of every visible
    /// token: it is a hash of both (a bijection of each before the final reduction).
    #[test]
    fn toy_decoder_reacts_to_every_seed_bit_and_every_token_bit() {
        let (visible, seed, vocab) = ([11u32, 22, 33], 0x0123_4567_89ab_cdefu64, u32::MAX);
        let base = toy_next_token(&visible, seed, vocab);
        for bit in 0..64 {
            assert_ne!(
                toy_next_token(&visible, seed ^ (1 << bit), vocab),
                base,
                "seed bit {bit}"
            );
        }
        for pos in 0..visible.len() {
            for bit in 0..32 {
                let mut v = visible;
                v[pos] ^= 1 << bit;
                assert_ne!(
                    toy_next_token(&v, seed, vocab),
                    base,
                    "token {pos} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn toy_tokens_are_in_the_vocabulary() {
        for vocab in [1u32, 2, 7, 1000] {
            for seed in 0..16u64 {
                for visible in [&[][..], &[5], &[5, 9, 200]] {
                    let t = toy_next_token(visible, seed, vocab);
                    assert!(t < vocab, "{t} >= {vocab} (seed {seed}, {visible:?})");
                }
            }
        }
    }

    #[test]
    fn toy_kv_refuses_pages_past_its_memory() {
        // 4 pages of 2 slots: page 3 is the last, page 4 does not exist.
        let cfg = PoolConfig::new(4, 2, 1);
        let mut kv = ToyKv::new(&cfg);
        assert!(kv.write(&[3], 1, 7), "the very last slot");
        assert_eq!(kv.read(&[3], 2), Some(vec![ToyKv::EMPTY, 7]));
        assert!(!kv.write(&[4], 0, 8));
        assert_eq!(kv.read(&[4], 1), None);
        assert_eq!(kv.read(&[3, 4], 3), None);
    }

    #[test]
    fn toy_kv_copies_a_whole_page_but_never_more() {
        let cfg = PoolConfig::new(4, 2, 1);
        let mut kv = ToyKv::new(&cfg);
        assert!(kv.write(&[1], 0, 5) && kv.write(&[1], 1, 6));
        let full = CopyAction {
            src: 1,
            dst: 2,
            tokens: 2,
            bytes: 2,
        };
        assert!(kv.apply(&full), "a whole page is in range");
        assert_eq!(kv.read(&[2], 2), Some(vec![5, 6]));
        let before = kv.clone();
        let over = CopyAction {
            src: 1,
            dst: 0,
            tokens: 3,
            bytes: 3,
        };
        assert!(!kv.apply(&over), "more tokens than a page holds");
        assert_eq!(kv, before, "a refused copy writes nothing");
    }
}
