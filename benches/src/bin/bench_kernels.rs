//! bench-kernels: the CPU attention table (fused kernels vs libtorch SDPA vs torch-ops vs attn-core) and
//! the single-head peak-memory measurement.
//!
//! Runbook (one CPU machine; every implementation uses the same thread count):
//!
//! ```text
//! cargo xtask bench kernels                     # T = 512..16384, ~15 min on 2 cores; writes docs/bench/kernels-cpu.{md,json}
//! cargo xtask bench kernels --quick             # T = 512, 1024, 2048 (a minute or two)
//! cargo xtask bench kernels --lengths 1024,4096 --threads 1 --no-write
//! cargo xtask bench kernels memory              # peak memory of one head at T = 65536 (child processes);
//!                                               # writes docs/bench/memory-cpu.{md,json}
//! ```
//!
//! Without xtask: `cargo run --release -p lssa-benches --bin bench-kernels -- ARGS`.
//!
//! What is timed, per sequence length `T` (B=1, H=12, d=64, causal, f32):
//!
//! - `fused`: `attn_kernels::cpu::forward` (fwd) and `attn_kernels::cpu::backward` (fwd+bwd: it runs the
//!   forward itself) in a rayon pool of `--threads` threads;
//! - `sdpa`: libtorch `scaled_dot_product_attention` (causal softmax), `tch::set_num_threads(--threads)`;
//! - `flex-attention`: LSSA and LSSAR written for PyTorch's FlexAttention and compiled
//!   (`benches/flex_lssa.py` in a child process, `lssa_benches::flex`; forward only, as FlexAttention
//!   has no CPU backward in PyTorch 2.11, and LSSAR needs a `return_lse` it does not compile on the CPU);
//! - `torch-ops`: `gpt_model::attention::torch_ops` with its `(B, H, T, T)` matrices and autograd,
//!   skipped where its estimated memory exceeds `--torch-ops-max-gib`;
//! - `attn-core-f64`: the f64 reference, at `T <= --reference-max-t` only.
//!
//! Each cell: a warm-up, then the median of up to `--max-reps` repetitions within `--cell-secs`. SDPA
//! and the fused rows of one (T, pass) run in rounds (`measure::time_rounds`: one repetition of each
//! per round), so a burst of load on a shared machine hits every one of them rather than all samples
//! of one; their time / SDPA is the median of per-round ratios.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use lssa_benches::flops;
use lssa_benches::measure::{self, Policy};
use lssa_benches::memory::{self, ChildReport};
use lssa_benches::workload::{Implementation, Pass, VariantSpec, Workload, random_array, to_tensor};
use lssa_benches::{env, flex};
use serde::Serialize;

/// Format tag and version of the JSON outputs.
const FORMAT: &str = "lssa-bench-kernels";
const FORMAT_VERSION: u32 = 1;
const MEMORY_FORMAT: &str = "lssa-bench-memory";

#[derive(Parser, Debug)]
#[command(name = "bench-kernels", about = "CPU attention benchmarks: fused vs SDPA vs torch-ops vs attn-core")]
struct Cli {
    /// Threads for everything (rayon pool of the fused kernels and libtorch intra-op); default: all cores.
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Option<Cmd>,
    #[command(flatten)]
    timing: TimingArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Peak memory of a single-head forward at a long length, each measured in a child process.
    Memory(MemoryArgs),
    /// (internal) One peak-memory measurement; prints a JSON line.
    #[command(hide = true)]
    MemoryChild(ChildArgs),
}

#[derive(Args, Debug)]
struct TimingArgs {
    /// Sequence lengths 512, 1024, 2048 only.
    #[arg(long)]
    quick: bool,
    /// Sequence lengths (comma-separated); overrides --quick. Default: 512,1024,2048,4096,8192,16384.
    #[arg(long, value_delimiter = ',')]
    lengths: Vec<usize>,
    /// Variants of the fused / torch-ops / reference rows (attn-core names). SDPA always runs (softmax).
    #[arg(long, value_delimiter = ',', default_value = "lssa,lssa+rw15,softmax")]
    variants: Vec<String>,
    /// Implementations to run (fused, sdpa, flex-attention, torch-ops, attn-core-f64).
    #[arg(long, value_delimiter = ',', default_value = "fused,sdpa,flex-attention,torch-ops,attn-core-f64")]
    implementations: Vec<String>,
    /// Batch size.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Heads.
    #[arg(long, default_value_t = 12)]
    heads: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// Skip torch-ops cells whose estimated T x T memory exceeds this many GiB.
    #[arg(long, default_value_t = 6.0)]
    torch_ops_max_gib: f64,
    /// Run the attn-core f64 reference only up to this length (it is O(T² d) scalar f64 code).
    #[arg(long, default_value_t = 1024)]
    reference_max_t: usize,
    /// At most this many timed repetitions per cell.
    #[arg(long, default_value_t = 7)]
    max_reps: usize,
    /// Stop repeating a cell after this many seconds of timed runs (one always runs).
    #[arg(long, default_value_t = 4.0)]
    cell_secs: f64,
    /// SDPA and fused cells get at least this many timed repetitions (rounds), whatever `--cell-secs`
    /// says, so their long-T ratios are medians, not single pairs.
    #[arg(long, default_value_t = 3)]
    min_round_reps: usize,
    /// Where kernels-cpu.md and kernels-cpu.json go. Default: docs/bench in the workspace.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Print only; write no files.
    #[arg(long)]
    no_write: bool,
}

#[derive(Args, Debug)]
struct MemoryArgs {
    /// Sequence length.
    #[arg(long, default_value_t = 65536)]
    t: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// Variants measured with the fused kernel.
    #[arg(long, value_delimiter = ',', default_value = "lssa,lssa+rw15")]
    variants: Vec<String>,
    /// Also measure torch-ops at this length to check its memory model (0: skip).
    #[arg(long, default_value_t = 4096)]
    calibrate_t: usize,
    /// Where memory-cpu.md and memory-cpu.json go. Default: docs/bench in the workspace.
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Print only; write no files.
    #[arg(long)]
    no_write: bool,
}

#[derive(Args, Debug)]
struct ChildArgs {
    #[arg(long)]
    implementation: String,
    #[arg(long)]
    variant: String,
    #[arg(long)]
    t: usize,
    #[arg(long)]
    head_dim: usize,
    /// torch-ops only: also run the backward (of `sum(o)`), measuring the autograd peak.
    #[arg(long)]
    backward: bool,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let threads = cli.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    tch::set_num_threads(threads as i32);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("building the rayon pool")?;
    match cli.command {
        None => run_timing(&cli.timing, threads, &pool),
        Some(Cmd::Memory(args)) => run_memory(&args, threads),
        Some(Cmd::MemoryChild(args)) => memory_child(&args, &pool),
    }
}

// ---------------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------------

/// One measured cell.
#[derive(Serialize, Debug, Clone)]
struct Row {
    variant: String,
    t: usize,
    implementation: Implementation,
    pass: Pass,
    /// Median wall time, milliseconds.
    ms: f64,
    /// FLOPs in FlashAttention's convention divided by the median time.
    gflops: f64,
    /// Time over SDPA's (same T, same pass): below 1 is faster than SDPA. For fused rows the median
    /// of per-round ratios (`measure::paired_ratio`), else the ratio of the medians.
    time_vs_sdpa: Option<f64>,
    samples_ms: Vec<f64>,
    warmup_counted: bool,
}

/// A cell that did not run, and why.
#[derive(Serialize, Debug, Clone)]
struct Skip {
    variant: String,
    t: usize,
    implementation: Implementation,
    pass: Pass,
    reason: String,
}

#[derive(Serialize, Debug, Default)]
struct Summary {
    /// Least-squares slope of ln(ms) vs ln(T) for the fused LSSA forward over 1K <= T <= 16K.
    fused_lssa_fwd_exponent: Option<f64>,
    /// The lengths that slope was fitted on.
    fused_lssa_fwd_exponent_lengths: Vec<usize>,
    /// Fused forward time of lssa+rw15 over lssa at T = 4096.
    fused_lssar_over_lssa_fwd_4096: Option<f64>,
    /// torch-ops time over fused time at T = 4096, forward, per variant (how much faster fused is).
    torch_ops_over_fused_fwd_4096: BTreeMap<String, f64>,
    /// FlexAttention time over fused time at T = 4096, forward, per variant: the quotient of their
    /// times over SDPA (each a paired ratio) where both have one, else of their medians.
    flex_over_fused_fwd_4096: BTreeMap<String, f64>,
}

#[derive(Serialize, Debug)]
struct Report {
    format: &'static str,
    version: u32,
    git_revision: String,
    command: String,
    date: String,
    cpu: String,
    threads: usize,
    batch: usize,
    heads: usize,
    head_dim: usize,
    flop_convention: &'static str,
    timing_policy: String,
    rows: Vec<Row>,
    skipped: Vec<Skip>,
    summary: Summary,
}

const FLOP_CONVENTION: &str =
    "FlashAttention's: forward 4*B*H*T^2*d / 2 (causal), backward 2.5x forward, same count for every variant";

fn parse_implementations(names: &[String]) -> Result<Vec<Implementation>> {
    names
        .iter()
        .map(|n| {
            Implementation::ALL.into_iter().find(|i| i.name() == n).ok_or_else(|| {
                let known: Vec<_> = Implementation::ALL.iter().map(|i| i.name()).collect();
                anyhow!("unknown implementation `{n}` ({})", known.join(", "))
            })
        })
        .collect()
}

fn run_timing(args: &TimingArgs, threads: usize, pool: &rayon::ThreadPool) -> Result<()> {
    let lengths = if !args.lengths.is_empty() {
        args.lengths.clone()
    } else if args.quick {
        vec![512, 1024, 2048]
    } else {
        vec![512, 1024, 2048, 4096, 8192, 16384]
    };
    let variants: Vec<VariantSpec> = args.variants.iter().map(|v| v.parse()).collect::<Result<_>>()?;
    let sdpa_variant: VariantSpec = "softmax".parse()?;
    let imps = parse_implementations(&args.implementations)?;
    let policy = Policy { max_reps: args.max_reps, cell_budget_s: args.cell_secs, ..Policy::default() };
    let round_policy = Policy { min_reps: args.min_round_reps, ..policy };
    let (b, h, d) = (args.batch, args.heads, args.head_dim);
    let cpu = env::cpu_model();
    eprintln!("bench-kernels: {cpu}; {threads} thread(s); B={b} H={h} d={d}; T = {lengths:?}");

    let start = Instant::now();
    // FlexAttention first, every length in one child process (it compiles once per shape).
    let flex_rows = if imps.contains(&Implementation::Flex) {
        eprintln!("  flex-attention: {} (compiles each length first)", gpt_model::runtime::torch_python().0.display());
        let req = flex::SpeedRequest {
            device: "cpu".into(),
            dtype: "f32".into(),
            head_dim: d,
            heads: h,
            lengths: lengths.clone(),
            batch: b,
            tokens: 0,
            threads,
            reps: round_policy.max_reps,
            min_reps: round_policy.min_reps,
            budget_s: round_policy.cell_budget_s,
            lead_in_below_s: round_policy.lead_in_below_s,
            backward: false,
            // SDPA in the child's rounds too: FlexAttention's time / SDPA is then paired like fused's.
            sdpa: imps.contains(&Implementation::Sdpa),
        };
        flex::speed(&req).map_err(|e| format!("{e:#}"))
    } else {
        Ok(Vec::new())
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut skipped: Vec<Skip> = Vec::new();
    for &t in &lengths {
        let work = Workload::new(b, h, t, d, 0);
        for pass in Pass::ALL {
            let flop = match pass {
                Pass::Forward => flops::forward(b, h, t, d),
                Pass::ForwardBackward => flops::forward_backward(b, h, t, d),
            };
            // SDPA first: every other row of this (T, pass) is reported relative to it.
            let mut cells: Vec<(Implementation, &VariantSpec)> = Vec::new();
            if imps.contains(&Implementation::Sdpa) {
                cells.push((Implementation::Sdpa, &sdpa_variant));
            }
            for imp in
                [Implementation::Fused, Implementation::Flex, Implementation::TorchOps, Implementation::Reference]
            {
                if imps.contains(&imp) {
                    // The FlexAttention baseline is written for LSSA and LSSAR only.
                    let ours = |v: &&VariantSpec| imp != Implementation::Flex || flex_cell(&v.name, pass).is_some();
                    cells.extend(variants.iter().filter(ours).map(|v| (imp, v)));
                }
            }
            let mut runnable = Vec::new();
            for (imp, variant) in cells {
                if let Some(reason) = skip_reason(args, imp, variant, &work, pass) {
                    eprintln!("  skip  T={t:>5} {pass:<7} {imp:<13} {:<12} {reason}", variant.name);
                    skipped.push(Skip { variant: variant.name.clone(), t, implementation: imp, pass, reason });
                } else {
                    runnable.push((imp, variant));
                }
            }
            // SDPA and the fused kernels, whose ratio is the claim, run in rounds (one repetition of
            // each per round) and their ratio is the median of per-round ratios; the slower rows
            // (10-30x) and FlexAttention's child process run one cell after the other.
            let in_rounds = |imp: Implementation| matches!(imp, Implementation::Sdpa | Implementation::Fused);
            let round_cells: Vec<_> = runnable.iter().copied().filter(|&(imp, _)| in_rounds(imp)).collect();
            let mut fns: Vec<_> = round_cells
                .iter()
                .map(|&(imp, variant)| {
                    let work = &work;
                    move || work.run(imp, variant, pass, pool)
                })
                .collect();
            if !fns.is_empty() {
                eprintln!(
                    "  T={t:>5} {pass:<7} {} cells in rounds (SDPA and fused; {:.0} s elapsed)",
                    fns.len(),
                    start.elapsed().as_secs_f64()
                );
            }
            let mut round_timings = measure::time_rounds(&round_policy, &mut fns).into_iter();
            let mut sdpa: Option<measure::Timing> = None;
            for (imp, variant) in runnable {
                let mut flex_vs_sdpa = None;
                let timing = if in_rounds(imp) {
                    round_timings.next().expect("one timing per cell in rounds")
                } else if imp == Implementation::Flex {
                    flex_timing(&flex_rows, &variant.name, t, pass).map(|(timing, ratio)| {
                        flex_vs_sdpa = ratio;
                        timing
                    })
                } else {
                    measure::time(&policy, || work.run(imp, variant, pass, pool))
                };
                match timing {
                    Ok(timing) => {
                        let ms = timing.median_ms();
                        let time_vs_sdpa = match &sdpa {
                            // Paired with the SDPA run in FlexAttention's process.
                            _ if imp == Implementation::Flex => flex_vs_sdpa,
                            Some(s) if in_rounds(imp) => measure::paired_ratio(&timing, s),
                            Some(s) => Some(ms / s.median_ms()),
                            None => None,
                        };
                        let row = Row {
                            variant: variant.name.clone(),
                            t,
                            implementation: imp,
                            pass,
                            ms,
                            gflops: flop / (ms * 1e-3) / 1e9,
                            time_vs_sdpa,
                            samples_ms: timing.samples_ms.clone(),
                            warmup_counted: timing.warmup_counted,
                        };
                        eprintln!(
                            "  T={t:>5} {pass:<7} {imp:<13} {:<12} {ms:>10.2} ms {:>7.1} GFLOP/s  (n={}, {:.0} s elapsed)",
                            variant.name,
                            row.gflops,
                            row.samples_ms.len(),
                            start.elapsed().as_secs_f64()
                        );
                        rows.push(row);
                        if imp == Implementation::Sdpa {
                            sdpa = Some(timing);
                        }
                    }
                    Err(e) => {
                        let reason = format!("failed: {e:#}");
                        eprintln!("  FAIL  T={t:>5} {pass:<7} {imp:<13} {:<12} {reason}", variant.name);
                        skipped.push(Skip { variant: variant.name.clone(), t, implementation: imp, pass, reason });
                    }
                }
            }
        }
    }
    eprintln!("bench-kernels: done in {:.0} s", start.elapsed().as_secs_f64());

    let summary = summarise(&rows);
    let report = Report {
        format: FORMAT,
        version: FORMAT_VERSION,
        git_revision: env::git_revision(),
        command: env::command_line(),
        date: env::utc_now(),
        cpu,
        threads,
        batch: b,
        heads: h,
        head_dim: d,
        flop_convention: FLOP_CONVENTION,
        timing_policy: format!(
            "one warm-up (counted as a sample when >= {} s), then the median of up to {} repetitions within {} s per cell; \
             SDPA and fused run in rounds (one repetition of each per round, after an untimed lead-in run where a run \
             takes under {} s; the budget shared; at least {} rounds) and their time / SDPA is the median of \
             per-round ratios; FlexAttention runs in its own process in rounds with an SDPA run there, its time / SDPA \
             paired the same way; the other rows run one cell after the other",
            policy.long_run_s, policy.max_reps, policy.cell_budget_s, policy.lead_in_below_s, round_policy.min_reps
        ),
        rows,
        skipped,
        summary,
    };
    let md = markdown(&report, &lengths);
    print!("{md}");
    if !args.no_write {
        let dir = args.out_dir.clone().unwrap_or_else(|| env::workspace_root().join("docs/bench"));
        write_outputs(&dir, "kernels-cpu", &md, &serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// The cell of `flex_lssa.py` that times `variant` in `pass`, if it has one.
fn flex_cell(variant: &str, pass: Pass) -> Option<&'static str> {
    match (variant, pass) {
        ("lssa", Pass::Forward) => Some(flex::LSSA_FWD),
        ("lssa+rw15", Pass::Forward) => Some(flex::LSSAR15_FWD),
        ("lssa", Pass::ForwardBackward) => Some(flex::LSSA_FWD_BWD),
        _ => None,
    }
}

/// The FlexAttention child's samples for one cell, or why there are none, and its time over that of
/// the SDPA the child timed in the same rounds.
fn flex_timing(
    rows: &std::result::Result<Vec<flex::SpeedRow>, String>,
    variant: &str,
    t: usize,
    pass: Pass,
) -> Result<(measure::Timing, Option<f64>)> {
    let rows = rows.as_ref().map_err(|e| anyhow!("{e}"))?;
    let cell = flex_cell(variant, pass).ok_or_else(|| anyhow!("no FlexAttention cell for {variant} {pass}"))?;
    let row = rows.iter().find(|r| r.t == t).ok_or_else(|| anyhow!("flex_lssa.py returned no row for T = {t}"))?;
    if let Some(e) = row.errors.get(cell) {
        bail!("{e}");
    }
    let timing = row.timing(cell).ok_or_else(|| anyhow!("flex_lssa.py did not run {cell}"))?;
    Ok((timing, row.time_vs_sdpa(cell)))
}

/// Why a cell must not run, if it must not.
fn skip_reason(
    args: &TimingArgs,
    imp: Implementation,
    variant: &VariantSpec,
    work: &Workload,
    pass: Pass,
) -> Option<String> {
    match imp {
        Implementation::TorchOps if !variant.has_torch_ops() => Some("no torch-ops implementation".into()),
        Implementation::TorchOps => {
            let bytes = memory::torch_ops_bytes(work.b, work.h, work.t, variant.reweighted(), pass);
            (memory::gib(bytes) > args.torch_ops_max_gib).then(|| {
                format!(
                    "T x T tensors need ~{:.1} GiB ({} x {:.2} GiB) > --torch-ops-max-gib {}",
                    memory::gib(bytes),
                    memory::torch_ops_tt_tensors(variant.reweighted(), pass),
                    memory::gib((work.b * work.h * work.t * work.t * 4) as f64),
                    args.torch_ops_max_gib
                )
            })
        }
        Implementation::Reference if work.t > args.reference_max_t => {
            Some(format!("f64 reference only at T <= --reference-max-t {}", args.reference_max_t))
        }
        Implementation::Sdpa if !variant.has_sdpa() => Some("SDPA is softmax only".into()),
        Implementation::Flex if pass == Pass::ForwardBackward => {
            Some("PyTorch 2.11's FlexAttention has no CPU backward".into())
        }
        _ => None,
    }
}

fn find<'a>(rows: &'a [Row], imp: Implementation, variant: &str, t: usize, pass: Pass) -> Option<&'a Row> {
    rows.iter().find(|r| r.implementation == imp && r.variant == variant && r.t == t && r.pass == pass)
}

fn summarise(rows: &[Row]) -> Summary {
    let fwd_row = |imp, v: &str, t| find(rows, imp, v, t, Pass::Forward);
    let fwd = |imp, v: &str, t| fwd_row(imp, v, t).map(|r| r.ms);
    let fit: Vec<(usize, f64)> = rows
        .iter()
        .filter(|r| {
            r.implementation == Implementation::Fused
                && r.variant == "lssa"
                && r.pass == Pass::Forward
                && (1024..=16384).contains(&r.t)
        })
        .map(|r| (r.t, r.ms))
        .collect();
    let exponent = measure::loglog_slope(&fit.iter().map(|&(t, ms)| (t as f64, ms)).collect::<Vec<_>>());
    let lssar =
        fwd(Implementation::Fused, "lssa+rw15", 4096).zip(fwd(Implementation::Fused, "lssa", 4096)).map(|(a, b)| a / b);
    let (mut torch_ops_over_fused, mut flex_over_fused) = (BTreeMap::new(), BTreeMap::new());
    for r in rows.iter().filter(|r| r.implementation == Implementation::Fused && r.t == 4096 && r.pass == Pass::Forward)
    {
        if let Some(ops) = fwd(Implementation::TorchOps, &r.variant, 4096) {
            torch_ops_over_fused.insert(r.variant.clone(), ops / r.ms);
        }
        if let Some(flex) = fwd_row(Implementation::Flex, &r.variant, 4096) {
            // Through SDPA when both are paired with it (each in its own process), else the medians.
            let ratio = match (flex.time_vs_sdpa, r.time_vs_sdpa) {
                (Some(f), Some(ours)) => f / ours,
                _ => flex.ms / r.ms,
            };
            flex_over_fused.insert(r.variant.clone(), ratio);
        }
    }
    Summary {
        fused_lssa_fwd_exponent: exponent,
        fused_lssa_fwd_exponent_lengths: fit.iter().map(|&(t, _)| t).collect(),
        fused_lssar_over_lssa_fwd_4096: lssar,
        torch_ops_over_fused_fwd_4096: torch_ops_over_fused,
        flex_over_fused_fwd_4096: flex_over_fused,
    }
}

fn markdown(r: &Report, lengths: &[usize]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# CPU attention: fused kernels vs libtorch\n");
    let _ = writeln!(md, "- CPU: {}", r.cpu);
    let _ = writeln!(md, "- threads: {} (the fused kernels' rayon pool and libtorch's intra-op pool alike)", r.threads);
    let _ = writeln!(md, "- date: {}; git revision: `{}`", r.date, r.git_revision);
    let _ = writeln!(md, "- command: `{}`", r.command);
    let _ = writeln!(
        md,
        "- shape: B={}, H={}, d={}, causal; f32 (attn-core-f64: f64); torch-ops and SDPA forward without autograd",
        r.batch, r.heads, r.head_dim
    );
    if r.rows.iter().any(|row| row.implementation == Implementation::Flex) {
        let _ = writeln!(
            md,
            "- flex-attention: LSSA as a `score_mod` of PyTorch's FlexAttention, compiled (`benches/flex_lssa.py`; \
             the q/k normalisation included; checked against attn-core by `benches/tests/flex.rs`); forward only; \
             timed in its own process before the other rows, in rounds with an SDPA run of its own, so its time / SDPA \
             is paired like fused's, and flex / fused below is the quotient of the two paired ratios"
        );
    }
    let _ = writeln!(md, "- FLOPs: {}", r.flop_convention);
    let _ = writeln!(md, "- timing: {}", r.timing_policy);
    let header = |md: &mut String, first: &str| {
        let _ = write!(md, "| implementation | variant |");
        for t in lengths {
            let _ = write!(md, " T={t} |");
        }
        let _ = write!(md, "\n|---|---|");
        for _ in lengths {
            let _ = write!(md, "---:|");
        }
        let _ = writeln!(md, "{first}");
    };
    let mut keys: Vec<(Implementation, String)> = Vec::new();
    for row in &r.rows {
        if !keys.contains(&(row.implementation, row.variant.clone())) {
            keys.push((row.implementation, row.variant.clone()));
        }
    }
    keys.sort_by_key(|(imp, _)| Implementation::ALL.iter().position(|i| i == imp));
    for pass in Pass::ALL {
        let _ = writeln!(md, "\n## {pass}: median ms (time / SDPA {pass} time)\n");
        header(&mut md, "");
        for (imp, variant) in &keys {
            let _ = write!(md, "| {imp} | {variant} |");
            for &t in lengths {
                match find(&r.rows, *imp, variant, t, pass) {
                    Some(row) => match row.time_vs_sdpa {
                        Some(x) if *imp != Implementation::Sdpa => {
                            let _ = write!(md, " {} ({x:.2}x) |", fmt_ms(row.ms));
                        }
                        _ => {
                            let _ = write!(md, " {} |", fmt_ms(row.ms));
                        }
                    },
                    None => md.push_str(" - |"),
                }
            }
            md.push('\n');
        }
        let _ = writeln!(md, "\n## {pass}: GFLOP/s (FlashAttention count)\n");
        header(&mut md, "");
        for (imp, variant) in &keys {
            let _ = write!(md, "| {imp} | {variant} |");
            for &t in lengths {
                match find(&r.rows, *imp, variant, t, pass) {
                    Some(row) => {
                        let _ = write!(md, " {:.1} |", row.gflops);
                    }
                    None => md.push_str(" - |"),
                }
            }
            md.push('\n');
        }
    }
    let s = &r.summary;
    let _ = writeln!(md, "\n## Summary\n");
    match s.fused_lssa_fwd_exponent {
        Some(k) => {
            let _ = writeln!(
                md,
                "- fused LSSA forward: time ~ T^{k:.2} (log-log least squares over T = {:?}; 2 is the O(T²) ideal)",
                s.fused_lssa_fwd_exponent_lengths
            );
        }
        None => {
            let _ = writeln!(md, "- fused LSSA forward exponent: needs fused lssa fwd at two or more T in 1K..16K");
        }
    }
    match s.fused_lssar_over_lssa_fwd_4096 {
        Some(x) => {
            let _ = writeln!(
                md,
                "- fused LSSAR (lssa+rw15) / LSSA forward time at T=4096: {x:.2}x (SPEC 6 expects about 1.5x)"
            );
        }
        None => {
            let _ = writeln!(md, "- fused LSSAR / LSSA forward at T=4096: not measured");
        }
    }
    if s.torch_ops_over_fused_fwd_4096.is_empty() {
        let _ = writeln!(md, "- torch-ops / fused forward time at T=4096: not measured");
    }
    for (v, x) in &s.torch_ops_over_fused_fwd_4096 {
        let _ = writeln!(md, "- torch-ops / fused forward time at T=4096, {v}: {x:.2}x (fused is {x:.2}x faster)");
    }
    for (v, x) in &s.flex_over_fused_fwd_4096 {
        let _ = writeln!(
            md,
            "- flex-attention / fused forward time at T=4096, {v}: {x:.2}x (fused is {x:.2}x faster than {v} in compiled FlexAttention)"
        );
    }
    if !r.skipped.is_empty() {
        let _ = writeln!(md, "\n## Not run\n");
        for k in &r.skipped {
            let _ = writeln!(md, "- T={} {} {} {}: {}", k.t, k.pass, k.implementation, k.variant, k.reason);
        }
    }
    md
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 { format!("{ms:.0}") } else { format!("{ms:.2}") }
}

fn write_outputs(dir: &std::path::Path, stem: &str, md: &str, json: &str) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (ext, text) in [("md", md), ("json", json)] {
        let path = dir.join(format!("{stem}.{ext}"));
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("bench-kernels: wrote {}", path.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------
// Peak memory
// ---------------------------------------------------------------------------------------------------

#[derive(Serialize, Debug)]
struct MemoryRow {
    implementation: Implementation,
    variant: String,
    t: usize,
    heads: usize,
    head_dim: usize,
    /// `measured` (child process) or `estimated` (memory model, not run).
    how: &'static str,
    /// Memory beyond inputs and output.
    extra_bytes: f64,
    /// Inputs (q, k, v) plus output.
    io_bytes: f64,
    forward_ms: Option<f64>,
    note: String,
}

#[derive(Serialize, Debug)]
struct MemoryReport {
    format: &'static str,
    version: u32,
    git_revision: String,
    command: String,
    date: String,
    cpu: String,
    threads: usize,
    method: &'static str,
    rows: Vec<MemoryRow>,
}

const MEMORY_METHOD: &str = "child process: allocate and touch q, k, v and an output-sized buffer; baseline = VmRSS; \
free the buffer; reset VmHWM (/proc/self/clear_refs); run the forward; extra = VmHWM - baseline";

fn run_memory(args: &MemoryArgs, threads: usize) -> Result<()> {
    memory::check_supported()?;
    let d = args.head_dim;
    let mut rows = Vec::new();
    for name in &args.variants {
        let spec: VariantSpec = name.parse()?;
        eprintln!("memory: fused {name} at T={} (child process) ...", args.t);
        let rep = spawn_child(threads, Implementation::Fused, name, args.t, d, Pass::Forward)?;
        rows.push(MemoryRow {
            implementation: Implementation::Fused,
            variant: spec.name.clone(),
            t: args.t,
            heads: 1,
            head_dim: d,
            how: "measured",
            extra_bytes: rep.extra_bytes() as f64,
            io_bytes: rep.io_bytes as f64,
            forward_ms: Some(rep.forward_ms),
            note: format!(
                "{:.0} bytes per row{}",
                rep.extra_bytes() as f64 / args.t as f64,
                if rep.peak_reset { "" } else { "; peak reset refused, includes set-up transients" }
            ),
        });
        // torch-ops: measured at a moderate T (to check the model), estimated at the long T.
        if spec.has_torch_ops() {
            let mut note = format!(
                "model: {} T x T f32 tensors of {:.1} GiB each, not run",
                memory::torch_ops_tt_tensors(spec.reweighted(), Pass::Forward),
                memory::gib((args.t * args.t * 4) as f64)
            );
            if args.calibrate_t > 0 {
                let tt = (args.calibrate_t * args.calibrate_t * 4) as f64;
                for pass in Pass::ALL {
                    eprintln!(
                        "memory: torch-ops {name} {pass} at T={} (child process, calibration) ...",
                        args.calibrate_t
                    );
                    let cal = spawn_child(threads, Implementation::TorchOps, name, args.calibrate_t, d, pass)?;
                    let measured = cal.extra_bytes() as f64 / tt;
                    let _ = write!(note, "; measured {pass} at T={}: {measured:.1}", args.calibrate_t);
                    rows.push(MemoryRow {
                        implementation: Implementation::TorchOps,
                        variant: spec.name.clone(),
                        t: args.calibrate_t,
                        heads: 1,
                        head_dim: d,
                        how: "measured",
                        extra_bytes: cal.extra_bytes() as f64,
                        io_bytes: cal.io_bytes as f64,
                        forward_ms: Some(cal.forward_ms),
                        note: format!(
                            "{pass}: {measured:.1} T x T f32 tensors (model: {})",
                            memory::torch_ops_tt_tensors(spec.reweighted(), pass)
                        ),
                    });
                }
            }
            rows.push(MemoryRow {
                implementation: Implementation::TorchOps,
                variant: spec.name.clone(),
                t: args.t,
                heads: 1,
                head_dim: d,
                how: "estimated",
                extra_bytes: memory::torch_ops_bytes(1, 1, args.t, spec.reweighted(), Pass::Forward),
                io_bytes: (4 * args.t * d * 4) as f64,
                forward_ms: None,
                note,
            });
        }
    }
    let report = MemoryReport {
        format: MEMORY_FORMAT,
        version: FORMAT_VERSION,
        git_revision: env::git_revision(),
        command: env::command_line(),
        date: env::utc_now(),
        cpu: env::cpu_model(),
        threads,
        method: MEMORY_METHOD,
        rows,
    };
    let mut md = String::new();
    let _ = writeln!(md, "# Peak memory of one attention head (forward, causal, f32)\n");
    let _ = writeln!(md, "- CPU: {}; threads: {}", report.cpu, report.threads);
    let _ = writeln!(md, "- date: {}; git revision: `{}`", report.date, report.git_revision);
    let _ = writeln!(md, "- command: `{}`", report.command);
    let _ = writeln!(md, "- method: {}\n", report.method);
    let _ = writeln!(
        md,
        "| implementation | variant | T | d | how | extra beyond inputs+output | inputs+output | forward | note |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---|---:|---:|---:|---|");
    for r in &report.rows {
        let extra = if r.extra_bytes >= (1u64 << 30) as f64 {
            format!("{:.1} GiB", memory::gib(r.extra_bytes))
        } else {
            format!("{:.1} MiB", memory::mib(r.extra_bytes))
        };
        let fwd = r.forward_ms.map_or("-".to_string(), |ms| format!("{:.1} s", ms / 1e3));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {extra} | {:.1} MiB | {fwd} | {} |",
            r.implementation,
            r.variant,
            r.t,
            r.head_dim,
            r.how,
            memory::mib(r.io_bytes),
            r.note
        );
    }
    print!("{md}");
    if !args.no_write {
        let dir = args.out_dir.clone().unwrap_or_else(|| env::workspace_root().join("docs/bench"));
        write_outputs(&dir, "memory-cpu", &md, &serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

fn spawn_child(
    threads: usize,
    imp: Implementation,
    variant: &str,
    t: usize,
    d: usize,
    pass: Pass,
) -> Result<ChildReport> {
    let exe = std::env::current_exe().context("locating this executable")?;
    let mut cmd = Command::new(&exe);
    cmd.args(["--threads", &threads.to_string(), "memory-child", "--implementation", imp.name()]).args([
        "--variant",
        variant,
        "--t",
        &t.to_string(),
        "--head-dim",
        &d.to_string(),
    ]);
    if pass == Pass::ForwardBackward {
        cmd.arg("--backward");
    }
    let out = cmd.output().with_context(|| format!("spawning {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "memory child ({imp} {variant} T={t}) failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().context("memory child printed nothing")?;
    serde_json::from_str(line).with_context(|| format!("parsing the memory child's report `{line}`"))
}

/// In the child: inputs and an output-sized buffer, baseline, free, reset peak, forward, peak.
fn memory_child(args: &ChildArgs, pool: &rayon::ThreadPool) -> Result<()> {
    let spec: VariantSpec = args.variant.parse()?;
    let shape = (1, 1, args.t, args.head_dim);
    let io_bytes = (4 * args.t * args.head_dim * 4) as u64;
    // Start the pool's threads now, so their stacks are part of the baseline.
    pool.broadcast(|_| std::hint::black_box(0));
    let [q, k, v] = [0, 1, 2].map(|i| random_array(shape, 100 + i)); // touched: every entry written
    let (baseline_bytes, peak_reset, peak_bytes, forward_ms) = match args.implementation.as_str() {
        "fused" => {
            let out_buf = ndarray::Array4::<f32>::from_elem(shape, 1.0); // touched
            let baseline = memory::proc_status_bytes("VmRSS")?;
            drop(out_buf);
            let reset = memory::reset_peak();
            let start = Instant::now();
            let out = pool
                .install(|| attn_kernels::cpu::forward(&spec.variant, q.view(), k.view(), v.view()))
                .map_err(|e| anyhow!("fused forward: {e}"))?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let peak = memory::proc_status_bytes("VmHWM")?;
            std::hint::black_box(&out);
            (baseline, reset, peak, ms)
        }
        "torch-ops" => {
            let [qt, kt, vt] = [&q, &k, &v].map(to_tensor);
            drop((q, k, v));
            let out_buf = to_tensor(&ndarray::Array4::<f32>::from_elem(shape, 1.0));
            let baseline = memory::proc_status_bytes("VmRSS")?;
            drop(out_buf);
            let reset = memory::reset_peak();
            let start = Instant::now();
            if args.backward {
                let [qt, kt, vt] = [&qt, &kt, &vt].map(|x| x.set_requires_grad(true));
                let out = spec.torch_ops_forward(&qt, &kt, &vt)?;
                let grads = tch::Tensor::run_backward(&[out.sum(tch::Kind::Float)], &[&qt, &kt, &vt], false, false);
                std::hint::black_box(&grads);
            } else {
                let out = tch::no_grad(|| spec.torch_ops_forward(&qt, &kt, &vt))?;
                std::hint::black_box(&out);
            }
            let ms = start.elapsed().as_secs_f64() * 1e3;
            let peak = memory::proc_status_bytes("VmHWM")?;
            (baseline, reset, peak, ms)
        }
        other => bail!("memory-child: unsupported implementation `{other}`"),
    };
    let report = ChildReport { baseline_bytes, peak_bytes, peak_reset, io_bytes, forward_ms };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
