//! A forward whose tasks run bands of query tiles in lockstep, key tile after key tile
//! (`Tuning::band`, what AMX's default tiles do), computes what one task a query tile computes, bit
//! for bit, on every ISA the machine runs: the outputs, and through the backward, which reads them,
//! the rows' statistics. Accuracy against the f64 reference is `against_reference.rs`'s subject.

mod common;
use common::variant;

use attn_core::fixtures::random_array;
use attn_kernels::cpu::{self, Isa, Options, Tuning};

#[test]
fn a_band_of_query_tiles_computes_what_a_task_a_tile_computes() {
    // One thread: a call takes fewer tiles a band where it would make fewer than 8 tasks a thread.
    // 4 heads of 300 rows: 19 query tiles of 16 (bands of 3 and of 4 both end in a partial band,
    // and the last tile has 12 rows), or 10 of 32 (the last 12 rows: under AMX a partial block of
    // 16, whose padding rows must be zero in every tile of a band).
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let (b, h, t, d) = (1, 4, 300, 64);
    let q = random_array::<f32>([b, h, t, d], 81);
    let k = random_array::<f32>([b, h, t, d], 82);
    let v = random_array::<f32>([b, h, t, d], 83);
    let g = random_array::<f32>([b, h, t, d], 84);
    for isa in Isa::all_supported() {
        for (block_q, block_k) in [(16, 24), (32, 128)] {
            let opts = |band| {
                let tuning = Tuning { block_q, block_k, band, ..Tuning::for_isa(isa) };
                Options { tuning, isa, ..Default::default() }
            };
            for name in ["lssa", "softmax", "linear-l1", "relu-l1", "sigmoid-rowbias-l1", "lssa+rw15"] {
                let var = variant(name);
                let run = |band| {
                    pool.install(|| {
                        let o = cpu::forward_with(&var, &q, &k, &v, &opts(band)).unwrap();
                        (o, cpu::backward_with(&var, &q, &k, &v, &g, &opts(band)).unwrap())
                    })
                };
                let (o1, g1) = run(1);
                for band in [3, 4] {
                    let (o, gr) = run(band);
                    let at = format!("{name}, {isa:?}, tiles {block_q} x {block_k}, band {band}");
                    assert!(o == o1, "{at}: outputs differ");
                    assert!(gr.dq == g1.dq && gr.dk == g1.dk && gr.dv == g1.dv, "{at}: gradients differ");
                }
            }
        }
    }
}
