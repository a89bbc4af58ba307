//! Student's t distribution, written out: random draws (for the bootstraps elsewhere in the crate),
//! the CDF through the regularised incomplete beta function (a continued fraction), and the quantile
//! for any real degrees of freedom, by bisection on the CDF.
//!
//! - `P(T > t) = I_x(df/2, 1/2) / 2` with `x = df / (df + t^2)` (`t >= 0`).
//! - `I_x(a, b)` is evaluated by its continued fraction with the modified Lentz method, on the side
//!   (`x` or `1 - x`, by the symmetry `I_x(a, b) = 1 - I_{1-x}(b, a)`) where it converges fast.
//! - Beyond [`EXPANSION_DF`] degrees of freedom the quantile is the normal quantile corrected by the
//!   Cornish-Fisher series in `1/df` (Abramowitz and Stegun 26.7.5), whose first omitted term is
//!   below 1e-18 there; the normal quantile inverts `P(Z > z) = Q(1/2, z^2/2) / 2`, the regularised
//!   upper incomplete gamma function (a series or a continued fraction).

use attn_core::fixtures::Rng;

/// Degrees of freedom above which [`t_quantile`] uses the expansion around the normal quantile.
pub(super) const EXPANSION_DF: f64 = 1e4;

/// Relative accuracy the continued fractions and series stop at.
const EPS: f64 = 1e-16;

/// Guards the Lentz recursion against division by zero.
const TINY: f64 = 1e-300;

/// A draw from Student's t with `df` degrees of freedom (normal / sqrt(chi-square / df)).
pub(crate) fn student_t(rng: &mut Rng, df: usize) -> f64 {
    let z = rng.normal();
    let chi2: f64 = (0..df).map(|_| rng.normal().powi(2)).sum();
    z / (chi2 / df as f64).sqrt()
}

/// `ln Gamma(x)` for `x > 0`: the Lanczos approximation (g = 7, 9 coefficients), relative error
/// about 1e-15; the reflection formula below 1/2.
pub(super) fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let a = C[0] + C.iter().enumerate().skip(1).map(|(i, c)| c / (x + i as f64)).sum::<f64>();
    let t = x + G + 0.5;
    0.5 * std::f64::consts::TAU.ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The continued fraction of `I_x(a, b)` (without its prefactor), modified Lentz; converges fast for
/// `x < (a + 1) / (a + b + 2)`.
fn beta_fraction(a: f64, b: f64, x: f64) -> f64 {
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - qab * x / qap);
    let mut h = d;
    // The number of terms grows like sqrt(max(a, b)); the bound is far above what EXPANSION_DF needs.
    for m in 1..100_000 {
        let (m, m2) = (m as f64, 2.0 * m as f64);
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 / guard(1.0 + aa * d);
        c = guard(1.0 + aa / c);
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 / guard(1.0 + aa * d);
        c = guard(1.0 + aa / c);
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < EPS {
            break;
        }
    }
    h
}

/// The regularised incomplete beta function `I_x(a, b)`, with `y = 1 - x` passed in so that a
/// caller who knows it exactly loses no digits near `x = 1`.
pub(super) fn incomplete_beta(a: f64, b: f64, x: f64, y: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if y <= 0.0 {
        return 1.0;
    }
    let front = (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * y.ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_fraction(b, a, y) / b
    }
}

/// `P(T > t)` for `t >= 0`.
fn upper_tail(t: f64, df: f64) -> f64 {
    let t2 = t * t;
    // x = df / (df + t^2) and 1 - x, each computed without cancellation.
    let (x, y) =
        if t2 > df { (1.0 / (1.0 + t2 / df), 1.0 / (1.0 + df / t2)) } else { (df / (df + t2), t2 / (df + t2)) };
    0.5 * incomplete_beta(0.5 * df, 0.5, x, y)
}

/// Student's t CDF with `df > 0` (real) degrees of freedom.
pub fn t_cdf(t: f64, df: f64) -> f64 {
    if t.is_nan() || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if t >= 0.0 { 1.0 - upper_tail(t, df) } else { upper_tail(-t, df) }
}

/// `P(Z > z)` of a standard normal, for `z >= 0`: `Q(1/2, z^2/2) / 2`.
fn normal_upper_tail(z: f64) -> f64 {
    let (a, x) = (0.5, 0.5 * z * z);
    if x == 0.0 {
        return 0.5;
    }
    let front = (-x + a * x.ln() - ln_gamma(a)).exp();
    let q = if x < a + 1.0 {
        // Series of the lower function P(a, x).
        let (mut ap, mut del, mut sum) = (a, 1.0 / a, 1.0 / a);
        for _ in 0..1000 {
            ap += 1.0;
            del *= x / ap;
            sum += del;
            if del.abs() < sum.abs() * EPS {
                break;
            }
        }
        1.0 - sum * front
    } else {
        // Continued fraction of Q(a, x), modified Lentz.
        let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
        let mut b = x + 1.0 - a;
        let mut c = 1.0 / TINY;
        let mut d = 1.0 / b;
        let mut h = d;
        for i in 1..1000 {
            let an = -(i as f64) * (i as f64 - a);
            b += 2.0;
            d = 1.0 / guard(an * d + b);
            c = guard(b + an / c);
            let step = d * c;
            h *= step;
            if (step - 1.0).abs() < EPS {
                break;
            }
        }
        front * h
    };
    0.5 * q
}

/// Finds `s` in `[lo, hi]` where the decreasing `f` crosses `target`, to the last bit.
fn bisect(mut lo: f64, mut hi: f64, target: f64, f: impl Fn(f64) -> f64) -> f64 {
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if f(mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// The standard normal quantile.
pub(super) fn normal_quantile(p: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) {
        return f64::NAN;
    }
    if p < 0.5 {
        return -normal_quantile(1.0 - p);
    }
    bisect(0.0, 40.0, 1.0 - p, normal_upper_tail)
}

/// The Cornish-Fisher expansion of the t quantile around the normal one (A&S 26.7.5).
pub(super) fn t_quantile_expansion(p: f64, df: f64) -> f64 {
    let z = normal_quantile(p);
    let z2 = z * z;
    let g1 = (z2 + 1.0) * z / 4.0;
    let g2 = ((5.0 * z2 + 16.0) * z2 + 3.0) * z / 96.0;
    let g3 = (((3.0 * z2 + 19.0) * z2 + 17.0) * z2 - 15.0) * z / 384.0;
    let g4 = ((((79.0 * z2 + 776.0) * z2 + 1482.0) * z2 - 1920.0) * z2 - 945.0) * z / 92160.0;
    z + (g1 + (g2 + (g3 + g4 / df) / df) / df) / df
}

/// The `p` quantile of Student's t with `df > 0` (real, `f64::INFINITY` for the normal) degrees of
/// freedom; NaN outside `0 < p < 1`. Below `EXPANSION_DF` (1e4), the root of the CDF by bisection on
/// `ln t` (to the last bit, about 1e-13 relative with the CDF's own error).
pub fn t_quantile(p: f64, df: f64) -> f64 {
    if !(p > 0.0 && p < 1.0) || df.is_nan() || df <= 0.0 {
        return f64::NAN;
    }
    if p == 0.5 {
        return 0.0;
    }
    if p < 0.5 {
        return -t_quantile(1.0 - p, df);
    }
    if df > EXPANSION_DF {
        return t_quantile_expansion(p, df);
    }
    // ln t from far below any quantile to the largest finite t.
    bisect(-745.0, 709.0, 1.0 - p, |s| upper_tail(s.exp(), df)).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_t_quantile_matches_the_tables() {
        for (df, t) in [
            (1.0, 12.706_204_736),
            (2.0, 4.302_652_730),
            (5.0, 2.570_581_836),
            (10.0, 2.228_138_852),
            (30.0, 2.042_272_456),
            (1e9, 1.959_963_985),
            (f64::INFINITY, 1.959_963_985),
        ] {
            let q = t_quantile(0.975, df);
            assert!((q - t).abs() < 1e-8, "t_0.975({df}) = {q}, the table says {t}");
            assert!((t_quantile(0.025, df) + q).abs() < 1e-15, "symmetric");
        }
        // Closed forms: df = 1 is Cauchy, df = 2 has t = (2p - 1) sqrt(2 / (4p(1 - p))).
        for p in [0.6, 0.9, 0.975, 0.999] {
            let cauchy = (std::f64::consts::PI * (p - 0.5)).tan();
            assert!((t_quantile(p, 1.0) / cauchy - 1.0).abs() < 1e-12, "df 1, p {p}");
            let two = (2.0 * p - 1.0) * (2.0 / (4.0 * p * (1.0 - p))).sqrt();
            assert!((t_quantile(p, 2.0) / two - 1.0).abs() < 1e-12, "df 2, p {p}");
        }
        assert!((normal_quantile(0.975) - 1.959_963_984_540_054).abs() < 1e-13);
        assert!((normal_quantile(0.5)).abs() < 1e-15 && normal_quantile(1.0).is_nan());
        assert!(t_quantile(0.975, 0.0).is_nan() && t_quantile(0.0, 3.0).is_nan());
        assert_eq!(t_quantile(0.5, 3.0), 0.0);
    }

    #[test]
    fn the_cdf_inverts_the_quantile_and_the_two_methods_meet() {
        for df in [0.5, 1.0, 2.5, 7.3, 100.0, 3000.0] {
            for p in [0.51, 0.8, 0.975, 0.9999] {
                let t = t_quantile(p, df);
                assert!((t_cdf(t, df) - p).abs() < 1e-13, "df {df}, p {p}: cdf {}", t_cdf(t, df));
                assert!((t_cdf(-t, df) - (1.0 - p)).abs() < 1e-13);
            }
        }
        // Where the quantile switches to the expansion, the bisection on the CDF agrees with it.
        for df in [EXPANSION_DF / 10.0, EXPANSION_DF] {
            let exact = bisect(-745.0, 709.0, 0.025, |s| upper_tail(s.exp(), df)).exp();
            assert!((exact - t_quantile_expansion(0.975, df)).abs() < 1e-11, "df {df}");
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-14);
        assert!((ln_gamma(10.0) - 362_880f64.ln()).abs() < 1e-12);
    }

    #[test]
    fn a_non_integer_df_matches_the_integrated_density() {
        // With t = sqrt(df) tan(u), the density is proportional to cos(u)^(df - 1) on (-pi/2, pi/2),
        // so the 97.5% point of t(2.5) is sqrt(2.5) tan(u*), u* the point where the integral of
        // cos^1.5 from 0 reaches 95% of its integral up to pi/2. Simpson's rule, bisection on u.
        let df = 2.5;
        let integral = |b: f64| {
            let n = 20_000;
            let h = b / n as f64;
            let f = |u: f64| u.cos().max(0.0).powf(df - 1.0);
            (0..=n)
                .map(|i| {
                    let w = if i == 0 || i == n {
                        1.0
                    } else if i % 2 == 1 {
                        4.0
                    } else {
                        2.0
                    };
                    w * f(i as f64 * h)
                })
                .sum::<f64>()
                * h
                / 3.0
        };
        let whole = integral(std::f64::consts::FRAC_PI_2);
        let (mut lo, mut hi) = (0.0, std::f64::consts::FRAC_PI_2);
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if integral(mid) < 0.95 * whole {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let by_integration = df.sqrt() * (0.5 * (lo + hi)).tan();
        let q = t_quantile(0.975, df);
        assert!((q - by_integration).abs() < 1e-7, "t_0.975(2.5) = {q}, by integration {by_integration}");
        // Between the neighbouring integers' table values.
        assert!(q < 4.302_652_73 && q > 3.182_446_305, "{q}");
    }
}
