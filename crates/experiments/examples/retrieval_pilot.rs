//! The pilot that sized the retrieval benchmark (docs/PILOT.md): trains one model per (variant, seed)
//! with the `small` settings overridden by `key=value` arguments and prints its answer loss, accuracy
//! per length and bin, and its times, one JSON line per model.
//!
//! ```text
//! cargo run --release -p experiments --example retrieval_pilot -- variants=softmax,lssa+rw15 seeds=9000,9001 steps=600 batch=32
//! ```
//!
//! Keys: `variants` (comma-separated), `seeds` (comma-separated seed values, never the benchmark's
//! own), and any field of `experiments::retrieval::Settings` given as a TOML value (`steps=600`,
//! `d_model=64`, `multiples=[1,4,16]`).

use anyhow::{Context, Result};
use experiments::retrieval::report::{Bin, accuracy, answers};
use experiments::retrieval::{Settings, train_and_evaluate};

fn main() -> Result<()> {
    let mut variants = vec!["softmax".to_string()];
    let mut seeds = vec![9000u64];
    let mut table = toml::Table::try_from(Settings::for_scale("small"))?;
    for arg in std::env::args().skip(1) {
        let (k, v) = arg.split_once('=').with_context(|| format!("`{arg}` is not key=value"))?;
        match k {
            "variants" => variants = v.split(',').map(String::from).collect(),
            "seeds" => seeds = v.split(',').map(|s| s.parse()).collect::<Result<_, _>>()?,
            _ => {
                let value: toml::Value = toml::from_str::<toml::Table>(&format!("x = {v}"))?["x"].clone();
                anyhow::ensure!(table.contains_key(k), "no setting `{k}`");
                table.insert(k.to_string(), value);
            }
        }
    }
    for seed in seeds {
        let mut t = table.clone();
        t.insert("seed".into(), toml::Value::Integer(i64::try_from(seed)?));
        let s: Settings = t.try_into()?;
        for v in &variants {
            let r = train_and_evaluate(&s, v, 0, &[None])?;
            let mut cells = serde_json::Map::new();
            for ntk in [true, false] {
                for &m in &s.multiples {
                    for (bin, name) in [(Bin::Inside, "in"), (Bin::Beyond, "beyond")] {
                        if let Some(i) = accuracy(answers(&s, std::slice::from_ref(&r), ntk, None, &[m], bin)) {
                            let rope = if ntk || m == 1 { "ntk" } else { "plain" };
                            cells.insert(format!("{rope}_{m}x_{name}"), serde_json::json!(i.estimate));
                        }
                    }
                }
            }
            println!(
                "{}",
                serde_json::json!({
                    "variant": v, "seed": seed, "steps": s.steps, "batch": s.batch, "n_layer": s.n_layer,
                    "d_model": s.d_model, "answer_loss": r.train_loss, "train_s": r.train_s, "eval_s": r.eval_s,
                    "accuracy": cells,
                })
            );
        }
    }
    Ok(())
}
