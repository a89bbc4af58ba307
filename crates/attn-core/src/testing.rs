//! Property-test kit (feature `testing`): `check_activation` for a new activation, `check_variant`
//! for a whole variant, plus the [`crate::fixtures`] helpers for checking a kernel against the
//! reference.
//!
//! Every check panics with a message naming the activation or variant and the failing input,
//! like `assert!`. The proptest runs use a fixed seed, so a check that passes once always passes.
//!
//! ```
//! use attn_core::Activation;
//!
//! /// Squareplus `(x + sqrt(x^2 + 4)) / 2`, written without cancellation or overflow.
//! #[derive(Debug, Clone)]
//! struct Squareplus;
//!
//! impl Activation for Squareplus {
//!     fn name(&self) -> &str { "squareplus" }
//!     fn value(&self, x: f64) -> f64 {
//!         let r = x.hypot(2.0);
//!         if x >= 0.0 { 0.5 * (x + r) } else { 2.0 / (r - x) }
//!     }
//!     fn derivative(&self, x: f64) -> f64 {
//!         let r = x.hypot(2.0);
//!         if x >= 0.0 { 0.5 * (1.0 + x / r) } else { 2.0 / (r * (r - x)) }
//!     }
//!     fn is_non_negative(&self) -> bool { true }
//! }
//!
//! attn_core::testing::check_activation(&Squareplus);
//! ```

use std::sync::Arc;

use ndarray::{Array4, s};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::activation::Activation;
pub use crate::fixtures::*;
use crate::reference::{backward, forward, weights};
use crate::stage::Stage1;
use crate::variant::Variant;

/// Inputs at which every activation must not return NaN (and must be finite where `|x| <= 88`).
pub const EXTREME_INPUTS: [f64; 17] =
    [0.0, 1e-30, -1e-30, 1.0, -1.0, 10.0, -10.0, 88.0, -88.0, 1e4, -1e4, 1e30, -1e30, 1e300, -1e300, 0.5, -0.5];

/// Default relative tolerance of the finite-difference gradient checks (f64).
pub const GRAD_TOL: f64 = 1e-6;

fn runner(cases: u32) -> TestRunner {
    TestRunner::new_with_rng(
        Config { cases, failure_persistence: None, ..Config::default() },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    )
}

/// Run the whole kit on an activation (see the module docs for an example):
///
/// 1. `derivative` against central differences at random points (kinks, where the one-sided
///    differences disagree, are skipped);
/// 2. no NaN at [`EXTREME_INPUTS`], finite values for `|x| <= 88`, and `value >= 0` when it
///    declares [`Activation::is_non_negative`];
/// 3. for non-negative activations, rows of the stage-1 weights (`phi` + l1) with scores up to
///    `+-1e4` are finite, non-negative and sum to 1 (or are all zero when every `phi` is 0); for
///    the others, finite with `sum |a| = 1` or 0;
/// 4. causality of `phi` + l1 with and without `+rw3`;
/// 5. analytic gradients of `phi` + l1 (and `+rw3`) against finite differences.
///
/// # Panics
/// On the first failed property, with a message naming the activation and the input.
pub fn check_activation<A: Activation + Clone + 'static>(activation: &A) {
    check_activation_arc(Arc::new(activation.clone()));
}

/// [`check_activation`] for a shared activation.
pub fn check_activation_arc(activation: Arc<dyn Activation>) {
    let name = activation.name().to_string();
    check_derivative(&*activation, &name);
    check_extremes(&*activation, &name);
    check_rows(&activation, &name);
    let base = Variant::new(Stage1::new(activation), None).expect("no power to check");
    for variant in [base.clone(), base.with_reweight(3).expect("3 is a valid power")] {
        check_causality(&variant, [1, 2, 7, 4], 11);
        for seed in 0..2 {
            let (q, k, v) = random_qkv::<f64>([1, 2, 5, 4], 100 + seed);
            check_gradients(&variant, &q, &k, &v, GRAD_TOL);
        }
    }
}

fn check_derivative(act: &dyn Activation, name: &str) {
    let strategy = prop_oneof![-5.0..5.0f64, -40.0..40.0f64];
    let result = runner(256).run(&strategy, |x| {
        let h = 1e-6 * x.abs().max(1.0);
        let (vm, v0, vp) = (act.value(x - h), act.value(x), act.value(x + h));
        let central = (vp - vm) / (2.0 * h);
        let (left, right) = ((v0 - vm) / h, (vp - v0) / h);
        let d = act.derivative(x);
        let scale = 1f64.max(d.abs()).max(central.abs());
        if (left - right).abs() > 1e-3 * scale {
            return Ok(()); // a kink within h of x
        }
        prop_assert!((d - central).abs() <= 1e-6 * scale, "derivative({x}) = {d}, central difference {central}");
        Ok(())
    });
    if let Err(e) = result {
        panic!("check_activation(`{name}`): derivative does not match finite differences: {e}");
    }
}

fn check_extremes(act: &dyn Activation, name: &str) {
    for &x in &EXTREME_INPUTS {
        let (v, d) = (act.value(x), act.derivative(x));
        assert!(!v.is_nan() && !d.is_nan(), "check_activation(`{name}`): NaN at x = {x:e} (value {v}, derivative {d})");
        if x.abs() <= 88.0 {
            assert!(
                v.is_finite() && d.is_finite(),
                "check_activation(`{name}`): not finite at x = {x:e} (value {v}, derivative {d})"
            );
        }
        if act.is_non_negative() {
            assert!(v >= 0.0, "check_activation(`{name}`): declared non-negative but value({x:e}) = {v}");
        }
    }
}

fn check_rows(act: &Arc<dyn Activation>, name: &str) {
    let stage1 = Stage1::new(act.clone());
    let score = prop_oneof![
        3 => -10.0..10.0f64,
        1 => -1e4..1e4f64,
        1 => prop::sample::select(vec![0.0, 88.0, -88.0, 1e4, -1e4, 700.0, -700.0]),
    ];
    let strategy = prop::collection::vec(score, 1..24);
    let nonneg = act.is_non_negative();
    let result = runner(256).run(&strategy, |s| {
        let a = stage1.weights_from_scores(&s);
        prop_assert!(a.iter().all(|x| x.is_finite()), "non-finite weights {a:?}");
        // Under l1 a running-max activation is evaluated at s - max s (SPEC section 2).
        let shift = if act.needs_running_max() { s.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x)) } else { 0.0 };
        let all_zero = s.iter().all(|&x| act.value(x - shift) == 0.0);
        let total: f64 = if nonneg { a.iter().sum() } else { a.iter().map(|x| x.abs()).sum() };
        if nonneg {
            prop_assert!(a.iter().all(|&x| x >= 0.0), "negative weight in {a:?}");
        }
        if all_zero {
            prop_assert!(total == 0.0, "all phi are 0 but the weights are {a:?}");
        } else {
            prop_assert!((total - 1.0).abs() <= 1e-12 * s.len() as f64, "row sums to {total}, weights {a:?}");
        }
        Ok(())
    });
    if let Err(e) = result {
        let hint = if nonneg && !act.needs_running_max() {
            " (an exponential-type activation must declare `needs_running_max`)"
        } else {
            ""
        };
        panic!("check_activation(`{name}`): stage-1 rows with phi + l1 are wrong{hint}: {e}");
    }
}

/// Panics unless changing a future key or value (position 5, or `T - 2`) leaves every earlier row
/// of the output and of the weights bit-for-bit unchanged.
pub fn check_causality(variant: &Variant, shape: [usize; 4], seed: u64) {
    let t = shape[2];
    assert!(t >= 2, "check_causality needs T >= 2");
    let pos = 5.min(t - 2).max(1);
    let (q, k, v) = random_qkv::<f64>(shape, seed);
    let (mut k2, mut v2) = (k.clone(), v.clone());
    k2.slice_mut(s![.., .., pos, ..]).mapv_inplace(|x| 3.0 * x + 1.0);
    v2.slice_mut(s![.., .., pos, ..]).mapv_inplace(|x| -2.0 * x + 0.5);
    let run = |k: &Array4<f64>, v: &Array4<f64>| {
        let y = forward(variant, &q, k, v).unwrap_or_else(|e| panic!("`{variant}`: forward failed: {e}"));
        let w = weights(variant, &q, k).unwrap_or_else(|e| panic!("`{variant}`: weights failed: {e}"));
        (y, w)
    };
    let (y1, w1) = run(&k, &v);
    let (y2, w2) = run(&k2, &v2);
    let before = s![.., .., ..pos, ..];
    assert!(
        y1.slice(before) == y2.slice(before) && w1.slice(before) == w2.slice(before),
        "`{variant}` is not causal: changing key/value {pos} changed an earlier row"
    );
    assert!(
        w1.indexed_iter().all(|((_, _, i, j), &x)| j <= i || x == 0.0),
        "`{variant}`: a weight above the diagonal is non-zero"
    );
}

/// Panics unless the analytic gradients of `variant` at `(q, k, v)` match fourth-order finite
/// differences (`step = 1e-5`) with [`grads_rel_diff`] `< tol`. `d_out` is drawn from a fixed seed.
pub fn check_gradients(variant: &Variant, q: &Array4<f64>, k: &Array4<f64>, v: &Array4<f64>, tol: f64) {
    let d_out = random_array::<f64>(shape4(v), 4242);
    let analytic = backward(variant, q, k, v, &d_out).unwrap_or_else(|e| panic!("`{variant}`: backward failed: {e}"));
    let numeric =
        numerical_grads(variant, q, k, v, &d_out, 1e-5).unwrap_or_else(|e| panic!("`{variant}`: forward failed: {e}"));
    let err = grads_rel_diff(&analytic, &numeric);
    assert!(
        err < tol,
        "`{variant}`: analytic gradient differs from finite differences: relative error {err:e} >= {tol:e}\n\
         analytic: {analytic:?}\nnumeric: {numeric:?}"
    );
}

/// Causality, gradients on random and adversarial inputs (huge logits, near-uniform rows), and,
/// where the variant promises it, non-negative rows summing to 1. Panics on failure.
pub fn check_variant(variant: &Variant) {
    check_causality(variant, [1, 2, 7, 4], 5);
    let shape = [1, 2, 6, 4];
    let mut inputs = vec![random_qkv::<f64>(shape, 1), random_qkv::<f64>(shape, 2)];
    inputs.push(adversarial_qkv(Adversarial::HugeLogits { logit: 20.0 }, shape, 3));
    inputs.push(adversarial_qkv(Adversarial::NearUniform { spread: 0.05 }, shape, 4));
    for (q, k, v) in &inputs {
        check_gradients(variant, q, k, v, GRAD_TOL);
        if variant.rows_sum_to_one() {
            let w = weights(variant, q, k).unwrap_or_else(|e| panic!("`{variant}`: weights failed: {e}"));
            for row in w.rows() {
                let sum: f64 = row.sum();
                assert!(row.iter().all(|&x| x >= 0.0), "`{variant}`: negative weight in {row}");
                assert!((sum - 1.0).abs() < 1e-12 || sum == 0.0, "`{variant}`: row sums to {sum}");
            }
        }
    }
}
