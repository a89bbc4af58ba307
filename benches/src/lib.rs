//! lssa-benches: side-by-side benchmarks of the fused kernels against libtorch (SDPA and plain tensor
//! ops) and the `attn-core` reference, on the same machine, in the same run, with the same threads.
//!
//! Owns: benchmark harnesses and their Markdown/JSON output. May link tch; `attn-kernels` itself must not.
//!
//! Status: the kernel benchmarks arrive with the CPU kernels.
