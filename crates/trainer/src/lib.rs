//! trainer: the data pipeline (llm.c shards, tokenizers), the training loop, checkpoints, multi-length
//! evaluation, and data-parallel training over libtorch's c10d process groups (torchrun-compatible).
//!
//! Owns: everything about ranks, process groups, optimiser state and data positions. It is the only
//! crate that knows about ranks and process groups.
//!
//! Must never depend on: `experiments` (no tables or figures here), and never re-implements the model
//! or the attention maths (those are `gpt-model` and `attn-core`).
//!
//! Status: the training loop is the subject of its own issue and is not written yet.

pub mod dist;
pub mod launch;
