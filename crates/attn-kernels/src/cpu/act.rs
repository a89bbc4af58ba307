//! The positivity maps `phi` and their derivatives over f32 slices, in the branch-free form the
//! multiversioned kernel bodies vectorise; plus a slow path for users' own activations.
//!
//! Accuracy (f32, against the f64 definitions in attn-core): exp, softplus and sigmoid inherit the
//! bounds documented in [`crate::cpu::math`]; GELU uses Abramowitz & Stegun 7.1.26 for `erf`
//! (absolute error <= 1.5e-7); Mish is `x * tanh(softplus(x))` with `tanh(y) = (1 - e^{-2y}) / (1 + e^{-2y})`,
//! stable for every `x` because `y >= 0`.

use attn_core::{Builtin, Phi};

use crate::cpu::isa::Isa;
use crate::cpu::math;

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

/// Replaces every score `xs[c]` by `phi(xs[c])`: built-ins in vectorisable code, a user's activation
/// element by element through its f64 `value` (correct, slow). `in_range`: the caller knows every
/// score lies within `±math::IN_RANGE_MAX`, so softplus may skip its range handling (same values),
/// and on AVX-512 (`isa`, the kernel's, which its dispatch checked) takes it from
/// [`math::softplus_table`] (within 1.7 ulps where [`math::softplus`] is within 2.6; the AMX
/// forward's fused row uses the same, so a forward and its backward see the same weights).
#[inline(always)]
pub(crate) fn apply<const FMA: bool>(phi: &Phi, in_range: bool, isa: Isa, xs: &mut [f32]) {
    match phi {
        Phi::Builtin(Builtin::Exp) => xs.iter_mut().for_each(|x| *x = math::exp::<FMA>(*x)),
        #[cfg(target_arch = "x86_64")]
        Phi::Builtin(Builtin::Softplus) if in_range && isa.simd() == Isa::Avx512 => {
            // SAFETY: the kernels run under `isa`, which their dispatch checked this CPU supports
            // (AVX-512F with it).
            unsafe { math::softplus_table::softplus_in_range(xs) }
        }
        Phi::Builtin(Builtin::Softplus) if in_range => softplus_in_range_two_pass::<FMA>(xs),
        Phi::Builtin(Builtin::Softplus) => xs.iter_mut().for_each(|x| *x = math::softplus::<FMA>(*x)),
        Phi::Builtin(Builtin::Relu) => xs.iter_mut().for_each(|x| *x = x.max(0.0)),
        Phi::Builtin(Builtin::Relu2) => xs.iter_mut().for_each(|x| *x = x.max(0.0) * x.max(0.0)),
        Phi::Builtin(Builtin::Relu6) => xs.iter_mut().for_each(|x| *x = x.clamp(0.0, 6.0)),
        Phi::Builtin(Builtin::Gelu) => {
            xs.iter_mut().for_each(|x| *x = 0.5 * *x * (1.0 + erf::<FMA>(*x * FRAC_1_SQRT_2)))
        }
        Phi::Builtin(Builtin::Sigmoid) => xs.iter_mut().for_each(|x| *x = math::sigmoid::<FMA>(*x)),
        Phi::Builtin(Builtin::Mish) => xs.iter_mut().for_each(|x| *x *= tanh_softplus::<FMA>(*x)),
        Phi::Builtin(Builtin::Identity) => {}
        Phi::Custom(a) => xs.iter_mut().for_each(|x| *x = a.value(*x as f64) as f32),
    }
}

/// [`math::softplus_in_range`] over `xs`, bit for bit, in two passes per 128 scores: `e^(-|x|)`, then
/// `max(x, 0) + ln(1 + e)`. One pass needs about 20 constants and AVX2 has 16 registers, so it
/// re-loads constants every iteration; two passes each fit, and the store and reload of `e` stay in
/// L1. Measured side by side (`cpu_lab`, 1 thread, T = 4096, 3 alternations): the LSSA forward took
/// 0.92-0.96x the time under AVX2 and the same under AVX-512. Chunks of 128 scores rather than 64
/// (since AVX-512's key tiles are 128 wide): 8 AVX-512 registers a pass instead of 4, more
/// independent chains for the polynomials' dependent FMAs; the one-thread LSSA forward on an Intel
/// Xeon took 0.95-0.97x the time in three alternations (207-226 ms against 215-234).
#[inline(always)]
pub(crate) fn softplus_in_range_two_pass<const FMA: bool>(xs: &mut [f32]) {
    for c in xs.chunks_mut(128) {
        let mut e = [0.0f32; 128];
        let e = &mut e[..c.len()];
        e.iter_mut().zip(c.iter()).for_each(|(e, &x)| *e = math::exp_in_range::<FMA>(-x.abs()));
        c.iter_mut().zip(e.iter()).for_each(|(x, &e)| *x = math::softplus_of::<FMA>(*x, e));
    }
}

/// `out[c] *= phi'(s[c])`: multiplies an upstream gradient by the derivative at the scores.
/// `f` holds `phi(s)` already (used by exp, whose derivative is itself, and by sigmoid; for exp under
/// a running maximum it holds `exp(s - max)`, which is what the caller's normaliser expects).
/// `in_range` as for [`apply`].
#[inline(always)]
pub(crate) fn mul_derivative<const FMA: bool>(phi: &Phi, in_range: bool, s: &[f32], f: &[f32], out: &mut [f32]) {
    let n = out.len();
    let s = &s[..n];
    match phi {
        Phi::Builtin(Builtin::Exp) => out.iter_mut().zip(&f[..n]).for_each(|(o, &f)| *o *= f),
        Phi::Builtin(Builtin::Softplus) if in_range => {
            out.iter_mut().zip(s).for_each(|(o, &s)| *o *= math::sigmoid_in_range::<FMA>(s))
        }
        Phi::Builtin(Builtin::Softplus) => out.iter_mut().zip(s).for_each(|(o, &s)| *o *= math::sigmoid::<FMA>(s)),
        Phi::Builtin(Builtin::Relu) => out.iter_mut().zip(s).for_each(|(o, &s)| *o = if s > 0.0 { *o } else { 0.0 }),
        Phi::Builtin(Builtin::Relu2) => out.iter_mut().zip(s).for_each(|(o, &s)| *o *= 2.0 * s.max(0.0)),
        Phi::Builtin(Builtin::Relu6) => {
            out.iter_mut().zip(s).for_each(|(o, &s)| *o = if s > 0.0 && s < 6.0 { *o } else { 0.0 })
        }
        Phi::Builtin(Builtin::Gelu) => out.iter_mut().zip(s).for_each(|(o, &s)| {
            let cdf = 0.5 * (1.0 + erf::<FMA>(s * FRAC_1_SQRT_2));
            let pdf = INV_SQRT_2PI * math::exp::<FMA>(-0.5 * s * s);
            *o *= math::fmadd::<FMA>(s, pdf, cdf);
        }),
        Phi::Builtin(Builtin::Sigmoid) => out.iter_mut().zip(&f[..n]).for_each(|(o, &f)| *o *= f * (1.0 - f)),
        Phi::Builtin(Builtin::Mish) => out.iter_mut().zip(s).for_each(|(o, &s)| {
            let t = tanh_softplus::<FMA>(s);
            *o *= t + s * (1.0 - t * t) * math::sigmoid::<FMA>(s);
        }),
        Phi::Builtin(Builtin::Identity) => {}
        Phi::Custom(a) => out.iter_mut().zip(s).for_each(|(o, &s)| *o *= a.derivative(s as f64) as f32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softplus_in_range_is_the_full_softplus_bit_for_bit_at_every_length() {
        // Lengths around the two-pass form's 64-score chunks; values over the whole in-range span.
        let phi = Phi::Builtin(Builtin::Softplus);
        for n in [1, 63, 64, 65, 130, 1000] {
            let xs: Vec<f32> = (0..n).map(|i| (i as f32 / n as f32 * 2.0 - 1.0) * math::IN_RANGE_MAX).collect();
            for fma in [false, true] {
                let (mut fast, mut full) = (xs.clone(), xs.clone());
                if fma {
                    apply::<true>(&phi, true, Isa::Scalar, &mut fast);
                    apply::<true>(&phi, false, Isa::Scalar, &mut full);
                } else {
                    apply::<false>(&phi, true, Isa::Scalar, &mut fast);
                    apply::<false>(&phi, false, Isa::Scalar, &mut full);
                }
                let differ = fast.iter().zip(&full).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "n = {n}, fma = {fma}: {differ} values differ");
                assert!(full.iter().zip(&xs).all(|(&f, &x)| f >= x.max(0.0)), "softplus(x) >= max(x, 0)");
            }
        }
    }
}
