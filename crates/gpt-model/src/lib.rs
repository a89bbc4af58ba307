//! gpt-model: GPT-2 (RoPE, NTK-scaled at long lengths) on libtorch through `tch`, with every attention
//! variant of `attn-core` selectable by name.
//!
//! Owns: the model ([`model::Gpt`]), its config and presets ([`config`]), checkpoint I/O
//! ([`checkpoint`]), generation with a KV cache, and the bridge that puts the fused `attn-kernels`
//! inside libtorch's autograd ([`attention::fused`], on the crate's one FFI module `ffi`). It is the only crate that knows `tch` modules.
//!
//! Must never depend on: `trainer`, `experiments` (no training loop, no process groups, no reporting
//! here). The attention maths itself is never re-derived here: it comes from `attn-core` (reference)
//! and `attn-kernels` (fused); [`attention::torch_ops`] restates it in tch ops and is tested against
//! `attn-core`.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

pub mod attention;
pub mod checkpoint;
pub mod config;
mod ffi;
pub mod io;
pub mod loss;
pub mod model;
pub mod runtime;

pub use config::{AttnImpl, Init, ModelConfig};
pub use model::{ForwardOptions, Gpt, KvCache};
