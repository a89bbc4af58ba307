//! The reproduction report: `REPRODUCTION.md` with every table next to the paper's numbers, figures as
//! PNG and SVG (plotters), and a plain-language verdict per claim, computed from the numbers (never
//! written by hand).
//!
//! Every part is built as a typed [`doc::Section`] from the results ([`document`]: `verdicts.rs` the
//! summary and the verdicts, `tables.rs` the language-model tables and figures, `sinks.rs` the
//! attention sinks, `runs.rs` the runs, each post-training kind its own section) and rendered once, by
//! [`doc::to_markdown`]. The variants a part picks out (the gap figure's baseline, the training-loss
//! figure's runs) come from the definitions (`defs/`), never from names written here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, Result};

use crate::claims::OrderingVerdict;
use crate::doc::{self, Block, Item, Section};
use crate::post::{Figures, PostTraining};
use crate::runner::Runs;
use crate::scale::Scale;
use crate::spec::{EvalKey, Experiment, Kind, Row};

mod premise;
mod runs;
mod sinks;
mod tables;
#[cfg(test)]
pub(crate) mod tests;
mod verdicts;

/// Everything the report needs besides the results.
#[derive(Debug)]
pub struct Context<'a> {
    /// The scale.
    pub scale: &'a Scale,
    /// The command that reproduces it.
    pub command: &'a str,
    /// The same command without `--only`, to which each section appends its own `--only` list.
    pub base_command: &'a str,
    /// Git revision.
    pub git_revision: &'a str,
    /// Wall time of the whole reproduction so far (training + evaluation), seconds.
    pub wall_s: f64,
    /// Figures directory, relative to the report.
    pub figures_rel: &'a str,
    /// The post-training experiments, each holding the results of this invocation (none where it
    /// did not run).
    pub post: &'a [Box<dyn PostTraining>],
    /// The other meaningful scales' committed reports, which the summary's premise paragraph links
    /// where they exist.
    pub others: &'a [OtherReport],
}

/// Another scale's committed report, as this report refers to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherReport {
    /// The scale.
    pub scale: String,
    /// Its file relative to this report, when it exists there (else the report names it in plain
    /// text: a link to a missing file would not resolve).
    pub link: Option<String>,
}

/// The default scale (`reproduce`'s), whose committed report is `docs/REPRODUCTION.md`.
pub const DEFAULT_SCALE: &str = "small";

/// The committed report of `scale` in `docs/` and its figures directory beside it:
/// `REPRODUCTION.md` and `figures` for the default scale, `REPRODUCTION-<scale>.md` and
/// `figures-<scale>` for the others, so no scale's report overwrites another's or draws over its
/// figures.
pub fn committed_names(scale: &str) -> (String, String) {
    if scale == DEFAULT_SCALE {
        ("REPRODUCTION.md".into(), "figures".into())
    } else {
        (format!("REPRODUCTION-{scale}.md"), format!("figures-{scale}"))
    }
}

impl std::fmt::Debug for dyn PostTraining + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostTraining({:?})", self.kind())
    }
}

fn key(ntk: bool, posthoc: Option<u32>, multiple: usize) -> EvalKey {
    EvalKey::new(ntk, posthoc, multiple)
}

/// The mean over a variant's seeds of one evaluation's loss (`None` when no seed has it).
fn mean_loss(runs: &Runs, variant: &str, key: &EvalKey) -> Option<f64> {
    let l: Vec<f64> = runs.get(variant)?.iter().filter(|r| r.error.is_none()).filter_map(|r| r.loss(key)).collect();
    (!l.is_empty()).then(|| l.iter().sum::<f64>() / l.len() as f64)
}

/// One evaluation of a variant's first seed (the post-hoc sweep is run on it alone).
fn first_seed_loss(runs: &Runs, variant: &str, key: &EvalKey) -> Option<f64> {
    runs.get(variant)?.first().filter(|r| r.error.is_none())?.loss(key)
}

fn row_loss(runs: &Runs, row: &Row, ntk: bool, m: usize) -> Option<f64> {
    mean_loss(runs, &row.train, &key(ntk, row.posthoc, m))
}

fn fmt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.3}"))
}

/// Kendall's tau between two equally long score lists (ties count as neither agreeing nor disagreeing).
pub fn kendall_tau(a: &[f64], b: &[f64]) -> Option<f64> {
    let n = a.len();
    if n < 2 || b.len() != n {
        return None;
    }
    let (mut agree, mut disagree) = (0i64, 0i64);
    for i in 0..n {
        for j in i + 1..n {
            let s = (a[i] - a[j]).signum() * (b[i] - b[j]).signum();
            if s > 0.0 {
                agree += 1;
            } else if s < 0.0 {
                disagree += 1;
            }
        }
    }
    let pairs = (n * (n - 1) / 2) as f64;
    Some((agree - disagree) as f64 / pairs)
}

/// The report's title.
const TITLE: &str = "Reproduction report: Softplus attention with re-weighting (LSSA / LSSAR)";

/// Writes `REPRODUCTION.md` to `report_path` ([`document`], rendered by [`doc::to_markdown`]) and the
/// figures to `figures_dir`.
pub fn write(
    experiments: &[Experiment],
    results: &Runs,
    ctx: &Context<'_>,
    report_path: &Path,
    figures_dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(figures_dir).with_context(|| format!("creating {}", figures_dir.display()))?;
    let report = document(experiments, results, ctx, Figures { dir: figures_dir, rel: ctx.figures_rel })?;
    std::fs::write(report_path, doc::to_markdown(&report, 1))
        .with_context(|| format!("writing {}", report_path.display()))?;
    Ok(())
}

/// The whole report as one typed section (the title, the header list, the summary, the verdicts,
/// one section per experiment, what is not reproduced yet, the runs), drawing its figures into
/// `figures.dir` on the way.
pub fn document(
    experiments: &[Experiment],
    results: &Runs,
    ctx: &Context<'_>,
    figures: Figures<'_>,
) -> Result<Section> {
    let mut report = Section::new(TITLE);
    report.push(Block::List(header(experiments, results, ctx)));
    let claims = crate::claims::all()?;
    let judged = crate::claims::judge(&claims, results);
    let orderings = crate::claims::judge_orderings(&claims, experiments, results);
    let noise = crate::claims::seed_noise(results);
    let post_lines: Vec<String> = ctx.post.iter().flat_map(|p| p.verdicts()).collect();
    let family = verdicts::family(&judged, &orderings, ctx.post.iter().flat_map(|p| p.counted()).collect());
    let premise = premise::paragraph(&claims.claim, results, ctx.others);
    let mut summary = verdicts::summary_section(&judged, premise.as_deref(), &post_lines, &family, results);
    let at = usize::from(premise.is_some());
    summary.blocks.splice(at..at, premise::pilot_blocks(ctx.scale, figures)?);
    report.push(summary);
    let mut verdicts = verdicts::verdicts_section(&judged, &orderings, noise, &family);
    verdicts.blocks.extend(tables::gap_blocks(results, figures)?);
    report.push(verdicts);
    for e in experiments {
        report.push(experiment_section(e, results, ctx, &orderings, noise, figures)?);
    }
    report.blocks.extend(missing_section().map(Block::Section));
    report.push(runs::runs_section(results, figures)?);
    Ok(report)
}

/// The list under the title: scale, command, revisions, what is missing, training, validation,
/// provenance, and how to read the numbers.
fn header(experiments: &[Experiment], results: &Runs, ctx: &Context<'_>) -> Vec<Item> {
    let s = ctx.scale;
    let mut items = vec![format!("scale: **{}**: {}", s.name, s.about)];
    if let Some(h) = s.history {
        items.push(format!("scale history: {h}"));
    }
    if !s.meaningful {
        items.push(
            "**these numbers are not meaningful**: this scale only proves that the pipeline runs end to end.".into(),
        );
    }
    items.push(format!("regenerate: `{}` (runs that already have results are not redone)", ctx.command));
    items.push(format!(
        "git revision: `{}`; run time: {:.1} min, summed over every training, evaluation and experiment (runs trained side by side count each; the elapsed time is shorter)",
        ctx.git_revision,
        ctx.wall_s / 60.0
    ));
    let planned = crate::spec::plan(experiments);
    let done =
        planned.keys().filter(|v| results.get(v.as_str()).is_some_and(|r| r.iter().any(|r| r.error.is_none()))).count();
    if done < planned.len() {
        let missing: Vec<String> =
            planned.keys().filter(|v| !results.contains_key(v.as_str())).map(|v| format!("`{v}`")).collect();
        items.push(format!(
            "**partial**: {done} of {} planned trained variants have results; rows of the others show `-`. Missing: {}.",
            planned.len(),
            missing.join(", ")
        ));
    }
    items.push(format!(
        "training: {} steps of {} tokens, T_train = {}; {}",
        s.train.max_steps,
        s.train.tokens_per_step,
        s.train.model.context_len,
        seeds_line(results)
    ));
    items.push(format!("validation: {}", validation_line(results, s.train.model.context_len)));
    items.push(format!("provenance: {}", provenance_line(results)));
    items.push(
        "numbers: validation loss in nats/token, the mean over a row's seeds. `ntk / plain` = NTK-scaled RoPE / unscaled RoPE beyond 1x (SPEC section 9). The paper's numbers are GPT-2 124M on FineWeb-10B at T_train = 1024; at a small scale the absolute values differ, and what can be compared is the *shape*. Every claim below is judged from paired differences with 95% intervals, never from one run.".into(),
    );
    items.into_iter().map(Item::from).collect()
}

/// Experiment `e`'s section: its README, the command that regenerates its runs, then its tables and
/// figures (a post-training kind's from its [`PostTraining::section`]).
fn experiment_section(
    e: &Experiment,
    results: &Runs,
    ctx: &Context<'_>,
    orderings: &[OrderingVerdict],
    noise: Option<crate::stats::SeedNoise>,
    figures: Figures<'_>,
) -> Result<Section> {
    let mut section = Section::new(e.title.clone());
    section.push(e.readme.lines().skip(1).collect::<Vec<_>>().join("\n").trim());
    let post = crate::post::find(ctx.post, e.kind);
    // The language models the section reads (none for kinds with their own models), then the
    // kind's own `--only` name.
    let mut trained: Vec<String> =
        crate::spec::plan(std::slice::from_ref(e)).into_keys().map(|t| t.to_string()).collect();
    trained.extend(post.and_then(|p| p.only_name()).map(String::from));
    let extra = post.map_or("", |p| p.regenerate_extra());
    section.push(format!("Regenerate this section's runs: `{} --only {}{extra}`", ctx.base_command, trained.join(",")));
    let blocks = match (post, e.kind) {
        (Some(p), _) => p.section(e, figures)?,
        (None, Kind::Table) => {
            let ordering = orderings.iter().find(|o| o.experiment == e.name);
            tables::table_blocks(e, results, noise, ordering, figures)?
        }
        (None, Kind::LengthCurve) => tables::curve_blocks(e, results, figures)?,
        (None, Kind::Sinks) => sinks::sinks_blocks(e, results, figures)?,
        (None, Kind::PSweep) => tables::sweep_blocks(e, results, figures)?,
        // The post-training kinds are sections of their `PostTraining` values, above.
        (None, other) => anyhow::bail!("no post-training experiment in the report's context handles {other:?}"),
    };
    section.blocks.extend(blocks);
    Ok(section)
}

/// The parts of the paper not implemented yet (`status::PARTS`), if any.
fn missing_section() -> Option<Section> {
    let missing: Vec<Item> = crate::status::PARTS
        .iter()
        .filter(|p| p.missing.is_some())
        .map(|part| Item::from(format!("{} ({}): not implemented yet, no numbers shown.", part.name, part.what)))
        .collect();
    (!missing.is_empty()).then(|| Section { title: "Not reproduced yet".into(), blocks: vec![Block::List(missing)] })
}

/// The paper's length table: the table experiment with the most lengths (its Table 4), whose numbers
/// the context facts and the premise quote.
fn length_table() -> Option<Experiment> {
    let tables = crate::spec::all().ok()?.into_iter().filter(|e| e.kind == Kind::Table);
    tables.rev().max_by_key(|e| e.lengths.len())
}

/// The length-curve experiment of the definitions (Figure 1), whatever this invocation's scope: its
/// first row is the baseline the gap figure draws the others against, and its trained variants are
/// those of the training-loss figure.
fn length_curve() -> Option<Experiment> {
    crate::spec::all().ok()?.into_iter().find(|e| e.kind == Kind::LengthCurve)
}

/// `seeds: 3 of softmax, lssa, ...; 1 of the other 22 variants`.
fn seeds_line(runs: &Runs) -> String {
    let mut by_count: BTreeMap<usize, Vec<&str>> = BTreeMap::new();
    for (v, seeds) in runs {
        by_count.entry(seeds.iter().filter(|r| r.error.is_none()).count()).or_default().push(v);
    }
    let parts: Vec<String> = by_count
        .iter()
        .rev()
        .map(|(n, vs)| {
            if vs.len() <= 6 {
                format!("{n} of {}", vs.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", "))
            } else {
                format!("{n} of the other {} variants", vs.len())
            }
        })
        .collect();
    format!(
        "seeds (initialisation and data order): {}",
        if parts.is_empty() { "none yet".to_string() } else { parts.join("; ") }
    )
}

/// How many targets the evaluation scored, and how.
fn validation_line(runs: &Runs, t_train: usize) -> String {
    let longest = crate::claims::longest_multiple(runs);
    let Some(l) = runs.values().flatten().find_map(|r| r.eval(&EvalKey::new(true, None, 1))) else {
        return "no evaluations yet".into();
    };
    let spans = l.tokens / (longest * t_train).max(1);
    format!(
        "{} target tokens at every length, in {spans} spans of {} tokens spread evenly over the whole validation split (every held-out document of every source, not a prefix), cut into windows of each length, so every length and every row predicts the same targets; per-window losses are kept, and the comparisons below are paired on them. The *tail* measure scores only each window's last T_train targets (against the same targets at 1x), so a longer window gets no credit for the extra context its other tokens have",
        l.tokens,
        longest * t_train
    )
}

/// Which code computed the runs: one git revision and numbers revision, or the list of those mixed.
fn provenance_line(runs: &Runs) -> String {
    let mut revs: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for r in runs.values().flatten() {
        *revs.entry((r.git_revision.as_str(), r.numbers_revision.as_str())).or_default() += 1;
    }
    let dirty = revs.keys().any(|(g, _)| g.ends_with("-dirty"));
    let list: Vec<String> = revs.iter().map(|((g, n), c)| format!("git `{g}` / numbers `{n}` ({c} runs)")).collect();
    let numbers: BTreeSet<&str> = revs.keys().map(|(_, n)| *n).collect();
    format!(
        "{}{}{}",
        if revs.len() == 1 { "every run from " } else { "runs from several revisions: " },
        list.join(", "),
        match (numbers.len() > 1, dirty) {
            (true, _) => "; **the runs were computed by different code** (numbers revisions differ)",
            (false, true) => "; some runs come from a work tree with uncommitted changes",
            (false, false) => "",
        }
    )
}
