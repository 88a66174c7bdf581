//! The simulator calls the cost functions for every batch, chunk, iteration and transfer:
//! they must not allocate. A counting global allocator checks it, counting only on the
//! thread that asked: libtest's own threads allocate too (the "has been running for over
//! 60 seconds" notice on a loaded machine), which made a process-wide count flaky.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use moonagent_models::{
    decode_iter_time_ns, encoder_time_ns, fingerprint_time_ns, prefill_time_ns, transfer_time_ns,
    CostModel, Flow, HardwareProfile, LinkKind, ModelSpec,
};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialised and without a destructor: reading it never allocates.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCS.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn cost_functions_do_not_allocate() {
    let hw = HardwareProfile::by_name("h200").unwrap();
    let model = ModelSpec::by_name("qwen2.5-vl-7b").unwrap();
    let cost = CostModel::new(&hw, &model, 2).unwrap();
    let tcp = *hw.link(LinkKind::Tcp).unwrap();
    let images = [256u32, 1024, 64];
    let chunks = [(512u32, 0u32), (128, 4096)];
    let before = ALLOCS.load(Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    let mut sink = 0u64;
    for i in 0..10_000u32 {
        sink = sink
            .wrapping_add(cost.encoder_time_ns(&images))
            .wrapping_add(cost.prefill_time_ns(i % 8192 + 1, i))
            .wrapping_add(cost.prefill_batch_time_ns(&chunks))
            .wrapping_add(cost.decode_iter_time_ns(i % 256 + 1, u64::from(i) * 100))
            .wrapping_add(transfer_time_ns(&tcp, Flow::KvPut, u64::from(i) << 10))
            .wrapping_add(fingerprint_time_ns(&hw.host, u64::from(i) << 12))
            .wrapping_add(encoder_time_ns(&hw, &model, &images))
            .wrapping_add(prefill_time_ns(&hw, &model, i % 100 + 1, 7))
            .wrapping_add(decode_iter_time_ns(&hw, &model, 8, 8_000));
    }
    COUNTING.with(|c| c.set(false));
    let after = ALLOCS.load(Ordering::SeqCst);
    assert!(sink > 0);
    // The counter counts: one allocation on this thread is seen.
    COUNTING.with(|c| c.set(true));
    let probe = std::hint::black_box(vec![1u8; 8]);
    COUNTING.with(|c| c.set(false));
    drop(probe);
    assert_eq!(
        ALLOCS.load(Ordering::SeqCst) - after,
        1,
        "the counting allocator counts"
    );
    assert_eq!(
        after - before,
        0,
        "cost functions allocated {} times",
        after - before
    );
}
