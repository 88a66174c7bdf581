//! Shared test harness for the policy tests: a hand-driven object table that calls a
//! policy's hooks the way `MemStore` does (insert at put, access on a read hit, remove
//! before a slot is freed, slots reused lowest-freed-last), so victim order can be asserted
//! exactly on tiny cases (foyer's `Dump` style).

#![allow(dead_code)]

use moonagent_core::store::{
    AccessHints, DataType, EvictRequest, EvictionPolicy, Nanos, ObjId, ObjectMeta,
};

/// A live, complete, unpinned object with no lease beyond `lease_timeout`.
pub fn meta(size: u64, data_type: DataType, lease_timeout: Nanos) -> ObjectMeta {
    ObjectMeta {
        live: true,
        size,
        data_type,
        hard_pinned: false,
        soft_pin_until: None,
        lease_timeout,
        complete: true,
        readers: 0,
        put_time: 0,
        insert_seq: 0,
        last_access: 0,
        last_access_seq: 0,
        access_count: 0,
        hints: AccessHints::default(),
        key_hash: 0,
    }
}

/// An object table driving one policy's hooks.
pub struct Table {
    pub metas: Vec<ObjectMeta>,
    pub free: Vec<ObjId>,
    pub seq: u64,
    pub capacity: u64,
}

impl Table {
    pub fn new(capacity: u64) -> Self {
        Self {
            metas: Vec::new(),
            free: Vec::new(),
            seq: 0,
            capacity,
        }
    }

    /// Put `m` (its `insert_seq`, `last_access_seq` and, unless set, `key_hash` are assigned).
    pub fn insert(&mut self, p: &mut dyn EvictionPolicy, mut m: ObjectMeta) -> ObjId {
        self.seq += 1;
        m.insert_seq = self.seq;
        m.last_access_seq = self.seq;
        if m.key_hash == 0 {
            m.key_hash = 0x9E37_79B9_7F4A_7C15 ^ self.seq;
        }
        let id = match self.free.pop() {
            Some(id) => {
                self.metas[id.index()] = m;
                id
            }
            None => {
                self.metas.push(m);
                ObjId(self.metas.len() as u32 - 1)
            }
        };
        p.on_insert(id, &self.metas[id.index()]);
        id
    }

    /// A lease-granting read hit at `now` with lease until `lease_until`.
    pub fn access(
        &mut self,
        p: &mut dyn EvictionPolicy,
        id: ObjId,
        now: Nanos,
        lease_until: Nanos,
    ) {
        self.seq += 1;
        let m = &mut self.metas[id.index()];
        m.last_access = now;
        m.last_access_seq = self.seq;
        m.access_count += 1;
        m.lease_timeout = m.lease_timeout.max(lease_until);
        p.on_access(id, &self.metas[id.index()]);
    }

    /// Free a slot (remove or eviction).
    pub fn remove(&mut self, p: &mut dyn EvictionPolicy, id: ObjId) {
        p.on_remove(id, &self.metas[id.index()]);
        self.metas[id.index()].live = false;
        self.free.push(id);
    }

    pub fn used(&self) -> u64 {
        self.metas.iter().filter(|m| m.live).map(|m| m.size).sum()
    }

    pub fn req(&self, now: Nanos, target: u64, lower_bound: u64) -> EvictRequest {
        EvictRequest {
            now,
            target,
            lower_bound,
            object_count: self.metas.iter().filter(|m| m.live).count() as u64,
            used_bytes: self.used(),
            capacity_bytes: self.capacity,
            allow_soft_pinned: true,
        }
    }

    /// Plan victims, check each is a candidate, free them as the store would; returns them.
    pub fn evict(&mut self, p: &mut dyn EvictionPolicy, req: &EvictRequest) -> Vec<u32> {
        let mut out = Vec::new();
        p.select_victims(req, &self.metas, &mut out);
        for &id in &out {
            assert_ne!(
                self.metas[id.index()].candidate(req.now),
                moonagent_core::store::Candidate::No,
                "victim {id:?} is not a candidate"
            );
        }
        for &id in &out {
            self.remove(p, id);
        }
        out.iter().map(|i| i.0).collect()
    }
}
