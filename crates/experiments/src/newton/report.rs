//! The Newton's-law experiment as a [`PostTraining`] kind: runs a model per row, and writes the
//! report's section and verdict lines.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context as _, Result};

use super::experiment::{PhysicsResult, Settings, run};
use crate::plot::{Series, save_with};
use crate::post::{Figures, Inputs, PostTraining};
use crate::spec::{Experiment, Kind};

/// The name `--only` accepts for the Newton's-law experiment (its models are its own).
pub const ONLY: &str = "newton";

/// The Newton's-law experiment: results by trained variant.
#[derive(Debug, Default)]
pub struct Experiments {
    /// Results by variant (empty until run).
    pub results: BTreeMap<String, PhysicsResult>,
}

impl PostTraining for Experiments {
    fn kind(&self) -> Kind {
        Kind::Physics
    }

    fn only_name(&self) -> Option<&'static str> {
        Some(ONLY)
    }

    fn needs_trained_rows(&self) -> bool {
        false
    }

    fn run(&mut self, e: &Experiment, inputs: &Inputs<'_>) -> Result<()> {
        let settings = Settings::for_scale(inputs.scale.name);
        for r in &e.rows {
            if self.results.contains_key(&r.train) {
                continue;
            }
            let res = run(&settings, &r.train, &inputs.out.join("newton"))
                .with_context(|| format!("the physics experiment with `{}`", r.train))?;
            eprintln!(
                "reproduce: physics `{}`: acceleration error {:.3}, best law {} ({:.0} s)",
                r.train, res.accel_rel_rmse, res.best_law, res.wall_s
            );
            self.results.insert(r.train.clone(), res);
        }
        Ok(())
    }

    fn wall_s(&self) -> f64 {
        self.results.values().map(|p| p.wall_s).sum()
    }

    fn verdicts(&self) -> Vec<String> {
        verdicts(&self.results)
    }

    fn section(&self, md: &mut String, e: &Experiment, figures: Figures<'_>) -> Result<()> {
        section(md, e, &self.results, figures)
    }
}

fn section(
    md: &mut String,
    e: &Experiment,
    physics: &BTreeMap<String, PhysicsResult>,
    figures: Figures<'_>,
) -> Result<()> {
    let (figures_dir, figures_rel) = (figures.dir, figures.rel);
    let Some(any) = e.rows.iter().find_map(|r| physics.get(&r.train)) else {
        let _ = writeln!(md, "Not run in this invocation (select it with `--only {ONLY}`).");
        return Ok(());
    };
    let s = &any.settings;
    let _ = writeln!(
        md,
        "Each model: {} layers, width {}, {} heads; {} training orbits of {} steps (dt = {}), {} Adam steps of {} orbits; forces read from {} held-out orbits.\n",
        s.n_layer, s.d_model, s.n_head, s.train_orbits, s.seq_len, s.dt, s.steps, s.batch, s.test_orbits
    );
    let _ = writeln!(
        md,
        "| model | acceleration error (rel. RMSE) | best law (BIC) | its rel. RMSE | power-law fit: a (m1) | b (m2) | k (r) | Newton's law? | time |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let mut series: Vec<Series> = Vec::new();
    for (i, r) in e.rows.iter().enumerate() {
        let Some(p) = physics.get(&r.train) else {
            let _ = writeln!(md, "| {} | - | - | - | - | - | - | - | - |", r.label);
            continue;
        };
        let pl = |j: usize| p.power_law.map_or("-".to_string(), |(v, se)| format!("{:.2} ± {:.2}", v[j], se[j]));
        let _ = writeln!(
            md,
            "| {} | {:.3} | `{}` | {:.3} | {} | {} | {} | {} | {:.0} s |",
            r.label,
            p.accel_rel_rmse,
            p.best_law,
            p.best_law_rel_rmse,
            pl(1),
            pl(2),
            pl(3),
            if p.newton_recovered { "**yes**" } else { "no" },
            p.wall_s
        );
        series.push((r.label.clone(), i, false, p.ratio_by_r.iter().map(|&(x, y)| (x, y.log10())).collect()));
    }
    let _ = writeln!(
        md,
        "\nThe acceleration error is relative to the exact accelerations; predicting no correction to constant velocity scores 1. Newton's law is `a = 1, b = 1, k = -2` with `c = G = 1`.\n"
    );
    if let Some((lo, hi)) = series
        .iter()
        .flat_map(|s| s.3.iter().map(|p| p.0))
        .fold(None, |acc: Option<(f64, f64)>, x| Some(acc.map_or((x, x), |(a, b)| (a.min(x), b.max(x)))))
    {
        series.push(("Newton".into(), 7, true, vec![(lo, 0.0), (hi, 0.0)]));
    }
    let name = format!("{}_force_ratio", e.name);
    save_with(
        &figures_dir.join(&name),
        "Implied force over Newton's force against distance (median per bin)",
        ("log2 of the distance r", "log10(implied / Newton)"),
        &series,
    )?;
    let _ = writeln!(md, "![{}]({figures_rel}/{name}.png) ([SVG]({figures_rel}/{name}.svg))", e.title);
    Ok(())
}

/// One verdict line per physics result: whether that model's implied forces follow Newton's law.
fn verdicts(physics: &BTreeMap<String, PhysicsResult>) -> Vec<String> {
    if physics.is_empty() {
        return Vec::new();
    }
    let get = |v: &str| physics.get(v);
    let mut out = Vec::new();
    let describe = |p: &PhysicsResult| {
        let exps = p.power_law.map_or(String::new(), |(v, se)| {
            format!(
                " (fitted exponents a = {:.2} ± {:.2}, b = {:.2} ± {:.2}, k = {:.2} ± {:.2})",
                v[1], se[1], v[2], se[2], v[3], se[3]
            )
        });
        format!("{}: best law `{}`{exps}", p.variant, p.best_law)
    };
    match (get("softmax"), get("lssa+rw15")) {
        (Some(s), Some(r)) => {
            let claim = r.newton_recovered && !s.newton_recovered;
            out.push(format!(
                "**Newton's law recovered by LSSAR but not by softmax: {}.** {}; {}.",
                if claim { "reproduced" } else { "not reproduced at this scale" },
                describe(r),
                describe(s)
            ));
        }
        _ => {
            for p in physics.values() {
                out.push(format!("Newton's law: {}.", describe(p)));
            }
        }
    }
    out
}
