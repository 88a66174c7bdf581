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

    /// Reserve exactly (see `Vec::reserve_exact`). A buffer of many megabytes is asked to
    /// be backed by transparent huge pages (Linux `madvise`, where the kernel allows it):
    /// filling 320 MB of accesses then takes a few hundred page faults, not 80,000.
    pub fn reserve_exact(&mut self, n: usize) {
        let v = self.to_mut();
        v.reserve_exact(n);
        advise_huge(
            v.as_mut_ptr().cast(),
            v.capacity() * std::mem::size_of::<T>(),
        );
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

/// `madvise(MADV_HUGEPAGE)` on the whole 2 MiB pages inside `len` bytes at `p` (a hint:
/// the contents are untouched and an error is ignored; a no-op below 8 MiB or off Linux).
#[allow(unused_variables)]
fn advise_huge(p: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if len < 4 * HUGE {
            return;
        }
        let start = (p as usize).next_multiple_of(HUGE);
        let end = (p as usize + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: [start, end) lies inside the allocation of `len` bytes at `p`, which
            // the caller owns; MADV_HUGEPAGE changes only how the kernel backs the pages,
            // never their contents or protection.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}
