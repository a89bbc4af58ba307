//! The fused CPU kernels against the attn-core f64 reference, forward and backward, for every fused
//! variant, on awkward shapes and adversarial inputs, on every instruction set this CPU supports.
//!
//! Tolerance (STYLE.md, flash-attention's rule): the forward error of the fused kernel against the
//! f64 reference must be at most 2x the error of a naive f32 implementation of the same maths
//! (materialised scores, f32 everywhere; written below) plus a floor of a few f32 ulps of the
//! output scale. The backward has no naive f32 twin here; its bound is relative to the gradient's
//! scale and the forward's observed conditioning (documented at `backward_tolerance`).

use attn_core::Variant;
use attn_kernels::cpu::{self, Isa, Options, Tuning};
use ndarray::{Array4, Zip};
use proptest::prelude::*;

mod common;
use common::{FUSED, max_abs_diff, to64, variant};

/// Deterministic pseudo-random inputs in [-scale, scale] (splitmix64).
fn random(shape: (usize, usize, usize, usize), seed: u64, scale: f32) -> Array4<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    Array4::from_shape_simple_fn(shape, || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    })
}

fn max_abs(x: &Array4<f64>) -> f64 {
    x.iter().fold(0.0, |m, v| m.max(v.abs()))
}

/// `phi` evaluated the way a naive f32 implementation would: with f32 libm (`exp`, `ln_1p`) for the
/// transcendental built-ins, the f64 definition rounded for the rest (exact or polynomial anyway).
fn phi_f32(v: &Variant, x: f32) -> f32 {
    match v.stage1().activation.name() {
        "exp" => x.exp(),
        "softplus" => x.max(0.0) + (-x.abs()).exp().ln_1p(),
        "sigmoid" => 1.0 / (1.0 + (-x).exp()),
        _ => v.stage1().activation.value(x as f64) as f32,
    }
}

/// `phi'` as [`phi_f32`].
fn dphi_f32(v: &Variant, x: f32) -> f32 {
    match v.stage1().activation.name() {
        "exp" => x.exp(),
        "softplus" => 1.0 / (1.0 + (-x).exp()),
        "sigmoid" => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 - s)
        }
        _ => v.stage1().activation.derivative(x as f64) as f32,
    }
}

/// The same maths done naively in f32: materialised scores, f32 activation (the f64 definition
/// rounded), f32 sums. The yardstick for "framework noise".
fn naive_f32(v: &Variant, q: &Array4<f32>, k: &Array4<f32>, val: &Array4<f32>) -> Array4<f32> {
    let (b, h, t, d) = q.dim();
    let s1 = &v.stage1();
    let mut out = Array4::<f32>::zeros((b, h, t, d));
    let norm = |x: ndarray::ArrayView1<'_, f32>| -> f32 {
        if s1.scores == attn_core::Scores::Cosine { 1.0 / x.dot(&x).sqrt().max(1e-12) } else { 1.0 }
    };
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let n = i + 1;
                let qi = q.slice(ndarray::s![bi, hi, i, ..]);
                let (scale, bias) = (s1.scale.value(n, d) as f32, s1.bias.value(n).unwrap() as f32);
                let mut s: Vec<f32> = (0..n)
                    .map(|j| {
                        let kj = k.slice(ndarray::s![bi, hi, j, ..]);
                        scale * qi.dot(&kj) * norm(qi) * norm(kj) + bias
                    })
                    .collect();
                if s1.needs_running_max() {
                    let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    s.iter_mut().for_each(|x| *x -= m);
                }
                let f: Vec<f32> = s.iter().map(|&x| phi_f32(v, x)).collect();
                let mut a: Vec<f32> = match s1.norm {
                    attn_core::Norm::L1 => {
                        let z: f32 = f.iter().map(|x| x.abs()).sum();
                        f.iter().map(|&x| if z == 0.0 { 0.0 } else { x / z }).collect()
                    }
                    attn_core::Norm::None => f,
                    attn_core::Norm::DivN => f.iter().map(|&x| x / n as f32).collect(),
                    attn_core::Norm::DivLen => f.iter().map(|&x| x / t as f32).collect(),
                };
                if let Some(p) = v.reweight() {
                    let off = attn_core::stage::reweight_offset(n) as f32;
                    let u: Vec<f32> = a.iter().map(|&x| (n as f32 * x - off).max(0.0)).collect();
                    let m = u.iter().fold(0.0f32, |a, &b| a.max(b));
                    if m > 0.0 {
                        let r: Vec<f32> = u.iter().map(|&x| (x / m).powi(p as i32)).collect();
                        let w: f32 = r.iter().sum();
                        a = r.iter().map(|&x| x / w).collect();
                    }
                }
                let mut o = vec![0.0f32; d];
                for (j, &w) in a.iter().enumerate() {
                    for c in 0..d {
                        o[c] += w * val[[bi, hi, j, c]];
                    }
                }
                if s1.output_norm == attn_core::OutputNorm::LayerNorm {
                    let mean = o.iter().sum::<f32>() / d as f32;
                    let var = o.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / d as f32;
                    o.iter_mut().for_each(|x| *x = (*x - mean) / (var + 1e-5).sqrt());
                }
                for c in 0..d {
                    out[[bi, hi, i, c]] = o[c];
                }
            }
        }
    }
    out
}

/// The backward done naively in f32 (materialised rows, SPEC section 5 formulas, f32 everywhere):
/// the yardstick for the backward's error, as [`naive_f32`] is for the forward's.
fn naive_f32_backward(
    v: &Variant,
    q: &Array4<f32>,
    k: &Array4<f32>,
    val: &Array4<f32>,
    g: &Array4<f32>,
) -> [Array4<f32>; 3] {
    use attn_core::{Norm, OutputNorm, Scores};
    let (b, h, t, d) = q.dim();
    let s1 = &v.stage1();
    let (mut dq, mut dk, mut dv) = (Array4::zeros(q.dim()), Array4::zeros(q.dim()), Array4::zeros(q.dim()));
    for bi in 0..b {
        for hi in 0..h {
            let inv = |x: &Array4<f32>, i: usize| -> f32 {
                let r = x.slice(ndarray::s![bi, hi, i, ..]);
                if s1.scores == Scores::Cosine { 1.0 / r.dot(&r).sqrt().max(1e-12) } else { 1.0 }
            };
            let qn: Vec<f32> = (0..t).map(|i| inv(q, i)).collect();
            let kn: Vec<f32> = (0..t).map(|i| inv(k, i)).collect();
            let mut dqp = vec![vec![0.0f32; d]; t];
            let mut dkp = vec![vec![0.0f32; d]; t];
            for i in 0..t {
                let n = i + 1;
                let (scale, bias) = (s1.scale.value(n, d) as f32, s1.bias.value(n).unwrap() as f32);
                let qi: Vec<f32> = (0..d).map(|c| q[[bi, hi, i, c]] * qn[i]).collect();
                let kj = |j: usize| -> Vec<f32> { (0..d).map(|c| k[[bi, hi, j, c]] * kn[j]).collect() };
                let mut s: Vec<f32> =
                    (0..n).map(|j| scale * kj(j).iter().zip(&qi).map(|(a, b)| a * b).sum::<f32>() + bias).collect();
                if s1.needs_running_max() {
                    let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    s.iter_mut().for_each(|x| *x -= m);
                }
                let f: Vec<f32> = s.iter().map(|&x| phi_f32(v, x)).collect();
                let z: f32 = f.iter().map(|x| x.abs()).sum();
                let a: Vec<f32> = match s1.norm {
                    Norm::L1 => f.iter().map(|&x| if z == 0.0 { 0.0 } else { x / z }).collect(),
                    Norm::None => f.clone(),
                    Norm::DivN => f.iter().map(|&x| x / n as f32).collect(),
                    Norm::DivLen => f.iter().map(|&x| x / t as f32).collect(),
                };
                // Stage 2.
                let off = attn_core::stage::reweight_offset(n) as f32;
                let u: Vec<f32> = a.iter().map(|&x| (n as f32 * x - off).max(0.0)).collect();
                let m = u.iter().fold(0.0f32, |a, &b| a.max(b));
                let rw = v.reweight().filter(|_| m > 0.0);
                let (w, wsum) = match rw {
                    Some(p) => {
                        let r: Vec<f32> = u.iter().map(|&x| (x / m).powi(p as i32)).collect();
                        let ws: f32 = r.iter().sum();
                        (r.iter().map(|&x| x / ws).collect::<Vec<f32>>(), ws)
                    }
                    None => (a.clone(), 1.0),
                };
                let mut o = vec![0.0f32; d];
                for j in 0..n {
                    for c in 0..d {
                        o[c] += w[j] * val[[bi, hi, j, c]];
                    }
                }
                let mut gi: Vec<f32> = (0..d).map(|c| g[[bi, hi, i, c]]).collect();
                if s1.output_norm == OutputNorm::LayerNorm {
                    let mean = o.iter().sum::<f32>() / d as f32;
                    let var = o.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / d as f32;
                    let sigma = (var + 1e-5).sqrt();
                    let xh: Vec<f32> = o.iter().map(|x| (x - mean) / sigma).collect();
                    let mg = gi.iter().sum::<f32>() / d as f32;
                    let mgx = gi.iter().zip(&xh).map(|(a, b)| a * b).sum::<f32>() / d as f32;
                    gi = (0..d).map(|c| (gi[c] - mg - xh[c] * mgx) / sigma).collect();
                }
                let dw: Vec<f32> = (0..n).map(|j| (0..d).map(|c| gi[c] * val[[bi, hi, j, c]]).sum()).collect();
                for j in 0..n {
                    for c in 0..d {
                        dv[[bi, hi, j, c]] += w[j] * gi[c];
                    }
                }
                let da: Vec<f32> = match rw {
                    Some(p) => {
                        let dp: f32 = gi.iter().zip(&o).map(|(a, b)| a * b).sum();
                        (0..n)
                            .map(|j| {
                                let rho = u[j] / m;
                                let dr = if u[j] > 0.0 { p as f32 * rho.powi(p as i32 - 1) / m } else { 0.0 };
                                n as f32 * (dw[j] - dp) / wsum * dr
                            })
                            .collect()
                    }
                    None => dw,
                };
                let c_i: f32 = a.iter().zip(&da).map(|(a, b)| a * b).sum();
                let df: Vec<f32> = (0..n)
                    .map(|j| match s1.norm {
                        Norm::L1 if z == 0.0 => 0.0,
                        Norm::L1 => (da[j] - f[j].signum() * (f[j] != 0.0) as i32 as f32 * c_i) / z,
                        Norm::None => da[j],
                        Norm::DivN => da[j] / n as f32,
                        Norm::DivLen => da[j] / t as f32,
                    })
                    .collect();
                for j in 0..n {
                    let ds = df[j] * dphi_f32(v, s[j]) * scale;
                    let kjv = kj(j);
                    for c in 0..d {
                        dqp[i][c] += ds * kjv[c];
                        dkp[j][c] += ds * qi[c];
                    }
                }
            }
            // Back through x' = x * inv.
            for (dst, part, x, inv) in [(&mut dq, &dqp, q, &qn), (&mut dk, &dkp, k, &kn)] {
                for i in 0..t {
                    let xp: Vec<f32> = (0..d).map(|c| x[[bi, hi, i, c]] * inv[i]).collect();
                    let proj = if s1.scores == Scores::Cosine && inv[i] < 1e12 {
                        xp.iter().zip(&part[i]).map(|(a, b)| a * b).sum::<f32>()
                    } else {
                        0.0
                    };
                    let sc = if s1.scores == Scores::Cosine { inv[i] } else { 1.0 };
                    for c in 0..d {
                        dst[[bi, hi, i, c]] = (part[i][c] - xp[c] * proj) * sc;
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}

/// Forward error bound: 2x the naive f32 error, plus a floor of 64 ulps of the output scale (for
/// short rows the naive error is a handful of roundings and can be luckily small, while the
/// re-weighting's `u = N a - 1` cancels and amplifies any rounding by `p / u`).
/// With re-weighting the cancellation in `u` is multiplied by `p`, so both terms grow as in
/// [`backward_tolerance`] (`lssa+rw15`, T = 15, d = 72, seed 619: 7x the naive error).
fn forward_tolerance(naive_err: f64, reference: &Array4<f64>, p: Option<u32>) -> f64 {
    let (factor, floor) = match p {
        Some(p) => ((f64::from(p) / 4.0).max(8.0), (f64::from(p) / 4.0).max(1.0)),
        _ => (2.0, 1.0),
    };
    factor * naive_err + floor * 64.0 * f32::EPSILON as f64 * max_abs(reference).max(1.0)
}

/// Backward error bound: 2x the naive f32 backward's error, plus a floor of 64 ulps of the gradient
/// scale (inputs are O(1), so that scale is at least 1).
///
/// Known exception, measured and bounded rather than hidden: with a large re-weighting power
/// (`p >= 15`) on adversarial rows (logits in the hundreds, or `p = 64`) the kernel's `dq`/`dk` error
/// reaches 4-6x the naive one (relative error ~1e-5 of the largest entry), the same on every tile
/// size, and unchanged when the per-entry re-weighting arithmetic is done in f64. The gradient there
/// carries `p * rho^(p-1)`, which multiplies any rounding in `u` by `p`, so every re-weighted variant
/// gets `max(8, p / 4)` (a random search of 8000 cases later found 14x at `p = 64`, `lssa+rw64`, T = 10,
/// seed 183, and 4.8x at `p = 3`, `sigmoid-rowbias-l1+rw3`, T = 40, seed 420); stage-1 variants keep 2x.
fn backward_tolerance(naive_err: f64, reference: &Array4<f64>, p: Option<u32>) -> f64 {
    let (factor, floor) = match p {
        // The floor grows with p too: a naive implementation can be exact by luck on short rows
        // (`lssa+rw64`, T = 5, seed 604: naive 2e-11, kernel 3.6e-5 of a unit-scale gradient).
        Some(p) => ((f64::from(p) / 4.0).max(8.0), (f64::from(p) / 4.0).max(1.0)),
        _ => (2.0, 1.0),
    };
    factor * naive_err + floor * 64.0 * f32::EPSILON as f64 * max_abs(reference).max(1.0)
}

/// The backward's unavoidable f32 error on nearly zero-sum l1 rows (e.g. `relu-l1` with one score just
/// above 0), as `[dq, dk]` bounds: `df_ij = (<g_i, v_j> - D_i) / Z_i` divides the rounding of
/// `D_i = <g_i, o_i>` (about `eps |g_i| |o_i|`) by a tiny `Z_i`; that error reaches `dq_i` as
/// `scale_i (dD_i / Z_i) sum_j phi'(s_ij) k_j` and `dk_j` as `sum_i scale_i (dD_i / Z_i) phi'(s_ij) q_i`.
/// A naive f32 implementation can be exact there by luck (when `a` rounds to a one-hot row), so 2x its
/// error is no bound; this first-order one is, and it is negligible wherever `Z_i` is of order 1
/// (softmax's shifted rows have `Z_i >= 1`). Issue-4 regression: `relu-l1`, T = 4, d = 72, seed 392.
fn l1_conditioning_tolerance(
    v: &Variant,
    q: &Array4<f32>,
    k: &Array4<f32>,
    g: &Array4<f32>,
    o: &Array4<f64>,
) -> [f64; 2] {
    if v.stage1().norm != attn_core::Norm::L1 || v.stage1().scores == attn_core::Scores::Cosine {
        return [0.0, 0.0];
    }
    let sh = q.shape();
    let (t, d) = (sh[2], sh[3]);
    let row = |x: &Array4<f32>, b: usize, h: usize, i: usize| -> Vec<f64> {
        (0..d).map(|c| x[[b, h, i, c]] as f64).collect()
    };
    let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
    let (mut dq_tol, mut dk_tol) = (0.0f64, 0.0f64);
    for b in 0..sh[0] {
        for h in 0..sh[1] {
            let mut dk_acc = vec![0.0f64; t];
            for i in 0..t {
                let n = i + 1;
                let qi = row(q, b, h, i);
                let scores: Vec<f64> = (0..n)
                    .map(|j| v.stage1().score(qi.iter().zip(row(k, b, h, j)).map(|(a, c)| a * c).sum(), n, d).unwrap())
                    .collect();
                let shift =
                    if v.needs_running_max() { scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max) } else { 0.0 };
                let z: f64 = scores.iter().map(|&s| v.activation().value(s - shift).abs()).sum();
                if z <= 0.0 {
                    continue; // a zero-sum row has zero gradient by definition ([choice] of attn-core)
                }
                let o_norm = (0..d).map(|c| o[[b, h, i, c]].powi(2)).sum::<f64>().sqrt();
                let c_i = v.stage1().scale.value(n, d).abs() * norm(&row(g, b, h, i)) * o_norm / z;
                let mut w = vec![0.0f64; d];
                for (j, &s) in scores.iter().enumerate() {
                    let dphi = v.activation().derivative(s - shift);
                    for (wc, kc) in w.iter_mut().zip(row(k, b, h, j)) {
                        *wc += dphi * kc;
                    }
                    dk_acc[j] += c_i * dphi.abs() * norm(&qi);
                }
                dq_tol = dq_tol.max(c_i * norm(&w));
            }
            dk_tol = dk_tol.max(dk_acc.iter().cloned().fold(0.0, f64::max));
        }
    }
    let eps8 = 8.0 * f32::EPSILON as f64;
    [eps8 * dq_tol, eps8 * dk_tol]
}

fn check_case(name: &str, shape: (usize, usize, usize, usize), seed: u64, qk_scale: f32, opts: &Options) {
    let v = variant(name);
    let q = random(shape, seed, qk_scale);
    let k = random(shape, seed + 1, qk_scale);
    let val = random(shape, seed + 2, 1.0);
    let g = random(shape, seed + 3, 1.0);
    let want = attn_core::forward(&v, &to64(&q), &to64(&k), &to64(&val)).unwrap();
    let got = cpu::forward_with(&v, &q, &k, &val, opts).unwrap();
    let naive_err = max_abs_diff(&naive_f32(&v, &q, &k, &val), &want);
    let err = max_abs_diff(&got, &want);
    let tol = forward_tolerance(naive_err, &want, v.reweight());
    assert!(
        err <= tol,
        "{name} {shape:?} seed {seed} scale {qk_scale} {:?}: forward error {err:.3e} > {tol:.3e} (naive f32 {naive_err:.3e})",
        opts.isa
    );

    let out64 = attn_core::forward(&v, &to64(&q), &to64(&k), &to64(&val)).unwrap();
    let conditioning = l1_conditioning_tolerance(&v, &q, &k, &g, &out64);
    let want = attn_core::backward(&v, &to64(&q), &to64(&k), &to64(&val), &to64(&g)).unwrap();
    let naive = naive_f32_backward(&v, &q, &k, &val, &g);
    let got = cpu::backward_with(&v, &q, &k, &val, &g, opts).unwrap();
    for (what, a, b, nv) in [
        ("dq", &got.dq, &want.dq, &naive[0]),
        ("dk", &got.dk, &want.dk, &naive[1]),
        ("dv", &got.dv, &want.dv, &naive[2]),
    ] {
        let err = max_abs_diff(a, b);
        let naive_err = max_abs_diff(nv, b);
        // dv has no 1/Z_i amplification.
        let extra = match what {
            "dq" => conditioning[0],
            "dk" => conditioning[1],
            _ => 0.0, // dv has no 1/Z_i amplification
        };
        let tol = backward_tolerance(naive_err, b, v.reweight()) + extra;
        assert!(
            err <= tol,
            "{name} {shape:?} seed {seed} scale {qk_scale} {:?}: {what} error {err:.3e} > {tol:.3e} (naive f32 {naive_err:.3e})",
            opts.isa
        );
    }
}

fn small_tiles(isa: Isa) -> Options {
    // Small tiles so short sequences still cross several tiles, and tile edges that are not
    // multiples of the register blocks.
    Options { tuning: Tuning { block_q: 16, block_k: 24, ..Tuning::default() }, isa, ..Default::default() }
}

#[test]
fn every_fused_variant_matches_the_reference_on_every_isa() {
    for isa in Isa::all_supported() {
        for name in FUSED {
            check_case(name, (1, 2, 53, 40), 7, 1.0, &small_tiles(isa));
        }
    }
}

#[test]
fn the_default_tiles_of_every_isa_match_the_reference() {
    // The tiles `Options::default` picks for each ISA (`Tuning::for_isa`: 128 keys a tile on AVX-512),
    // over sequences of several such tiles with a partial last one, each ISA forced in turn; and
    // tiles of 256 keys, where a row's visible keys may end in the first 128 (AMX's row pass takes
    // 128 at a time).
    for isa in Isa::all_supported() {
        for tuning in [Tuning::for_isa(isa), Tuning { block_q: 128, block_k: 256, ..Tuning::for_isa(isa) }] {
            let opts = Options { tuning, isa, ..Default::default() };
            for name in ["lssa", "lssa+rw15", "softmax", "relu-l1+rw15"] {
                check_case(name, (1, 2, 300, 64), 300, 1.0, &opts);
            }
        }
    }
}

#[test]
fn head_dims_and_lengths_that_do_not_fit_the_tiles() {
    let isa = Isa::detect();
    for &(t, d) in &[(1, 64), (2, 8), (65, 64), (31, 72), (17, 128), (100, 40)] {
        for name in ["softmax", "lssa", "lssa+rw15", "relu-l1", "sigmoid-rowbias-l1+rw3"] {
            check_case(name, (2, 1, t, d), t as u64, 1.0, &Options { isa, ..Default::default() });
            check_case(name, (1, 1, t, d), 1000 + t as u64, 1.0, &small_tiles(isa));
        }
    }
}

#[test]
fn rows_longer_than_one_fold_group_match_the_reference() {
    // 450 keys in tiles of 24 are 19 key tiles: a row's lane sums fold into its normaliser every
    // `FOLD_TILES` (8) tiles, so the last rows cross two group boundaries and end in a partial group.
    for isa in Isa::all_supported() {
        for name in ["lssa", "lssa+rw15", "softmax", "softmax+rw15", "relu-l1+rw15"] {
            check_case(name, (1, 1, 450, 16), 450, 1.0, &small_tiles(isa));
        }
    }
}

#[test]
fn key_groups_without_an_above_mean_key_are_skipped_correctly() {
    // relu-l1+rw15 with the first 200 keys pointing away from every query: their f is 0, so for the
    // query tiles past them the first groups of key tiles hold no above-mean key, and the second
    // sweep skips them (rows that see only those keys fall back to w = a).
    let (t, d) = (450, 16);
    let q = random((1, 1, t, d), 11, 0.3) + 1.0; // every component in [0.7, 1.3]
    let mut k = random((1, 1, t, d), 12, 1.0);
    k.slice_mut(ndarray::s![.., .., ..200, ..]).mapv_inplace(|x| -1.0 - x.abs());
    let val = random((1, 1, t, d), 13, 1.0);
    let v = variant("relu-l1+rw15");
    let want = attn_core::forward(&v, &to64(&q), &to64(&k), &to64(&val)).unwrap();
    let naive_err = max_abs_diff(&naive_f32(&v, &q, &k, &val), &want);
    let tol = forward_tolerance(naive_err, &want, v.reweight());
    for isa in Isa::all_supported() {
        for bytes in [0, usize::MAX] {
            let opts =
                Options { tuning: Tuning { score_cache_bytes: bytes, ..small_tiles(isa).tuning }, ..small_tiles(isa) };
            let err = max_abs_diff(&cpu::forward_with(&v, &q, &k, &val, &opts).unwrap(), &want);
            assert!(err <= tol, "{isa:?}, score cache {bytes}: forward error {err:.3e} > {tol:.3e}");
        }
    }
}

#[test]
fn adversarial_large_logits_and_near_uniform_rows() {
    let opts = small_tiles(Isa::detect());
    for name in FUSED {
        // Large logits: |q|,|k| up to 4 at d = 32 give dot products of hundreds.
        check_case(name, (1, 1, 40, 32), 11, 4.0, &opts);
        // Near-uniform rows: tiny scores, every key close to the row mean (re-weighting's hard case).
        check_case(name, (1, 1, 40, 32), 12, 1e-3, &opts);
    }
}

#[test]
fn uniform_rows_fall_back_to_stage_one_weights() {
    // Identical keys make every stage-1 row exactly uniform: with re-weighting every u_ij <= 0 for
    // rows > 3, so the kernel must fall back to w = a (the attn-core [choice]), i.e. output the mean of v.
    let q = random((1, 1, 37, 16), 5, 1.0);
    let k = Array4::from_elem((1, 1, 37, 16), 0.25f32);
    let v = random((1, 1, 37, 16), 6, 1.0);
    for name in ["lssa+rw15", "softmax+rw3", "lssa+rw1"] {
        let var = variant(name);
        let got = cpu::forward_with(&var, &q, &k, &v, &small_tiles(Isa::detect())).unwrap();
        for i in 0..37 {
            for c in 0..16 {
                let mean: f32 = (0..=i).map(|j| v[[0, 0, j, c]]).sum::<f32>() / (i + 1) as f32;
                assert!((got[[0, 0, i, c]] - mean).abs() < 1e-5, "{name} row {i}: {} vs {mean}", got[[0, 0, i, c]]);
            }
        }
    }
}

#[test]
fn relu_rows_with_no_positive_score_are_zero() {
    // relu-l1 with every score negative: the attn-core [choice] is an all-zero row, never NaN.
    let q = Array4::from_elem((1, 1, 20, 8), 1.0f32);
    let k = Array4::from_elem((1, 1, 20, 8), -1.0f32);
    let v = random((1, 1, 20, 8), 3, 1.0);
    let var = variant("relu-l1");
    let out = cpu::forward(&var, &q, &k, &v).unwrap();
    assert!(out.iter().all(|&x| x == 0.0));
    let g = cpu::backward(&var, &q, &k, &v, &v).unwrap();
    assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|&x| x == 0.0));
}

#[test]
fn lssar_with_one_dominant_key_stays_finite_at_long_length() {
    // T = 8192: u reaches N - 1 and (N-1)^15 would overflow f32 without the max-rescaling.
    let t = 8192;
    // q = (1, ..., 1); key 0 is parallel to it and every other key is orthogonal to it (zero mean over
    // its coordinates), so row i's stage-1 weights are one large value and N_i - 1 equal small ones.
    let q = Array4::from_elem((1, 1, t, 16), 1.0f32);
    let mut k = random((1, 1, t, 16), 22, 1.0);
    for j in 0..t {
        let mut row = k.slice_mut(ndarray::s![0, 0, j, ..]);
        let mean = row.sum() / 16.0;
        row.mapv_inplace(|x| if j == 0 { 1.0 } else { x - mean });
    }
    let v = random((1, 1, t, 16), 23, 1.0);
    let var = variant("lssa+rw15");
    let out = cpu::forward(&var, &q, &k, &v).unwrap();
    assert!(out.iter().all(|x| x.is_finite()));
    // The last row puts nearly all its weight on the dominant first key.
    let last = out.slice(ndarray::s![0, 0, t - 1, ..]);
    let first_v = v.slice(ndarray::s![0, 0, 0, ..]);
    let err = (&last - &first_v).iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(err < 0.05, "last row should be ~v_0, error {err}");
}

#[test]
fn strided_inputs_give_the_same_result() {
    // (B, T, H, d) memory viewed as (B, H, T, d), as a transformer's projections produce it.
    let q = random((2, 30, 3, 16), 31, 1.0).permuted_axes([0, 2, 1, 3]);
    let k = random((2, 30, 3, 16), 32, 1.0).permuted_axes([0, 2, 1, 3]);
    let v = random((2, 30, 3, 16), 33, 1.0).permuted_axes([0, 2, 1, 3]);
    let var = variant("lssa+rw3");
    let strided = cpu::forward(&var, &q, &k, &v).unwrap();
    let contiguous = cpu::forward(
        &var,
        &q.as_standard_layout().to_owned(),
        &k.as_standard_layout().to_owned(),
        &v.as_standard_layout().to_owned(),
    )
    .unwrap();
    assert_eq!(strided, contiguous);
}

#[test]
fn bad_input_gives_attn_core_errors() {
    let q = random((1, 2, 8, 4), 1, 1.0);
    let k_bad = random((1, 2, 7, 4), 2, 1.0); // fewer keys than query rows;
    let var = variant("lssa");
    let err = cpu::forward(&var, &q, &k_bad, &q).unwrap_err();
    assert!(matches!(err, attn_kernels::Error::Input(attn_core::Error::ShapeMismatch { arg: "k", .. })), "{err}");
    let mut nan = q.clone();
    nan[[0, 1, 3, 2]] = f32::NAN;
    let err = cpu::forward(&var, &q, &q, &nan).unwrap_err();
    assert!(matches!(err, attn_kernels::Error::Input(attn_core::Error::NonFinite { arg: "v", .. })), "{err}");
    let empty = Array4::<f32>::zeros((1, 1, 0, 4));
    assert!(cpu::forward(&var, &empty, &empty, &empty).is_err());
    let err = cpu::forward(&variant("recentered"), &q, &q, &q).unwrap_err();
    assert!(matches!(err, attn_kernels::Error::NotFused { .. }), "{err}");
    assert!(err.to_string().contains("attn_core::forward"));
}

/// The kernels scan the values in chunks on their threads and ask attn-core for the error only when
/// one is not finite: attn-core's error for a value in any argument, chunk (four here) or strided view.
#[test]
fn a_value_that_is_not_finite_anywhere_gives_attn_core_error() {
    let shape = (1, 3, 1100, 64); // 211,200 values: four chunks of the scan
    let q = random(shape, 3, 1.0);
    let var = variant("lssa+rw3");
    for (arg, at, bad) in [
        ("q", [0, 2, 1099, 63], f32::NAN),
        ("k", [0, 0, 0, 0], f32::INFINITY),
        ("v", [0, 1, 700, 5], f32::NEG_INFINITY),
        ("d_out", [0, 2, 1024, 1], f32::NAN),
    ] {
        let mut x = q.clone();
        x[at] = bad;
        let inputs = |name: &str| if name == arg { &x } else { &q };
        let want = attn_core::backward(&var, inputs("q"), inputs("k"), inputs("v"), inputs("d_out")).unwrap_err();
        assert!(matches!(want, attn_core::Error::NonFinite { arg: a, index, .. } if a == arg && index == at));
        let got = cpu::backward(&var, inputs("q"), inputs("k"), inputs("v"), inputs("d_out")).unwrap_err();
        assert_eq!(got.to_string(), attn_kernels::Error::Input(want).to_string());
        if arg != "d_out" {
            let got = cpu::forward(&var, inputs("q"), inputs("k"), inputs("v")).unwrap_err();
            assert!(
                matches!(got, attn_kernels::Error::Input(attn_core::Error::NonFinite { arg: a, index, .. }) if a == arg && index == at)
            );
        }
    }
    // Two faults at once: the error attn-core gives first (q's value before d_out's shape).
    let mut x = q.clone();
    x[[0, 0, 5, 5]] = f32::NAN;
    let short = random((1, 3, 1099, 64), 5, 1.0);
    let want = attn_core::backward(&var, &x, &q, &q, &short).unwrap_err();
    assert!(matches!(want, attn_core::Error::NonFinite { arg: "q", .. }), "{want}");
    let got = cpu::backward(&var, &x, &q, &q, &short).unwrap_err();
    assert_eq!(got.to_string(), attn_kernels::Error::Input(want).to_string());
    // A strided view (heads and positions swapped) scans element by element.
    let mut x = random((1, 1100, 3, 64), 4, 1.0);
    x[[0, 17, 1, 9]] = f32::NAN;
    let xt = x.view().permuted_axes([0, 2, 1, 3]);
    let err = cpu::forward(&var, &q, &q, xt).unwrap_err();
    assert!(
        matches!(err, attn_kernels::Error::Input(attn_core::Error::NonFinite { arg: "v", index: [0, 1, 17, 9], .. })),
        "{err}"
    );
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let q = random((1, 3, 70, 32), 41, 1.0);
    let var = variant("lssa+rw15");
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| cpu::backward(&var, &q, &q, &q, &q).unwrap())
    };
    let (one, four) = (run(1), run(4));
    // The dq partial sums are added in a different grouping with more key chunks: allow rounding.
    assert_eq!(one.dv, four.dv);
    assert_eq!(one.dk, four.dk);
    let dq_err = Zip::from(&one.dq).and(&four.dq).fold(0.0f32, |m, a, b| m.max((a - b).abs()));
    assert!(dq_err < 1e-5, "{dq_err}");
}

/// Re-weighting's second sweep reads the first sweep's activations (softmax+rw: its scores) where they fit
/// `Tuning::score_cache_bytes` and recomputes them where they do not: the same outputs and row
/// statistics bit for bit, for every re-weighted variant, whether the whole stripe fits, none of it
/// fits (budget 0), or it fits for the first query tiles only (a budget between the two). And the
/// backward, which reads those statistics, agrees too.
#[test]
fn reweighting_is_the_same_with_and_without_the_score_cache() {
    let (b, h, t, d) = (2, 2, 150, 40);
    let q = attn_core::fixtures::random_qkv::<f32>([b, h, t, d], 31);
    let g = attn_core::fixtures::random_qkv::<f32>([b, h, t, d], 32).0;
    for name in ["lssa+rw15", "lssa+rw1", "softplus-l1+rw3", "relu-l1+rw15", "sigmoid-rowbias-l1+rw3", "softmax+rw15"] {
        let v: Variant = name.parse().unwrap();
        for isa in Isa::all_supported() {
            let run = |bytes: usize| {
                let opts = Options {
                    tuning: Tuning { block_q: 16, block_k: 24, score_cache_bytes: bytes, ..Tuning::default() },
                    isa,
                    ..Default::default()
                };
                let o = cpu::forward_with(&v, &q.0, &q.1, &q.2, &opts).unwrap();
                // The backward runs its own forward for the statistics, with the same options.
                let grads = cpu::backward_with(&v, &q.0, &q.1, &q.2, &g, &opts).unwrap();
                (o, grads.dq, grads.dk, grads.dv)
            };
            // 150 keys in tiles of 24 (padded to a multiple of the register block): 7 key tiles for
            // the last query tile; the middle budget holds the stripes of query tiles with <= 4.
            let all = run(usize::MAX);
            for bytes in [0, 4 * 16 * 32 * 4 + 1] {
                let other = run(bytes);
                assert!(all == other, "{name} on {isa:?}: budget {bytes} changes the results");
            }
        }
    }
}

/// Re-weighting's backward with the forward's helper (no `E_i` sweep) and without it (the sweep): the
/// same gradients up to rounding, and each as close to the f64 reference as the other, for every
/// re-weighted variant the kernels fuse, on every ISA, across several tiles; under `relu-l1` the
/// first row of the first head sees only a negative score (`Z = 0`: the fallback `w = a`).
#[test]
fn reweighting_backward_is_the_same_with_and_without_the_forward_helper() {
    let (b, h, t, d) = (1, 2, 70, 40);
    let (mut q, k, v) = attn_core::fixtures::random_qkv::<f32>([b, h, t, d], 41);
    for c in 0..d {
        q[[0, 0, 0, c]] = -k[[0, 0, 0, c]];
    }
    let g = attn_core::fixtures::random_qkv::<f32>([b, h, t, d], 42).0;
    let f64s = |x: &Array4<f32>| x.mapv(|a| a as f64);
    for name in [
        "lssa+rw15",
        "lssa+rw1",
        "lssa+rw3",
        "softplus-l1+rw64",
        "relu-l1+rw15",
        "softmax+rw15",
        "sigmoid-rowbias-l1+rw3",
    ] {
        let var: Variant = name.parse().unwrap();
        let exact = attn_core::backward(&var, &f64s(&q), &f64s(&k), &f64s(&v), &f64s(&g)).unwrap();
        for isa in Isa::all_supported() {
            let run = |helper: bool| {
                let tuning = Tuning { block_q: 16, block_k: 24, reweight_helper: helper, ..Tuning::default() };
                cpu::backward_with(&var, &q, &k, &v, &g, &Options { tuning, isa, ..Default::default() }).unwrap()
            };
            let (with, without) = (run(true), run(false));
            for (what, a, b, r) in [
                ("dq", &with.dq, &without.dq, &exact.dq),
                ("dk", &with.dk, &without.dk, &exact.dk),
                ("dv", &with.dv, &without.dv, &exact.dv),
            ] {
                let scale = r.iter().fold(0.0f64, |m, x| m.max(x.abs()));
                let err =
                    |x: &Array4<f32>| Zip::from(x).and(r).fold(0.0f64, |m, &a, &e| m.max((a as f64 - e).abs())) / scale;
                let diff = Zip::from(a).and(b).fold(0.0f64, |m, &x, &y| m.max((x as f64 - y as f64).abs())) / scale;
                let (ew, eo) = (err(a), err(b));
                assert!(diff < 1e-4, "{name} {isa:?} {what}: helper changes the gradient by {diff:.2e}");
                assert!(
                    ew <= 2.0 * eo + 1e-5,
                    "{name} {isa:?} {what}: error {ew:.2e} with the helper, {eo:.2e} without"
                );
            }
        }
    }
}

/// Issue-6 regression (found by `random_shapes_match_the_reference`): a `relu-l1` row whose only
/// positive score is 0.002, so `Z_i` is tiny and the backward is ill-conditioned; the error must stay
/// within the first-order bound of [`l1_conditioning_tolerance`] on every ISA and tile size.
#[test]
fn cases_found_by_random_search_stay_within_their_bounds() {
    for isa in [Isa::Scalar, Isa::detect()] {
        for b in [1, 3, 16] {
            let opts =
                Options { tuning: Tuning { block_q: b, block_k: b, ..Tuning::default() }, isa, ..Default::default() };
            check_case("relu-l1", (1, 1, 4, 72), 392, 1.0, &opts);
            check_case("relu2-l1", (1, 1, 21, 72), 392, 1.0, &opts);
            check_case("lssa+rw64", (1, 1, 10, 64), 183, 1.0, &opts);
            check_case("lssa+rw64", (1, 1, 5, 64), 604, 1.0, &opts);
            check_case("lssa+rw15", (1, 1, 15, 72), 619, 1.0, &opts);
            check_case("sigmoid-rowbias-l1+rw3", (1, 1, 40, 64), 420, 1.0, &opts);
        }
    }
}

/// The property tests' random source: fixed, so that CI is reproducible (a case that fails fails every
/// time, on every machine); set `PROPTEST_RNG_SEED=<n>` (and `PROPTEST_CASES`) to explore other cases.
fn proptest_config() -> ProptestConfig {
    let seed = std::env::var("PROPTEST_RNG_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_122);
    ProptestConfig { rng_seed: proptest::test_runner::RngSeed::Fixed(seed), ..ProptestConfig::with_cases(24) }
}

proptest! {
    #![proptest_config(proptest_config())]
    #[test]
    fn random_shapes_match_the_reference(
        t in 1usize..80,
        d in prop::sample::select(vec![8usize, 40, 64, 72]),
        bq in 1usize..40,
        bk in 1usize..40,
        which in 0usize..FUSED.len(),
        seed in 0u64..1000,
    ) {
        let opts = Options { tuning: Tuning { block_q: bq, block_k: bk, ..Default::default() }, ..Default::default() };
        check_case(FUSED[which], (1, 1, t, d), seed, 1.0, &opts);
    }
}

/// A user's activation the kernels do not know: it must run (element by element) and still match.
#[derive(Debug, Clone)]
struct Squareplus;

impl attn_core::Activation for Squareplus {
    fn name(&self) -> &str {
        "squareplus"
    }
    fn value(&self, x: f64) -> f64 {
        (x + (x * x + 4.0).sqrt()) / 2.0
    }
    fn derivative(&self, x: f64) -> f64 {
        (1.0 + x / (x * x + 4.0).sqrt()) / 2.0
    }
    fn is_non_negative(&self) -> bool {
        true
    }
}

#[test]
fn a_users_own_activation_runs_fused() {
    let v = Variant::builder().activation(Squareplus).reweight(3).build().unwrap();
    let q = random((1, 2, 30, 16), 51, 1.0);
    let k = random((1, 2, 30, 16), 52, 1.0);
    let val = random((1, 2, 30, 16), 53, 1.0);
    let want = attn_core::forward(&v, &to64(&q), &to64(&k), &to64(&val)).unwrap();
    let got = cpu::forward(&v, &q, &k, &val).unwrap();
    assert!(max_abs_diff(&got, &want) < 1e-5, "{}", max_abs_diff(&got, &want));
    let want = attn_core::backward(&v, &to64(&q), &to64(&k), &to64(&val), &to64(&val)).unwrap();
    let got = cpu::backward(&v, &q, &k, &val, &val).unwrap();
    for (a, b) in [(&got.dq, &want.dq), (&got.dk, &want.dk), (&got.dv, &want.dv)] {
        assert!(max_abs_diff(a, b) < 1e-4 * max_abs(b).max(1.0), "{}", max_abs_diff(a, b));
    }
}
