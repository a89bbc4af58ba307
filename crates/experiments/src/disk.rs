//! The disk space a reproduction's plan will write, estimated before it trains anything, and the
//! check that refuses to start when the output's file system has less free ([`check`]): a two-hour
//! run should not die of a full disk in its last hour.
//!
//! What is counted ([`estimate`]), each an upper bound from the plan and the scale:
//!
//! - checkpoints: every run keeps its scale's `keep_last` training checkpoints (the parameters as
//!   f32 with the two AdamW moments: 12 bytes a parameter, plus the header), and each of `jobs`
//!   trainings in flight holds one more while its next one is written;
//! - training logs: a `metrics.jsonl` line per step;
//! - results: every `result.json`, whose evaluations keep a loss per validation window (three at
//!   a multiple above 1x), every seed counted with every evaluation of its variant;
//! - figures: the report's (PNG and SVG) and the attention maps drawn beside the runs;
//! - caches of the retrieval benchmark (one file per model) and of Newton's law (one per variant).
//!
//! The sizes per item below were read off the `smoke` scale's output and rounded up: `--all` wrote
//! 174 MiB there, and the estimate says 208 MiB (mostly the figures' and caches' generous sizes).
//! Whatever the output directory already holds counts as written: a continued reproduction needs
//! only the rest.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Result, bail};

use crate::scale::Scale;
use crate::spec::{EvalKey, Experiment, Kind, SinkKey, TrainedVariant};

/// A checkpoint's header: tensor names, shapes and offsets, the config and the training state.
const CKPT_HEADER_BYTES: u64 = 64 << 10;
/// One line of `metrics.jsonl`.
const METRICS_LINE_BYTES: u64 = 320;
/// A `result.json` without its evaluations (the config, the provenance, the sink statistics).
const RESULT_BASE_BYTES: u64 = 16 << 10;
/// An evaluation's own fields.
const EVAL_BASE_BYTES: u64 = 512;
/// One per-window loss as pretty-printed JSON (an f32 on its own indented line).
const WINDOW_VALUE_BYTES: u64 = 32;
/// The figures of one experiment's report section (PNG and SVG).
const FIGURE_BYTES: u64 = 1 << 20;
/// One attention map (PNG) beside a run.
const MAP_BYTES: u64 = 256 << 10;
/// One retrieval model's cached file without its answers (settings, provenance).
const RETRIEVAL_MODEL_BASE_BYTES: u64 = 4 << 10;
/// One answered question in a retrieval model's file: two verdicts and a distance.
const RETRIEVAL_ANSWER_BYTES: u64 = 20;
/// One Newton's-law variant's cached fits (every seed's orbits; 12 KB at `smoke`).
const NEWTON_VARIANT_BYTES: u64 = 4 << 20;

/// What a plan writes, by kind, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Training checkpoints kept, plus one being written per training in flight.
    pub checkpoints: u64,
    /// `metrics.jsonl` of every run.
    pub logs: u64,
    /// `result.json` of every run.
    pub results: u64,
    /// The report's figures and the attention maps.
    pub figures: u64,
    /// The retrieval benchmark's and Newton's law's caches.
    pub caches: u64,
}

impl Estimate {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.checkpoints + self.logs + self.results + self.figures + self.caches
    }

    /// `checkpoints 1.2 GiB, training logs 3.1 MiB, ...`.
    pub fn breakdown(&self) -> String {
        [
            ("checkpoints", self.checkpoints),
            ("training logs", self.logs),
            ("results", self.results),
            ("figures", self.figures),
            ("retrieval and Newton caches", self.caches),
        ]
        .iter()
        .filter(|(_, b)| *b > 0)
        .map(|(what, b)| format!("{what} {}", human(*b)))
        .collect::<Vec<_>>()
        .join(", ")
    }
}

/// One training checkpoint of `scale`'s model: 12 bytes per parameter (the f32 weights and the two
/// AdamW moments) plus the header.
pub fn checkpoint_bytes(scale: &Scale) -> u64 {
    scale.train.model.n_params() as u64 * 12 + CKPT_HEADER_BYTES
}

/// What the plan writes: the trainings of `plan` (`seeds[variant]` seeds each, one when absent)
/// with their evaluations and the sink measurements of `sinks`, `jobs` trainings at a time, the
/// report's sections of `experiments`, and the models of the post-training experiments of `post`
/// (those that will run).
pub fn estimate(
    scale: &Scale,
    plan: &BTreeMap<TrainedVariant, Vec<EvalKey>>,
    seeds: &BTreeMap<String, usize>,
    sinks: &BTreeMap<String, Vec<SinkKey>>,
    experiments: &[Experiment],
    post: &[&Experiment],
    jobs: usize,
) -> Result<Estimate> {
    let t = scale.train.model.context_len;
    let longest = plan.values().flatten().map(|k| k.multiple).max().unwrap_or(1);
    let spans = scale.val_targets.div_ceil(longest * t).max(1) as u64;
    let eval_bytes = |k: &EvalKey| {
        let windows = spans * (longest / k.multiple.max(1)) as u64;
        EVAL_BASE_BYTES + windows * if k.multiple == 1 { 1 } else { 3 } * WINDOW_VALUE_BYTES
    };
    let mut e = Estimate::default();
    let mut runs = 0u64;
    for (variant, needs) in plan {
        let n = seeds.get(variant.as_str()).copied().unwrap_or(1) as u64;
        runs += n;
        e.results += n * (RESULT_BASE_BYTES + needs.iter().map(eval_bytes).sum::<u64>());
        let maps = sinks.get(variant.as_str()).map_or(0, |s| s.iter().filter(|k| k.map).count()) as u64;
        e.figures += maps * MAP_BYTES;
    }
    let ckpt = checkpoint_bytes(scale);
    let in_flight = runs.min(jobs.max(1) as u64);
    e.checkpoints = (runs * scale.train.keep_last.max(1) as u64 + in_flight) * ckpt;
    e.logs = runs * scale.train.max_steps as u64 * METRICS_LINE_BYTES;
    e.figures += experiments.len() as u64 * FIGURE_BYTES;
    for p in post {
        match p.kind {
            Kind::Retrieval => {
                let mut largest = 0u64;
                for r in crate::retrieval::plans(p, scale.name)? {
                    let s = &r.settings;
                    // A model stopped by a signal keeps its weights and moments until it finishes.
                    let params = r.rows.keys().filter_map(|v| s.model(v).ok()).map(|m| m.n_params()).max().unwrap_or(0);
                    largest = largest.max(params as u64 * 12 + CKPT_HEADER_BYTES);
                    // Every power at 1x, and with both RoPE treatments beyond it.
                    let readings = (2 * s.multiples.len()).saturating_sub(1) as u64;
                    let answers = readings * (s.prompts * s.asked) as u64 * RETRIEVAL_ANSWER_BYTES;
                    for powers in r.rows.values() {
                        e.caches += s.seeds as u64 * (RETRIEVAL_MODEL_BASE_BYTES + powers.len() as u64 * answers);
                    }
                }
                // The stopped models' states: one per job at most.
                e.caches += jobs.max(1) as u64 * largest;
            }
            Kind::Physics => e.caches += p.rows.len() as u64 * NEWTON_VARIANT_BYTES,
            _ => {}
        }
    }
    Ok(e)
}

/// Refuses, before anything is trained, a plan that writes `estimate` under `out` when `out`'s file
/// system has less free than it still needs (the estimate less what `out` already holds); `free`
/// answers the free bytes of `out`'s file system (`trainer::process::free_bytes`, or a stand-in in
/// tests). Returns the bytes still needed.
pub fn check(estimate: &Estimate, out: &Path, free: &dyn Fn(&Path) -> Result<u64>) -> Result<u64> {
    let total = estimate.total();
    let there = bytes_under(out);
    let needed = total.saturating_sub(there);
    let free = free(out)?;
    if free < needed {
        bail!(
            "not enough disk space for this reproduction in {}: its plan writes about {} ({}){}, so it needs {} more, and the file system has {} free; free at least {} (or give --out a directory on another file system), then run the same command again",
            out.display(),
            human(total),
            estimate.breakdown(),
            if there > 0 { format!(", of which {} is there already", human(there)) } else { String::new() },
            human(needed),
            human(free),
            human(needed - free)
        );
    }
    Ok(needed)
}

/// Bytes of the files under `dir` (0 when it does not exist; unreadable entries count 0).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => bytes_under(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// `512 B`, `3.4 MiB`, `1.20 GiB`.
pub fn human(bytes: u64) -> String {
    const MIB: f64 = (1u64 << 20) as f64;
    const GIB: f64 = (1u64 << 30) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.2} GiB", b / GIB)
    } else if b >= MIB {
        format!("{:.1} MiB", b / MIB)
    } else if bytes >= 1024 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{bytes} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(variants: &[&str], keys: &[EvalKey]) -> BTreeMap<TrainedVariant, Vec<EvalKey>> {
        variants.iter().map(|v| (v.parse().unwrap(), keys.to_vec())).collect()
    }

    #[test]
    fn checkpoints_count_every_runs_kept_files_and_one_per_job_at_twelve_bytes_a_parameter() {
        let scale = Scale::by_name("small").unwrap();
        // The small scale: 4 layers of width 128, vocabulary 2048 (padded), about 1.05M parameters.
        let params = scale.train.model.n_params() as u64;
        assert!((1_000_000..1_100_000).contains(&params), "{params}");
        let one = checkpoint_bytes(&scale);
        assert!(one > params * 12 && one < params * 12 + (1 << 20), "{one}");
        let key = EvalKey { ntk: true, posthoc: None, multiple: 1 };
        let plan = plan_of(&["softmax", "lssa"], &[key]);
        let seeds = BTreeMap::from([("lssa".to_string(), 3)]);
        let e = estimate(&scale, &plan, &seeds, &BTreeMap::new(), &[], &[], 2).unwrap();
        // 4 runs (softmax once, lssa three times), keep_last 1 each, 2 more in flight.
        assert_eq!(scale.train.keep_last, 1);
        assert_eq!(e.checkpoints, 6 * one);
        assert_eq!(e.logs, 4 * scale.train.max_steps as u64 * METRICS_LINE_BYTES);
        // More seeds, more results; longer evaluations keep three values per window.
        let long = plan_of(&["softmax", "lssa"], &[key, EvalKey { multiple: 16, ..key }]);
        let e16 = estimate(&scale, &long, &seeds, &BTreeMap::new(), &[], &[], 2).unwrap();
        assert!(e16.results > e.results && e16.checkpoints == e.checkpoints);
        assert!(e.total() == e.checkpoints + e.logs + e.results + e.figures + e.caches);
    }

    #[test]
    fn the_check_refuses_less_free_than_needed_and_counts_what_is_there() {
        let out = tempfile::tempdir().unwrap();
        let e = Estimate { checkpoints: 10 << 20, results: 1 << 20, ..Default::default() };
        let free = |n: u64| move |_: &Path| -> Result<u64> { Ok(n) };
        let err = check(&e, out.path(), &free(4 << 20)).unwrap_err().to_string();
        for needle in
            ["not enough disk space", "11.0 MiB", "checkpoints 10.0 MiB", "4.0 MiB free", "free at least 7.0 MiB"]
        {
            assert!(err.contains(needle), "`{needle}` missing: {err}");
        }
        assert!(err.contains(&out.path().display().to_string()), "{err}");
        assert_eq!(check(&e, out.path(), &free(11 << 20)).unwrap(), 11 << 20);
        // A continued run: 8 MiB of it is already written, 3 MiB to go.
        std::fs::create_dir_all(out.path().join("lssa")).unwrap();
        std::fs::write(out.path().join("lssa/ckpt_00000500.safetensors"), vec![0u8; 8 << 20]).unwrap();
        assert_eq!(check(&e, out.path(), &free(3 << 20)).unwrap(), 3 << 20);
        // A directory not made yet holds nothing.
        assert!(check(&e, &out.path().join("new"), &free(1 << 20)).is_err());
    }
}
