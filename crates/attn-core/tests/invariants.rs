//! Invariants of the maths: row sums, LSSA row 1, the re-weighting's order / below-mean /
//! one-hot / arg-max / empty-row properties, closed forms of the presets, causality, and LSSAR at
//! T = 16384 in f32.

use attn_core::fixtures::{Adversarial, adversarial_qkv, random_array, random_qkv};
use attn_core::math::softplus;
use attn_core::stage::{reweight_offset, reweight_row};
use attn_core::{Bias, Scale, Stage1, Variant, forward, weights};
use ndarray::{Array4, s};
use proptest::prelude::*;

/// Every preset with and without re-weighting (sigmoid-bias with t_train = 1024).
fn presets_with_rw() -> Vec<Variant> {
    let mut out = Vec::new();
    for v in Variant::all_presets() {
        let v = v.with_train_len(1024);
        for p in [None, Some(1), Some(3), Some(15)] {
            out.push(Variant::new(v.stage1().clone(), p).unwrap());
        }
    }
    out
}

fn row(w: &Array4<f64>, b: usize, h: usize, i: usize) -> Vec<f64> {
    w.slice(s![b, h, i, ..=i]).to_vec()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn weights_non_negative_and_rows_sum_to_one(seed in 0u64..1000, t in 1usize..12, d in 1usize..9, kind in 0usize..3) {
        let shape = [1, 2, t, d];
        let (q, k, _) = match kind {
            0 => random_qkv::<f64>(shape, seed),
            1 => adversarial_qkv(Adversarial::HugeLogits { logit: 80.0 }, shape, seed),
            _ => adversarial_qkv(Adversarial::NearUniform { spread: 1e-3 }, shape, seed),
        };
        for variant in presets_with_rw().iter().filter(|v| v.rows_sum_to_one()) {
            let w = weights(variant, &q, &k).unwrap();
            for b in 0..2 {
                for i in 0..t {
                    let r = row(&w, 0, b, i);
                    let sum: f64 = r.iter().sum();
                    prop_assert!(r.iter().all(|&x| x >= 0.0), "{variant}: row {i} = {r:?}");
                    prop_assert!((sum - 1.0).abs() < 1e-12 || (sum == 0.0 && variant.activation().name().starts_with("relu")),
                        "{variant}: row {i} sums to {sum}");
                }
            }
        }
    }

    #[test]
    fn lssa_row_one_has_weight_one(seed in 0u64..1000, d in 1usize..9, factor in prop::option::of(-5.0..5.0f64), p in prop::option::of(1u32..40)) {
        let (q, k, _) = random_qkv::<f64>([1, 1, 4, d], seed);
        let lssa: Variant = "lssa".parse().unwrap();
        let variant = Variant::new(Stage1 { scale: Scale::LssaLog { d_factor: factor }, ..lssa.stage1().clone() }, p).unwrap();
        let w = weights(&variant, &q, &k).unwrap();
        prop_assert_eq!(w[[0, 0, 0, 0]], 1.0);
    }

    #[test]
    fn reweight_keeps_order_and_zeroes_below_mean(raw in prop::collection::vec(0.0..1.0f64, 1..40), p in 1u32..64) {
        let total: f64 = raw.iter().sum();
        prop_assume!(total > 0.0);
        let a: Vec<f64> = raw.iter().map(|x| x / total).collect();
        let n = a.len();
        let w = reweight_row(&a, p);
        prop_assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        for j in 0..n {
            for l in 0..n {
                if a[j] >= a[l] {
                    prop_assert!(w[j] >= w[l], "order broken: a {:?} w {:?}", a, w);
                }
            }
            // Rows > 3: keys at or below the row mean 1/N get exactly zero weight.
            if n > 3 && (n as f64) * a[j] - 1.0 <= 0.0 {
                prop_assert_eq!(w[j], 0.0);
            }
        }
    }

    #[test]
    fn reweight_is_a_no_op_on_one_hot_rows(n in 1usize..50, hot in 0usize..50, p in 1u32..=1024) {
        let hot = hot % n;
        let a: Vec<f64> = (0..n).map(|j| if j == hot { 1.0 } else { 0.0 }).collect();
        prop_assert_eq!(reweight_row(&a, p), a);
    }

    #[test]
    fn reweight_tends_to_argmax_as_p_grows(raw in prop::collection::vec(0.0..1.0f64, 2..30)) {
        let total: f64 = raw.iter().sum();
        let a: Vec<f64> = raw.iter().map(|x| x / total).collect();
        let mut sorted = a.clone();
        sorted.sort_by(|x, y| y.partial_cmp(x).unwrap());
        let n = a.len() as f64;
        let off = reweight_offset(a.len());
        // A clear winner after the offset: second-largest u at most 0.97 of the largest.
        prop_assume!((n * sorted[1] - off) <= 0.97 * (n * sorted[0] - off));
        let arg = a.iter().position(|&x| x == sorted[0]).unwrap();
        let mut last = 0.0;
        for p in [1, 2, 4, 15, 64, 256, 1024] {
            let w = reweight_row(&a, p);
            prop_assert!(w[arg] >= last - 1e-15, "max weight not increasing in p");
            last = w[arg];
        }
        prop_assert!(last > 1.0 - 1e-9, "p = 1024 gives max weight {last}");
    }
}

/// [choice] an empty row (every key at or below the mean, rows > 3) falls back to `w = a`.
#[test]
fn reweight_empty_row_falls_back_to_stage_one() {
    for n in [4, 5, 8, 64] {
        let a = vec![1.0 / n as f64; n];
        assert_eq!(reweight_row(&a, 15), a, "n = {n}");
    }
    // A signed stage 1 (inverse): every u < 0, so re-weighting changes nothing.
    let (q, k, _) = random_qkv::<f64>([1, 1, 7, 4], 3);
    let inv: Variant = "inverse".parse().unwrap();
    let inv_rw: Variant = "inverse+rw15".parse().unwrap();
    assert_eq!(weights(&inv, &q, &k).unwrap(), weights(&inv_rw, &q, &k).unwrap());
}

/// Rows 1..3 have no offset, so early uniform rows are not emptied.
#[test]
fn reweight_rows_one_to_three_have_no_offset() {
    assert_eq!(reweight_offset(1), 0.0);
    assert_eq!(reweight_offset(3), 0.0);
    assert_eq!(reweight_offset(4), 1.0);
    assert_eq!(reweight_row(&[1.0], 15), vec![1.0]);
    assert_eq!(reweight_row(&[0.5, 0.5], 15), vec![0.5, 0.5]);
    let w = reweight_row(&[0.2, 0.3, 0.5], 1);
    assert!((w[2] - 0.5).abs() < 1e-15 && w[0] > 0.0); // u = 3a, then l1: unchanged for p = 1
}

/// The streaming shortcut of SPEC section 3: `m_i = N_i max_j f_ij / Z_i - off_i`.
#[test]
fn reweight_max_follows_from_stage_one() {
    let s = [0.3, -1.0, 2.5, 0.7, 1.9];
    let lssa = Stage1::preset("lssa").unwrap();
    let a = lssa.weights_from_scores(&s);
    let f: Vec<f64> = s.iter().map(|&x| softplus(x)).collect();
    let z: f64 = f.iter().sum();
    let m_stream = 5.0 * f.iter().cloned().fold(0.0, f64::max) / z - 1.0;
    let m_direct = a.iter().map(|&x| 5.0 * x - 1.0).fold(0.0, f64::max);
    assert!((m_stream - m_direct).abs() < 1e-14);
}

fn naive_scores(q: &Array4<f64>, k: &Array4<f64>, i: usize, cosine: bool) -> Vec<f64> {
    let d = q.dim().3;
    let norm = |x: Vec<f64>| {
        let n = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        if cosine { x.iter().map(|v| v / n).collect() } else { x }
    };
    let qi = norm(q.slice(s![0, 0, i, ..]).to_vec());
    (0..=i)
        .map(|j| {
            let kj = norm(k.slice(s![0, 0, j, ..]).to_vec());
            qi.iter().zip(&kj).map(|(a, b)| a * b).sum::<f64>() / if cosine { 1.0 } else { (d as f64).sqrt() }
        })
        .collect()
}

/// Closed forms of SPEC section 4, written out by hand.
#[test]
fn presets_match_their_closed_forms() {
    let (q, k, _) = random_qkv::<f64>([1, 1, 7, 5], 21);
    let d = 5.0f64;
    let get = |name: &str| weights(&name.parse::<Variant>().unwrap().with_train_len(512), &q, &k).unwrap();
    let (softmax, lssa, recentered, relu_seqlen, relu_rowlen, sig_bias, sig_row, linear) = (
        get("softmax"),
        get("lssa"),
        get("recentered"),
        get("relu-seqlen"),
        get("relu-rowlen"),
        get("sigmoid-bias"),
        get("sigmoid-rowbias"),
        get("linear"),
    );
    let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
    let t = 7.0; // the sequence length: relu-seqlen divides every row by it
    for i in 0..7 {
        let n = (i + 1) as f64;
        let s = naive_scores(&q, &k, i, false);
        let e: Vec<f64> = s.iter().map(|x| x.exp()).collect();
        let z: f64 = e.iter().sum();
        let c = naive_scores(&q, &k, i, true);
        let sp: Vec<f64> = c.iter().map(|x| (1.0 + (d.ln() * n.ln() * x).exp()).ln()).collect();
        let zs: f64 = sp.iter().sum();
        for j in 0..=i {
            let close =
                |a: f64, b: f64, what: &str| assert!((a - b).abs() < 1e-12, "{what} row {i} key {j}: {a} vs {b}");
            close(softmax[[0, 0, i, j]], e[j] / z, "softmax");
            close(lssa[[0, 0, i, j]], sp[j] / zs, "lssa");
            let rc = if i + 1 > 3 { e[j] / z - 1.0 / n } else { e[j] / z };
            close(recentered[[0, 0, i, j]], rc, "recentered");
            close(relu_seqlen[[0, 0, i, j]], s[j].max(0.0) / t, "relu-seqlen");
            close(relu_rowlen[[0, 0, i, j]], s[j].max(0.0) / n, "relu-rowlen");
            close(sig_bias[[0, 0, i, j]], sig(s[j] - 512f64.ln()), "sigmoid-bias");
            close(sig_row[[0, 0, i, j]], sig(s[j] - n.ln()), "sigmoid-rowbias");
            close(linear[[0, 0, i, j]], s[j], "linear");
        }
        if i + 1 > 3 {
            let sum: f64 = (0..=i).map(|j| recentered[[0, 0, i, j]]).sum();
            assert!(sum.abs() < 1e-14, "recentered row {i} sums to {sum}");
        }
    }
    // inverse = -softmax; recentered-l1 rows have sum |.| = 1.
    assert_eq!(get("inverse"), -&softmax);
    let rl1 = get("recentered-l1");
    for i in 0..7 {
        let l1: f64 = (0..=i).map(|j| rl1[[0, 0, i, j]].abs()).sum();
        assert!((l1 - 1.0).abs() < 1e-14);
    }
}

/// relu-seqlen divides by the sequence length: the same row with the same scores gets half the
/// weights in a window twice as long (what lets its loss grow with length, as the paper's row
/// does); relu-rowlen divides by the row's own key count and does not see the window. Re-weighting
/// on top sees the smaller `a` (`u = N_i a - off_i` falls below 0 sooner).
#[test]
fn relu_seqlen_weights_shrink_with_the_window_and_relu_rowlen_weights_do_not() {
    let t = 6;
    let (q2, k2, _) = random_qkv::<f64>([1, 2, 2 * t, 4], 23);
    // The T-window is the first half of the 2T-window: rows 0..T see the same keys and scores.
    let (q1, k1) = (q2.slice(s![.., .., ..t, ..]).to_owned(), k2.slice(s![.., .., ..t, ..]).to_owned());
    let get = |name: &str, q: &Array4<f64>, k: &Array4<f64>| weights(&name.parse::<Variant>().unwrap(), q, k).unwrap();
    let (seq1, seq2) = (get("relu-seqlen", &q1, &k1), get("relu-seqlen", &q2, &k2));
    let (row1, row2) = (get("relu-rowlen", &q1, &k1), get("relu-rowlen", &q2, &k2));
    let mut positive = 0;
    for h in 0..2 {
        for i in 0..t {
            let s = {
                let qh = q1.slice(s![.., h..h + 1, .., ..]).to_owned();
                let kh = k1.slice(s![.., h..h + 1, .., ..]).to_owned();
                naive_scores(&qh, &kh, i, false)
            };
            for j in 0..=i {
                let relu = s[j].max(0.0);
                positive += usize::from(relu > 0.0);
                let close = |a: f64, b: f64, what: &str| {
                    assert!((a - b).abs() < 1e-12, "{what} head {h} row {i} key {j}: {a} vs {b}")
                };
                close(seq1[[0, h, i, j]], relu / t as f64, "relu-seqlen, T-window");
                close(seq2[[0, h, i, j]], relu / (2 * t) as f64, "relu-seqlen, 2T-window");
                close(seq2[[0, h, i, j]], seq1[[0, h, i, j]] / 2.0, "relu-seqlen halves");
                close(row1[[0, h, i, j]], relu / (i + 1) as f64, "relu-rowlen");
                assert_eq!(row1[[0, h, i, j]], row2[[0, h, i, j]], "relu-rowlen head {h} row {i} key {j}");
            }
        }
    }
    assert!(positive > 10, "too few positive scores ({positive}) for the test to mean anything");
    // The per-row helper treats its row as the last of its sequence: L = N.
    let last = naive_scores(&q1, &k1, t - 1, false);
    let by_row = "relu-seqlen".parse::<Variant>().unwrap().weights_from_scores(&last);
    for (j, w) in by_row.iter().enumerate() {
        assert!((w - seq1[[0, 0, t - 1, j]]).abs() < 1e-15);
    }
    // Re-weighting on top uses a as defined: u = N_i a_ij - off_i with a = ReLU(s) / T.
    let rw1 = get("relu-seqlen+rw3", &q1, &k1);
    for i in 0..t {
        let a: Vec<f64> = (0..=i).map(|j| seq1[[0, 0, i, j]]).collect();
        let expected = reweight_row(&a, 3);
        for j in 0..=i {
            assert!((rw1[[0, 0, i, j]] - expected[j]).abs() < 1e-14, "relu-seqlen+rw3 row {i} key {j}");
        }
    }
}

/// relu-ln: each output row has mean 0 and (biased) variance var / (var + 1e-5).
#[test]
fn relu_ln_output_rows_are_layer_normalised() {
    let (q, k, v) = random_qkv::<f64>([1, 2, 6, 8], 22);
    let ln: Variant = "relu-ln".parse().unwrap();
    let plain = Variant::new(Stage1 { output_norm: attn_core::OutputNorm::None, ..ln.stage1().clone() }, None).unwrap();
    let y = forward(&ln, &q, &k, &v).unwrap();
    let o = forward(&plain, &q, &k, &v).unwrap();
    for (yr, or) in y.rows().into_iter().zip(o.rows()) {
        let mean = or.mean().unwrap();
        let var = or.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 8.0;
        for (a, b) in yr.iter().zip(or.iter()) {
            assert!((a - (b - mean) / (var + 1e-5).sqrt()).abs() < 1e-12);
        }
    }
}

#[test]
fn every_variant_is_causal() {
    let (q, k, v) = random_qkv::<f64>([1, 2, 8, 4], 30);
    let (mut k2, mut v2) = (k.clone(), v.clone());
    k2.slice_mut(s![.., .., 5.., ..]).mapv_inplace(|x| 2.0 * x - 1.0);
    v2.slice_mut(s![.., .., 5.., ..]).mapv_inplace(|x| x + 3.0);
    for variant in presets_with_rw() {
        let (y1, y2) = (forward(&variant, &q, &k, &v).unwrap(), forward(&variant, &q, &k2, &v2).unwrap());
        assert_eq!(y1.slice(s![.., .., ..5, ..]), y2.slice(s![.., .., ..5, ..]), "{variant}");
        assert_ne!(y1, y2, "{variant}: later rows should change");
        let w = weights(&variant, &q, &k).unwrap();
        assert!(w.indexed_iter().all(|((_, _, i, j), &x)| j <= i || x == 0.0), "{variant}");
    }
}

#[test]
fn scale_and_bias_constants() {
    assert_eq!(Scale::InvSqrtD.value(10, 64), 0.125);
    assert_eq!(Scale::LssaLog { d_factor: None }.value(1, 64), 0.0);
    assert!((Scale::LssaLog { d_factor: None }.value(1024, 64) - 64f64.ln() * 1024f64.ln()).abs() < 1e-12);
    assert_eq!(Scale::LssaLog { d_factor: Some(4.0) }.value(8, 64), 4.0 * 8f64.ln());
    assert_eq!(Scale::LogNOverSqrtD.value(16, 4), 16f64.ln() / 2.0);
    assert_eq!(Bias::None.value(9).unwrap(), 0.0);
    assert_eq!(Bias::LogRowLen.value(9).unwrap(), -(9f64.ln()));
    assert_eq!(Bias::LogTrainLen { t_train: Some(1024) }.value(3).unwrap(), -(1024f64.ln()));
    assert!(Bias::LogTrainLen { t_train: None }.value(3).is_err());
    assert!(Bias::LogTrainLen { t_train: Some(0) }.value(3).is_err());
}

/// LSSAR at T = 16384 with one dominant key stays finite in f32. Key 0 is aligned with every
/// query and the others are anti-aligned, so on the last row `u_0 = N a_0 - 1` is in the
/// thousands and `u_0^15` would overflow f32 (and `(N - 1)^15` would too) without the `m_i`
/// rescaling. B = H = 1, d = 2 to stay fast (O(T) memory per row, O(T^2) time).
#[test]
fn lssar_long_sequence_with_one_dominant_key_is_finite_in_f32() {
    let t = 16384;
    let mut q = Array4::<f32>::zeros((1, 1, t, 2));
    let mut k = Array4::<f32>::zeros((1, 1, t, 2));
    let v = random_array::<f32>([1, 1, t, 2], 40);
    for i in 0..t {
        let angle = 1e-2 * (i % 97) as f32;
        q[[0, 0, i, 0]] = 1.0;
        q[[0, 0, i, 1]] = 0.01 * angle;
        k[[0, 0, i, 0]] = if i == 0 { 1.0 } else { -angle.cos() };
        k[[0, 0, i, 1]] = if i == 0 { 0.0 } else { angle.sin() };
    }
    let variant: Variant = "lssa+rw15".parse().unwrap();
    // The dominant key's u on the last row, from the stage-1 weights of that row.
    let a_last = {
        let last = |x: &Array4<f32>| x.slice(s![.., .., t - 1..t, ..]).to_owned();
        let (ql, kl) = (last(&q), k.clone());
        let s_row: Vec<f64> = (0..t)
            .map(|j| {
                let (qv, kv) = ([ql[[0, 0, 0, 0]], ql[[0, 0, 0, 1]]], [kl[[0, 0, j, 0]], kl[[0, 0, j, 1]]]);
                let dot =
                    |a: [f32; 2], b: [f32; 2]| f64::from(a[0]) * f64::from(b[0]) + f64::from(a[1]) * f64::from(b[1]);
                let cos = dot(qv, kv) / (dot(qv, qv).sqrt() * dot(kv, kv).sqrt());
                variant.stage1().scale.value(t, 2) * cos
            })
            .collect();
        variant.stage1().weights_from_scores(&s_row)
    };
    let u0 = t as f64 * a_last[0] - 1.0;
    assert!(u0.powi(15) > f64::from(f32::MAX), "test input is not adversarial enough: u0 = {u0}");
    let y = forward(&variant, &q, &k, &v).unwrap();
    assert!(y.iter().all(|x| x.is_finite()));
    // Re-weighting leaves the last row (almost) entirely on key 0.
    for c in 0..2 {
        assert!((y[[0, 0, t - 1, c]] - v[[0, 0, 0, c]]).abs() < 1e-4, "last row does not pick key 0");
    }
}
