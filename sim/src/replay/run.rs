//! The Mooncake-master replay loop: each policy on its own `MemStore` (reads, prefix
//! lookups with `exists`, puts), per-type counters, and the parallel fan-out over
//! policies and store configs.

use moonagent_core::serve::kv_prefix::{self, BlockStore, Publish};
use moonagent_core::store::{
    AccessHints, DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, StoreError,
    StoreResult,
};
use rayon::prelude::*;

use super::{
    Access, Compiled, LabelledPolicy, PolicyResult, ReplayError, TypeResult, FIRST_KV, NEVER,
};

/// A run of accesses as the core's prefix-KV rule sees it: block `i` is `run[i]`, keyed
/// by its dense object number, read and put with the access's hints.
struct Blocks<'r> {
    store: &'r mut MemStore<u32>,
    objects: &'r [u32],
    first: usize,
    run: &'r [Access],
}

impl BlockStore for Blocks<'_> {
    fn block_exists(&mut self, i: usize) -> StoreResult<bool> {
        let a = &self.run[i];
        self.store
            .exists_hinted(a.time, &self.objects[self.first + i], Some(hints(a)))
    }
    fn block_put(&mut self, i: usize) -> StoreResult<()> {
        let a = &self.run[i];
        self.store
            .put_with(
                a.time,
                self.objects[self.first + i],
                Payload::SizeOnly(u64::from(a.size)),
                &ReplicateConfig::of(DataType::ALL[a.dtype as usize]),
                hints(a),
            )
            .map(|_| ())
    }
}

/// The replay of one policy: a store and its per-type counters.
struct Run<'c> {
    store: MemStore<u32>,
    objects: &'c [u32],
    by: [TypeResult; DataType::COUNT],
    missing: Vec<usize>,
}

/// Replay `compiled` under one policy on a store built from `store_cfg`.
pub fn replay_one(
    compiled: &Compiled,
    store_cfg: &MemStoreConfig,
    lp: &LabelledPolicy,
) -> Result<PolicyResult, ReplayError> {
    store_cfg.validate().map_err(ReplayError::StoreConfig)?;
    compiled.check_filled()?;
    let store: MemStore<u32> =
        MemStore::with_policy(store_cfg.clone(), &lp.policy).map_err(|source| {
            ReplayError::Policy {
                label: lp.label.clone(),
                source,
            }
        })?;
    let mut run = Run {
        store,
        objects: &compiled.objects,
        by: [TypeResult::default(); DataType::COUNT],
        missing: Vec::new(),
    };
    let acc: &[Access] = &compiled.accesses;
    let kv = DataType::KvCache.index() as u8;
    let mut i = 0;
    while i < acc.len() {
        let a = &acc[i];
        if a.dtype == kv {
            // One request's prefix lookup: the run of KV accesses starting here.
            let mut j = i + 1;
            while j < acc.len()
                && acc[j].dtype == kv
                && acc[j].flags & FIRST_KV == 0
                && acc[j].time == a.time
            {
                j += 1;
            }
            run.kv_lookup(i, &acc[i..j])?;
            i = j;
        } else {
            run.get_or_put(i, a)?;
            i += 1;
        }
    }
    let stats = run.store.stats().clone();
    Ok(PolicyResult::assemble(lp, run.by, stats))
}

#[inline]
pub(crate) fn hints(a: &Access) -> AccessHints {
    AccessHints {
        miss_penalty_ns: u64::from(a.penalty_ns),
        next_access: if a.next == NEVER {
            u64::MAX
        } else {
            u64::from(a.next)
        },
        tenant: u32::from(a.tenant),
        priority: 0,
    }
}

#[inline]
pub(crate) fn count_lookup(r: &mut TypeResult, a: &Access, hit: bool) {
    let size = u64::from(a.size);
    let pen = u64::from(a.penalty_ns);
    r.lookups += 1;
    r.lookup_bytes += size;
    r.penalty_ns += pen;
    if a.is_reuse() {
        r.reuse_lookups += 1;
        r.reuse_penalty_ns += pen;
    }
    if hit {
        r.hits += 1;
        r.hit_bytes += size;
        r.saved_ns += pen;
        if a.is_reuse() {
            r.reuse_hits += 1;
        }
    }
}

fn store_err(op: &'static str, a: &Access, source: StoreError) -> ReplayError {
    ReplayError::Store {
        op,
        time: a.time,
        id: a.id,
        source,
    }
}

impl Run<'_> {
    fn put(&mut self, i: usize, a: &Access) -> Result<(), ReplayError> {
        let mut one = Blocks {
            store: &mut self.store,
            objects: self.objects,
            first: i,
            run: std::slice::from_ref(a),
        };
        let r = &mut self.by[a.dtype as usize];
        // No space: the object simply stays uncached, as on the real master; a put of an
        // object that is there after all is refused, as on the master.
        match kv_prefix::publish(&mut one, 0) {
            Ok(Publish::Stored) => r.puts += 1,
            Ok(Publish::NoSpace) => r.puts_no_space += 1,
            Ok(Publish::Exists) => r.puts_exists += 1,
            Err(source) => return Err(store_err("put", a, source)),
        }
        Ok(())
    }

    fn get_or_put(&mut self, i: usize, a: &Access) -> Result<(), ReplayError> {
        let hit = match self
            .store
            .get_size_with(a.time, &self.objects[i], Some(hints(a)))
        {
            Ok(_) => true,
            Err(StoreError::NotFound | StoreError::NotReady) => false,
            Err(source) => return Err(store_err("get", a, source)),
        };
        count_lookup(&mut self.by[a.dtype as usize], a, hit);
        if !hit {
            self.put(i, a)?;
        }
        Ok(())
    }

    /// One request's prefix lookup; `first` is the index of `run[0]` in the trace.
    fn kv_lookup(&mut self, first: usize, run: &[Access]) -> Result<(), ReplayError> {
        let mut blocks = Blocks {
            store: &mut self.store,
            objects: self.objects,
            first,
            run,
        };
        let by = &mut self.by;
        kv_prefix::lookup(&mut blocks, run.len(), &mut self.missing, |k, hit| {
            count_lookup(&mut by[run[k].dtype as usize], &run[k], hit)
        })
        .map_err(|source| ReplayError::Exists {
            time: run[0].time,
            source,
        })?;
        for n in 0..self.missing.len() {
            let k = self.missing[n];
            self.put(first + k, &run[k])?;
        }
        Ok(())
    }
}

/// Replay every policy over the same compiled trace, in parallel (rayon), results in the
/// order given.
pub fn replay_all(
    compiled: &Compiled,
    store_cfg: &MemStoreConfig,
    policies: &[LabelledPolicy],
) -> Result<Vec<PolicyResult>, ReplayError> {
    policies
        .par_iter()
        .map(|lp| replay_one(compiled, store_cfg, lp))
        .collect()
}

/// Replay every (store config, policy) pair in parallel (rayon): one row of results per
/// store config, each in the order of `policies`.
pub fn replay_grid(
    compiled: &Compiled,
    store_cfgs: &[MemStoreConfig],
    policies: &[LabelledPolicy],
) -> Result<Vec<Vec<PolicyResult>>, ReplayError> {
    grid(
        store_cfgs,
        policies,
        |c, p| replay_one(compiled, c, p),
        &|| {},
    )
}

/// Run `one(config, policy)` for every pair in parallel (rayon), calling `on_done` as each
/// finishes (a progress bar); one row of results per config, each in the order of
/// `policies`. The store-level and the plain replay grids both run through here.
pub fn grid<C: Sync>(
    cfgs: &[C],
    policies: &[LabelledPolicy],
    one: impl Fn(&C, &LabelledPolicy) -> Result<PolicyResult, ReplayError> + Sync,
    on_done: &(dyn Fn() + Sync),
) -> Result<Vec<Vec<PolicyResult>>, ReplayError> {
    let pairs: Vec<(usize, usize)> = (0..cfgs.len())
        .flat_map(|s| (0..policies.len()).map(move |p| (s, p)))
        .collect();
    let flat: Vec<PolicyResult> = pairs
        .par_iter()
        .map(|&(s, p)| {
            let r = one(&cfgs[s], &policies[p]);
            on_done();
            r
        })
        .collect::<Result<_, _>>()?;
    let mut it = flat.into_iter();
    Ok((0..cfgs.len())
        .map(|_| it.by_ref().take(policies.len()).collect())
        .collect())
}
