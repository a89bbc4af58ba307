//! A call on the OpenMP team (`cpu::Helpers::OpenMp`, what lssa-py runs under PyTorch) computes what
//! the same call on a rayon pool of as many threads computes, bit for bit: the split of the work
//! (a decoding step's whole key heads, or a long cache's key ranges merged in order; a longer call's
//! query tiles, the backward's key-tile chunks) depends only on the thread count, never on which
//! threads run it. The rayon path's own accuracy against the f64 reference is
//! `cached_and_grouped.rs`'s subject. Its own test binary, so that loading libgomp here (as
//! libtorch's wheels load theirs into the global scope) happens before the kernels look for it.

mod common;
use common::FUSED;

use attn_core::fixtures::random_array;
use attn_kernels::cpu;
use ndarray::s;

/// libgomp loaded into the global scope, as libtorch's wheels load theirs (kept for the process:
/// the runtime's threads live on, so it is never unloaded); then its team of `threads` threads and a
/// rayon pool of as many.
fn openmp_and_rayon(threads: usize) -> (cpu::Helpers, rayon::ThreadPool) {
    // SAFETY: libgomp runs no initialiser that depends on anything but the C library.
    let lib = unsafe {
        libloading::os::unix::Library::open(
            Some("libgomp.so.1"),
            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
        )
    }
    .expect("libgomp.so.1 (GCC's OpenMP runtime, which the C compiler of the build brings)");
    std::mem::forget(lib);
    let openmp = cpu::Helpers::openmp(threads).expect("GOMP_parallel once libgomp is loaded");
    (openmp, rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap())
}

#[test]
fn a_decoding_step_on_the_openmp_team_equals_the_rayon_one_bit_for_bit() {
    let (openmp, pool) = openmp_and_rayon(3);
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
}

/// Training calls: the forward of every query tile and the backward's phases (row gradients, key
/// tiles in chunks, the `dq` sums, the grouped heads' sums) on the team, against the rayon pool.
/// Fewer heads than threads makes the backward split key tiles into chunks.
#[test]
fn a_training_call_on_the_openmp_team_equals_the_rayon_one_bit_for_bit() {
    let (openmp, pool) = openmp_and_rayon(3);
    for (batch, heads, kv_heads, t) in [(2, 2, 2, 150), (1, 2, 2, 300), (1, 4, 2, 150)] {
        let d = 32;
        let q = random_array::<f32>([batch, heads, t, d], 81);
        let k = random_array::<f32>([batch, kv_heads, t, d], 82);
        let v = random_array::<f32>([batch, kv_heads, t, d], 83);
        let g = random_array::<f32>([batch, heads, t, d], 84);
        let rayon_opts = cpu::Options::default();
        let openmp_opts = cpu::Options { helpers: openmp, ..rayon_opts };
        for name in FUSED {
            let var: attn_core::Variant = name.parse().unwrap();
            let shape = format!("{name}, B = {batch}, {heads}/{kv_heads} heads, T = {t}");
            let want = pool.install(|| cpu::forward_with(&var, &q, &k, &v, &rayon_opts).unwrap());
            let got = cpu::forward_with(&var, &q, &k, &v, &openmp_opts).unwrap();
            assert!(got == want, "{shape}: the forwards differ");
            let want = pool.install(|| cpu::backward_with(&var, &q, &k, &v, &g, &rayon_opts).unwrap());
            let got = cpu::backward_with(&var, &q, &k, &v, &g, &openmp_opts).unwrap();
            assert!(got == want, "{shape}: the gradients differ");
        }
    }
}
