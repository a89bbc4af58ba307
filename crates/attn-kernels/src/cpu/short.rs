//! Calls of at most [`DIRECT_MAX_ROWS`] query rows (a decoding step): their scores are dot products of
//! `q` with `k`'s rows as they are, and their key norms are summed in the same way by the forward
//! (with the dot products) and the backward (beforehand), so that both see the same scores. Also the
//! 16-lane reduction the engine's row sums use.

use crate::cpu::math;

/// Reduces 16 lanes pairwise (lane `l` with `l + 8`, then `l + 4`, ...): a left-to-right fold is
/// 16 dependent scalar operations.
#[inline(always)]
pub(crate) fn fold_lanes(mut acc: [f32; 16], op: impl Fn(f32, f32) -> f32) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] = op(acc[l], acc[l + w]);
        }
    }
    acc[0]
}

/// The most query rows of a call whose scores skip the packing of `K` (a decoding step, a few rows
/// of speculative decoding): for so few rows, packing every key tile would read and write `K` once
/// more than the scores themselves read it. The forward and the backward of such a call compute the
/// same scores (the same dot products and key norms, bit for bit): a backward that recomputed them
/// otherwise would see rows the forward did not normalise (a near-zero relu row's `a = f / Z` off by
/// 1e-3).
pub(crate) const DIRECT_MAX_ROWS: usize = 4;

/// `sum_c a[c] b[c]` in 16 independent lanes (vectorised by the caller's target features).
#[inline(always)]
pub(crate) fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (at, bt) = (ac.remainder(), bc.remainder());
    // Loops over zipped iterators (which LLVM turns into whole-vector operations; indexed lanes
    // stayed scalar) and no closures (a closure is a function of its own, compiled without the
    // caller's target features: FMA became a libm call).
    for (x, y) in ac.zip(bc) {
        for (a, (&x, &y)) in acc.iter_mut().zip(x.iter().zip(y)) {
            *a = math::fmadd::<FMA>(x, y, *a);
        }
    }
    for (l, (&x, &y)) in at.iter().zip(bt).enumerate() {
        acc[l] = math::fmadd::<FMA>(x, y, acc[l]);
    }
    fold_lanes(acc, |x, y| x + y)
}

/// `sum_c k[c]^2` in 16 lanes of plain multiplies and adds: the same value wherever it is compiled
/// (with FMA or without), so a short call's forward and backward agree on every key norm.
#[inline(always)]
pub(crate) fn lanes_sq_norm(k: &[f32]) -> f32 {
    let mut sq = [0.0f32; 16];
    let chunks = k.chunks_exact(16);
    for (s, &y) in sq.iter_mut().zip(chunks.remainder()) {
        *s += y * y;
    }
    for c in chunks {
        for (s, &y) in sq.iter_mut().zip(c) {
            *s += y * y;
        }
    }
    fold_lanes(sq, |x, y| x + y)
}

/// `1 / max(||k||, 1e-12)` from [`lanes_sq_norm`]'s `k2`; where the squares overflowed f32 (|k|
/// above 1e19), from an f64 sum of them.
#[inline(always)]
pub(crate) fn inv_norm_from(k2: f32, k: &[f32]) -> f32 {
    if k2.is_finite() {
        return 1.0 / k2.sqrt().max(1e-12);
    }
    let mut n2 = 0.0f64;
    for &v in k {
        n2 += f64::from(v) * f64::from(v);
    }
    (1.0 / n2.sqrt().max(1e-12)) as f32
}

/// [`inv_norms`](super::engine::inv_norms) as a short call's forward takes its key norms ([`lanes_sq_norm`], [`inv_norm_from`]):
/// the backward of such a call reads these.
pub(crate) fn inv_norms_short(x: &[f32], ld: usize, t: usize, d: usize, out: &mut [f32]) {
    for i in 0..t {
        let row = &x[i * ld..i * ld + d];
        out[i] = inv_norm_from(lanes_sq_norm(row), row);
    }
}
