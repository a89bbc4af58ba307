//! Symbolic regression of a pairwise force law over a small grammar:
//!
//! ```text
//! law  := term | term + term
//! term := c · m1^a · m2^b · r^k        (a, b, k on a grid of halves in [-3, 3]; c fitted)
//! ```
//!
//! Products of terms are terms (their exponents add), so the grammar covers sums and products of
//! power laws. Every single term on the grid and every sum of two terms (the second term ranging over
//! the whole grid, the first over the best single terms) is fitted by weighted least squares on the
//! relative error `(F_hat - F) / F` (linear in the coefficients), and the candidates are ranked by
//! BIC: `n ln(max(RSS / n, floor)) + p ln n`, `p` = 4 parameters per term. The floor (relative MSE
//! 1e-12) makes fits that are exact to rounding tie, so the simpler law wins them.
//!
//! For the winning law's single-term form, [`power_law`] also fits the exponents continuously (least
//! squares on logarithms) and returns their standard errors: the "recovered exponents with errors".

/// One observed force between two bodies.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Mass of the body the force acts on.
    pub m1: f64,
    /// Mass of the other body.
    pub m2: f64,
    /// Their distance.
    pub r: f64,
    /// The magnitude of the force (positive).
    pub f: f64,
}

/// `coef · m1^a · m2^b · r^k`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Term {
    /// The fitted coefficient.
    pub coef: f64,
    /// Exponent of `m1`.
    pub a: f64,
    /// Exponent of `m2`.
    pub b: f64,
    /// Exponent of `r`.
    pub k: f64,
}

impl Term {
    fn basis(&self, s: &Sample) -> f64 {
        s.m1.powf(self.a) * s.m2.powf(self.b) * s.r.powf(self.k)
    }

    /// The term's value at `s`.
    pub fn eval(&self, s: &Sample) -> f64 {
        self.coef * self.basis(s)
    }

    /// Same exponents (to 1e-9).
    pub fn same_shape(&self, a: f64, b: f64, k: f64) -> bool {
        (self.a - a).abs() < 1e-9 && (self.b - b).abs() < 1e-9 && (self.k - k).abs() < 1e-9
    }
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.4}", self.coef)?;
        for (name, e) in [("m1", self.a), ("m2", self.b), ("r", self.k)] {
            if e != 0.0 {
                write!(f, " · {name}^{e}")?;
            }
        }
        Ok(())
    }
}

/// A candidate law and how well it fits.
#[derive(Clone, Debug, PartialEq)]
pub struct Law {
    /// Its terms (one or two).
    pub terms: Vec<Term>,
    /// Root mean squared relative error.
    pub rel_rmse: f64,
    /// Bayesian information criterion (lower is better).
    pub bic: f64,
}

impl Law {
    /// The law's value at `s`.
    pub fn eval(&self, s: &Sample) -> f64 {
        self.terms.iter().map(|t| t.eval(s)).sum()
    }
}

impl std::fmt::Display for Law {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "F = ")?;
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                write!(f, " + ")?;
            }
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

/// The exponent grid: halves from -3 to 3.
pub fn exponent_grid() -> Vec<f64> {
    (-6..=6).map(|i| f64::from(i) / 2.0).collect()
}

/// Relative MSE below which fits count as exact (see the module docs).
const MSE_FLOOR: f64 = 1e-12;
/// How many of the best single terms start a two-term search.
const SUM_SEEDS: usize = 24;

fn bic(n: usize, rss: f64, terms: usize) -> f64 {
    let n = n as f64;
    n * (rss / n).max(MSE_FLOOR).ln() + 4.0 * terms as f64 * n.ln()
}

/// Weighted least squares of `F ≈ Σ c_t basis_t` on relative errors, for one or two bases (`x[t][i]`
/// is basis t at sample i divided by F_i); returns the coefficients and the residual sum of squares,
/// or `None` when the system is singular.
fn solve(x: &[&[f64]]) -> Option<(Vec<f64>, f64)> {
    let n = x[0].len();
    match x {
        [u] => {
            let uu: f64 = u.iter().map(|v| v * v).sum();
            let u1: f64 = u.iter().sum();
            if uu <= 0.0 || !uu.is_finite() {
                return None;
            }
            let c = u1 / uu;
            let rss = u.iter().map(|v| (c * v - 1.0).powi(2)).sum();
            Some((vec![c], rss))
        }
        [u, w] => {
            let (mut uu, mut uw, mut ww, mut u1, mut w1) = (0.0, 0.0, 0.0, 0.0, 0.0);
            for i in 0..n {
                uu += u[i] * u[i];
                uw += u[i] * w[i];
                ww += w[i] * w[i];
                u1 += u[i];
                w1 += w[i];
            }
            let det = uu * ww - uw * uw;
            if !(det.is_finite() && det > 1e-12 * uu * ww) {
                return None;
            }
            let c = [(u1 * ww - w1 * uw) / det, (w1 * uu - u1 * uw) / det];
            let rss = (0..n).map(|i| (c[0] * u[i] + c[1] * w[i] - 1.0).powi(2)).sum();
            Some((c.to_vec(), rss))
        }
        _ => None,
    }
}

/// Every law of the grammar fitted to `samples`, best (lowest BIC) first.
///
/// # Panics
/// When `samples` is empty or a sample is not positive and finite.
pub fn search(samples: &[Sample]) -> Vec<Law> {
    assert!(!samples.is_empty(), "no samples");
    for s in samples {
        assert!(
            [s.m1, s.m2, s.r, s.f].iter().all(|v| v.is_finite() && *v > 0.0),
            "samples must be positive and finite: {s:?}"
        );
    }
    let n = samples.len();
    let grid = exponent_grid();
    let mut shapes = Vec::new();
    for &a in &grid {
        for &b in &grid {
            for &k in &grid {
                shapes.push(Term { coef: 1.0, a, b, k });
            }
        }
    }
    // Each basis divided by F (relative-error least squares).
    let columns: Vec<Vec<f64>> = shapes.iter().map(|t| samples.iter().map(|s| t.basis(s) / s.f).collect()).collect();
    // Single terms, with the grid index of their shape (the seeds of the two-term search).
    let mut singles: Vec<(usize, Law)> = Vec::new();
    for (i, (t, col)) in shapes.iter().zip(&columns).enumerate() {
        if let Some((c, rss)) = solve(&[col]) {
            let law =
                Law { terms: vec![Term { coef: c[0], ..*t }], rel_rmse: (rss / n as f64).sqrt(), bic: bic(n, rss, 1) };
            singles.push((i, law));
        }
    }
    singles.sort_by(|x, y| x.1.bic.total_cmp(&y.1.bic));
    let seeds: Vec<usize> = singles.iter().take(SUM_SEEDS).map(|(i, _)| *i).collect();
    let mut laws: Vec<Law> = singles.into_iter().map(|(_, l)| l).collect();
    for &i in &seeds {
        for j in 0..shapes.len() {
            if j == i {
                continue;
            }
            if let Some((c, rss)) = solve(&[&columns[i], &columns[j]]) {
                laws.push(Law {
                    terms: vec![Term { coef: c[0], ..shapes[i] }, Term { coef: c[1], ..shapes[j] }],
                    rel_rmse: (rss / n as f64).sqrt(),
                    bic: bic(n, rss, 2),
                });
            }
        }
    }
    laws.sort_by(|x, y| x.bic.total_cmp(&y.bic));
    laws
}

/// A continuous single power law `F = c · m1^a · m2^b · r^k`, by least squares on logarithms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PowerLaw {
    /// `[ln c, a, b, k]`.
    pub params: [f64; 4],
    /// Their standard errors.
    pub stderr: [f64; 4],
    /// Root mean squared residual of `ln F`.
    pub log_rmse: f64,
}

/// Fits [`PowerLaw`] to `samples` (needs at least 5 samples whose `ln m1, ln m2, ln r` are not
/// collinear); `None` otherwise.
pub fn power_law(samples: &[Sample]) -> Option<PowerLaw> {
    let n = samples.len();
    if n < 5 {
        return None;
    }
    // Normal equations of y = X beta with X rows [1, ln m1, ln m2, ln r].
    let mut xtx = [[0.0f64; 4]; 4];
    let mut xty = [0.0f64; 4];
    let rows: Vec<([f64; 4], f64)> =
        samples.iter().map(|s| ([1.0, s.m1.ln(), s.m2.ln(), s.r.ln()], s.f.ln())).collect();
    for (x, y) in &rows {
        for i in 0..4 {
            xty[i] += x[i] * y;
            for j in 0..4 {
                xtx[i][j] += x[i] * x[j];
            }
        }
    }
    let inv = invert4(xtx)?;
    let mut beta = [0.0; 4];
    for i in 0..4 {
        beta[i] = (0..4).map(|j| inv[i][j] * xty[j]).sum();
    }
    let rss: f64 = rows.iter().map(|(x, y)| (y - (0..4).map(|i| x[i] * beta[i]).sum::<f64>()).powi(2)).sum();
    let sigma2 = rss / (n - 4) as f64;
    let stderr = [0, 1, 2, 3].map(|i| (sigma2 * inv[i][i]).max(0.0).sqrt());
    Some(PowerLaw { params: beta, stderr, log_rmse: (rss / n as f64).sqrt() })
}

/// The normal equations of the log-space power-law fit over a set of samples: `X^T X`, `X^T y` with
/// rows `[1, ln m1, ln m2, ln r]` and `y = ln F`, and the sample count. Sums of these are the
/// equations of the union, so a bootstrap over orbits resamples per-orbit sums instead of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Normal {
    /// `X^T X`.
    pub xtx: [[f64; 4]; 4],
    /// `X^T y`.
    pub xty: [f64; 4],
    /// Samples summed.
    pub n: usize,
}

impl Normal {
    /// The equations of `samples` (each with a positive force).
    pub fn of(samples: &[Sample]) -> Self {
        let mut out = Self::default();
        for s in samples {
            let (x, y) = ([1.0, s.m1.ln(), s.m2.ln(), s.r.ln()], s.f.ln());
            for i in 0..4 {
                out.xty[i] += x[i] * y;
                for j in 0..4 {
                    out.xtx[i][j] += x[i] * x[j];
                }
            }
        }
        out.n = samples.len();
        out
    }

    /// Adds `other`'s equations (`weight` times: a bootstrap draws an orbit several times).
    pub fn add(&mut self, other: &Normal, weight: f64) {
        for i in 0..4 {
            self.xty[i] += weight * other.xty[i];
            for j in 0..4 {
                self.xtx[i][j] += weight * other.xtx[i][j];
            }
        }
        self.n += (weight as usize) * other.n;
    }

    /// `[ln c, a, b, k]`, or `None` with fewer than 5 samples or collinear logarithms.
    pub fn solve(&self) -> Option<[f64; 4]> {
        if self.n < 5 {
            return None;
        }
        let inv = invert4(self.xtx)?;
        Some([0, 1, 2, 3].map(|i| (0..4).map(|j| inv[i][j] * self.xty[j]).sum()))
    }
}

/// Gauss-Jordan inverse with partial pivoting; `None` when (near) singular.
fn invert4(m: [[f64; 4]; 4]) -> Option<[[f64; 4]; 4]> {
    let mut a = [[0.0; 8]; 4];
    for i in 0..4 {
        a[i][..4].copy_from_slice(&m[i]);
        a[i][4 + i] = 1.0;
    }
    let scale = m.iter().flatten().fold(0.0f64, |s, v| s.max(v.abs()));
    for col in 0..4 {
        let pivot = (col..4).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
        if a[pivot][col].abs() <= 1e-12 * scale {
            return None;
        }
        a.swap(col, pivot);
        let p = a[col][col];
        for v in &mut a[col] {
            *v /= p;
        }
        for row in 0..4 {
            if row != col {
                let f = a[row][col];
                let pivot_row = a[col];
                for (v, pv) in a[row].iter_mut().zip(pivot_row) {
                    *v -= f * pv;
                }
            }
        }
    }
    let mut inv = [[0.0; 4]; 4];
    for i in 0..4 {
        inv[i].copy_from_slice(&a[i][4..]);
    }
    Some(inv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::newton::sim;
    use rand::{Rng, SeedableRng};

    /// Pair forces from simulated two-body orbits with the exact accelerations: `F = m1 |a1|`.
    fn orbit_samples(g: f64, systems: usize, seed: u64) -> Vec<Sample> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut out = Vec::new();
        for _ in 0..systems {
            let mut sys = sim::random_two_body(&mut rng, g);
            let traj = sim::simulate(&mut sys, 0.05, 20, 10);
            for (pos, acc) in traj.pos.iter().zip(&traj.acc) {
                let a1 = (acc[0][0].powi(2) + acc[0][1].powi(2)).sqrt();
                let (m1, m2) = (traj.masses[0], traj.masses[1]);
                out.push(Sample { m1, m2, r: sim::distance(pos[0], pos[1]), f: m1 * a1 });
                // The same pair seen from the other body.
                let a2 = (acc[1][0].powi(2) + acc[1][1].powi(2)).sqrt();
                out.push(Sample { m1: m2, m2: m1, r: sim::distance(pos[0], pos[1]), f: m2 * a2 });
            }
        }
        out
    }

    #[test]
    fn newtons_law_is_recovered_from_exact_orbit_forces() {
        let g = 0.7;
        let samples = orbit_samples(g, 12, 1);
        let laws = search(&samples);
        let best = &laws[0];
        assert_eq!(best.terms.len(), 1, "{best}");
        let t = best.terms[0];
        assert!(t.same_shape(1.0, 1.0, -2.0), "recovered {best}");
        assert!((t.coef - g).abs() < 1e-9, "G = {} vs {g}", t.coef);
        assert!(best.rel_rmse < 1e-9);
        let fit = power_law(&samples).unwrap();
        for (got, want) in fit.params.iter().zip([g.ln(), 1.0, 1.0, -2.0]) {
            assert!((got - want).abs() < 1e-9, "{:?}", fit.params);
        }
    }

    #[test]
    fn a_planted_sum_of_two_terms_is_recovered() {
        // F = 2 m1 m2 / r^2 + 0.5 m1 m2^2 / r^3 on random (m1, m2, r).
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let samples: Vec<Sample> = (0..300)
            .map(|_| {
                let (m1, m2, r) =
                    (rng.random_range(0.1..10.0), rng.random_range(0.1..10.0), rng.random_range(0.3..3.0f64));
                Sample { m1, m2, r, f: 2.0 * m1 * m2 / (r * r) + 0.5 * m1 * m2 * m2 / r.powi(3) }
            })
            .collect();
        let best = &search(&samples)[0];
        assert_eq!(best.terms.len(), 2, "{best}");
        let mut terms = best.terms.clone();
        terms.sort_by(|x, y| y.k.total_cmp(&x.k));
        assert!(terms[0].same_shape(1.0, 1.0, -2.0) && (terms[0].coef - 2.0).abs() < 1e-8, "{best}");
        assert!(terms[1].same_shape(1.0, 2.0, -3.0) && (terms[1].coef - 0.5).abs() < 1e-8, "{best}");
    }

    #[test]
    fn noisy_forces_give_the_law_and_honest_error_bars() {
        // 1% multiplicative noise on inverse-square forces.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut samples = orbit_samples(1.0, 10, 2);
        for s in &mut samples {
            s.f *= 1.0 + 0.01 * (rng.random::<f64>() * 2.0 - 1.0);
        }
        let best = &search(&samples)[0];
        assert!(best.terms.len() == 1 && best.terms[0].same_shape(1.0, 1.0, -2.0), "{best}");
        let fit = power_law(&samples).unwrap();
        for (i, want) in [(1, 1.0), (2, 1.0), (3, -2.0)] {
            let (got, se) = (fit.params[i], fit.stderr[i]);
            assert!(se > 0.0 && se < 0.05, "stderr {se}");
            assert!((got - want).abs() < 5.0 * se + 1e-3, "exponent {i}: {got} ± {se}, want {want}");
        }
    }

    #[test]
    fn degenerate_inputs_are_refused() {
        let s = Sample { m1: 1.0, m2: 1.0, r: 1.0, f: 1.0 };
        // Every sample identical: the exponents are not identifiable.
        assert!(power_law(&[s; 10]).is_none());
        assert!(power_law(&[s; 3]).is_none());
        assert!(std::panic::catch_unwind(|| search(&[Sample { f: -1.0, ..s }])).is_err());
    }
}
