//! trainer: trains a GPT-2 with any attention variant on llm.c token shards, on one CPU, one GPU or many
//! GPUs, and evaluates checkpoints at `1x..16x` the training length.
//!
//! Runbook:
//!
//! ```text
//! # once: the default corpus (Brown + Shakespeare + Milton, ~8K byte-level BPE) into data/default
//! cargo xtask data
//!
//! # one CPU (2 cores: cpu-small, T = 128, a few minutes), then its evaluation at 1x..16x
//! cargo run --release -p trainer -- train --set model.attention=lssa+rw15 --out-dir runs/lssar
//! cargo run --release -p trainer -- eval --checkpoint runs/lssar/ckpt_00000600.safetensors
//!
//! # the shipped recipes (configs/: the reproduction scales' training configs), plus overrides
//! # (any key, dotted into [model]); `small` is the default reproduction's model (2 CPU cores)
//! trainer train --config configs/small.toml --set model.attention=lssa+rw15 --out-dir runs/lssar
//! trainer train --config configs/small.toml --set max_steps=500 --set model.attention=softmax --out-dir runs/sm
//!
//! # one GPU (device = "auto" picks it; bf16 autocast): the `gpu` scale's 6-layer model at T = 512
//! trainer train --config configs/gpu.toml --set model.attention=lssa+rw15 --out-dir runs/gpu-lssar
//!
//! # N GPUs on one machine, with torchrun (rank 0 logs and writes checkpoints): the paper's recipe
//! torchrun --standalone --nproc-per-node=8 --no-python target/release/trainer train --config configs/paper.toml
//!
//! # N processes without Python: the built-in launcher (Gloo on CPU, NCCL on GPU)
//! trainer train --config configs/small.toml --nproc-per-node 2 --out-dir runs/ddp
//!
//! # continue a run exactly where its last checkpoint left it; or start over in the same directory
//! trainer train --config configs/small.toml --out-dir runs/lssar --resume latest
//! trainer train --config configs/small.toml --out-dir runs/lssar --overwrite
//!
//! # text from any checkpoint (KV cache; --temperature 0 is greedy; the same --seed, the same text)
//! trainer sample --checkpoint runs/lssar/ckpt_00000600.safetensors --prompt "The king said" \
//!     --max-tokens 100 --temperature 0.8 --top-p 0.95 --seed 1
//! trainer sample --checkpoint C --prompts prompts.txt --json        # one prompt per line, batched
//! trainer sample --checkpoint C --prompt "..." --reweight 15        # post-hoc LSSAR p = 15
//! trainer sample --checkpoint C --prompt "..." --max-tokens 400 --length-scale 4   # 4 x T_train, NTK RoPE
//!
//! # weights only (no optimiser moments: about a third of a training checkpoint), for eval and sample
//! trainer export --checkpoint runs/lssar/ckpt_00000600.safetensors --out lssar.safetensors
//!
//! # downstream multiple choice (any of arc_easy, arc_challenge, hellaswag, piqa, sciq, mmlu .jsonl
//! # in DIR) and passkey retrieval, one JSON; --lengths adds the validation loss beside them
//! trainer eval --checkpoint lssar.safetensors --tasks data/mc --passkey --passkey-lengths 1,2,4 --rope ntk
//! trainer eval --checkpoint lssar.safetensors --tasks data/mc --lengths 1,4 --reweight 15 --out eval.json
//! ```
//!
//! Outputs in `out_dir`: `config.toml` (the resolved config), `metrics.jsonl` (one line per step),
//! `ckpt_<step>.safetensors` (model, optimiser moments, step, data position; the last `keep_last`
//! kept), `result.json` (format-tagged summary with the per-length losses). `eval` prints its JSON and
//! writes it with `--out`: `format` = `lssa-eval`, `format_version` = 1, `lengths` (the validation
//! loss; empty when only --tasks / --passkey were asked), and `tasks` / `passkey` when asked.
//! `sample --json` prints `format` = `lssa-sample`.
//!
//! `eval`, `sample` and `export` read a checkpoint once, memory-mapped, and accept both kinds: a
//! training state (`ckpt_*.safetensors`) and a weights-only export; `train --resume` needs the
//! former. The tokenizer is the one the checkpoint records: GPT-2, or the `tokenizer.json` of its
//! training data directory (`--data-dir` points elsewhere: a shard directory or any directory
//! holding that `tokenizer.json`).
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

mod common;
mod eval_cmd;
mod export_cmd;
mod logits_cmd;
mod sample_cmd;
mod train_cmd;

use anyhow::Result;
use clap::{Parser, Subcommand};

use eval_cmd::{EvalArgs, eval_cmd};
use export_cmd::{ExportArgs, export_cmd};
use logits_cmd::{LogitsArgs, logits_cmd};
use sample_cmd::{SampleArgs, sample_cmd};
use train_cmd::{TrainArgs, train_cmd};

#[derive(Parser, Debug)]
#[command(name = "trainer", about = "Train and evaluate GPT-2 with Softplus/LSSA/LSSAR or any attention variant")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Train (one process, or every rank of a torchrun / --nproc-per-node launch).
    Train(TrainArgs),
    /// Validation loss of a checkpoint at several multiples of its training length, downstream
    /// multiple choice (--tasks) and passkey retrieval (--passkey), as one JSON.
    Eval(EvalArgs),
    /// Text from a checkpoint: continue a prompt (or a file of prompts) with the KV cache.
    Sample(SampleArgs),
    /// Write the weights of a checkpoint alone (no optimiser state), for eval and sample, or as a
    /// Hugging Face folder (--format hf).
    Export(ExportArgs),
    /// The logits of one sequence of token ids, as a .npy file (to compare with an export).
    Logits(LogitsArgs),
}

fn main() {
    // Before anything else: it may run this program again with libgomp's spin count set.
    trainer::process::limit_openmp_spinning();
    // Test builds only: the fail points FAILPOINTS configures (gpt_model::io::WRITE_FAILPOINT).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    // The process's settings belong here, not to the library's `train` (which leaves the process as
    // it found it): the allocator keeps freed tensor memory.
    trainer::process::keep_freed_memory();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log piped to a file stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // What checkpoints and results record: the tree as it was when this command started.
    trainer::git_revision();
    if let Err(e) = run() {
        // A stop signal that the training answered by saving: a documented status of its own, so a
        // scheduler's requeue script can tell it from a failure.
        if e.downcast_ref::<trainer::train::Preempted>().is_some()
            || matches!(
                e.downcast_ref::<trainer::launch::LaunchError>(),
                Some(trainer::launch::LaunchError::Preempted { .. })
            )
        {
            eprintln!("trainer: {e:#}");
            std::process::exit(trainer::process::PREEMPTED_EXIT);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    use clap::{CommandFactory, FromArgMatches};
    // `--version` names the git revision too (the crate version alone says little in a clone).
    let version: &'static str =
        Box::leak(format!("{} (git {})", env!("CARGO_PKG_VERSION"), trainer::git_revision()).into_boxed_str());
    let cli = Cli::from_arg_matches(&Cli::command().version(version).get_matches())?;
    match cli.command {
        // Only a training answers SIGTERM / SIGINT / SIGUSR1 by saving first; the other commands
        // keep the default (they have nothing to save).
        Cmd::Train(a) => train_cmd(a, trainer::process::install_stop_handlers()?),
        Cmd::Eval(a) => eval_cmd(a),
        Cmd::Sample(a) => sample_cmd(a),
        Cmd::Export(a) => export_cmd(a),
        Cmd::Logits(a) => logits_cmd(a),
    }
}
