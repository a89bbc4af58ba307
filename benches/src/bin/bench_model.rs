//! bench-model: one GPT-2 block at the `gpt2-124m` shape (width 768, 12 heads of 64, MLP 4x), forward
//! and backward through libtorch's autograd, with the attention `reference` (tch ops, materialised
//! `T x T`) against `fused` (attn-kernels through the C++ autograd bridge), side by side in one run.
//!
//! Runbook:
//!
//! ```text
//! cargo xtask bench model                               # T = 1024, 4096; lssa, lssa+rw15, softmax; writes docs/bench/model-cpu.{md,json}
//! cargo xtask bench model --lengths 512 --no-write      # a quick look
//! ```
//!
//! What is timed: `loss = model.loss(x, y); loss.backward()` for a 1-block model (vocabulary 64, so the
//! embedding and output layer are negligible next to the block), B = 1, f32, on `--threads` threads for
//! libtorch and the kernels' rayon pool alike. Each cell: a warm-up, then the median of up to 5
//! repetitions within 6 s.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

use std::fmt::Write as _;

use anyhow::{Context, Result};
use clap::Parser;
use gpt_model::config::{AttnImpl, ModelConfig};
use gpt_model::model::{ForwardOptions, Gpt};
use lssa_benches::env;
use lssa_benches::measure::{self, Policy};
use serde::Serialize;
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

const FORMAT: &str = "lssa-bench-model";
const FORMAT_VERSION: u32 = 1;

#[derive(Parser, Debug)]
#[command(name = "bench-model", about = "One gpt2-124m block, forward+backward: fused vs reference attention")]
struct Cli {
    /// Sequence lengths.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096")]
    lengths: Vec<usize>,
    /// Attention variants (attn-core names).
    #[arg(long, value_delimiter = ',', default_value = "lssa,lssa+rw15,softmax")]
    variants: Vec<String>,
    /// Threads for libtorch and the kernels; default: all cores.
    #[arg(long)]
    threads: Option<usize>,
    /// Print only; do not write docs/bench/model-cpu.{md,json}.
    #[arg(long)]
    no_write: bool,
}

#[derive(Serialize)]
struct Row {
    variant: String,
    t: usize,
    implementation: &'static str,
    median_ms: f64,
    /// Median over rounds of the reference step's time over the fused step's (same on both rows).
    reference_over_fused: Option<f64>,
    samples_ms: Vec<f64>,
    warmup_counted: bool,
}

#[derive(Serialize)]
struct Report {
    #[serde(flatten)]
    header: env::Header,
    threads: usize,
    rows: Vec<Row>,
}

fn block_config(variant: &str, t: usize) -> ModelConfig {
    ModelConfig {
        n_layer: 1,
        vocab_size: 64,
        context_len: t,
        attention: variant.parse().unwrap_or_else(|e| panic!("`{variant}` is not a variant: {e}")),
        attn_impl: AttnImpl::Reference,
        ..ModelConfig::gpt2_124m()
    }
}

fn main() -> Result<()> {
    env::git_revision(); // the revision the run starts from, before anything can edit the tree
    let cli = Cli::parse();
    let threads = cli.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    tch::set_num_threads(threads as i32);
    // The global pool: the kernels run on it when called from libtorch's autograd (tensors are not Sync,
    // so the model cannot be moved into a scoped pool).
    rayon::ThreadPoolBuilder::new().num_threads(threads).build_global().context("building the rayon pool")?;
    let policy = Policy { max_reps: 5, cell_budget_s: 6.0, long_run_s: 3.0, ..Policy::default() };
    let mut rows = Vec::new();
    for &t in &cli.lengths {
        for variant in &cli.variants {
            let cfg = block_config(variant, t);
            tch::manual_seed(0);
            let vs = VarStore::new(Device::Cpu);
            let model = Gpt::new(&vs.root(), &cfg).with_context(|| format!("model for {variant}"))?;
            let x = Tensor::randint(64, [1, t as i64], (Kind::Int64, Device::Cpu));
            let y = Tensor::randint(64, [1, t as i64], (Kind::Int64, Device::Cpu));
            // Reference and fused in rounds (one step of each per round), as bench-kernels times SDPA
            // against the fused kernels: load from elsewhere then hits both sides of the ratio.
            let names = ["reference", "fused"];
            let step = |imp: AttnImpl| {
                let (model, x, y) = (&model, &x, &y);
                let opts = ForwardOptions { attn_impl: Some(imp), ..Default::default() };
                move || -> Result<()> {
                    let loss = model.loss(x, y, &opts)?;
                    loss.backward();
                    Ok(())
                }
            };
            let timings = measure::time_rounds(&policy, &mut [step(AttnImpl::Reference), step(AttnImpl::Fused)]);
            let timings: Vec<measure::Timing> = timings
                .into_iter()
                .zip(names)
                .map(|(t, n)| t.with_context(|| format!("{variant} {n}")))
                .collect::<Result<_>>()?;
            let ratio = measure::paired_ratio(&timings[0], &timings[1]);
            for (name, timing) in names.into_iter().zip(timings) {
                eprintln!("T={t:>5} {variant:<10} {name:<9} {:>9.1} ms", timing.median_ms());
                rows.push(Row {
                    variant: variant.clone(),
                    t,
                    implementation: name,
                    median_ms: timing.median_ms(),
                    reference_over_fused: ratio,
                    samples_ms: timing.samples_ms,
                    warmup_counted: timing.warmup_counted,
                });
            }
        }
    }
    let report = Report { header: env::Header::now(FORMAT, FORMAT_VERSION), threads, rows };
    let md = markdown(&report, &cli);
    print!("{md}");
    if !cli.no_write {
        let dir = env::workspace_root().join("docs/bench");
        lssa_benches::sections::write(&dir, "model-cpu", &report.header.cpu, &md, serde_json::to_value(&report)?)?;
    }
    Ok(())
}

fn markdown(r: &Report, cli: &Cli) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# One GPT-2 block (gpt2-124m shape), forward+backward: fused vs reference attention\n");
    let _ = writeln!(s, "- CPU: {} ({} threads for libtorch and the kernels alike)", r.header.cpu, r.threads);
    let _ = writeln!(s, "- date: {}; git revision: `{}`", r.header.date, r.header.git_revision);
    let _ = writeln!(s, "- command: `{}`", r.header.command);
    let _ = writeln!(
        s,
        "- model: 1 block, d_model 768, 12 heads x 64, MLP 4x, vocabulary 64, B = 1, f32; timed: `loss.backward()` after the forward"
    );
    let _ = writeln!(
        s,
        "- timing: reference and fused in rounds (one step of each per round, after a warm-up round; an untimed \
         lead-in step before each timed step under 1 s), up to 5 rounds within 6 s per implementation; ms are \
         medians, reference / fused the median of per-round ratios\n"
    );
    let _ = writeln!(s, "| variant | T | reference ms | fused ms | reference / fused |");
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    for &t in &cli.lengths {
        for v in &cli.variants {
            let find = |imp: &str| r.rows.iter().find(|x| x.t == t && &x.variant == v && x.implementation == imp);
            if let (Some(a), Some(b)) = (find("reference"), find("fused")) {
                let ratio = a.reference_over_fused.unwrap_or(a.median_ms / b.median_ms);
                let _ = writeln!(s, "| {v} | {t} | {:.1} | {:.1} | {ratio:.2}x |", a.median_ms, b.median_ms);
            }
        }
    }
    s
}
