//! The retrieval experiment: associative recall ([`trainer::data::recall`]) learnt in training and
//! asked beyond the training length.
//!
//! Every language model of the scale is trained with a share of recall sequences in its data
//! (`recall_share` in the scale's config), so the task is taught at `T_train`, on the model's own
//! training run. Evaluation asks each trained model (every seed) for the value of a key whose needle
//! sits at a fixed *distance* before the question, measured in multiples of `T_train`: beyond 1x the
//! model must attend further back than any training sequence allowed. Each prompt has distractor
//! needles with other keys, filler from the validation tokens, and is scored in one forward pass: the
//! answer is the highest-scoring of the asked key's [`VALUES`](trainer::data::recall::VALUES) candidate
//! tokens at the question (exact match), and the answer's log-probability among them shows partial skill.
//!
//! - Prompts are a function of the settings' seed, the length and the distance alone: every model and
//!   seed answers the same prompts, so differences between rows are paired.
//! - The gate: a model is said to have learnt the task when its accuracy at 1x (distances up to
//!   `T_train` in prompts of `T_train` tokens) reaches [`Settings::gate`]; a row whose seeds do not all
//!   pass is reported with its 1x number, and the verdict says it cannot be judged.
//! - The verdict on "LSSAR retrieves beyond `T_train` where softmax does not": the accuracy over every
//!   cell with a distance beyond 1x, LSSAR (trained with `p = 15`) minus softmax, with the
//!   reproduction's bootstrap over prompts and seeds ([`crate::stats`]), against an effect of
//!   [`EFFECT`] fixed in advance.
//! - NTK-scaled RoPE beyond 1x, as in the report's other long-length numbers.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::Tensor;

use gpt_model::ForwardOptions;
use trainer::data::recall::RecallTask;

use crate::plot::{Series, draw_grid, save_with};
use crate::post::{Figures, Inputs, PostTraining};
use crate::runner::run_dir_name;
use crate::scale::Scale;
use crate::spec::{Experiment, Kind};
use crate::stats::{Interval, Rule, Term, Verdict};

/// The least difference in accuracy beyond `T_train` (LSSAR minus softmax) that counts as the claim,
/// fixed before the runs.
pub const EFFECT: f64 = 0.2;

/// Sizes of the retrieval experiment at one scale.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Needle distances, in multiples of `T_train` (a distance of `d` is evaluated in prompts of at
    /// least `d x T_train` tokens; distance 1 in a 1x prompt is `T_train - 1`, the farthest that fits).
    pub distances: Vec<f64>,
    /// Prompts per (length, distance) cell.
    pub prompts: usize,
    /// Distractor needles per prompt.
    pub distractors: usize,
    /// Accuracy at 1x a model must reach to count as having learnt the task.
    pub gate: f64,
    /// Seed of the prompts.
    pub seed: u64,
}

impl Settings {
    /// `smoke`: a few prompts (the test suite); others: 64 prompts per cell.
    pub fn for_scale(scale: &str) -> Self {
        match scale {
            "smoke" => Settings { distances: vec![0.5, 1.0, 2.0], prompts: 4, distractors: 2, gate: 0.9, seed: 7 },
            _ => Settings {
                distances: vec![0.5, 1.0, 2.0, 4.0, 8.0, 15.0],
                prompts: 64,
                distractors: 3,
                gate: 0.9,
                seed: 7,
            },
        }
    }
}

/// The answers of one model at one (length, distance).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Prompt length, a multiple of `T_train`.
    pub multiple: usize,
    /// Needle distance, a multiple of `T_train`.
    pub distance: f64,
    /// Per prompt: whether the answer scored highest among the candidates.
    pub correct: Vec<bool>,
    /// Per prompt: the answer's log-probability among the candidates (`ln(1/8)` is chance).
    pub log_p: Vec<f64>,
}

impl Cell {
    /// Share of prompts answered.
    pub fn accuracy(&self) -> f64 {
        self.correct.iter().filter(|&&c| c).count() as f64 / self.correct.len().max(1) as f64
    }
}

/// One trained model's answers (one seed of a row).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    /// The seed index of the trained run.
    pub seed_index: usize,
    /// The recall share the model was trained with (0: it never saw the task).
    pub recall_share: f64,
    /// The cells, by length then distance.
    pub cells: Vec<Cell>,
    /// Evaluation time, seconds.
    pub wall_s: f64,
}

impl SeedResult {
    /// Accuracy at 1x (the gate's measure): every prompt of `T_train` tokens.
    pub fn gate_accuracy(&self) -> Option<f64> {
        pooled(self.cells.iter().filter(|c| c.multiple == 1))
    }
}

/// The retrieval results of one row (a trained variant, and a post-hoc power where the row has one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetrievalResult {
    /// Row label.
    pub label: String,
    /// The trained variant.
    pub variant: String,
    /// Post-hoc re-weighting power at evaluation.
    pub posthoc: Option<u32>,
    /// Settings it ran with (cached results are reused only for the same settings).
    pub settings: Settings,
    /// The lengths evaluated, multiples of `T_train`.
    pub multiples: Vec<usize>,
    /// One entry per trained seed.
    pub seeds: Vec<SeedResult>,
}

impl RetrievalResult {
    /// Whether every seed reached the gate at 1x.
    pub fn passes_gate(&self) -> bool {
        !self.seeds.is_empty() && self.seeds.iter().all(|s| s.gate_accuracy().is_some_and(|a| a >= self.settings.gate))
    }

    /// Correct answers and prompts over every seed at `(multiple, distance)`.
    pub fn counts_at(&self, multiple: usize, distance: f64) -> Option<(usize, usize)> {
        let cells: Vec<&Cell> = self
            .seeds
            .iter()
            .flat_map(|s| s.cells.iter().filter(|c| c.multiple == multiple && c.distance == distance))
            .collect();
        (!cells.is_empty()).then(|| {
            (
                cells.iter().map(|c| c.correct.iter().filter(|&&x| x).count()).sum(),
                cells.iter().map(|c| c.correct.len()).sum(),
            )
        })
    }

    /// Mean log-probability of the answer among its key's candidates over every seed and every
    /// prompt at 1x (the gate's prompts): partial skill below the gate (`ln(1/8)` is chance).
    pub fn gate_log_p(&self) -> Option<f64> {
        let xs: Vec<f64> = self
            .seeds
            .iter()
            .flat_map(|s| s.cells.iter().filter(|c| c.multiple == 1))
            .flat_map(|c| c.log_p.iter().copied())
            .collect();
        (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
    }

    /// Per seed, the 0/1 answers of every cell beyond `T_train` (distance > 1), in one fixed order:
    /// the values of a [`Term`] of the verdict.
    pub fn beyond(&self) -> Vec<Vec<f64>> {
        self.seeds
            .iter()
            .map(|s| {
                s.cells
                    .iter()
                    .filter(|c| c.distance > 1.0)
                    .flat_map(|c| c.correct.iter().map(|&x| if x { 1.0 } else { 0.0 }))
                    .collect()
            })
            .collect()
    }
}

fn pooled<'a>(cells: impl Iterator<Item = &'a Cell>) -> Option<f64> {
    let (mut hit, mut n) = (0usize, 0usize);
    for c in cells {
        hit += c.correct.iter().filter(|&&x| x).count();
        n += c.correct.len();
    }
    (n > 0).then(|| hit as f64 / n as f64)
}

/// The Wilson score interval (95%) of `hits` successes in `n` trials.
pub fn wilson(hits: usize, n: usize) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (z, n) = (1.959_963_984_540_054, n as f64);
    let p = hits as f64 / n;
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// The distance in tokens of a needle `distance x t_train` back in a prompt of `len` tokens, or
/// `None` when the cell does not exist (the distance exceeds the prompt's length).
pub fn distance_tokens(distance: f64, t_train: usize, len: usize) -> Option<usize> {
    let d = (distance * t_train as f64).round() as usize;
    (distance <= (len / t_train) as f64 && d >= 1).then(|| d.min(len - 1))
}

/// The prompts of one cell: a function of the settings' seed, the length and the distance alone.
fn cell_prompts(
    task: &RecallTask,
    settings: &Settings,
    filler: &[u16],
    len: usize,
    dist: usize,
) -> Result<Vec<trainer::data::recall::RecallPrompt>> {
    let mut rng = ChaCha8Rng::seed_from_u64(settings.seed);
    rng.set_stream(((len as u64) << 32) | dist as u64);
    (0..settings.prompts).map(|_| task.prompt(filler, len, dist, settings.distractors, &mut rng)).collect()
}

/// Evaluates seed `seed_index` of the trained `variant` for each of `rows` (`(label, post-hoc power)`).
fn eval_seed(
    scale: &Scale,
    out: &Path,
    variant: &str,
    seed_index: usize,
    multiples: &[usize],
    settings: &Settings,
    rows: &[(String, Option<u32>)],
) -> Result<Vec<SeedResult>> {
    let crate::runner::Trained { model, val, cfg, device, .. } =
        crate::runner::load_trained_seed(scale, out, variant, seed_index)?;
    let t = cfg.model.context_len;
    let task = RecallTask::for_vocab(cfg.model.vocab_size)?;
    let cells_n = multiples.len() * settings.distances.len();
    let work = crate::progress::Work::start(
        &format!("retrieval `{variant}` seed {seed_index}"),
        cells_n * rows.len(),
        "cells",
    );
    let mut out_rows = Vec::new();
    for (_, posthoc) in rows {
        let start = Instant::now();
        let mut cells = Vec::new();
        for &m in multiples {
            let len = m * t;
            let opts = ForwardOptions { length_scale: Some(m as f64), ntk: true, reweight: *posthoc, attn_impl: None };
            for &d in &settings.distances {
                work.inc();
                let Some(dist) = distance_tokens(d, t, len) else { continue };
                let prompts = cell_prompts(&task, settings, &val, len, dist)?;
                let (mut correct, mut log_p) = (Vec::new(), Vec::new());
                // Batches of about 8K tokens: the logits of a batch are `batch x len x vocab` floats.
                for chunk in prompts.chunks((8192 / len).max(1)) {
                    let ids: Vec<i64> = chunk.iter().flat_map(|p| p.tokens.iter().map(|&x| i64::from(x))).collect();
                    let idx = Tensor::from_slice(&ids).view([chunk.len() as i64, len as i64]).to(device);
                    let logits = tch::no_grad(|| model.forward(&idx, &opts))?;
                    // Each prompt's candidates: the asked key's values.
                    let cand: Vec<i64> =
                        chunk.iter().flat_map(|p| task.candidates(p.key).iter().map(|&c| i64::from(c))).collect();
                    let cand = Tensor::from_slice(&cand).view([chunk.len() as i64, -1]).to(device);
                    let last = logits.select(1, len as i64 - 1).gather(1, &cand, false).to_kind(tch::Kind::Double);
                    let lp = last.log_softmax(-1, tch::Kind::Double).to_device(tch::Device::Cpu);
                    let best = lp.argmax(-1, false);
                    for (i, p) in chunk.iter().enumerate() {
                        correct.push(best.int64_value(&[i as i64]) == p.answer_index as i64);
                        log_p.push(lp.double_value(&[i as i64, p.answer_index as i64]));
                    }
                }
                cells.push(Cell { multiple: m, distance: d, correct, log_p });
            }
        }
        out_rows.push(SeedResult {
            seed_index,
            recall_share: cfg.recall_share,
            cells,
            wall_s: start.elapsed().as_secs_f64(),
        });
    }
    Ok(out_rows)
}

/// Evaluates every trained seed of `variant` for each of `rows` (`(label, post-hoc power)`), at
/// `multiples` of the training length; results are cached under `out/retrieval`, one file per row,
/// reused only for the same settings, code and trained runs.
pub fn run(
    scale: &Scale,
    out: &Path,
    variant: &str,
    seeds: usize,
    multiples: &[usize],
    rows: &[(String, Option<u32>)],
) -> Result<Vec<RetrievalResult>> {
    ensure!(seeds >= 1, "no trained seed of `{variant}`");
    let settings = Settings::for_scale(scale.name);
    let cache_dir = out.join("retrieval");
    let cache = |label: &str| cache_dir.join(format!("{}.json", run_dir_name(label)));
    // The models it reads (their configs: seeds, scale, recall share) and the code.
    let configs: String = (0..seeds)
        .map(|s| {
            std::fs::read_to_string(crate::runner::run_dir(out, variant, s).join("result.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<crate::runner::RunResult>(&t).ok())
                .map_or_else(String::new, |r| r.config)
        })
        .collect();
    let provenance = format!("{} {}", crate::runner::task_revision(), crate::runner::fingerprint(&configs));
    #[derive(Deserialize, Serialize)]
    struct Cached {
        provenance: String,
        result: RetrievalResult,
    }
    let cached: Vec<Option<RetrievalResult>> = rows
        .iter()
        .map(|(label, _)| {
            std::fs::read_to_string(cache(label))
                .ok()
                .and_then(|t| serde_json::from_str::<Cached>(&t).ok())
                .filter(|c| c.provenance == provenance)
                .map(|c| c.result)
                .filter(|r| r.settings == settings && r.multiples == multiples && r.seeds.len() == seeds)
        })
        .collect();
    if cached.iter().all(Option::is_some) {
        crate::progress::say(&format!("retrieval, `{variant}`: cached in {}", cache_dir.display()));
        return Ok(cached.into_iter().flatten().collect());
    }
    let mut per_row: Vec<Vec<SeedResult>> = vec![Vec::new(); rows.len()];
    for s in 0..seeds {
        for (i, r) in eval_seed(scale, out, variant, s, multiples, &settings, rows)?.into_iter().enumerate() {
            per_row[i].push(r);
        }
    }
    std::fs::create_dir_all(&cache_dir).with_context(|| format!("creating {}", cache_dir.display()))?;
    let mut results = Vec::new();
    for ((label, posthoc), seeds) in rows.iter().zip(per_row) {
        let result = RetrievalResult {
            label: label.clone(),
            variant: variant.to_string(),
            posthoc: *posthoc,
            settings: settings.clone(),
            multiples: multiples.to_vec(),
            seeds,
        };
        let text = serde_json::to_string_pretty(&Cached { provenance: provenance.clone(), result: result.clone() })?;
        trainer::data::io::write_atomic(&cache(label), |w| w.write_all(text.as_bytes()))?;
        results.push(result);
    }
    Ok(results)
}

/// The name `--only` accepts for the retrieval experiment alone (it also trains its rows' models).
pub const ONLY: &str = "retrieval";

/// The retrieval experiment as a [`PostTraining`] kind: results by row label.
#[derive(Debug, Default)]
pub struct Experiments {
    /// Results by row label (empty until run).
    pub results: BTreeMap<String, RetrievalResult>,
}

impl PostTraining for Experiments {
    fn kind(&self) -> Kind {
        Kind::Retrieval
    }

    fn only_name(&self) -> Option<&'static str> {
        Some(ONLY)
    }

    fn run(&mut self, e: &Experiment, inputs: &Inputs<'_>) -> Result<()> {
        let mut by_variant: BTreeMap<&str, Vec<(String, Option<u32>)>> = BTreeMap::new();
        for r in &e.rows {
            by_variant.entry(r.train.as_str()).or_default().push((r.label.clone(), r.posthoc));
        }
        for (variant, rows) in by_variant {
            // Every seed that trained without error, from the first: seeds are paired by index.
            let seeds = inputs.results.get(variant).map_or(0, |r| r.iter().take_while(|s| s.error.is_none()).count());
            if seeds == 0 {
                crate::progress::say(&format!("retrieval: no trained `{variant}` model, its rows stay empty"));
                continue;
            }
            for res in run(inputs.scale, inputs.out, variant, seeds, &e.lengths, &rows)
                .with_context(|| format!("the retrieval experiment with `{variant}`"))?
            {
                crate::progress::say(&format!(
                    "retrieval `{}`: 1x accuracy by seed {:?}",
                    res.label,
                    res.seeds.iter().map(|s| s.gate_accuracy().unwrap_or(f64::NAN)).collect::<Vec<_>>()
                ));
                self.results.insert(res.label.clone(), res);
            }
        }
        Ok(())
    }

    fn wall_s(&self) -> f64 {
        self.results.values().flat_map(|r| &r.seeds).map(|s| s.wall_s).sum()
    }

    fn verdicts(&self) -> Vec<String> {
        verdict(&self.results).into_iter().map(|v| v.line).collect()
    }

    fn section(&self, md: &mut String, e: &Experiment, figures: Figures<'_>) -> Result<()> {
        section(md, e, &self.results, figures)
    }
}

/// The rows the verdict compares.
const LSSAR: &str = "LSSAR p=15 (train)";
const SOFTMAX: &str = "Softmax";

/// The retrieval verdict, in words, with its parts for tests.
#[derive(Clone, Debug, PartialEq)]
pub struct RetrievalVerdict {
    /// The verdict.
    pub verdict: Verdict,
    /// The accuracy difference beyond `T_train`, LSSAR minus softmax, when both rows passed the gate.
    pub interval: Option<Interval>,
    /// The report's line.
    pub line: String,
}

/// "LSSAR retrieves beyond `T_train` where softmax does not", judged when both rows ran.
pub fn verdict(results: &BTreeMap<String, RetrievalResult>) -> Option<RetrievalVerdict> {
    let (r, s) = (results.get(LSSAR)?, results.get(SOFTMAX)?);
    let claim = "**LSSAR retrieves beyond the training length where softmax does not**";
    let gate_of = |x: &RetrievalResult| {
        x.seeds
            .iter()
            .map(|s| s.gate_accuracy().map_or("-".into(), |a| format!("{:.0}%", 100.0 * a)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !(r.passes_gate() && s.passes_gate()) {
        let failed: Vec<String> = [r, s]
            .iter()
            .filter(|x| !x.passes_gate())
            .map(|x| format!("{} (1x accuracy by seed: {})", x.label, gate_of(x)))
            .collect();
        return Some(RetrievalVerdict {
            verdict: Verdict::Inconclusive,
            interval: None,
            line: format!(
                "{claim}: **inconclusive**: not judged, because {} did not learn the task at the training length (gate: {:.0}% at 1x on every seed).",
                failed.join(" and "),
                100.0 * r.settings.gate
            ),
        });
    }
    let (rv, sv) = (r.beyond(), s.beyond());
    let n = rv.len().min(sv.len());
    let terms = [Term { coef: 1.0, values: rv[..n].to_vec() }, Term { coef: -1.0, values: sv[..n].to_vec() }];
    let rule = Rule::Effect { delta: EFFECT };
    let line_of = |i: &Interval, v: Verdict, why: &str| {
        format!(
            "{claim}: **{}** {} (accuracy beyond 1x, LSSAR minus softmax, paired on {} prompts x {n} seeds; the claim needs at least {EFFECT}: {why}).",
            v.word(),
            i.show(),
            rv[0].len()
        )
    };
    match crate::stats::bootstrap(&terms, None, 0x5245_5452) {
        Ok(i) => {
            let (v, why) = rule.judge(&i);
            Some(RetrievalVerdict { verdict: v, interval: Some(i), line: line_of(&i, v, &why) })
        }
        Err(e) => Some(RetrievalVerdict {
            verdict: Verdict::Inconclusive,
            interval: None,
            line: format!("{claim}: **inconclusive**: {e}"),
        }),
    }
}

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

fn section(
    md: &mut String,
    e: &Experiment,
    retrieval: &BTreeMap<String, RetrievalResult>,
    figures: Figures<'_>,
) -> Result<()> {
    let (figures_dir, figures_rel) = (figures.dir, figures.rel);
    let Some(any) = e.rows.iter().find_map(|r| retrieval.get(&r.label)) else {
        let _ = writeln!(md, "Not run in this invocation (select it with `--only {ONLY}`).");
        return Ok(());
    };
    let s = &any.settings;
    let share = any.seeds.first().map_or(0.0, |x| x.recall_share);
    let _ = writeln!(
        md,
        "Training mix: {:.0}% of every model's training windows were recall sequences. Evaluation: {} prompts per cell and seed, {} distractor needles each, NTK RoPE; a cell is (prompt length, needle distance), both in multiples of T_train. Gate: {:.0}% accuracy at 1x on every seed.\n",
        100.0 * share,
        s.prompts,
        s.distractors,
        100.0 * s.gate
    );
    if share == 0.0 {
        let _ = writeln!(md, "**These models were trained without the recall mix**: they never saw the task.\n");
    }
    let longest = any.multiples.iter().copied().max().unwrap_or(1);
    let _ = write!(md, "| row | seeds | 1x accuracy (gate) | 1x answer log-prob |");
    for d in &s.distances {
        let _ = write!(md, " distance {d}x |");
    }
    let _ = writeln!(md);
    let _ = writeln!(md, "|---|---:|---|---:|{}", "---:|".repeat(s.distances.len()));
    let mut series: Vec<Series> = Vec::new();
    for (i, r) in e.rows.iter().enumerate() {
        let Some(res) = retrieval.get(&r.label) else {
            let _ = writeln!(md, "| {} | - | - | - |{}", r.label, " - |".repeat(s.distances.len()));
            continue;
        };
        let gates: Vec<String> = res.seeds.iter().map(|x| x.gate_accuracy().map_or("-".into(), pct)).collect();
        let gate = if res.passes_gate() { "passed" } else { "**not learnt**" };
        let log_p = res.gate_log_p().map_or("-".into(), |x| format!("{x:.2}"));
        let _ = write!(md, "| {} | {} | {gate}: {} | {log_p} |", r.label, res.seeds.len(), gates.join(", "));
        for &d in &s.distances {
            let cell = res.counts_at(longest, d).map_or("-".into(), |(hit, n)| {
                let (lo, hi) = wilson(hit, n);
                format!("{} [{}, {}]", pct(hit as f64 / n as f64), pct(lo), pct(hi))
            });
            let _ = write!(md, " {cell} |");
        }
        let _ = writeln!(md);
        series.push((
            r.label.clone(),
            i,
            r.posthoc.is_some(),
            s.distances
                .iter()
                .filter_map(|&d| res.counts_at(longest, d).map(|(hit, n)| (d, hit as f64 / n as f64)))
                .collect(),
        ));
        let name = format!("{}_{}", e.name, run_dir_name(&r.label));
        let acc = |m: usize, d: f64| res.counts_at(m, d).map_or(f64::NAN, |(hit, n)| hit as f64 / n as f64);
        draw_grid(
            &figures_dir.join(&name),
            &format!("{}: recall accuracy, all seeds", r.label),
            ("needle distance (x T_train)", "prompt length"),
            &res.multiples,
            &s.distances,
            &acc,
        )?;
    }
    let _ = writeln!(
        md,
        "\nCells: accuracy in prompts of {longest}x T_train over every seed, with its 95% Wilson interval; chance is {:.0}% (one of the asked key's {} tokens). The 1x answer log-prob is the mean log-probability of the answer among those tokens over the gate's prompts, in nats (chance {:.2}): partial skill below the gate shows there. The heat maps show every length.\n",
        100.0 / trainer::data::recall::VALUES as f64,
        trainer::data::recall::VALUES,
        -(trainer::data::recall::VALUES as f64).ln()
    );
    let name = format!("{}_accuracy", e.name);
    save_with(
        &figures_dir.join(&name),
        &format!("Recall accuracy against needle distance ({longest}x prompts, all seeds)"),
        ("needle distance / T_train (log scale)", "accuracy"),
        &series,
    )?;
    let _ = writeln!(md, "![{}]({figures_rel}/{name}.png) ([SVG]({figures_rel}/{name}.svg))\n", e.title);
    for r in e.rows.iter().filter(|r| retrieval.contains_key(&r.label)) {
        let name = format!("{}_{}", e.name, run_dir_name(&r.label));
        let _ = writeln!(md, "![{}]({figures_rel}/{name}.png)", r.label);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wilson_intervals_match_known_values() {
        // 50 of 50: the interval's lower end is 92.9% (a textbook value for n = 50).
        let (lo, hi) = wilson(50, 50);
        assert!((lo - 0.9287).abs() < 1e-3 && hi == 1.0, "{lo} {hi}");
        // 0 of 50 mirrors it.
        let (lo, hi) = wilson(0, 50);
        assert!(lo == 0.0 && (hi - 0.0713).abs() < 1e-3, "{lo} {hi}");
        // 32 of 64: symmetric about 0.5, half-width about 0.12.
        let (lo, hi) = wilson(32, 64);
        assert!((0.5 - lo - (hi - 0.5)).abs() < 1e-12 && (hi - lo - 0.2386).abs() < 2e-3, "{lo} {hi}");
    }

    #[test]
    fn distances_fit_their_prompts() {
        assert_eq!(distance_tokens(0.5, 64, 64), Some(32));
        assert_eq!(distance_tokens(1.0, 64, 64), Some(63), "the farthest that fits a 1x prompt");
        assert_eq!(distance_tokens(2.0, 64, 64), None, "no 2x distance in a 1x prompt");
        assert_eq!(distance_tokens(15.0, 64, 1024), Some(960));
        assert_eq!(distance_tokens(15.0, 64, 512), None);
    }

    fn result(label: &str, gate_hits: usize, beyond_hits: &[usize]) -> RetrievalResult {
        let settings = Settings::for_scale("small");
        let seeds = beyond_hits
            .iter()
            .enumerate()
            .map(|(s, &hits)| SeedResult {
                seed_index: s,
                recall_share: 0.1,
                cells: vec![
                    Cell {
                        multiple: 1,
                        distance: 0.5,
                        correct: (0..64).map(|i| i < gate_hits).collect(),
                        log_p: vec![-0.1; 64],
                    },
                    Cell {
                        multiple: 16,
                        distance: 8.0,
                        correct: (0..64).map(|i| i < hits).collect(),
                        log_p: vec![-1.0; 64],
                    },
                ],
                wall_s: 1.0,
            })
            .collect();
        RetrievalResult {
            label: label.into(),
            variant: "v".into(),
            posthoc: None,
            settings,
            multiples: vec![1, 16],
            seeds,
        }
    }

    #[test]
    fn the_verdict_needs_the_gate_then_reads_the_paired_difference() {
        let mut m = BTreeMap::new();
        m.insert(LSSAR.to_string(), result(LSSAR, 64, &[60, 58, 62]));
        m.insert(SOFTMAX.to_string(), result(SOFTMAX, 64, &[10, 12, 8]));
        let v = verdict(&m).unwrap();
        assert_eq!(v.verdict, Verdict::Reproduced, "{}", v.line);
        let i = v.interval.unwrap();
        assert!((i.estimate - (180.0 - 30.0) / 192.0).abs() < 1e-9 && i.lo > 0.5, "{i:?}");
        // The same accuracies both ways: no effect.
        m.insert(SOFTMAX.to_string(), result(SOFTMAX, 64, &[60, 58, 62]));
        let v = verdict(&m).unwrap();
        assert_eq!(v.verdict, Verdict::Inconclusive, "{}", v.line);
        // Softmax better: contradicted.
        m.insert(LSSAR.to_string(), result(LSSAR, 64, &[5, 8, 6]));
        assert_eq!(verdict(&m).unwrap().verdict, Verdict::Contradicted);
        // A row below the gate on one seed: not judged, and the line says which row and its numbers.
        m.insert(LSSAR.to_string(), result(LSSAR, 32, &[60, 58, 62]));
        let v = verdict(&m).unwrap();
        assert_eq!((v.verdict, v.interval), (Verdict::Inconclusive, None));
        assert!(
            v.line.contains("did not learn") && v.line.contains(&format!("{LSSAR} (1x accuracy by seed: 50%")),
            "{}",
            v.line
        );
        m.remove(SOFTMAX);
        assert!(verdict(&m).is_none());
    }
}
