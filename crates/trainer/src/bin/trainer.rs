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
//! # a config file plus overrides (any key, dotted into [model])
//! trainer train --config my.toml --set max_steps=2000 --set model.attention=softmax
//!
//! # one GPU (device = "auto" picks it; bf16 autocast)
//! trainer train --config gpu.toml --set device=cuda
//!
//! # N GPUs on one machine, with torchrun (rank 0 logs and writes checkpoints)
//! torchrun --standalone --nproc-per-node=8 --no-python target/release/trainer train --config paper.toml
//!
//! # N processes without Python: the built-in launcher (Gloo on CPU, NCCL on GPU)
//! trainer train --config my.toml --nproc-per-node 2
//!
//! # continue a run exactly where its last checkpoint left it
//! trainer train --config my.toml --resume latest
//! ```
//!
//! Outputs in `out_dir`: `config.toml` (the resolved config), `metrics.jsonl` (one line per step),
//! `ckpt_<step>.safetensors` (model, optimiser moments, step, data position; the last `keep_last`
//! kept), `result.json` (format-tagged summary with the per-length losses). `eval` prints its JSON and
//! writes it with `--out`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gpt_model::model::Gpt;
use serde::Serialize;
use trainer::config::TrainConfig;
use trainer::data::loader::validation_tokens;
use trainer::eval::{self, LengthLoss, Rope};
use trainer::train::{self, RunOptions};

/// Format tag and version of `result.json` and `eval` output.
const RESULT_FORMAT: &str = "lssa-train-result";
const EVAL_FORMAT: &str = "lssa-eval";
const FORMAT_VERSION: u32 = 1;

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
    /// Validation loss of a checkpoint at several multiples of its training length.
    Eval(EvalArgs),
}

#[derive(clap::Args, Debug)]
struct TrainArgs {
    /// TOML config (see `trainer::config::TrainConfig`); without it, the defaults (cpu-small).
    #[arg(long)]
    config: Option<PathBuf>,
    /// `key=value` overrides, TOML values; dotted keys reach into [model] (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Shorthand for --set data_dir=...
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Shorthand for --set out_dir=...
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Resume from a checkpoint file, or `latest` (the newest in out_dir).
    #[arg(long)]
    resume: Option<String>,
    /// Spawn this many ranks on this machine (Gloo on CPU, NCCL on GPU) unless already launched.
    #[arg(long, default_value_t = 1)]
    nproc_per_node: usize,
    /// Lengths (multiples of T_train) of the final evaluation written to result.json.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    eval_lengths: Vec<usize>,
    /// No progress bar (logs instead).
    #[arg(long)]
    no_progress: bool,
}

#[derive(clap::Args, Debug)]
struct EvalArgs {
    /// The checkpoint (its config and tokenizer are read from it).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Shard directory for the validation tokens (default: the checkpoint's training data_dir).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Multiples of the training length.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    lengths: Vec<usize>,
    /// RoPE at long lengths: ntk, plain or both.
    #[arg(long, default_value = "both")]
    rope: String,
    /// Post-hoc re-weighting powers to apply (none: the trained variant only).
    #[arg(long, value_delimiter = ',')]
    reweight: Vec<u32>,
    /// Validation tokens scored at every length (trimmed to a multiple of the longest length).
    #[arg(long, default_value_t = 65_536)]
    val_tokens: usize,
    /// Tokens per forward.
    #[arg(long, default_value_t = 16_384)]
    batch_tokens: usize,
    /// Also write the JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Serialize)]
struct TrainResult<'a> {
    format: &'static str,
    format_version: u32,
    git_revision: String,
    command: String,
    config: &'a TrainConfig,
    world_size: usize,
    steps: usize,
    final_train_loss: f64,
    final_val_loss: Option<f64>,
    wall_s: f64,
    tokens_per_s: f64,
    checkpoint: PathBuf,
    lengths: Vec<LengthLoss>,
}

#[derive(Serialize)]
struct EvalResult {
    format: &'static str,
    format_version: u32,
    git_revision: String,
    command: String,
    checkpoint: PathBuf,
    variant: String,
    context_len: usize,
    lengths: Vec<LengthLoss>,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    // What checkpoints and results record: the tree as it was when this command started.
    trainer::git_revision();
    if let Err(e) = run() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    match Cli::parse().command {
        Cmd::Train(a) => train_cmd(a),
        Cmd::Eval(a) => eval_cmd(a),
    }
}

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

fn load_config(a: &TrainArgs) -> Result<TrainConfig> {
    let (text, name) = match &a.config {
        Some(p) => {
            (std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?, p.display().to_string())
        }
        None => (TrainConfig::default().to_toml(), "defaults".to_string()),
    };
    let mut overrides = a.set.clone();
    if let Some(d) = &a.data_dir {
        overrides.push(format!("data_dir={:?}", d.display().to_string()));
    }
    if let Some(d) = &a.out_dir {
        overrides.push(format!("out_dir={:?}", d.display().to_string()));
    }
    Ok(TrainConfig::from_toml_with_overrides(&text, &name, &overrides)?)
}

fn train_cmd(a: TrainArgs) -> Result<()> {
    if a.nproc_per_node > 1 && std::env::var_os("RANK").is_none() {
        // The built-in launcher: re-run this command once per rank with torchrun's variables set.
        let exe = std::env::current_exe().context("locating this binary")?;
        let args = trainer::launch::remove_option(&std::env::args().skip(1).collect::<Vec<_>>(), "--nproc-per-node");
        eprintln!("trainer: launching {} ranks on 127.0.0.1", a.nproc_per_node);
        return Ok(trainer::launch::spawn(a.nproc_per_node, &exe, &args)?);
    }
    let cfg = load_config(&a)?;
    let me = train::Rank::from_env()?;
    let coll = me.collective();
    let (rank, world) = (coll.rank(), coll.world_size());
    if rank == 0 {
        eprintln!("trainer: resolved config\n{}", cfg.to_toml());
        eprintln!("trainer: {}; {} rank(s)", gpt_model::runtime::describe(), world);
    }
    let mut data = me.open_data(&cfg)?;
    let dir = trainer::data::shard::ShardDir::open(&cfg.data_dir)?;
    if dir.vocab_size() > cfg.model.vocab_size {
        bail!(
            "{}: the data's tokenizer `{}` has {} tokens but model.vocab_size is only {}; set --set model.vocab_size={}",
            cfg.data_dir.display(),
            dir.tokenizer_id(),
            dir.vocab_size(),
            cfg.model.vocab_size,
            dir.vocab_size()
        );
    }
    let longest = a.eval_lengths.iter().copied().max().unwrap_or(1) * cfg.model.context_len;
    let val = validation_tokens(&cfg.data_dir, (cfg.eval_tokens + 1).max(longest * 2 + 1), Some(dir.tokenizer_id()))
        .with_context(|| format!("reading the validation split of {}", cfg.data_dir.display()))?;
    let resume = match a.resume.as_deref() {
        None => None,
        Some("latest") => Some(
            train::list_checkpoints(&cfg.out_dir)?
                .pop()
                .with_context(|| format!("--resume latest: no checkpoint in {}", cfg.out_dir.display()))?,
        ),
        Some(p) => Some(PathBuf::from(p)),
    };
    let opts = RunOptions { resume, progress: !a.no_progress, val_tokens: val.clone(), command: command_line() };
    let run = train::train(&cfg, &mut data, coll, &opts)?;
    if rank != 0 {
        return Ok(());
    }
    // The final evaluation at every length, on the checkpoint just written (rank 0 alone).
    let device = train::pick_device(cfg.device, 0)?;
    let mut vs = tch::nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &cfg.model)?;
    gpt_model::checkpoint::load(&mut vs, &cfg.model, &run.checkpoint)?;
    let lengths = eval::multi_length(&model, &val, &a.eval_lengths, Rope::Ntk, None, 16_384, device)?;
    for l in &lengths {
        eprintln!("eval {:>2}x (T = {:>5}): {:.4} nats/token", l.multiple, l.seq_len, l.loss);
    }
    let last = run.steps.last();
    let result = TrainResult {
        format: RESULT_FORMAT,
        format_version: FORMAT_VERSION,
        git_revision: trainer::git_revision(),
        command: command_line(),
        config: &cfg,
        world_size: world,
        steps: last.map_or(0, |s| s.step),
        final_train_loss: last.map_or(f64::NAN, |s| s.loss),
        final_val_loss: last.and_then(|s| s.val_loss),
        wall_s: run.wall_s,
        tokens_per_s: run.tokens_per_s,
        checkpoint: run.checkpoint.clone(),
        lengths,
    };
    let path = cfg.out_dir.join("result.json");
    std::fs::write(&path, serde_json::to_string_pretty(&result)?)
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("trainer: wrote {}", path.display());
    Ok(())
}

fn eval_cmd(a: EvalArgs) -> Result<()> {
    let meta = gpt_model::checkpoint::read_metadata(&a.checkpoint)?;
    let model_cfg = gpt_model::checkpoint::read_config(&a.checkpoint)?;
    let data_dir = match (&a.data_dir, meta.get("train_config")) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => TrainConfig::from_toml_with_overrides(t, "checkpoint train_config", &[])?.data_dir,
        (None, None) => bail!("{}: no training config in the checkpoint; pass --data-dir", a.checkpoint.display()),
    };
    let ropes = match a.rope.as_str() {
        "ntk" => vec![Rope::Ntk],
        "plain" => vec![Rope::Plain],
        "both" => vec![Rope::Ntk, Rope::Plain],
        other => bail!("--rope {other}: expected ntk, plain or both"),
    };
    let device = train::pick_device(trainer::config::DeviceChoice::Auto, 0)?;
    let mut vs = tch::nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &model_cfg)?;
    gpt_model::checkpoint::load(&mut vs, &model_cfg, &a.checkpoint)?;
    let val = validation_tokens(&data_dir, a.val_tokens + 1, meta.get("tokenizer").map(String::as_str))
        .with_context(|| format!("reading the validation split of {}", data_dir.display()))?;
    let mut lengths = Vec::new();
    let powers: Vec<Option<u32>> = std::iter::once(None).chain(a.reweight.iter().map(|&p| Some(p))).collect();
    for rope in &ropes {
        for p in &powers {
            lengths.extend(eval::multi_length(&model, &val, &a.lengths, *rope, *p, a.batch_tokens, device)?);
        }
    }
    let result = EvalResult {
        format: EVAL_FORMAT,
        format_version: FORMAT_VERSION,
        git_revision: trainer::git_revision(),
        command: command_line(),
        checkpoint: a.checkpoint.clone(),
        variant: model_cfg.attention.clone(),
        context_len: model_cfg.context_len,
        lengths,
    };
    let json = serde_json::to_string_pretty(&result)?;
    println!("{json}");
    if let Some(out) = &a.out {
        std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}
