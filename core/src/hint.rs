//! Performance hints with no effect on results.

/// Ask the CPU to fetch the cache line holding `x` (x86-64's `prefetcht0`; a no-op on
/// other targets). A hint only: it reads nothing the program sees and cannot fault, so
/// what any caller computes is the same with or without it.
#[inline(always)]
pub fn prefetch<T>(x: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetcht0` (SSE, in every x86-64 CPU) never faults and has no
    // architectural effect; `x` is a live reference besides. The only `unsafe` in core.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((x as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// [`prefetch`] the first `lines` cache lines of `s` (fewer when `s` is shorter): one
/// element every 64 bytes from the first (every element when they are larger).
#[inline(always)]
pub fn prefetch_lines<T>(s: &[T], lines: usize) {
    let step = (64 / std::mem::size_of::<T>().max(1)).max(1);
    for x in s.iter().step_by(step).take(lines) {
        prefetch(x);
    }
}
