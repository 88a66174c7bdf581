//! [`Recorded`]: a `Store` wrapper that logs every operation and its outcome, and can put
//! the inner store's keys under a namespace. Two runs of the same driver on two stores
//! (`MemStore` and a real Mooncake Store) compare by their logs: the same operations with
//! the same outcomes mean the same decisions.

use serde::{Deserialize, Serialize};

use super::{Nanos, Payload, ReplicateConfig, Store, StoreResult};

/// Which operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OpKind {
    /// `put_start`.
    PutStart,
    /// `put_end`.
    PutEnd,
    /// `put_revoke`.
    PutRevoke,
    /// `get_into`.
    Get,
    /// `get_size`.
    GetSize,
    /// `exists`.
    Exists,
    /// `remove`.
    Remove,
    /// `begin_read`.
    BeginRead,
    /// `end_read`.
    EndRead,
}

/// One logged operation: its kind, the key as the caller named it (without the
/// namespace), and the outcome (`Ok(..)` or the error, as text).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreOp {
    /// Which operation.
    pub kind: OpKind,
    /// The caller's key.
    pub key: String,
    /// The result, `{:?}`-formatted (sizes and booleans included).
    pub outcome: String,
    /// Whether it succeeded (for reads: found the object).
    pub ok: bool,
}

/// A store that logs every operation (see the module docs).
#[derive(Debug)]
pub struct Recorded<S> {
    inner: S,
    namespace: String,
    ops: Vec<StoreOp>,
    key: String,
}

impl<S: Store> Recorded<S> {
    /// Log every operation on `inner`, keys unchanged.
    pub fn new(inner: S) -> Self {
        Self::namespaced(inner, "")
    }

    /// Log every operation on `inner`, which sees every key as `namespace` + key (so runs
    /// on a shared real store do not see each other's objects).
    pub fn namespaced(inner: S, namespace: &str) -> Self {
        Self {
            inner,
            namespace: namespace.to_string(),
            ops: Vec::new(),
            key: String::new(),
        }
    }

    /// The operations so far.
    pub fn ops(&self) -> &[StoreOp] {
        &self.ops
    }

    /// The inner store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The inner store back.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The inner store, mutably (operations on it are not logged).
    pub fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Keys whose last successful write was a completed put not followed by a
    /// successful remove, in first-put order: what the log says the store should hold
    /// (before any eviction).
    pub fn written_keys(&self) -> Vec<String> {
        let mut order: Vec<&str> = Vec::new();
        let mut live: std::collections::HashMap<&str, bool> = std::collections::HashMap::new();
        for op in self.ops.iter().filter(|o| o.ok) {
            match op.kind {
                OpKind::PutEnd => {
                    // First write of the key: remember its position.
                    let first = live.insert(&op.key, true).is_none();
                    order.extend(first.then_some(op.key.as_str()));
                }
                OpKind::Remove => {
                    live.insert(&op.key, false);
                }
                _ => {}
            }
        }
        order
            .into_iter()
            .filter(|k| live.get(k) == Some(&true))
            .map(String::from)
            .collect()
    }

    fn run<T: std::fmt::Debug>(
        &mut self,
        kind: OpKind,
        key: &str,
        f: impl FnOnce(&mut S, &str) -> StoreResult<T>,
        ok: impl FnOnce(&StoreResult<T>) -> bool,
    ) -> StoreResult<T> {
        self.key.clear();
        self.key.push_str(&self.namespace);
        self.key.push_str(key);
        let r = f(&mut self.inner, &self.key);
        self.ops.push(StoreOp {
            kind,
            key: key.to_string(),
            outcome: format!("{r:?}"),
            ok: ok(&r),
        });
        r
    }
}

impl<S: Store> Store for Recorded<S> {
    fn put_start(
        &mut self,
        now: Nanos,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        self.run(
            OpKind::PutStart,
            key,
            |s, k| s.put_start(now, k, size, cfg),
            Result::is_ok,
        )
    }
    fn put_end(&mut self, now: Nanos, key: &str, payload: Payload) -> StoreResult<()> {
        self.run(
            OpKind::PutEnd,
            key,
            |s, k| s.put_end(now, k, payload),
            Result::is_ok,
        )
    }
    fn put_revoke(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        self.run(
            OpKind::PutRevoke,
            key,
            |s, k| s.put_revoke(now, k),
            Result::is_ok,
        )
    }
    fn get_into(&mut self, now: Nanos, key: &str, buf: &mut [u8]) -> StoreResult<u64> {
        self.run(
            OpKind::Get,
            key,
            |s, k| s.get_into(now, k, buf),
            Result::is_ok,
        )
    }
    fn get_size(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        self.run(
            OpKind::GetSize,
            key,
            |s, k| s.get_size(now, k),
            Result::is_ok,
        )
    }
    fn exists(&mut self, now: Nanos, key: &str) -> StoreResult<bool> {
        self.run(
            OpKind::Exists,
            key,
            |s, k| s.exists(now, k),
            |r| *r == Ok(true),
        )
    }
    fn remove(&mut self, now: Nanos, key: &str, force: bool) -> StoreResult<()> {
        self.run(
            OpKind::Remove,
            key,
            |s, k| s.remove(now, k, force),
            Result::is_ok,
        )
    }
    fn begin_read(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        self.run(
            OpKind::BeginRead,
            key,
            |s, k| s.begin_read(now, k),
            Result::is_ok,
        )
    }
    fn end_read(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        self.run(
            OpKind::EndRead,
            key,
            |s, k| s.end_read(now, k),
            Result::is_ok,
        )
    }
}
