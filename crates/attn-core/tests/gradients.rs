//! Analytic gradients of every variant (with and without `+rw1`, `+rw3`, `+rw15`) against
//! fourth-order finite differences in f64, on random and adversarial inputs.

use attn_core::fixtures::{Adversarial, adversarial_qkv, grads_rel_diff, numerical_grads, random_array, random_qkv};
use attn_core::{Bias, Scale, Scores, Variant, backward, forward};
use ndarray::Array4;

/// Relative error bound of SPEC/issue: analytic vs finite differences in f64.
const TOL: f64 = 1e-6;

/// Every preset (sigmoid-bias with `t_train = 1024`), a parameterised LSSA, and two custom
/// stage 1s, each without re-weighting and with `p` = 1, 3, 15.
fn all_variants() -> Vec<Variant> {
    let mut base: Vec<Variant> = Variant::all_presets().into_iter().map(|v| v.with_train_len(1024)).collect();
    base.push("lssa:d_factor=4.0".parse().unwrap());
    base.push(Variant::builder().scale(Scale::LogNOverSqrtD).build().unwrap());
    base.push(
        Variant::builder().preset("sigmoid-l1").unwrap().scores(Scores::Cosine).bias(Bias::LogRowLen).build().unwrap(),
    );
    let mut all = Vec::new();
    for v in base {
        for p in [None, Some(1), Some(3), Some(15)] {
            all.push(Variant::new(v.stage1().clone(), p).unwrap());
        }
    }
    all
}

fn grad_error(variant: &Variant, q: &Array4<f64>, k: &Array4<f64>, v: &Array4<f64>, seed: u64) -> f64 {
    let d_out = random_array::<f64>([v.dim().0, v.dim().1, v.dim().2, v.dim().3], seed);
    let analytic = backward(variant, q, k, v, &d_out).unwrap();
    let numeric = numerical_grads(variant, q, k, v, &d_out, 1e-5).unwrap();
    grads_rel_diff(&analytic, &numeric)
}

/// One checking helper, many cases: every variant on one kind of input.
fn check_all(name: &str, inputs: &[(Array4<f64>, Array4<f64>, Array4<f64>)]) {
    let mut failures = Vec::new();
    for variant in all_variants() {
        for (n, (q, k, v)) in inputs.iter().enumerate() {
            let err = grad_error(&variant, q, k, v, 77 + n as u64);
            if err.is_nan() || err >= TOL {
                failures.push(format!("{variant} (input {n}): {err:e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{name}: gradient mismatches:\n{}", failures.join("\n"));
}

#[test]
fn every_variant_gradient_matches_finite_differences_on_random_inputs() {
    check_all("random", &[random_qkv([1, 2, 6, 4], 1), random_qkv([2, 1, 5, 3], 2)]);
}

#[test]
fn every_variant_gradient_matches_finite_differences_on_huge_logits() {
    check_all(
        "huge logits",
        &[
            adversarial_qkv(Adversarial::HugeLogits { logit: 20.0 }, [1, 2, 6, 4], 3),
            adversarial_qkv(Adversarial::HugeLogits { logit: 40.0 }, [1, 1, 7, 3], 4),
        ],
    );
}

#[test]
fn every_variant_gradient_matches_finite_differences_on_near_uniform_rows() {
    check_all(
        "near-uniform",
        &[
            adversarial_qkv(Adversarial::NearUniform { spread: 0.05 }, [1, 2, 6, 4], 5),
            adversarial_qkv(Adversarial::NearUniform { spread: 0.01 }, [1, 1, 7, 3], 6),
        ],
    );
}

#[test]
fn gradient_with_separate_value_dim() {
    let (q, k, _) = random_qkv::<f64>([1, 2, 6, 4], 9);
    let v = random_array::<f64>([1, 2, 6, 3], 10);
    for name in ["softmax", "lssa+rw15", "relu-ln", "recentered-l1+rw3"] {
        let variant: Variant = name.parse().unwrap();
        let err = grad_error(&variant, &q, &k, &v, 11);
        assert!(err < TOL, "{name}: {err:e}");
    }
}

/// The sequence-length divisor (`relu-seqlen`, `df = da / T`) and its per-row twin
/// (`relu-rowlen`, `df = da / N_i`), alone and re-weighted, on inputs with positive and negative
/// scores; the two give different gradients (they are different functions of the scores).
#[test]
fn relu_seqlen_and_relu_rowlen_gradients_match_finite_differences() {
    let (q, k, v) = random_qkv::<f64>([1, 2, 7, 4], 16);
    let d_out = random_array::<f64>([1, 2, 7, 4], 17);
    for name in ["relu-seqlen", "relu-seqlen+rw3", "relu-seqlen+rw15", "relu-rowlen", "relu-rowlen+rw3"] {
        let variant: Variant = name.parse().unwrap();
        let err = grad_error(&variant, &q, &k, &v, 18);
        assert!(err < TOL, "{name}: {err:e}");
    }
    let grads = |name: &str| backward(&name.parse::<Variant>().unwrap(), &q, &k, &v, &d_out).unwrap();
    let (seq, row) = (grads("relu-seqlen"), grads("relu-rowlen"));
    assert!(seq.dq.iter().any(|&x| x != 0.0), "relu-seqlen: zero dq");
    // The last row has N = T: both divide it by T, so its dq agrees; earlier rows do not.
    let t = 6;
    for c in 0..4 {
        assert!((seq.dq[[0, 0, t, c]] - row.dq[[0, 0, t, c]]).abs() < 1e-12);
    }
    assert!((0..t).any(|i| (seq.dq[[0, 0, i, 0]] - row.dq[[0, 0, i, 0]]).abs() > 1e-6));
}

/// [choice] a zero-sum l1 row gives zero weights, zero output and zero gradient, never NaN.
#[test]
fn zero_sum_l1_row_has_zero_output_and_zero_gradient() {
    let (q, k, v) = adversarial_qkv::<f64>(Adversarial::AllNegative { logit: 5.0 }, [1, 2, 6, 4], 12);
    for name in ["relu-l1", "relu2-l1", "relu6-l1", "relu-l1+rw3", "relu-l1+rw15"] {
        let variant: Variant = name.parse().unwrap();
        let y = forward(&variant, &q, &k, &v).unwrap();
        assert!(y.iter().all(|&x| x == 0.0), "{name}: output {y}");
        let d_out = random_array::<f64>([1, 2, 6, 4], 13);
        let g = backward(&variant, &q, &k, &v, &d_out).unwrap();
        for (what, x) in [("dq", &g.dq), ("dk", &g.dk), ("dv", &g.dv)] {
            assert!(x.iter().all(|&x| x == 0.0), "{name}: {what} = {x}");
        }
    }
}

/// A zero query or key vector under cosine scores: the 1e-12 guard keeps everything finite.
#[test]
fn cosine_scores_with_zero_vectors_stay_finite() {
    let (mut q, mut k, v) = random_qkv::<f64>([1, 1, 5, 4], 14);
    q.slice_mut(ndarray::s![0, 0, 2, ..]).fill(0.0);
    k.slice_mut(ndarray::s![0, 0, 1, ..]).fill(0.0);
    let d_out = random_array::<f64>([1, 1, 5, 4], 15);
    for name in ["lssa", "lssa+rw15"] {
        let variant: Variant = name.parse().unwrap();
        let y = forward(&variant, &q, &k, &v).unwrap();
        let g = backward(&variant, &q, &k, &v, &d_out).unwrap();
        assert!(y.iter().chain(&g.dq).chain(&g.dk).chain(&g.dv).all(|x| x.is_finite()), "{name}");
    }
}

/// f32 inputs run the same f64 maths: results equal the f64 results rounded to f32.
#[test]
fn f32_inputs_match_f64_reference_rounded() {
    let (q, k, v) = random_qkv::<f32>([1, 2, 9, 5], 16);
    let d_out = random_array::<f32>([1, 2, 9, 5], 17);
    let wide = |x: &Array4<f32>| x.mapv(f64::from);
    for name in ["softmax", "lssa+rw15", "relu-ln", "sigmoid-rowbias-l1+rw3"] {
        let variant: Variant = name.parse().unwrap();
        let y32 = forward(&variant, &q, &k, &v).unwrap();
        let y64 = forward(&variant, &wide(&q), &wide(&k), &wide(&v)).unwrap();
        assert_eq!(y32, y64.mapv(|x| x as f32), "{name}");
        let g32 = backward(&variant, &q, &k, &v, &d_out).unwrap();
        let g64 = backward(&variant, &wide(&q), &wide(&k), &wide(&v), &wide(&d_out)).unwrap();
        assert_eq!(g32.dq, g64.dq.mapv(|x| x as f32), "{name}");
        assert_eq!(g32.dk, g64.dk.mapv(|x| x as f32), "{name}");
        assert_eq!(g32.dv, g64.dv.mapv(|x| x as f32), "{name}");
    }
}
