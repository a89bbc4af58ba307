//! gpt-model: GPT-2 (RoPE, NTK-scaled at long lengths) on libtorch through `tch`, with every attention
//! variant of `attn-core` selectable by name.
//!
//! Owns: the model, its config presets, checkpoint I/O, generation with a KV cache, and the bridge that
//! puts the fused `attn-kernels` inside libtorch's autograd. It is the only crate that knows `tch`
//! modules.
//!
//! Must never depend on: `trainer`, `experiments` (no training loop, no process groups, no reporting
//! here). The attention maths itself is never re-derived here: it comes from `attn-core` (reference)
//! and `attn-kernels` (fused).

pub mod attention;
pub mod runtime;
