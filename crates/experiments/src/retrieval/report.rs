//! The retrieval benchmark's verdicts and report section: accuracy per (RoPE treatment, prompt
//! length, distance bin) with 95% intervals over seeds and questions ([`crate::stats::contrast`] on
//! 0/1 answers), the gate at 1x, the figure, and the `[[retrieval]]` claims of `defs/claims.toml`
//! judged three-way on identical questions, seed by seed.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;

use super::{SeedRun, Settings};
use crate::claims::{RetrievalClaim, RowRef};
use crate::plot::{GapSeries, save_intervals};
use crate::post::Figures;
use crate::spec::Experiment;
use crate::stats::{self, Interval, Rule, Term, Verdict};

/// Which questions a reading takes, by the distance from needle to question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bin {
    /// Distance below the training length: a hop any training window had.
    Inside,
    /// Distance at least the training length: further back than training ever asked.
    Beyond,
}

/// Share of `true`.
pub fn share(xs: &[bool]) -> f64 {
    xs.iter().filter(|&&x| x).count() as f64 / xs.len().max(1) as f64
}

/// Per seed index, the 0/1 answers of `runs` under `(ntk, posthoc)` at `multiples` whose distance
/// falls in `bin`, concatenated in a fixed order (the same questions for every model).
pub fn answers(
    s: &Settings,
    runs: &[SeedRun],
    ntk: bool,
    posthoc: Option<u32>,
    multiples: &[usize],
    bin: Bin,
) -> BTreeMap<usize, Vec<f64>> {
    let t = s.t_train as u32;
    runs.iter()
        .filter_map(|r| {
            let mut v = Vec::new();
            for &m in multiples {
                let a = r.get(ntk, posthoc, m)?;
                for (&c, &d) in a.correct.iter().zip(&a.distance) {
                    if (d >= t) == (bin == Bin::Beyond) {
                        v.push(if c { 1.0 } else { 0.0 });
                    }
                }
            }
            (!v.is_empty()).then_some((r.seed_index, v))
        })
        .collect()
}

/// Mean accuracy over seeds and questions with its 95% interval (clamped to `[0, 1]`, where a share
/// lies: with few seeds the t interval of a share near 0 or 1 can reach beyond).
pub fn accuracy(values: BTreeMap<usize, Vec<f64>>) -> Option<Interval> {
    (!values.is_empty()).then_some(())?;
    let i = stats::contrast(&[Term { coef: 1.0, values }], None).ok()?.interval;
    Some(Interval { lo: i.lo.max(0.0), hi: i.hi.min(1.0), ..i })
}

/// 1x accuracy of each seed, by seed index.
pub fn gate_accuracies(runs: &[SeedRun]) -> Vec<(usize, f64)> {
    runs.iter().filter_map(|r| Some((r.seed_index, share(&r.get(true, None, 1)?.correct)))).collect()
}

fn row_runs<'a>(results: &'a BTreeMap<String, Vec<SeedRun>>, r: &RowRef) -> Option<&'a [SeedRun]> {
    results.get(&r.train).map(Vec::as_slice).filter(|x| !x.is_empty())
}

/// Whether every seed of a row (as trained: post-hoc rows read their model's 1x answers under the
/// power) reaches the gate.
fn passes(s: &Settings, runs: &[SeedRun], posthoc: Option<u32>) -> bool {
    runs.len() >= s.seeds.min(2)
        && runs.iter().all(|r| r.get(true, posthoc, 1).is_some_and(|a| share(&a.correct) >= s.gate))
}

/// A judged retrieval claim.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    /// Its name.
    pub name: String,
    /// Per RoPE treatment (`true`: NTK), the interval and verdict, when the gate let it be judged.
    pub readings: Vec<(bool, Interval, Verdict)>,
    /// The report's line.
    pub line: String,
}

fn describe(r: &RowRef) -> String {
    match r.posthoc {
        Some(p) => format!("`{}` with p = {p} post hoc", r.train),
        None => format!("`{}`", r.train),
    }
}

/// Every `[[retrieval]]` claim of `defs/claims.toml`, judged on `results`.
pub fn verdicts(s: &Settings, results: &BTreeMap<String, Vec<SeedRun>>) -> Vec<Judged> {
    let claims = match crate::claims::all() {
        Ok(c) => c.retrieval,
        Err(e) => return vec![Judged { name: "retrieval".into(), readings: Vec::new(), line: format!("{e}") }],
    };
    claims.iter().map(|c| judge(s, c, results)).collect()
}

fn judge(s: &Settings, c: &RetrievalClaim, results: &BTreeMap<String, Vec<SeedRun>>) -> Judged {
    let head = format!("**{}**: {}", c.name, c.statement);
    let not_judged = |why: String| Judged {
        name: c.name.clone(),
        readings: Vec::new(),
        line: format!("{head}: **inconclusive**: not judged, because {why}."),
    };
    let (Some(row), Some(base)) = (row_runs(results, &c.row), row_runs(results, &c.baseline)) else {
        return not_judged("its rows did not run".into());
    };
    let failing: Vec<String> = [(&c.row, row), (&c.baseline, base)]
        .iter()
        .filter(|(r, runs)| !passes(s, runs, r.posthoc))
        .map(|(r, runs)| {
            let by_seed: Vec<String> = runs
                .iter()
                .map(|x| x.get(true, r.posthoc, 1).map_or("-".into(), |a| format!("{:.1}%", 100.0 * share(&a.correct))))
                .collect();
            format!("{} did not learn the task (1x accuracy by seed: {})", describe(r), by_seed.join(", "))
        })
        .collect();
    if !failing.is_empty() {
        return not_judged(format!("{} (gate: {:.0}% on every seed)", failing.join(" and "), 100.0 * s.gate));
    }
    let beyond: Vec<usize> = s.multiples.iter().copied().filter(|&m| m > 1).collect();
    let rule = Rule::Effect { delta: c.delta };
    let mut readings = Vec::new();
    let mut parts = Vec::new();
    for ntk in [true, false] {
        let terms = [
            Term { coef: 1.0, values: answers(s, row, ntk, c.row.posthoc, &beyond, Bin::Beyond) },
            Term { coef: -1.0, values: answers(s, base, ntk, c.baseline.posthoc, &beyond, Bin::Beyond) },
        ];
        let rope = if ntk { "NTK" } else { "plain" };
        match stats::contrast(&terms, None) {
            Ok(con) => {
                let (v, why) = rule.judge(&con.interval);
                let note = con
                    .note(|k| describe(if k == 0 { &c.row } else { &c.baseline }))
                    .map_or(String::new(), |n| format!("; {n}"));
                parts.push(format!(
                    "**{}** under {rope} RoPE ({} points; {why}; {} seeds x {} questions{note})",
                    v.word(),
                    points(&con.interval),
                    con.seeds.len(),
                    con.spans
                ));
                readings.push((ntk, con.interval, v));
            }
            Err(e) => parts.push(format!("not judged under {rope} RoPE: {e}")),
        }
    }
    Judged {
        name: c.name.clone(),
        readings,
        line: format!(
            "{head} (accuracy beyond the training length, {}x-{}x prompts): {}.",
            beyond.first().unwrap_or(&1),
            beyond.last().unwrap_or(&1),
            parts.join("; ")
        ),
    }
}

/// An interval of a share as percentage points.
fn points(i: &Interval) -> String {
    format!("{:+.1} [{:+.1}, {:+.1}]", 100.0 * i.estimate, 100.0 * i.lo, 100.0 * i.hi)
}

fn pct(i: &Interval) -> String {
    format!("{:.1}% [{:.1}, {:.1}]", 100.0 * i.estimate, 100.0 * i.lo, 100.0 * i.hi)
}

/// The section: what ran, the gate table, accuracy per length and bin under both RoPE treatments, the
/// figures.
pub fn section(
    md: &mut String,
    e: &Experiment,
    results: Option<&(Settings, BTreeMap<String, Vec<SeedRun>>)>,
    figures: Figures<'_>,
) -> Result<()> {
    let Some((s, results)) = results else {
        let _ = writeln!(md, "Not run in this invocation (select it with `--only {}`).", super::ONLY);
        return Ok(());
    };
    let _ = writeln!(
        md,
        "Task: {} keys of {} values each; a sequence asks {} of them, and {:.0}% of its background are distractors (needles of the other keys), the rest filler from {} ids. Models: {} transformer blocks of width {} with {} attention heads, trained from scratch at T_train = {} for {} steps of {} windows (AdamW, lr {}, answers supervised), {} seeds per trained row. Evaluation: {} prompts per length with {} questions each (beyond 1x, half with the needle inside the last T_train tokens and half beyond), the same prompts for every model; chance is {:.1}%. Gate: {:.0}% at 1x on every seed.\n",
        s.keys,
        s.values,
        s.asked,
        s.density_permille as f64 / 10.0,
        s.filler,
        s.n_layer,
        s.d_model,
        s.n_head,
        s.t_train,
        s.steps,
        s.batch,
        s.lr,
        s.seeds,
        s.prompts,
        s.asked,
        100.0 / s.values as f64,
        100.0 * s.gate
    );
    let _ = writeln!(md, "| row | trained as | seeds | answer loss (train) | 1x accuracy by seed | gate |");
    let _ = writeln!(md, "|---|---|---:|---:|---|---|");
    for r in &e.rows {
        let rr = RowRef { train: r.train.clone(), posthoc: r.posthoc };
        let Some(runs) = row_runs(results, &rr) else {
            let _ = writeln!(md, "| {} | {} | 0 | - | - | not run |", r.label, describe(&rr));
            continue;
        };
        let by_seed: Vec<String> = runs
            .iter()
            .map(|x| x.get(true, r.posthoc, 1).map_or("-".into(), |a| format!("{:.1}%", 100.0 * share(&a.correct))))
            .collect();
        let loss = runs.iter().map(|x| x.train_loss).sum::<f64>() / runs.len() as f64;
        let gate = if passes(s, runs, r.posthoc) { "passed" } else { "**not learnt**: reported, not judged" };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {loss:.3} | {} | {gate} |",
            r.label,
            describe(&rr),
            runs.len(),
            by_seed.join(", ")
        );
    }
    let _ = writeln!(md);
    for ntk in [true, false] {
        let rope = if ntk { "NTK-scaled" } else { "plain" };
        let _ = writeln!(
            md,
            "Accuracy with {rope} RoPE beyond 1x (mean over seeds and questions, 95% interval over both):\n"
        );
        let mut head = String::from("| row | 1x |");
        let mut rule = String::from("|---|---:|");
        for &m in s.multiples.iter().filter(|&&m| m > 1) {
            let _ = write!(head, " {m}x inside | {m}x beyond |");
            rule.push_str("---:|---:|");
        }
        let _ = writeln!(md, "{head}\n{rule}");
        let mut series: Vec<GapSeries> = Vec::new();
        for (i, r) in e.rows.iter().enumerate() {
            let Some(runs) = row_runs(results, &RowRef { train: r.train.clone(), posthoc: r.posthoc }) else {
                continue;
            };
            let cell = |m: usize, bin| accuracy(answers(s, runs, ntk, r.posthoc, &[m], bin));
            let show = |x: Option<Interval>| x.map_or("-".into(), |i| pct(&i));
            let _ = write!(md, "| {} | {} |", r.label, show(cell(1, Bin::Inside)));
            let (mut inside, mut beyond) = (Vec::new(), Vec::new());
            if let Some(one) = cell(1, Bin::Inside) {
                inside.push((1.0, one));
                beyond.push((1.0, one));
            }
            for &m in s.multiples.iter().filter(|&&m| m > 1) {
                let (a, b) = (cell(m, Bin::Inside), cell(m, Bin::Beyond));
                let _ = write!(md, " {} | {} |", show(a), show(b));
                inside.extend(a.map(|x| (m as f64, x)));
                beyond.extend(b.map(|x| (m as f64, x)));
            }
            let _ = writeln!(md);
            series.push((format!("{} (beyond)", r.label), i, false, beyond));
            series.push((format!("{} (inside, dashed)", r.label), i, true, inside));
        }
        let name = format!("{}_{}", e.name, if ntk { "ntk" } else { "plain" });
        save_intervals(
            &figures.dir.join(&name),
            &format!("Recall accuracy against prompt length, {rope} RoPE (needle inside / beyond T_train)"),
            ("prompt length / training length", "accuracy"),
            false,
            &series,
        )?;
        let _ = writeln!(
            md,
            "\n![{} ({rope} RoPE)]({}/{name}.png) ([SVG]({}/{name}.svg))\n",
            e.title, figures.rel, figures.rel
        );
    }
    let _ = writeln!(
        md,
        "Solid lines: questions whose needle sits at least T_train tokens back (further than any training window); dashed: within the last T_train tokens. At 1x every needle is inside."
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retrieval::Answers;

    fn run(seed_index: usize, gate_hits: usize, beyond_hits: usize) -> SeedRun {
        let n = 64;
        let mk = |multiple: usize, ntk: bool, hits: usize, distance: u32| Answers {
            ntk,
            posthoc: None,
            multiple,
            correct: (0..n).map(|i| i < hits).collect(),
            distance: vec![distance; n],
        };
        SeedRun {
            variant: "v".into(),
            seed_index,
            train_loss: 0.1,
            train_s: 1.0,
            eval_s: 1.0,
            answers: vec![mk(1, true, gate_hits, 10), mk(4, true, beyond_hits, 100), mk(4, false, beyond_hits, 100)],
        }
    }

    fn claim() -> RetrievalClaim {
        RetrievalClaim {
            name: "retrieval-lssar".into(),
            statement: "LSSAR beats softmax".into(),
            row: RowRef { train: "lssa+rw15".into(), posthoc: None },
            baseline: RowRef { train: "softmax".into(), posthoc: None },
            delta: 0.05,
        }
    }

    #[test]
    fn a_claim_needs_the_gate_then_reads_the_paired_difference_beyond_t_train() {
        let s = Settings { multiples: vec![1, 4], seeds: 3, ..Settings::for_scale("small") };
        let mut m = BTreeMap::new();
        m.insert("lssa+rw15".to_string(), (0..3).map(|k| run(k, 64, 60 - k)).collect::<Vec<_>>());
        m.insert("softmax".to_string(), (0..3).map(|k| run(k, 64, 20 + 2 * k)).collect::<Vec<_>>());
        let j = judge(&s, &claim(), &m);
        assert_eq!(j.readings.len(), 2, "{}", j.line);
        for (_, i, v) in &j.readings {
            assert_eq!(*v, Verdict::Reproduced, "{}", j.line);
            // Seeds: 60/64 - 20/64, 59/64 - 22/64, 58/64 - 24/64.
            assert!((i.estimate - (40.0 + 37.0 + 34.0) / 3.0 / 64.0).abs() < 1e-12, "{i:?}");
        }
        // Equal rows: no effect.
        m.insert("softmax".to_string(), m["lssa+rw15"].clone());
        assert!(judge(&s, &claim(), &m).readings.iter().all(|(_, _, v)| *v == Verdict::Inconclusive));
        // A seed below the gate: not judged, and the line names the row and its 1x numbers.
        m.insert("softmax".to_string(), vec![run(0, 64, 20), run(1, 32, 20), run(2, 64, 20)]);
        let j = judge(&s, &claim(), &m);
        assert!(
            j.readings.is_empty() && j.line.contains("`softmax` did not learn") && j.line.contains("50.0%"),
            "{}",
            j.line
        );
    }

    #[test]
    fn bins_split_questions_at_the_training_length() {
        let s = Settings { multiples: vec![1, 4], ..Settings::for_scale("small") };
        let mut r = run(0, 64, 32);
        r.answers[1].distance = (0..64).map(|i| if i < 16 { 63 } else { 64 }).collect();
        let inside = answers(&s, std::slice::from_ref(&r), true, None, &[4], Bin::Inside);
        let beyond = answers(&s, std::slice::from_ref(&r), true, None, &[4], Bin::Beyond);
        assert_eq!((inside[&0].len(), beyond[&0].len()), (16, 48));
        assert_eq!(inside[&0].iter().sum::<f64>(), 16.0, "the first 16 questions were answered");
        let acc = accuracy(beyond).unwrap();
        assert!((acc.estimate - 16.0 / 48.0).abs() < 1e-12);
    }
}
