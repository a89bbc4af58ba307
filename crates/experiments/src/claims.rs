//! The paper's headline claims (`defs/claims.toml`) and the Tables 1-3 ordering rule, judged from the
//! runs with [`crate::stats`]: every verdict is one of [`Verdict`]'s outcomes, with its interval,
//! standard error, degrees of freedom and one-sided p-value, against the effect fixed in advance.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use trainer::eval::Rope;

use crate::runner::{RunResult, Runs};
use crate::spec::{EvalKey, Experiment, TrainedVariant};
use crate::stats::{self, Evidence, Interval, Judgement, Rule, Term, Verdict};

const CLAIMS: &str = include_str!("../defs/claims.toml");

/// One term of a claim's contrast.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimTerm {
    /// Coefficient.
    pub coef: f64,
    /// TrainedVariant variant.
    pub train: TrainedVariant,
    /// Post-hoc re-weighting power.
    #[serde(default)]
    pub posthoc: Option<u32>,
    /// Length multiple.
    pub multiple: usize,
}

/// A fact of the runs, beside the paper's, that the report's summary gives next to a claim that does
/// not reproduce as a likely reason: a row's rise from 1x to a length (`kind = "rise"`), or its gap to
/// softmax at a length (`kind = "gap"`), here and in the paper's Table 4.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextFact {
    /// `rise` or `gap`.
    pub kind: String,
    /// TrainedVariant variant.
    pub train: TrainedVariant,
    /// Post-hoc re-weighting power.
    #[serde(default)]
    pub posthoc: Option<u32>,
    /// The length (multiple) it is read at.
    pub multiple: usize,
}

/// One claim.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// Stable name.
    pub name: String,
    /// What it says, in words.
    pub statement: String,
    /// A few words for the report's summary.
    pub short: String,
    /// `effect`, `at-most` or `equivalent`.
    rule: String,
    /// The effect size, the bound or the margin of equivalence, nats.
    pub delta: f64,
    /// The contrast.
    pub terms: Vec<ClaimTerm>,
    /// When and why the claim was added, when that was after the runs it is judged on.
    #[serde(default)]
    pub added: Option<String>,
    /// Lengths at which the report also shows the contrast, each term read at the claim's longest
    /// length moved there.
    #[serde(default)]
    pub across: Vec<usize>,
    /// Facts the summary shows beside the claim when it does not reproduce.
    #[serde(default)]
    pub context: Vec<ContextFact>,
}

impl Claim {
    /// The verdict rule.
    pub fn rule(&self) -> Rule {
        match self.rule.as_str() {
            "effect" => Rule::Effect { delta: self.delta },
            "equivalent" => Rule::Equivalent { margin: self.delta },
            _ => Rule::AtMost { delta: self.delta },
        }
    }

    /// The longest length the claim reads (1 when it is about the training length only).
    pub fn longest(&self) -> usize {
        self.terms.iter().map(|t| t.multiple).max().unwrap_or(1)
    }

    /// The lengths of [`Claim::across`] that term `t` is also read at (none when it is not read at the
    /// claim's longest length).
    fn across_terms(&self, t: &ClaimTerm) -> impl Iterator<Item = usize> + '_ {
        let moves = t.multiple == self.longest();
        self.across.iter().copied().filter(move |_| moves)
    }
}

/// The Tables 1-3 ordering rule.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ordering {
    /// Two of the paper's rows are separated when they differ by more than this (nats).
    pub paper_noise: f64,
    /// The experiments it applies to.
    pub experiments: Vec<String>,
}

/// A row of the retrieval benchmark: a trained variant, with a post-hoc power or not.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowRef {
    /// TrainedVariant variant.
    pub train: TrainedVariant,
    /// Post-hoc re-weighting power.
    #[serde(default)]
    pub posthoc: Option<u32>,
}

/// A `[[retrieval]]` claim: a row recalls beyond the training length better than a baseline, by at
/// least `delta` (judged by the retrieval benchmark, `crate::retrieval`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalClaim {
    /// Stable name.
    pub name: String,
    /// What it says, in words.
    pub statement: String,
    /// The row claimed better.
    pub row: RowRef,
    /// The row it is compared with.
    pub baseline: RowRef,
    /// The least effect that counts (a share of questions).
    pub delta: f64,
}

/// `defs/claims.toml`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claims {
    /// The headline claims.
    pub claim: Vec<Claim>,
    /// The ordering rule.
    pub ordering: Ordering,
    /// The retrieval benchmark's claims.
    #[serde(default)]
    pub retrieval: Vec<RetrievalClaim>,
}

/// The claims, parsed and checked (variant names parse, rules are known, multiples are positive).
pub fn all() -> anyhow::Result<Claims> {
    let c: Claims = toml::from_str(CLAIMS)?;
    for claim in &c.claim {
        anyhow::ensure!(
            ["effect", "at-most", "equivalent"].contains(&claim.rule.as_str()),
            "claim {}: rule `{}`",
            claim.name,
            claim.rule
        );
        anyhow::ensure!(
            claim.rule != "equivalent" || claim.delta > 0.0,
            "claim {}: an equivalence needs a positive margin",
            claim.name
        );
        anyhow::ensure!(
            claim.context.iter().all(|f| ["rise", "gap"].contains(&f.kind.as_str()) && f.multiple >= 1),
            "claim {}: a context fact is a `rise` or a `gap` at a positive multiple",
            claim.name
        );
        anyhow::ensure!(
            claim.across.iter().all(|&m| m >= 1),
            "claim {}: `across` lists positive multiples",
            claim.name
        );
        anyhow::ensure!(!claim.terms.is_empty(), "claim {}: no terms", claim.name);
        for t in &claim.terms {
            if let Some(p) = t.posthoc {
                t.train.variant().clone().with_reweight(p).map_err(|e| anyhow::anyhow!("claim {}: {e}", claim.name))?;
            }
            anyhow::ensure!(t.multiple >= 1, "claim {}: multiple 0", claim.name);
        }
    }
    for r in &c.retrieval {
        for row in [&r.row, &r.baseline] {
            if let Some(p) = row.posthoc {
                let v = row.train.variant().clone();
                v.with_reweight(p).map_err(|e| anyhow::anyhow!("retrieval claim {}: {e}", r.name))?;
            }
        }
    }
    Ok(c)
}

impl Claims {
    /// The trained variants some claim reads: the ones trained with several seeds.
    pub fn variants(&self) -> BTreeSet<String> {
        self.claim.iter().flat_map(|c| c.terms.iter().map(|t| t.train.to_string())).collect()
    }

    /// The evaluations the claims need beyond the experiments' own (post-hoc powers, both RoPE
    /// treatments at every length a claim reads), by trained variant.
    pub fn plan(&self) -> BTreeMap<TrainedVariant, Vec<EvalKey>> {
        let mut out: BTreeMap<TrainedVariant, Vec<EvalKey>> = BTreeMap::new();
        for c in &self.claim {
            for t in &c.terms {
                for m in std::iter::once(t.multiple).chain(c.across_terms(t)) {
                    for ntk in [true, false] {
                        out.entry(t.train.clone()).or_default().push(EvalKey::new(ntk, t.posthoc, m));
                    }
                }
            }
        }
        out
    }
}

/// Which per-window losses a reading averages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measure {
    /// The whole window (the paper's measure).
    Whole,
    /// Each window's last `T_train` targets; at 1x, the same targets in their own 1x windows.
    Tail,
}

/// The per-span losses of one run for `key`, averaged as `measure` says; `longest` is the span length
/// in training lengths and `reference` the length whose tails a 1x term is paired with.
fn span_values(r: &RunResult, key: &EvalKey, measure: Measure, longest: usize, reference: usize) -> Option<Vec<f64>> {
    let w = r.eval(key)?.per_window.as_ref()?;
    let m = key.multiple;
    let per_span = longest / m;
    let window: Vec<f64> = match (measure, m) {
        (Measure::Whole, 1) => w.first.iter().map(|&x| f64::from(x)).collect(),
        (Measure::Whole, _) => w
            .first
            .iter()
            .zip(&w.rest)
            .map(|(&f, &r)| (f64::from(f) + (m - 1) as f64 * f64::from(r)) / m as f64)
            .collect(),
        // The 1x windows that are the tails of the reference length's windows.
        (Measure::Tail, 1) => {
            return Some(
                w.first
                    .chunks(per_span)
                    .map(|span| {
                        let tails: Vec<f64> =
                            span.iter().skip(reference - 1).step_by(reference).map(|&x| f64::from(x)).collect();
                        tails.iter().sum::<f64>() / tails.len() as f64
                    })
                    .collect(),
            );
        }
        (Measure::Tail, _) => w.tail.iter().map(|&x| f64::from(x)).collect(),
    };
    if window.is_empty() || !window.len().is_multiple_of(per_span) {
        return None;
    }
    Some(window.chunks(per_span).map(|s| s.iter().sum::<f64>() / s.len() as f64).collect())
}

/// The per-span losses of a row by seed index (`RunResult::seed_index`, never the run's position):
/// every seed of `variant` that trained without error and has the evaluation.
fn row_values(
    runs: &Runs,
    variant: &str,
    key: &EvalKey,
    measure: Measure,
    longest: usize,
    reference: usize,
) -> Option<BTreeMap<usize, Vec<f64>>> {
    let seeds: BTreeMap<usize, Vec<f64>> = runs
        .get(variant)?
        .iter()
        .filter(|r| r.error.is_none())
        .filter_map(|r| Some((r.seed_index, span_values(r, key, measure, longest, reference)?)))
        .collect();
    (!seeds.is_empty()).then_some(seeds)
}

/// The span length of the runs in training lengths: the longest evaluated multiple.
pub fn longest_multiple(runs: &Runs) -> usize {
    runs.values().flatten().flat_map(|r| r.evals.iter().map(|(k, _)| k.multiple)).max().unwrap_or(1)
}

/// The seed noise of a row's 1x loss and its correlation between rows on a shared seed, from the
/// variants with several seeds paired by seed index ([`stats::seed_noise`]): what the interval of a
/// contrast between single-seed rows uses ([`stats::contrast`]).
pub fn seed_noise(runs: &Runs) -> Option<stats::SeedNoise> {
    let key = EvalKey::new(true, None, 1);
    let rows: Vec<BTreeMap<usize, f64>> = runs
        .values()
        .map(|seeds| {
            seeds
                .iter()
                .filter(|r| r.error.is_none())
                .filter_map(|r| Some((r.seed_index, r.loss(&key).filter(|l| l.is_finite())?)))
                .collect()
        })
        .collect();
    stats::seed_noise(&rows)
}

/// The contrast `sum coef x row` of rows `(coef, trained variant, evaluation)` with its interval, read
/// as `measure` (tails paired with `reference`'s windows), on the seeds every row has; `None` when a
/// row has no results or no seed is common to all.
pub fn contrast(
    runs: &Runs,
    terms: &[(f64, &str, EvalKey)],
    measure: Measure,
    reference: usize,
) -> Option<stats::Contrast> {
    let longest = longest_multiple(runs);
    let terms: Option<Vec<Term>> = terms
        .iter()
        .map(|(coef, v, key)| {
            Some(Term { coef: *coef, values: row_values(runs, v, key, measure, longest, reference)? })
        })
        .collect();
    stats::contrast(&terms?, seed_noise(runs)).ok()
}

/// `` `lssa` `` / `` `lssa` post-hoc p=15 at 16x ``: a claim term in a note.
fn term_label(t: &ClaimTerm) -> String {
    let p = t.posthoc.map_or(String::new(), |p| format!(" post-hoc p={p}"));
    let m = if t.multiple > 1 { format!(" at {}x", t.multiple) } else { String::new() };
    format!("`{}`{p}{m}", t.train)
}

/// One reading of a claim: a RoPE treatment (none at 1x) and a measure.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// The RoPE treatment beyond 1x; `None` for a claim about 1x only.
    pub rope: Option<Rope>,
    /// Whole windows or tails.
    pub measure: Measure,
    /// The contrast and its 95% interval.
    pub interval: Interval,
    /// Its estimate, standard error and degrees of freedom.
    pub evidence: Evidence,
    /// The verdict on it, why, and its p-value.
    pub judgement: Judgement,
    /// When some seed of a variant had no result for this reading, so the contrast read only the
    /// seeds every term has: which seeds, and which variant lacks which.
    pub note: Option<String>,
}

/// A judged claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    /// The claim.
    pub claim: Claim,
    /// Seeds per variant it read.
    pub seeds: BTreeMap<String, usize>,
    /// Its readings (empty when `missing` says why).
    pub readings: Vec<Reading>,
    /// The whole-window contrast at each length of [`Claim::across`], per RoPE treatment.
    pub across: Vec<(Option<Rope>, usize, Interval)>,
    /// What is missing, when it could not be judged.
    pub missing: Option<String>,
}

/// Judges every claim on `runs`.
pub fn judge(claims: &Claims, runs: &Runs) -> Vec<Judged> {
    let longest = longest_multiple(runs);
    let noise = seed_noise(runs);
    claims
        .claim
        .iter()
        .map(|c| {
            let seeds: BTreeMap<String, usize> = c
                .terms
                .iter()
                .map(|t| {
                    (
                        t.train.to_string(),
                        runs.get(t.train.as_str()).map_or(0, |s| s.iter().filter(|r| r.error.is_none()).count()),
                    )
                })
                .collect();
            let ropes: Vec<Option<Rope>> =
                if c.longest() > 1 { vec![Some(Rope::Plain), Some(Rope::Ntk)] } else { vec![None] };
            let measures: &[Measure] =
                if c.longest() > 1 { &[Measure::Whole, Measure::Tail] } else { &[Measure::Whole] };
            let mut readings = Vec::new();
            for &rope in &ropes {
                for &measure in measures {
                    let terms: Option<Vec<Term>> = c
                        .terms
                        .iter()
                        .map(|t| {
                            let key = EvalKey::new(rope != Some(Rope::Plain), t.posthoc, t.multiple);
                            let values = row_values(runs, &t.train, &key, measure, longest, c.longest())?;
                            Some(Term { coef: t.coef, values })
                        })
                        .collect();
                    let Some(terms) = terms else {
                        return Judged {
                            claim: c.clone(),
                            seeds,
                            readings: Vec::new(),
                            across: Vec::new(),
                            missing: Some("some of its runs or evaluations have no results".into()),
                        };
                    };
                    match stats::contrast(&terms, noise) {
                        Ok(q) => {
                            let evidence = q.evidence();
                            let judgement = c.rule().judge(&evidence);
                            let note = q.note(|k| term_label(&c.terms[k]));
                            readings.push(Reading { rope, measure, interval: q.interval, evidence, judgement, note });
                        }
                        Err(e) => {
                            let why = match e {
                                stats::StatsError::NoCommonSeed(_) => format!(
                                    "no seed has results for every term: {}",
                                    c.terms
                                        .iter()
                                        .zip(&terms)
                                        .map(|(ct, t)| format!(
                                            "{} has seeds {:?}",
                                            term_label(ct),
                                            t.values.keys().collect::<Vec<_>>()
                                        ))
                                        .collect::<Vec<_>>()
                                        .join("; ")
                                ),
                                e => e.to_string(),
                            };
                            return Judged {
                                claim: c.clone(),
                                seeds,
                                readings: Vec::new(),
                                across: Vec::new(),
                                missing: Some(why),
                            };
                        }
                    }
                }
            }
            let mut across = Vec::new();
            for &rope in &ropes {
                for &m in &c.across {
                    let terms: Vec<(f64, &str, EvalKey)> = c
                        .terms
                        .iter()
                        .map(|t| {
                            let at = if t.multiple == c.longest() { m } else { t.multiple };
                            (t.coef, t.train.as_str(), EvalKey::new(rope != Some(Rope::Plain), t.posthoc, at))
                        })
                        .collect();
                    if let Some(q) = contrast(runs, &terms, Measure::Whole, 1) {
                        across.push((rope, m, q.interval));
                    }
                }
            }
            Judged { claim: c.clone(), seeds, readings, across, missing: None }
        })
        .collect()
}

/// One pair of rows of an ordering table.
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    /// Row labels.
    pub rows: (String, String),
    /// The paper's difference (first minus second).
    pub paper: f64,
    /// Ours, with its interval.
    pub ours: Interval,
    /// Separated in the paper (beyond its noise) and in ours (interval excludes 0).
    pub separated: (bool, bool),
}

/// The ordering verdict of one table.
#[derive(Clone, Debug, PartialEq)]
pub struct OrderingVerdict {
    /// The experiment.
    pub experiment: String,
    /// Every pair of rows with both numbers.
    pub pairs: Vec<Pair>,
    /// The permutation test over the pairs separated in both (none when there are none).
    pub test: Option<stats::Permutation>,
    /// The verdict.
    pub verdict: Verdict,
    /// Why, in words.
    pub why: String,
}

impl OrderingVerdict {
    /// The permutation test's one-sided p-value behind the verdict (the agreement's for reproduced and
    /// inconclusive, the disagreement's for contradicted; 1 with no pair to test) and the level it is
    /// read at, for the family-wise reading ([`stats::holm`]).
    pub fn p(&self) -> (f64, f64) {
        let p = match (&self.test, self.verdict) {
            (None, _) => 1.0,
            (Some(t), Verdict::Contradicted) => t.p_disagree,
            (Some(t), _) => t.p_agree,
        };
        (p, crate::stats::LEVEL)
    }
}

/// Judges the Tables 1-3 ordering claims at 1x.
pub fn judge_orderings(claims: &Claims, experiments: &[Experiment], runs: &Runs) -> Vec<OrderingVerdict> {
    let longest = longest_multiple(runs);
    let noise = seed_noise(runs);
    let key = EvalKey::new(true, None, 1);
    let mut out = Vec::new();
    for e in experiments.iter().filter(|e| claims.ordering.experiments.contains(&e.name)) {
        let rows: Vec<(&crate::spec::Row, BTreeMap<usize, Vec<f64>>)> = e
            .rows
            .iter()
            .filter(|r| r.posthoc.is_none() && !r.paper.is_empty())
            .filter_map(|r| Some((r, row_values(runs, &r.train, &key, Measure::Whole, longest, 1)?)))
            .collect();
        if rows.len() < 2 {
            continue;
        }
        let mut pairs = Vec::new();
        let mut both = Vec::new();
        for i in 0..rows.len() {
            for j in i + 1..rows.len() {
                let terms =
                    [Term { coef: 1.0, values: rows[i].1.clone() }, Term { coef: -1.0, values: rows[j].1.clone() }];
                // Single-seed rows meet on their shared seed, with the correlated seed-noise model.
                let Ok(ours) = stats::contrast(&terms, noise).map(|q| q.interval) else { continue };
                let paper = rows[i].0.paper[0] - rows[j].0.paper[0];
                let separated = (paper.abs() > claims.ordering.paper_noise, ours.lo > 0.0 || ours.hi < 0.0);
                if separated.0 && separated.1 {
                    both.push((i, j));
                }
                pairs.push(Pair { rows: (rows[i].0.label.clone(), rows[j].0.label.clone()), paper, ours, separated });
            }
        }
        let ours: Vec<f64> = rows
            .iter()
            .map(|(_, v)| stats::estimate(&[Term { coef: 1.0, values: v.clone() }]).unwrap_or(f64::NAN))
            .collect();
        let paper: Vec<f64> = rows.iter().map(|(r, _)| r.paper[0]).collect();
        let test = stats::permutation_test(&ours, &paper, &both);
        let (verdict, why) = match &test {
            None => (
                Verdict::Inconclusive,
                format!(
                    "no pair of rows is separated beyond noise both in the paper (by more than {} nats) and in our runs (interval excluding 0)",
                    claims.ordering.paper_noise
                ),
            ),
            Some(t) if t.p_agree < crate::stats::LEVEL => (
                Verdict::Reproduced,
                format!("{} of {} separated pairs agree; exact permutation p = {:.3}", t.agree, t.pairs, t.p_agree),
            ),
            Some(t) if t.p_disagree < crate::stats::LEVEL => (
                Verdict::Contradicted,
                format!(
                    "only {} of {} separated pairs agree; exact permutation p = {:.3} for so few",
                    t.agree, t.pairs, t.p_disagree
                ),
            ),
            Some(t) => (
                Verdict::Inconclusive,
                format!(
                    "{} of {} separated pairs agree, which random orderings match or beat with p = {:.3}",
                    t.agree, t.pairs, t.p_agree
                ),
            ),
        };
        out.push(OrderingVerdict { experiment: e.name.clone(), pairs, test, verdict, why });
    }
    out
}

#[cfg(test)]
mod tests {
    use trainer::eval::{LengthLoss, WindowLosses};

    use super::*;

    /// A run of `variant` at seed index `seed` with per-window 1x losses `first` (one window per span).
    fn run(variant: &str, seed: usize, first: Vec<f32>) -> RunResult {
        let loss = first.iter().map(|&x| f64::from(x)).sum::<f64>() / first.len() as f64;
        let eval = LengthLoss {
            multiple: 1,
            seq_len: 8,
            rope: Rope::Ntk,
            reweight: None,
            loss,
            tokens: 8 * first.len(),
            windows: first.len(),
            per_window: Some(WindowLosses { first, rest: Vec::new(), tail: Vec::new() }),
        };
        serde_json::from_value(serde_json::json!({
            "format": "test", "format_version": 1, "scale": "test", "variant": variant, "seed_index": seed,
            "config": "", "git_revision": "", "command": "", "train_wall_s": 0.0, "tokens_per_s": 0.0,
            "final_train_loss": 1.0, "evals": [[EvalKey::new(true, None, 1), eval]],
        }))
        .unwrap()
    }

    #[test]
    fn rows_pair_on_the_seed_index_and_a_missing_seed_is_noted() {
        let claims: Claims = toml::from_str(
            r#"
            [[claim]]
            name = "gap"
            short = "softmax is worse"
            statement = "softmax is worse"
            rule = "effect"
            delta = 0.02
            terms = [{ coef = 1.0, train = "softmax", multiple = 1 }, { coef = -1.0, train = "lssa", multiple = 1 }]
            [ordering]
            paper_noise = 0.01
            experiments = []
            "#,
        )
        .unwrap();
        // Seed s moves both rows by 0.5 s; softmax is 0.05 above lssa on every span of every seed.
        let losses = |level: f64, s: usize| -> Vec<f32> {
            (0..8).map(|w| (level + 0.5 * s as f64 + 0.1 * w as f64 + 0.001 * ((s * w) % 3) as f64) as f32).collect()
        };
        let mut failed = run("softmax", 1, Vec::new());
        (failed.evals, failed.error) = (Vec::new(), Some("diverged".into()));
        let mut runs = Runs::new();
        // Seed 1 of softmax failed, and the runs are out of order: pairing by position would meet
        // softmax's seed 2 with lssa's seed 1.
        runs.insert(
            "softmax".into(),
            vec![
                run("softmax", 3, losses(5.05, 3)),
                run("softmax", 0, losses(5.05, 0)),
                failed,
                run("softmax", 2, losses(5.05, 2)),
            ],
        );
        runs.insert("lssa".into(), (0..4).map(|s| run("lssa", s, losses(5.0, s))).collect());
        let j = &judge(&claims, &runs)[0];
        assert_eq!(j.missing, None);
        let r = &j.readings[0];
        assert!((r.interval.estimate - 0.05).abs() < 1e-5 && r.interval.hi - r.interval.lo < 0.01, "{r:?}");
        assert_eq!(r.judgement.verdict, Verdict::Reproduced);
        assert_eq!(
            r.note.as_deref(),
            Some("restricted to seeds 0, 2, 3, the seeds every term has: seed 1 is missing from `softmax`")
        );
        // The seed-noise model pairs the two rows on seeds 0, 2, 3: their deviations are identical.
        let noise = seed_noise(&runs).unwrap();
        assert_eq!((noise.pairs, noise.rho), (1, stats::MAX_RHO), "{noise:?}");
    }

    #[test]
    fn an_equivalence_claim_is_read_at_1x_and_contrasts_are_shown_across_lengths() {
        let claims: Claims = toml::from_str(
            r#"
            [[claim]]
            name = "free"
            short = "lssa costs nothing"
            statement = "lssa equals softmax at 1x"
            rule = "equivalent"
            delta = 0.01
            terms = [{ coef = 1.0, train = "lssa", multiple = 1 }, { coef = -1.0, train = "softmax", multiple = 1 }]
            [[claim]]
            name = "beats"
            short = "lssa below softmax"
            statement = "lssa below softmax at 2x"
            rule = "effect"
            delta = 0.02
            across = [1, 2]
            terms = [{ coef = 1.0, train = "softmax", multiple = 2 }, { coef = -1.0, train = "lssa", multiple = 2 }]
            [ordering]
            paper_noise = 0.01
            experiments = []
            "#,
        )
        .unwrap();
        // 1x windows only: lssa is 0.002 above softmax on every span of every seed, the seeds and
        // spans moving both rows alike.
        let losses = |level: f64, s: usize| -> Vec<f32> {
            (0..8).map(|w| (level + 0.05 * s as f64 + 0.1 * w as f64 + 0.001 * ((s * w) % 3) as f64) as f32).collect()
        };
        let mut runs = Runs::new();
        runs.insert("softmax".into(), (0..4).map(|s| run("softmax", s, losses(5.0, s))).collect());
        runs.insert("lssa".into(), (0..4).map(|s| run("lssa", s, losses(5.002, s))).collect());
        let judged = judge(&claims, &runs);
        let free = &judged[0];
        assert_eq!(free.readings.len(), 1, "one reading, without a RoPE treatment");
        assert_eq!(free.readings[0].rope, None);
        assert_eq!(free.readings[0].judgement.verdict, Verdict::Reproduced, "{:?}", free.readings[0]);
        // The 2x claim has no 2x evaluations here: not judged, and nothing shown across lengths.
        assert!(judged[1].missing.is_some() && judged[1].across.is_empty());
    }

    #[test]
    fn the_claims_parse_and_read_multi_seed_rows() {
        let c = all().unwrap();
        let names: Vec<&str> = c.claim.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "softmax-degrades",
                "interaction",
                "lssar-flat",
                "large-p-train",
                "large-p-posthoc",
                "lssar-beats-softmax",
                "lssar-posthoc-beats-softmax",
                "lssa-beats-softmax",
                "lssar-free-at-1x",
                "lssar-flat-paper",
            ]
        );
        // The paper's comparisons: read at 8x, the longest length of its Table 4, shown at 2x-16x.
        let beats = c.claim.iter().find(|c| c.name == "lssar-beats-softmax").unwrap();
        assert_eq!((beats.longest(), beats.rule()), (8, Rule::Effect { delta: 0.02 }));
        assert!(c.plan()["lssa"].contains(&EvalKey::new(false, Some(15), 16)), "across reaches 16x");
        let free = c.claim.iter().find(|c| c.name == "lssar-free-at-1x").unwrap();
        assert_eq!((free.longest(), free.rule()), (1, Rule::Equivalent { margin: c.ordering.paper_noise }));
        assert_eq!(c.variants().into_iter().collect::<Vec<_>>(), ["lssa", "lssa+rw15", "softmax", "softmax+rw15"]);
        assert!(c.plan()["softmax"].contains(&EvalKey::new(false, Some(15), 1)));
        assert!(c.plan()["lssa+rw15"].contains(&EvalKey::new(false, None, 16)));
        assert_eq!(c.ordering.experiments, ["table1", "table2", "table3"]);
        // Each claim's contrast sums to zero: it compares rows, never reads a level.
        for claim in &c.claim {
            assert!(claim.terms.iter().map(|t| t.coef).sum::<f64>().abs() < 1e-12, "{}", claim.name);
        }
    }
}
