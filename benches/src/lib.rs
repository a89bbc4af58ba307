//! lssa-benches: side-by-side benchmarks of the fused kernels against libtorch (SDPA and plain tensor
//! ops) and the `attn-core` reference, on the same machine, in the same run, with the same threads.
//!
//! Owns: benchmark harnesses and their Markdown/JSON output. May link tch; `attn-kernels` itself must not.
//!
//! Entry points:
//!
//! - `bench-kernels` (`cargo xtask bench kernels [ARGS...]`): the CPU table `docs/bench/kernels-cpu.md`
//!   and `.json`, and (`bench-kernels memory`) the peak-memory table `docs/bench/memory-cpu.md`.
//! - `cargo bench -p lssa-benches --bench kernels`: a small criterion set for quick before/after checks.
//!
//! Conventions: FLOPs are counted as FlashAttention counts them ([`flops`]), for every variant alike, so
//! GFLOP/s compare wall time on a common scale, not the work each variant really does.
//! Every CPU table (`docs/bench/{kernels,memory,model,train}-cpu.{md,json}`) keeps one section per CPU
//! model: a run replaces its own machine's and keeps the others ([`sections`]).
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

pub mod env;
pub mod flex;
pub mod fma;
pub mod measure;
pub mod memory;
pub mod sections;
pub mod workload;

/// FLOP counts in FlashAttention's convention.
pub mod flops {
    /// Forward FLOPs of causal attention: `4·B·H·T²·d`, halved for the causal mask.
    pub fn forward(b: usize, h: usize, t: usize, d: usize) -> f64 {
        4.0 * (b * h) as f64 * (t as f64) * (t as f64) * d as f64 / 2.0
    }

    /// Backward FLOPs are counted as 2.5x the forward's (FlashAttention's convention).
    pub const BACKWARD_OVER_FORWARD: f64 = 2.5;

    /// Forward plus backward FLOPs: `3.5 x` [`forward`].
    pub fn forward_backward(b: usize, h: usize, t: usize, d: usize) -> f64 {
        forward(b, h, t, d) * (1.0 + BACKWARD_OVER_FORWARD)
    }
}
