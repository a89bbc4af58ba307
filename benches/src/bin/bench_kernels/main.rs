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
//! Beside them: the CPU's FMA peak (`lssa_benches::fma`), each GFLOP/s cell's share of it, and a
//! fused `floor` row (`--floor`, default `linear-l1`: the products and tile loop without an
//! activation's work), from which the summary gives each variant's time over the floor at T = 4096.
//!
//! Each cell: a warm-up, then the median of up to `--max-reps` repetitions within `--cell-secs`. SDPA
//! and the fused rows of one (T, pass) run in rounds (`measure::time_rounds`: one repetition of each
//! per round), so a burst of load on a shared machine hits every one of them rather than all samples
//! of one; their time / SDPA is the median of per-round ratios.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

mod peak;
mod report;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use lssa_benches::flops;
use lssa_benches::measure::{self, Policy};
use lssa_benches::memory;
use lssa_benches::workload::{Implementation, Pass, VariantSpec, Workload};
use lssa_benches::{env, flex, fma};

use peak::{ChildArgs, MemoryArgs};
use report::{FLOP_CONVENTION, FORMAT, FORMAT_VERSION, Report, Row, Skip};

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
    /// A fused row beside the variants with no activation's work: the same products and tile loop
    /// (default `linear-l1`, the identity on dot scores, l1-normalised), so its time is the floor
    /// any activation adds to. Empty: none.
    #[arg(long, default_value = "linear-l1")]
    floor: String,
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

fn main() -> Result<()> {
    env::git_revision(); // the revision the run starts from, before anything can edit the tree
    let cli = Cli::parse();
    let threads = cli.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    tch::set_num_threads(threads as i32);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().context("building the rayon pool")?;
    match cli.command {
        None => run_timing(&cli.timing, threads, &pool),
        Some(Cmd::Memory(args)) => peak::run_memory(&args, threads),
        Some(Cmd::MemoryChild(args)) => peak::memory_child(&args, &pool),
    }
}

// ---------------------------------------------------------------------------------------------------
// Timing
// ---------------------------------------------------------------------------------------------------

impl TimingArgs {
    /// The `--floor` variant's name, unless it is empty.
    fn floor(&self) -> Option<&str> {
        (!self.floor.is_empty()).then_some(self.floor.as_str())
    }
}

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
    // A floor already among the variants runs as one of them.
    let floor: Option<VariantSpec> =
        args.floor().filter(|f| !args.variants.iter().any(|v| v == f)).map(str::parse).transpose()?;
    let imps = parse_implementations(&args.implementations)?;
    let policy = Policy { max_reps: args.max_reps, cell_budget_s: args.cell_secs, ..Policy::default() };
    let round_policy = Policy { min_reps: args.min_round_reps, ..policy };
    let (b, h, d) = (args.batch, args.heads, args.head_dim);
    // What ran, not only what the CPU offers: ATTN_KERNELS_ISA and ATEN_CPU_CAPABILITY can lower both.
    let aten = std::env::var("ATEN_CPU_CAPABILITY")
        .map(|c| format!(", libtorch's ATEN_CPU_CAPABILITY={c}"))
        .unwrap_or_default();
    let cpu = format!("{}; fused kernels' ISA: {}{aten}", env::cpu_model(), attn_kernels::cpu::Isa::detect());
    eprintln!("bench-kernels: {cpu}; {threads} thread(s); B={b} H={h} d={d}; T = {lengths:?}");
    let fma_peak = fma::peak(threads);
    match fma_peak {
        Some(p) => eprintln!("  FMA peak: {:.1} GFLOP/s ({} threads, {} lanes)", p.gflops, p.threads, p.lanes),
        None => eprintln!("  FMA peak: not measured (no vector FMA kernel for this ISA)"),
    }

    let start = Instant::now();
    // FlexAttention first, every length in one child process (it compiles once per shape).
    let flex_rows = if imps.contains(&Implementation::Flex) {
        eprintln!("  flex-attention: {} (compiles each length first)", gpt_model::runtime::torch_python().0.display());
        flex_baseline(args, &lengths, threads, &round_policy, imps.contains(&Implementation::Sdpa))
    } else {
        Ok(Vec::new())
    };
    let mut bench = Bench { args, pool, policy, round_policy, start, flex_rows, rows: Vec::new(), skipped: Vec::new() };
    for &t in &lengths {
        let work = Workload::new(b, h, t, d, 0);
        for pass in Pass::ALL {
            let flop = match pass {
                Pass::Forward => flops::forward(b, h, t, d),
                Pass::ForwardBackward => flops::forward_backward(b, h, t, d),
            };
            bench.time_pass(&work, pass, flop, cells(&imps, &variants, floor.as_ref(), &sdpa_variant, pass));
        }
    }
    eprintln!("bench-kernels: done in {:.0} s", start.elapsed().as_secs_f64());
    bench.write_report(&lengths, cpu, threads, fma_peak)
}

/// The FlexAttention baseline's request for the child process (CPU, f32, forward only) and its
/// answer: every length, timed in rounds by `policy`, with an SDPA run of its own in each round when
/// `sdpa`.
fn flex_baseline(
    args: &TimingArgs,
    lengths: &[usize],
    threads: usize,
    policy: &Policy,
    sdpa: bool,
) -> std::result::Result<Vec<flex::SpeedRow>, String> {
    let req = flex::SpeedRequest {
        device: "cpu".into(),
        dtype: "f32".into(),
        head_dim: args.head_dim,
        heads: args.heads,
        lengths: lengths.to_vec(),
        batch: args.batch,
        tokens: 0,
        threads,
        reps: policy.max_reps,
        min_reps: policy.min_reps,
        budget_s: policy.cell_budget_s,
        lead_in_below_s: policy.lead_in_below_s,
        backward: false,
        // SDPA in the child's rounds too: FlexAttention's time / SDPA is then paired like fused's.
        sdpa,
    };
    flex::speed(&req).map_err(|e| format!("{e:#}"))
}

/// The cells of one pass at one length that `--implementations` asks for: SDPA first (every other
/// row of this (T, pass) is reported relative to it), then each implementation's variants, the
/// fused kernels' `floor` after theirs.
fn cells<'v>(
    imps: &[Implementation],
    variants: &'v [VariantSpec],
    floor: Option<&'v VariantSpec>,
    sdpa_variant: &'v VariantSpec,
    pass: Pass,
) -> Vec<(Implementation, &'v VariantSpec)> {
    let mut cells: Vec<(Implementation, &VariantSpec)> = Vec::new();
    if imps.contains(&Implementation::Sdpa) {
        cells.push((Implementation::Sdpa, sdpa_variant));
    }
    for imp in [Implementation::Fused, Implementation::Flex, Implementation::TorchOps, Implementation::Reference] {
        if imps.contains(&imp) {
            // The FlexAttention baseline is written for LSSA and LSSAR only.
            let ours = |v: &&VariantSpec| imp != Implementation::Flex || flex_cell(&v.name, pass).is_some();
            cells.extend(variants.iter().filter(ours).map(|v| (imp, v)));
            if imp == Implementation::Fused {
                cells.extend(floor.map(|v| (imp, v)));
            }
        }
    }
    cells
}

/// Whether `imp` runs in rounds with the others of its (T, pass): SDPA and the fused kernels, whose
/// ratio is the claim.
fn in_rounds(imp: Implementation) -> bool {
    matches!(imp, Implementation::Sdpa | Implementation::Fused)
}

/// One cell: an implementation of a variant in one pass at one length, and its FLOP.
struct Cell<'v> {
    imp: Implementation,
    variant: &'v VariantSpec,
    t: usize,
    pass: Pass,
    flop: f64,
}

/// A timing run: its settings, and the rows and skipped cells so far.
struct Bench<'a> {
    args: &'a TimingArgs,
    pool: &'a rayon::ThreadPool,
    policy: Policy,
    round_policy: Policy,
    start: Instant,
    /// The FlexAttention child's rows, or why there are none.
    flex_rows: std::result::Result<Vec<flex::SpeedRow>, String>,
    rows: Vec<Row>,
    skipped: Vec<Skip>,
}

impl Bench<'_> {
    /// Times the `cells` of one pass at `work`'s length that may run (the others are skipped, with
    /// the reason) and records each.
    fn time_pass(&mut self, work: &Workload, pass: Pass, flop: f64, cells: Vec<(Implementation, &VariantSpec)>) {
        let t = work.t;
        let mut runnable = Vec::new();
        for (imp, variant) in cells {
            if let Some(reason) = skip_reason(self.args, imp, variant, work, pass) {
                eprintln!("  skip  T={t:>5} {pass:<7} {imp:<13} {:<12} {reason}", variant.name);
                self.skipped.push(Skip { variant: variant.name.clone(), t, implementation: imp, pass, reason });
            } else {
                runnable.push((imp, variant));
            }
        }
        // SDPA and the fused kernels, whose ratio is the claim, run in rounds (one repetition of
        // each per round) and their ratio is the median of per-round ratios; the slower rows
        // (10-30x) and FlexAttention's child process run one cell after the other.
        let round_cells: Vec<_> = runnable.iter().copied().filter(|&(imp, _)| in_rounds(imp)).collect();
        let pool = self.pool;
        let mut fns: Vec<_> =
            round_cells.iter().map(|&(imp, variant)| move || work.run(imp, variant, pass, pool)).collect();
        if !fns.is_empty() {
            eprintln!(
                "  T={t:>5} {pass:<7} {} cells in rounds (SDPA and fused; {:.0} s elapsed)",
                fns.len(),
                self.start.elapsed().as_secs_f64()
            );
        }
        let mut round_timings = measure::time_rounds(&self.round_policy, &mut fns).into_iter();
        let mut sdpa: Option<measure::Timing> = None;
        for (imp, variant) in runnable {
            // With FlexAttention's, its time over the SDPA run in its own process.
            let timing = if in_rounds(imp) {
                round_timings.next().expect("one timing per cell in rounds").map(|timing| (timing, None))
            } else if imp == Implementation::Flex {
                flex_timing(&self.flex_rows, &variant.name, t, pass)
            } else {
                measure::time(&self.policy, || work.run(imp, variant, pass, pool)).map(|timing| (timing, None))
            };
            self.record(Cell { imp, variant, t, pass, flop }, timing, &mut sdpa);
        }
    }

    /// A row for a cell's timing (its time over `sdpa`'s, the SDPA timing of its (T, pass) so far,
    /// or with FlexAttention's over that of its own process), which becomes `sdpa` for an SDPA cell;
    /// a skipped cell for a failure. Printed either way.
    fn record(
        &mut self,
        cell: Cell<'_>,
        timing: Result<(measure::Timing, Option<f64>)>,
        sdpa: &mut Option<measure::Timing>,
    ) {
        let Cell { imp, variant, t, pass, flop } = cell;
        match timing {
            Ok((timing, flex_vs_sdpa)) => {
                let ms = timing.median_ms();
                let time_vs_sdpa = match &*sdpa {
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
                    self.start.elapsed().as_secs_f64()
                );
                self.rows.push(row);
                if imp == Implementation::Sdpa {
                    *sdpa = Some(timing);
                }
            }
            Err(e) => {
                let reason = format!("failed: {e:#}");
                eprintln!("  FAIL  T={t:>5} {pass:<7} {imp:<13} {:<12} {reason}", variant.name);
                self.skipped.push(Skip { variant: variant.name.clone(), t, implementation: imp, pass, reason });
            }
        }
    }

    /// The report of the rows and skipped cells: printed as Markdown, and unless `--no-write`
    /// written with its JSON to `--out-dir`.
    fn write_report(
        self,
        lengths: &[usize],
        cpu: String,
        threads: usize,
        fma_peak: Option<fma::FmaPeak>,
    ) -> Result<()> {
        let (args, policy, round_policy) = (self.args, self.policy, self.round_policy);
        let floor = args.floor().map(str::to_owned);
        let summary = report::summarise(&self.rows, floor.as_deref());
        let report = Report {
            format: FORMAT,
            version: FORMAT_VERSION,
            git_revision: env::git_revision(),
            command: env::command_line(),
            date: env::utc_now(),
            cpu,
            threads,
            fma_peak,
            floor,
            batch: args.batch,
            heads: args.heads,
            head_dim: args.head_dim,
            flop_convention: FLOP_CONVENTION,
            timing_policy: format!(
                "one warm-up (counted as a sample when >= {} s), then the median of up to {} repetitions within {} s per cell; \
                 SDPA and fused run in rounds (one repetition of each per round, after an untimed lead-in run where a run \
                 takes under {} s; the budget shared; at least {} rounds) and their time / SDPA is the median of \
                 per-round ratios; FlexAttention runs in its own process in rounds with an SDPA run there, its time / SDPA \
                 paired the same way; the other rows run one cell after the other",
                policy.long_run_s, policy.max_reps, policy.cell_budget_s, policy.lead_in_below_s, round_policy.min_reps
            ),
            rows: self.rows,
            skipped: self.skipped,
            summary,
        };
        let md = report::markdown(&report, lengths);
        print!("{md}");
        if !args.no_write {
            let dir = args.out_dir.clone().unwrap_or_else(|| env::workspace_root().join("docs/bench"));
            lssa_benches::sections::write(&dir, "kernels-cpu", &report.cpu, &md, serde_json::to_value(&report)?)?;
        }
        Ok(())
    }
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
