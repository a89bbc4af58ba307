//! The pilots that sized the retrieval benchmark (docs/PILOT.md): trains one model per (regime,
//! variant, seed) with the `small` settings of the regime overridden by `key=value` arguments, and
//! prints its answer loss, its times and its accuracy (exact recall and key-conditional) per length
//! and bin, and pooled over the questions beyond the training length at every length past 1x (the
//! quantity the verdicts compare), one JSON line per model.
//!
//! ```text
//! cargo run --release -p experiments --example retrieval_pilot -- \
//!     regimes=spread-25,far-0 variants=softmax,lssa+rw15 seeds=9000,9001 steps=600
//! ```
//!
//! Keys: `regimes` (comma-separated cells of `defs/retrieval/regimes.toml`, e.g. `spread-0` or
//! `spread-0@torch-default`; default `spread-25`),
//! `variants` (comma-separated), `seeds` (comma-separated seed values, never the benchmark's own),
//! `posthoc` (a power also evaluated post hoc on `lssa` models; default 15), and any field of
//! `experiments::retrieval::Settings` given as a TOML value (`steps=600`, `d_model=64`,
//! `multiples=[1,4,16]`).

use anyhow::{Context, Result};
use experiments::retrieval::{Answers, Settings, cells, train_and_evaluate};

/// Share of `true` among the answers of `a` (exact or key-conditional) whose distance is in the bin.
fn share(a: &Answers, exact: bool, beyond: bool, t_train: u32) -> Option<f64> {
    let picked: Vec<bool> = a
        .distance
        .iter()
        .enumerate()
        .filter(|&(_, &d)| (d >= t_train) == beyond)
        .map(|(i, _)| if exact { a.exact[i] } else { a.correct[i] })
        .collect();
    (!picked.is_empty()).then(|| picked.iter().filter(|&&x| x).count() as f64 / picked.len() as f64)
}

fn main() -> Result<()> {
    let mut variants: Vec<experiments::spec::TrainedVariant> = vec!["softmax".parse()?];
    let mut seeds = vec![9000u64];
    let mut names = vec!["spread-25".to_string()];
    let mut posthoc = 15u32;
    let mut overrides = Vec::new();
    for arg in std::env::args().skip(1) {
        let (k, v) = arg.split_once('=').with_context(|| format!("`{arg}` is not key=value"))?;
        match k {
            "variants" => variants = v.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "seeds" => seeds = v.split(',').map(|s| s.parse()).collect::<Result<_, _>>()?,
            "regimes" => names = v.split(',').map(String::from).collect(),
            "posthoc" => posthoc = v.parse()?,
            _ => overrides.push((k.to_string(), toml::from_str::<toml::Table>(&format!("x = {v}"))?["x"].clone())),
        }
    }
    let all = cells()?;
    for name in &names {
        let regime = all.iter().find(|r| &r.name == name).with_context(|| format!("no regime `{name}`"))?;
        let mut table = toml::Table::try_from(Settings::for_regime("small", regime))?;
        for (k, v) in &overrides {
            anyhow::ensure!(table.contains_key(k), "no setting `{k}`");
            table.insert(k.clone(), v.clone());
        }
        for &seed in &seeds {
            let mut t = table.clone();
            t.insert("seed".into(), toml::Value::Integer(i64::try_from(seed)?));
            let s: Settings = t.try_into()?;
            let tt = s.t_train as u32;
            for v in &variants {
                let powers = if *v == "lssa" { vec![None, Some(posthoc)] } else { vec![None] };
                let r = train_and_evaluate(&s, v, 0, &powers, None)?;
                let mut cells = serde_json::Map::new();
                for &p in &powers {
                    let tag = p.map_or(String::new(), |p| format!("rw{p}_"));
                    for ntk in [true, false] {
                        let rope = |m: usize| if ntk || m == 1 { "ntk" } else { "plain" };
                        let mut pooled = [(0.0, 0usize); 2];
                        for &m in &s.multiples {
                            let Some(a) = r.get(ntk, p, m) else { continue };
                            for (beyond, bin) in [(false, "in"), (true, "beyond")] {
                                for (exact, score) in [(true, "exact"), (false, "key")] {
                                    if let Some(x) = share(a, exact, beyond, tt) {
                                        cells.insert(
                                            format!("{tag}{}_{m}x_{bin}_{score}", rope(m)),
                                            serde_json::json!(x),
                                        );
                                    }
                                }
                            }
                            if m > 1 {
                                for (slot, exact) in pooled.iter_mut().zip([true, false]) {
                                    let n = a.distance.iter().filter(|&&d| d >= tt).count();
                                    slot.0 += share(a, exact, true, tt).unwrap_or(0.0) * n as f64;
                                    slot.1 += n;
                                }
                            }
                        }
                        for ((sum, n), score) in pooled.iter().zip(["exact", "key"]) {
                            let name = format!("{tag}{}_beyond_{score}", if ntk { "ntk" } else { "plain" });
                            cells.insert(name, serde_json::json!(sum / (*n).max(1) as f64));
                        }
                    }
                }
                println!(
                    "{}",
                    serde_json::json!({
                        "regime": name, "variant": v, "seed": seed, "steps": s.steps, "batch": s.batch,
                        "lr": s.lr, "answer_loss": r.train_loss, "train_s": r.train_s, "eval_s": r.eval_s,
                        "accuracy": cells,
                    })
                );
            }
        }
    }
    Ok(())
}
