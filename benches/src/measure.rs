//! Timing policy (warm-up, then the median of a few repetitions within a per-cell time budget) and the
//! small statistics the report needs.

use std::time::Instant;

use anyhow::Result;

/// How many times one benchmark cell runs.
///
/// The first run is a warm-up (page faults, thread start-up, libtorch's first-call dispatch). When it
/// alone takes at least `long_run_s`, one-time costs are negligible against it and it counts as a
/// sample too: at T = 16K a single fused forward+backward takes seconds, and a second warm-up would
/// double the whole run for no information.
#[derive(Clone, Copy, Debug)]
pub struct Policy {
    /// At most this many timed repetitions.
    pub max_reps: usize,
    /// Stop repeating once the timed repetitions have used this many seconds (at least one always runs).
    pub cell_budget_s: f64,
    /// A warm-up at least this long counts as a sample.
    pub long_run_s: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Self { max_reps: 7, cell_budget_s: 4.0, long_run_s: 2.0 }
    }
}

/// The samples of one cell, in milliseconds.
#[derive(Clone, Debug)]
pub struct Timing {
    /// Every timed repetition, in run order.
    pub samples_ms: Vec<f64>,
    /// Whether the warm-up run was counted as a sample (see [`Policy`]).
    pub warmup_counted: bool,
}

impl Timing {
    /// The median sample.
    pub fn median_ms(&self) -> f64 {
        median(&self.samples_ms)
    }
}

/// Runs `f` under `policy` and returns its samples.
pub fn time(policy: &Policy, mut f: impl FnMut() -> Result<()>) -> Result<Timing> {
    let once = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let start = Instant::now();
        f()?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    let warmup_ms = once(&mut f)?;
    let warmup_counted = warmup_ms >= policy.long_run_s * 1e3;
    let mut samples_ms = if warmup_counted { vec![warmup_ms] } else { Vec::new() };
    while samples_ms.len() < policy.max_reps.max(1) {
        let spent_s: f64 = samples_ms.iter().sum::<f64>() / 1e3;
        let next_s = samples_ms.last().copied().unwrap_or(warmup_ms) / 1e3;
        if !samples_ms.is_empty() && spent_s + next_s > policy.cell_budget_s {
            break;
        }
        samples_ms.push(once(&mut f)?);
    }
    Ok(Timing { samples_ms, warmup_counted })
}

/// The median (the mean of the two middle values for an even count); NaN when empty.
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut s = xs.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 }
}

/// The least-squares slope of `ln y` against `ln x`: the exponent `k` in `y ≈ c·x^k`. `None` with fewer
/// than two distinct `x`, or any non-positive value.
pub fn loglog_slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.iter().any(|&(x, y)| x <= 0.0 || y <= 0.0) {
        return None;
    }
    let n = points.len() as f64;
    let (lx, ly): (Vec<f64>, Vec<f64>) = points.iter().map(|&(x, y)| (x.ln(), y.ln())).unzip();
    let (mx, my) = (lx.iter().sum::<f64>() / n, ly.iter().sum::<f64>() / n);
    let sxx: f64 = lx.iter().map(|x| (x - mx).powi(2)).sum();
    if points.len() < 2 || sxx == 0.0 {
        return None;
    }
    let sxy: f64 = lx.iter().zip(&ly).map(|(x, y)| (x - mx) * (y - my)).sum();
    Some(sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn loglog_slope_recovers_a_power_law() {
        let pts: Vec<(f64, f64)> =
            [1024.0, 2048.0, 4096.0, 16384.0].iter().map(|&t: &f64| (t, 3e-6 * t.powf(1.93))).collect();
        let k = loglog_slope(&pts).unwrap();
        assert!((k - 1.93).abs() < 1e-12, "slope {k}");
        assert_eq!(loglog_slope(&[(1.0, 1.0)]), None);
        assert_eq!(loglog_slope(&[(1.0, 1.0), (2.0, 0.0)]), None);
    }

    #[test]
    fn time_respects_the_budget_and_counts_long_warmups() {
        let policy = Policy { max_reps: 5, cell_budget_s: 0.0, long_run_s: 1e9 };
        let mut calls = 0;
        let t = time(&policy, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        // Zero budget: the warm-up plus exactly one timed repetition.
        assert_eq!((calls, t.samples_ms.len(), t.warmup_counted), (2, 1, false));

        let policy = Policy { max_reps: 3, cell_budget_s: 1e9, long_run_s: 0.0 };
        let mut calls = 0;
        let t = time(&policy, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        // The warm-up counts (every run is "long" at 0 s), then two more up to max_reps.
        assert_eq!((calls, t.samples_ms.len(), t.warmup_counted), (3, 3, true));
    }
}
