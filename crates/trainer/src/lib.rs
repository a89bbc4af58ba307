//! trainer: the data pipeline (llm.c shards, tokenizers), the training loop, checkpoints, multi-length
//! evaluation, and data-parallel training over libtorch's c10d process groups (torchrun-compatible).
//!
//! Owns: everything about ranks, process groups, optimiser state and data positions. It is the only
//! crate that knows about ranks and process groups.
//!
//! Must never depend on: `experiments` (no tables or figures here), and never re-implements the model
//! or the attention maths (those are `gpt-model` and `attn-core`).
//!
//! - [`data`]: llm.c shards, tokenizers, the default corpus, the per-rank loader.
//! - [`dist`], [`launch`]: data parallelism over libtorch's c10d (Gloo, NCCL) and the built-in launcher.
//! - [`config`]: the TOML training config with CLI overrides.
//! - [`train`]: the loop; [`state`]: its checkpoints and log on disk, resume; [`optim`]: AdamW and the schedule; [`process`]: what a
//!   training shares with its process (libtorch's thread count) and machine (its run directory's lock).
//! - [`eval`]: validation loss at `1x..16x` the training length.
//! - [`hf`]: a checkpoint as a Hugging Face (GPT-NeoX) folder that stock transformers loads.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

pub mod config;
pub mod data;
pub mod dist;
pub mod eval;
pub mod hf;
pub mod launch;
pub mod optim;
pub mod process;
pub mod sample;
pub mod state;
pub mod tasks;
pub mod train;

/// The git revision of the working tree (`-dirty` when it has tracked changes), as it was at this
/// function's first call in the process: call it at start-up, and a long job whose tree is edited
/// meanwhile still records the revision its code was started from. Outside a git checkout (a binary
/// carried to a GPU machine with a copy of the tree but no `.git`), `$LSSA_GIT_REVISION` when set (the
/// build's revision, `benches/gpu-session.sh science`), else `unknown`.
pub fn git_revision() -> String {
    static AT_START: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    AT_START.get_or_init(read_git_revision).clone()
}

fn read_git_revision() -> String {
    let git = |args: &[&str]| std::process::Command::new("git").args(args).output().ok().filter(|o| o.status.success());
    let Some(rev) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        let given = std::env::var("LSSA_GIT_REVISION").map(|r| r.trim().to_string());
        return given.ok().filter(|r| !r.is_empty()).unwrap_or_else(|| "unknown".into());
    };
    let rev = String::from_utf8_lossy(&rev.stdout).trim().to_string();
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|o| !o.stdout.is_empty());
    if dirty { format!("{rev}-dirty") } else { rev }
}
