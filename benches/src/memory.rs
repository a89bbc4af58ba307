//! Peak-memory measurement (Linux `/proc/self/status`) and the memory model of the materialised
//! torch-ops attention.
//!
//! A measurement runs in a fresh child process, so that nothing the parent allocated (libtorch caches,
//! earlier benchmarks) is in its peak. The child allocates and touches the inputs and an output-sized
//! buffer, reads `VmRSS` (the baseline: inputs + output), frees the buffer, resets the peak (`5` into
//! `/proc/self/clear_refs`), runs the forward (which allocates its own output) and reads `VmHWM`.
//! `VmHWM - baseline` is the memory the forward needs beyond its inputs and output.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::workload::Pass;

/// One field of `/proc/self/status` in bytes (the file states kB).
pub fn proc_status_bytes(field: &str) -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .with_context(|| format!("no {field} in /proc/self/status"))?;
    let kib: u64 = line[field.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .with_context(|| format!("parsing `{line}`"))?;
    Ok(kib * 1024)
}

/// Resets `VmHWM` to the current `VmRSS` (Linux 4.0+). Returns whether the kernel accepted it.
pub fn reset_peak() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// What a child reports (one JSON line on its stdout).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChildReport {
    /// `VmRSS` with inputs and an output-sized buffer allocated and touched.
    pub baseline_bytes: u64,
    /// `VmHWM` after the forward.
    pub peak_bytes: u64,
    /// Whether the peak was reset before the forward; if not, the peak may include set-up transients.
    pub peak_reset: bool,
    /// Bytes of the inputs plus the output.
    pub io_bytes: u64,
    /// Wall time of the forward, milliseconds.
    pub forward_ms: f64,
}

impl ChildReport {
    /// Memory the forward needed beyond its inputs and output.
    pub fn extra_bytes(&self) -> u64 {
        self.peak_bytes.saturating_sub(self.baseline_bytes)
    }
}

/// How many `(B, H, T, T)` f32 tensors the torch-ops attention keeps alive at its peak (also used,
/// conservatively, for its softmax, which has fewer intermediates).
///
/// Measured with `bench-kernels memory` (child processes, one head, `T = 4096`, libtorch 2.11 CPU) and
/// rounded up: forward without autograd 4.1 for LSSA and LSSAR alike (the element-wise chain frees as
/// it goes: about two live `T x T` operands plus broadcast temporaries); forward+backward 8.3 (LSSA)
/// and 12.3 (LSSAR), because autograd saves the inputs of every `T x T` op (cosines, scaled scores,
/// softplus, masked `f`, `a`; re-weighting adds `u`, its ReLU, the ratio and its power) and the
/// backward holds a few gradients of that size at once.
pub fn torch_ops_tt_tensors(reweighted: bool, pass: Pass) -> f64 {
    match (pass, reweighted) {
        (Pass::Forward, _) => 4.5,
        (Pass::ForwardBackward, false) => 9.0,
        (Pass::ForwardBackward, true) => 13.0,
    }
}

/// Estimated peak bytes of the torch-ops attention beyond its inputs: `B·H·T²·4 bytes` times
/// [`torch_ops_tt_tensors`].
pub fn torch_ops_bytes(b: usize, h: usize, t: usize, reweighted: bool, pass: Pass) -> f64 {
    (b * h) as f64 * (t as f64).powi(2) * 4.0 * torch_ops_tt_tensors(reweighted, pass)
}

/// Bytes as GiB.
pub fn gib(bytes: f64) -> f64 {
    bytes / (1u64 << 30) as f64
}

/// Bytes as MiB.
pub fn mib(bytes: f64) -> f64 {
    bytes / (1u64 << 20) as f64
}

/// Fails unless `/proc/self/status` is readable (Linux).
pub fn check_supported() -> Result<()> {
    if proc_status_bytes("VmRSS").is_err() || proc_status_bytes("VmHWM").is_err() {
        bail!("peak-memory measurement needs Linux /proc/self/status (VmRSS, VmHWM)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_sees_a_touched_allocation() {
        check_supported().unwrap();
        let before = proc_status_bytes("VmRSS").unwrap();
        let buf = vec![1u8; 64 << 20];
        let after = proc_status_bytes("VmRSS").unwrap();
        let peak = proc_status_bytes("VmHWM").unwrap();
        std::hint::black_box(&buf);
        assert!(after >= before + (60 << 20), "RSS grew by {} bytes only", after.saturating_sub(before));
        assert!(peak >= after);
    }

    #[test]
    fn torch_ops_estimate_scales_with_t_squared() {
        let one = torch_ops_bytes(1, 1, 1024, false, Pass::Forward);
        assert_eq!(one, 1024.0 * 1024.0 * 4.0 * 4.5);
        assert_eq!(torch_ops_bytes(1, 12, 2048, false, Pass::Forward), one * 12.0 * 4.0);
        assert!(torch_ops_bytes(1, 1, 1024, true, Pass::ForwardBackward) > one);
    }
}
