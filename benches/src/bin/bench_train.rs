//! bench-train: the trainer's training step against the PyTorch eager loop a user would write, at the
//! `small` scale's shape, side by side in one run; and a profile of where the trainer's step spends
//! its time.
//!
//! Runbook:
//!
//! ```text
//! cargo xtask bench train                          # T = 64, 256; softmax, lssa, lssa+rw15; writes docs/bench/train-cpu.{md,json}
//! cargo xtask bench train --lengths 64 --no-write  # a quick look
//! ```
//!
//! What is compared, per (attention, T), in rounds (one cell of each side per round, the side that
//! goes first alternating):
//!
//! - the trainer: [`trainer::train::train`] itself (the loop `trainer train` runs: data, forward,
//!   backward, clipping, AdamW, the metrics line) on `configs/small.toml`'s model and recipe, fed random
//!   token ids, with its default `shards` (the batch split over the threads); its tokens/s is the
//!   median of the per-step rates after the warm-up steps;
//! - PyTorch: `benches/python/train_eager.py` (nanoGPT-style: the same model, `torch.optim.AdamW` and
//!   `clip_grad_norm_` with their defaults, `F.scaled_dot_product_attention` for softmax and the
//!   project's `lssa.attention` for the others, so both sides run the same attention kernels), in the
//!   torch venv's Python, with the same threads, shape and step counts; once as a user runs it, once
//!   with the process settings the trainer makes for itself ([`trainer::process::keep_freed_memory`]
//!   and [`trainer::process::limit_openmp_spinning`], here through glibc's `MALLOC_*_` variables and
//!   `GOMP_SPINCOUNT`), so the table shows what they are worth on both sides;
//! - PyTorch under `torch.compile` (Inductor, its C++ backend on the CPU; `--compile` of the same
//!   script), with the trainer's process settings: what a PyTorch user runs to go faster. Its
//!   compilation falls in the untimed warm-up steps (each cell is a fresh process; Inductor's on-disk
//!   cache makes the later rounds' compilations shorter);
//! - for the variants other than softmax, PyTorch with the attention materialised
//!   (`lssa.reference_attention`: the variant as PyTorch ops with `(B, H, T, T)` weights), the loop a
//!   PyTorch user without this project's kernels writes (issue 36's baseline).
//!
//! The ratios are the medians over rounds of the trainer's tokens/s over PyTorch's in the same round.
//! The profile (`--profile`, on by default) times the phases of one unsharded step (`shards = 1`)
//! (zeroing the gradients, the batch, forward, backward, clipping, AdamW), once with the optimiser the
//! trainer uses and once with the per-tensor AdamW it replaced.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use gpt_model::model::{ForwardOptions, Gpt};
use lssa_benches::env;
use lssa_benches::measure::median;
use serde::Serialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use trainer::config::TrainConfig;
use trainer::optim::AdamW;
use trainer::train::{BatchSource, RunOptions, Single};

const FORMAT: &str = "lssa-bench-train";
const FORMAT_VERSION: u32 = 3; // 2: the materialised-attention side; 3: the torch.compile side

#[derive(Parser, Debug)]
#[command(name = "bench-train", about = "The trainer's step against a PyTorch eager loop, side by side")]
struct Cli {
    /// Sequence lengths (the batch stays `configs/small.toml`'s).
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    lengths: Vec<usize>,
    /// Attention variants (attn-core names).
    #[arg(long, value_delimiter = ',', default_value = "softmax,lssa,lssa+rw15")]
    variants: Vec<String>,
    /// Rounds per cell.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Tokens timed per cell and round (steps = tokens / (batch · T), at least 10).
    #[arg(long, default_value_t = 131_072)]
    tokens: usize,
    /// Untimed steps before each cell's timed ones.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Threads for libtorch and the kernels, on both sides.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// The Python with torch (and the `lssa` package for the variants other than softmax); default:
    /// `gpt_model::runtime::torch_python` (`LSSA_TORCH_PYTHON`, else the venv of the loaded libtorch).
    #[arg(long)]
    python: Option<PathBuf>,
    /// Skip the phase profile.
    #[arg(long)]
    no_profile: bool,
    /// Print only; do not write docs/bench/train-cpu.{md,json}.
    #[arg(long)]
    no_write: bool,
}

#[derive(Serialize)]
struct Row {
    variant: String,
    t: usize,
    batch: usize,
    steps: usize,
    trainer_tokens_per_s: Vec<f64>,
    pytorch_tokens_per_s: Vec<f64>,
    /// PyTorch with the trainer's process settings.
    pytorch_tuned_tokens_per_s: Vec<f64>,
    /// PyTorch with the attention materialised (empty for softmax, where both run SDPA).
    pytorch_materialised_tokens_per_s: Vec<f64>,
    /// PyTorch under `torch.compile`, with the trainer's process settings.
    pytorch_compiled_tokens_per_s: Vec<f64>,
    /// Trainer / PyTorch in the same round, over the rounds.
    ratio: Ratio,
    /// The same against PyTorch with the trainer's process settings.
    ratio_tuned: Ratio,
    /// The same against PyTorch with the attention materialised (none for softmax).
    ratio_materialised: Option<Ratio>,
    /// The same against PyTorch under `torch.compile`.
    ratio_compiled: Ratio,
}

/// The per-round ratios of two sides: their median and their spread (smallest and largest).
#[derive(Serialize, Clone, Copy)]
struct Ratio {
    median: f64,
    min: f64,
    max: f64,
}

impl Ratio {
    /// `ours[i] / theirs[i]` over the rounds `i`.
    fn of(ours: &[f64], theirs: &[f64]) -> Ratio {
        let r: Vec<f64> = ours.iter().zip(theirs).map(|(a, b)| a / b).collect();
        let fold = |f: fn(f64, f64) -> f64, init| r.iter().copied().fold(init, f);
        Ratio { median: median(&r), min: fold(f64::min, f64::INFINITY), max: fold(f64::max, f64::NEG_INFINITY) }
    }
}

impl std::fmt::Display for Ratio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2}x ({:.2}-{:.2})", self.median, self.min, self.max)
    }
}

#[derive(Serialize)]
struct Phase {
    phase: &'static str,
    ms: f64,
}

#[derive(Serialize)]
struct Profile {
    variant: String,
    optimiser: &'static str,
    steps: usize,
    phases: Vec<Phase>,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: env::Header,
    threads: usize,
    torch: String,
    rows: Vec<Row>,
    profiles: Vec<Profile>,
}

/// Random token ids (attn-core's seeded generator): what both sides train on (the step's cost does
/// not depend on the ids). Its position is the number of batches drawn.
struct Source {
    seed: u64,
    rng: attn_core::fixtures::Rng,
    drawn: u64,
    vocab: usize,
    batch: usize,
    t: usize,
}

impl Source {
    fn new(seed: u64, cfg: &TrainConfig) -> Self {
        let (vocab, batch, t) = (cfg.model.vocab_size, cfg.batch_size, cfg.model.context_len);
        Source { seed, rng: attn_core::fixtures::Rng::new(seed), drawn: 0, vocab, batch, t }
    }
}

impl BatchSource for Source {
    fn next_batch(&mut self) -> Result<(Vec<i64>, Vec<i64>)> {
        let mut x = Vec::with_capacity(self.batch * self.t);
        let mut y = Vec::with_capacity(self.batch * self.t);
        for _ in 0..self.batch {
            let row: Vec<i64> = (0..=self.t).map(|_| (self.rng.next_u64() % self.vocab as u64) as i64).collect();
            x.extend_from_slice(&row[..self.t]);
            y.extend_from_slice(&row[1..]);
        }
        self.drawn += 1;
        Ok((x, y))
    }
    fn position(&self) -> serde_json::Value {
        serde_json::json!(self.drawn)
    }
    fn seek(&mut self, pos: &serde_json::Value) -> Result<()> {
        let target = pos.as_u64().context("a u64 position")?;
        (self.rng, self.drawn) = (attn_core::fixtures::Rng::new(self.seed), 0);
        while self.drawn < target {
            self.next_batch()?;
        }
        Ok(())
    }
    fn tokenizer_id(&self) -> String {
        "random".into()
    }
}

fn small_config(variant: &str, t: usize, steps: usize, threads: usize, out_dir: &Path) -> Result<TrainConfig> {
    let path = env::workspace_root().join("configs/small.toml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut cfg = TrainConfig::from_toml_with_overrides(&text, "configs/small.toml", &[])?;
    cfg.model.attention = variant.parse()?;
    cfg.model.context_len = t;
    cfg.tokens_per_step = cfg.batch_size * t;
    cfg.max_steps = steps;
    cfg.warmup_steps = 1;
    cfg.eval_every = 0;
    cfg.ckpt_every = 0;
    cfg.threads = threads;
    cfg.out_dir = out_dir.to_path_buf();
    Ok(cfg)
}

/// The trainer's median tokens/s over its steps after `warmup`.
fn trainer_cell(variant: &str, t: usize, steps: usize, warmup: usize, threads: usize) -> Result<f64> {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(variant, t, warmup + steps, threads, dir.path())?;
    let mut source = Source::new(7, &cfg);
    let opts = RunOptions { overwrite: true, ..Default::default() };
    let summary = trainer::train::train(&cfg, &mut source, &Single, &opts)?;
    let rates: Vec<f64> = summary.steps.iter().skip(warmup).map(|m| m.tokens_per_s).collect();
    Ok(median(&rates))
}

#[derive(serde::Deserialize)]
struct EagerOut {
    tokens_per_s: f64,
}

/// The trainer's process settings as environment variables: glibc's for
/// [`trainer::process::keep_freed_memory`], libgomp's for [`trainer::process::limit_openmp_spinning`].
fn tuned() -> [(&'static str, String); 3] {
    use trainer::process::{MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD, OPENMP_SPIN_COUNT};
    [
        ("MALLOC_MMAP_THRESHOLD_", MALLOC_MMAP_THRESHOLD.to_string()),
        ("MALLOC_TRIM_THRESHOLD_", MALLOC_TRIM_THRESHOLD.to_string()),
        ("GOMP_SPINCOUNT", OPENMP_SPIN_COUNT.to_string()),
    ]
}

/// How the PyTorch side runs.
#[derive(Clone, Copy)]
enum Eager {
    /// As a user runs it, with the fused op for the LSSA variants.
    Plain,
    /// With the trainer's allocator and OpenMP settings.
    Tuned,
    /// With the attention as materialised PyTorch ops.
    Materialised,
    /// Under `torch.compile`, with the trainer's allocator and OpenMP settings.
    Compiled,
}

/// One side of a round: the trainer, or the PyTorch loop run one way.
#[derive(Clone, Copy)]
enum Side {
    Trainer,
    PyTorch(Eager),
}

#[allow(clippy::too_many_arguments)]
fn pytorch_cell(
    python: &Path,
    how: Eager,
    variant: &str,
    t: usize,
    batch: usize,
    steps: usize,
    warmup: usize,
    threads: usize,
) -> Result<f64> {
    let script = env::workspace_root().join("benches/python/train_eager.py");
    let mut cmd = Command::new(python);
    match how {
        Eager::Tuned | Eager::Compiled => {
            cmd.envs(tuned());
        }
        // This process runs with GOMP_SPINCOUNT set (see `main`): not for a plain PyTorch run.
        Eager::Plain | Eager::Materialised => {
            for (name, _) in tuned() {
                cmd.env_remove(name);
            }
        }
    }
    let out = cmd
        .arg(&script)
        .args(matches!(how, Eager::Materialised).then_some("--materialised"))
        .args(matches!(how, Eager::Compiled).then_some("--compile"))
        .args(["--attention", variant, "--json"])
        .args(["--threads", &threads.to_string(), "--context", &t.to_string(), "--batch", &batch.to_string()])
        .args(["--steps", &steps.to_string(), "--warmup", &warmup.to_string()])
        .output()
        .with_context(|| format!("running {} {}", python.display(), script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({}):\n{}", script.display(), out.status, String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("train_eager.py printed nothing")?;
    Ok(serde_json::from_str::<EagerOut>(line).with_context(|| format!("reading `{line}`"))?.tokens_per_s)
}

fn torch_version(python: &Path) -> String {
    Command::new(python)
        .args(["-c", "import torch; print(torch.__version__)"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

fn lssa_importable(python: &Path) -> bool {
    Command::new(python).args(["-c", "import lssa"]).output().is_ok_and(|o| o.status.success())
}

/// How one step of the trainer splits into phases: the trainer's step (train.rs) written out with a
/// clock between the phases; `fused` picks the trainer's optimiser or the per-tensor AdamW it replaced.
fn profile(variant: &str, steps: usize, fused: bool) -> Result<Profile> {
    let dir = tempfile::tempdir()?;
    let cfg = small_config(variant, 64, steps, 0, dir.path())?;
    let (b, t) = (cfg.batch_size as i64, cfg.model.context_len as i64);
    let vs = VarStore::new(Device::Cpu);
    let model = Gpt::new_seeded(&vs.root(), &cfg.model, 1)?;
    let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    let mut opt = AdamW::new(params, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay);
    let mut source = Source::new(11, &cfg);
    const NAMES: [&str; 6] = ["zero gradients", "batch", "forward", "backward", "clip", "AdamW"];
    let mut acc = [0.0f64; 6];
    let warmup = 5;
    for i in 0..warmup + steps {
        let mut marks = [Instant::now(); 7];
        if fused {
            opt.zero_grad().map_err(anyhow::Error::msg)?;
        } else {
            for s in &opt.slots {
                let mut g = s.param.grad();
                if g.defined() {
                    let _ = g.zero_();
                }
            }
        }
        marks[1] = Instant::now();
        let (x, y) = source.next_batch()?;
        let (x, y) = (Tensor::from_slice(&x).view([b, t]), Tensor::from_slice(&y).view([b, t]));
        marks[2] = Instant::now();
        let loss = model.loss(&x, &y, &ForwardOptions::default())?;
        marks[3] = Instant::now();
        loss.backward();
        let _ = loss.to_kind(Kind::Double).double_value(&[]);
        marks[4] = Instant::now();
        if fused {
            opt.clip_grad_norm(cfg.grad_clip).map_err(anyhow::Error::msg)?;
        } else {
            clip_per_tensor(&opt, cfg.grad_clip);
        }
        marks[5] = Instant::now();
        if fused {
            opt.step(1e-3).map_err(anyhow::Error::msg)?;
        } else {
            opt.step_unfused(1e-3);
        }
        marks[6] = Instant::now();
        if i >= warmup {
            for (k, a) in acc.iter_mut().enumerate() {
                *a += (marks[k + 1] - marks[k]).as_secs_f64();
            }
        }
    }
    let mut phases: Vec<Phase> =
        NAMES.iter().zip(acc).map(|(&phase, s)| Phase { phase, ms: s * 1e3 / steps as f64 }).collect();
    phases.push(Phase { phase: "step", ms: acc.iter().sum::<f64>() * 1e3 / steps as f64 });
    Ok(Profile {
        variant: variant.to_string(),
        optimiser: if fused { "fused (the trainer's)" } else { "per-tensor (before)" },
        steps,
        phases,
    })
}

/// The clipping the trainer had before its multi-tensor ops: one float64 norm and one read per tensor.
fn clip_per_tensor(opt: &AdamW, max_norm: f64) {
    let _g = tch::no_grad_guard();
    let grads = opt.grads();
    let norm =
        grads.iter().map(|g| g.to_kind(Kind::Double).square().sum(Kind::Double).double_value(&[])).sum::<f64>().sqrt();
    if norm > max_norm {
        for mut g in grads {
            let _ = g.g_mul_scalar_(max_norm / (norm + 1e-6));
        }
    }
}

fn main() -> Result<()> {
    env::git_revision(); // the revision the run starts from, before anything can edit the tree
    // The trainer side runs in this process: with the OpenMP setting `trainer` makes for itself.
    trainer::process::limit_openmp_spinning();
    let cli = Cli::parse();
    let python = cli.python.clone().unwrap_or_else(|| gpt_model::runtime::torch_python().0);
    let torch = torch_version(&python);
    if cli.variants.iter().any(|v| v != "softmax") && !lssa_importable(&python) {
        bail!(
            "{} cannot `import lssa` (the PyTorch side of the LSSA rows): install it with `cargo xtask test` \
             (which builds and installs the wheel) or `{} -m pip install ./crates/lssa-py`, or pass --variants softmax",
            python.display(),
            python.display()
        );
    }
    let _threads = trainer::process::claim_threads(cli.threads)?;
    trainer::process::keep_freed_memory(); // as trainer::train does: the profile below runs under it too
    let cfg = small_config("softmax", 64, 1, cli.threads, Path::new("."))?;
    let batch = cfg.batch_size;

    let mut profiles = Vec::new();
    if !cli.no_profile {
        for variant in ["softmax", "lssa+rw15"] {
            for fused in [false, true] {
                let p = profile(variant, 100, fused)?;
                eprintln!(
                    "profile {variant} ({}): {}",
                    p.optimiser,
                    p.phases.iter().map(|ph| format!("{} {:.2} ms", ph.phase, ph.ms)).collect::<Vec<_>>().join(", ")
                );
                profiles.push(p);
            }
        }
    }

    let mut rows = Vec::new();
    for &t in &cli.lengths {
        let steps = (cli.tokens / (batch * t)).max(10);
        for variant in &cli.variants {
            let (mut ours, mut theirs, mut tuned, mut mat, mut compiled) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
            let mut sides = vec![
                Side::Trainer,
                Side::PyTorch(Eager::Plain),
                Side::PyTorch(Eager::Tuned),
                Side::PyTorch(Eager::Compiled),
            ];
            // Softmax runs SDPA on every PyTorch side: no materialised side of its own.
            if variant != "softmax" {
                sides.push(Side::PyTorch(Eager::Materialised));
            }
            for round in 0..cli.rounds {
                // The order of the sides rotates from round to round.
                for i in 0..sides.len() {
                    match sides[(i + round) % sides.len()] {
                        Side::Trainer => ours.push(trainer_cell(variant, t, steps, cli.warmup, cli.threads)?),
                        Side::PyTorch(how) => {
                            let rate = pytorch_cell(&python, how, variant, t, batch, steps, cli.warmup, cli.threads)?;
                            match how {
                                Eager::Plain => theirs.push(rate),
                                Eager::Tuned => tuned.push(rate),
                                Eager::Materialised => mat.push(rate),
                                Eager::Compiled => compiled.push(rate),
                            }
                        }
                    }
                }
                eprintln!(
                    "{variant} T={t} round {}: trainer {:.0} tokens/s, PyTorch eager {:.0} (with the trainer's process settings {:.0}; \
                     torch.compile {:.0}{})",
                    round + 1,
                    ours[round],
                    theirs[round],
                    tuned[round],
                    compiled[round],
                    mat.get(round).map_or(String::new(), |m| format!("; materialised attention {m:.0}"))
                );
            }
            let ratio = |other: &[f64]| Ratio::of(&ours, other);
            rows.push(Row {
                variant: variant.clone(),
                t,
                batch,
                steps,
                ratio: ratio(&theirs),
                ratio_tuned: ratio(&tuned),
                ratio_materialised: (!mat.is_empty()).then(|| ratio(&mat)),
                ratio_compiled: ratio(&compiled),
                trainer_tokens_per_s: ours,
                pytorch_tokens_per_s: theirs,
                pytorch_tuned_tokens_per_s: tuned,
                pytorch_materialised_tokens_per_s: mat,
                pytorch_compiled_tokens_per_s: compiled,
            });
        }
    }

    let report =
        Report { header: env::Header::now(FORMAT, FORMAT_VERSION), threads: cli.threads, torch, rows, profiles };
    let md = markdown(&report, cli.warmup);
    print!("{md}");
    if !cli.no_write {
        let dir = env::workspace_root().join("docs/bench");
        lssa_benches::sections::write(&dir, "train-cpu", &report.header.cpu, &md, serde_json::to_value(&report)?)?;
    }
    Ok(())
}

fn markdown(r: &Report, warmup: usize) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# The trainer's step against a PyTorch eager loop (CPU)\n");
    let _ = writeln!(s, "- CPU: {} ({} threads for libtorch and the kernels, on both sides)", r.header.cpu, r.threads);
    let _ = writeln!(s, "- date: {}; git revision: `{}`; torch {}", r.header.date, r.header.git_revision, r.torch);
    let _ = writeln!(s, "- command: `{}`", r.header.command);
    let _ = writeln!(
        s,
        "- model: `configs/small.toml` (4 layers, width 128, 2 heads of 64, vocabulary 2048, batch {}), random token ids",
        r.rows.first().map_or(16, |row| row.batch)
    );
    let _ = writeln!(
        s,
        "- trainer: `trainer::train` (what `trainer train` runs); PyTorch: `benches/python/train_eager.py` (the same model, \
         `torch.optim.AdamW` and `clip_grad_norm_` with their defaults; SDPA for softmax, `lssa.attention` otherwise)"
    );
    let _ = writeln!(
        s,
        "- PyTorch, torch.compile: the same loop with the model under `torch.compile` (Inductor, its C++ backend on the \
         CPU; f32) and the trainer's process settings; compilation falls in the untimed warm-up steps"
    );
    let _ = writeln!(
        s,
        "- PyTorch (tuned): the same loop with the trainer's process settings, which a PyTorch user can set too: \
         its allocator's (`trainer::process::keep_freed_memory`: `MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=1073741824`) \
         and OpenMP's (`trainer::process::limit_openmp_spinning`: `GOMP_SPINCOUNT={}`)",
        trainer::process::OPENMP_SPIN_COUNT
    );
    let _ = writeln!(
        s,
        "- timing: each cell {warmup} untimed steps, then the median per-step tokens/s; the sides take turns within a \
         round, in an order that rotates; ratios = median over rounds of trainer / PyTorch in the same round, \
         with the smallest and largest round in brackets"
    );
    let _ = writeln!(
        s,
        "- PyTorch, materialised attention (not for softmax, where every side runs SDPA): the same loop with \
         `lssa.reference_attention`, the variant as PyTorch ops with (B, H, T, T) weights: what a PyTorch user \
         without this project's kernels writes\n"
    );
    let _ = writeln!(
        s,
        "| attention | T | steps | trainer tokens/s (rounds) | PyTorch eager (rounds) | PyTorch eager, tuned (rounds) | PyTorch torch.compile (rounds) | PyTorch eager, materialised attention (rounds) | trainer / PyTorch | trainer / PyTorch tuned | trainer / torch.compile | trainer / PyTorch materialised |"
    );
    let _ = writeln!(s, "|---|---:|---:|---|---|---|---|---|---:|---:|---:|---:|");
    let list = |xs: &[f64]| xs.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" / ");
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.variant,
            row.t,
            row.steps,
            list(&row.trainer_tokens_per_s),
            list(&row.pytorch_tokens_per_s),
            list(&row.pytorch_tuned_tokens_per_s),
            list(&row.pytorch_compiled_tokens_per_s),
            if row.pytorch_materialised_tokens_per_s.is_empty() {
                "(SDPA)".to_string()
            } else {
                list(&row.pytorch_materialised_tokens_per_s)
            },
            row.ratio,
            row.ratio_tuned,
            row.ratio_compiled,
            row.ratio_materialised.map_or("-".to_string(), |r| r.to_string())
        );
    }
    if !r.profiles.is_empty() {
        let _ = writeln!(
            s,
            "\n## Where the trainer's step goes (T = 64, ms per step, mean over {} steps)\n\n\
             The step unsharded: one forward and backward of the whole batch on libtorch's threads \
             (`shards = 1`); on the CPU the trainer splits it over its threads by default \
             (`trainer::train::shards`).\n",
            r.profiles[0].steps
        );
        let names: Vec<&str> = r.profiles[0].phases.iter().map(|p| p.phase).collect();
        let _ = writeln!(s, "| attention | optimiser | {} |", names.join(" | "));
        let _ = writeln!(s, "|---|---|{}|", names.iter().map(|_| "---:").collect::<Vec<_>>().join("|"));
        for p in &r.profiles {
            let cells: Vec<String> = p.phases.iter().map(|ph| format!("{:.2}", ph.ms)).collect();
            let _ = writeln!(s, "| {} | {} | {} |", p.variant, p.optimiser, cells.join(" | "));
        }
    }
    s
}
