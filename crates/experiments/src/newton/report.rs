//! The Newton's-law experiment as a [`PostTraining`] kind: runs the models of each row, and writes
//! the report's section and the verdict on "LSSAR recovers Newton's law and softmax does not".

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context as _, Result};

use super::experiment::{PhysicsResult, Settings, run};
use super::fit::{self, BAND, NEWTON, SeedOrbits};
use crate::plot::{Series, save_with};
use crate::post::{Figures, Inputs, PostTraining};
use crate::spec::{Experiment, Kind};
use crate::stats::{Interval, Verdict};

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
            crate::progress::say(&format!(
                "physics `{}`: Newton's law {} ({:.0} s)",
                r.train,
                res.newton().word(),
                res.wall_s()
            ));
            self.results.insert(r.train.clone(), res);
        }
        Ok(())
    }

    fn wall_s(&self) -> f64 {
        self.results.values().map(PhysicsResult::wall_s).sum()
    }

    fn verdicts(&self) -> Vec<String> {
        verdict(&self.results).map(|v| v.line).into_iter().collect()
    }

    fn section(&self, md: &mut String, e: &Experiment, figures: Figures<'_>) -> Result<()> {
        section(md, e, &self.results, figures)
    }
}

/// A variant's law in words.
fn law_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Reproduced => "Newton's law",
        Verdict::Contradicted => "not Newton's law",
        Verdict::Inconclusive | Verdict::SmallerThanClaimed => "cannot tell",
    }
}

fn show3(e: &[Interval; 3]) -> String {
    format!("a = {}, b = {}, k = {}", e[0].show(), e[1].show(), e[2].show())
}

/// The Newton verdict, with its parts for tests.
#[derive(Clone, Debug, PartialEq)]
pub struct NewtonVerdict {
    /// The verdict.
    pub verdict: Verdict,
    /// The report's line.
    pub line: String,
}

/// "LSSAR recovers Newton's law and softmax does not": reproduced when LSSAR's exponents are
/// Newton's and softmax's are not; contradicted when LSSAR's are not Newton's or softmax's are;
/// inconclusive otherwise. `None` unless both ran.
pub fn verdict(physics: &BTreeMap<String, PhysicsResult>) -> Option<NewtonVerdict> {
    let (r, s) = (physics.get("lssa+rw15")?, physics.get("softmax")?);
    let (vr, vs) = (r.newton(), s.newton());
    let verdict = match (vr, vs) {
        (Verdict::Reproduced, Verdict::Contradicted) => Verdict::Reproduced,
        (Verdict::Contradicted, _) | (_, Verdict::Reproduced) => Verdict::Contradicted,
        _ => Verdict::Inconclusive,
    };
    let describe = |p: &PhysicsResult, v: Verdict| {
        let e = p.exponents().map_or("no fit (too few forces above the error floor)".into(), |e| show3(&e));
        format!("{}: {} ({e})", p.variant, law_word(v))
    };
    let diff = difference(r, s).map_or(String::new(), |d| format!("; LSSAR minus softmax: {}", show3(&d)));
    Some(NewtonVerdict {
        verdict,
        line: format!(
            "**LSSAR recovers Newton's law and softmax does not**: **{}**. {}; {}{diff} (95% intervals over orbits and {} seeds; Newton's law when every exponent's interval lies within {BAND} of `a = 1, b = 1, k = -2`).",
            verdict.word(),
            describe(r, vr),
            describe(s, vs),
            r.seeds.len()
        ),
    })
}

/// The table of each seed's model: its errors, exponents with intervals from the bootstrap over
/// orbits alone, the law they give, and the grammar's best law on its samples.
fn per_seed(md: &mut String, e: &Experiment, physics: &BTreeMap<String, PhysicsResult>) {
    let _ = writeln!(
        md,
        "Each seed's model alone (intervals from the bootstrap over orbits; the grammar's best law fitted to that seed's forces above the floor):\n"
    );
    let _ = writeln!(
        md,
        "| model | seed | acceleration error beyond T | forces above the floor | a (m1) | b (m2) | k (r) | law | best law of the grammar |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---|---|---|---|---|");
    for r in &e.rows {
        let Some(p) = physics.get(&r.train) else { continue };
        for (i, x) in p.seeds.iter().enumerate() {
            let ex = p.seed_exponents(i);
            let cell = |j: usize| ex.map_or("-".to_string(), |e| e[j].show());
            let law = ex.map_or(Verdict::Inconclusive, |e| fit::is_newton(&e));
            let _ = writeln!(
                md,
                "| {} | {} | {:.3} | {:.0}% | {} | {} | {} | {} | `{}` |",
                r.label,
                x.seed_index,
                x.accel_rel_rmse_beyond,
                100.0 * x.kept as f64 / x.samples.max(1) as f64,
                cell(0),
                cell(1),
                cell(2),
                law_word(law),
                x.best_law
            );
        }
    }
    let _ = writeln!(md);
}

/// The exponents of `a` minus those of `b`, paired on orbits and seeds.
fn difference(a: &PhysicsResult, b: &PhysicsResult) -> Option<[Interval; 3]> {
    let sa: Vec<SeedOrbits> = a.seeds.iter().map(|s| s.orbits.clone()).collect();
    let sb: Vec<SeedOrbits> = b.seeds.iter().map(|s| s.orbits.clone()).collect();
    fit::exponents(&[(1.0, &sa), (-1.0, &sb)], 0x4449_4646)
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
        "Each model: {} layers, width {}, {} heads, RoPE; {} training orbits of {} steps (dt = {}), {} Adam steps of {} orbits; {} seeds per variant; forces read from {} held-out orbits of {} steps, beyond step {}.\n",
        s.n_layer,
        s.d_model,
        s.n_head,
        s.train_orbits,
        s.seq_len,
        s.dt,
        s.steps,
        s.batch,
        s.seeds,
        s.test_orbits,
        s.seq_len * s.eval_multiple,
        s.seq_len
    );
    let _ = writeln!(
        md,
        "| model | next-position loss | acceleration error within / beyond T | forces above the floor | a (m1) | b (m2) | k (r) | law | time |"
    );
    let _ = writeln!(md, "|---|---:|---|---:|---|---|---|---|---:|");
    let mean = |p: &PhysicsResult, f: fn(&super::experiment::SeedResult) -> f64| {
        p.seeds.iter().map(f).sum::<f64>() / p.seeds.len().max(1) as f64
    };
    let mut series: Vec<Series> = Vec::new();
    for (i, r) in e.rows.iter().enumerate() {
        let Some(p) = physics.get(&r.train) else {
            let _ = writeln!(md, "| {} | - | - | - | - | - | - | - | - |", r.label);
            continue;
        };
        let ex = p.exponents();
        let cell = |j: usize| ex.map_or("-".to_string(), |e| e[j].show());
        let kept: usize = p.seeds.iter().map(|x| x.kept).sum();
        let all: usize = p.seeds.iter().map(|x| x.samples).sum();
        let _ = writeln!(
            md,
            "| {} | {:.3} | {:.3} / {:.3} | {:.0}% | {} | {} | {} | {} | {:.0} s |",
            r.label,
            mean(p, |x| x.final_train_loss),
            mean(p, |x| x.accel_rel_rmse_within),
            mean(p, |x| x.accel_rel_rmse_beyond),
            100.0 * kept as f64 / all.max(1) as f64,
            cell(0),
            cell(1),
            cell(2),
            law_word(p.newton()),
            p.wall_s()
        );
        series.push((r.label.clone(), i, false, p.ratio_by_r.iter().map(|&(x, y)| (x, y.log10())).collect()));
    }
    let _ = writeln!(
        md,
        "\nLosses and errors are means over seeds. The acceleration error is relative to the exact accelerations (predicting constant velocity scores 1), within the training length and beyond it. Exponents: the seed mean with its 95% interval over orbits and seeds; Newton's law is `a = {}, b = {}, k = {}`, and counts as recovered when all three intervals lie within {BAND} of it.\n",
        NEWTON[0], NEWTON[1], NEWTON[2]
    );
    if let (Some(a), Some(b)) = (physics.get("lssa+rw15"), physics.get("softmax"))
        && let Some(d) = difference(a, b)
    {
        let _ = writeln!(md, "LSSAR minus softmax, paired on orbits and seeds: {}.\n", show3(&d));
    }
    per_seed(md, e, physics);
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
        "Implied force over Newton's force against distance (seed 0, beyond T, median per bin)",
        ("log2 of the distance r", "log10(implied / Newton)"),
        &series,
    )?;
    let _ = writeln!(md, "![{}]({figures_rel}/{name}.png) ([SVG]({figures_rel}/{name}.svg))", e.title);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::newton::experiment::SeedResult;
    use crate::newton::regress::{Normal, Sample};

    /// A result whose every seed's forces follow `F = m1 m2 r^k` exactly (no noise).
    fn exact(variant: &str, k: f64) -> PhysicsResult {
        let orbit = |o: usize| {
            let (m1, m2) = (0.5 + 0.1 * o as f64, 1.5 - 0.07 * o as f64);
            let samples: Vec<Sample> = (0..10)
                .flat_map(|i| {
                    let r = 0.5 + 0.2 * i as f64;
                    [Sample { m1, m2, r, f: m1 * m2 * r.powf(k) }, Sample { m1: m2, m2: m1, r, f: m1 * m2 * r.powf(k) }]
                })
                .collect();
            Normal::of(&samples)
        };
        let seed = |i: usize| SeedResult {
            seed_index: i,
            final_train_loss: 1.0,
            accel_rel_rmse_within: 0.1,
            accel_rel_rmse_beyond: 0.2,
            floor: 0.01,
            kept: 200,
            samples: 200,
            orbits: SeedOrbits { orbits: (0..10).map(orbit).collect() },
            best_law: "F = m1 m2 r^-2".into(),
            wall_s: 1.0,
        };
        PhysicsResult {
            variant: variant.into(),
            settings: Settings::for_scale("small"),
            revision: String::new(),
            seeds: (0..3).map(seed).collect(),
            ratio_by_r: Vec::new(),
        }
    }

    #[test]
    fn the_verdict_follows_each_variants_law() {
        let mut m = BTreeMap::new();
        m.insert("lssa+rw15".to_string(), exact("lssa+rw15", -2.0));
        m.insert("softmax".to_string(), exact("softmax", -1.0));
        let v = verdict(&m).unwrap();
        assert_eq!(v.verdict, Verdict::Reproduced, "{}", v.line);
        assert!(v.line.contains("LSSAR minus softmax") && v.line.contains("k = -1.000"), "{}", v.line);
        m.insert("softmax".to_string(), exact("softmax", -2.0));
        assert_eq!(verdict(&m).unwrap().verdict, Verdict::Contradicted, "softmax recovers it too");
        m.insert("lssa+rw15".to_string(), exact("lssa+rw15", -3.0));
        m.insert("softmax".to_string(), exact("softmax", -1.0));
        assert_eq!(verdict(&m).unwrap().verdict, Verdict::Contradicted, "LSSAR does not");
        m.remove("softmax");
        assert!(verdict(&m).is_none());
    }

    #[test]
    fn each_seed_gets_its_own_row_with_its_own_law() {
        let physics_exp = crate::spec::all().unwrap().into_iter().find(|e| e.kind == Kind::Physics).unwrap();
        let mut m = BTreeMap::new();
        m.insert("lssa+rw15".to_string(), exact("lssa+rw15", -2.0));
        let mut soft = exact("softmax", -2.0);
        // Seed 1 of softmax follows an inverse-distance law instead.
        soft.seeds[1] = exact("softmax", -1.0).seeds[1].clone();
        m.insert("softmax".to_string(), soft);
        let mut md = String::new();
        per_seed(&mut md, &physics_exp, &m);
        let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| model")).collect();
        let ran = physics_exp.rows.iter().filter(|r| m.contains_key(&r.train)).count();
        assert_eq!(rows.len(), 3 * ran, "{md}");
        assert!(rows.iter().any(|l| l.contains("| 1 |") && l.contains("-1.000 [")), "seed 1's k of -1: {md}");
        let newton = rows.iter().filter(|l| l.contains("| Newton's law |")).count();
        let not_newton = rows.iter().filter(|l| l.contains("| not Newton's law |")).count();
        assert_eq!((newton, not_newton), (3 * ran - 1, 1), "{md}");
    }
}
