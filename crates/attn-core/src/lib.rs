//! attn-core: the exact maths of Softplus attention with re-weighting (LSSA / LSSAR) and its
//! baselines, as an `f64` reference forward and backward on plain `ndarray` arrays.
//!
//! This crate is the ground truth of the workspace: it knows no tensor library and no GPU, and
//! every fused kernel is tested against it. Its three uses, each with an example below: read the
//! maths, check a kernel against the reference, and property-test a new activation.
//!
//! "SPEC section N" in this workspace's docs is a section of `docs/SPEC.md` in the repository: the
//! maths, variants, gradients, streaming algorithm, model, recipe and evaluation as implemented.
//!
//! Owns: the definitions (variants, activations, per-row constants, re-weighting) and the f64
//! reference. Must never depend on: a tensor library (`tch`), a GPU library, or any other crate of
//! this workspace; its only dependencies are `ndarray`, `num-traits`, `thiserror` (and `proptest`
//! behind `testing`).
//!
//! # Formulas
//!
//! Per head, causal, rows 1-indexed: row `i` sees keys `j <= i`, so `N_i = i`.
//!
//! ```text
//! stage 1   s_ij = scale_i * <q'_i, k'_j> + b_i          q', k': raw, or x / max(||x||, 1e-12)
//!           f_ij = phi(s_ij) * M_ij
//!           a_i. = transform(norm_i(f_i.))
//! stage 2   u_ij = N_i a_ij - off_i                     off_i = 0 if N_i <= 3 else 1
//! (+rw<p>)  r_ij = (ReLU(u_ij) / m_i)^p                 m_i = max_j ReLU(u_ij)
//!           w_ij = r_ij / W_i                           W_i = sum_j r_ij
//!           (m_i == 0, an "empty row": w_ij = a_ij)
//! output    o_i  = sum_j w_ij v_j                       (relu-ln: then layer norm over d)
//! ```
//!
//! - `scale_i` ([`Scale`]): `1/sqrt(d)`; LSSA `ln(d) * ln(N_i)` (the `ln(d)` factor may be
//!   overridden, `lssa:d_factor=4.0`); `ln(N_i)/sqrt(d)`.
//! - `b_i` ([`Bias`]): 0; `-ln(T_train)`; `-ln(N_i)`.
//! - `phi` ([`Activation`]): exp, softplus `max(x,0) + log1p(exp(-|x|))`, ReLU, ReLU^2,
//!   ReLU6 `min(max(x,0),6)`, GELU `x Phi(x)` (erf form), sigmoid (overflow-free), Mish
//!   `x tanh(softplus(x))`, identity.
//! - `norm_i` ([`Norm`]): l1 `f_ij / sum_k |f_ik|`; none; `f_ij / N_i`; `f_ij / L`, `L` the length of
//!   the sequence the row belongs to (`T` here; Wortsman et al.'s ReLU divided by the sequence length).
//! - `transform` ([`Transform`]): none; `-a`; recentred `a_ij - mean_k a_ik` for `N_i > 3` (rows
//!   1..3 unmodified); recentred then divided by `sum_k |.|`.
//! - softmax is exp + l1 evaluated as `exp(s - max_j s)` (the max cancels).
//! - LSSA: `a_ij = softplus(ln(d) ln(i) cos(q_i, k_j)) / sum_k softplus(...)`; row 1 has weight 1.
//!   LSSAR = `lssa+rw15`.
//!
//! Gradients (SPEC section 5), with `g_i = dL/do_i` and `D_i = <g_i, o_i>`: `dv_j = sum_i w_ij g_i`;
//! stage 2 `h_ij = (<g_i, v_j> - D_i) / W_i * p (u_ij/m_i)^(p-1) / m_i` (for `u_ij > 0`, else 0;
//! no gradient through `m_i`), `da_ij = N_i h_ij`; l1 `df_ij = (da_ij - sign(f_ij) sum_k a_ik da_ik)
//! / Z_i` (`sign = +1` for a non-negative `phi`; this is `N_i (h_ij - E_i) / Z_i` with
//! `E_i = sum_k a_ik h_ik`), `/ N_i` `df_ij = da_ij / N_i`, `/ L` `df_ij = da_ij / L`; `ds_ij = df_ij phi'(s_ij)`; `dq'_i = sum_j scale_i ds_ij k'_j`,
//! `dk'_j = sum_i scale_i ds_ij q'_i`; through the L2 normalisation
//! `dx = (dx' - x' <x', dx'>) / ||x||` (`dx'/1e-12` when `||x|| <= 1e-12`); through the layer norm
//! `do = (dy - mean(dy) - y mean(dy y)) / sigma`.
//!
//! # Choices (SPEC **\[choice\]**s and this crate's own)
//!
//! - Natural logs everywhere; `ln(d)` of LSSA configurable (`d_factor`), `ln(N_i)` fixed.
//! - Re-weighting on an empty row (every `u_ij <= 0`, e.g. an exactly uniform row with `i > 3`)
//!   falls back to `w = a` and its gradient is stage 1's.
//! - An l1 row whose `sum |f|` is exactly 0 (e.g. `relu-l1` with every score negative) gives
//!   all-zero weights (output 0) and zero gradient through it: no division by zero, no NaN.
//! - `relu-seqlen` is `ReLU(s) / L` with `L` the length of the sequence being processed (the
//!   window; the paper does not say whether the training or the inference length), so its weights
//!   shrink as the window grows; `relu-rowlen` is the per-row `ReLU(s) / N_i`. The per-row helpers
//!   ([`Stage1::weights_from_scores`]) take their row as the last of its sequence (`L = N_i`).
//! - `sigmoid-rowbias` uses `b_i = -ln(N_i)`; `relu-ln` is `ReLU(s/sqrt(d))`, no normaliser, then
//!   `(o - mean) / sqrt(var + 1e-5)` (biased variance, no affine parameters) per output row.
//! - `recentered` subtracts the actual row mean of `a` over the unmasked keys (`= 1/N_i` for
//!   softmax up to rounding; the gradient is the same).
//! - Exponential-type activations ([`Activation::needs_running_max`]) under l1 are evaluated as
//!   `phi(s - max s)`; `exp-nonorm` is not shifted (it overflows like the real thing).
//! - `v` may have its own head dimension `d_v`; `B = 0` or `H = 0` give empty outputs.
//! - RoPE: GPT-NeoX rotate-half pairing (element `c` pairs with `c + d/2`),
//!   `inv_freq_c = base^(-2c/d)`, odd `d` is an error; NTK base `b * s^(d/(d-2))` for `s > 1`.
//! - `p` is in `1..=1024` ([`stage::MAX_REWEIGHT_POWER`]).
//!
//! # Variant names
//!
//! ```text
//! <stage1>[:<key>=<value>[,<key>=<value>]...][+rw<p>]
//! ```
//!
//! `<stage1>` is one of [`variant::STAGE1_NAMES`]: softmax, inverse, recentered, recentered-l1, linear,
//! exp-nonorm, linear-l1, relu-l1, relu2-l1, relu6-l1, gelu-l1, sigmoid-l1, softplus-l1, mish-l1,
//! sigmoid-bias, sigmoid-rowbias, sigmoid-rowbias-l1, relu-seqlen, relu-rowlen, relu-ln, lssa,
//! lssa-exp, softmax-logn.
//! Keys: `d_factor=<f64>` (lssa only; replaces `ln(d)`), `t_train=<usize >= 1>` (sigmoid-bias only;
//! without it the name parses but forward/backward return [`Error::MissingParameter`] until
//! [`Variant::with_train_len`] fills it in). `+rw<p>` adds stage 2 with power `p` (1..=1024).
//! Examples: `lssa+rw15` (LSSAR), `softmax+rw3`, `sigmoid-bias:t_train=1024`,
//! `lssa:d_factor=4.0+rw15`. `Display` prints the same grammar (`f64` values in Rust's shortest
//! round-trip form), so `name.parse::<Variant>()?.to_string()` round-trips; a custom stage 1 that
//! is no preset prints as `custom(...)`, which does not parse.
//!
//! # Read the maths
//!
//! ```
//! use attn_core::{Variant, forward, weights};
//! use ndarray::Array4;
//!
//! let lssar: Variant = "lssa+rw15".parse()?;
//! let q = Array4::from_shape_fn((1, 1, 5, 4), |(_, _, t, c)| ((t * 4 + c) as f64).sin());
//! let k = Array4::from_shape_fn((1, 1, 5, 4), |(_, _, t, c)| ((t * 3 + c) as f64).cos());
//! let v = Array4::from_shape_fn((1, 1, 5, 4), |(_, _, t, c)| (t + c) as f64);
//!
//! let w = weights(&lssar, &q, &k)?; // (B, H, T, T), causal
//! assert_eq!(w[[0, 0, 0, 0]], 1.0); // row 1: ln(1) = 0, a single weight of 1
//! for i in 0..5 {
//!     let row_sum: f64 = (0..5).map(|j| w[[0, 0, i, j]]).sum();
//!     assert!((row_sum - 1.0).abs() < 1e-12);
//! }
//! // The same row by hand: scores -> stage 1 -> stage 2.
//! let scores = [0.3, -1.2, 2.0, 0.1];
//! let a = lssar.stage1().weights_from_scores(&scores);
//! let w4 = attn_core::stage::reweight_row(&a, 15);
//! assert_eq!(w4, lssar.weights_from_scores(&scores));
//! assert_eq!(w4[1], 0.0); // below the row mean: dropped
//! let y = forward(&lssar, &q, &k, &v)?; // (B, H, T, d)
//! assert_eq!(y.shape(), &[1, 1, 5, 4]);
//! # Ok::<(), attn_core::Error>(())
//! ```
//!
//! # Check a kernel against the reference
//!
//! ```
//! use attn_core::fixtures::{Adversarial, adversarial_qkv, random_qkv, rel_diff};
//! use attn_core::{Variant, forward};
//! use ndarray::Array4;
//!
//! /// "Your kernel": a naive f32 softmax attention.
//! fn my_softmax_kernel(q: &Array4<f32>, k: &Array4<f32>, v: &Array4<f32>) -> Array4<f32> {
//!     let (b, h, t, d) = q.dim();
//!     let mut y = Array4::zeros((b, h, t, d));
//!     for (bi, hi) in (0..b).flat_map(|x| (0..h).map(move |y| (x, y))) {
//!         for i in 0..t {
//!             let s: Vec<f32> = (0..=i)
//!                 .map(|j| (0..d).map(|c| q[[bi, hi, i, c]] * k[[bi, hi, j, c]]).sum::<f32>() / (d as f32).sqrt())
//!                 .collect();
//!             let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
//!             let z: f32 = s.iter().map(|x| (x - m).exp()).sum();
//!             for (j, sj) in s.iter().enumerate() {
//!                 for c in 0..d {
//!                     y[[bi, hi, i, c]] += (sj - m).exp() / z * v[[bi, hi, j, c]];
//!                 }
//!             }
//!         }
//!     }
//!     y
//! }
//!
//! let softmax: Variant = "softmax".parse()?;
//! for (q, k, v) in [
//!     random_qkv::<f32>([2, 3, 33, 40], 7), // awkward sizes
//!     adversarial_qkv::<f32>(Adversarial::HugeLogits { logit: 60.0 }, [1, 2, 17, 72], 8),
//!     adversarial_qkv::<f32>(Adversarial::NearUniform { spread: 1e-3 }, [1, 1, 20, 8], 9),
//! ] {
//!     let reference = forward(&softmax, &q, &k, &v)?; // f64 maths, rounded to f32
//!     let err = rel_diff(&my_softmax_kernel(&q, &k, &v), &reference);
//!     assert!(err < 1e-5, "kernel error {err}");
//! }
//! # Ok::<(), attn_core::Error>(())
//! ```
//!
//! Gradients: compare your backward with [`backward`] the same way, using
//! [`fixtures::grads_rel_diff`]; [`fixtures::numerical_grads`] gives finite differences.
//!
//! # Test an activation
//!
//! With the `testing` feature, `testing::check_activation` runs the whole property kit
//! (derivative, extreme inputs, row sums, causality, gradients) on your activation and panics on
//! failure:
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # fn main() {
//! use attn_core::{Activation, Variant, forward};
//!
//! #[derive(Debug, Clone)]
//! struct Softsign; // x / (1 + |x|) + 1, shifted to be non-negative
//!
//! impl Activation for Softsign {
//!     fn name(&self) -> &str { "softsign1" }
//!     fn value(&self, x: f64) -> f64 { x / (1.0 + x.abs()) + 1.0 }
//!     fn derivative(&self, x: f64) -> f64 { 1.0 / ((1.0 + x.abs()) * (1.0 + x.abs())) }
//!     fn is_non_negative(&self) -> bool { true }
//! }
//!
//! attn_core::testing::check_activation(&Softsign);
//! // Then use it in a variant of your own, re-weighted:
//! let v = Variant::builder().activation(Softsign).reweight(3).build().unwrap();
//! let (q, k, x) = attn_core::fixtures::random_qkv::<f32>([1, 2, 8, 16], 0);
//! assert!(forward(&v, &q, &k, &x).unwrap().iter().all(|y| y.is_finite()));
//! # }
//! # #[cfg(not(feature = "testing"))]
//! # fn main() {}
//! ```
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt
#![deny(missing_docs)]

// The root holds what most users name (at most 30 items, `xtask/tests/tidy.rs` counts them); the
// rest lives in named modules.
pub mod activation;
mod error;
pub mod fixtures;
mod listed;
pub mod math;
mod plan;
mod real;
pub mod reference;
pub mod rope;
pub mod stage;
#[cfg(feature = "testing")]
pub mod testing;
pub mod variant;

pub use activation::{Activation, Builtin};
pub use error::{Error, Result};
pub use plan::{Phi, Plan};
pub use real::Real;
pub use reference::{Grads, backward, forward, weights};
pub use stage::{Bias, Norm, OutputNorm, Scale, Scores, Stage1, Transform};
pub use variant::{Variant, VariantBuilder};
