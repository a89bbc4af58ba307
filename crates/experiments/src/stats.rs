//! The statistics every verdict reads, written once: a bootstrap over seeds and validation spans for
//! linear contrasts of losses, the three-way verdict rule, and an exact permutation test for
//! orderings. Plain Rust (no tensors), so it is tested on planted data.
//!
//! # The design the interval assumes
//!
//! A quantity is a contrast `q = sum_k c_k L_k`, each `L_k` the mean loss of one row (a trained variant,
//! a post-hoc power, a RoPE treatment, a length) over its seeds and the validation spans. Every run is
//! scored on the same spans, so seeds and spans are *crossed* (span `w` is the same text for every seed
//! and every row), not nested, and the two sources of noise are drawn separately in each replicate:
//!
//! - **Spans**, resampled with replacement: one draw of span indices is shared by every term and every
//!   seed, which keeps the pairing on identical target tokens.
//! - **Seeds**, from a t distribution. Resampling 3 seeds with replacement gives intervals that are too
//!   narrow (the spread of a 3-point resample is 2/3 of the seeds' variance, with normal tails where a
//!   3-seed mean has t tails): in this module's planted-data test a null difference came out
//!   "reproduced" in 1 trial of 20 that way. So the terms whose rows have the same number of seeds `n`
//!   (seed `k` of two variants shares its data order and initial weights: they are paired) contribute
//!   the per-seed contrast's standard error times a `t(n - 1)` draw.
//!
//! A row with a single seed carries no information about seed-to-seed noise. When the rows that have
//! several seeds measure it ([`pooled_seed_sd`]), each single-seed term gets that standard deviation
//! times a `t` draw with the pooled degrees of freedom, so its interval is not narrowed to span noise.

use attn_core::fixtures::Rng;

/// Bootstrap replicates per interval.
pub const REPLICATES: usize = 4000;

/// One term of a contrast: a coefficient and the row's per-span losses, one vector per seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Term {
    /// Coefficient `c_k`.
    pub coef: f64,
    /// `values[seed][span]`: the row's mean loss over that span, for that seed. Every seed has the
    /// same spans, in the same order, as every other term.
    pub values: Vec<Vec<f64>>,
}

/// A point estimate with a two-sided 95% interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// The contrast on all the data.
    pub estimate: f64,
    /// 2.5th percentile of the bootstrap replicates.
    pub lo: f64,
    /// 97.5th percentile.
    pub hi: f64,
}

impl Interval {
    /// `+0.012 [+0.004, +0.020]`.
    pub fn show(&self) -> String {
        format!("{:+.3} [{:+.3}, {:+.3}]", self.estimate, self.lo, self.hi)
    }
}

/// Why a contrast cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatsError {
    /// No terms, a term without seeds, or terms with different span counts.
    #[error("a contrast needs terms with at least one seed each and the same spans: {0}")]
    Shape(String),
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

fn check(terms: &[Term]) -> Result<usize, StatsError> {
    let spans = terms.first().and_then(|t| t.values.first()).map(Vec::len).unwrap_or(0);
    if spans == 0 {
        return Err(StatsError::Shape("no terms or no spans".into()));
    }
    for (i, t) in terms.iter().enumerate() {
        if t.values.is_empty() || t.values.iter().any(|s| s.len() != spans) {
            return Err(StatsError::Shape(format!(
                "term {i} has {} seeds with span counts {:?}, expected {spans} each",
                t.values.len(),
                t.values.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
    }
    Ok(spans)
}

/// The contrast on all the data: `sum_k c_k mean_{seeds, spans} values`.
pub fn estimate(terms: &[Term]) -> Result<f64, StatsError> {
    check(terms)?;
    Ok(terms.iter().map(|t| t.coef * mean(&t.values.iter().map(|s| mean(s)).collect::<Vec<_>>())).sum())
}

/// The seed-to-seed standard deviation of one row's mean loss and its degrees of freedom.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SeedNoise {
    /// Standard deviation, nats.
    pub sd: f64,
    /// Degrees of freedom of the estimate.
    pub df: usize,
}

/// A draw from Student's t with `df` degrees of freedom (normal / sqrt(chi-square / df)).
pub(crate) fn student_t(rng: &mut Rng, df: usize) -> f64 {
    let z = rng.normal();
    let chi2: f64 = (0..df).map(|_| rng.normal().powi(2)).sum();
    z / (chi2 / df as f64).sqrt()
}

/// The contrast with a 95% percentile interval from [`REPLICATES`] replicates that resample the spans
/// and draw the seed level from t distributions (see the module docs), reproducible from
/// `rng_seed`. `single_seed`: the seed noise added to every single-seed term (`None`: span noise only).
pub fn bootstrap(terms: &[Term], single_seed: Option<SeedNoise>, rng_seed: u64) -> Result<Interval, StatsError> {
    let spans = check(terms)?;
    let est = estimate(terms)?;
    // Span level: the seed-averaged contrast of every span.
    let per_span: Vec<f64> = (0..spans)
        .map(|w| {
            terms.iter().map(|t| t.coef * t.values.iter().map(|s| s[w]).sum::<f64>() / t.values.len() as f64).sum()
        })
        .collect();
    // Seed level: (standard error, degrees of freedom) per group of terms with the same seed count.
    let mut groups: Vec<(f64, usize)> = Vec::new();
    let mut counts: Vec<usize> = terms.iter().map(|t| t.values.len()).collect();
    counts.sort_unstable();
    counts.dedup();
    for n in counts {
        let group: Vec<&Term> = terms.iter().filter(|t| t.values.len() == n).collect();
        if n >= 2 {
            let per_seed: Vec<f64> = (0..n).map(|s| group.iter().map(|t| t.coef * mean(&t.values[s])).sum()).collect();
            let m = mean(&per_seed);
            let sd = (per_seed.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
            groups.push((sd / (n as f64).sqrt(), n - 1));
        } else if let Some(noise) = single_seed {
            // Independent single-seed rows: their seed noises add in variance.
            let c2: f64 = group.iter().map(|t| t.coef * t.coef).sum();
            groups.push((noise.sd * c2.sqrt(), noise.df.max(1)));
        }
    }
    let mut rng = Rng::new(rng_seed);
    let mut reps = Vec::with_capacity(REPLICATES);
    for _ in 0..REPLICATES {
        let mut sum = 0.0;
        for _ in 0..spans {
            sum += per_span[(rng.next_u64() % spans as u64) as usize];
        }
        let mut q = sum / spans as f64;
        for &(se, df) in &groups {
            q += se * student_t(&mut rng, df);
        }
        reps.push(q);
    }
    reps.sort_by(f64::total_cmp);
    let at = |p: f64| reps[((p * (REPLICATES - 1) as f64).round() as usize).min(REPLICATES - 1)];
    Ok(Interval { estimate: est, lo: at(0.025), hi: at(0.975) })
}

/// The pooled seed-to-seed standard deviation of a row's mean loss, from rows with several seeds:
/// each row gives its seeds' mean losses (over the spans); the within-row variances are pooled with
/// their degrees of freedom. `None` when no row has two seeds.
pub fn pooled_seed_sd(rows: &[Vec<f64>]) -> Option<SeedNoise> {
    let (mut ss, mut df) = (0.0, 0usize);
    for r in rows.iter().filter(|r| r.len() >= 2) {
        let m = mean(r);
        ss += r.iter().map(|x| (x - m).powi(2)).sum::<f64>();
        df += r.len() - 1;
    }
    (df > 0).then(|| SeedNoise { sd: (ss / df as f64).sqrt(), df })
}

/// A verdict on a claim about the paper.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The data support the claim.
    Reproduced,
    /// The data go against it.
    Contradicted,
    /// The data cannot decide.
    Inconclusive,
}

impl Verdict {
    /// `reproduced`, `contradicted`, `inconclusive`.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Reproduced => "reproduced",
            Verdict::Contradicted => "contradicted",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// What a claim says of its quantity `q`, with the effect size fixed before the runs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// An effect: `q > 0`, and large enough to matter: at least `delta`.
    /// Reproduced when the interval lies above 0 and the estimate reaches `delta`; contradicted when
    /// the interval lies below 0 (the effect goes the other way); inconclusive otherwise (the interval
    /// holds 0, or the effect is real but smaller than `delta`).
    Effect {
        /// The least effect that counts.
        delta: f64,
    },
    /// A bound: `q < delta` (e.g. "stays flat": rises by less than `delta`).
    /// Reproduced when the interval lies below `delta`; contradicted when it lies above; inconclusive
    /// when it holds `delta`.
    AtMost {
        /// The bound.
        delta: f64,
    },
}

impl Rule {
    /// The verdict on an interval, and why, in words.
    pub fn judge(&self, i: &Interval) -> (Verdict, String) {
        match *self {
            Rule::Effect { delta } => {
                if i.lo > 0.0 && i.estimate >= delta {
                    (Verdict::Reproduced, format!("the interval lies above 0 and the estimate reaches {delta}"))
                } else if i.hi < 0.0 {
                    (Verdict::Contradicted, "the interval lies below 0: the effect goes the other way".into())
                } else if i.lo > 0.0 {
                    (
                        Verdict::Inconclusive,
                        format!("an effect in the claimed direction, smaller than the {delta} fixed in advance"),
                    )
                } else {
                    (Verdict::Inconclusive, "the interval holds 0".into())
                }
            }
            Rule::AtMost { delta } => {
                if i.hi < delta {
                    (Verdict::Reproduced, format!("the interval lies below {delta}"))
                } else if i.lo > delta {
                    (Verdict::Contradicted, format!("the interval lies above {delta}"))
                } else {
                    (Verdict::Inconclusive, format!("the interval holds {delta}"))
                }
            }
        }
    }

    /// `q >= 0.02 (effect)` / `q < 0.02`.
    pub fn show(&self) -> String {
        match *self {
            Rule::Effect { delta } => format!("> 0, at least {delta}"),
            Rule::AtMost { delta } => format!("< {delta}"),
        }
    }
}

/// An exact one-sided permutation test of agreement between two orderings on a fixed set of pairs:
/// `agree` counts the pairs `(i, j)` of `pairs` where `ours[i] - ours[j]` has the sign of
/// `theirs[i] - theirs[j]`; the p-values are the shares of all `n!` permutations of `ours` whose
/// agreement is at least (`p_agree`) / at most (`p_disagree`) the observed one. At most 10 rows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Permutation {
    /// Pairs whose signs agree.
    pub agree: usize,
    /// Pairs tested.
    pub pairs: usize,
    /// P(agreement >= observed) under random orderings.
    pub p_agree: f64,
    /// P(agreement <= observed) under random orderings.
    pub p_disagree: f64,
}

/// See [`Permutation`]. `None` with no pairs or more than 10 rows.
pub fn permutation_test(ours: &[f64], theirs: &[f64], pairs: &[(usize, usize)]) -> Option<Permutation> {
    let n = ours.len();
    if pairs.is_empty() || n > 10 || theirs.len() != n {
        return None;
    }
    let agreement =
        |x: &[f64]| pairs.iter().filter(|&&(i, j)| (x[i] - x[j]).signum() == (theirs[i] - theirs[j]).signum()).count();
    let observed = agreement(ours);
    let (mut ge, mut le, mut total) = (0u64, 0u64, 0u64);
    let mut perm: Vec<usize> = (0..n).collect();
    let mut x = vec![0.0; n];
    // Heap's algorithm over every permutation of the row indices.
    let mut c = vec![0usize; n];
    let mut visit = |perm: &[usize]| {
        for (slot, &p) in x.iter_mut().zip(perm) {
            *slot = ours[p];
        }
        let a = agreement(&x);
        ge += u64::from(a >= observed);
        le += u64::from(a <= observed);
        total += 1;
    };
    visit(&perm);
    let mut i = 0;
    while i < n {
        if c[i] < i {
            if i % 2 == 0 {
                perm.swap(0, i);
            } else {
                perm.swap(c[i], i);
            }
            visit(&perm);
            c[i] += 1;
            i = 0;
        } else {
            c[i] = 0;
            i += 1;
        }
    }
    Some(Permutation {
        agree: observed,
        pairs: pairs.len(),
        p_agree: ge as f64 / total as f64,
        p_disagree: le as f64 / total as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per-span losses of one row: a level, a seed offset, span difficulty shared by every row (the
    /// pairing), and the row's own per-span noise. Realistic sizes for the small scale: spans differ
    /// by about 0.3 nats, seeds by about 0.01, a row's own per-span noise about 0.02.
    fn row(level: f64, seeds: usize, spans: usize, seed_sd: f64, rng: &mut Rng, difficulty: &[f64]) -> Vec<Vec<f64>> {
        (0..seeds)
            .map(|_| {
                let offset = seed_sd * rng.normal();
                (0..spans).map(|w| level + offset + difficulty[w] + 0.02 * rng.normal()).collect()
            })
            .collect()
    }

    fn difference(effect: f64, seeds: usize, trial: u64) -> Interval {
        let spans = 32;
        let mut rng = Rng::new(trial);
        let difficulty: Vec<f64> = (0..spans).map(|_| 0.3 * rng.normal()).collect();
        let a = row(5.0 + effect, seeds, spans, 0.01, &mut rng, &difficulty);
        let b = row(5.0, seeds, spans, 0.01, &mut rng, &difficulty);
        bootstrap(&[Term { coef: 1.0, values: a }, Term { coef: -1.0, values: b }], None, trial).unwrap()
    }

    #[test]
    fn a_planted_effect_is_found_and_a_null_is_not_reproduced() {
        let rule = Rule::Effect { delta: 0.02 };
        let (mut found, mut false_alarms, mut nulls_inconclusive) = (0, 0, 0);
        for trial in 0..100 {
            let i = difference(0.05, 3, trial);
            if rule.judge(&i).0 == Verdict::Reproduced {
                found += 1;
            }
            let null = rule.judge(&difference(0.0, 3, 1000 + trial)).0;
            false_alarms += usize::from(null == Verdict::Reproduced);
            nulls_inconclusive += usize::from(null == Verdict::Inconclusive);
        }
        // 0.05 nats is 6 standard errors of a 3-seed paired difference (seed sd 0.01); with t(2) tails
        // about 86% of such experiments find it. Bootstrapping the 3 seeds instead found 100% and let
        // a null through; a broken interval finds ~0 or ~100.
        assert!((70..=98).contains(&found), "found in {found} of 100");
        // A null is reproduced only when its interval misses 0 (2.5% one-sided) and the estimate
        // reaches 0.02 as well.
        assert!(false_alarms <= 3, "a null reproduced in {false_alarms} of 100");
        assert!(nulls_inconclusive >= 90, "a null inconclusive in only {nulls_inconclusive} of 100");
        // An effect the other way is contradicted.
        assert_eq!(rule.judge(&difference(-0.05, 3, 7)).0, Verdict::Contradicted);
    }

    #[test]
    fn the_interval_covers_the_truth_about_95_percent_of_the_time() {
        let mut covered = 0;
        for trial in 0..200 {
            let i = difference(0.03, 3, 5000 + trial);
            covered += usize::from(i.lo <= 0.03 && 0.03 <= i.hi);
        }
        assert!((182..=200).contains(&covered), "covered {covered} of 200");
    }

    #[test]
    fn pairing_on_spans_removes_their_shared_difficulty() {
        // Two rows that differ by exactly 0.01 on every span of every seed: span difficulty (0.3 nats)
        // and the seed offsets cancel, so the interval is a point.
        let mut rng = Rng::new(3);
        let d: Vec<f64> = (0..16).map(|_| 0.3 * rng.normal()).collect();
        let a: Vec<Vec<f64>> = (0..3).map(|s| d.iter().map(|x| 5.01 + x + 0.001 * s as f64).collect()).collect();
        let b: Vec<Vec<f64>> = (0..3).map(|s| d.iter().map(|x| 5.0 + x + 0.001 * s as f64).collect()).collect();
        let i = bootstrap(&[Term { coef: 1.0, values: a }, Term { coef: -1.0, values: b }], None, 1).unwrap();
        assert!((i.estimate - 0.01).abs() < 1e-12 && (i.hi - i.lo) < 1e-9, "{i:?}");
    }

    #[test]
    fn single_seed_rows_get_the_pooled_seed_noise() {
        let mut rng = Rng::new(5);
        let d: Vec<f64> = (0..32).map(|_| 0.3 * rng.normal()).collect();
        let t = vec![
            Term { coef: 1.0, values: row(5.0, 1, 32, 0.0, &mut rng, &d) },
            Term { coef: -1.0, values: row(5.0, 1, 32, 0.0, &mut rng, &d) },
        ];
        let narrow = bootstrap(&t, None, 9).unwrap();
        let wide = bootstrap(&t, Some(SeedNoise { sd: 0.02, df: 8 }), 9).unwrap();
        // Two single-seed rows: the difference gets sqrt(2) x 0.02 of seed noise with t(8) tails
        // (97.5% point 2.306): about +-0.065.
        assert!(narrow.hi - narrow.lo < 0.03, "{narrow:?}");
        let expected = 2.0 * 2.306 * 0.02 * 2f64.sqrt();
        assert!((wide.hi - wide.lo - expected).abs() < 0.02, "{wide:?} vs width {expected}");
        let pooled = pooled_seed_sd(&[vec![1.0, 1.2, 1.1], vec![3.0, 3.2], vec![7.0]]).unwrap();
        // Within-row squares 0.02 + 0.02 over 2 + 1 degrees of freedom.
        assert!((pooled.sd - (0.04f64 / 3.0).sqrt()).abs() < 1e-12 && pooled.df == 3, "{pooled:?}");
        assert_eq!(pooled_seed_sd(&[vec![1.0]]), None);
    }

    #[test]
    fn the_verdict_rules() {
        let i = |estimate, lo, hi| Interval { estimate, lo, hi };
        let effect = Rule::Effect { delta: 0.02 };
        assert_eq!(effect.judge(&i(0.05, 0.03, 0.07)).0, Verdict::Reproduced);
        assert_eq!(effect.judge(&i(0.01, 0.005, 0.015)).0, Verdict::Inconclusive);
        assert!(effect.judge(&i(0.01, 0.005, 0.015)).1.contains("smaller than"));
        assert_eq!(effect.judge(&i(0.01, -0.01, 0.03)).0, Verdict::Inconclusive);
        assert_eq!(effect.judge(&i(-0.05, -0.07, -0.03)).0, Verdict::Contradicted);
        let flat = Rule::AtMost { delta: 0.02 };
        assert_eq!(flat.judge(&i(0.0, -0.01, 0.01)).0, Verdict::Reproduced);
        assert_eq!(flat.judge(&i(0.0, -0.01, 0.03)).0, Verdict::Inconclusive);
        assert_eq!(flat.judge(&i(0.05, 0.03, 0.07)).0, Verdict::Contradicted);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(bootstrap(&[], None, 0).is_err());
        let t = |v: Vec<Vec<f64>>| Term { coef: 1.0, values: v };
        assert!(bootstrap(&[t(vec![vec![1.0, 2.0]]), t(vec![vec![1.0]])], None, 0).is_err());
        assert!(bootstrap(&[t(vec![])], None, 0).is_err());
    }

    #[test]
    fn the_permutation_test_is_exact() {
        // Three rows, the paper's order 0 < 1 < 2, all three pairs tested.
        let paper = [1.0, 2.0, 3.0];
        let all = [(0, 1), (0, 2), (1, 2)];
        // Full agreement: 1 of the 3! = 6 orderings agrees on all three pairs.
        let p = permutation_test(&[10.0, 20.0, 30.0], &paper, &all).unwrap();
        assert_eq!((p.agree, p.pairs), (3, 3));
        assert!((p.p_agree - 1.0 / 6.0).abs() < 1e-12 && (p.p_disagree - 1.0).abs() < 1e-12);
        // Reversed: 1 of 6 agrees on none.
        let p = permutation_test(&[30.0, 20.0, 10.0], &paper, &all).unwrap();
        assert_eq!(p.agree, 0);
        assert!((p.p_disagree - 1.0 / 6.0).abs() < 1e-12);
        // One pair: half of the orderings agree on it.
        let p = permutation_test(&[10.0, 20.0, 30.0], &paper, &[(0, 2)]).unwrap();
        assert!((p.p_agree - 0.5).abs() < 1e-12);
        // Five rows in the paper's order: 1/120 < 0.05.
        let five = [1.0, 2.0, 3.0, 4.0, 5.0];
        let pairs: Vec<(usize, usize)> = (0..5).flat_map(|i| (i + 1..5).map(move |j| (i, j))).collect();
        let p = permutation_test(&five, &five, &pairs).unwrap();
        assert!((p.p_agree - 1.0 / 120.0).abs() < 1e-12);
        assert!(permutation_test(&five, &five, &[]).is_none());
    }
}
