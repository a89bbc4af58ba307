//! Row kernels of a language model's loss: each row's log-sum-exp, and the softmax of a row scaled,
//! which is the cross-entropy gradient before the target's `-1`. gpt-model's fused cross-entropy runs
//! them on its `(N, V)` float32 logits (libtorch's own `exp` on this path, MKL's high-accuracy VML
//! routine, took about 1 ns per element per thread on a 2-core AMD EPYC: 2.4 ms of a 65 ms training
//! step at the `small` shape).
//!
//! Both are [`multiversion!`](crate::multiversion)ed over one row; the caller splits the rows over
//! its threads. Accuracy: `exp` and `ln` are within 1.1 and 1.0 ulp (`cpu::math`'s bounds), and
//! the sum runs in 16 float32 partial sums.

use super::isa::Isa;
use super::math::{exp, ln};

/// Lanes of the partial maxima and sums: one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;

crate::multiversion! {
    /// `ln(sum_j e^(x_j))` of one row, shifted by its maximum so no term overflows. `-inf` for an
    /// empty row or one of `-inf` only, `+inf` if some `x_j` is `+inf`, NaN if some `x_j` is NaN (either way round).
    /// Panics if the CPU lacks `isa`.
    pub fn logsumexp<const FMA: bool>(isa: Isa, x: &[f32]) -> f32 {
        let (chunks, rest) = (x.chunks_exact(LANES), x.chunks_exact(LANES).remainder());
        // Compare-and-select maxima: a NaN never wins, so it reaches the sum below and makes it NaN.
        let mut lanes = [f32::NEG_INFINITY; LANES];
        for c in chunks.clone() {
            for (m, &v) in lanes.iter_mut().zip(c) {
                *m = if v > *m { v } else { *m };
            }
        }
        let mut max = f32::NEG_INFINITY;
        for &v in lanes.iter().chain(rest) {
            max = if v > max { v } else { max };
        }
        if max.is_infinite() {
            // Only here can a NaN hide from the sum below (as `inf - inf` or beside `-inf` terms).
            let nan = x.iter().any(|v| v.is_nan());
            return if nan { f32::NAN } else { max };
        }
        let mut sums = [0.0f32; LANES];
        for c in chunks {
            for (s, &v) in sums.iter_mut().zip(c) {
                *s += exp::<FMA>(v - max);
            }
        }
        let mut sum = 0.0f32;
        for &v in rest {
            sum += exp::<FMA>(v - max);
        }
        for s in sums {
            sum += s;
        }
        // sum >= 1 (the maximum's own term), or NaN, which `ln` does not promise to pass on.
        if sum.is_nan() { f32::NAN } else { max + ln::<FMA>(sum) }
    }
}

crate::multiversion! {
    /// `out[j] = e^(x[j] - lse) * scale`: the softmax of the row times `scale`, given the row's
    /// [`logsumexp`] `lse`. Panics if the CPU lacks `isa` or the lengths differ.
    pub fn softmax_scaled<const FMA: bool>(isa: Isa, x: &[f32], lse: f32, scale: f32, out: &mut [f32]) {
        assert_eq!(x.len(), out.len(), "softmax_scaled: row lengths differ");
        for (o, &v) in out.iter_mut().zip(x) {
            *o = exp::<FMA>(v - lse) * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Float64 reference: ln(sum e^x) with the maximum shift.
    fn lse64(x: &[f32]) -> f64 {
        let m = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
    }

    fn row(n: usize, seed: u64, spread: f32) -> Vec<f32> {
        let mut rng = attn_core::fixtures::Rng::new(seed);
        (0..n).map(|_| (rng.uniform() as f32 - 0.5) * spread + 30.0).collect()
    }

    #[test]
    fn logsumexp_and_softmax_match_float64_on_every_isa() {
        for isa in Isa::all_supported() {
            // Lengths around the lane count and the model's vocabulary; logits far from 0 and spread
            // wide, so the shift matters and small terms underflow.
            for (n, spread) in [(1, 4.0), (15, 4.0), (16, 4.0), (17, 60.0), (2048, 30.0), (2051, 200.0)] {
                let x = row(n, n as u64, spread);
                let want = lse64(&x);
                let got = logsumexp(isa, &x);
                assert!(((got as f64) - want).abs() <= 4e-7 * want.abs(), "{isa:?} n={n}: {got} vs {want}");
                let mut p = vec![0.0f32; n];
                softmax_scaled(isa, &x, got, 0.25, &mut p);
                let total: f64 = p.iter().map(|&v| v as f64).sum();
                assert!((total - 0.25).abs() < 1e-5, "{isa:?} n={n}: softmax sums to {total}");
                for (&pj, &xj) in p.iter().zip(&x) {
                    let w = 0.25 * (xj as f64 - want).exp();
                    assert!((pj as f64 - w).abs() <= 1e-5 * w + 1e-30, "{isa:?} n={n}: {pj} vs {w}");
                }
            }
        }
    }

    #[test]
    fn logsumexp_of_special_rows() {
        for isa in Isa::all_supported() {
            assert_eq!(logsumexp(isa, &[]), f32::NEG_INFINITY);
            assert_eq!(logsumexp(isa, &[f32::NEG_INFINITY; 20]), f32::NEG_INFINITY);
            let mut x = row(40, 3, 4.0);
            x[33] = f32::INFINITY;
            assert_eq!(logsumexp(isa, &x), f32::INFINITY);
            x[33] = f32::NAN;
            assert!(logsumexp(isa, &x).is_nan(), "{isa:?}: a NaN in the tail lanes");
            x[33] = 0.0;
            x[2] = f32::NAN;
            assert!(logsumexp(isa, &x).is_nan(), "{isa:?}: a NaN in the vector lanes");
            // One finite term among -inf: exactly that term.
            let mut y = vec![f32::NEG_INFINITY; 37];
            y[36] = -3.5;
            assert_eq!(logsumexp(isa, &y), -3.5);
        }
    }
}
