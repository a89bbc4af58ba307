//! A decoding step on the OpenMP team (`cpu::Helpers::OpenMp`, what lssa-py runs under PyTorch)
//! computes what the same step on a rayon pool of as many threads computes, bit for bit: the split of
//! the work (whole key heads, or a long cache's key ranges merged in order) depends only on the thread
//! count, never on which threads run it. The rayon path's own accuracy against the f64 reference is
//! `cached_and_grouped.rs`'s subject. Its own test binary, so that loading libgomp here (as
//! libtorch's wheels load theirs into the global scope) happens before the kernels look for it.

mod common;
use common::FUSED;

use attn_core::fixtures::random_array;
use attn_kernels::cpu;
use ndarray::s;

#[test]
fn a_decoding_step_on_the_openmp_team_equals_the_rayon_one_bit_for_bit() {
    // SAFETY: libgomp runs no initialiser that depends on anything but the C library.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some("libgomp.so.1"),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .expect("libgomp.so.1 (GCC's OpenMP runtime, which the C compiler of the build brings)");
    let threads = 3;
    let openmp = cpu::Helpers::openmp(threads).expect("GOMP_parallel once libgomp is loaded");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    // 6 key heads of 2100 keys (whole heads, 2 a thread) and 1 key head (its cache split in 6 ranges).
    for (heads, kv_heads) in [(6, 6), (3, 1)] {
        let (t, d) = (2100, 64);
        let q = random_array::<f32>([1, heads, t, d], 71);
        let k = random_array::<f32>([1, kv_heads, t, d], 72);
        let v = random_array::<f32>([1, kv_heads, t, d], 73);
        let tuning = cpu::Tuning { split_keys: 256, ..Default::default() };
        let rayon_opts = cpu::Options { tuning, ..Default::default() };
        let openmp_opts = cpu::Options { helpers: openmp, ..rayon_opts };
        for name in FUSED {
            let var: attn_core::Variant = name.parse().unwrap();
            for rows in [1, 3] {
                let q = q.slice(s![.., .., t - rows.., ..]);
                let want = pool.install(|| cpu::forward_with(&var, q, &k, &v, &rayon_opts).unwrap());
                let got = cpu::forward_with(&var, q, &k, &v, &openmp_opts).unwrap();
                assert!(got == want, "{name}, {heads}/{kv_heads} heads, {rows} rows: OpenMP and rayon differ");
            }
        }
    }
    std::mem::forget(lib);
}
