//! Scalar special functions in f64 that the activations, the statistics and the tests share:
//! softplus and the sigmoid without overflow, `erf`, `erfc` and the normal CDF to a few ulps.

/// `1 / sqrt(pi)`.
const FRAC_1_SQRT_PI: f64 = 0.564_189_583_547_756_3;

/// Numerically stable softplus `ln(1 + e^x) = max(x, 0) + log1p(exp(-|x|))`.
pub fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// Overflow-free logistic sigmoid `1 / (1 + e^-x)` (never evaluates `exp` of a positive number).
pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// The error function, accurate to a few ulps (series `2/sqrt(pi) e^{-x^2} sum 2^n x^{2n+1}/(2n+1)!!`
/// for `|x| < 2`, continued fraction of `erfc` beyond).
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    let a = x.abs();
    let r = if a < 2.0 { erf_series(a) } else { 1.0 - erfc_cf(a) };
    if x < 0.0 { -r } else { r }
}

/// The complementary error function `1 - erf(x)`, accurate in relative terms for large `x`.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x < 2.0 { 1.0 - erf(x) } else { erfc_cf(x) }
}

/// The standard normal CDF `Phi(x) = erfc(-x / sqrt 2) / 2`.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

/// `erf(x)` for `0 <= x < 2` by the all-positive series (no cancellation).
fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= 2.0 * x2 / (2 * n + 1) as f64;
        sum += term;
        if term <= sum * 1e-17 {
            break;
        }
    }
    2.0 * FRAC_1_SQRT_PI * (-x2).exp() * sum
}

/// `erfc(x)` for `x >= 2` by the continued fraction
/// `e^{-x^2}/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`, evaluated backwards.
fn erfc_cf(x: f64) -> f64 {
    if x > 27.3 {
        return 0.0; // erfc(27.3) < 1e-325: below the smallest subnormal
    }
    let mut t = x;
    for n in (1..=120).rev() {
        t = x + (n as f64 * 0.5) / t;
    }
    FRAC_1_SQRT_PI * (-x * x).exp() / t
}
