//! Inputs and comparison helpers for checking a kernel against the reference: seeded random and
//! adversarial q/k/v, error metrics, and finite-difference gradients. No dependencies.

use ndarray::{Array4, ArrayView, AsArray, Dimension, Ix4};

use crate::error::Result;
use crate::real::Real;
use crate::reference::{Grads, forward};
use crate::variant::Variant;

/// A tiny deterministic generator (SplitMix64), so fixtures need no `rand` dependency.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// A (B, H, T, d) array of standard normal values from `seed`.
pub fn random_array<F: Real>(shape: [usize; 4], seed: u64) -> Array4<F> {
    let mut rng = Rng::new(seed);
    Array4::from_shape_simple_fn(shape, || F::from_f64(rng.normal()))
}

/// Standard normal `(q, k, v)`, each of `shape` (B, H, T, d), from `seed`.
pub fn random_qkv<F: Real>(shape: [usize; 4], seed: u64) -> (Array4<F>, Array4<F>, Array4<F>) {
    let s = seed.wrapping_mul(3);
    (random_array(shape, s), random_array(shape, s + 1), random_array(shape, s + 2))
}

/// Kinds of adversarial inputs (STYLE.md: "a few very large logits per row, near-uniform rows,
/// rows where everything is below the mean").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Adversarial {
    /// Key 0 and about a quarter of the other keys are aligned with every query, so each row has a
    /// few dot-product scores near `logit` (scale `1/sqrt(d)`) and cosine scores near 1; the others
    /// are ordinary.
    HugeLogits {
        /// Target size of the dominant scaled dot products.
        logit: f64,
    },
    /// Every key is one shared vector plus `spread` times noise: rows are near-uniform (`u_ij`
    /// near 0 in the re-weighting).
    NearUniform {
        /// Relative size of the key noise.
        spread: f64,
    },
    /// Every scaled dot product is near `-logit`: rows of small `phi` values, all-zero rows for
    /// ReLU-type activations (the zero-sum l1 case).
    AllNegative {
        /// Size of the negative scores.
        logit: f64,
    },
    /// Every key is the same vector: rows exactly uniform, i.e. every key at the row mean (the
    /// empty-row fallback of the re-weighting).
    ExactlyUniform,
}

/// Adversarial `(q, k, v)` of `shape` (B, H, T, d) from `seed`; `v` is standard normal.
pub fn adversarial_qkv<F: Real>(kind: Adversarial, shape: [usize; 4], seed: u64) -> (Array4<F>, Array4<F>, Array4<F>) {
    let [nb, nh, t, d] = shape;
    let mut rng = Rng::new(seed.wrapping_mul(7919).wrapping_add(17));
    let sqrt_d = (d as f64).sqrt();
    let mut q = Array4::<f64>::zeros(shape);
    let mut k = Array4::<f64>::zeros(shape);
    for b in 0..nb {
        for h in 0..nh {
            let shared: Vec<f64> = (0..d).map(|_| rng.normal()).collect();
            for i in 0..t {
                let dominant = i == 0 || rng.uniform() < 0.25;
                for c in 0..d {
                    let (qv, kv) = match kind {
                        Adversarial::HugeLogits { logit } => {
                            let e = if c == 0 { 1.0 } else { 0.0 };
                            let kv = if dominant {
                                logit * sqrt_d * e * (1.0 + 0.1 * rng.normal()) + 0.1 * rng.normal()
                            } else {
                                rng.normal()
                            };
                            (e + 0.05 * rng.normal(), kv)
                        }
                        Adversarial::NearUniform { spread } => (rng.normal(), shared[c] + spread * rng.normal()),
                        Adversarial::AllNegative { logit } => {
                            let e = if c == 0 { 1.0 } else { 0.0 };
                            let kv = if c == 0 { -logit * sqrt_d * (1.0 + 0.1 * rng.normal()) } else { rng.normal() };
                            (e + if c == 0 { 0.0 } else { 0.05 * rng.normal() }, kv)
                        }
                        Adversarial::ExactlyUniform => (rng.normal(), shared[c]),
                    };
                    q[[b, h, i, c]] = qv;
                    k[[b, h, i, c]] = kv;
                }
            }
        }
    }
    let v = random_array::<F>(shape, seed.wrapping_add(1_000_003));
    (q.mapv(F::from_f64), k.mapv(F::from_f64), v)
}

/// Largest `|x|` (0 for an empty array).
pub fn max_abs<'a, F: Real, D: Dimension>(a: impl AsArray<'a, F, D>) -> f64 {
    let a: ArrayView<'a, F, D> = a.into();
    a.iter().fold(0.0, |m, x| m.max(x.into_f64().abs()))
}

/// Largest `|a - b|`; infinity when the shapes differ, NaN when an element is NaN.
pub fn max_abs_diff<'a, 'b, F: Real, D: Dimension>(a: impl AsArray<'a, F, D>, b: impl AsArray<'b, F, D>) -> f64 {
    let (a, b): (ArrayView<'a, F, D>, ArrayView<'b, F, D>) = (a.into(), b.into());
    if a.shape() != b.shape() {
        return f64::INFINITY;
    }
    a.iter().zip(b.iter()).fold(0.0, |m, (x, y)| {
        let e = (x.into_f64() - y.into_f64()).abs();
        if e.is_nan() || m.is_nan() { f64::NAN } else { m.max(e) }
    })
}

/// `max |actual - reference| / max |reference|`: the error relative to the reference's scale
/// (use this, not an element-wise ratio, so that near-zero entries do not dominate).
pub fn rel_diff<'a, 'b, F: Real, D: Dimension>(
    actual: impl AsArray<'a, F, D>,
    reference: impl AsArray<'b, F, D>,
) -> f64 {
    let reference: ArrayView<'b, F, D> = reference.into();
    max_abs_diff(actual, reference.view()) / max_abs(reference.view()).max(f64::MIN_POSITIVE)
}

/// Gradient error: the largest absolute difference over `dq`, `dk`, `dv`, divided by the largest
/// reference gradient entry over all three (so a tensor whose true gradient is ~0 is judged on the
/// scale of the whole gradient).
pub fn grads_rel_diff<F: Real>(actual: &Grads<F>, reference: &Grads<F>) -> f64 {
    let diff = max_abs_diff(&actual.dq, &reference.dq)
        .max(max_abs_diff(&actual.dk, &reference.dk))
        .max(max_abs_diff(&actual.dv, &reference.dv));
    let scale = max_abs(&reference.dq).max(max_abs(&reference.dk)).max(max_abs(&reference.dv));
    diff / scale.max(f64::MIN_POSITIVE)
}

/// `L = sum(d_out * forward(q, k, v))` in f64.
pub fn loss(variant: &Variant, q: &Array4<f64>, k: &Array4<f64>, v: &Array4<f64>, d_out: &Array4<f64>) -> Result<f64> {
    let y = forward(variant, q, k, v)?;
    Ok(y.iter().zip(d_out.iter()).map(|(a, b)| a * b).sum())
}

/// Gradients of [`loss`] by the fourth-order central difference
/// `(-L(x+2h) + 8 L(x+h) - 8 L(x-h) + L(x-2h)) / 12h`, `h = step * max(1, |x|)` per element
/// (`step = 1e-5` is a good default in f64). Costs `4 (|q| + |k| + |v|)` forward passes.
pub fn numerical_grads(
    variant: &Variant,
    q: &Array4<f64>,
    k: &Array4<f64>,
    v: &Array4<f64>,
    d_out: &Array4<f64>,
    step: f64,
) -> Result<Grads<f64>> {
    let mut x = [q.clone(), k.clone(), v.clone()];
    let mut out = [q.clone(), k.clone(), v.clone()];
    for which in 0..3 {
        let idx: Vec<_> = x[which].indexed_iter().map(|(i, _)| i).collect();
        for i in idx {
            let x0 = x[which][i];
            let h = step * x0.abs().max(1.0);
            let mut eval = |delta: f64| -> Result<f64> {
                x[which][i] = x0 + delta;
                let l = loss(variant, &x[0], &x[1], &x[2], d_out);
                x[which][i] = x0;
                l
            };
            let (p2, p1, m1, m2) = (eval(2.0 * h)?, eval(h)?, eval(-h)?, eval(-2.0 * h)?);
            out[which][i] = (-p2 + 8.0 * p1 - 8.0 * m1 + m2) / (12.0 * h);
        }
    }
    let [dq, dk, dv] = out;
    Ok(Grads { dq, dk, dv })
}

/// Shape helper: `[B, H, T, d]` of a 4-d array.
pub fn shape4<'a, F: Real>(a: impl AsArray<'a, F, Ix4>) -> [usize; 4] {
    let a: ArrayView<'a, F, Ix4> = a.into();
    let s = a.shape();
    [s[0], s[1], s[2], s[3]]
}
