//! The FlexAttention baseline: LSSA and LSSAR written for PyTorch's FlexAttention
//! (`benches/flex_lssa.py`), the tool a user would try first (ANCHORS.md), timed by the same
//! benchmarks that time the fused kernels.
//!
//! FlexAttention lives in PyTorch's Python API, so the benchmarks run the script in a child process
//! with the Python whose torch this process loaded ([`gpt_model::runtime::torch_python`]: the venv
//! `cargo xtask setup` made, or any other venv libtorch was loaded from, else `python3`;
//! `LSSA_TORCH_PYTHON` overrides the choice).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::measure::Timing;

/// The script: in this checkout, else `benches/flex_lssa.py` below the current directory (a binary
/// carried to a GPU machine runs from the repository root there).
pub fn script() -> PathBuf {
    let here = crate::env::workspace_root().join("benches/flex_lssa.py");
    if here.is_file() { here } else { PathBuf::from("benches/flex_lssa.py") }
}

/// A cell of a [`SpeedRow`]: the LSSA forward.
pub const LSSA_FWD: &str = "lssa_fwd";
/// A cell of a [`SpeedRow`]: the LSSAR (`p = 15`) forward, two FlexAttention calls.
pub const LSSAR15_FWD: &str = "lssar15_fwd";
/// A cell of a [`SpeedRow`]: the LSSA forward and backward.
pub const LSSA_FWD_BWD: &str = "lssa_fwd_bwd";
/// A cell of a [`SpeedRow`] with [`SpeedRequest::sdpa`]: libtorch's SDPA softmax forward.
pub const SDPA_FWD: &str = "sdpa_fwd";
/// A cell of a [`SpeedRow`] with [`SpeedRequest::sdpa`] and [`SpeedRequest::backward`]: SDPA
/// forward and backward.
pub const SDPA_FWD_BWD: &str = "sdpa_fwd_bwd";

/// What `flex_lssa.py speed` runs.
#[derive(Clone, Debug)]
pub struct SpeedRequest {
    /// `cpu` or `cuda`.
    pub device: String,
    /// `f32`, `bf16` or `f16`.
    pub dtype: String,
    /// Head dimension `d`.
    pub head_dim: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Sequence lengths, one row each.
    pub lengths: Vec<usize>,
    /// The batch size; 0: `max(tokens / T, 1)`.
    pub batch: usize,
    /// With `batch = 0`: batch `max(tokens / T, 1)` (0 for batch 1).
    pub tokens: usize,
    /// torch's intra-op threads (0: torch's default).
    pub threads: usize,
    /// At most this many rounds (timed runs per cell), after one warm-up, which compiles.
    pub reps: usize,
    /// At least this many rounds, whatever the budget.
    pub min_reps: usize,
    /// Stop the rounds once the next would take the timed total past this many seconds per cell.
    pub budget_s: f64,
    /// A cell whose last run took less runs once more, untimed, before each timed run
    /// ([`crate::measure::Policy::lead_in_below_s`]).
    pub lead_in_below_s: f64,
    /// Also LSSA forward+backward (FlexAttention has no CPU backward).
    pub backward: bool,
    /// Also libtorch's SDPA softmax ([`SDPA_FWD`], [`SDPA_FWD_BWD`]), in the same rounds, so the
    /// FlexAttention cells' time over SDPA's is a paired ratio ([`SpeedRow::time_vs_sdpa`]).
    pub sdpa: bool,
}

/// One length's results.
#[derive(Clone, Debug, Deserialize)]
pub struct SpeedRow {
    /// Sequence length.
    #[serde(rename = "T")]
    pub t: usize,
    /// Batch size it ran at.
    #[serde(rename = "B")]
    pub b: usize,
    /// Timed runs in ms per cell ([`LSSA_FWD`], [`LSSAR15_FWD`], [`LSSA_FWD_BWD`], [`SDPA_FWD`],
    /// [`SDPA_FWD_BWD`]); the cells ran in rounds, run `i` of every cell in round `i + 1`.
    #[serde(default)]
    pub samples_ms: BTreeMap<String, Vec<f64>>,
    /// Why a cell did not run.
    #[serde(default)]
    pub errors: BTreeMap<String, String>,
    /// Largest relative error of the compiled outputs against a materialised f32 reference (first
    /// length only).
    pub rel_err_vs_materialised: Option<f64>,
}

impl SpeedRow {
    /// The median of a cell's timed runs, in ms.
    pub fn median_ms(&self, cell: &str) -> Option<f64> {
        self.timing(cell).map(|t| t.median_ms())
    }

    /// A cell's runs as a [`Timing`] whose rounds line up with the other cells' (the warm-up, which
    /// compiles, is never a sample).
    pub fn timing(&self, cell: &str) -> Option<Timing> {
        let samples_ms = self.samples_ms.get(cell).filter(|s| !s.is_empty())?.clone();
        Some(Timing { samples_ms, warmup_counted: false })
    }

    /// A cell's time over SDPA's in the same pass, the median of per-round ratios; `None` without
    /// an SDPA cell for that pass (no [`SpeedRequest::sdpa`], or it failed).
    pub fn time_vs_sdpa(&self, cell: &str) -> Option<f64> {
        let sdpa = if cell == LSSA_FWD_BWD { SDPA_FWD_BWD } else { SDPA_FWD };
        crate::measure::paired_ratio(&self.timing(cell)?, &self.timing(sdpa)?)
    }
}

/// Runs `flex_lssa.py speed`, printing a line to stderr per length as it finishes. When the child
/// dies part-way (out of memory at a long length), the rows it finished are returned.
pub fn speed(req: &SpeedRequest) -> Result<Vec<SpeedRow>> {
    let lengths: Vec<String> = req.lengths.iter().map(ToString::to_string).collect();
    let mut cmd = command();
    cmd.arg("speed")
        .args(["--device", &req.device, "--dtype", &req.dtype])
        .args(["--head-dim", &req.head_dim.to_string(), "--heads", &req.heads.to_string()])
        .args(["--lengths", &lengths.join(","), "--batch", &req.batch.to_string()])
        .args(["--tokens", &req.tokens.to_string()])
        .args(["--threads", &req.threads.to_string(), "--reps", &req.reps.to_string()])
        .args(["--min-reps", &req.min_reps.to_string(), "--budget-s", &req.budget_s.to_string()])
        .args(["--lead-in-below-s", &req.lead_in_below_s.to_string()]);
    if req.backward {
        cmd.arg("--backward");
    }
    if req.sdpa {
        cmd.arg("--sdpa");
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().with_context(spawn_context)?;
    // Drain stderr on a thread so a chatty child never blocks on a full pipe.
    let mut err_pipe = child.stderr.take().expect("piped");
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let mut rows = Vec::new();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        if !line.starts_with('{') {
            continue;
        }
        let row: SpeedRow = serde_json::from_str(&line).with_context(|| format!("flex_lssa.py printed `{line}`"))?;
        let cells: Vec<String> = row
            .samples_ms
            .keys()
            .filter_map(|c| row.median_ms(c).map(|ms| format!("{c} {ms:.2} ms")))
            .chain(row.errors.keys().map(|c| format!("{c} -")))
            .collect();
        eprintln!("  flex-attention T={:>5}: {}", row.t, cells.join(", "));
        rows.push(row);
    }
    let status = child.wait()?;
    let stderr = stderr.join().unwrap_or_default();
    if !status.success() || rows.len() != req.lengths.len() {
        let why = format!("flex_lssa.py speed failed ({status}); its stderr ends:\n{}", tail(&stderr, 15));
        if rows.is_empty() {
            bail!(why);
        }
        // Keep the lengths that finished; the others have no row (their cells report that).
        eprintln!("  flex-attention: {why}");
    }
    Ok(rows)
}

/// Runs `flex_lssa.py check DIR` (see the script).
pub fn check(dir: &Path) -> Result<()> {
    let out = command().arg("check").arg(dir).output().with_context(spawn_context)?;
    if !out.status.success() {
        bail!(
            "flex_lssa.py check failed ({}); its stderr ends:\n{}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 15)
        );
    }
    Ok(())
}

fn command() -> Command {
    let (python, _) = gpt_model::runtime::torch_python();
    let mut cmd = Command::new(python);
    // torch warns once that NumPy is missing (the venv has none; nothing here needs it).
    cmd.args(["-W", "ignore::UserWarning"]).arg(script());
    cmd
}

fn spawn_context() -> String {
    let (python, why) = gpt_model::runtime::torch_python();
    format!(
        "running {} ({why}) on {}; set LSSA_TORCH_PYTHON to a Python with torch 2.11",
        python.display(),
        script().display()
    )
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flex_cells_are_paired_with_the_sdpa_cell_of_their_pass_by_round() {
        let row: SpeedRow = serde_json::from_str(
            r#"{"T": 1024, "B": 1, "samples_ms": {"lssa_fwd": [2, 4, 6], "sdpa_fwd": [1, 4, 3],
                "lssa_fwd_bwd": [10, 30], "sdpa_fwd_bwd": [5, 10, 20], "lssar15_fwd": [7]},
                "errors": {"x": "why"}}"#,
        )
        .unwrap();
        // Per-round ratios 2, 1, 2: median 2, where the ratio of medians would be 4 / 3.
        assert_eq!(row.time_vs_sdpa(LSSA_FWD), Some(2.0));
        assert_eq!(row.median_ms(LSSA_FWD), Some(4.0));
        // The backward cell pairs with SDPA's backward, round by round (10 / 5, 30 / 10).
        assert_eq!(row.time_vs_sdpa(LSSA_FWD_BWD), Some(2.5));
        assert_eq!(row.time_vs_sdpa(LSSAR15_FWD), Some(7.0));
        let no_sdpa: SpeedRow = serde_json::from_str(r#"{"T": 1, "B": 1, "samples_ms": {"lssa_fwd": [1]}}"#).unwrap();
        assert_eq!(no_sdpa.time_vs_sdpa(LSSA_FWD), None);
        assert_eq!(row.time_vs_sdpa("absent"), None);
    }
}
