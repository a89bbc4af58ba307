//! The pilot of training length (issue 58, `docs/PILOT.md`): how softmax's rise beyond the training
//! length, and each row's gap to softmax, grow with the training tokens of the `small` recipe, on
//! pilot seeds that no verdict reads.
//!
//! Its numbers are `docs/pilot/length.json`, written from the pilot's `result.json` files by
//! `examples/pilot_length.rs` and embedded here ([`length`]), so that the report draws the same figure
//! as `docs/PILOT.md` from the same data.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use crate::doc::{Align, Table};
use crate::plot::Series;
use crate::runner::RunResult;
use crate::spec::EvalKey;

/// The pilot's summary, as committed.
const LENGTH_JSON: &str = include_str!("../../../docs/pilot/length.json");

/// One pilot of training length: every (training steps, row, seed) with its losses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LengthPilot {
    /// What ran, in words.
    pub about: String,
    /// The command of each training length (`{steps}` stands for the count).
    pub command: String,
    /// Every (steps, row, seed), sorted.
    pub points: Vec<Point>,
}

/// One model of the pilot read one way (as trained, or with a post-hoc power).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// Optimiser steps it was trained for (the learning-rate schedule stretched to them).
    pub steps: usize,
    /// Training tokens (`steps x tokens per step`).
    pub tokens: usize,
    /// The trained variant.
    pub train: String,
    /// The post-hoc power it was read with, if any.
    pub posthoc: Option<u32>,
    /// The seed (the config's `seed`).
    pub seed: u64,
    /// The training loss of the last step.
    pub final_train_loss: f64,
    /// Validation loss by length multiple, NTK-scaled RoPE (1x is the same model under both).
    pub ntk: BTreeMap<usize, f64>,
    /// Validation loss by length multiple, plain RoPE.
    pub plain: BTreeMap<usize, f64>,
}

impl Point {
    /// The row's name as the report writes it (`lssa p=15 post hoc`).
    pub fn row(&self) -> String {
        match self.posthoc {
            Some(p) => format!("{} p={p} post hoc", self.train),
            None => self.train.clone(),
        }
    }

    /// The loss at `multiple` under NTK (`ntk`) or plain RoPE; 1x is the same under both.
    pub fn loss(&self, ntk: bool, multiple: usize) -> Option<f64> {
        if multiple == 1 || ntk { self.ntk.get(&multiple) } else { self.plain.get(&multiple) }.copied()
    }
}

/// The committed pilot (`docs/pilot/length.json`, embedded at build time).
pub fn length() -> Result<LengthPilot> {
    serde_json::from_str(LENGTH_JSON).context("docs/pilot/length.json")
}

impl LengthPilot {
    /// The pilot from its runs: every `result.json` under `dir/steps-<N>/` (one directory per training
    /// length, as `reproduce --out` wrote them), each trained variant read as trained and with every
    /// post-hoc power it was evaluated with.
    pub fn from_runs(dir: &Path, about: &str, command: &str) -> Result<LengthPilot> {
        let mut points = Vec::new();
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let steps_dir = entry?.path();
            if !steps_dir.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("steps-")) {
                continue;
            }
            for run in std::fs::read_dir(&steps_dir)? {
                let path = run?.path().join("result.json");
                let Ok(text) = std::fs::read_to_string(&path) else { continue };
                let r: RunResult = serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
                points.extend(points_of(&r).with_context(|| format!("{}", path.display()))?);
            }
        }
        points.sort_by_key(|a| (a.steps, a.row(), a.seed));
        Ok(LengthPilot { about: about.into(), command: command.into(), points })
    }

    /// The training lengths, ascending.
    pub fn steps(&self) -> Vec<usize> {
        let mut s: Vec<usize> = self.points.iter().map(|p| p.steps).collect();
        s.dedup();
        s
    }

    /// The rows, softmax first.
    pub fn rows(&self) -> Vec<String> {
        let mut r: Vec<String> = self.points.iter().map(Point::row).collect();
        r.sort_by_key(|n| (n != "softmax", n.clone()));
        r.dedup();
        r
    }

    /// `f` of each seed of `row` at `steps` (seeds in order), where `f` is defined.
    pub fn per_seed(&self, steps: usize, row: &str, f: impl Fn(&Point) -> Option<f64>) -> Vec<f64> {
        self.points.iter().filter(|p| p.steps == steps && p.row() == row).filter_map(f).collect()
    }

    /// Softmax's rise from 1x to `multiple` of each seed at `steps`.
    pub fn rise(&self, steps: usize, ntk: bool, multiple: usize) -> Vec<f64> {
        self.per_seed(steps, "softmax", |p| Some(p.loss(ntk, multiple)? - p.loss(ntk, 1)?))
    }

    /// `row` minus softmax at `multiple` of each seed at `steps`, paired by seed.
    pub fn gap(&self, steps: usize, row: &str, ntk: bool, multiple: usize) -> Vec<f64> {
        let at = |p: &Point| p.loss(ntk, multiple);
        let soft: BTreeMap<u64, f64> = self
            .points
            .iter()
            .filter(|p| p.steps == steps && p.row() == "softmax")
            .filter_map(|p| Some((p.seed, at(p)?)))
            .collect();
        self.points
            .iter()
            .filter(|p| p.steps == steps && p.row() == row)
            .filter_map(|p| Some(at(p)? - soft.get(&p.seed)?))
            .collect()
    }

    /// Millions of training tokens at `steps`.
    fn mtokens(&self, steps: usize) -> f64 {
        self.points.iter().find(|p| p.steps == steps).map_or(0.0, |p| p.tokens as f64 / 1e6)
    }

    /// The figure's series (means over seeds, x in millions of training tokens): softmax's rise from
    /// 1x to 8x under plain and NTK RoPE, and every other row's gap to softmax at 1x and at 8x
    /// (plain RoPE).
    pub fn series(&self) -> Vec<Series> {
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        let line = |f: &dyn Fn(usize) -> Vec<f64>| -> Vec<(f64, f64)> {
            self.steps().into_iter().filter_map(|s| Some((self.mtokens(s), mean(f(s))?))).collect()
        };
        let mut out: Vec<Series> = vec![
            ("softmax's rise 1x -> 8x, plain RoPE".into(), 0, false, line(&|s| self.rise(s, false, 8))),
            ("softmax's rise 1x -> 8x, NTK RoPE".into(), 0, true, line(&|s| self.rise(s, true, 8))),
        ];
        for (i, row) in self.rows().into_iter().filter(|r| r != "softmax").enumerate() {
            out.push((format!("{row} - softmax at 1x"), i + 1, true, line(&|s| self.gap(s, &row, false, 1))));
            out.push((format!("{row} - softmax at 8x, plain"), i + 1, false, line(&|s| self.gap(s, &row, false, 8))));
        }
        // A row read at 1x alone (softmax with p = 15 post hoc) has no 8x line.
        out.retain(|s| !s.3.is_empty());
        out
    }

    /// Draws [`LengthPilot::series`] to `<path>.png` and `.svg`.
    pub fn figure(&self, path_no_ext: &Path) -> Result<()> {
        crate::plot::save_with(
            path_no_ext,
            "Pilot (seeds apart from the verdicts'): softmax's rise and each row's gap against training",
            ("training tokens (millions, log scale)", "nats (rise: 8x - 1x; gap: row - softmax)"),
            &self.series(),
        )
    }

    /// One line per training length: tokens, softmax's 1x validation and last training loss, its
    /// rise to 8x and 16x under both RoPE treatments, and each row's gap to softmax at 1x and 8x
    /// (plain); every cell lists the seeds in order.
    pub fn table(&self) -> Table {
        let mut t = Table::new([
            ("steps", Align::Right),
            ("tokens", Align::Right),
            ("softmax 1x val (train)", Align::Left),
            ("rise 8x plain", Align::Left),
            ("rise 8x NTK", Align::Left),
            ("rise 16x plain", Align::Left),
            ("rise 16x NTK", Align::Left),
        ]);
        let others: Vec<String> = self.rows().into_iter().filter(|r| r != "softmax").collect();
        for r in &others {
            t.column(format!("{r} - softmax, 1x / 8x plain"), Align::Left);
        }
        let show = |v: &[f64]| v.iter().map(|x| format!("{x:+.3}")).collect::<Vec<_>>().join(", ");
        for s in self.steps() {
            let val = self.per_seed(s, "softmax", |p| p.loss(true, 1));
            let train = self.per_seed(s, "softmax", |p| Some(p.final_train_loss));
            let both: Vec<String> = val.iter().zip(&train).map(|(v, t)| format!("{v:.3} ({t:.3})")).collect();
            let mut row = vec![
                s.to_string(),
                format!("{:.1}M", self.mtokens(s)),
                both.join(", "),
                show(&self.rise(s, false, 8)),
                show(&self.rise(s, true, 8)),
                show(&self.rise(s, false, 16)),
                show(&self.rise(s, true, 16)),
            ];
            for r in &others {
                row.push(format!("{} / {}", show(&self.gap(s, r, false, 1)), show(&self.gap(s, r, false, 8))));
            }
            t.row(row);
        }
        t
    }
}

/// The points of one run: as trained, and with every post-hoc power it was evaluated with.
fn points_of(r: &RunResult) -> Result<Vec<Point>> {
    let cfg = trainer::config::TrainConfig::from_toml_with_overrides(&r.config, "result.json", &[])?;
    let mut powers: Vec<Option<u32>> = r.evals.iter().map(|(k, _)| k.posthoc).collect();
    powers.sort();
    powers.dedup();
    Ok(powers
        .into_iter()
        .map(|posthoc| {
            let pick = |ntk: bool| -> BTreeMap<usize, f64> {
                r.evals
                    .iter()
                    .filter(|(k, _)| k.posthoc == posthoc && (k.ntk == ntk || k.multiple == 1))
                    .map(|(k, l): &(EvalKey, _)| (k.multiple, l.loss))
                    .collect()
            };
            Point {
                steps: cfg.max_steps,
                tokens: cfg.max_steps * cfg.tokens_per_step,
                train: r.variant.clone(),
                posthoc,
                seed: cfg.seed,
                final_train_loss: r.final_train_loss,
                ntk: pick(true),
                plain: pick(false),
            }
        })
        .collect())
}
