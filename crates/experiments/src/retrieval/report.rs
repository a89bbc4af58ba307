//! The retrieval benchmark's verdicts and report section, regime by regime: accuracy per (RoPE
//! treatment, prompt length, distance bin) with 95% intervals over seeds and questions
//! ([`crate::stats::contrast`] on 0/1 answers), exact recall (the headline) and the key-conditional
//! score beside it, the gate at 1x, a figure per regime, the `[[retrieval]]` claims of
//! `defs/claims.toml` judged on identical questions seed by seed in every regime, and one robustness
//! line per claim and RoPE treatment that says whether its verdict holds in every regime.

use std::collections::BTreeMap;

use anyhow::Result;

use super::{Regime, RegimeRuns, SeedRun, Settings};
use crate::claims::{RetrievalClaim, RowRef};
use crate::doc::{Align, Block, Figure, Item, Section, Table};
use crate::family::Counted;
use crate::plot::{GapSeries, save_intervals};
use crate::post::Figures;
use crate::spec::Experiment;
use crate::stats::{self, Evidence, Interval, Judgement, Rule, Term, Verdict};

/// Which questions a reading takes, by the distance from needle to question.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bin {
    /// Distance below the training length: a hop any training window had.
    Inside,
    /// Distance at least the training length: further back than training ever asked.
    Beyond,
}

/// How a question is scored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Score {
    /// The answer is the argmax over the whole vocabulary (the headline score).
    Exact,
    /// The answer scores highest among its key's values (chance 1 in `values`).
    KeyConditional,
}

/// Share of `true`.
pub fn share(xs: &[bool]) -> f64 {
    xs.iter().filter(|&&x| x).count() as f64 / xs.len().max(1) as f64
}

/// Per seed index, the 0/1 answers of `runs` under `(ntk, posthoc)` at `multiples` whose distance
/// falls in `bin`, scored as `score`, concatenated in a fixed order (the same questions for every
/// model of a regime).
pub fn answers(
    s: &Settings,
    runs: &[SeedRun],
    (ntk, posthoc): (bool, Option<u32>),
    multiples: &[usize],
    bin: Bin,
    score: Score,
) -> BTreeMap<usize, Vec<f64>> {
    let t = s.t_train as u32;
    runs.iter()
        .filter_map(|r| {
            let mut v = Vec::new();
            for &m in multiples {
                let a = r.get(ntk, posthoc, m)?;
                let scored = if score == Score::Exact { &a.exact } else { &a.correct };
                for (&c, &d) in scored.iter().zip(&a.distance) {
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

fn row_runs<'a>(results: &'a BTreeMap<String, Vec<SeedRun>>, r: &RowRef) -> Option<&'a [SeedRun]> {
    results.get(r.train.as_str()).map(Vec::as_slice).filter(|x| !x.is_empty())
}

/// A seed's 1x accuracy under a row's post-hoc power, scored as `score`.
fn one_x(r: &SeedRun, posthoc: Option<u32>, score: Score) -> Option<f64> {
    let a = r.get(true, posthoc, 1)?;
    Some(share(if score == Score::Exact { &a.exact } else { &a.correct }))
}

/// Whether every seed of a row (post-hoc rows read their model's 1x answers under the power) reaches
/// the gate in exact recall.
fn passes(s: &Settings, runs: &[SeedRun], posthoc: Option<u32>) -> bool {
    runs.len() >= s.seeds.min(2) && runs.iter().all(|r| one_x(r, posthoc, Score::Exact).is_some_and(|a| a >= s.gate))
}

/// One reading of a retrieval claim in one regime: a RoPE treatment.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    /// NTK-scaled RoPE (`false`: plain).
    pub ntk: bool,
    /// The difference in exact recall beyond the training length, with its 95% interval.
    pub interval: Interval,
    /// Its estimate, standard error and degrees of freedom.
    pub evidence: Evidence,
    /// The verdict on it.
    pub judgement: Judgement,
    /// The same difference in key-conditional accuracy (reported, not judged).
    pub key_conditional: Option<Interval>,
    /// Seeds read.
    pub seeds: usize,
    /// Questions per seed.
    pub questions: usize,
    /// Which seeds a missing result left out, if any.
    pub note: Option<String>,
}

/// A retrieval claim in one regime (a task cell: a regime and the initialisation its models had).
#[derive(Clone, Debug, PartialEq)]
pub struct RegimeVerdict {
    /// The cell's name (`spread-0`, `spread-0@torch-default`).
    pub regime: String,
    /// The initialisation of the cell's models (its recipe, beside the language models' AdamW).
    pub init: gpt_model::Init,
    /// Its readings (empty when `not_judged` says why).
    pub readings: Vec<Reading>,
    /// Why it could not be judged there.
    pub not_judged: Option<String>,
}

/// A judged retrieval claim, regime by regime.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    /// The claim.
    pub claim: RetrievalClaim,
    /// Its verdicts in every regime, in the regimes' order.
    pub regimes: Vec<RegimeVerdict>,
    /// The prompt lengths beyond 1x it reads.
    pub beyond: Vec<usize>,
}

fn rope_name(ntk: bool) -> &'static str {
    if ntk { "NTK" } else { "plain" }
}

impl Judged {
    /// The robustness line under one RoPE treatment: `<verdict> in every regime` (`in every regime
    /// and recipe` when the cells span several initialisations), or `depends on the regime` (`on the
    /// regime or recipe`) with each cell's verdict.
    pub fn robustness(&self, ntk: bool) -> String {
        let each: Vec<(&str, Option<Verdict>)> = self
            .regimes
            .iter()
            .map(|g| (g.regime.as_str(), g.readings.iter().find(|r| r.ntk == ntk).map(|r| r.judgement.verdict)))
            .collect();
        let recipes = self.regimes.iter().any(|g| g.init != self.regimes[0].init);
        let (every, depends) = if recipes {
            ("in every regime and recipe", "on the regime or recipe")
        } else {
            ("in every regime", "on the regime")
        };
        match each.first() {
            Some((_, Some(v))) if each.iter().all(|(_, w)| *w == Some(*v)) => format!("{} {every}", v.word()),
            _ => format!(
                "depends {depends}: {}",
                each.iter()
                    .map(|(g, v)| format!("{g} {}", v.map_or("not judged", Verdict::word)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The report's summary line: the claim and its robustness under both RoPE treatments.
    pub fn line(&self) -> String {
        format!(
            "**{}**: {} (exact recall beyond the training length, {}x-{}x prompts): under NTK RoPE, {}; under plain RoPE, {}.",
            self.claim.name,
            self.claim.statement,
            self.beyond.first().unwrap_or(&1),
            self.beyond.last().unwrap_or(&1),
            self.robustness(true),
            self.robustness(false)
        )
    }

    /// Its readings as counted verdicts of the report's family.
    pub fn counted(&self) -> Vec<Counted> {
        let mut out = Vec::new();
        for g in &self.regimes {
            for r in &g.readings {
                let term =
                    |row: &RowRef| format!("retrieval {}: {} ({} RoPE)", g.regime, describe(row), rope_name(r.ntk));
                out.push(Counted {
                    claim: self.claim.name.clone(),
                    reading: format!("{}, {}", g.regime, rope_name(r.ntk)),
                    evidence: Some((r.interval, r.evidence)),
                    judgement: r.judgement.clone(),
                    terms: vec![(term(&self.claim.row), 1.0), (term(&self.claim.baseline), -1.0)],
                });
            }
        }
        out
    }
}

fn describe(r: &RowRef) -> String {
    match r.posthoc {
        Some(p) => format!("`{}` with p = {p} post hoc", r.train),
        None => format!("`{}`", r.train),
    }
}

/// The summary's line on the regimes without distractors, the nearest to the paper's own passkey
/// retrieval (one needle in filler text): each claim's verdicts there. `None` when no regime is
/// free of distractors.
pub fn passkey_line(groups: &[RegimeRuns], judged: &[Judged]) -> Option<String> {
    let clean: Vec<&str> =
        groups.iter().filter(|g| g.regime.distractors_permille == 0).map(|g| g.regime.name.as_str()).collect();
    if clean.is_empty() {
        return None;
    }
    let parts: Vec<String> = judged
        .iter()
        .map(|j| {
            let each: Vec<String> = j
                .regimes
                .iter()
                .filter(|g| clean.contains(&g.regime.as_str()))
                .map(|g| {
                    let v = |ntk| {
                        g.readings.iter().find(|r| r.ntk == ntk).map_or("not judged", |r| r.judgement.verdict.word())
                    };
                    format!("{} {} / {}", g.regime, v(true), v(false))
                })
                .collect();
            format!("`{}`: {}", j.claim.name, each.join(", "))
        })
        .collect();
    Some(format!(
        "Nearest the paper's own retrieval task (passkey retrieval: one needle in filler text, no distractors of its kind) are the regimes without distractors, {}; there the retrieval verdicts read (NTK / plain RoPE): {}.",
        clean.iter().map(|c| format!("`{c}`")).collect::<Vec<_>>().join(" and "),
        parts.join("; ")
    ))
}

/// Every `[[retrieval]]` claim of `defs/claims.toml`, judged in every regime of `groups`.
pub fn verdicts(groups: &[RegimeRuns]) -> Result<Vec<Judged>> {
    let claims = crate::claims::all()?.retrieval;
    Ok(claims
        .into_iter()
        .map(|c| {
            let regimes = groups.iter().map(|g| judge(&g.settings, &c, &g.runs, &g.regime)).collect();
            let beyond = groups
                .first()
                .map(|g| g.settings.multiples.iter().copied().filter(|&m| m > 1).collect())
                .unwrap_or_default();
            Judged { claim: c, regimes, beyond }
        })
        .collect())
}

fn judge(s: &Settings, c: &RetrievalClaim, results: &BTreeMap<String, Vec<SeedRun>>, cell: &Regime) -> RegimeVerdict {
    let (regime, init) = (cell.name.clone(), cell.init());
    let not_judged =
        |why: String| RegimeVerdict { regime: regime.clone(), init, readings: Vec::new(), not_judged: Some(why) };
    let (Some(row), Some(base)) = (row_runs(results, &c.row), row_runs(results, &c.baseline)) else {
        return not_judged("its rows did not run".into());
    };
    let failing: Vec<String> = [(&c.row, row), (&c.baseline, base)]
        .iter()
        .filter(|(r, runs)| !passes(s, runs, r.posthoc))
        .map(|(r, runs)| {
            let by_seed: Vec<String> = runs
                .iter()
                .map(|x| one_x(x, r.posthoc, Score::Exact).map_or("-".into(), |a| format!("{:.1}%", 100.0 * a)))
                .collect();
            format!("{} did not learn the task (1x exact recall by seed: {})", describe(r), by_seed.join(", "))
        })
        .collect();
    if !failing.is_empty() {
        return not_judged(format!("{} (gate: {:.0}% on every seed)", failing.join(" and "), 100.0 * s.gate));
    }
    let beyond: Vec<usize> = s.multiples.iter().copied().filter(|&m| m > 1).collect();
    let rule = Rule::Effect { delta: c.delta };
    let mut readings = Vec::new();
    let mut errors = Vec::new();
    for ntk in [true, false] {
        let difference = |score| {
            let terms = [
                Term { coef: 1.0, values: answers(s, row, (ntk, c.row.posthoc), &beyond, Bin::Beyond, score) },
                Term { coef: -1.0, values: answers(s, base, (ntk, c.baseline.posthoc), &beyond, Bin::Beyond, score) },
            ];
            stats::contrast(&terms, None)
        };
        match difference(Score::Exact) {
            Ok(con) => {
                let evidence = con.evidence();
                readings.push(Reading {
                    ntk,
                    interval: con.interval,
                    evidence,
                    judgement: rule.judge(&evidence),
                    key_conditional: difference(Score::KeyConditional).ok().map(|k| k.interval),
                    seeds: con.seeds.len(),
                    questions: con.spans,
                    note: con.note(|k| describe(if k == 0 { &c.row } else { &c.baseline })),
                });
            }
            Err(e) => errors.push(format!("not judged under {} RoPE: {e}", rope_name(ntk))),
        }
    }
    RegimeVerdict { regime, init, readings, not_judged: (!errors.is_empty()).then(|| errors.join("; ")) }
}

/// An interval of a share as percentage points.
pub fn points(i: &Interval) -> String {
    format!("{:+.1} [{:+.1}, {:+.1}]", 100.0 * i.estimate, 100.0 * i.lo, 100.0 * i.hi)
}

fn pct(i: &Interval) -> String {
    format!("{:.1}% [{:.1}, {:.1}]", 100.0 * i.estimate, 100.0 * i.lo, 100.0 * i.hi)
}

/// The section: the task, the regimes, then per regime (a subsection) its gate table, exact recall per
/// length and bin under both RoPE treatments, key-conditional accuracy beside it, its figure and its
/// verdicts; last, every claim's verdicts across the regimes with its robustness lines.
pub fn section(e: &Experiment, groups: Option<&[RegimeRuns]>, figures: Figures<'_>) -> Result<Vec<Block>> {
    let Some(groups) = groups.filter(|g| !g.is_empty()) else {
        return Ok(vec![Block::Text(format!("Not run in this invocation (select it with `--only {}`).", super::ONLY))]);
    };
    let mut blocks = vec![
        Block::Text(task_text(&groups[0].settings)),
        Block::Text(recipe_text(groups)),
        Block::from("Regimes (`crates/experiments/defs/retrieval/regimes.toml`):"),
        Block::Table(regimes_table(e, groups)),
    ];
    let judged = verdicts(groups)?;
    for g in groups {
        blocks.push(Block::Section(regime_section(e, g, &judged, figures)?));
    }
    blocks.push(Block::Section(across_section(groups, &judged)));
    Ok(blocks)
}

/// The task, the models, the evaluation and the scores, in words.
fn task_text(s: &Settings) -> String {
    format!(
        "Task: {} keys of {} values each; a sequence asks {} of them; the background is filler from {} ids and, in the regimes with distractors, needles of the other keys. Models: {} transformer blocks of width {} with {} attention heads, trained from scratch at T_train = {} for {} steps of {} windows (peak lr {}, {} warm-up steps, cosine to a tenth; answers supervised), {} seeds per trained row and regime. Evaluation: {} prompts per length with {} questions each, the same prompts for every model of a regime. Scores: **exact recall** (the answer is the argmax over the whole vocabulary of {} tokens; the verdicts read it) and the key-conditional score (the answer scores highest among its key's {} values; chance {:.1}%). Gate: {:.0}% exact recall at 1x on every seed.",
        s.keys,
        s.values,
        s.asked,
        s.filler,
        s.n_layer,
        s.d_model,
        s.n_head,
        s.t_train,
        s.steps,
        s.batch,
        s.lr,
        s.warmup,
        s.seeds,
        s.prompts,
        s.asked,
        s.layout().map_or(0, |l| l.vocab()),
        s.values,
        100.0 / s.values as f64,
        100.0 * s.gate
    )
}

/// The recipes the models were trained with, read from their results (not from the settings that
/// asked for them): the optimiser once when every model shares it, and which cells used which
/// initialisation.
fn recipe_text(groups: &[RegimeRuns]) -> String {
    let mut optimisers: Vec<String> = Vec::new();
    let mut inits: Vec<(gpt_model::Init, Vec<String>)> = Vec::new();
    for g in groups {
        for r in g.runs.values().flatten() {
            let o = r.recipe.describe();
            if !optimisers.contains(&o) {
                optimisers.push(o);
            }
            match inits.iter_mut().find(|(i, _)| *i == r.recipe.init) {
                Some((_, cells)) if cells.contains(&g.regime.name) => {}
                Some((_, cells)) => cells.push(g.regime.name.clone()),
                None => inits.push((r.recipe.init, vec![g.regime.name.clone()])),
            }
        }
    }
    let inits: Vec<String> = inits
        .iter()
        .map(|(i, cells)| {
            let names: Vec<String> = cells.iter().map(|c| format!("`{c}`")).collect();
            format!("`{i}` in {}", names.join(", "))
        })
        .collect();
    format!(
        "Recipe, as recorded by the trained models: {}. Initialisation (`model.init`; `gpt2`: normal(0, 0.02) with the residual projections scaled by 1/sqrt(2 n_layer) and zero biases; `torch-default`: every linear layer uniform in +-1/sqrt(fan_in) as PyTorch's `nn.Linear`, the embedding normal(0, 0.02)): {}.",
        optimisers.join("; or "),
        inits.join("; ")
    )
}

/// The regimes: placement, distractor density, whether the ablation rows ran there (or run only
/// with `--all`, or nowhere in that cell), what it is.
fn regimes_table(e: &Experiment, groups: &[RegimeRuns]) -> Table {
    let mut t = Table::new([
        ("regime", Align::Left),
        ("placement", Align::Left),
        ("distractors", Align::Right),
        ("ablation rows", Align::Left),
        ("what", Align::Left),
    ]);
    for g in groups {
        let ablations = e.rows.iter().filter(|r| r.ablation).all(|r| g.runs.contains_key(r.train.as_str()));
        t.row(vec![
            format!("`{}`", g.regime.name),
            g.regime.placement.name().to_string(),
            // Per mille to a whole percent, rounded half up (every regime's is a multiple of 10).
            format!("{}%", (g.regime.distractors_permille + 5) / 10),
            // The ablation rows run in GPT-2's cells only (`retrieval::plans`): elsewhere `--all`
            // does not run them either.
            match (ablations, g.regime.init()) {
                (true, _) => "run",
                (false, super::Init::Gpt2) => "`--all` only",
                (false, _) => "not run (GPT-2's initialisation only)",
            }
            .to_string(),
            g.regime.about.clone(),
        ]);
    }
    t
}

/// Every claim's verdicts across the regimes, and its robustness lines.
fn across_section(groups: &[RegimeRuns], judged: &[Judged]) -> Section {
    let mut s = Section::new("Retrieval verdicts across the regimes");
    s.push(
        "Exact recall beyond the training length, row minus baseline in percentage points (95% interval over seeds and questions), in every regime (and, where a regime's models were also trained with another initialisation, in that cell: `<regime>@<init>`); the key-conditional difference in parentheses. Each claim's robustness line says whether its verdict holds in every cell.",
    );
    let mut t = Table::new([("claim", Align::Left), ("RoPE", Align::Left)]);
    for g in groups {
        t.column(g.regime.name.clone(), Align::Left);
    }
    for j in judged {
        for ntk in [true, false] {
            let cells = j.regimes.iter().map(|g| match g.readings.iter().find(|r| r.ntk == ntk) {
                Some(r) => format!(
                    "**{}**: {}{}",
                    r.judgement.verdict.word(),
                    points(&r.interval),
                    r.key_conditional.map_or(String::new(), |k| format!(" ({})", points(&k)))
                ),
                None => "not judged".into(),
            });
            t.row([format!("**{}**", j.claim.name), rope_name(ntk).to_string()].into_iter().chain(cells).collect());
        }
    }
    s.push(t);
    let lines: Vec<Item> = judged
        .iter()
        .map(|j| Item {
            text: j.line(),
            sub: j
                .regimes
                .iter()
                .filter_map(|g| g.not_judged.as_ref().map(|why| format!("not judged in `{}`: {why}.", g.regime)))
                .collect(),
        })
        .collect();
    if !lines.is_empty() {
        s.push(Block::List(lines));
    }
    s
}

/// A row of a regime's tables: its index among the experiment's rows, the row, its seeds' results.
type RowRuns<'a> = (usize, &'a crate::spec::Row, &'a [SeedRun]);

/// A regime's gate table: each row's seeds, training loss, 1x exact recall by seed, 1x key-conditional
/// accuracy, and whether it passed the gate.
fn gate_table(s: &Settings, rows: &[RowRuns<'_>]) -> Table {
    let mut t = Table::new([
        ("row", Align::Left),
        ("trained as", Align::Left),
        ("seeds", Align::Right),
        ("answer loss (train)", Align::Right),
        ("1x exact recall by seed", Align::Left),
        ("1x key-conditional", Align::Right),
        ("gate", Align::Left),
    ]);
    for &(_, r, runs) in rows {
        let rr = RowRef { train: r.train.clone(), posthoc: r.posthoc };
        let by_seed: Vec<String> = runs
            .iter()
            .map(|x| one_x(x, r.posthoc, Score::Exact).map_or("-".into(), |a| format!("{:.1}%", 100.0 * a)))
            .collect();
        let key: Vec<f64> = runs.iter().filter_map(|x| one_x(x, r.posthoc, Score::KeyConditional)).collect();
        let loss = runs.iter().map(|x| x.train_loss).sum::<f64>() / runs.len() as f64;
        let gate = if passes(s, runs, r.posthoc) { "passed" } else { "**not learnt**: reported, not judged" };
        t.row(vec![
            r.label.clone(),
            describe(&rr),
            runs.len().to_string(),
            format!("{loss:.3}"),
            by_seed.join(", "),
            format!("{:.1}%", 100.0 * key.iter().sum::<f64>() / key.len().max(1) as f64),
            gate.to_string(),
        ]);
    }
    t
}

/// Exact recall under one RoPE treatment per (length, bin) that some row has questions in, with each
/// row's figure series (1x and beyond) appended to `series`.
fn recall_table(s: &Settings, rows: &[RowRuns<'_>], ntk: bool, series: &mut Vec<GapSeries>) -> Table {
    let mut columns: Vec<(usize, Bin)> = vec![(1, Bin::Inside)];
    for m in s.multiples.iter().copied().filter(|&m| m > 1) {
        for bin in [Bin::Inside, Bin::Beyond] {
            if rows.iter().any(|&(_, r, runs)| !answers(s, runs, (ntk, r.posthoc), &[m], bin, Score::Exact).is_empty())
            {
                columns.push((m, bin));
            }
        }
    }
    let mut t = Table::new([("row", Align::Left)]);
    for &(m, bin) in &columns {
        let name = match (m, bin) {
            (1, _) => "1x".to_string(),
            (m, Bin::Inside) => format!("{m}x inside"),
            (m, Bin::Beyond) => format!("{m}x beyond"),
        };
        t.column(name, Align::Right);
    }
    for &(i, r, runs) in rows {
        let mut cells = vec![r.label.clone()];
        let mut pts = Vec::new();
        for &(m, bin) in &columns {
            let x = accuracy(answers(s, runs, (ntk, r.posthoc), &[m], bin, Score::Exact));
            cells.push(x.map_or("-".into(), |i| pct(&i)));
            if let Some(x) = x.filter(|_| m == 1 || bin == Bin::Beyond) {
                pts.push((m as f64, x));
            }
        }
        t.row(cells);
        series.push((format!("{} ({})", r.label, rope_name(ntk)), i, !ntk, pts));
    }
    t
}

/// Key-conditional accuracy beyond the training length per length (NTK / plain).
fn key_table(s: &Settings, rows: &[RowRuns<'_>]) -> Table {
    let beyond: Vec<usize> = s.multiples.iter().copied().filter(|&m| m > 1).collect();
    let mut t = Table::new([("row", Align::Left)]);
    for &m in &beyond {
        t.column(format!("{m}x"), Align::Right);
    }
    for &(_, r, runs) in rows {
        let cells = beyond.iter().map(|&m| {
            let show = |ntk| {
                accuracy(answers(s, runs, (ntk, r.posthoc), &[m], Bin::Beyond, Score::KeyConditional))
                    .map_or("-".into(), |i| format!("{:.1}%", 100.0 * i.estimate))
            };
            format!("{} / {}", show(true), show(false))
        });
        t.row(std::iter::once(r.label.clone()).chain(cells).collect());
    }
    t
}

/// Each claim's verdicts in one regime, one item per claim.
fn regime_verdicts(regime: &str, judged: &[Judged]) -> Vec<Item> {
    let mut items = Vec::new();
    for j in judged {
        let Some(v) = j.regimes.iter().find(|v| v.regime == regime) else { continue };
        let parts: Vec<String> = v
            .readings
            .iter()
            .map(|r| {
                format!(
                    "**{}** under {} RoPE ({} points, SE {:.1}, df {:.0}; {}; {} seeds x {} questions{})",
                    r.judgement.verdict.word(),
                    rope_name(r.ntk),
                    points(&r.interval),
                    100.0 * r.evidence.se,
                    r.evidence.df,
                    r.judgement.why,
                    r.seeds,
                    r.questions,
                    r.note.as_ref().map_or(String::new(), |n| format!("; {n}"))
                )
            })
            .chain(v.not_judged.iter().map(|w| format!("not judged: {w}")))
            .collect();
        items.push(Item::from(format!("**{}**: {}: {}.", j.claim.name, j.claim.statement, parts.join("; "))));
    }
    items
}

/// One regime's subsection.
fn regime_section(e: &Experiment, g: &RegimeRuns, judged: &[Judged], figures: Figures<'_>) -> Result<Section> {
    let s = &g.settings;
    let mut sec = Section::new(format!("Regime `{}`", g.regime.name));
    sec.push(g.regime.about.clone());
    let rows: Vec<RowRuns<'_>> = e
        .rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| Some((i, r, row_runs(&g.runs, &RowRef { train: r.train.clone(), posthoc: r.posthoc })?)))
        .collect();
    sec.push(gate_table(s, &rows));
    let mut series: Vec<GapSeries> = Vec::new();
    for ntk in [true, false] {
        let rope = if ntk { "NTK-scaled" } else { "plain" };
        sec.push(format!("Exact recall with {rope} RoPE (mean over seeds and questions, 95% interval over both):"));
        sec.push(recall_table(s, &rows, ntk, &mut series));
    }
    sec.push("Key-conditional accuracy beyond the training length (mean over seeds and questions; NTK / plain):");
    sec.push(key_table(s, &rows));
    let name = format!("{}_{}", e.name, g.regime.name);
    save_intervals(
        &figures.dir.join(&name),
        &format!("Exact recall beyond T_train, regime {} (solid: NTK RoPE, dashed: plain)", g.regime.name),
        ("prompt length / training length", "exact recall, needle beyond T_train (1x: all)"),
        false,
        &series,
    )?;
    sec.push(Figure::drawn(format!("{} ({})", e.title, g.regime.name), figures.rel, &name));
    sec.push(format!("Verdicts in `{}`:", g.regime.name));
    let items = regime_verdicts(&g.regime.name, judged);
    if !items.is_empty() {
        sec.push(Block::List(items));
    }
    Ok(sec)
}

#[cfg(test)]
mod tests;
