//! Re-weighting's powers `rho^p` over f32 slices: compiled squarings for the powers the paper and
//! the sweeps use, no subnormal result, and the bound under which a forward drops a weight.

/// `x^P` with `P` known at compile time: the squarings unroll and stay in registers.
#[inline(always)]
fn pow_one<const P: u32>(x: f32) -> f32 {
    let (mut base, mut acc, mut e) = (x, 1.0f32, P);
    while e > 0 {
        if e & 1 == 1 {
            acc *= base;
        }
        base *= base;
        e >>= 1;
    }
    acc
}

/// The bases in `[0, 1]` below which `x^p` falls under f32's normal range: `2^(-126 / p)`, raised
/// by a factor `1 + 2^-18` so that the rounding of the squarings (at most `2 log2(p)` roundings of
/// `2^-24`) cannot take a power at the bound below it; the powers it flushes besides are within
/// `p 2^-18` (0.03% at `p = 64`) above the bottom of the normal range.
#[inline(always)]
pub(crate) fn subnormal_below(p: u32) -> f32 {
    if p == 0 { 0.0 } else { (2f64.powf(-126.0 / f64::from(p)) * (1.0 + 2f64.powi(-18))) as f32 }
}

/// `xs <- g(xs)^p` (`g` element-wise, into `[0, 1]` where re-weighting calls it): the powers the
/// paper and its sweeps use (and their `p - 1` for gradients) are compiled as constants, one pass
/// with `g` fused in and the squarings in registers; any other `p` applies `g`, then runs repeated
/// squaring over the slice (`tmp` is scratch of the same length), one pass per bit of `p`. The
/// same values either way.
///
/// A power below f32's normal range (`g(x)` under about `2^(-126 / p)`: the power under
/// `1.2e-38`) is 0, computed without a subnormal intermediate: Intel cores take a microcode assist
/// of about a hundred cycles for each subnormal result, and `rho^15` is subnormal for every `rho`
/// under 0.003 (avoiding them took the LSSAR forward on an Intel Xeon from 378-408 to 303-320
/// ms, `cpu_lab`, T = 4096). Such a weight is under `2^-126` where a row's largest is exactly 1:
/// the row sums it joins (f64) do not move, and a weighted sum of values moves only where it
/// cancels to within a few ulps of `2^-126`. Checked: LSSAR's outputs and gradients (p = 2, 4, 15; T = 200 to 4096,
/// random inputs; 11.5M values) came out the same bit for bit before and after this flush.
#[inline(always)]
pub(crate) fn map_pow(xs: &mut [f32], p: u32, tmp: &mut [f32], g: impl Fn(f32) -> f32) {
    map_pow_from(xs, p, tmp, subnormal_below(p), g)
}

/// `2^-30 / t`: re-weighting's weights `rho^p` under it are negligible in a forward over `t` keys
/// (see [`negligible_below`]).
pub(crate) fn negligible_weight(t: usize) -> f64 {
    2f64.powi(-30) / t.max(1) as f64
}

/// The bases in `[0, 1]` whose power `rho^p` is under [`negligible_weight`]`(t)` (give or take
/// the rounding of the bound to f32 and of the squarings, `p 2^-23` relative), and at least
/// [`subnormal_below`]`(p)`.
///
/// Re-weighting's forward drops those weights: a row's largest weight is 1 exactly (its best key
/// has `rho = 1`), so its weight sum `W` is at least 1, and the weights it drops (at most `t`, each
/// under `2^-29 / t`) sum to under `2^-29 W`. Its output `sum(w v) / W` moves by under
/// `2^-28 max |v|`, far below the f32 rounding of its sums (one rounding of `2^-24` per term).
/// What it buys: a value product over fewer keys. At `p = 15` and `t = 4096` the bound is `rho <
/// 0.144`, where about half of a random row's above-mean keys fall (LSSAR's forward on an Intel
/// Xeon, T = 4096, 2 threads: 0.94x the time). The backward helper's terms `f rho^(p-1)` go by the
/// same bound on `rho^(p-1)` (`negligible_below(p - 1, t)`: they sum to under `2^-30` of the
/// helper's `c_i`, whose best key adds `f_max`), so on AVX-512 the two value products share each
/// row's list of keys (`tile::matmul_acc_nonzero_two`; LSSAR's forward + backward 0.96-0.97x the
/// time). The backward's own gradients are those of every weight.
pub(crate) fn negligible_below(p: u32, t: usize) -> f32 {
    if p == 0 {
        return 0.0;
    }
    let low = negligible_weight(t).powf(1.0 / f64::from(p)) as f32;
    low.max(subnormal_below(p))
}

/// [`map_pow`] with `g(x)` under `low` (at least [`subnormal_below`]`(p)`) giving 0.
#[inline(always)]
pub(crate) fn map_pow_from(xs: &mut [f32], p: u32, tmp: &mut [f32], low: f32, g: impl Fn(f32) -> f32) {
    debug_assert!(low >= subnormal_below(p), "a power under f32's normal range must be flushed");
    let g = |x: f32| {
        let b = g(x);
        if b < low { 0.0 } else { b }
    };
    macro_rules! compiled {
        ($($p:literal)*) => {
            match p {
                $($p => return xs.iter_mut().for_each(|x| *x = pow_one::<$p>(g(*x))),)*
                _ => {}
            }
        };
    }
    compiled!(1 2 3 4 5 7 8 14 15 24 25 49 50 63 64);
    xs.iter_mut().for_each(|x| *x = g(*x));
    if p == 0 {
        return xs.fill(1.0);
    }
    let n = xs.len();
    let base = &mut tmp[..n];
    base.copy_from_slice(xs);
    xs.fill(1.0);
    let mut e = p;
    loop {
        if e & 1 == 1 {
            xs.iter_mut().zip(base.iter()).for_each(|(x, &b)| *x *= b);
        }
        e >>= 1;
        if e == 0 {
            break;
        }
        base.iter_mut().for_each(|b| *b *= *b);
    }
}

/// `xs <- xs^p` ([`map_pow`] with no map).
#[inline(always)]
pub(crate) fn pow_slice(xs: &mut [f32], p: u32, tmp: &mut [f32]) {
    map_pow(xs, p, tmp, |x| x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The forward's bound for dropping re-weighted weights: the base whose `p`-th power is
    /// `2^-30 / t` (exact powers in f64), never under the subnormal bound; and `map_pow_from` drops
    /// exactly the bases under it, keeping the squarings' bits for the others.
    #[test]
    fn negligible_weights_are_the_powers_under_the_bound() {
        let xs: Vec<f32> = (0..=1.0f32.to_bits()).step_by(40_009).map(f32::from_bits).collect();
        for t in [1usize, 64, 4096, 1 << 20] {
            let eps = 2f64.powi(-30) / t as f64;
            for p in [1u32, 2, 15, 64] {
                let low = negligible_below(p, t);
                let at = f64::from(low).powi(p as i32);
                if low > subnormal_below(p) {
                    assert!((at / eps - 1.0).abs() <= f64::from(p) * 2f64.powi(-23), "p = {p}, t = {t}: {at:e}");
                } else {
                    assert!(eps < f64::from(f32::MIN_POSITIVE) * 1.0003, "p = {p}, t = {t}");
                }
                let mut got = xs.clone();
                let mut tmp = vec![0.0; xs.len()];
                map_pow_from(&mut got, p, &mut tmp, low, |x| x);
                let (mut dropped, mut kept) = (0, 0);
                for (&x, &y) in xs.iter().zip(&got) {
                    let exact = f64::from(x).powi(p as i32);
                    if y == 0.0 && x != 0.0 {
                        assert!(exact < eps.max(f64::from(f32::MIN_POSITIVE)) * 1.0003, "{x:e}^{p} dropped, t = {t}");
                        dropped += 1;
                    } else {
                        assert!(x == 0.0 || exact >= eps * (1.0 - 1e-5), "{x:e}^{p} kept, t = {t}");
                        let mut one = [x];
                        pow_slice(&mut one, p, &mut [0.0]);
                        assert_eq!(y.to_bits(), one[0].to_bits(), "{x:e}^{p}");
                        kept += 1;
                    }
                }
                assert!(dropped > 0 && kept > 0, "p = {p}, t = {t}: the sweep must cross the bound");
            }
        }
        // At the benchmarks' shape, LSSAR (p = 15, T = 4096) drops rho under 0.144.
        assert!((negligible_below(15, 4096) - 0.1436).abs() < 1e-3, "{}", negligible_below(15, 4096));
    }

    /// Re-weighting's powers: 0 exactly where `x^p` is below f32's normal range (no subnormal is
    /// produced), the repeated squaring's bits everywhere else; compiled and generic exponents.
    #[test]
    fn map_pow_flushes_only_subnormal_powers() {
        // Every 4099th f32 in [0, 1], and the 200 around each exponent's boundary.
        let mut xs: Vec<f32> = (0..=1.0f32.to_bits()).step_by(4099).map(f32::from_bits).collect();
        for p in [1u32, 2, 6, 14, 15, 16, 64] {
            let b = subnormal_below(p).to_bits();
            xs.extend((b - 100..b + 100).map(f32::from_bits));
        }
        // The unflushed squarings (6 and 16 take map_pow's generic path, the others its compiled one).
        type Pow = fn(f32) -> f32;
        let squarings: [(u32, Pow); 7] = [
            (1, pow_one::<1>),
            (2, pow_one::<2>),
            (6, pow_one::<6>),
            (14, pow_one::<14>),
            (15, pow_one::<15>),
            (16, pow_one::<16>),
            (64, pow_one::<64>),
        ];
        for (p, squaring) in squarings {
            let mut got = xs.clone();
            let mut tmp = vec![0.0; xs.len()];
            map_pow(&mut got, p, &mut tmp, |x| x);
            let (mut flushed, mut kept) = (0, 0);
            for (&x, &y) in xs.iter().zip(&got) {
                let want = squaring(x);
                assert!(y == 0.0 || y >= f32::MIN_POSITIVE, "{x:e}^{p} = {y:e} is subnormal");
                if y == 0.0 && want != 0.0 {
                    // Only a power under the normal range, or within 0.03% above its bottom, goes.
                    assert!(want < f32::MIN_POSITIVE * 1.0003, "{x:e}^{p} = {want:e} flushed");
                    flushed += 1;
                } else {
                    assert_eq!(y.to_bits(), want.to_bits(), "{x:e}^{p}");
                    kept += 1;
                }
            }
            assert!(flushed > 0 && kept > 0, "p = {p}: the sweep must cross the boundary");
        }
    }
}
