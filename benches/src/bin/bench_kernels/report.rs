//! The timing table's records (the JSON rows, skips and summary) and its Markdown (written by `lssa_benches::sections`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use lssa_benches::measure;
use lssa_benches::workload::{Implementation, Pass};
use serde::Serialize;

/// Format tag and version of the JSON outputs.
pub(crate) const FORMAT: &str = "lssa-bench-kernels";
pub(crate) const FORMAT_VERSION: u32 = 1;

/// One measured cell.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Row {
    pub(crate) variant: String,
    pub(crate) t: usize,
    pub(crate) implementation: Implementation,
    pub(crate) pass: Pass,
    /// Median wall time, milliseconds.
    pub(crate) ms: f64,
    /// FLOPs in FlashAttention's convention divided by the median time.
    pub(crate) gflops: f64,
    /// Time over SDPA's (same T, same pass): below 1 is faster than SDPA. For fused rows the median
    /// of per-round ratios (`measure::paired_ratio`), else the ratio of the medians.
    pub(crate) time_vs_sdpa: Option<f64>,
    pub(crate) samples_ms: Vec<f64>,
    pub(crate) warmup_counted: bool,
}

/// A cell that did not run, and why.
#[derive(Serialize, Debug, Clone)]
pub(crate) struct Skip {
    pub(crate) variant: String,
    pub(crate) t: usize,
    pub(crate) implementation: Implementation,
    pub(crate) pass: Pass,
    pub(crate) reason: String,
}

#[derive(Serialize, Debug, Default)]
pub(crate) struct Summary {
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
pub(crate) struct Report {
    pub(crate) format: &'static str,
    pub(crate) version: u32,
    pub(crate) git_revision: String,
    pub(crate) command: String,
    pub(crate) date: String,
    pub(crate) cpu: String,
    pub(crate) threads: usize,
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) flop_convention: &'static str,
    pub(crate) timing_policy: String,
    pub(crate) rows: Vec<Row>,
    pub(crate) skipped: Vec<Skip>,
    pub(crate) summary: Summary,
}

pub(crate) const FLOP_CONVENTION: &str =
    "FlashAttention's: forward 4*B*H*T^2*d / 2 (causal), backward 2.5x forward, same count for every variant";

fn find<'a>(rows: &'a [Row], imp: Implementation, variant: &str, t: usize, pass: Pass) -> Option<&'a Row> {
    rows.iter().find(|r| r.implementation == imp && r.variant == variant && r.t == t && r.pass == pass)
}

pub(crate) fn summarise(rows: &[Row]) -> Summary {
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

pub(crate) fn markdown(r: &Report, lengths: &[usize]) -> String {
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
