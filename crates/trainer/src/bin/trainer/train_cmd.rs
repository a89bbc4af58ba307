//! `trainer train`: the run (or the built-in launcher of its ranks), then the final evaluation at every
//! length into `result.json`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use gpt_model::checkpoint::WEIGHTS_KIND;
use gpt_model::model::Gpt;
use serde::Serialize;
use trainer::config::TrainConfig;
use trainer::data::loader::validation_tokens;
use trainer::eval::{self, LengthLoss, Rope};
use trainer::train::{self, RunOptions};

use crate::common::{FORMAT_VERSION, RESULT_FORMAT, command_line};

#[derive(clap::Args, Debug)]
pub(crate) struct TrainArgs {
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

/// `trainer train`; `stop` is set by the stop signals `main` installed for it (SIGTERM, SIGINT,
/// SIGUSR1): the training saves at its next step boundary and ends with [`train::Preempted`].
pub(crate) fn train_cmd(a: TrainArgs, stop: trainer::process::StopFlag) -> Result<()> {
    if a.nproc_per_node > 1 && std::env::var_os("RANK").is_none() {
        // The built-in launcher: re-run this command once per rank with torchrun's variables set;
        // a stop signal to it is forwarded to the ranks, which save and stop together.
        let exe = std::env::current_exe().context("locating this binary")?;
        let args = trainer::launch::remove_option(&std::env::args().skip(1).collect::<Vec<_>>(), "--nproc-per-node");
        eprintln!("trainer: launching {} ranks on 127.0.0.1", a.nproc_per_node);
        return Ok(trainer::launch::spawn_stoppable(a.nproc_per_node, &exe, &args, Some(stop))?);
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
        Some("latest") => Some(train::latest_checkpoint(&cfg.out_dir)?),
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
        lock: train::DirLock::Take,
        stop: Some(stop),
        resume,
        progress: !a.no_progress,
        val_tokens: val.clone(),
        command: command_line(),
        overwrite: a.overwrite,
        on_step: None,
        // The one place the trainer reads the kernel switch; below it the choice is a typed value.
        cuda_kernel: gpt_model::attention::CudaKernel::from_env()?,
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
    // The protocol of `trainer eval` and the reproduction (spread spans), so the checkpoint's 1x
    // loss here is the one they report.
    let set = eval::ValidationSet::open(
        &cfg.data_dir,
        cfg.model.context_len,
        &a.eval_lengths,
        eval::DEFAULT_VAL_TARGETS,
        Some(dir.tokenizer_id()),
    )?;
    eprintln!("eval: {}", set.describe());
    let lengths = set.score(&model, &a.eval_lengths, Rope::Ntk, None, 16_384, device)?;
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
