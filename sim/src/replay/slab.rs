//! [`Slab`]: the storage of a [`super::Compiled`]'s arrays, either an owned `Vec` or a view
//! into a memory-mapped compiled-trace file ([`super::trace_cache`]). Reads go through
//! `Deref<Target = [T]>`, so a replay cannot tell the two apart; the first write to a
//! mapped slab copies it into a `Vec` (copy on write), so code that builds or edits a
//! `Compiled` (`push`, `fill_next`) works on either.
//!
//! A mapped slab's bytes were checked once, when it was made, to be a whole, aligned
//! `[T]` (zerocopy's `ref_from_bytes`); every later view re-runs that check, which is a
//! length and an alignment test, never a copy.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use memmap2::Mmap;
use zerocopy::{FromBytes, Immutable, KnownLayout};

/// An owned or memory-mapped array (see the module docs).
pub struct Slab<T> {
    inner: Inner<T>,
}

enum Inner<T> {
    Owned(Vec<T>),
    Mapped {
        map: Arc<Mmap>,
        offset: usize,
        len: usize,
    },
}

impl<T> Slab<T>
where
    T: FromBytes + Immutable + KnownLayout + Clone,
{
    /// `len` elements of `map` from byte `offset`, or `None` when they are out of bounds
    /// or misaligned.
    pub(crate) fn mapped(map: Arc<Mmap>, offset: usize, len: usize) -> Option<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let end = offset.checked_add(bytes)?;
        let slice = map.get(offset..end)?;
        <[T]>::ref_from_bytes(slice).ok()?;
        Some(Self {
            inner: Inner::Mapped { map, offset, len },
        })
    }

    /// Whether the elements are read from a mapped file (no copy was made).
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, Inner::Mapped { .. })
    }

    /// The elements as a `Vec`, copying a mapped slab first (copy on write).
    pub fn to_mut(&mut self) -> &mut Vec<T> {
        if let Inner::Mapped { .. } = self.inner {
            let owned = self.as_slice().to_vec();
            self.inner = Inner::Owned(owned);
        }
        match &mut self.inner {
            Inner::Owned(v) => v,
            Inner::Mapped { .. } => unreachable!("made owned above"),
        }
    }

    /// The elements.
    #[inline]
    pub fn as_slice(&self) -> &[T] {
        match &self.inner {
            Inner::Owned(v) => v,
            Inner::Mapped { map, offset, len } => {
                let bytes = &map[*offset..*offset + *len * std::mem::size_of::<T>()];
                <[T]>::ref_from_bytes(bytes).expect("checked in Slab::mapped")
            }
        }
    }

    /// Append (see `Vec::push`).
    pub fn push(&mut self, x: T) {
        self.to_mut().push(x);
    }

    /// Reserve room (see `Vec::reserve`).
    pub fn reserve(&mut self, n: usize) {
        self.to_mut().reserve(n);
    }

    /// Reserve exactly (see `Vec::reserve_exact`).
    ///
    /// No transparent-huge-page advice (`madvise(MADV_HUGEPAGE)`, used here until
    /// 2026-12-06): an advised fault must find a free 2 MiB page (under the kernel's
    /// default `defrag=madvise`, compacting memory synchronously) and zero it, and on a
    /// virtual machine that huge-page fault path stalled the 10M-request compile for up to
    /// 0.8 s (0.41-1.23 s against 0.45-0.48 s without the advice; `sim/README.md`, "Huge
    /// pages dropped").
    pub fn reserve_exact(&mut self, n: usize) {
        self.to_mut().reserve_exact(n);
    }

    /// Empty it (a mapped slab drops its view, it copies nothing).
    pub fn clear(&mut self) {
        self.inner = Inner::Owned(Vec::new());
    }

    /// Resize (see `Vec::resize`).
    pub fn resize(&mut self, n: usize, x: T) {
        self.to_mut().resize(n, x);
    }
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self {
            inner: Inner::Owned(Vec::new()),
        }
    }
}

impl<T> From<Vec<T>> for Slab<T> {
    fn from(v: Vec<T>) -> Self {
        Self {
            inner: Inner::Owned(v),
        }
    }
}

impl<T: Clone> Clone for Slab<T> {
    fn clone(&self) -> Self {
        Self {
            inner: match &self.inner {
                Inner::Owned(v) => Inner::Owned(v.clone()),
                Inner::Mapped { map, offset, len } => Inner::Mapped {
                    map: Arc::clone(map),
                    offset: *offset,
                    len: *len,
                },
            },
        }
    }
}

impl<T> Deref for Slab<T>
where
    T: FromBytes + Immutable + KnownLayout + Clone,
{
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T> DerefMut for Slab<T>
where
    T: FromBytes + Immutable + KnownLayout + Clone,
{
    fn deref_mut(&mut self) -> &mut [T] {
        self.to_mut()
    }
}

impl<T> PartialEq for Slab<T>
where
    T: FromBytes + Immutable + KnownLayout + Clone + PartialEq,
{
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T> Eq for Slab<T> where T: FromBytes + Immutable + KnownLayout + Clone + Eq {}

impl<T> PartialEq<Vec<T>> for Slab<T>
where
    T: FromBytes + Immutable + KnownLayout + Clone + PartialEq,
{
    fn eq(&self, other: &Vec<T>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T> fmt::Debug for Slab<T>
where
    T: FromBytes + Immutable + KnownLayout + Clone + fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_slice().fmt(f)
    }
}

impl<'a, T> IntoIterator for &'a Slab<T>
where
    T: FromBytes + Immutable + KnownLayout + Clone,
{
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.as_slice().iter()
    }
}
