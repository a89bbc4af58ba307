//! The reproduction report: `REPRODUCTION.md` with every table next to the paper's numbers, figures as
//! PNG and SVG (plotters), and a plain-language verdict per claim, computed from the numbers (never
//! written by hand).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use sinks::sinks_section;

use crate::claims::{Measure, OrderingVerdict};
use crate::plot::{GapSeries, Series, save, save_gaps, save_with};
use crate::post::{Figures, PostTraining};
use crate::runner::{RunResult, Runs};
use crate::scale::Scale;
use crate::spec::{EvalKey, Experiment, Kind, Row};

mod sinks;
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

/// Writes `REPRODUCTION.md` to `report_path` and the figures to `figures_dir`.
pub fn write(
    experiments: &[Experiment],
    results: &Runs,
    ctx: &Context<'_>,
    report_path: &Path,
    figures_dir: &Path,
) -> Result<()> {
    std::fs::create_dir_all(figures_dir).with_context(|| format!("creating {}", figures_dir.display()))?;
    let mut md = String::new();
    let s = ctx.scale;
    let _ = writeln!(md, "# Reproduction report: Softplus attention with re-weighting (LSSA / LSSAR)\n");
    let _ = writeln!(md, "- scale: **{}**: {}", s.name, s.about);
    if !s.meaningful {
        let _ = writeln!(
            md,
            "- **these numbers are not meaningful**: this scale only proves that the pipeline runs end to end."
        );
    }
    let _ = writeln!(md, "- regenerate: `{}` (runs that already have results are not redone)", ctx.command);
    let _ = writeln!(
        md,
        "- git revision: `{}`; run time: {:.1} min, summed over every training, evaluation and experiment (runs trained side by side count each; the elapsed time is shorter)",
        ctx.git_revision,
        ctx.wall_s / 60.0
    );
    let planned = crate::spec::plan(experiments);
    let done = planned.keys().filter(|v| results.get(*v).is_some_and(|r| r.iter().any(|r| r.error.is_none()))).count();
    if done < planned.len() {
        let missing: Vec<&str> = planned.keys().filter(|v| !results.contains_key(*v)).map(String::as_str).collect();
        let _ = writeln!(
            md,
            "- **partial**: {done} of {} planned trained variants have results; rows of the others show `-`. Missing: {}.",
            planned.len(),
            missing.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", ")
        );
    }
    let _ = writeln!(
        md,
        "- training: {} steps of {} tokens, T_train = {}; {}",
        s.train.max_steps,
        s.train.tokens_per_step,
        s.train.model.context_len,
        seeds_line(results)
    );
    let _ = writeln!(md, "- validation: {}", validation_line(results, s.train.model.context_len));
    let _ = writeln!(md, "- provenance: {}", provenance_line(results));
    let _ = writeln!(
        md,
        "- numbers: validation loss in nats/token, the mean over a row's seeds. `ntk / plain` = NTK-scaled RoPE / unscaled RoPE beyond 1x (SPEC section 9). The paper's numbers are GPT-2 124M on FineWeb-10B at T_train = 1024; at a small scale the absolute values differ, and what can be compared is the *shape*. Every claim below is judged from paired differences with 95% intervals, never from one run.\n"
    );
    let claims = crate::claims::all()?;
    let judged = crate::claims::judge(&claims, results);
    let orderings = crate::claims::judge_orderings(&claims, experiments, results);
    let noise = crate::claims::seed_noise(results);
    let post_lines: Vec<String> = ctx.post.iter().flat_map(|p| p.verdicts()).collect();
    let family = verdicts::family(&judged, &orderings, ctx.post.iter().flat_map(|p| p.counted()).collect());
    verdicts::summary_section(&mut md, &judged, &post_lines, &family, results);
    verdicts::verdicts_section(&mut md, &judged, &orderings, noise, &family);
    if gap_figure(results, &figures_dir.join("claims_gap"))? {
        let _ = writeln!(
            md,
            "![gap to softmax against length]({0}/claims_gap.png) ([SVG]({0}/claims_gap.svg))\n\nEach point: a row's loss minus softmax's at that length, on the same targets, mean over seeds with its 95% interval; below 0 is better than softmax. The length claims are about how these curves bend from 1x to 16x.\n",
            ctx.figures_rel
        );
    }
    for e in experiments {
        let _ = writeln!(md, "## {}\n", e.title);
        let _ = writeln!(md, "{}", e.readme.lines().skip(1).collect::<Vec<_>>().join("\n").trim());
        let _ = writeln!(md);
        let post = crate::post::find(ctx.post, e.kind);
        // The language models the section reads (none for kinds with their own models), then the
        // kind's own `--only` name.
        let mut trained: Vec<String> = crate::spec::plan(std::slice::from_ref(e)).into_keys().collect();
        trained.extend(post.and_then(|p| p.only_name()).map(String::from));
        let extra = post.map_or("", |p| p.regenerate_extra());
        let _ = writeln!(
            md,
            "Regenerate this section's runs: `{} --only {}{extra}`\n",
            ctx.base_command,
            trained.join(",")
        );
        if let Some(p) = post {
            p.section(&mut md, e, Figures { dir: figures_dir, rel: ctx.figures_rel })?;
            let _ = writeln!(md);
            continue;
        }
        match e.kind {
            Kind::Table => {
                table(&mut md, e, results);
                resolution(&mut md, e, results, noise);
                if let Some(o) = orderings.iter().find(|o| o.experiment == e.name) {
                    ordering_pairs(&mut md, o);
                }
                if e.lengths.len() > 1 {
                    let name = format!("{}_length", e.name);
                    plot_lengths(e, results, &figures_dir.join(&name), false)?;
                    let _ = writeln!(
                        md,
                        "\n![{}]({}/{name}.png) ([SVG]({}/{name}.svg))\n",
                        e.title, ctx.figures_rel, ctx.figures_rel
                    );
                } else {
                    let _ = writeln!(md);
                }
            }
            Kind::LengthCurve => {
                table(&mut md, e, results);
                plot_lengths(e, results, &figures_dir.join(&e.name), true)?;
                let _ = writeln!(
                    md,
                    "\n![{}]({}/{}.png) ([SVG]({}/{}.svg))\n",
                    e.title, ctx.figures_rel, e.name, ctx.figures_rel, e.name
                );
            }
            Kind::Sinks => {
                sinks_section(&mut md, e, results, figures_dir, ctx.figures_rel)?;
                let _ = writeln!(md);
            }
            Kind::PSweep => {
                p_table(&mut md, e, results);
                plot_p(e, results, &figures_dir.join(&e.name))?;
                let _ = writeln!(
                    md,
                    "\n![{}]({}/{}.png) ([SVG]({}/{}.svg))\n",
                    e.title, ctx.figures_rel, e.name, ctx.figures_rel, e.name
                );
            }
            // The post-training kinds are sections of their `PostTraining` values, above.
            other => anyhow::bail!("no post-training experiment in the report's context handles {other:?}"),
        }
    }
    let missing: Vec<_> = crate::status::PARTS.iter().filter(|p| p.missing.is_some()).collect();
    if !missing.is_empty() {
        let _ = writeln!(md, "## Not reproduced yet\n");
        for part in missing {
            let _ = writeln!(md, "- {} ({}): not implemented yet, no numbers shown.", part.name, part.what);
        }
        let _ = writeln!(md);
    }
    let _ = writeln!(md, "## Runs\n");
    let _ = writeln!(
        md,
        "`late drop` is the mean training loss over the fourth fifth of the steps minus that over the last fifth: how much the loss still fell at the end (the learning rate decays over the last steps too, so part of it is annealing). Times include any other work the machine did meanwhile.\n"
    );
    let _ = writeln!(
        md,
        "| trained variant | seed | lr | final train loss | late drop | train time (s) | eval time (s) | tokens/s | git revision | note |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|");
    let mut curves: Vec<Series> = Vec::new();
    for (v, r) in results.iter().flat_map(|(v, seeds)| seeds.iter().map(move |r| (v, r))) {
        let note = match (&r.error, &r.note) {
            (Some(e), _) => format!("training failed: {}", e.replace('|', "/")),
            (None, Some(n)) => n.replace('|', "/"),
            (None, None) => String::new(),
        };
        let curve = if r.error.is_none() { train_curve(r) } else { Vec::new() };
        let late = late_drop(&curve).map_or("-".to_string(), |d| format!("{d:.3}"));
        let _ = writeln!(
            md,
            "| `{v}` | {} | {} | {:.3} | {late} | {:.0} | {:.0} | {:.0} | `{}` | {note} |",
            r.seed_index, r.lr, r.final_train_loss, r.train_wall_s, r.eval_wall_s, r.tokens_per_s, r.git_revision
        );
        if ["softmax", "lssa", "lssa+rw15"].contains(&v.as_str()) && r.seed_index == 0 && !curve.is_empty() {
            // Means over blocks of 25 steps, so the figure shows the trend rather than batch noise.
            let pts = curve
                .chunks(25)
                .map(|c| {
                    (
                        c.iter().map(|p| p.0).sum::<f64>() / c.len() as f64,
                        c.iter().map(|p| p.1).sum::<f64>() / c.len() as f64,
                    )
                })
                .collect();
            curves.push((v.clone(), curves.len(), false, pts));
        }
    }
    if !curves.is_empty() {
        save_with(
            &figures_dir.join("train_loss"),
            "Training loss of the Figure 1 runs, first seed (means over 25 steps)",
            ("training step (log scale)", "training loss (nats/token)"),
            &curves,
        )?;
        let _ = writeln!(
            md,
            "\n![training loss]({}/train_loss.png) ([SVG]({}/train_loss.svg))",
            ctx.figures_rel, ctx.figures_rel
        );
    }
    std::fs::write(report_path, md).with_context(|| format!("writing {}", report_path.display()))?;
    Ok(())
}

/// `(step, loss)` of a run's `metrics.jsonl` (in the `out_dir` of its config); empty if unreadable.
fn train_curve(r: &RunResult) -> Vec<(f64, f64)> {
    let Ok(cfg) = trainer::config::TrainConfig::from_toml_with_overrides(&r.config, "result", &[]) else {
        return Vec::new();
    };
    let Ok(text) = std::fs::read_to_string(cfg.out_dir.join("metrics.jsonl")) else { return Vec::new() };
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| Some((v["step"].as_f64()?, v["loss"].as_f64()?)))
        .collect()
}

/// Mean loss over the fourth fifth of the steps minus the mean over the last fifth.
fn late_drop(curve: &[(f64, f64)]) -> Option<f64> {
    let n = curve.len();
    if n < 10 {
        return None;
    }
    let mean = |s: &[(f64, f64)]| s.iter().map(|p| p.1).sum::<f64>() / s.len() as f64;
    Some(mean(&curve[3 * n / 5..4 * n / 5]) - mean(&curve[4 * n / 5..]))
}

fn table(md: &mut String, e: &Experiment, results: &Runs) {
    let mut head = String::from("| row | trained as |");
    let mut rule = String::from("|---|---|");
    for &m in &e.lengths {
        let _ = write!(head, " {m}x ours (ntk / plain) | {m}x paper |");
        rule.push_str("---:|---:|");
    }
    let _ = writeln!(md, "{head}\n{rule}");
    for r in &e.rows {
        let seeds = results.get(&r.train).map_or(0, |s| s.iter().filter(|x| x.error.is_none()).count());
        let seeds = if seeds > 1 { format!(" ({seeds} seeds)") } else { String::new() };
        let how = match r.posthoc {
            Some(p) => format!("`{}`, p = {p} post hoc{seeds}", r.train),
            None => format!("`{}`{seeds}", r.train),
        };
        let _ = write!(md, "| {} | {how} |", r.label);
        for (i, &m) in e.lengths.iter().enumerate() {
            let (a, b) = (row_loss(results, r, true, m), row_loss(results, r, false, m));
            let ours = if m == 1 { fmt(a) } else { format!("{} / {}", fmt(a), fmt(b)) };
            let _ = write!(md, " {ours} | {} |", r.paper.get(i).map_or("-".into(), |v| format!("{v:.4}")));
        }
        let _ = writeln!(md);
    }
}

fn p_table(md: &mut String, e: &Experiment, results: &Runs) {
    for r in &e.rows {
        let _ = writeln!(md, "**{}** (`{}`, NTK RoPE, first seed)\n", r.label, r.train);
        let mut head = String::from("| p |");
        let mut rule = String::from("|---:|");
        for &m in &e.lengths {
            let _ = write!(head, " {m}x |");
            rule.push_str("---:|");
        }
        let _ = writeln!(md, "{head}\n{rule}");
        for p in std::iter::once(None).chain(e.powers.iter().map(|&p| Some(p))) {
            let _ = write!(md, "| {} |", p.map_or("none".into(), |p| p.to_string()));
            for &m in &e.lengths {
                let _ = write!(md, " {} |", fmt(first_seed_loss(results, &r.train, &key(true, p, m))));
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(md);
    }
}

fn plot_lengths(e: &Experiment, results: &Runs, path: &Path, with_plain: bool) -> Result<()> {
    let mut series = Vec::new();
    // Tables plot the trained rows (post-hoc rows are in Figure 1 and the table); curves plot every row.
    let rows: Vec<&Row> = e.rows.iter().filter(|r| with_plain || r.posthoc.is_none()).collect();
    for (i, r) in rows.iter().enumerate() {
        for (ntk, dashed) in [(true, false), (false, true)] {
            if !ntk && !with_plain {
                continue;
            }
            let pts: Vec<(f64, f64)> =
                e.lengths.iter().filter_map(|&m| row_loss(results, r, ntk, m).map(|l| (m as f64, l))).collect();
            let label = if with_plain {
                format!("{} ({})", r.label, if ntk { "NTK" } else { "plain RoPE" })
            } else {
                r.label.clone()
            };
            series.push((label, i, dashed, pts));
        }
    }
    save(path, &e.title, "inference length / training length (NTK RoPE)", &series)
}

fn plot_p(e: &Experiment, results: &Runs, path: &Path) -> Result<()> {
    let mut series = Vec::new();
    for (ri, r) in e.rows.iter().enumerate() {
        for (li, &m) in e.lengths.iter().enumerate() {
            let pts: Vec<(f64, f64)> = e
                .powers
                .iter()
                .filter_map(|&p| first_seed_loss(results, &r.train, &key(true, Some(p), m)).map(|l| (p as f64, l)))
                .collect();
            series.push((format!("{} {m}x", r.label), li, ri == 1, pts));
        }
    }
    save(path, &e.title, "re-weighting power p (solid: LSSA, dashed: softmax)", &series)
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

/// The smallest difference between two of a table's rows at 1x that our seeds resolve (the half-width
/// of a paired difference's 95% interval from the seed noise alone: the validation spans add a
/// little), beside the paper's differences between the same rows.
fn resolution(md: &mut String, e: &Experiment, results: &Runs, noise: Option<crate::stats::SeedNoise>) {
    let Some(n) = noise else { return };
    let seeds: Vec<usize> = e
        .rows
        .iter()
        .filter(|r| r.posthoc.is_none())
        .map(|r| results.get(&r.train).map_or(0, |s| s.iter().filter(|x| x.error.is_none()).count()))
        .filter(|&k| k > 0)
        .collect();
    let (Some(&few), Some(&most)) = (seeds.iter().min(), seeds.iter().max()) else { return };
    let t = crate::stats::t_quantile(0.975, n.df as f64);
    // Two rows on the same seeds: the shared part of the seed noise cancels in the difference.
    let half = |k: usize| t * (n.variance(&[1.0, -1.0]) / k as f64).sqrt();
    let paper: Vec<f64> = e.rows.iter().filter_map(|r| r.paper.first().copied()).collect();
    let spread = |xs: &[f64]| {
        let mut d: Vec<f64> =
            xs.iter().enumerate().flat_map(|(i, a)| xs[i + 1..].iter().map(move |b| (a - b).abs())).collect();
        d.sort_by(f64::total_cmp);
        (d.first().copied(), d.get(d.len() / 2).copied(), d.last().copied())
    };
    let ours = if few == most {
        format!("about ±{:.3} nats ({few} seed{} per row)", half(few), if few == 1 { "" } else { "s" })
    } else {
        format!(
            "about ±{:.3} nats between rows with {few} seed{}, ±{:.3} between rows with {most}",
            half(few),
            if few == 1 { "" } else { "s" },
            half(most)
        )
    };
    let theirs = match spread(&paper) {
        (Some(lo), Some(mid), Some(hi)) => {
            format!(
                "the paper's differences between these rows at its first length are {lo:.4} to {hi:.4} nats (median {mid:.4})"
            )
        }
        _ => "the paper gives no numbers for these rows".to_string(),
    };
    let _ = writeln!(
        md,
        "
Resolution: a difference between two of these rows at 1x is resolved when it exceeds {ours}, from the seed noise measured on the multi-seed rows (sd {:.4}, correlation {:.2} on a shared seed, t with {} degrees of freedom); {theirs}.",
        n.sd, n.rho, n.df
    );
}

/// The pairs of an ordering table: the paper's difference, ours with its interval, and which count.
fn ordering_pairs(md: &mut String, o: &OrderingVerdict) {
    let _ = writeln!(
        md,
        "\nOrdering at 1x, pair by pair (first row minus second; a pair counts when separated in both):\n"
    );
    let _ = writeln!(md, "| pair | paper | ours: estimate [95% interval] | separated (paper / ours) | signs |");
    let _ = writeln!(md, "|---|---:|---|---|---|");
    for p in &o.pairs {
        let counts = p.separated.0 && p.separated.1;
        let signs = if !counts {
            "-"
        } else if (p.paper > 0.0) == (p.ours.estimate > 0.0) {
            "agree"
        } else {
            "**disagree**"
        };
        let yn = |b: bool| if b { "yes" } else { "no" };
        let _ = writeln!(
            md,
            "| {} - {} | {:+.4} | {} | {} / {} | {signs} |",
            p.rows.0,
            p.rows.1,
            p.paper,
            p.ours.show(),
            yn(p.separated.0),
            yn(p.separated.1)
        );
    }
    let _ = writeln!(md, "\nVerdict: **{}**: {}.", o.verdict.word(), o.why);
}

/// The rows of the gap figure: label, trained variant, post-hoc power.
const GAP_ROWS: [(&str, &str, Option<u32>); 3] =
    [("LSSA", "lssa", None), ("LSSAR p=15 (train)", "lssa+rw15", None), ("LSSAR p=15 (post hoc)", "lssa", Some(15))];

/// Draws each of [`GAP_ROWS`] minus softmax against length with 95% intervals, NTK (solid) and plain
/// RoPE (dashed), to `<path>.png` and `<path>.svg`; `false` (nothing drawn) without softmax results.
fn gap_figure(runs: &Runs, path_no_ext: &Path) -> Result<bool> {
    let lengths: BTreeSet<usize> =
        runs.get("softmax").into_iter().flatten().flat_map(|r| r.evals.iter().map(|(k, _)| k.multiple)).collect();
    let mut series: Vec<GapSeries> = Vec::new();
    for (i, (label, variant, posthoc)) in GAP_ROWS.iter().enumerate() {
        for (ntk, dashed) in [(true, false), (false, true)] {
            let pts: Vec<(f64, crate::stats::Interval)> = lengths
                .iter()
                .filter_map(|&m| {
                    let terms = [(1.0, *variant, key(ntk, *posthoc, m)), (-1.0, "softmax", key(ntk, None, m))];
                    crate::claims::contrast(runs, &terms, Measure::Whole, 1).map(|c| (m as f64, c.interval))
                })
                .collect();
            if !pts.is_empty() {
                series.push((format!("{label} ({})", if ntk { "NTK" } else { "plain RoPE" }), i, dashed, pts));
            }
        }
    }
    if series.is_empty() {
        return Ok(false);
    }
    let title = "Loss minus softmax's, paired on the same targets (mean over seeds, 95% intervals)";
    save_gaps(path_no_ext, title, &series)?;
    Ok(true)
}
