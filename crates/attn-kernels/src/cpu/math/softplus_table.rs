//! Softplus on AVX-512 from a table of per-interval polynomials: the kernels' softplus on scores
//! known in range on AVX-512 and AMX (`act::apply`, and the AMX forward's fused row pass
//! `tile::amx::softplus_row`), where the branch-free [`math::softplus_in_range`] takes about 31
//! vector operations for 16 scores (`e^-|x|`'s range reduction and polynomial, then `ln(1 + e)`'s
//! degree-8 polynomial) and this one 18 (0.64x the time over 128-score rows, one core of an Intel
//! Xeon).
//!
//! # Method
//!
//! `softplus(x) = max(x, 0) + g(|x|)` with `g(u) = ln(1 + e^-u)`. Below [`TABLE_MAX`], `g` is one of
//! 32 polynomials of degree 5 in `s = u - k/2`, `k = round(2u)` (so `|s| <= 1/4`): `2u + 1.5 · 2^23`
//! holds `k` in its low bits, which index the 32 coefficients of a power in one `vpermt2ps` (two
//! registers of 16), and `s` is exact. `g` is analytic in a strip of half-width `π` about the real
//! axis, so degree 5 fits it within 0.09 ulp over a quarter each side of a centre, relative error
//! included where `g ≈ e^-u` is small (the coefficients scale with `e^-k/2`). A vector with a lane
//! at or past [`TABLE_MAX`] (`k >= 32`) takes [`math::softplus_in_range`] for the whole vector and
//! keeps its values in those lanes, bit for bit, so scores down to `-IN_RANGE_MAX` keep relative
//! accuracy.
//!
//! The coefficients are fitted per interval in f64 for the least maximum relative error, then fixed
//! in f32 one at a time from the constant up, the higher ones refitted after each rounding (the
//! constant's rounding is an ulp of a result in the binade below it); `tools/fit_softplus_table.py`
//! re-derives them and prints the table.
//!
//! # Accuracy
//!
//! [`SOFTPLUS_TABLE_MAX_ULPS`] for every f32 `x` with `|x| <= IN_RANGE_MAX`: the maximum over all
//! 2.2e9 of them was 1.646 ulps (at `x = -15.25`; the `#[ignore]`d test `exhaustive_accuracy`, 25 s
//! on 2 cores), against 2.126 for [`math::softplus`]. The default suite sweeps 5.2M of them.
//!
//! [`math`]: super
//! [`math::softplus_in_range`]: super::softplus_in_range
//! [`math::softplus`]: super::softplus

use std::arch::x86_64::*;

use crate::cpu::math;

/// Where the table ends: it covers `|x| < TABLE_MAX` (`k = round(2|x|) <= 31`); a vector with a lane
/// at or past it takes [`math::softplus_in_range`] for those lanes.
pub const TABLE_MAX: f32 = 15.75;

/// Max error of the table's softplus (`softplus16`) for `|x| <= IN_RANGE_MAX`
/// (`math::IN_RANGE_MAX`), in ulps of the exact result's binade (measured 1.646, module docs).
pub const SOFTPLUS_TABLE_MAX_ULPS: f64 = 1.7;

/// `g(k/2 + s) = ln(1 + e^-(k/2 + s))` for `|s| <= 1/4` (`s >= 0` at `k = 0`) by Horner's scheme
/// over `COEFFS.0[p][k]`, `p = 0..6`: row `p` holds the coefficient of `s^(5 - p)` for every
/// interval `k`.
#[repr(C, align(64))]
struct Table([[f32; 32]; 6]);

#[rustfmt::skip]
static COEFFS: Table = Table([
    [
        -6.3794816e-4, 8.544331e-4, 1.017467e-3, 6.360226e-4, 1.6473445e-4, -7.973721e-5, -1.561699e-4, -1.4613947e-4,
        -1.1082174e-4, -7.760902e-5, -5.004695e-5, -3.1703283e-5, -2.0055793e-5, -1.2198743e-5, -7.5780154e-6,
        -4.6397263e-6, -2.764932e-6, -1.7081964e-6, -1.0271416e-6, -6.211188e-7, -3.8416138e-7, -2.3195604e-7,
        -1.4122723e-7, -8.414752e-8, -5.087103e-8, -3.1321775e-8, -1.9094776e-8, -1.1615269e-8, -6.9110144e-9,
        -4.2612465e-9, -2.5829892e-9, -1.5611403e-9,
    ],
    [
        -4.7140904e-3, -3.9948123e-3, -1.4772204e-3, 6.298685e-4, 1.6184788e-3, 1.6891119e-3, 1.3724134e-3,
        9.833407e-4, 6.57792e-4, 4.2473536e-4, 2.665494e-4, 1.6505526e-4, 1.0167389e-4, 6.206406e-5, 3.7895345e-5,
        2.3082042e-5, 1.3971668e-5, 8.501744e-6, 5.152437e-6, 3.12449e-6, 1.9012014e-6, 1.1514884e-6, 7.000376e-7,
        4.228928e-7, 2.5651286e-7, 1.5599485e-7, 9.463356e-8, 5.7438157e-8, 3.4754272e-8, 2.1115122e-8, 1.28183775e-8,
        7.757964e-9,
    ],
    [
        -1.16478834e-4, -9.591892e-3, -1.51422825e-2, -1.5789257e-2, -1.3326478e-2, -9.911136e-3, -6.8152235e-3,
        -4.4642044e-3, -2.8379404e-3, -1.7712105e-3, -1.0932023e-3, -6.7010854e-4, -4.0904016e-4, -2.490748e-4,
        -1.514221e-4, -9.1973234e-5, -5.5836932e-5, -3.388281e-5, -2.0558102e-5, -1.2471744e-5, -7.564919e-6,
        -4.5887587e-6, -2.783323e-6, -1.6882982e-6, -1.0240389e-6, -6.210874e-7, -3.7670284e-7, -2.2848057e-7,
        -1.3859e-7, -8.40543e-8, -5.0981942e-8, -3.0922422e-8,
    ],
    [
        1.2501092e-1, 1.1750132e-1, 9.830604e-2, 7.457404e-2, 5.2496344e-2, 3.5051867e-2, 2.2588285e-2, 1.4226537e-2,
        8.831412e-3, 5.433062e-3, 3.3240193e-3, 2.0267887e-3, 1.2332406e-3, 7.494612e-4, 4.5510437e-4, 2.7623083e-4,
        1.6761865e-4, 1.0169154e-4, 6.168933e-5, 3.7420243e-5, 2.2697512e-5, 1.376734e-5, 8.350398e-6, 5.0649464e-6,
        3.0720694e-6, 1.8632878e-6, 1.1301435e-6, 6.854654e-7, 4.1576118e-7, 2.5217003e-7, 1.529482e-7, 9.2768815e-8,
    ],
    [
        -5.0000036e-1, -3.7754068e-1, -2.6894143e-1, -1.8242551e-1, -1.1920293e-1, -7.585818e-2, -4.7425874e-2,
        -2.931223e-2, -1.798621e-2, -1.0986943e-2, -6.6928505e-3, -4.0701376e-3, -2.4726233e-3, -1.5011822e-3,
        -9.1105123e-4, -5.5277866e-4, -3.353501e-4, -2.0342699e-4, -1.2339458e-4, -7.4846226e-5, -4.5397872e-5,
        -2.7535692e-5, -1.6701422e-5, -1.0129991e-5, -6.144174e-6, -3.7266393e-6, -2.2603244e-6, -1.3709573e-6,
        -8.31528e-7, -5.0434744e-7, -3.0590223e-7, -1.8553911e-7,
    ],
    [
        6.931472e-1, 4.74077e-1, 3.132617e-1, 2.0141327e-1, 1.2692802e-1, 7.8889735e-2, 4.8587352e-2, 2.9750418e-2,
        1.8149927e-2, 1.1047745e-2, 6.7153485e-3, 4.078443e-3, 2.4756852e-3, 1.5023102e-3, 9.114665e-4, 5.529315e-4,
        3.3540637e-4, 2.0344768e-4, 1.2340219e-4, 7.484903e-5, 4.53989e-5, 2.753607e-5, 1.6701562e-5, 1.0130042e-5,
        6.1441933e-6, 3.7266464e-6, 2.260327e-6, 1.3709582e-6, 8.315284e-7, 5.0434755e-7, 3.059023e-7, 1.8553912e-7,
    ],
]);

/// [`COEFFS`] in registers: row `p` as its two vectors of 16 intervals, what `vpermt2ps` indexes.
#[derive(Clone, Copy)]
struct Coeffs([(__m512, __m512); 6]);

impl Coeffs {
    #[target_feature(enable = "avx512f")]
    fn load() -> Coeffs {
        // SAFETY: each row of the 64-byte-aligned table is 32 floats, two aligned vectors.
        let row =
            |p: usize| unsafe { (_mm512_load_ps(COEFFS.0[p].as_ptr()), _mm512_load_ps(COEFFS.0[p][16..].as_ptr())) };
        Coeffs(std::array::from_fn(row))
    }
}

/// Softplus of the lanes of `x`, within [`SOFTPLUS_TABLE_MAX_ULPS`] where `|x| <= IN_RANGE_MAX`;
/// lanes outside `live` may hold anything (their results are unspecified, never UB).
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn softplus16(c: &Coeffs, x: __m512, live: __mmask16) -> __m512 {
    // `1.5 · 2^23`: `2u` plus it holds `round(2u)` in its low mantissa bits (`2u < 2^22`).
    const MAGIC: f32 = 12_582_912.0;
    let magic = _mm512_set1_ps(MAGIC);
    let u = _mm512_abs_ps(x);
    let rounded = _mm512_fmadd_ps(u, _mm512_set1_ps(2.0), magic);
    let k = _mm512_sub_ps(rounded, magic);
    let s = _mm512_fmadd_ps(k, _mm512_set1_ps(-0.5), u);
    // `vpermt2ps` reads the index's low 5 bits: `k mod 32`.
    let at = _mm512_castps_si512(rounded);
    let mut g = _mm512_permutex2var_ps(c.0[0].0, at, c.0[0].1);
    for &(lo, hi) in &c.0[1..] {
        g = _mm512_fmadd_ps(g, s, _mm512_permutex2var_ps(lo, at, hi));
    }
    // `max(x, 0)` as `math::softplus_of` takes it (`maxps` returns its second operand, `+0`, for
    // `x = -0`).
    let f = _mm512_add_ps(_mm512_max_ps(x, _mm512_setzero_ps()), g);
    // Lanes past the last interval (`k >= 32`).
    let beyond = _mm512_mask_cmp_ps_mask(live, u, _mm512_set1_ps(TABLE_MAX), _CMP_GE_OQ);
    if beyond == 0 {
        return f;
    }
    // Through an array the loop vectorises over, without the calls a slice copy makes (which
    // would spill the table's registers around every vector).
    let mut lanes = [0.0f32; 16];
    // SAFETY: `lanes` holds 16 floats.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), x) };
    lanes.iter_mut().for_each(|x| *x = math::softplus_in_range::<true>(*x));
    // SAFETY: as above.
    _mm512_mask_blend_ps(beyond, f, unsafe { _mm512_loadu_ps(lanes.as_ptr()) })
}

/// `xs[i] = softplus(xs[i])` in place by [`softplus16`] (`act::apply`'s on AVX-512): within
/// [`SOFTPLUS_TABLE_MAX_ULPS`] for `|xs[i]| <= IN_RANGE_MAX`; unspecified (never UB) beyond, NaN
/// included. Callers without AVX-512F in their own features call it in `unsafe`, having checked
/// the CPU.
#[target_feature(enable = "avx512f,fma")]
pub(crate) fn softplus_in_range(xs: &mut [f32]) {
    let c = Coeffs::load();
    for chunk in xs.chunks_mut(16) {
        let live: __mmask16 = if chunk.len() == 16 { !0 } else { (1 << chunk.len()) - 1 };
        // SAFETY: the mask covers `chunk`'s elements only.
        let x = unsafe { _mm512_maskz_loadu_ps(live, chunk.as_ptr()) };
        // SAFETY: as the load.
        unsafe { _mm512_mask_storeu_ps(chunk.as_mut_ptr(), live, softplus16(&c, x, live)) };
    }
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::*;
    use crate::cpu::Isa;
    use crate::cpu::math::tests::{key, softplus_ref, sweep, ulp, unkey};

    /// The largest error of [`softplus16`] over `xs` in ulps of the exact result, and where;
    /// panics where a lane past the table differs from [`math::softplus_in_range`] by a bit. Runs
    /// the slice in pieces of 37 (every tail of a vector of 16 in turn).
    fn worst(xs: &[f32]) -> (f64, f32) {
        let mut got = xs.to_vec();
        // SAFETY: the callers checked AVX-512F.
        got.chunks_mut(37).for_each(|c| unsafe { softplus_in_range(c) });
        let mut w = (0.0, 0.0);
        for (&x, &y) in xs.iter().zip(&got) {
            if x.abs() >= TABLE_MAX {
                let want = math::softplus_in_range::<true>(x);
                assert_eq!(y.to_bits(), want.to_bits(), "softplus({x:e}) past the table: {y:e}, math's {want:e}");
            }
            let exact = softplus_ref(f64::from(x));
            let ulps = (f64::from(y) - exact).abs() / ulp(exact);
            if ulps > w.0 {
                w = (ulps, x);
            }
        }
        w
    }

    /// 2^22 inputs evenly over the bit patterns of `[-IN_RANGE_MAX, IN_RANGE_MAX]`, 2^20 on a linear
    /// grid over the table's range, and the intervals' edges and centres: within the bound, and
    /// `math`'s bits past the table.
    #[test]
    fn sweep_meets_the_bound_and_is_maths_past_the_table() {
        if !Isa::Avx512.is_supported() {
            return;
        }
        let mut xs = sweep(-math::IN_RANGE_MAX, math::IN_RANGE_MAX, 1 << 22);
        xs.extend((0..1 << 20).map(|i| (i as f32 / (1 << 19) as f32 - 1.0) * TABLE_MAX));
        for k in 0..=32 {
            let edge = k as f32 / 2.0 + 0.25;
            for x in [k as f32 / 2.0, edge.next_down(), edge, edge.next_up()] {
                xs.extend([x, -x]);
            }
        }
        xs.extend([0.0, -0.0, f32::MIN_POSITIVE, -f32::MIN_POSITIVE, 1e-30, -1e-30]);
        let (ulps, at) = xs.par_chunks(1 << 16).map(worst).reduce(|| (0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
        println!("softplus (table): max {ulps:.3} ulps at x = {at:e}");
        assert!(ulps <= SOFTPLUS_TABLE_MAX_ULPS, "{ulps} ulps at x = {at:e}");
    }

    /// A call writes its slice and nothing around it, at every length up to 40.
    #[test]
    fn a_call_writes_only_its_slice() {
        if !Isa::Avx512.is_supported() {
            return;
        }
        for n in 0..=40 {
            let mut buf = vec![f32::NAN; n + 2];
            buf[1..=n].iter_mut().enumerate().for_each(|(i, x)| *x = i as f32 - 20.0);
            // SAFETY: checked above.
            unsafe { softplus_in_range(&mut buf[1..=n]) };
            assert!(buf[0].is_nan() && buf[n + 1].is_nan(), "length {n}");
            for (i, &y) in buf[1..=n].iter().enumerate() {
                let exact = softplus_ref(i as f64 - 20.0);
                assert!(
                    (f64::from(y) - exact).abs() <= SOFTPLUS_TABLE_MAX_ULPS * ulp(exact),
                    "length {n}, element {i}"
                );
            }
        }
    }

    /// Every f32 in `[-IN_RANGE_MAX, IN_RANGE_MAX]` (2.2e9): the source of
    /// [`SOFTPLUS_TABLE_MAX_ULPS`].
    #[test]
    #[ignore = "exhaustive over 2.2e9 inputs; run with --ignored --nocapture"]
    fn exhaustive_accuracy() {
        if !Isa::Avx512.is_supported() {
            return;
        }
        let (lo, hi) = (key(-math::IN_RANGE_MAX), key(math::IN_RANGE_MAX));
        let chunk = 1i64 << 20;
        let t = std::time::Instant::now();
        let (ulps, at) = (0..(hi - lo) / chunk + 1)
            .into_par_iter()
            .map(|c| {
                let start = lo + c * chunk;
                worst(&(start..(start + chunk).min(hi + 1)).map(unkey).collect::<Vec<_>>())
            })
            .reduce(|| (0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a });
        println!("softplus (table): max {ulps:.3} ulps at x = {at:e} ({:.0} s)", t.elapsed().as_secs_f64());
        assert!(ulps <= SOFTPLUS_TABLE_MAX_ULPS, "{ulps} ulps at x = {at:e}");
    }
}
