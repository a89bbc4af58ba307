//! The timing table's records (the JSON rows, skips and summary) and its Markdown (written by `lssa_benches::sections`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use lssa_benches::fma::FmaPeak;
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
    /// Fused time over the floor row's (`--floor`) at T = 4096, per variant and pass (`fwd`,
    /// `fwd+bwd`): the quotient of their paired time / SDPA ratios (both ran in SDPA's rounds).
    fused_over_floor_4096: BTreeMap<String, BTreeMap<String, f64>>,
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
    /// The CPU's f32 FMA peak on `threads` threads at the fused kernels' ISA (`lssa_benches::fma`).
    pub(crate) fma_peak: Option<FmaPeak>,
    /// The fused row with no activation's work (`--floor`), if run.
    pub(crate) floor: Option<String>,
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

pub(crate) fn summarise(rows: &[Row], floor: Option<&str>) -> Summary {
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
    let mut over_floor: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for pass in Pass::ALL {
        let Some(base) = floor.and_then(|f| find(rows, Implementation::Fused, f, 4096, pass)) else { continue };
        for r in rows.iter().filter(|r| {
            r.implementation == Implementation::Fused && r.t == 4096 && r.pass == pass && r.variant != base.variant
        }) {
            let ratio = match (r.time_vs_sdpa, base.time_vs_sdpa) {
                (Some(ours), Some(b)) => ours / b,
                _ => r.ms / base.ms,
            };
            over_floor.entry(r.variant.clone()).or_default().insert(pass.to_string(), ratio);
        }
    }
    Summary {
        fused_over_floor_4096: over_floor,
        fused_lssa_fwd_exponent: exponent,
        fused_lssa_fwd_exponent_lengths: fit.iter().map(|&(t, _)| t).collect(),
        fused_lssar_over_lssa_fwd_4096: lssar,
        torch_ops_over_fused_fwd_4096: torch_ops_over_fused,
        flex_over_fused_fwd_4096: flex_over_fused,
    }
}

pub(crate) fn markdown(r: &Report, lengths: &[usize]) -> String {
    let mut md = String::new();
    preamble(&mut md, r);
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
                    Some(row) => match r.fma_peak {
                        Some(p) => {
                            let _ = write!(md, " {:.1} ({:.0}%) |", row.gflops, 100.0 * row.gflops / p.gflops);
                        }
                        None => {
                            let _ = write!(md, " {:.1} |", row.gflops);
                        }
                    },
                    None => md.push_str(" - |"),
                }
            }
            md.push('\n');
        }
    }
    summary(&mut md, r);
    md
}

/// The title and the run's settings.
fn preamble(md: &mut String, r: &Report) {
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
    match r.fma_peak {
        Some(p) => {
            let _ = writeln!(
                md,
                "- FMA peak: {:.1} GFLOP/s ({} threads at once, vectors of {} f32, independent chains of fused \
                 multiply-adds in registers; `lssa_benches::fma`): the most the products can reach here. The \
                 GFLOP/s tables give each cell's share of it in brackets (the FlashAttention count is the \
                 products' multiply-adds: a fused row's share is its products' efficiency, less what the \
                 activation and the tile loop take)",
                p.gflops, p.threads, p.lanes
            );
        }
        None => {
            let _ = writeln!(md, "- FMA peak: not measured (no vector FMA kernel for the fused kernels' ISA here)");
        }
    }
    if let Some(floor) = &r.floor {
        let _ = writeln!(
            md,
            "- floor: `fused | {floor}` runs the fused kernels' two products and tile loop with the activation \
             `{floor}` names (by default the identity on dot scores, l1-normalised: no activation's work), so its \
             time is about the least any fused variant can take with these products, and a variant's time over it \
             is what its activation and normalisation cost (the Summary gives it at T=4096)"
        );
    }
    let _ = writeln!(md, "- timing: {}", r.timing_policy);
}

/// The summary and the cells not run.
fn summary(md: &mut String, r: &Report) {
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
    if let Some(floor) = &r.floor {
        for (v, by_pass) in &s.fused_over_floor_4096 {
            let cells: Vec<String> = by_pass.iter().map(|(pass, x)| format!("{pass} {x:.2}x")).collect();
            let _ = writeln!(
                md,
                "- fused {v} time over the floor ({floor}) at T=4096: {} (what its activation and \
                 normalisation cost over the products)",
                cells.join(", ")
            );
        }
    }
    if !r.skipped.is_empty() {
        let _ = writeln!(md, "\n## Not run\n");
        for k in &r.skipped {
            let _ = writeln!(md, "- T={} {} {} {}: {}", k.t, k.pass, k.implementation, k.variant, k.reason);
        }
    }
}

fn fmt_ms(ms: f64) -> String {
    if ms >= 100.0 { format!("{ms:.0}") } else { format!("{ms:.2}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, imp: Implementation, pass: Pass, ms: f64, vs_sdpa: Option<f64>) -> Row {
        Row {
            variant: variant.into(),
            t: 4096,
            implementation: imp,
            pass,
            ms,
            gflops: 40.0,
            time_vs_sdpa: vs_sdpa,
            samples_ms: vec![ms],
            warmup_counted: false,
        }
    }

    #[test]
    fn a_variant_over_the_floor_is_the_quotient_of_their_paired_ratios_and_the_peak_share_is_printed() {
        let rows = vec![
            row("softmax", Implementation::Sdpa, Pass::Forward, 500.0, None),
            row("lssa", Implementation::Fused, Pass::Forward, 510.0, Some(1.02)),
            row("linear-l1", Implementation::Fused, Pass::Forward, 400.0, Some(0.85)),
        ];
        let summary = summarise(&rows, Some("linear-l1"));
        let lssa = &summary.fused_over_floor_4096["lssa"];
        // 1.02 / 0.85, not the medians' 510 / 400 = 1.275
        assert!((lssa["fwd"] - 1.2).abs() < 1e-12, "{lssa:?}");
        assert!(!summary.fused_over_floor_4096.contains_key("linear-l1"));
        let report = Report {
            format: FORMAT,
            version: FORMAT_VERSION,
            git_revision: String::new(),
            command: String::new(),
            date: String::new(),
            cpu: "test".into(),
            threads: 2,
            fma_peak: Some(FmaPeak { gflops: 80.0, threads: 2, lanes: 8 }),
            floor: Some("linear-l1".into()),
            batch: 1,
            heads: 12,
            head_dim: 64,
            flop_convention: FLOP_CONVENTION,
            timing_policy: String::new(),
            rows,
            skipped: Vec::new(),
            summary,
        };
        let md = markdown(&report, &[4096]);
        assert!(md.contains("| fused | lssa | 40.0 (50%) |"), "{md}");
        assert!(md.contains("over the floor (linear-l1) at T=4096: fwd 1.20x"), "{md}");
    }
}
