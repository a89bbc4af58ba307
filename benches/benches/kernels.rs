//! Criterion set for quick before/after checks of the fused CPU kernels: T = 1024, B = 1, H = 12,
//! d = 64, causal, f32; fused `lssa` and `lssa+rw15` forward against libtorch SDPA forward, all on the
//! same thread count (all cores).
//!
//! `cargo bench -p lssa-benches --bench kernels` (the full side-by-side table is `bench-kernels`).

use criterion::{Criterion, criterion_main};
use lssa_benches::workload::{Implementation, Pass, VariantSpec, Workload};

const T: usize = 1024;

fn kernels(c: &mut Criterion) {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    tch::set_num_threads(threads as i32);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("rayon pool");
    let work = Workload::new(1, 12, T, 64, 0);
    let mut group = c.benchmark_group(format!("attention_fwd_T{T}_H12_d64_{threads}threads"));
    group.sample_size(20);
    let cases =
        [(Implementation::Fused, "lssa"), (Implementation::Fused, "lssa+rw15"), (Implementation::Sdpa, "softmax")];
    for (imp, name) in cases {
        let variant: VariantSpec = name.parse().expect("a known variant");
        group.bench_function(format!("{imp}/{name}"), |b| {
            b.iter(|| work.run(imp, &variant, Pass::Forward, &pool).expect("benchmark run"))
        });
    }
    group.finish();
}

mod group {
    #![allow(missing_docs)] // `criterion_group!` expands to an undocumented `pub fn`.
    criterion::criterion_group!(benches, super::kernels);
}
criterion_main!(group::benches);
