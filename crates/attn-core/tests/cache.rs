//! Queries that continue a sequence (a KV cache, chunked prefill) and grouped-query attention in the
//! reference: decoding a sequence row by row gives the rows of the full forward, a query head that
//! shares its key head computes what it would with its own copy, and the gradients of a shared key
//! head are the sum over its query heads (and match finite differences).

use attn_core::fixtures::{grads_rel_diff, max_abs_diff, numerical_grads, random_array, random_qkv};
use attn_core::{Variant, backward, forward, weights};
use ndarray::{Array4, Axis, s};

/// Every preset (sigmoid-bias with its training length) with and without re-weighting.
fn variants() -> Vec<Variant> {
    let mut out = Vec::new();
    for v in Variant::all_presets().into_iter().map(|v| v.with_train_len(1024)) {
        out.push(v.clone());
        out.push(v.with_reweight(15).unwrap());
    }
    out
}

/// `x` with every head repeated `g` times (head `h` of the result is head `h / g` of `x`).
fn repeat_heads(x: &Array4<f64>, g: usize) -> Array4<f64> {
    let (b, h, t, d) = x.dim();
    Array4::from_shape_fn((b, h * g, t, d), |(bi, hi, ti, di)| x[[bi, hi / g, ti, di]])
}

#[test]
fn decoding_row_by_row_and_chunked_prefill_give_the_full_forwards_rows() {
    let (q, k, v) = random_qkv::<f64>([2, 2, 9, 6], 11);
    for variant in variants() {
        let full = forward(&variant, &q, &k, &v).unwrap();
        // Chunked prefill: the last 5 rows against the whole sequence (same T_k: every variant).
        let chunk = forward(&variant, q.slice(s![.., .., 4.., ..]), &k, &v).unwrap();
        let err = max_abs_diff(&chunk, full.slice(s![.., .., 4.., ..]));
        assert!(err < 1e-13, "{variant}: chunk of 5 differs by {err}");
        // One token at a time against the cache so far: the rows of the full forward, except for
        // relu-seqlen, which divides by the sequence's length and so changes its rows as it grows.
        let name = variant.to_string();
        if name.starts_with("relu-seqlen") {
            continue;
        }
        for r in 0..9 {
            let one = forward(
                &variant,
                q.slice(s![.., .., r..=r, ..]),
                k.slice(s![.., .., ..=r, ..]),
                v.slice(s![.., .., ..=r, ..]),
            )
            .unwrap();
            let err = max_abs_diff(&one, full.slice(s![.., .., r..=r, ..]));
            assert!(err < 1e-13, "{variant}: row {r} decoded differs by {err}");
        }
    }
}

#[test]
fn relu_seqlen_decoded_rows_divide_by_the_sequence_so_far() {
    let (q, k, v) = random_qkv::<f64>([1, 1, 6, 4], 12);
    let variant: Variant = "relu-seqlen".parse().unwrap();
    let full = forward(&variant, &q, &k, &v).unwrap();
    // Row 2 of a 3-token sequence: the full 6-token forward divides it by 6, the decode by 3.
    let three =
        forward(&variant, q.slice(s![.., .., 2..=2, ..]), k.slice(s![.., .., ..3, ..]), v.slice(s![.., .., ..3, ..]))
            .unwrap();
    let scaled = full.slice(s![.., .., 2..=2, ..]).mapv(|x| x * 6.0 / 3.0);
    assert!(max_abs_diff(&three, &scaled) < 1e-13);
}

#[test]
fn grouped_query_heads_compute_what_repeated_key_heads_would_and_sum_their_gradients() {
    // 4 query heads over 2 key heads, a 3-row chunk of a 7-token sequence.
    let q = random_array::<f64>([2, 4, 3, 5], 13);
    let k = random_array::<f64>([2, 2, 7, 5], 14);
    let v = random_array::<f64>([2, 2, 7, 3], 15);
    let d_out = random_array::<f64>([2, 4, 3, 3], 16);
    let (kr, vr) = (repeat_heads(&k, 2), repeat_heads(&v, 2));
    for variant in variants() {
        let gqa = forward(&variant, &q, &k, &v).unwrap();
        let repeated = forward(&variant, &q, &kr, &vr).unwrap();
        assert!(max_abs_diff(&gqa, &repeated) < 1e-14, "{variant}");
        assert!(max_abs_diff(&weights(&variant, &q, &k).unwrap(), &weights(&variant, &q, &kr).unwrap()) < 1e-14);
        let g = backward(&variant, &q, &k, &v, &d_out).unwrap();
        let gr = backward(&variant, &q, &kr, &vr, &d_out).unwrap();
        assert_eq!((g.dk.dim(), g.dv.dim()), ((2, 2, 7, 5), (2, 2, 7, 3)));
        assert!(max_abs_diff(&g.dq, &gr.dq) < 1e-13, "{variant}: dq");
        // A key head's gradient: the sum over the query heads that read it.
        let sum_pairs = |x: &Array4<f64>| {
            let (b, h, t, d) = x.dim();
            Array4::from_shape_fn((b, h / 2, t, d), |(bi, hi, ti, di)| {
                x[[bi, 2 * hi, ti, di]] + x[[bi, 2 * hi + 1, ti, di]]
            })
        };
        assert!(max_abs_diff(&g.dk, &sum_pairs(&gr.dk)) < 1e-12, "{variant}: dk");
        assert!(max_abs_diff(&g.dv, &sum_pairs(&gr.dv)) < 1e-12, "{variant}: dv");
    }
}

#[test]
fn cached_and_grouped_gradients_match_finite_differences() {
    let q = random_array::<f64>([1, 4, 3, 4], 17);
    let k = random_array::<f64>([1, 2, 6, 4], 18);
    let v = random_array::<f64>([1, 2, 6, 3], 19);
    let d_out = random_array::<f64>([1, 4, 3, 3], 20);
    for name in ["softmax", "lssa", "lssa+rw15", "sigmoid-rowbias-l1+rw3", "relu-ln"] {
        let variant: Variant = name.parse().unwrap();
        let analytic = backward(&variant, &q, &k, &v, &d_out).unwrap();
        let numeric = numerical_grads(&variant, &q, &k, &v, &d_out, 1e-4).unwrap();
        let err = grads_rel_diff(&analytic, &numeric);
        assert!(err < 1e-6, "{name}: relative error {err}");
        // Sanity: the key gradient is not zero (the cache's keys matter).
        assert!(analytic.dk.index_axis(Axis(2), 0).iter().any(|x| x.abs() > 1e-9), "{name}");
    }
}
