//! The training loop: gradient accumulation to a token budget per step, AdamW with warm-up + cosine,
//! clipping, evaluation every N steps, JSONL metrics, atomic checkpoints (last K kept) and exact resume,
//! for one process or many (gradients averaged through a [`Collective`]).
//!
//! Random state: training draws no random numbers after the initialisation (no dropout; the data order
//! is a deterministic function of the seed and the position), so a checkpoint's `seed` plus its weights, optimiser
//! moments and data position is the whole state, and a resumed run repeats the losses of an
//! uninterrupted one exactly (tested).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail, ensure};
use gpt_model::model::Gpt;
use serde::{Deserialize, Serialize};
use tch::nn::VarStore;
use tch::{Device, Tensor};

use crate::data::recall::RecallTask;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::config::{DeviceChoice, TrainConfig};
use crate::data::loader::WindowSampling;
use crate::optim::AdamW;
pub use crate::state::{CKPT_KIND, METRICS_FILE, checkpoint_path, latest_checkpoint, list_checkpoints};
use crate::state::{check_resume, truncate_metrics};

mod run;
mod shards;

/// Written to `out_dir` by rank 0 when training diverges (`{"step": N, "loss": "NaN"}`), removed when
/// a training starts, so a parent process can tell a divergence from a crash.
pub const DIVERGED_FILE: &str = "diverged.json";

/// The training loss became NaN or infinite (the error [`train`] returns; callers may retry at a
/// lower learning rate, as the experiment runner does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diverged {
    /// The step whose loss was not finite.
    pub step: usize,
    /// That loss.
    pub loss: f64,
}

impl std::fmt::Display for Diverged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "training loss is {} at step {}: diverged (try a lower lr)", self.loss, self.step)
    }
}

impl std::error::Error for Diverged {}

/// A stream of training batches with a resumable position.
pub trait BatchSource {
    /// The next `(x, y)` micro-batch of `batch x seq_len` token ids each (`y` is `x` shifted by one).
    fn next_batch(&mut self) -> Result<(Vec<i64>, Vec<i64>)>;
    /// Where the stream is, serialised (stored in checkpoints).
    fn position(&self) -> serde_json::Value;
    /// Continue from a position returned by [`BatchSource::position`].
    fn seek(&mut self, pos: &serde_json::Value) -> Result<()>;
    /// The tokenizer's identity (stored in checkpoints; a resume with another tokenizer is refused).
    fn tokenizer_id(&self) -> String;
}

/// What data parallelism needs from a process group; [`Single`] is the one-process case.
pub trait Collective {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// This process's index on its node (the CUDA device it uses); 0 outside a process group.
    fn local_rank(&self) -> usize {
        0
    }
    /// Overwrite `tensors` with rank 0's.
    fn broadcast_(&self, tensors: &[Tensor]) -> Result<()>;
    /// Replace `tensors` with their mean over ranks.
    fn all_reduce_mean_(&self, tensors: &[Tensor]) -> Result<()>;
    /// The sum of `x` over ranks.
    fn all_reduce_sum_f64(&self, x: f64) -> Result<f64>;
}

/// One process: every collective is the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn broadcast_(&self, _: &[Tensor]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_mean_(&self, _: &[Tensor]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f64(&self, x: f64) -> Result<f64> {
        Ok(x)
    }
}

/// This process's place in a run: the process group when torchrun's variables (or the built-in
/// launcher's) are set, else [`Single`]. What every rank entry point starts from.
pub struct Rank {
    pg: Option<crate::dist::ProcessGroup>,
}

impl Rank {
    /// Joins the process group named by the environment, if any.
    pub fn from_env() -> Result<Self> {
        Ok(Self { pg: crate::dist::ProcessGroup::from_env()? })
    }

    /// The collectives of this rank ([`Single`] outside a process group).
    pub fn collective(&self) -> &dyn Collective {
        match &self.pg {
            Some(pg) => pg,
            None => &Single,
        }
    }

    /// This rank's share of the training split of `cfg.data_dir`.
    pub fn open_data(&self, cfg: &TrainConfig) -> Result<ShardSource> {
        let c = self.collective();
        let (batch, seq) = (cfg.batch_size, cfg.model.context_len);
        ShardSource::open(&cfg.data_dir, batch, seq, c.rank(), c.world_size(), cfg.seed, cfg.sampling)
            .with_context(|| format!("opening the training data in {}", cfg.data_dir.display()))
    }
}

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StepMetrics {
    /// Optimiser step (1-based: the number of updates applied).
    pub step: usize,
    /// Mean training loss of the step (over ranks and micro-batches).
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Training tokens per second over all ranks.
    pub tokens_per_s: f64,
    /// Model FLOP utilisation, when a peak is configured.
    pub mfu: Option<f64>,
    /// Validation loss at `1x`, on evaluation steps.
    pub val_loss: Option<f64>,
    /// Seconds since the run (or resume) started.
    pub elapsed_s: f64,
}

/// What a finished run reports.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunSummary {
    /// Every step's metrics, in order (from the resume point when resumed).
    pub steps: Vec<StepMetrics>,
    /// The last checkpoint written.
    pub checkpoint: PathBuf,
    /// Wall time of this invocation.
    pub wall_s: f64,
    /// Mean training tokens per second.
    pub tokens_per_s: f64,
}

/// The device for `choice` on a rank with local rank `local_rank`.
pub fn pick_device(choice: DeviceChoice, local_rank: usize) -> Result<Device> {
    Ok(match choice {
        DeviceChoice::Cpu => Device::Cpu,
        DeviceChoice::Cuda => {
            ensure!(
                tch::Cuda::is_available(),
                "device = \"cuda\" but CUDA is not available ({})",
                gpt_model::runtime::describe()
            );
            Device::Cuda(local_rank)
        }
        DeviceChoice::Auto => {
            if tch::Cuda::is_available() {
                Device::Cuda(local_rank)
            } else {
                Device::Cpu
            }
        }
    })
}

/// A training that a stop signal ended after saving ([`RunOptions::stop`]): resume it with
/// `--resume latest` (the binary exits with [`crate::process::PREEMPTED_EXIT`]).
#[derive(Debug)]
pub struct Preempted {
    /// The last step trained (and saved).
    pub step: usize,
    /// The signal, or `a signal to another rank`.
    pub signal: String,
    /// The checkpoint of `step` (rank 0; `None` on the other ranks).
    pub checkpoint: Option<PathBuf>,
}

impl std::fmt::Display for Preempted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stopped by {} after step {}", self.signal, self.step)?;
        if let Some(c) = &self.checkpoint {
            write!(f, ", saved in {}", c.display())?;
        }
        write!(f, "; continue with the same command and --resume latest")
    }
}

impl std::error::Error for Preempted {}

/// Called on rank 0 after every optimiser step with its metrics: how a caller that runs trainings
/// (the experiment runner) shows their progress.
#[derive(Clone)]
pub struct StepHook(pub std::sync::Arc<dyn Fn(&StepMetrics) + Send + Sync>);

impl std::fmt::Debug for StepHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StepHook")
    }
}

/// Who holds the run directory's lock ([`crate::process::RunLock`]) while [`train`] runs.
#[derive(Clone, Debug, Default)]
pub enum DirLock {
    /// `train` takes it on rank 0, and refuses a directory another process holds.
    #[default]
    Take,
    /// The caller holds it, for this `out_dir` (the experiment runner, which clears or resumes the
    /// directory before training and writes its result after).
    Held(std::sync::Arc<crate::process::RunLock>),
    /// The parent process that launched this rank holds it (the runner's `--train-rank` children).
    HeldByParent,
}

/// Options of one [`train`] call besides the config.
#[derive(Debug, Default)]
pub struct RunOptions {
    /// Who holds the run directory's lock.
    pub lock: DirLock,
    /// Read at every step boundary: once a stop signal set it (on any rank), every rank stops at
    /// the same step, rank 0 saves a checkpoint there, and [`train`] returns [`Preempted`]. `None`:
    /// no pre-emption (the handlers belong to the binary's `main`,
    /// [`crate::process::install_stop_handlers`]). Every rank must be given one, or none.
    pub stop: Option<crate::process::StopFlag>,
    /// Resume from this checkpoint (its model, optimiser, step and data position).
    pub resume: Option<PathBuf>,
    /// Show a progress bar (rank 0 only; off in tests).
    pub progress: bool,
    /// Validation tokens for the evaluations during training (empty: no evaluation).
    pub val_tokens: Vec<u16>,
    /// The command line, for the record.
    pub command: String,
    /// Without `resume`, start over in an `out_dir` that holds checkpoints (they and `metrics.jsonl`
    /// are removed first); without it, such a directory is refused, so nothing is lost by mistake.
    pub overwrite: bool,
    /// Called after every step on rank 0 (beside the bar of `progress`).
    pub on_step: Option<StepHook>,
    /// The CUDA kernels the model runs (`Auto` by default; `trainer train` reads `LSSA_CUDA_KERNEL`
    /// for it at start, the documented switch to a lab version in a `lab` build).
    pub cuda_kernel: gpt_model::attention::CudaKernel,
}

/// Trains `cfg` on `data`, evaluating on `opts.val_tokens`, averaging gradients through `coll`.
/// Rank 0 writes `config.toml`, `metrics.jsonl` and checkpoints to `cfg.out_dir`. The process is left
/// as found: libtorch's thread count and autocast dtype are held while the training runs and restored
/// when the last training of the process that holds them returns.
pub fn train(
    cfg: &TrainConfig,
    data: &mut dyn BatchSource,
    coll: &dyn Collective,
    opts: &RunOptions,
) -> Result<RunSummary> {
    cfg.validate()?;
    let start = Instant::now();
    let (rank, world) = (coll.rank(), coll.world_size());
    // The recall mix wraps whatever source the caller gave (checkpoints store its position too).
    let mut mixed;
    let data: &mut dyn BatchSource = if cfg.recall_share > 0.0 {
        let task = RecallTask::for_vocab(cfg.model.vocab_size)?;
        mixed = RecallMix::new(data, task, cfg.recall_share, cfg.model.context_len, cfg.seed)?;
        &mut mixed
    } else {
        data
    };
    let accum = cfg.accumulation(world)?;
    // One writer per run directory, for the whole training: a second one is refused here, before
    // anything below deletes or writes.
    let _lock = take_lock(cfg, &opts.lock, rank)?;
    let device = pick_device(cfg.device, coll.local_rank())?;
    // libtorch's process-wide settings, held for this training and restored when the last training
    // of the process that holds them returns (the allocator's and the signal handlers belong to the
    // binaries' `main`).
    let _threads = crate::process::claim_threads(cfg.threads)?;
    // On the CPU the batch's sequences split over the threads the training runs on (the count just
    // claimed, or the process's), each shard on one libtorch thread of its own (`shards`).
    let shard_count = shards::count(device, tch::get_num_threads().max(1) as usize, cfg.batch_size, cfg.shards);
    let autocast = cfg.bf16 && device.is_cuda();
    let _bf16 = autocast.then(gpt_model::runtime::Bf16Autocast::hold);
    // Every rank refuses (so none waits on a rank 0 that stopped); rank 0 alone deletes, below.
    let old = refuse_overwrite(cfg, opts)?;
    // Everything a resume can refuse is checked, and the model and optimiser built and loaded,
    // before anything in the directory is deleted or written: a refused resume leaves the run's
    // directory as it found it.
    let resume_from = match &opts.resume {
        Some(path) => {
            let r = check_resume(path, cfg, world, &data.tokenizer_id())?;
            data.seek(&r.position).with_context(|| format!("{}: its data position", path.display()))?;
            Some(r)
        }
        None => None,
    };
    // The initial weights are a function of the seed alone, even when several trainings (and the
    // models built to evaluate them) share a process: `new_seeded` seeds and initialises under
    // gpt-model's initialisation lock.
    let mut vs = VarStore::new(device);
    let mut model = Gpt::new_seeded(&vs.root(), &cfg.model, cfg.seed as i64)?;
    model.set_cuda_kernel(opts.cuda_kernel);
    let params: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    let mut opt = AdamW::new(params, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay);
    let mut step = 0usize;
    if let Some(r) = resume_from {
        step = r.apply(&mut vs, &mut opt, &cfg.model)?;
    }
    if rank == 0 {
        prepare_run_dir(cfg, opts.resume.is_none(), &old)?;
    }
    // Every rank starts from rank 0's weights (identical anyway with the same seed; this makes it certain).
    coll.broadcast_(&opt.slots.iter().map(|s| s.param.shallow_clone()).collect::<Vec<_>>())?;
    let shards =
        (shard_count > 1).then(|| shards::Shards::new(&cfg.model, &opt, cfg.seed as i64, shard_count)).transpose()?;
    let tokenizer = data.tokenizer_id();
    let metrics = if rank == 0 { Some(open_metrics(&cfg.out_dir, step)?) } else { None };
    let bar = progress_bar(cfg, opts, rank, step);
    tracing::info!(
        rank,
        world,
        accum,
        shards = shard_count,
        ?device,
        params = cfg.model.n_params(),
        start_step = step,
        "training"
    );
    let run = run::Run {
        cfg,
        opts,
        coll,
        data,
        vs: &vs,
        model: &model,
        opt,
        shards,
        rank,
        world,
        accum,
        device,
        autocast,
        tokenizer,
        metrics,
        bar,
        start,
        first_step: step,
        steps: Vec::new(),
        last_ckpt: PathBuf::new(),
        tokens_seen: 0,
    };
    run.until_done(step)
}

/// The lock `lock` asks for: rank 0's of `cfg.out_dir` when the training takes it, a check that a
/// held one is the run directory's.
fn take_lock(cfg: &TrainConfig, lock: &DirLock, rank: usize) -> Result<Option<crate::process::RunLock>> {
    Ok(match lock {
        DirLock::Take if rank == 0 => Some(crate::process::RunLock::acquire(&cfg.out_dir)?),
        DirLock::Held(l) => {
            let same = |a: &Path, b: &Path| std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok();
            ensure!(
                same(l.dir(), &cfg.out_dir),
                "the lock held is {}'s, not the run directory {}'s",
                l.dir().display(),
                cfg.out_dir.display()
            );
            None
        }
        _ => None,
    })
}

/// The checkpoints a fresh start would delete; an error when there are some and `opts` neither
/// resumes nor overwrites.
fn refuse_overwrite(cfg: &TrainConfig, opts: &RunOptions) -> Result<Vec<PathBuf>> {
    let old = if opts.resume.is_none() { list_checkpoints(&cfg.out_dir)? } else { Vec::new() };
    if !old.is_empty() && !opts.overwrite {
        let names: Vec<String> =
            old.iter().map(|p| p.file_name().unwrap_or_default().to_string_lossy().into_owned()).collect();
        bail!(
            "{} already holds checkpoints ({}): continue the run with --resume latest, or start over with --overwrite (which deletes them)",
            cfg.out_dir.display(),
            names.join(", ")
        );
    }
    Ok(old)
}

/// Rank 0's run directory before the first step: a fresh start deletes `old` checkpoints and the
/// metrics; then `config.toml` is written and a divergence marker of an earlier attempt removed.
fn prepare_run_dir(cfg: &TrainConfig, fresh: bool, old: &[PathBuf]) -> Result<()> {
    let remove = |p: &Path| match std::fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing {}", p.display()))
        }
        _ => Ok(()),
    };
    if fresh {
        for p in old.iter().chain(std::iter::once(&cfg.out_dir.join(METRICS_FILE))) {
            remove(p)?;
        }
    }
    std::fs::create_dir_all(&cfg.out_dir).with_context(|| format!("creating {}", cfg.out_dir.display()))?;
    let toml = cfg.to_toml();
    crate::data::io::write_atomic(&cfg.out_dir.join("config.toml"), |w| w.write_all(toml.as_bytes()))?;
    remove(&cfg.out_dir.join(DIVERGED_FILE))
}

/// `metrics.jsonl` open for appending. A resumed run continues the log from its checkpoint: the
/// lines of steps after `step` (written before a crash or kill) are dropped, so every step appears once.
fn open_metrics(out_dir: &Path, step: usize) -> Result<std::fs::File> {
    let p = out_dir.join(METRICS_FILE);
    truncate_metrics(&p, step)?;
    std::fs::OpenOptions::new().create(true).append(true).open(&p).with_context(|| format!("opening {}", p.display()))
}

/// On a terminal a bar (rank 0, with `opts.progress`); otherwise (a job log, `nohup`) none, and the
/// loop prints a plain line per evaluation and per tenth.
fn progress_bar(cfg: &TrainConfig, opts: &RunOptions, rank: usize, step: usize) -> Option<indicatif::ProgressBar> {
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
    (rank == 0 && opts.progress && terminal).then(|| {
        let b = indicatif::ProgressBar::new(cfg.max_steps as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] step {pos}/{len} {msg} (eta {eta})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_position(step as u64);
        b
    })
}

/// `trainer: step 500/2000, loss 4.1234, val 4.2001, 10234 tok/s, ~3.2 min left` (the time left from
/// the pace since `first_step`, where this invocation started).
pub fn progress_line(m: &StepMetrics, max_steps: usize, first_step: usize) -> String {
    let done = m.step.saturating_sub(first_step).max(1) as f64;
    let left_min = m.elapsed_s / done * max_steps.saturating_sub(m.step) as f64 / 60.0;
    let val = m.val_loss.map_or(String::new(), |v| format!(", val {v:.4}"));
    format!(
        "trainer: step {}/{max_steps}, loss {:.4}{val}, {:.0} tok/s, ~{left_min:.1} min left",
        m.step, m.loss, m.tokens_per_s
    )
}

/// Batches from a shard directory ([`crate::data::loader::DataLoader`]), with its tokenizer identity.
#[derive(Debug)]
pub struct ShardSource {
    /// The loader.
    pub loader: crate::data::loader::DataLoader,
    /// The directory's tokenizer identity.
    pub tokenizer: String,
}

impl ShardSource {
    /// Opens the training split of `dir` for this rank, in the order of `seed` under `sampling`
    /// ([`crate::data::loader::DataLoader::seeded`]: random windows keyed by the seed, or the stream
    /// read from [`crate::data::loader::seed_rotation`]'s token on).
    pub fn open(
        dir: &Path,
        batch: usize,
        seq_len: usize,
        rank: usize,
        world: usize,
        seed: u64,
        sampling: WindowSampling,
    ) -> Result<Self> {
        use crate::data::loader::{DataLoader, Geometry};
        let sd = crate::data::shard::ShardDir::open(dir)?;
        let tokenizer = sd.tokenizer_id().to_string();
        let loader = DataLoader::open(
            dir,
            crate::data::Split::Train,
            Geometry::new(batch, seq_len, rank, world)?,
            Some(&tokenizer),
        )?;
        Ok(Self { loader: loader.seeded(sampling, seed), tokenizer })
    }
}

impl BatchSource for ShardSource {
    fn next_batch(&mut self) -> Result<(Vec<i64>, Vec<i64>)> {
        let b = self.loader.next_batch()?;
        Ok((b.x, b.y))
    }

    fn position(&self) -> serde_json::Value {
        serde_json::to_value(self.loader.position()).expect("a Position serialises")
    }

    fn seek(&mut self, pos: &serde_json::Value) -> Result<()> {
        let pos = serde_json::from_value(pos.clone()).context("data position in the checkpoint")?;
        Ok(self.loader.seek(pos)?)
    }

    fn tokenizer_id(&self) -> String {
        self.tokenizer.clone()
    }
}

impl Collective for crate::dist::ProcessGroup {
    fn rank(&self) -> usize {
        crate::dist::ProcessGroup::rank(self)
    }
    fn local_rank(&self) -> usize {
        self.env().local_rank
    }
    fn world_size(&self) -> usize {
        crate::dist::ProcessGroup::world_size(self)
    }
    fn broadcast_(&self, tensors: &[Tensor]) -> Result<()> {
        Ok(crate::dist::ProcessGroup::broadcast_(self, tensors, 0)?)
    }
    fn all_reduce_mean_(&self, tensors: &[Tensor]) -> Result<()> {
        Ok(crate::dist::ProcessGroup::all_reduce_mean_(self, tensors)?)
    }
    fn all_reduce_sum_f64(&self, x: f64) -> Result<f64> {
        Ok(crate::dist::ProcessGroup::all_reduce_sum_f64(self, x)?)
    }
}

/// Batches from token ids in memory, in order, wrapping around: for tests, synthetic tasks and small
/// experiments. Rank `rank` of `world` takes every `world`-th window, so ranks never overlap.
#[derive(Debug, Clone)]
pub struct MemorySource {
    tokens: Vec<u16>,
    batch: usize,
    seq_len: usize,
    rank: usize,
    world: usize,
    /// Index of the next window of this rank (windows of `seq_len + 1` tokens, stride `seq_len`).
    next: usize,
    tokenizer: String,
}

impl MemorySource {
    /// A source over `tokens` (at least `world x batch` windows of `seq_len + 1` tokens).
    pub fn new(
        tokens: Vec<u16>,
        batch: usize,
        seq_len: usize,
        rank: usize,
        world: usize,
        tokenizer: &str,
    ) -> Result<Self> {
        let windows = tokens.len().saturating_sub(1) / seq_len.max(1);
        ensure!(
            seq_len >= 1 && batch >= 1 && world >= 1 && rank < world && windows >= batch * world,
            "{} tokens make {windows} windows of {seq_len}; need at least batch x world = {}",
            tokens.len(),
            batch * world
        );
        Ok(Self { tokens, batch, seq_len, rank, world, next: 0, tokenizer: tokenizer.to_string() })
    }

    fn windows(&self) -> usize {
        (self.tokens.len() - 1) / self.seq_len
    }
}

impl BatchSource for MemorySource {
    fn next_batch(&mut self) -> Result<(Vec<i64>, Vec<i64>)> {
        let (mut x, mut y) =
            (Vec::with_capacity(self.batch * self.seq_len), Vec::with_capacity(self.batch * self.seq_len));
        for _ in 0..self.batch {
            // Global window index: this rank's share of every group of `world` windows.
            let w = (self.next * self.world + self.rank) % (self.windows() / self.world * self.world);
            let s = w * self.seq_len;
            x.extend(self.tokens[s..s + self.seq_len].iter().map(|&t| i64::from(t)));
            y.extend(self.tokens[s + 1..s + self.seq_len + 1].iter().map(|&t| i64::from(t)));
            self.next += 1;
        }
        Ok((x, y))
    }

    fn position(&self) -> serde_json::Value {
        serde_json::json!({ "next": self.next })
    }

    fn seek(&mut self, pos: &serde_json::Value) -> Result<()> {
        self.next =
            pos.get("next").and_then(serde_json::Value::as_u64).context("memory source position: no `next`")? as usize;
        Ok(())
    }

    fn tokenizer_id(&self) -> String {
        self.tokenizer.clone()
    }
}
/// A [`BatchSource`] that replaces a share of another's windows by recall sequences
/// ([`RecallTask::training_window`] on the window's own text; [`crate::data::recall`]). Whether a window is replaced, and its
/// needles, depend only on `seed` and the window's tokens: a resumed run, or the same run split over
/// data-parallel ranks, sees the same sequences (a window seen again in a later epoch gets the same
/// sequence again).
pub struct RecallMix<'a> {
    inner: &'a mut dyn BatchSource,
    task: RecallTask,
    share: f64,
    seq_len: usize,
    seed: u64,
}

impl<'a> RecallMix<'a> {
    /// Mixes `share` (in `[0, 1]`) recall windows of `seq_len` tokens into `inner`'s batches.
    pub fn new(
        inner: &'a mut dyn BatchSource,
        task: RecallTask,
        share: f64,
        seq_len: usize,
        seed: u64,
    ) -> Result<Self> {
        ensure!((0.0..=1.0).contains(&share), "recall share {share} is outside [0, 1]");
        ensure!(seq_len >= 12, "recall sequences need windows of at least 12 tokens, not {seq_len}");
        Ok(Self { inner, task, share, seq_len, seed })
    }
}

/// A generator seeded by `seed` and the tokens of `window` (FNV-1a).
fn window_rng(seed: u64, window: &[u32]) -> ChaCha8Rng {
    let h = window
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .chain(seed.to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    ChaCha8Rng::seed_from_u64(h)
}

impl BatchSource for RecallMix<'_> {
    fn next_batch(&mut self) -> Result<(Vec<i64>, Vec<i64>)> {
        let (mut x, mut y) = self.inner.next_batch()?;
        let t = self.seq_len;
        ensure!(x.len() == y.len() && x.len() % t == 0, "a batch of {} tokens is not whole windows of {t}", x.len());
        for row in 0..x.len() / t {
            let (xr, yr) = (&mut x[row * t..(row + 1) * t], &mut y[row * t..(row + 1) * t]);
            let mut window: Vec<u32> = xr.iter().map(|&v| v as u32).chain(std::iter::once(yr[t - 1] as u32)).collect();
            let mut rng = window_rng(self.seed, &window);
            if rng.random::<f64>() >= self.share {
                continue;
            }
            self.task.training_window(&mut window, &mut rng)?;
            for i in 0..t {
                xr[i] = i64::from(window[i]);
                yr[i] = i64::from(window[i + 1]);
            }
        }
        Ok((x, y))
    }

    fn position(&self) -> serde_json::Value {
        self.inner.position()
    }

    fn seek(&mut self, pos: &serde_json::Value) -> Result<()> {
        self.inner.seek(pos)
    }

    fn tokenizer_id(&self) -> String {
        self.inner.tokenizer_id()
    }
}
