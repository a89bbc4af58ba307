//! The positivity maps `phi` and their derivatives over f32 slices, in the branch-free form the
//! multiversioned kernel bodies vectorise; plus a slow path for users' own activations.
//!
//! Accuracy (f32, against the f64 definitions in attn-core): exp, softplus and sigmoid inherit the
//! bounds documented in [`crate::cpu::math`]; GELU uses Abramowitz & Stegun 7.1.26 for `erf`
//! (absolute error <= 1.5e-7); Mish is `x * tanh(softplus(x))` with `tanh(y) = (1 - e^{-2y}) / (1 + e^{-2y})`,
//! stable for every `x` because `y >= 0`.

use std::sync::Arc;

use attn_core::Activation;

use crate::cpu::math;

/// The activation a kernel evaluates; built-ins get vectorised code, anything else calls the
/// user's [`Activation`] element by element (correct, slow).
#[derive(Clone)]
pub(crate) enum Act {
    Exp,
    Softplus,
    Relu,
    Relu2,
    Relu6,
    Gelu,
    Sigmoid,
    Mish,
    Identity,
    Custom(Arc<dyn Activation>),
}

const FRAC_1_SQRT_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
/// 1 / sqrt(2 pi).
const INV_SQRT_2PI: f32 = 0.398_942_3;

/// erf(x), Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), odd extension.
#[inline(always)]
fn erf<const FMA: bool>(x: f32) -> f32 {
    let ax = x.abs();
    let t = 1.0 / math::fmadd::<FMA>(0.327_591_1, ax, 1.0);
    let mut poly = 1.061_405_4f32;
    poly = math::fmadd::<FMA>(poly, t, -1.453_152_1);
    poly = math::fmadd::<FMA>(poly, t, 1.421_413_7);
    poly = math::fmadd::<FMA>(poly, t, -0.284_496_74);
    poly = math::fmadd::<FMA>(poly, t, 0.254_829_6);
    let y = 1.0 - poly * t * math::exp::<FMA>(-ax * ax);
    y.copysign(x)
}

/// tanh(softplus(x)), stable for all x.
#[inline(always)]
fn tanh_softplus<const FMA: bool>(x: f32) -> f32 {
    let e = math::exp::<FMA>(-2.0 * math::softplus::<FMA>(x));
    (1.0 - e) / (1.0 + e)
}

impl Act {
    /// Replaces every score `xs[c]` by `phi(xs[c])`.
    #[inline(always)]
    pub(crate) fn apply<const FMA: bool>(&self, xs: &mut [f32]) {
        match self {
            Act::Exp => xs.iter_mut().for_each(|x| *x = math::exp::<FMA>(*x)),
            Act::Softplus => xs.iter_mut().for_each(|x| *x = math::softplus::<FMA>(*x)),
            Act::Relu => xs.iter_mut().for_each(|x| *x = x.max(0.0)),
            Act::Relu2 => xs.iter_mut().for_each(|x| *x = x.max(0.0) * x.max(0.0)),
            Act::Relu6 => xs.iter_mut().for_each(|x| *x = x.clamp(0.0, 6.0)),
            Act::Gelu => xs.iter_mut().for_each(|x| *x = 0.5 * *x * (1.0 + erf::<FMA>(*x * FRAC_1_SQRT_2))),
            Act::Sigmoid => xs.iter_mut().for_each(|x| *x = math::sigmoid::<FMA>(*x)),
            Act::Mish => xs.iter_mut().for_each(|x| *x *= tanh_softplus::<FMA>(*x)),
            Act::Identity => {}
            Act::Custom(a) => xs.iter_mut().for_each(|x| *x = a.value(*x as f64) as f32),
        }
    }

    /// `out[c] *= phi'(s[c])`: multiplies an upstream gradient by the derivative at the scores.
    /// `f` holds `phi(s)` already (used by exp, whose derivative is itself; for exp under a
    /// running maximum it holds `exp(s - max)`, which is what the caller's normaliser expects).
    #[inline(always)]
    pub(crate) fn mul_derivative<const FMA: bool>(&self, s: &[f32], f: &[f32], out: &mut [f32]) {
        let n = out.len();
        let s = &s[..n];
        match self {
            Act::Exp => out.iter_mut().zip(&f[..n]).for_each(|(o, &f)| *o *= f),
            Act::Softplus => out.iter_mut().zip(s).for_each(|(o, &s)| *o *= math::sigmoid::<FMA>(s)),
            Act::Relu => out.iter_mut().zip(s).for_each(|(o, &s)| *o = if s > 0.0 { *o } else { 0.0 }),
            Act::Relu2 => out.iter_mut().zip(s).for_each(|(o, &s)| *o *= 2.0 * s.max(0.0)),
            Act::Relu6 => out.iter_mut().zip(s).for_each(|(o, &s)| *o = if s > 0.0 && s < 6.0 { *o } else { 0.0 }),
            Act::Gelu => out.iter_mut().zip(s).for_each(|(o, &s)| {
                let cdf = 0.5 * (1.0 + erf::<FMA>(s * FRAC_1_SQRT_2));
                let pdf = INV_SQRT_2PI * math::exp::<FMA>(-0.5 * s * s);
                *o *= math::fmadd::<FMA>(s, pdf, cdf);
            }),
            Act::Sigmoid => out.iter_mut().zip(&f[..n]).for_each(|(o, &f)| *o *= f * (1.0 - f)),
            Act::Mish => out.iter_mut().zip(s).for_each(|(o, &s)| {
                let t = tanh_softplus::<FMA>(s);
                *o *= t + s * (1.0 - t * t) * math::sigmoid::<FMA>(s);
            }),
            Act::Identity => {}
            Act::Custom(a) => out.iter_mut().zip(s).for_each(|(o, &s)| *o *= a.derivative(s as f64) as f32),
        }
    }
}
