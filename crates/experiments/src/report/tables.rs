//! The language-model experiments' sections (Tables 1-4, Figure 1, Figure 2): each row's losses next
//! to the paper's, the resolution our seeds give, the ordering pairs, the figures against length and
//! against `p`; and the gap figure under the verdicts.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::Result;

use super::{first_seed_loss, fmt, key, row_loss};
use crate::claims::{Measure, OrderingVerdict};
use crate::doc::{Align, Block, Figure, Table};
use crate::plot::{GapSeries, save, save_gaps};
use crate::post::Figures;
use crate::runner::Runs;
use crate::spec::{Experiment, Row};
use crate::stats::SeedNoise;

/// A table experiment's blocks: the table, the resolution line, the ordering pairs and their verdict,
/// and the figure against length when it has several lengths.
pub(super) fn table_blocks(
    e: &Experiment,
    results: &Runs,
    noise: Option<SeedNoise>,
    ordering: Option<&OrderingVerdict>,
    figures: Figures<'_>,
) -> Result<Vec<Block>> {
    let mut blocks = vec![Block::Table(table(e, results))];
    blocks.extend(noise.and_then(|n| resolution(e, results, n)).map(Block::Text));
    if let Some(o) = ordering {
        blocks.extend(ordering_blocks(o));
    }
    if e.lengths.len() > 1 {
        let name = format!("{}_length", e.name);
        plot_lengths(e, results, &figures.dir.join(&name), false)?;
        blocks.push(Block::Figure(Figure::drawn(e.title.clone(), figures.rel, &name)));
    }
    Ok(blocks)
}

/// A length curve's blocks (Figure 1): the table and the figure, every row under both RoPE treatments.
pub(super) fn curve_blocks(e: &Experiment, results: &Runs, figures: Figures<'_>) -> Result<Vec<Block>> {
    plot_lengths(e, results, &figures.dir.join(&e.name), true)?;
    Ok(vec![Block::Table(table(e, results)), Block::Figure(Figure::drawn(e.title.clone(), figures.rel, &e.name))])
}

/// A p sweep's blocks (Figure 2): a table per row, then the figure.
pub(super) fn sweep_blocks(e: &Experiment, results: &Runs, figures: Figures<'_>) -> Result<Vec<Block>> {
    plot_p(e, results, &figures.dir.join(&e.name))?;
    let mut blocks = p_tables(e, results);
    blocks.push(Block::Figure(Figure::drawn(e.title.clone(), figures.rel, &e.name)));
    Ok(blocks)
}

/// Each row's loss at every length (NTK / plain RoPE beyond 1x) beside the paper's.
pub(super) fn table(e: &Experiment, results: &Runs) -> Table {
    let mut t = Table::new([("row", Align::Left), ("trained as", Align::Left)]);
    for &m in &e.lengths {
        t.column(format!("{m}x ours (ntk / plain)"), Align::Right);
        t.column(format!("{m}x paper"), Align::Right);
    }
    for r in &e.rows {
        let seeds = results.get(r.train.as_str()).map_or(0, |s| s.iter().filter(|x| x.error.is_none()).count());
        let seeds = if seeds > 1 { format!(" ({seeds} seeds)") } else { String::new() };
        let how = match r.posthoc {
            Some(p) => format!("`{}`, p = {p} post hoc{seeds}", r.train),
            None => format!("`{}`{seeds}", r.train),
        };
        let mut cells = vec![r.label.clone(), how];
        for (i, &m) in e.lengths.iter().enumerate() {
            let (a, b) = (row_loss(results, r, true, m), row_loss(results, r, false, m));
            cells.push(if m == 1 { fmt(a) } else { format!("{} / {}", fmt(a), fmt(b)) });
            cells.push(r.paper.get(i).map_or("-".into(), |v| format!("{v:.4}")));
        }
        t.row(cells);
    }
    t
}

/// Figure 2's tables: per row, its first seed's loss for every post-hoc `p` (NTK RoPE) at every length.
pub(super) fn p_tables(e: &Experiment, results: &Runs) -> Vec<Block> {
    let mut blocks = Vec::new();
    for r in &e.rows {
        blocks.push(Block::Text(format!("**{}** (`{}`, NTK RoPE, first seed)", r.label, r.train)));
        let mut t = Table::new([("p", Align::Right)]);
        for &m in &e.lengths {
            t.column(format!("{m}x"), Align::Right);
        }
        for p in std::iter::once(None).chain(e.powers.iter().map(|&p| Some(p))) {
            let cells = e.lengths.iter().map(|&m| fmt(first_seed_loss(results, &r.train, &key(true, p, m))));
            t.row(std::iter::once(p.map_or("none".into(), |p| p.to_string())).chain(cells).collect());
        }
        blocks.push(Block::Table(t));
    }
    blocks
}

/// Draws loss against length: the trained rows (`with_plain`: every row, NTK solid and plain dashed).
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

/// Draws loss against `p`, one line per row and length.
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

/// The smallest difference between two of a table's rows at 1x that our seeds resolve (the half-width
/// of a paired difference's 95% interval from the seed noise alone: the validation spans add a
/// little), beside the paper's differences between the same rows. `None` when no row has results.
fn resolution(e: &Experiment, results: &Runs, n: SeedNoise) -> Option<String> {
    let seeds: Vec<usize> = e
        .rows
        .iter()
        .filter(|r| r.posthoc.is_none())
        .map(|r| results.get(r.train.as_str()).map_or(0, |s| s.iter().filter(|x| x.error.is_none()).count()))
        .filter(|&k| k > 0)
        .collect();
    let (&few, &most) = (seeds.iter().min()?, seeds.iter().max()?);
    let t = crate::stats::t_quantile(1.0 - crate::stats::TAIL, n.df as f64);
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
    Some(format!(
        "Resolution: a difference between two of these rows at 1x is resolved when it exceeds {ours}, from the seed noise measured on the multi-seed rows (sd {:.4}, correlation {:.2} on a shared seed, t with {} degrees of freedom); {theirs}.",
        n.sd, n.rho, n.df
    ))
}

/// The pairs of an ordering table: the paper's difference, ours with its interval, and which count;
/// then the verdict.
fn ordering_blocks(o: &OrderingVerdict) -> [Block; 3] {
    let mut t = Table::new([
        ("pair", Align::Left),
        ("paper", Align::Right),
        ("ours: estimate [95% interval]", Align::Left),
        ("separated (paper / ours)", Align::Left),
        ("signs", Align::Left),
    ]);
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
        t.row(vec![
            format!("{} - {}", p.rows.0, p.rows.1),
            format!("{:+.4}", p.paper),
            p.ours.show(),
            format!("{} / {}", yn(p.separated.0), yn(p.separated.1)),
            signs.to_string(),
        ]);
    }
    [
        Block::from("Ordering at 1x, pair by pair (first row minus second; a pair counts when separated in both):"),
        Block::Table(t),
        Block::Text(format!("Verdict: **{}**: {}.", o.verdict.word(), o.why)),
    ]
}

/// The gap figure and its caption: every row of the length-curve experiment but the first minus the
/// first (the baseline), against length with 95% intervals, NTK (solid) and plain RoPE (dashed),
/// drawn to `claims_gap.png` / `.svg`; nothing without the baseline's results.
pub(super) fn gap_blocks(runs: &Runs, figures: Figures<'_>) -> Result<Vec<Block>> {
    let Some(curve) = super::length_curve() else { return Ok(Vec::new()) };
    let Some((base, rows)) = curve.rows.split_first() else { return Ok(Vec::new()) };
    let base_name = match base.posthoc {
        Some(p) => format!("{} post hoc p = {p}", base.train),
        None => base.train.to_string(),
    };
    let lengths: BTreeSet<usize> = runs
        .get(base.train.as_str())
        .into_iter()
        .flatten()
        .flat_map(|r| r.evals.iter().map(|(k, _)| k.multiple))
        .collect();
    let mut series: Vec<GapSeries> = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        for (ntk, dashed) in [(true, false), (false, true)] {
            let pts: Vec<(f64, crate::stats::Interval)> = lengths
                .iter()
                .filter_map(|&m| {
                    let terms = [
                        (1.0, r.train.as_str(), key(ntk, r.posthoc, m)),
                        (-1.0, base.train.as_str(), key(ntk, base.posthoc, m)),
                    ];
                    crate::claims::contrast(runs, &terms, Measure::Whole, 1).map(|c| (m as f64, c.interval))
                })
                .collect();
            if !pts.is_empty() {
                series.push((format!("{} ({})", r.label, if ntk { "NTK" } else { "plain RoPE" }), i, dashed, pts));
            }
        }
    }
    if series.is_empty() {
        return Ok(Vec::new());
    }
    let title = format!("Loss minus {base_name}'s, paired on the same targets (mean over seeds, 95% intervals)");
    save_gaps(&figures.dir.join("claims_gap"), &title, &series)?;
    Ok(vec![
        Block::Figure(Figure::drawn(format!("gap to {base_name} against length"), figures.rel, "claims_gap")),
        Block::Text(format!(
            "Each point: a row's loss minus {base_name}'s at that length, on the same targets, mean over seeds with its 95% interval; below 0 is better than {base_name}. The length claims are about how these curves bend from 1x to 16x."
        )),
    ])
}
