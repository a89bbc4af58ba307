//! The Newton's-law experiment as a [`PostTraining`] kind: runs the models of each row, and builds
//! the report's section and the verdict on "LSSAR recovers Newton's law and softmax does not" (the
//! experiment's last row against its first, `defs/newton/experiment.toml`).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};

use super::experiment::{PhysicsResult, Settings, run};
use super::fit::{self, BAND, NEWTON, SeedOrbits};
use crate::doc::{Align, Block, Figure, Table};
use crate::plot::{Series, save_with};
use crate::post::{Figures, Inputs, PostTraining};
use crate::spec::{Experiment, Kind, Row};
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
            if self.results.contains_key(r.train.as_str()) {
                continue;
            }
            let res = run(&settings, &r.train, &inputs.out.join("newton"), inputs.stop)
                .with_context(|| format!("the physics experiment with `{}`", r.train))?;
            crate::progress::say(&format!(
                "physics `{}`: Newton's law {} ({:.0} s)",
                r.train,
                res.newton().word(),
                res.wall_s()
            ));
            self.results.insert(r.train.to_string(), res);
        }
        Ok(())
    }

    fn wall_s(&self) -> f64 {
        self.results.values().map(PhysicsResult::wall_s).sum()
    }

    fn verdicts(&self) -> Vec<String> {
        let e = crate::spec::all().ok().and_then(|all| all.into_iter().find(|e| e.kind == Kind::Physics));
        e.and_then(|e| verdict(&e, &self.results)).map(|v| v.line).into_iter().collect()
    }

    fn section(&self, e: &Experiment, figures: Figures<'_>) -> Result<Vec<Block>> {
        section(e, &self.results, figures)
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

/// The rows the verdict compares, from the definition: the claimed one (its last row, the paper's
/// LSSAR) and the baseline (its first, softmax).
fn compared(e: &Experiment) -> Option<(&Row, &Row)> {
    Some((e.rows.last()?, e.rows.first()?)).filter(|(a, b)| a.train != b.train)
}

/// "LSSAR recovers Newton's law and softmax does not" (the compared rows of `e`: its last against its first): reproduced when
/// LSSAR's exponents are Newton's and softmax's are not; contradicted when LSSAR's are not Newton's or
/// softmax's are; inconclusive otherwise. `None` unless both ran.
pub fn verdict(e: &Experiment, physics: &BTreeMap<String, PhysicsResult>) -> Option<NewtonVerdict> {
    let (claimed, baseline) = compared(e)?;
    let (r, s) = (physics.get(claimed.train.as_str())?, physics.get(baseline.train.as_str())?);
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
    let diff = difference(r, s)
        .map_or(String::new(), |d| format!("; `{}` minus `{}`: {}", claimed.train, baseline.train, show3(&d)));
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
fn per_seed(e: &Experiment, physics: &BTreeMap<String, PhysicsResult>) -> Table {
    let mut t = Table::new([
        ("model", Align::Left),
        ("seed", Align::Right),
        ("acceleration error beyond T", Align::Right),
        ("forces above the floor", Align::Right),
        ("a (m1)", Align::Left),
        ("b (m2)", Align::Left),
        ("k (r)", Align::Left),
        ("law", Align::Left),
        ("best law of the grammar", Align::Left),
    ]);
    for r in &e.rows {
        let Some(p) = physics.get(r.train.as_str()) else { continue };
        for (i, x) in p.seeds.iter().enumerate() {
            let ex = p.seed_exponents(i);
            let cell = |j: usize| ex.map_or("-".to_string(), |e| e[j].show());
            let law = ex.map_or(Verdict::Inconclusive, |e| fit::is_newton(&e));
            t.row(vec![
                r.label.clone(),
                x.seed_index.to_string(),
                format!("{:.3}", x.accel_rel_rmse_beyond),
                format!("{:.0}%", 100.0 * x.kept as f64 / x.samples.max(1) as f64),
                cell(0),
                cell(1),
                cell(2),
                law_word(law).to_string(),
                format!("`{}`", x.best_law),
            ]);
        }
    }
    t
}

/// The exponents of `a` minus those of `b`, paired on orbits and seeds.
fn difference(a: &PhysicsResult, b: &PhysicsResult) -> Option<[Interval; 3]> {
    let sa: Vec<SeedOrbits> = a.seeds.iter().map(|s| s.orbits.clone()).collect();
    let sb: Vec<SeedOrbits> = b.seeds.iter().map(|s| s.orbits.clone()).collect();
    fit::exponents(&[(1.0, &sa), (-1.0, &sb)], 0x4449_4646)
}

/// The table of each row's models: losses and errors (means over seeds), exponents with their
/// intervals over orbits and seeds, the law, and the time; with the figure's series on the way.
fn models(e: &Experiment, physics: &BTreeMap<String, PhysicsResult>) -> (Table, Vec<Series>) {
    let mut t = Table::new([
        ("model", Align::Left),
        ("next-position loss", Align::Right),
        ("acceleration error within / beyond T", Align::Left),
        ("forces above the floor", Align::Right),
        ("a (m1)", Align::Left),
        ("b (m2)", Align::Left),
        ("k (r)", Align::Left),
        ("law", Align::Left),
        ("time", Align::Right),
    ]);
    let mean = |p: &PhysicsResult, f: fn(&super::experiment::SeedResult) -> f64| {
        p.seeds.iter().map(f).sum::<f64>() / p.seeds.len().max(1) as f64
    };
    let mut series: Vec<Series> = Vec::new();
    for (i, r) in e.rows.iter().enumerate() {
        let Some(p) = physics.get(r.train.as_str()) else {
            t.row(std::iter::once(r.label.clone()).chain(std::iter::repeat_n("-".to_string(), 8)).collect());
            continue;
        };
        let ex = p.exponents();
        let cell = |j: usize| ex.map_or("-".to_string(), |e| e[j].show());
        let kept: usize = p.seeds.iter().map(|x| x.kept).sum();
        let all: usize = p.seeds.iter().map(|x| x.samples).sum();
        t.row(vec![
            r.label.clone(),
            format!("{:.3}", mean(p, |x| x.final_train_loss)),
            format!("{:.3} / {:.3}", mean(p, |x| x.accel_rel_rmse_within), mean(p, |x| x.accel_rel_rmse_beyond)),
            format!("{:.0}%", 100.0 * kept as f64 / all.max(1) as f64),
            cell(0),
            cell(1),
            cell(2),
            law_word(p.newton()).to_string(),
            format!("{:.0} s", p.wall_s()),
        ]);
        series.push((r.label.clone(), i, false, p.ratio_by_r.iter().map(|&(x, y)| (x, y.log10())).collect()));
    }
    (t, series)
}

fn section(e: &Experiment, physics: &BTreeMap<String, PhysicsResult>, figures: Figures<'_>) -> Result<Vec<Block>> {
    let Some(any) = e.rows.iter().find_map(|r| physics.get(r.train.as_str())) else {
        return Ok(vec![Block::Text(format!("Not run in this invocation (select it with `--only {ONLY}`)."))]);
    };
    let s = &any.settings;
    let mut blocks = vec![Block::Text(format!(
        "Each model: {} layers, width {}, {} heads, RoPE; {} training orbits of {} steps (dt = {}), {} Adam steps of {} orbits; {} seeds per variant; forces read from {} held-out orbits of {} steps, beyond step {}.",
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
    ))];
    let (table, mut series) = models(e, physics);
    blocks.push(Block::Table(table));
    blocks.push(Block::Text(format!(
        "Losses and errors are means over seeds. The acceleration error is relative to the exact accelerations (predicting constant velocity scores 1), within the training length and beyond it. Exponents: the seed mean with its 95% interval over orbits and seeds; Newton's law is `a = {}, b = {}, k = {}`, and counts as recovered when all three intervals lie within {BAND} of it.",
        NEWTON[0], NEWTON[1], NEWTON[2]
    )));
    if let Some((ra, rb)) = compared(e)
        && let (Some(a), Some(b)) = (physics.get(ra.train.as_str()), physics.get(rb.train.as_str()))
        && let Some(d) = difference(a, b)
    {
        let (ta, tb) = (&ra.train, &rb.train);
        blocks.push(Block::Text(format!("`{ta}` minus `{tb}`, paired on orbits and seeds: {}.", show3(&d))));
    }
    blocks.push(Block::from(
        "Each seed's model alone (intervals from the bootstrap over orbits; the grammar's best law fitted to that seed's forces above the floor):",
    ));
    blocks.push(Block::Table(per_seed(e, physics)));
    if let Some((lo, hi)) = series
        .iter()
        .flat_map(|s| s.3.iter().map(|p| p.0))
        .fold(None, |acc: Option<(f64, f64)>, x| Some(acc.map_or((x, x), |(a, b)| (a.min(x), b.max(x)))))
    {
        series.push(("Newton".into(), 7, true, vec![(lo, 0.0), (hi, 0.0)]));
    }
    let name = format!("{}_force_ratio", e.name);
    save_with(
        &figures.dir.join(&name),
        "Implied force over Newton's force against distance (seed 0, beyond T, median per bin)",
        ("log2 of the distance r", "log10(implied / Newton)"),
        &series,
    )?;
    blocks.push(Block::Figure(Figure::drawn(e.title.clone(), figures.rel, &name)));
    Ok(blocks)
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

    fn physics_experiment() -> Experiment {
        crate::spec::all().unwrap().into_iter().find(|e| e.kind == Kind::Physics).unwrap()
    }

    #[test]
    fn the_verdict_follows_each_variants_law() {
        let e = physics_experiment();
        assert_eq!(compared(&e).map(|(a, b)| (a.train.as_str(), b.train.as_str())), Some(("lssa+rw15", "softmax")));
        let verdict = |m: &BTreeMap<String, PhysicsResult>| verdict(&e, m);
        let mut m = BTreeMap::new();
        m.insert("lssa+rw15".to_string(), exact("lssa+rw15", -2.0));
        m.insert("softmax".to_string(), exact("softmax", -1.0));
        let v = verdict(&m).unwrap();
        assert_eq!(v.verdict, Verdict::Reproduced, "{}", v.line);
        assert!(v.line.contains("`lssa+rw15` minus `softmax`") && v.line.contains("k = -1.000"), "{}", v.line);
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
        let physics_exp = physics_experiment();
        let mut m = BTreeMap::new();
        m.insert("lssa+rw15".to_string(), exact("lssa+rw15", -2.0));
        let mut soft = exact("softmax", -2.0);
        // Seed 1 of softmax follows an inverse-distance law instead.
        soft.seeds[1] = exact("softmax", -1.0).seeds[1].clone();
        m.insert("softmax".to_string(), soft);
        let t = per_seed(&physics_exp, &m);
        let ran = physics_exp.rows.iter().filter(|r| m.contains_key(r.train.as_str())).count();
        assert_eq!(t.rows.len(), 3 * ran, "{t:?}");
        let seed1 = (0..t.rows.len())
            .find(|&i| t.cell(i, "model") == Some("Softmax") && t.cell(i, "seed") == Some("1"))
            .unwrap();
        assert!(t.cell(seed1, "k (r)").unwrap().starts_with("-1.000 ["), "seed 1's k of -1: {t:?}");
        assert_eq!(t.cell(seed1, "law"), Some("not Newton's law"));
        let laws = t.column_cells("law");
        assert_eq!(laws.iter().filter(|l| **l == "Newton's law").count(), 3 * ran - 1, "{t:?}");
    }
}
