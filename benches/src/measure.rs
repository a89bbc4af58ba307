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
    /// At least this many (at most `max_reps`), whatever the budget: 1 for one sample per cell, more
    /// where a single sample of a long cell would make a ratio one pair of samples.
    pub min_reps: usize,
    /// Stop repeating once the timed repetitions have used this many seconds (at least one always runs).
    pub cell_budget_s: f64,
    /// A warm-up at least this long counts as a sample.
    pub long_run_s: f64,
    /// In [`time_rounds`], a cell whose last run took less than this runs once more, untimed, before
    /// each timed run. The first run after a cell on another thread pool pays for that pool's wind-down
    /// (libtorch's OpenMP workers spin for milliseconds after a parallel region); a second-long run
    /// absorbs that cost in its noise. Measurements: `docs/bench/kernels-cpu-notes.md`.
    pub lead_in_below_s: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Self { max_reps: 7, min_reps: 1, cell_budget_s: 4.0, long_run_s: 2.0, lead_in_below_s: 1.0 }
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

    /// `(round, ms)` for every sample: the warm-up is round 0, so a cell whose warm-up was not
    /// counted starts at round 1. For [`time_rounds`] the cells that share a round ran one after the
    /// other.
    pub fn rounds(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        let first = usize::from(!self.warmup_counted);
        self.samples_ms.iter().enumerate().map(move |(i, &ms)| (first + i, ms))
    }
}

/// The median over the rounds both cells have of `a`'s time over `b`'s: the ratio of two cells
/// timed by [`time_rounds`], from pairs of samples taken within one round of each other. `None`
/// when they share no round.
pub fn paired_ratio(a: &Timing, b: &Timing) -> Option<f64> {
    let b_by_round: std::collections::BTreeMap<usize, f64> = b.rounds().collect();
    let ratios: Vec<f64> = a.rounds().filter_map(|(r, ms)| b_by_round.get(&r).map(|&bm| ms / bm)).collect();
    (!ratios.is_empty()).then(|| median(&ratios))
}

/// Runs `f` under `policy` and returns its samples: [`time_rounds`] with one cell, whose repetitions
/// run back to back (so no lead-in runs).
pub fn time(policy: &Policy, mut f: impl FnMut() -> Result<()>) -> Result<Timing> {
    let policy = Policy { lead_in_below_s: 0.0, ..*policy };
    time_rounds(&policy, &mut [&mut f]).pop().expect("one timing per cell")
}

/// Times several cells in rounds: a warm-up round, then rounds of one repetition of each cell in
/// order, so that a burst of load from elsewhere on a shared machine lands on the same round of
/// every cell instead of on every sample of one (measurements: `docs/bench/kernels-cpu-notes.md`).
///
/// The [`Policy`] applies to the cells together: a cell's warm-up counts as its round-0 sample
/// when it takes at least `long_run_s`; rounds stop after `max_reps` samples per cell, or when the
/// next round would take the timed total past `cell_budget_s` times the number of cells (every cell
/// gets at least `min_reps` samples; lead-in runs, see [`Policy::lead_in_below_s`], are not counted). A cell
/// that fails drops out with its error; the others go on.
pub fn time_rounds<F: FnMut() -> Result<()>>(policy: &Policy, cells: &mut [F]) -> Vec<Result<Timing>> {
    let once = |f: &mut F| -> Result<f64> {
        let start = Instant::now();
        f()?;
        Ok(start.elapsed().as_secs_f64() * 1e3)
    };
    let mut out: Vec<Result<Timing>> = Vec::with_capacity(cells.len());
    let mut last_ms = vec![0.0; cells.len()];
    for (f, last) in cells.iter_mut().zip(&mut last_ms) {
        out.push(once(f).map(|ms| {
            *last = ms;
            let warmup_counted = ms >= policy.long_run_s * 1e3;
            Timing { samples_ms: if warmup_counted { vec![ms] } else { Vec::new() }, warmup_counted }
        }));
    }
    let budget_ms = policy.cell_budget_s * 1e3 * cells.len() as f64;
    let max_reps = policy.max_reps.max(1);
    loop {
        let live: Vec<usize> =
            (0..cells.len()).filter(|&i| out[i].as_ref().is_ok_and(|t| t.samples_ms.len() < max_reps)).collect();
        if live.is_empty() {
            break;
        }
        let timed = |i: usize| out[i].as_ref().map_or(0.0, |t| t.samples_ms.iter().sum::<f64>());
        let spent_ms: f64 = (0..cells.len()).map(timed).sum();
        let next_ms: f64 = live.iter().map(|&i| last_ms[i]).sum();
        let min_reps = policy.min_reps.clamp(1, max_reps);
        let short = live.iter().any(|&i| out[i].as_ref().is_ok_and(|t| t.samples_ms.len() < min_reps));
        if !short && spent_ms + next_ms > budget_ms {
            break;
        }
        for i in live {
            let f = &mut cells[i];
            let lead_in = if last_ms[i] < policy.lead_in_below_s * 1e3 { f() } else { Ok(()) };
            match lead_in.and_then(|()| once(f)) {
                Ok(ms) => {
                    last_ms[i] = ms;
                    if let Ok(t) = &mut out[i] {
                        t.samples_ms.push(ms);
                    }
                }
                Err(e) => out[i] = Err(e),
            }
        }
    }
    out
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
        let policy = Policy { max_reps: 5, min_reps: 1, cell_budget_s: 0.0, long_run_s: 1e9, lead_in_below_s: 0.0 };
        let mut calls = 0;
        let t = time(&policy, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        // Zero budget: the warm-up plus exactly one timed repetition.
        assert_eq!((calls, t.samples_ms.len(), t.warmup_counted), (2, 1, false));

        let policy = Policy { max_reps: 3, min_reps: 1, cell_budget_s: 1e9, long_run_s: 0.0, lead_in_below_s: 0.0 };
        let mut calls = 0;
        let t = time(&policy, || {
            calls += 1;
            Ok(())
        })
        .unwrap();
        // The warm-up counts (every run is "long" at 0 s), then two more up to max_reps.
        assert_eq!((calls, t.samples_ms.len(), t.warmup_counted), (3, 3, true));
    }

    #[test]
    fn rounds_interleave_the_cells_and_a_failing_cell_drops_out() {
        use std::cell::RefCell;
        let log = RefCell::new(Vec::new());
        let calls = RefCell::new([0usize; 3]);
        let cell = |i: usize| {
            let (log, calls) = (&log, &calls);
            move || -> Result<()> {
                log.borrow_mut().push(i);
                calls.borrow_mut()[i] += 1;
                if i == 1 && calls.borrow()[1] == 3 {
                    anyhow::bail!("cell 1 broke");
                }
                Ok(())
            }
        };
        let (mut a, mut b, mut c) = (cell(0), cell(1), cell(2));
        let policy = Policy { max_reps: 4, min_reps: 1, cell_budget_s: 1e9, long_run_s: 1e9, lead_in_below_s: 0.0 };
        let out = time_rounds(&policy, &mut [&mut a, &mut b, &mut c]);
        // The warm-up round, round 1, cell 1 fails in round 2, cells 0 and 2 go on to rounds 3 and 4.
        assert_eq!(*log.borrow(), [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 2, 0, 2]);
        assert_eq!(out[0].as_ref().unwrap().samples_ms.len(), 4);
        assert!(out[1].as_ref().is_err_and(|e| e.to_string() == "cell 1 broke"));
        let t2 = out[2].as_ref().unwrap();
        assert_eq!((t2.samples_ms.len(), t2.warmup_counted), (4, false));
        assert_eq!(t2.rounds().map(|(r, _)| r).collect::<Vec<_>>(), [1, 2, 3, 4]);
    }

    #[test]
    fn rounds_share_the_budget_and_count_long_warmups() {
        let (mut a, mut b) = (|| -> Result<()> { Ok(()) }, || -> Result<()> { Ok(()) });
        // Zero budget: the warm-up round plus one timed round.
        let policy = Policy { max_reps: 5, min_reps: 1, cell_budget_s: 0.0, long_run_s: 1e9, lead_in_below_s: 0.0 };
        let out = time_rounds(&policy, &mut [&mut a as &mut dyn FnMut() -> Result<()>, &mut b]);
        assert!(out.iter().all(|t| t.as_ref().is_ok_and(|t| t.samples_ms.len() == 1 && !t.warmup_counted)));
        // Every warm-up is long at 0 s: it is round 0, and max_reps includes it.
        let policy = Policy { max_reps: 3, min_reps: 1, cell_budget_s: 1e9, long_run_s: 0.0, lead_in_below_s: 0.0 };
        let out = time_rounds(&policy, &mut [&mut a as &mut dyn FnMut() -> Result<()>, &mut b]);
        for t in &out {
            let t = t.as_ref().unwrap();
            assert!(t.warmup_counted);
            assert_eq!(t.rounds().map(|(r, _)| r).collect::<Vec<_>>(), [0, 1, 2]);
        }
        // A cell that fails its warm-up has no samples and does not hold up the other.
        let mut bad = || -> Result<()> { anyhow::bail!("no") };
        let policy = Policy { max_reps: 2, min_reps: 1, cell_budget_s: 1e9, long_run_s: 1e9, lead_in_below_s: 0.0 };
        let out = time_rounds(&policy, &mut [&mut bad as &mut dyn FnMut() -> Result<()>, &mut a]);
        assert!(out[0].is_err());
        assert_eq!(out[1].as_ref().unwrap().samples_ms.len(), 2);
    }

    #[test]
    fn min_reps_overrides_the_budget() {
        let (mut a, mut b) = (|| -> Result<()> { Ok(()) }, || -> Result<()> { Ok(()) });
        let policy = Policy { max_reps: 5, min_reps: 3, cell_budget_s: 0.0, long_run_s: 0.0, lead_in_below_s: 0.0 };
        let out = time_rounds(&policy, &mut [&mut a as &mut dyn FnMut() -> Result<()>, &mut b]);
        // Round 0 (the counted warm-up), then rounds 1 and 2 although the budget is spent.
        assert!(out.iter().all(|t| t.as_ref().is_ok_and(|t| t.samples_ms.len() == 3)));
        let t = time(&policy, || Ok(())).unwrap();
        assert_eq!(t.samples_ms.len(), 3);
        // min_reps above max_reps is capped.
        let policy = Policy { max_reps: 2, min_reps: 9, ..policy };
        assert_eq!(time(&policy, || Ok(())).unwrap().samples_ms.len(), 2);
    }

    #[test]
    fn short_cells_get_an_untimed_lead_in_run_before_each_timed_one() {
        use std::cell::RefCell;
        let log = RefCell::new(Vec::new());
        let cell = |i: usize| {
            let log = &log;
            move || -> Result<()> {
                log.borrow_mut().push(i);
                Ok(())
            }
        };
        let (mut a, mut b) = (cell(0), cell(1));
        let policy = Policy { max_reps: 2, min_reps: 1, cell_budget_s: 1e9, long_run_s: 1e9, lead_in_below_s: 1e9 };
        let out = time_rounds(&policy, &mut [&mut a as &mut dyn FnMut() -> Result<()>, &mut b]);
        assert_eq!(*log.borrow(), [0, 1, 0, 0, 1, 1, 0, 0, 1, 1]);
        assert!(out.iter().all(|t| t.as_ref().is_ok_and(|t| t.samples_ms.len() == 2)));
    }

    #[test]
    fn paired_ratio_pairs_samples_by_round() {
        let a = Timing { samples_ms: vec![2.0, 4.0, 6.0], warmup_counted: true }; // rounds 0, 1, 2
        let b = Timing { samples_ms: vec![1.0, 2.0, 5.0], warmup_counted: false }; // rounds 1, 2, 3
        // Rounds 1 and 2: 4 / 1 and 6 / 2; the medians' ratio (4 / 2) would say 2.
        assert_eq!(paired_ratio(&a, &b), Some(3.5));
        assert_eq!(paired_ratio(&b, &a), Some((0.25 + 2.0 / 6.0) / 2.0));
        let c = Timing { samples_ms: vec![1.0], warmup_counted: true }; // round 0 only
        assert_eq!(paired_ratio(&b, &c), None);
    }
}
