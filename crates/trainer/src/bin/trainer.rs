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

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};
use gpt_model::checkpoint::WEIGHTS_KIND;
use gpt_model::model::{Gpt, Sampling};
use serde::Serialize;
use trainer::config::{DeviceChoice, TrainConfig};
use trainer::data::loader::validation_tokens;
use trainer::eval::{self, LengthLoss, Rope};
use trainer::sample::{self as sampling, SampleOptions};
use trainer::tasks::{self, ModelScorer, PasskeyOptions, PasskeyResult, Scores};
use trainer::train::{self, RunOptions};

/// Format tag and version of `result.json` and `eval` output.
const RESULT_FORMAT: &str = "lssa-train-result";
const EVAL_FORMAT: &str = "lssa-eval";
const SAMPLE_FORMAT: &str = "lssa-sample";
const FORMAT_VERSION: u32 = 1;
/// Prefix of the optimiser moments in a training checkpoint (`trainer::optim::AdamW::state`).
const OPTIM_PREFIX: &str = "optim.";
/// `eval --lengths` when no section is asked for.
const DEFAULT_LENGTHS: [usize; 5] = [1, 2, 4, 8, 16];

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
    /// Write the weights of a checkpoint alone (no optimiser state), for eval and sample.
    Export(ExportArgs),
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
    #[arg(long, conflicts_with = "overwrite")]
    resume: Option<String>,
    /// Start over in an out_dir that holds checkpoints, deleting them and its metrics.jsonl
    /// (without it or --resume, such a directory is refused).
    #[arg(long)]
    overwrite: bool,
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
    /// The checkpoint, a training state or a weights-only export (its config and tokenizer are read
    /// from it).
    #[arg(long)]
    checkpoint: PathBuf,
    /// Shard directory for the validation tokens and the tokenizer (default: the checkpoint's
    /// training data_dir); for the tokenizer alone, any directory holding its tokenizer.json.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Multiples of the training length for the validation loss [default: 1,2,4,8,16 unless --tasks
    /// or --passkey is given, which then skip the loss unless --lengths is given too].
    #[arg(long, value_delimiter = ',')]
    lengths: Option<Vec<usize>>,
    /// RoPE at long lengths.
    #[arg(long, value_enum, default_value_t = RopeChoice::Both)]
    rope: RopeChoice,
    /// Post-hoc re-weighting powers to apply, in every section asked for (none: the trained variant
    /// only).
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
    /// Score the multiple-choice files of this directory (arc_easy, arc_challenge, hellaswag, piqa,
    /// sciq, mmlu `.jsonl`, any subset; see trainer::tasks) zero-shot, as lm-evaluation-harness does.
    #[arg(long, value_name = "DIR")]
    tasks: Option<PathBuf>,
    /// Passkey retrieval with greedy decoding (see trainer::tasks).
    #[arg(long)]
    passkey: bool,
    /// Passkey prompt lengths, multiples of the training length (lengths too short for the prompt's
    /// fixed text are skipped and reported).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16", requires = "passkey")]
    passkey_lengths: Vec<usize>,
    /// Depths of the passkey in the filler (0: start, 1: end).
    #[arg(long, value_delimiter = ',', default_value = "0,0.25,0.5,0.75,1", requires = "passkey")]
    passkey_depths: Vec<f64>,
    /// Passkey prompts per (length, depth).
    #[arg(long, default_value_t = 4, requires = "passkey")]
    passkey_prompts: usize,
    /// Seed of the passkey prompts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// CPU threads for libtorch (0: its default, all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(clap::Args, Debug)]
struct SampleArgs {
    /// The checkpoint, a training state or a weights-only export.
    #[arg(long)]
    checkpoint: PathBuf,
    /// The text to continue (the end-of-text token is put before it, as before every training
    /// document; `<|endoftext|>` alone samples unconditionally).
    #[arg(long, required_unless_present = "prompts", conflicts_with = "prompts")]
    prompt: Option<String>,
    /// A file of prompts, one per line (blank lines skipped; `-` reads standard input), generated in
    /// batches of prompts of equal token length.
    #[arg(long, value_name = "FILE")]
    prompts: Option<PathBuf>,
    /// New tokens per prompt, at most (prompt + new tokens must fit the window, see --length-scale).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Softmax temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    temperature: f64,
    /// Sample among the k most likely tokens only.
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling: among the most likely tokens whose probability reaches p, in (0, 1].
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f64>,
    /// Seed: the same seed, checkpoint, prompts and options give the same text.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating after the end-of-text token (default: a prompt stops there).
    #[arg(long)]
    ignore_eot: bool,
    /// Post-hoc re-weighting power p: the trained variant with `+rw p` at inference.
    #[arg(long)]
    reweight: Option<u32>,
    /// The window as a multiple s >= 1 of the training length: prompt + new tokens may reach
    /// s x T_train tokens (NTK-scaled RoPE at s > 1 unless --rope plain).
    #[arg(long, default_value_t = 1.0)]
    length_scale: f64,
    /// RoPE when --length-scale > 1.
    #[arg(long, value_enum, default_value_t = SampleRope::Ntk)]
    rope: SampleRope,
    /// Where the tokenizer is (default: the checkpoint's training data_dir; GPT-2 needs none): a shard
    /// directory or any directory holding its tokenizer.json.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Most prompts per batched generation.
    #[arg(long, default_value_t = 8)]
    batch_size: usize,
    /// Print one JSON document (format `lssa-sample`) instead of the text.
    #[arg(long)]
    json: bool,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// CPU threads for libtorch (0: its default, all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

#[derive(clap::Args, Debug)]
struct ExportArgs {
    /// The checkpoint to read (a training state; a weights-only file is copied).
    #[arg(long)]
    checkpoint: PathBuf,
    /// The weights-only file to write (atomically; replaced if it exists, never the checkpoint itself).
    #[arg(long)]
    out: PathBuf,
}

/// `sample --rope`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum SampleRope {
    /// NTK-scaled base beyond the training length.
    Ntk,
    /// The training RoPE.
    Plain,
}

/// `--device`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum DeviceArg {
    /// The first GPU when CUDA works, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// The first GPU (an error without CUDA).
    Cuda,
}

impl From<DeviceArg> for DeviceChoice {
    fn from(d: DeviceArg) -> Self {
        match d {
            DeviceArg::Auto => DeviceChoice::Auto,
            DeviceArg::Cpu => DeviceChoice::Cpu,
            DeviceArg::Cuda => DeviceChoice::Cuda,
        }
    }
}

/// `eval --rope`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum RopeChoice {
    /// NTK-scaled beyond the training length.
    Ntk,
    /// Plain RoPE at every length.
    Plain,
    /// Both, one after the other.
    Both,
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

/// What every JSON output of `eval` and `sample` starts with.
#[derive(Serialize)]
struct Header {
    format: &'static str,
    format_version: u32,
    git_revision: String,
    command: String,
    checkpoint: PathBuf,
    variant: String,
    context_len: usize,
}

impl Header {
    fn new(format: &'static str, checkpoint: &std::path::Path, model: &gpt_model::ModelConfig) -> Header {
        Header {
            format,
            format_version: FORMAT_VERSION,
            git_revision: trainer::git_revision(),
            command: command_line(),
            checkpoint: checkpoint.to_path_buf(),
            variant: model.attention.clone(),
            context_len: model.context_len,
        }
    }
}

#[derive(Serialize)]
struct EvalResult {
    #[serde(flatten)]
    header: Header,
    lengths: Vec<LengthLoss>,
    /// With --tasks: one row per re-weighting setting (the trained variant, then each --reweight).
    #[serde(skip_serializing_if = "Option::is_none")]
    tasks: Option<Vec<TasksRow>>,
    /// With --passkey.
    #[serde(skip_serializing_if = "Option::is_none")]
    passkey: Option<PasskeySection>,
}

#[derive(Serialize)]
struct TasksRow {
    reweight: Option<u32>,
    dir: PathBuf,
    /// Per task: the file and the scores.
    scores: BTreeMap<String, TaskScore>,
    /// The same in lm-evaluation-harness's layout.
    lm_eval: serde_json::Value,
}

#[derive(Serialize)]
struct TaskScore {
    file: PathBuf,
    #[serde(flatten)]
    scores: Scores,
}

#[derive(Serialize)]
struct PasskeySection {
    options: PasskeyOptions,
    /// One per (RoPE, re-weighting) setting.
    results: Vec<PasskeyResult>,
}

#[derive(Serialize)]
struct SampleResult<'a> {
    #[serde(flatten)]
    header: Header,
    settings: SampleSettings,
    samples: &'a [sampling::Sample],
}

#[derive(Serialize)]
struct SampleSettings {
    max_tokens: usize,
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    seed: u64,
    stop_at_eot: bool,
    reweight: Option<u32>,
    length_scale: f64,
    rope: &'static str,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: a log piped to a file stays plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // What checkpoints and results record: the tree as it was when this command started.
    trainer::git_revision();
    if let Err(e) = run() {
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
        Cmd::Train(a) => train_cmd(a),
        Cmd::Eval(a) => eval_cmd(a),
        Cmd::Sample(a) => sample_cmd(a),
        Cmd::Export(a) => export_cmd(a),
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
    if let Some(p) = &resume
        && let Ok(meta) = gpt_model::checkpoint::read_metadata(p)
        && meta.get("kind").map(String::as_str) == Some(WEIGHTS_KIND)
    {
        bail!(
            "--resume {}: a weights-only export (trainer export) holds no optimiser state or data position, so a run cannot resume from it; resume from a ckpt_*.safetensors of the run, or start a new run",
            p.display()
        );
    }
    let opts = RunOptions {
        resume,
        progress: !a.no_progress,
        val_tokens: val.clone(),
        command: command_line(),
        overwrite: a.overwrite,
        on_step: None,
    };
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

fn set_threads(threads: usize) {
    if threads > 0 {
        tch::set_num_threads(threads as i32);
    }
}

fn eval_cmd(a: EvalArgs) -> Result<()> {
    set_threads(a.threads);
    let ckpt = sampling::open_checkpoint(&a.checkpoint)?;
    let meta = ckpt.metadata().clone();
    let model_cfg = ckpt.config()?;
    // The validation loss: asked with --lengths, or by default when no other section is.
    let lengths_asked = match &a.lengths {
        Some(l) => Some(l.clone()),
        None if a.tasks.is_none() && !a.passkey => Some(DEFAULT_LENGTHS.to_vec()),
        None => None,
    };
    let data_dir = match (&lengths_asked, &a.data_dir, sampling::train_data_dir(&meta)?) {
        (None, ..) => None,
        (Some(_), Some(d), _) => Some(d.clone()),
        (Some(_), None, Some(d)) => Some(d),
        (Some(_), None, None) => {
            bail!("{}: no training config in the checkpoint; pass --data-dir", a.checkpoint.display())
        }
    };
    if let Some(dir) = &a.tasks {
        tasks::task_files(dir).context("--tasks")?; // a typo fails now, not after the loss
    }
    let ropes = match a.rope {
        RopeChoice::Ntk => vec![Rope::Ntk],
        RopeChoice::Plain => vec![Rope::Plain],
        RopeChoice::Both => vec![Rope::Ntk, Rope::Plain],
    };
    let device = train::pick_device(a.device.into(), 0)?;
    let (_vs, model) = sampling::load_model(&ckpt, device)?;
    drop(ckpt);
    let powers: Vec<Option<u32>> = std::iter::once(None).chain(a.reweight.iter().map(|&p| Some(p))).collect();
    let sections = (usize::from(lengths_asked.is_some() && data_dir.is_some()) * ropes.len()
        + usize::from(a.passkey) * ropes.len()
        + usize::from(a.tasks.is_some()))
        * powers.len();
    let progress = Sections::new(sections);
    let mut lengths = Vec::new();
    if let (Some(multiples), Some(data_dir)) = (&lengths_asked, &data_dir) {
        let val = validation_tokens(data_dir, a.val_tokens + 1, meta.get("tokenizer").map(String::as_str))
            .with_context(|| format!("reading the validation split of {}", data_dir.display()))?;
        for rope in &ropes {
            for p in &powers {
                progress.start(&format!("loss at {multiples:?} x T_train ({}{})", rope_name(*rope), rw_name(*p)));
                lengths.extend(eval::multi_length(&model, &val, multiples, *rope, *p, a.batch_tokens, device)?);
                progress.done();
            }
        }
    }
    let tokenizer = if a.tasks.is_some() || a.passkey {
        Some(sampling::tokenizer_for(&meta, &a.checkpoint, a.data_dir.as_deref())?)
    } else {
        None
    };
    let mut task_rows = None;
    if let (Some(dir), Some(tok)) = (&a.tasks, &tokenizer) {
        let mut rows = Vec::new();
        for p in &powers {
            let mut scorer = ModelScorer::new(&model, tok, device);
            scorer.forward.reweight = *p;
            progress.start(&format!("tasks in {}{}", dir.display(), rw_name(*p)));
            let scored = tasks::score_dir(dir, &mut scorer)?;
            progress.done();
            for (task, _, s) in &scored {
                eprintln!(
                    "eval {task}{}: acc {:.4}, acc_norm {:.4} (n = {})",
                    p.map(|p| format!(" (rw{p})")).unwrap_or_default(),
                    s.acc,
                    s.acc_norm,
                    s.n
                );
            }
            let pairs: Vec<(String, Scores)> = scored.iter().map(|(t, _, s)| (t.clone(), s.clone())).collect();
            rows.push(TasksRow {
                reweight: *p,
                dir: dir.clone(),
                lm_eval: tasks::lm_eval_json(&pairs),
                scores: scored.into_iter().map(|(t, file, scores)| (t, TaskScore { file, scores })).collect(),
            });
        }
        task_rows = Some(rows);
    }
    let mut passkey = None;
    if let (true, Some(tok)) = (a.passkey, &tokenizer) {
        ensure!(
            a.passkey_depths.iter().all(|d| (0.0..=1.0).contains(d)),
            "--passkey-depths must lie in [0, 1], got {:?}",
            a.passkey_depths
        );
        let options = PasskeyOptions {
            multiples: a.passkey_lengths.clone(),
            depths: a.passkey_depths.clone(),
            prompts: a.passkey_prompts,
            seed: a.seed,
            batch_tokens: a.batch_tokens,
        };
        let mut results = Vec::new();
        for rope in &ropes {
            for p in &powers {
                progress.start(&format!("passkey ({}{})", rope_name(*rope), rw_name(*p)));
                let r = tasks::passkey(&model, tok, &options, *rope, *p)?;
                progress.done();
                for s in &r.skipped {
                    eprintln!("eval passkey: skipped {s}");
                }
                eprintln!(
                    "eval passkey ({}{}): {}",
                    if *rope == Rope::Ntk { "ntk" } else { "plain" },
                    p.map(|p| format!(", rw{p}")).unwrap_or_default(),
                    r.example
                );
                results.push(r);
            }
        }
        passkey = Some(PasskeySection { options, results });
    }
    let result =
        EvalResult { header: Header::new(EVAL_FORMAT, &a.checkpoint, &model_cfg), lengths, tasks: task_rows, passkey };
    let json = serde_json::to_string_pretty(&result)?;
    println!("{json}");
    if let Some(out) = &a.out {
        std::fs::write(out, &json).with_context(|| format!("writing {}", out.display()))?;
    }
    Ok(())
}

fn sample_cmd(a: SampleArgs) -> Result<()> {
    set_threads(a.threads);
    let prompts = match (&a.prompt, &a.prompts) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(file)) => sampling::read_prompts(file)?,
        (None, None) => bail!("give --prompt TEXT or --prompts FILE"),
    };
    let opts = SampleOptions {
        max_tokens: a.max_tokens,
        sampling: Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p },
        seed: a.seed,
        stop_at_eot: !a.ignore_eot,
        reweight: a.reweight,
        length_scale: a.length_scale,
        ntk: a.rope == SampleRope::Ntk,
        batch_size: a.batch_size,
    };
    // The options are checked before the (slow) load: a bad flag fails at once.
    opts.sampling.validate().map_err(|e| anyhow::anyhow!("{e}").context("sampling options"))?;
    let device = train::pick_device(a.device.into(), 0)?;
    let loaded = sampling::load(&a.checkpoint, a.data_dir.as_deref(), device)?;
    let samples = sampling::sample(&loaded.model, &loaded.tokenizer, &prompts, &opts)?;
    if a.json {
        let result = SampleResult {
            header: Header::new(SAMPLE_FORMAT, &a.checkpoint, &loaded.config),
            settings: SampleSettings {
                max_tokens: opts.max_tokens,
                temperature: opts.sampling.temperature,
                top_k: opts.sampling.top_k,
                top_p: opts.sampling.top_p,
                seed: opts.seed,
                stop_at_eot: opts.stop_at_eot,
                reweight: opts.reweight,
                length_scale: opts.length_scale,
                rope: if opts.ntk { "ntk" } else { "plain" },
            },
            samples: &samples,
        };
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        for (i, s) in samples.iter().enumerate() {
            if i > 0 {
                println!("---");
            }
            println!("{}{}", s.prompt, s.completion);
        }
    }
    Ok(())
}

fn export_cmd(a: ExportArgs) -> Result<()> {
    let ckpt = sampling::open_checkpoint(&a.checkpoint)?;
    ckpt.config()?; // a file without a model config is no checkpoint of ours
    let names = ckpt.names()?;
    let optim = names.iter().filter(|n| n.starts_with(OPTIM_PREFIX)).count();
    // What describes the model and where it came from stays; the resume state goes.
    let mut meta = ckpt.metadata().clone();
    for key in ["optim_t", "data_position", "world_size"] {
        meta.remove(key);
    }
    if let Some(kind) = ckpt.kind().filter(|k| *k != WEIGHTS_KIND) {
        meta.insert("exported_from_kind".into(), kind.to_string());
    }
    meta.insert("exported_from".into(), a.checkpoint.display().to_string());
    meta.insert("export_git_revision".into(), trainer::git_revision());
    let written = ckpt.export(&a.out, &|name: &str| !name.starts_with(OPTIM_PREFIX), meta)?;
    let mib =
        |p: &std::path::Path| std::fs::metadata(p).map(|m| m.len() as f64 / (1u64 << 20) as f64).unwrap_or(f64::NAN);
    println!(
        "trainer: wrote {} (weights only): {written} tensors, {:.1} MiB; left out {optim} optimiser tensors of {} ({:.1} MiB)",
        a.out.display(),
        mib(&a.out),
        a.checkpoint.display(),
        mib(&a.checkpoint)
    );
    Ok(())
}

/// `eval`'s sections (a loss sweep, a task directory, a passkey sweep) as they run: a bar on a
/// terminal, a line each otherwise.
struct Sections {
    bar: Option<indicatif::ProgressBar>,
}

impl Sections {
    fn new(n: usize) -> Sections {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let bar = indicatif::ProgressBar::new(n as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template("eval {pos}/{len} [{bar:25}] {msg} ({elapsed})")
                    .expect("a valid template")
                    .progress_chars("=> "),
            );
            bar
        });
        Sections { bar }
    }

    fn start(&self, what: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(what.to_string()),
            None => eprintln!("eval: {what} ..."),
        }
    }

    fn done(&self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }
}

impl Drop for Sections {
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn rope_name(rope: Rope) -> &'static str {
    if rope == Rope::Ntk { "ntk" } else { "plain" }
}

fn rw_name(p: Option<u32>) -> String {
    p.map(|p| format!(", rw{p}")).unwrap_or_default()
}
