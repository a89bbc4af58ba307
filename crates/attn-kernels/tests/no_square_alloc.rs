//! ARCHITECTURE.md invariant 2: no allocation of the fused CPU kernels is `T x T`. This test binary's
//! global allocator tracks the bytes live on every thread (rayon's workers included) and the largest
//! single block while a long forward and backward run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use attn_core::Variant;
use attn_kernels::cpu;

/// The system allocator, counting live bytes, their peak and the largest block.
struct Tracking;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to `System`; the counters are atomics that never allocate.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        LARGEST.fetch_max(layout.size(), Ordering::SeqCst);
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Tracking = Tracking;

#[test]
fn a_long_forward_and_backward_never_hold_a_t_by_t_matrix() {
    let (h, t, d) = (2, 4096, 16);
    let square = t * t * std::mem::size_of::<f32>(); // one head's weights: 64 MiB
    let x = |seed| attn_core::fixtures::random_array::<f32>([1, h, t, d], seed);
    let (q, k, v, g) = (x(1), x(2), x(3), x(4));
    // Two workers, as on CI: the score cache and the partials are per task, so the peak grows with
    // the threads (linearly in T each).
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    for name in ["lssa+rw15", "softmax"] {
        let variant: Variant = name.parse().unwrap();
        let before = LIVE.load(Ordering::SeqCst);
        PEAK.store(before, Ordering::SeqCst);
        LARGEST.store(0, Ordering::SeqCst);
        let (o, grads) = pool.install(|| {
            (cpu::forward(&variant, &q, &k, &v).unwrap(), cpu::backward(&variant, &q, &k, &v, &g).unwrap())
        });
        let (peak, largest) = (PEAK.load(Ordering::SeqCst) - before, LARGEST.load(Ordering::SeqCst));
        eprintln!(
            "{name}: peak {} KiB over the inputs, largest block {} KiB, T x T = {} KiB",
            peak >> 10,
            largest >> 10,
            square >> 10
        );
        // The bounds ARCHITECTURE.md's invariant 2 states (measured: LSSAR 4.9 MiB and 1 MiB, softmax
        // 4.3 MiB and 0.5 MiB; the largest block is a task's score cache, 64 rows of T floats). Under
        // AMX the keys and values are also packed as three bf16 parts each, `d` padded to 32: 12 bytes
        // a padded element, one block for the call (3 MiB here), linear in T too.
        let amx = if cpu::Isa::detect() == cpu::Isa::Amx { h * t * d.next_multiple_of(32) * 12 + 64 } else { 0 };
        assert!(largest <= amx.max(1 << 20), "{name}: a block of {largest} bytes (T x T is {square})");
        assert!(peak <= (6 << 20) + amx, "{name}: {peak} bytes live at once over the inputs (T x T is {square})");
        drop((o, grads));
    }
}
