//! A decoding step (one query row against a KV cache) allocates nothing once its thread's buffers
//! have grown to its sizes: not per call, not per key head. Counted by this test binary's global
//! allocator, on the calling thread (a step under 1 MiB of keys and values runs there alone).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use attn_core::Variant;
use attn_kernels::{Dtype, Params, RawTensor, cpu, null_input, null_output};

/// The system allocator, counting this thread's allocations while `COUNTING` is set.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards every call to `System`; the counters are thread-local cells that never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|a| a.set(a.get() + 1));
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations(f: impl FnOnce()) -> usize {
    ALLOCATIONS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get)
}

fn raw(x: &[f32], heads: usize, t: usize, d: usize) -> RawTensor<*const std::ffi::c_void> {
    RawTensor { ptr: x.as_ptr().cast(), strides: [heads * t * d, t * d, d] }
}

#[test]
fn a_decoding_step_allocates_nothing_once_warm() {
    let (h, h_kv, d, most) = (8, 2, 64, 600);
    let data =
        |n: usize, seed: u64| attn_core::fixtures::random_array::<f32>([1, 1, 1, n], seed).into_raw_vec_and_offset().0;
    let (q, k, v) = (data(h * d, 1), data(h_kv * most * d, 2), data(h_kv * most * d, 3));
    let (mut o, mut stats) = (vec![0.0f32; h * d], vec![0.0f32; h * cpu::STATS_PER_ROW]);
    let opts = cpu::Options::default();
    for name in ["lssa", "lssa+rw15", "softmax+rw3", "relu-l1"] {
        let variant: Variant = name.parse().unwrap();
        // The cache grows a key per step, as in generation; its stride stays that of `most` keys.
        let step = |t_k: usize, o: &mut [f32], stats: &mut [f32]| {
            let mut p = Params {
                batch: 1,
                heads: h,
                kv_heads: h_kv,
                seq_len: 1,
                kv_len: t_k,
                head_dim: d,
                q: raw(&q, h, 1, d),
                k: raw(&k, h_kv, most, d),
                v: raw(&v, h_kv, most, d),
                o: RawTensor { ptr: o.as_mut_ptr().cast(), strides: [h * d, d, d] },
                stats: stats.as_mut_ptr(),
                rw_aux: std::ptr::null_mut(),
                d_out: null_input(),
                dq: null_output(),
                dk: null_output(),
                dv: null_output(),
                dtype: Dtype::F32,
            };
            p.kv_len = t_k;
            assert!(cpu::forward_starts_on_caller(&p));
            // SAFETY: every pointer addresses a live buffer of the sizes and strides given.
            unsafe { cpu::forward_raw(&variant, &p, &opts).unwrap() };
        };
        step(500, &mut o, &mut stats); // grows the buffers (to twice 500 keys' tiles)
        for t_k in [501, 520, 599] {
            let n = allocations(|| step(t_k, &mut o, &mut stats));
            assert_eq!(n, 0, "{name}: a step against {t_k} keys allocated {n} times");
            assert!(o.iter().all(|x| x.is_finite()), "{name}: the step ran");
        }
    }
}
