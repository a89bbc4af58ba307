//! The report's last section: every run (variant and seed) with its learning rate, losses, times,
//! revision and what happened to it, and the training-loss figure of the length curve's variants.

use anyhow::Result;

use crate::doc::{Align, Figure, Section, Table};
use crate::plot::{Series, save_with};
use crate::post::Figures;
use crate::runner::{RunResult, Runs};

/// The runs table, and the training loss of the first seed of every variant the length-curve
/// experiment (Figure 1) trains, drawn to `train_loss.png` / `.svg`.
pub(super) fn runs_section(results: &Runs, figures: Figures<'_>) -> Result<Section> {
    let mut section = Section::new("Runs");
    section.push(
        "`late drop` is the mean training loss over the fourth fifth of the steps minus that over the last fifth: how much the loss still fell at the end (the learning rate decays over the last steps too, so part of it is annealing). Times include any other work the machine did meanwhile.",
    );
    let curve_experiment = super::length_curve();
    let drawn: Vec<&str> = curve_experiment.iter().flat_map(|e| e.rows.iter().map(|r| r.train.as_str())).collect();
    let mut t = Table::new([
        ("trained variant", Align::Left),
        ("seed", Align::Right),
        ("lr", Align::Right),
        ("final train loss", Align::Right),
        ("late drop", Align::Right),
        ("train time (s)", Align::Right),
        ("eval time (s)", Align::Right),
        ("tokens/s", Align::Right),
        ("git revision", Align::Left),
        ("note", Align::Left),
    ]);
    let mut curves: Vec<Series> = Vec::new();
    for (v, r) in results.iter().flat_map(|(v, seeds)| seeds.iter().map(move |r| (v, r))) {
        let curve = if r.error.is_none() { train_curve(r) } else { Vec::new() };
        t.row(run_row(v, r, &curve));
        if drawn.contains(&v.as_str()) && r.seed_index == 0 && !curve.is_empty() {
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
    section.push(t);
    if !curves.is_empty() {
        let which = curve_experiment.as_ref().map_or("", |e| e.title.split(':').next().unwrap_or(""));
        save_with(
            &figures.dir.join("train_loss"),
            &format!("Training loss of the {which} runs, first seed (means over 25 steps)"),
            ("training step (log scale)", "training loss (nats/token)"),
            &curves,
        )?;
        section.push(Figure::drawn("training loss", figures.rel, "train_loss"));
    }
    Ok(section)
}

/// One run's row of the runs table (`curve`: its training curve, empty when unreadable).
fn run_row(variant: &str, r: &RunResult, curve: &[(f64, f64)]) -> Vec<String> {
    let note = match (&r.error, &r.note) {
        (Some(e), _) => format!("training failed: {e}"),
        (None, Some(n)) => n.clone(),
        (None, None) => String::new(),
    };
    vec![
        format!("`{variant}`"),
        r.seed_index.to_string(),
        r.lr.to_string(),
        format!("{:.3}", r.final_train_loss),
        late_drop(curve).map_or("-".to_string(), |d| format!("{d:.3}")),
        format!("{:.0}", r.train_wall_s),
        format!("{:.0}", r.eval_wall_s),
        format!("{:.0}", r.tokens_per_s),
        format!("`{}`", r.git_revision),
        note,
    ]
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
