//! `bench-kernels memory`: the peak memory of a single-head forward, each measured in a child process
//! (`memory-child`), and its table.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use lssa_benches::env;
use lssa_benches::memory::{self, ChildReport};
use lssa_benches::workload::{Implementation, Pass, VariantSpec, random_array, to_tensor};
use serde::Serialize;

use crate::report::FORMAT_VERSION;

/// Format tag of the JSON output (versioned as the timing table's, [`FORMAT_VERSION`]).
const MEMORY_FORMAT: &str = "lssa-bench-memory";

#[derive(Args, Debug)]
pub(crate) struct MemoryArgs {
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
pub(crate) struct ChildArgs {
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

pub(crate) fn run_memory(args: &MemoryArgs, threads: usize) -> Result<()> {
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
        lssa_benches::sections::write(&dir, "memory-cpu", &report.cpu, &md, serde_json::to_value(&report)?)?;
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
pub(crate) fn memory_child(args: &ChildArgs, pool: &rayon::ThreadPool) -> Result<()> {
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
