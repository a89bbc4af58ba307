//! The CPU kernels on queries that continue a sequence (a KV cache: `q` holds the last `T_q` of
//! `T_k` rows) and on grouped-query attention (`H` query heads on `H_kv` key heads), against the
//! attn-core f64 reference and against the kernels' own whole-sequence results.
//!
//! Tolerance: the whole-sequence kernel's own error against the f64 reference is the yardstick (its
//! bound is the subject of `against_reference.rs`): a cached or grouped call must be within 2x that
//! error, plus 64 ulps of the output scale (times `max(1, p / 4)` with re-weighting, whose `u = N a - 1`
//! amplifies roundings by `p`). The per-row maths is the same; only which rows share a tile, and
//! whether the call's scores are provably in range (`engine::scores_in_range`, over the call's rows),
//! can differ.

mod common;
use common::{FUSED, max_abs_diff, to64, variant};

use attn_core::Variant;
use attn_core::fixtures::{max_abs, random_array};
use attn_kernels::cpu;
use ndarray::{Array4, Axis, s};

/// `x` (B, H_kv, T, d) with each key head repeated for its `group` query heads: (B, H_kv·group, T, d).
fn repeat_heads(x: &Array4<f32>, group: usize) -> Array4<f32> {
    let sh = x.shape();
    Array4::from_shape_fn((sh[0], sh[1] * group, sh[2], sh[3]), |(b, h, t, c)| x[[b, h / group, t, c]])
}

/// The sum over each group of `group` consecutive heads: the inverse of [`repeat_heads`] for gradients.
fn sum_groups(x: &Array4<f32>, group: usize) -> Array4<f32> {
    let sh = x.shape();
    Array4::from_shape_fn((sh[0], sh[1] / group, sh[2], sh[3]), |(b, hk, t, c)| {
        (0..group).map(|m| x[[b, hk * group + m, t, c]]).sum()
    })
}

fn bound(whole_err: f64, reference: &Array4<f64>, p: Option<u32>) -> f64 {
    let floor = p.map_or(1.0, |p| (f64::from(p) / 4.0).max(1.0));
    2.0 * whole_err + floor * 64.0 * f64::from(f32::EPSILON) * max_abs(reference).max(1.0)
}

/// Random inputs: q (B, H, T, d), k and v (B, H_kv, T, d), the upstream gradient (B, H, T, d).
struct Case {
    q: Array4<f32>,
    k: Array4<f32>,
    v: Array4<f32>,
    g: Array4<f32>,
    group: usize,
}

impl Case {
    fn new([b, h, h_kv, t, d]: [usize; 5], seed: u64) -> Self {
        Self {
            q: random_array([b, h, t, d], seed),
            k: random_array([b, h_kv, t, d], seed + 1),
            v: random_array([b, h_kv, t, d], seed + 2),
            g: random_array([b, h, t, d], seed + 3),
            group: h / h_kv,
        }
    }
}

#[test]
fn grouped_query_attention_equals_repeated_key_heads_with_summed_gradients() {
    let c = Case::new([2, 4, 2, 37, 24], 11);
    let (kr, vr) = (repeat_heads(&c.k, c.group), repeat_heads(&c.v, c.group));
    for name in FUSED {
        let v = variant(name);
        let want = attn_core::forward(&v, &to64(&c.q), &to64(&c.k), &to64(&c.v)).unwrap();
        let whole = cpu::forward(&v, &c.q, &kr, &vr).unwrap();
        let got = cpu::forward(&v, &c.q, &c.k, &c.v).unwrap();
        let tol = bound(max_abs_diff(&whole, &want), &want, v.reweight());
        let err = max_abs_diff(&got, &want);
        assert!(err <= tol, "{name}: grouped forward error {err:.3e} > {tol:.3e}");

        let want = attn_core::backward(&v, &to64(&c.q), &to64(&c.k), &to64(&c.v), &to64(&c.g)).unwrap();
        let whole = cpu::backward(&v, &c.q, &kr, &vr, &c.g).unwrap();
        let got = cpu::backward(&v, &c.q, &c.k, &c.v, &c.g).unwrap();
        assert_eq!(got.dk.shape(), c.k.shape());
        assert_eq!(got.dv.shape(), c.v.shape());
        for (what, got, whole, want) in [
            ("dq", &got.dq, whole.dq.clone(), &want.dq),
            ("dk", &got.dk, sum_groups(&whole.dk, c.group), &want.dk),
            ("dv", &got.dv, sum_groups(&whole.dv, c.group), &want.dv),
        ] {
            let tol = bound(max_abs_diff(&whole, want), want, v.reweight());
            let err = max_abs_diff(got, want);
            assert!(err <= tol, "{name}: grouped {what} error {err:.3e} > {tol:.3e}");
        }
    }
}

/// Decoding one token at a time, and a prefill in uneven chunks, give the rows of the whole
/// sequence's forward: for every fused variant, re-weighting included, on grouped heads. Except
/// `relu-seqlen` (and its re-weighting), which divides by the sequence's length, so that a row's
/// output depends on how many keys the call holds: there each call must match the reference of the
/// same call.
#[test]
fn decoding_row_by_row_and_chunked_prefill_equal_the_whole_forward() {
    let c = Case::new([1, 4, 2, 45, 16], 23);
    let t = c.q.shape()[2];
    for name in FUSED {
        let v = variant(name);
        let whole = cpu::forward(&v, &c.q, &c.k, &c.v).unwrap();
        let want = attn_core::forward(&v, &to64(&c.q), &to64(&c.k), &to64(&c.v)).unwrap();
        let tol = bound(max_abs_diff(&whole, &want), &want, v.reweight());
        let by_length = v.stage1().norm == attn_core::Norm::DivLen;
        // The calls: one row at a time (row r against keys 0..=r), then chunks that start and end
        // inside a tile.
        let steps: Vec<(usize, usize)> = (0..t).map(|r| (r, r + 1)).collect();
        for (what, calls) in [("decoded rows", steps), ("chunked prefill", vec![(0, 7), (7, 8), (8, 33), (33, t)])] {
            let mut rows = Vec::new();
            for (a, b) in calls {
                let (q, k, val) =
                    (c.q.slice(s![.., .., a..b, ..]), c.k.slice(s![.., .., ..b, ..]), c.v.slice(s![.., .., ..b, ..]));
                let o = cpu::forward(&v, q, k, val).unwrap();
                let call =
                    attn_core::forward(&v, &q.mapv(f64::from), &k.mapv(f64::from), &val.mapv(f64::from)).unwrap();
                let err = max_abs_diff(&o, &call);
                assert!(err <= tol, "{name}: {what}, rows {a}..{b}: error {err:.3e} > {tol:.3e}");
                rows.push(o);
            }
            let views: Vec<_> = rows.iter().map(|x| x.view()).collect();
            let joined = ndarray::concatenate(Axis(2), &views).unwrap();
            let err = max_abs_diff(&joined, &want);
            if by_length {
                assert!(err > 1e-3, "{name}: {what} should differ from the whole sequence's rows (T differs)");
            } else {
                assert!(err <= tol, "{name}: {what}' error against the whole forward {err:.3e} > {tol:.3e}");
            }
        }
    }
}

/// The backward of queries that continue a sequence: `dq` of those rows, and `dk`, `dv` of every
/// key from those rows alone, against the f64 reference of the same call.
#[test]
fn the_backward_of_a_continuing_chunk_matches_the_reference() {
    let c = Case::new([2, 4, 2, 41, 24], 37);
    let a = 29; // q: rows 29..41 of the 41-row sequence
    let q = c.q.slice(s![.., .., a.., ..]).to_owned();
    let g = c.g.slice(s![.., .., a.., ..]).to_owned();
    for name in FUSED {
        let v = variant(name);
        let whole = cpu::backward(&v, &c.q, &c.k, &c.v, &c.g).unwrap();
        let whole_want = attn_core::backward(&v, &to64(&c.q), &to64(&c.k), &to64(&c.v), &to64(&c.g)).unwrap();
        let want = attn_core::backward(&v, &to64(&q), &to64(&c.k), &to64(&c.v), &to64(&g)).unwrap();
        let got = cpu::backward(&v, &q, &c.k, &c.v, &g).unwrap();
        for (what, got, whole, whole_want, want) in [
            ("dq", &got.dq, &whole.dq, &whole_want.dq, &want.dq),
            ("dk", &got.dk, &whole.dk, &whole_want.dk, &want.dk),
            ("dv", &got.dv, &whole.dv, &whole_want.dv, &want.dv),
        ] {
            let tol = bound(max_abs_diff(whole, whole_want), whole_want, v.reweight());
            let err = max_abs_diff(got, want);
            assert!(err <= tol, "{name}: {what} of rows {a}.. error {err:.3e} > {tol:.3e}");
        }
    }
}

#[test]
fn shapes_that_do_not_continue_a_sequence_are_refused_as_attn_core_refuses_them() {
    let v = variant("lssa+rw15");
    let q = random_array::<f32>([1, 4, 8, 16], 1);
    for (k_shape, what) in
        [([1, 3, 8, 16], "3 key heads for 4 query heads"), ([1, 2, 7, 16], "7 keys for 8 query rows")]
    {
        let k = random_array::<f32>(k_shape, 2);
        let err = cpu::forward(&v, &q, &k, &k).unwrap_err().to_string();
        let want = attn_core::forward(&v, &to64(&q), &to64(&k), &to64(&k)).unwrap_err().to_string();
        assert_eq!(err, want, "{what}");
        assert!(err.contains("H_kv") && err.contains("T_k"), "{what}: {err}");
    }
}

/// Calls of at most `DIRECT_MAX_ROWS` (4) query rows compute their scores from `k` as it is, without
/// packing it; 5 rows pack. Both on every instruction set this CPU has, with tiles smaller than the
/// 70 keys, against the reference of the same call.
#[test]
fn short_calls_read_the_keys_unpacked_on_every_isa() {
    let c = Case::new([1, 4, 2, 70, 40], 47);
    for isa in cpu::Isa::all_supported() {
        let mut opts = cpu::Options { isa, ..Default::default() };
        opts.tuning.block_q = 16;
        opts.tuning.block_k = 24;
        for name in ["lssa", "lssa+rw15", "softmax", "relu-l1+rw3", "gelu-l1"] {
            let v = variant(name);
            let whole = cpu::forward_with(&v, &c.q, &c.k, &c.v, &opts).unwrap();
            let want = attn_core::forward(&v, &to64(&c.q), &to64(&c.k), &to64(&c.v)).unwrap();
            let tol = bound(max_abs_diff(&whole, &want), &want, v.reweight());
            for rows in [1, 3, 4, 5] {
                let q = c.q.slice(s![.., .., 70 - rows.., ..]);
                let got = cpu::forward_with(&v, q, &c.k, &c.v, &opts).unwrap();
                let call = attn_core::forward(&v, &q.mapv(f64::from), &to64(&c.k), &to64(&c.v)).unwrap();
                let err = max_abs_diff(&got, &call);
                assert!(err <= tol, "{isa:?} {name}, {rows} rows: error {err:.3e} > {tol:.3e}");
            }
        }
    }
}

/// A short forward takes each key's norm with its dot product, in f32 lanes: keys whose squares
/// overflow f32 (|k| of 1e20) or whose norm is clamped (1e-20) still give the reference's scores.
#[test]
fn a_short_forward_normalises_huge_and_tiny_keys_as_the_reference() {
    let c = Case::new([1, 2, 2, 9, 16], 53);
    let mut k = c.k.clone();
    k.slice_mut(s![.., .., 2, ..]).mapv_inplace(|x| x * 1e20);
    k.slice_mut(s![.., .., 5, ..]).mapv_inplace(|x| x * 1e-20);
    for name in ["lssa", "lssa+rw15"] {
        let v = variant(name);
        let q = c.q.slice(s![.., .., 8.., ..]);
        let got = cpu::forward(&v, q, &k, &c.v).unwrap();
        let want = attn_core::forward(&v, &q.mapv(f64::from), &to64(&k), &to64(&c.v)).unwrap();
        let err = max_abs_diff(&got, &want);
        assert!(err <= 1e-5, "{name}: error {err:.3e}");
    }
}

/// A short call's backward recomputes exactly the scores its forward normalised. With `relu-l1` and
/// one key whose score is a small difference of large terms, `a = f / Z` is 1 only if both passes
/// round the dot product (and the key norm) the same way; `dv` is then `g` itself. (A backward that
/// packed the keys while the forward did not was off by 1e-4 here, and by 1e-5 in the Python suite.)
#[test]
fn a_short_calls_backward_sees_the_scores_its_forward_normalised() {
    let d = 64;
    let q = random_array::<f32>([1, 1, 1, d], 61);
    let mut k = random_array::<f32>([1, 1, 1, d], 62);
    // Make q . k small (about 0.01) by moving k's last component: a sum of O(1) terms that cancel.
    let dot: f64 = (0..d).map(|c| f64::from(q[[0, 0, 0, c]]) * f64::from(k[[0, 0, 0, c]])).sum();
    let last = f64::from(q[[0, 0, 0, d - 1]]);
    k[[0, 0, 0, d - 1]] = (f64::from(k[[0, 0, 0, d - 1]]) - (dot - 0.01) / last) as f32;
    let v = random_array::<f32>([1, 1, 1, d], 63);
    let g = random_array::<f32>([1, 1, 1, d], 64);
    for name in ["relu-l1", "lssa", "relu-l1+rw3"] {
        let got = cpu::backward(&variant(name), &q, &k, &v, &g).unwrap();
        let err = got.dv.iter().zip(&g).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 64.0 * f32::EPSILON, "{name}: dv off g by {err:.3e}");
    }
}

/// A decoding step whose cache is split across threads (split-K: one key head on 3 threads, so 6
/// ranges of 8 key tiles): every fused variant's output, and the gradients of the split forward's
/// statistics, against the f64 reference of the same call, within the bound the unsplit call's own
/// error sets (the split changes only the order of the sums it merges).
#[test]
fn a_decoding_step_split_across_threads_matches_the_reference() {
    // 2100 keys of d = 64: 1 MiB of keys and values, above what a short call runs on its caller.
    let (t, d) = (2100, 64);
    let c = Case::new([1, 3, 1, t, d], 53);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    let opts = |split_keys| {
        let tuning = cpu::Tuning { block_q: 16, block_k: 32, split_keys, ..Default::default() };
        cpu::Options { tuning, ..Default::default() }
    };
    let (split, whole) = (opts(256), opts(usize::MAX));
    let mut differ = 0; // outputs where the split's order of sums shows: the split path ran
    for name in FUSED {
        let v = variant(name);
        for rows in [1, 3] {
            let (q, g) = (c.q.slice(s![.., .., t - rows.., ..]), c.g.slice(s![.., .., t - rows.., ..]));
            let (q64, k64, v64) = (q.mapv(f64::from), to64(&c.k), to64(&c.v));
            let want = attn_core::forward(&v, &q64, &k64, &v64).unwrap();
            let (got, unsplit) = pool.install(|| {
                (
                    cpu::forward_with(&v, q, &c.k, &c.v, &split).unwrap(),
                    cpu::forward_with(&v, q, &c.k, &c.v, &whole).unwrap(),
                )
            });
            let tol = bound(max_abs_diff(&unsplit, &want), &want, v.reweight());
            let err = max_abs_diff(&got, &want);
            assert!(err <= tol, "{name}, {rows} rows: split forward error {err:.3e} > {tol:.3e}");
            differ += usize::from(got != unsplit);
            let grads_want = attn_core::backward(&v, &q64, &k64, &v64, &g.mapv(f64::from)).unwrap();
            let (grads, grads_unsplit) = pool.install(|| {
                let run = |o| cpu::backward_with(&v, q, &c.k, &c.v, g, o).unwrap();
                (run(&split), run(&whole))
            });
            for (what, got, unsplit, want) in [
                ("dq", &grads.dq, &grads_unsplit.dq, &grads_want.dq),
                ("dk", &grads.dk, &grads_unsplit.dk, &grads_want.dk),
                ("dv", &grads.dv, &grads_unsplit.dv, &grads_want.dv),
            ] {
                let tol = bound(max_abs_diff(unsplit, want), want, v.reweight());
                let err = max_abs_diff(got, want);
                assert!(err <= tol, "{name}, {rows} rows: {what} of the split forward, error {err:.3e} > {tol:.3e}");
            }
        }
    }
    assert!(differ > FUSED.len() / 2, "only {differ} split outputs differ from the unsplit ones in any bit");
}

/// The tiled forward of grouped-query attention, which runs a key head's `G` query heads as the
/// `G block_q` rows of one task, with query tiles smaller and larger than the group and key tiles
/// that divide nothing, on queries that continue a sequence, against the reference of the same call.
#[test]
fn grouped_query_tiles_of_any_size_match_the_reference() {
    let c = Case::new([1, 6, 2, 29, 16], 61);
    let a = 6; // q: rows 6..29 of the 29-row sequence
    let q = c.q.slice(s![.., .., a.., ..]);
    let want_of = |v: &Variant| attn_core::forward(v, &q.mapv(f64::from), &to64(&c.k), &to64(&c.v)).unwrap();
    let (kr, vr) = (repeat_heads(&c.k, c.group), repeat_heads(&c.v, c.group));
    for name in ["lssa", "lssa+rw15", "softmax+rw3", "relu-l1", "sigmoid-bias:t_train=16"] {
        let v = variant(name);
        let want = want_of(&v);
        let whole = cpu::forward(&v, q, &kr, &vr).unwrap();
        let tol = bound(max_abs_diff(&whole, &want), &want, v.reweight());
        for (block_q, block_k) in [(5, 7), (2, 9), (64, 64)] {
            let mut opts = cpu::Options::default();
            (opts.tuning.block_q, opts.tuning.block_k) = (block_q, block_k);
            let err = max_abs_diff(&cpu::forward_with(&v, q, &c.k, &c.v, &opts).unwrap(), &want);
            assert!(err <= tol, "{name}, block_q {block_q}: grouped tiles error {err:.3e} > {tol:.3e}");
        }
    }
}
