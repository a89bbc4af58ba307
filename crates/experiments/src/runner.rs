//! The runner: trains every variant the experiments need, once per seed, and evaluates each run at
//! every (RoPE, post-hoc `p`, length) they ask for. Each run lives in its own directory
//! ([`run_dir`]) with its checkpoints, `metrics.jsonl` and `result.json`; results are written after
//! every evaluation and a finished piece is never redone, so an interrupted `reproduce` continues where
//! it stopped, and asking for more seeds later trains only the new ones.
//!
//! A result is reused only when its config (seed included) and the [`numbers_revision`] of the code
//! it was computed with match; otherwise the run is redone from scratch.
//!
//! Stopping ([`run_all`]'s `stop`, set by `reproduce`'s stop handlers on SIGTERM, SIGINT or SIGUSR1):
//! every training in flight saves a checkpoint at its next step and ends with
//! [`trainer::train::Preempted`], no new run and no new evaluation starts (one in flight finishes and
//! is written; results are written atomically, so none is left partial), and [`run_all`] returns
//! [`Stopped`]. The same command then continues: finished results are reused and each interrupted
//! training resumes from its newest checkpoint, to the numbers an uninterrupted run gives.
//!
//! Every evaluation scores the same validation spans ([`trainer::eval::ValidationSet`], the protocol `trainer eval` uses) and keeps
//! the loss of every window ([`trainer::eval::WindowLosses`]), so two runs, lengths or RoPE
//! treatments are compared on identical target tokens ([`crate::stats`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use gpt_model::model::Gpt;
use serde::{Deserialize, Serialize};
use trainer::config::TrainConfig;
use trainer::data::corpus::{self, BuildOptions, TokenizerChoice};
use trainer::eval::LengthLoss;
use trainer::process::StopFlag;
use trainer::train;

use crate::scale::{Data, Scale};
use crate::spec::{EvalKey, SinkKey, TrainedVariant};

mod evaluate;
mod training;

pub use training::{Launch, train_rank};
use training::{RANK_SUMMARY_FILE, train_attempt};

/// Format tag and version of a run's `result.json`.
pub const RESULT_FORMAT: &str = "lssa-experiment-run";
/// Version of [`RESULT_FORMAT`] (2: seeds, per-window losses on spread validation spans).
pub const RESULT_VERSION: u32 = 2;

/// A hash of every source file that can change a run's numbers (`build.rs` lists them), fixed when
/// this binary was built. Results and checkpoints made by other code are not reused.
pub fn numbers_revision() -> &'static str {
    env!("LSSA_NUMBERS_HASH")
}

/// [`numbers_revision`] and a hash of the retrieval and Newton's-law experiments' own sources: what
/// their cached results must match to be reused.
pub fn task_revision() -> String {
    format!("{}+{}", env!("LSSA_NUMBERS_HASH"), env!("LSSA_TASK_HASH"))
}

/// An FNV-1a hash of `text`, in hex: a short fingerprint of a config.
pub fn fingerprint(text: &str) -> String {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    format!("{h:016x}")
}

/// The file in a run directory that names the [`numbers_revision`] its checkpoints were trained with.
const REVISION_FILE: &str = "numbers-revision";

/// One trained variant and its evaluations.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    /// Format tag.
    pub format: String,
    /// Format version.
    pub format_version: u32,
    /// Scale name.
    pub scale: String,
    /// The trained variant.
    pub variant: String,
    /// Which seed of the variant this is (0, 1, ...; the config's `seed` is the scale's plus this).
    #[serde(default)]
    pub seed_index: usize,
    /// The resolved training config (TOML).
    pub config: String,
    /// Git revision of the training (`-dirty` when the work tree had uncommitted changes).
    pub git_revision: String,
    /// [`numbers_revision`] of the code that trained and evaluated it.
    #[serde(default)]
    pub numbers_revision: String,
    /// The command that produced it.
    pub command: String,
    /// Training wall time in seconds.
    pub train_wall_s: f64,
    /// Evaluation wall time in seconds (all evaluations so far).
    #[serde(default)]
    pub eval_wall_s: f64,
    /// Mean training tokens per second.
    pub tokens_per_s: f64,
    /// Training loss of the last step (NaN, written `null`, when training failed).
    #[serde(deserialize_with = "trainer::eval::null_as_nan")]
    pub final_train_loss: f64,
    /// The learning rate it was trained at (the scale's, or lower after a divergence).
    #[serde(default)]
    pub lr: f64,
    /// What happened on the way (e.g. a divergence and the retry at a lower learning rate).
    #[serde(default)]
    pub note: Option<String>,
    /// Every evaluation so far.
    pub evals: Vec<(EvalKey, LengthLoss)>,
    /// Attention-sink measurements (sinks experiment).
    #[serde(default)]
    pub sinks: Vec<SinkEval>,
    /// Why training failed (e.g. it diverged); the run then has no evaluations and is not retried.
    #[serde(default)]
    pub error: Option<String>,
}

impl RunResult {
    /// The loss of one evaluation.
    pub fn loss(&self, key: &EvalKey) -> Option<f64> {
        self.eval(key).map(|l| l.loss)
    }

    /// One evaluation, with its per-window losses.
    pub fn eval(&self, key: &EvalKey) -> Option<&LengthLoss> {
        self.evals.iter().find(|(k, _)| k == key).map(|(_, l)| l)
    }
}

/// Every run of every variant, seeds in order (`runs["lssa"][1]` is seed index 1 of `lssa`).
pub type Runs = BTreeMap<String, Vec<RunResult>>;

/// One attention-sink measurement of a trained model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SinkEval {
    /// What was measured.
    pub key: SinkKey,
    /// Per layer, first to last.
    pub layers: Vec<crate::sinks::LayerSinks>,
    /// The attention-map PNG drawn for it, if any.
    pub map: Option<PathBuf>,
}

/// Validation windows per attention-sink measurement.
const SINK_WINDOWS: usize = 4;

/// A directory name for a variant (`lssa+rw15` -> `lssa_rw15`).
pub fn run_dir_name(variant: &str) -> String {
    variant.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect()
}

/// The directory of seed `seed_index` of `variant` under `out`: `out/lssa_rw15` for the first seed
/// (which the later experiments load), `out/lssa_rw15_seed1` and so on for the others.
pub fn run_dir(out: &Path, variant: &str, seed_index: usize) -> PathBuf {
    match seed_index {
        0 => out.join(run_dir_name(variant)),
        k => out.join(format!("{}_seed{k}", run_dir_name(variant))),
    }
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let write = |w: &mut dyn std::io::Write| serde_json::to_writer_pretty(w, value).map_err(std::io::Error::other);
    Ok(trainer::data::io::write_atomic(path, write)?)
}

/// Generated English-like text, tokenized by the real pipeline into `<out>/data` (the smoke scale).
fn generated_data(out: &Path) -> Result<PathBuf> {
    let dir = out.join("data");
    if dir.join("manifest.json").exists() {
        return Ok(dir);
    }
    let text = out.join("text");
    corpus::write_generated_text(&text, 12, 3000, 2024)?;
    let corpus = corpus::input_documents(&[text])?;
    let opts = BuildOptions { tokenizer: TokenizerChoice::Bpe { vocab_size: 320 }, ..BuildOptions::new(&dir) };
    corpus::build(corpus, &opts)?;
    Ok(dir)
}

pub(crate) use crate::progress::say;

/// The data directory (generated for the smoke scale), its shards, and the scale's training
/// configuration pointed at them: what every run of `scale` under `out` starts from.
pub fn base_config(scale: &Scale, out: &Path) -> Result<(PathBuf, trainer::data::shard::ShardDir, TrainConfig)> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let data_dir = match &scale.data {
        Data::Generated => generated_data(out)?,
        Data::Shards(d) => d.clone(),
    };
    let sd = trainer::data::shard::ShardDir::open(&data_dir).with_context(|| {
        let build = if data_dir == Path::new(crate::scale::SMALL_DATA) {
            crate::scale::SMALL_DATA_COMMAND
        } else {
            "cargo xtask data"
        };
        format!("{}: no training data (run `{build}` first)", data_dir.display())
    })?;
    let mut base = scale.train.clone();
    base.data_dir = data_dir.clone();
    base.model.vocab_size = base.model.vocab_size.max(sd.vocab_size());
    Ok((data_dir, sd, base))
}

/// A trained language model loaded for an experiment that runs after the trainings.
pub struct Trained {
    /// The variables (kept alive with the model; fine-tuning updates them).
    pub vs: tch::nn::VarStore,
    /// The model, from the run's last checkpoint.
    pub model: Gpt,
    /// The data directory's tokenizer.
    pub tokenizer: trainer::data::tokenizer::Tokenizer,
    /// The scale's validation tokens.
    pub val: Vec<u16>,
    /// The training configuration the run used.
    pub cfg: TrainConfig,
    /// Where the model lives.
    pub device: tch::Device,
}

/// Loads the trained `variant` of `scale` under `out` (its last checkpoint), with its tokenizer and
/// the validation tokens.
pub fn load_trained(scale: &Scale, out: &Path, variant: &TrainedVariant) -> Result<Trained> {
    load_trained_seed(scale, out, variant, 0)
}

/// [`load_trained`] for seed `seed_index` of `variant`.
pub fn load_trained_seed(scale: &Scale, out: &Path, variant: &TrainedVariant, seed_index: usize) -> Result<Trained> {
    let (data_dir, sd, base) = base_config(scale, out)?;
    let tokenizer = trainer::data::tokenizer::Tokenizer::load_for_dir(&data_dir)?;
    let val = trainer::data::loader::validation_tokens(&data_dir, scale.val_tokens, Some(sd.tokenizer_id()))?;
    // The config the run was trained with (a `--set` may have changed the scale's), else the scale's.
    let mut cfg = run_config(&base, out, variant, seed_index);
    let saved = cfg.out_dir.join("config.toml");
    if let Ok(text) = std::fs::read_to_string(&saved) {
        cfg = TrainConfig::from_toml_with_overrides(&text, &saved.display().to_string(), &[])?;
    }
    let ckpt = train::list_checkpoints(&cfg.out_dir)?
        .pop()
        .with_context(|| format!("no trained `{variant}` model in {} (train it first)", cfg.out_dir.display()))?;
    let device = train::pick_device(cfg.device, 0)?;
    let mut vs = tch::nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &cfg.model)?;
    gpt_model::checkpoint::load(&mut vs, &cfg.model, &ckpt)?;
    Ok(Trained { vs, model, tokenizer, val, cfg, device })
}

/// The training config of seed `seed_index` of `variant`: the scale's `base` with the variant, the
/// run directory and the seed (the scale's plus the index).
pub fn run_config(base: &TrainConfig, out: &Path, variant: &TrainedVariant, seed_index: usize) -> TrainConfig {
    TrainConfig {
        model: gpt_model::ModelConfig { attention: variant.variant().clone(), ..base.model.clone() },
        out_dir: run_dir(out, variant, seed_index),
        seed: base.seed + seed_index as u64,
        ..base.clone()
    }
}

/// The results already under `out` for the plan, without training or evaluating anything: every
/// seed whose `result.json` has the config the plan would train, whatever code computed it (the
/// report lists the revisions). For `reproduce --report-only`.
pub fn load_all(
    scale: &Scale,
    plan: &BTreeMap<TrainedVariant, Vec<EvalKey>>,
    seeds: &BTreeMap<String, usize>,
    out: &Path,
) -> Result<Runs> {
    let (_, _, base) = base_config(scale, out)?;
    let mut runs = Runs::new();
    for variant in plan.keys() {
        for k in 0..seeds.get(variant.as_str()).copied().unwrap_or(1) {
            let cfg = run_config(&base, out, variant, k);
            let Ok(text) = std::fs::read_to_string(cfg.out_dir.join("result.json")) else { continue };
            let Ok(r) = serde_json::from_str::<RunResult>(&text) else { continue };
            if r.format_version == RESULT_VERSION && r.config == cfg.to_toml() {
                runs.entry(variant.to_string()).or_default().push(r);
            }
        }
    }
    Ok(runs)
}

/// The scale's validation spans: enough spans of `longest x T_train + 1` tokens for
/// `scale.val_targets` targets, spread over the validation split of `data_dir` (every length scores
/// exactly these targets).
pub fn validation_spans(scale: &Scale, data_dir: &Path, tokenizer: &str, longest: usize) -> Result<Vec<Vec<u16>>> {
    let t = scale.train.model.context_len;
    let set = trainer::eval::ValidationSet::open(data_dir, t, &[longest], scale.val_targets, Some(tokenizer))
        .with_context(|| format!("the {} scale's validation spans", scale.name))?;
    Ok(set.spans)
}

/// Runs every planned training, `seeds[variant]` seeds each (one when absent), in `jobs` parallel
/// workers (on a CPU machine they share libtorch's thread pool); returns every run's result. The
/// first seed of a variant gets every evaluation of `plan`, the others those `later_seeds` keeps
/// (the post-hoc sweep of Figure 2, for one, reads the first seed only). Once `stop` is set, see the
/// module docs: the error is then [`Stopped`] (unless a run also failed otherwise: that error).
#[allow(clippy::too_many_arguments)]
pub fn run_all(
    scale: &Scale,
    plan: &BTreeMap<TrainedVariant, Vec<EvalKey>>,
    seeds: &BTreeMap<String, usize>,
    later_seeds: &(dyn Fn(&EvalKey) -> bool + Sync),
    out: &Path,
    command: &str,
    jobs: usize,
    launch: &Launch,
    sinks: &BTreeMap<String, Vec<SinkKey>>,
    stop: Option<StopFlag>,
) -> Result<Runs> {
    let (data_dir, sd, base) = base_config(scale, out)?;
    let world = match launch {
        Launch::InProcess => 1,
        Launch::Ranks { nproc, .. } => *nproc,
    };
    // Fail before training anything if the global batch does not split over the ranks.
    base.accumulation(world)?;
    let longest = plan.values().flatten().map(|k| k.multiple).max().unwrap_or(1);
    let spans = validation_spans(scale, &data_dir, sd.tokenizer_id(), longest)?;
    // Seeds first by index, so an interrupted reproduction has every variant's first seed early.
    let mut runs: Vec<(&TrainedVariant, &Vec<EvalKey>, usize)> = Vec::new();
    let most = plan.keys().map(|v| seeds.get(v.as_str()).copied().unwrap_or(1)).max().unwrap_or(1);
    for k in 0..most {
        runs.extend(
            plan.iter().filter(|(v, _)| k < seeds.get(v.as_str()).copied().unwrap_or(1)).map(|(v, n)| (v, n, k)),
        );
    }
    let total_steps = runs.len() * base.max_steps;
    say(&format!(
        "scale {}: {} training runs ({} variants, up to {most} seeds) x {} steps; estimate {:.0} min for training on the machine this scale targets, plus evaluation",
        scale.name,
        runs.len(),
        plan.len(),
        base.max_steps,
        total_steps as f64 * scale.est_step_s / 60.0
    ));
    let started = Instant::now();
    let n_runs = runs.len();
    let jobs = jobs.clamp(1, n_runs.max(1));
    if jobs > 1 {
        say(&format!("{jobs} runs at a time"));
    }
    let overall = crate::progress::overall(n_runs);
    let queue = std::sync::Mutex::new(runs.into_iter());
    let results = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let worker = || {
        loop {
            // After a stop signal no new run starts.
            if stop.and_then(|s| s.signal()).is_some() {
                return;
            }
            let Some((variant, needs, k)) = queue.lock().expect("queue").next() else { return };
            let cfg = run_config(&base, out, variant, k);
            // Attention maps, sink statistics and the post-hoc sweep come from the first seed.
            let sink_needs = if k == 0 { sinks.get(variant.as_str()).map_or(&[][..], Vec::as_slice) } else { &[] };
            let needs: Vec<EvalKey> = needs.iter().copied().filter(|key| k == 0 || later_seeds(key)).collect();
            match run_one(scale, &cfg, k, &needs, sink_needs, &spans, command, launch, stop)
                .with_context(|| format!("run `{variant}` seed {k}"))
            {
                Ok(r) => {
                    let done = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    let elapsed = started.elapsed().as_secs_f64();
                    say(&format!(
                        "[{done}/{n_runs}] {variant} seed {k}: train loss {:.3}, val 1x {:.3} ({:.0} s so far, ~{:.0} min left)",
                        r.final_train_loss,
                        r.loss(&EvalKey { ntk: true, posthoc: None, multiple: 1 }).unwrap_or(f64::NAN),
                        elapsed,
                        elapsed / done as f64 * (n_runs - done) as f64 / 60.0
                    ));
                    overall.inc(1);
                    results.lock().expect("results").push(r);
                }
                Err(e) => {
                    // Stop taking new runs; the ones in flight finish (their results are kept), or
                    // after a stop signal save and stop too.
                    match e.chain().find_map(|c| c.downcast_ref::<train::Preempted>()) {
                        Some(p) => say(&format!(
                            "{variant} seed {k}: stopped by {} after step {}{}",
                            p.signal,
                            p.step,
                            p.checkpoint.as_ref().map_or(String::new(), |c| format!(", saved in {}", c.display()))
                        )),
                        None if is_stop(&e) => {}
                        None => say(&format!("{e:#}")),
                    }
                    failures.lock().expect("failures").push(e);
                    while queue.lock().expect("queue").next().is_some() {}
                    return;
                }
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(worker);
        }
    });
    overall.finish_and_clear();
    let mut failures = failures.into_inner().expect("failures");
    // A failure of its own outweighs the stop (the next invocation would meet it again).
    if let Some(i) = failures.iter().position(|e| !is_stop(e)) {
        return Err(failures.swap_remove(i));
    }
    if let Some(sig) = stop.and_then(|s| s.signal()) {
        return Err(Stopped { signal: trainer::process::signal_name(sig) }.into());
    }
    if let Some(e) = failures.into_iter().next() {
        return Err(e);
    }
    let mut by_variant = Runs::new();
    let mut all = results.into_inner().expect("results");
    all.sort_by_key(|r| r.seed_index);
    for r in all {
        by_variant.entry(r.variant.clone()).or_default().push(r);
    }
    Ok(by_variant)
}

/// How many language-model runs to train at once when `--jobs` is not given: one on a GPU or on
/// fewer than 4 cores; from 4 cores, one per 4 cores, at least 2 and at most 4.
///
/// Each run uses every core whatever the count (libtorch's intra-op threads), so its arithmetic,
/// and every number in the report, is the same for any count: only the wall time changes. On 2
/// cores one at a time is faster once the trainings are long: two runs side by side contend for the
/// cores (each with its own OpenMP team, both spinning), while a lone run's team has them. Measured
/// on a 2-core Intel Xeon at the `small` scale (`reproduce --claims-only --only lssa+rw15,softmax`,
/// the release binary of 92ee767, otherwise idle; 2026-11-29, 300 steps, two alternations):
/// training ran at 19.8K (LSSAR) and 24.5K (softmax) tokens/s alone against 18.2K and 22.2K for the
/// pair side by side, and the evaluations took as long either way (13-15 s each alone, 25-27 s for
/// two at once); whole runs, 4 of them: 110-114 s one at a time, 114-115 s two at once, with the
/// same losses to the bit. An 8000-step run is about 95% training, so one at a time saves about 8%
/// of the default run's trainings. Two at once had won at 150 steps (191-198 s against 236-238 s,
/// an earlier revision), where evaluation was most of a run. Giving each of two runs one thread instead changes the
/// numbers (libtorch's reductions split by thread count), so it is not an option.
pub fn default_jobs(cuda: bool) -> usize {
    jobs_for(cores(), cuda, RUNS_ALONE_BELOW)
}

/// How many small models (the retrieval benchmark's) to train at once when nothing says: one on a
/// GPU or a lone core, else one per 4 cores, at least 2 and at most 4, each on its share of the
/// cores (`retrieval::run`): these models are too small to keep 2 cores busy alone.
pub fn small_model_jobs(cuda: bool) -> usize {
    jobs_for(cores(), cuda, SMALL_MODELS_ALONE_BELOW)
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Below this many cores language-model runs train one at a time ([`default_jobs`]).
const RUNS_ALONE_BELOW: usize = 4;
/// Below this many cores the retrieval benchmark's small models train one at a time
/// ([`small_model_jobs`]).
const SMALL_MODELS_ALONE_BELOW: usize = 2;

/// One job on a GPU or below `alone_below` cores, else one per 4 cores, at least 2 and at most 4.
fn jobs_for(cores: usize, cuda: bool, alone_below: usize) -> usize {
    if cuda || cores < alone_below { 1 } else { (cores / 4).clamp(2, 4) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_jobs_by_machine() {
        // One GPU trains one run at a time; a lone core too.
        assert_eq!(jobs_for(64, true, RUNS_ALONE_BELOW), 1);
        assert_eq!(jobs_for(1, false, RUNS_ALONE_BELOW), 1);
        // Language models: one below 4 cores (2 and 3: one run has them all); two from 4 up to 11,
        // then one per 4 cores, at most 4.
        assert_eq!([2, 3].map(|c| jobs_for(c, false, RUNS_ALONE_BELOW)), [1; 2]);
        assert_eq!([4, 8, 11].map(|c| jobs_for(c, false, RUNS_ALONE_BELOW)), [2; 3]);
        assert_eq!([12, 15, 16, 64].map(|c| jobs_for(c, false, RUNS_ALONE_BELOW)), [3, 3, 4, 4]);
        // Small models: two at once from 2 cores, each on its share of them.
        assert_eq!([1, 2, 3, 8, 16].map(|c| jobs_for(c, false, SMALL_MODELS_ALONE_BELOW)), [1, 2, 2, 2, 4]);
        assert_eq!(jobs_for(64, true, SMALL_MODELS_ALONE_BELOW), 1);
    }

    /// A second runner on a run directory that another holds (a runner or a trainer: both take
    /// its lock) is refused before it removes or writes anything there, though the directory's
    /// stale checkpoints are what it would otherwise clear.
    #[test]
    fn a_second_runner_on_a_locked_directory_touches_nothing() {
        let out = tempfile::tempdir().unwrap();
        let scale = Scale::by_name("smoke").unwrap();
        let (_, _, base) = base_config(&scale, out.path()).unwrap();
        let cfg = run_config(&base, out.path(), &"lssa".parse().unwrap(), 0);
        std::fs::create_dir_all(&cfg.out_dir).unwrap();
        // A stale run: another config and checkpoints that a fresh start would delete.
        let files = [("config.toml", "stale = true\n"), ("ckpt_00000005.safetensors", "x"), ("metrics.jsonl", "{}\n")];
        for (f, text) in files {
            std::fs::write(cfg.out_dir.join(f), text).unwrap();
        }
        let holder = trainer::process::RunLock::acquire(&cfg.out_dir).unwrap();
        let err = run_one(&scale, &cfg, 0, &[], &[], &[], "test", &Launch::InProcess, None).unwrap_err();
        assert!(format!("{err:#}").contains("is in use"), "{err:#}");
        for (f, text) in files {
            assert_eq!(std::fs::read_to_string(cfg.out_dir.join(f)).unwrap(), text, "{f} was touched");
        }
        assert!(!cfg.out_dir.join(REVISION_FILE).exists(), "the refused runner wrote its revision file");
        drop(holder);
    }
}

/// How many times a diverging run is retried, each time at half the learning rate.
pub const MAX_LR_HALVINGS: u32 = 2;

/// Removes a run's checkpoints, metrics and divergence marker (a fresh start).
fn clear_training(dir: &Path) -> Result<()> {
    for ckpt in train::list_checkpoints(dir)? {
        std::fs::remove_file(&ckpt).with_context(|| format!("removing {}", ckpt.display()))?;
    }
    for f in ["metrics.jsonl", train::DIVERGED_FILE, RANK_SUMMARY_FILE] {
        let _ = std::fs::remove_file(dir.join(f));
    }
    Ok(())
}

/// One run of `cfg` (seed `seed_index`): its result, loaded when one of this config and code
/// exists, else trained (or, should it diverge at every learning rate, the error); then the
/// evaluations of `needs` and the sink measurements of `sink_needs` it lacks.
#[allow(clippy::too_many_arguments)]
fn run_one(
    scale: &Scale,
    cfg: &TrainConfig,
    seed_index: usize,
    needs: &[EvalKey],
    sink_needs: &[SinkKey],
    spans: &[Vec<u16>],
    command: &str,
    launch: &Launch,
    stop: Option<StopFlag>,
) -> Result<RunResult> {
    let result_path = cfg.out_dir.join("result.json");
    let loaded = load_result(cfg, &result_path);
    let progress = std::sync::Arc::new(crate::progress::Training::start(
        &format!("{} seed {seed_index}", cfg.model.attention),
        cfg.max_steps,
    ));
    let result = match loaded {
        Some(r) => r,
        None => train_run(scale, cfg, seed_index, command, launch, &progress, &result_path, stop)?,
    };
    if result.error.is_some() {
        return Ok(result);
    }
    evaluate::evaluate(scale, cfg, result, needs, sink_needs, spans, &progress, &result_path, stop)
}

/// The result at `result_path` when it is of this format, config and code; a result of another
/// format, config (e.g. the scale was edited) or code is redone from scratch.
fn load_result(cfg: &TrainConfig, result_path: &Path) -> Option<RunResult> {
    let text = std::fs::read_to_string(result_path).ok()?;
    let r: Option<RunResult> = serde_json::from_str(&text).ok();
    if let Some(r) = r.as_ref().filter(|r| r.config == cfg.to_toml() && r.format_version == RESULT_VERSION)
        && r.numbers_revision != numbers_revision()
    {
        say(&format!(
            "{}: computed by other code (numbers revision {} at {}, this build {}): training again",
            cfg.out_dir.display(),
            r.numbers_revision,
            r.git_revision,
            numbers_revision()
        ));
    }
    let r = r.filter(|r| r.format_version == RESULT_VERSION && r.numbers_revision == numbers_revision());
    // Results written before retries existed have no `lr`: they were trained at the config's.
    r.filter(|r| r.config == cfg.to_toml()).map(|r| RunResult { lr: if r.lr > 0.0 { r.lr } else { cfg.lr }, ..r })
}

/// Trains `cfg` under its directory's lock and writes its result to `result_path`. A run that
/// diverges is retried from scratch at half, then a quarter of the learning rate; the result says
/// so. A variant that diverges at all three is a result too (its `error` says so; the report shows
/// it) and is not retried by later invocations. A training stopped by `stop` returns its
/// [`train::Preempted`] and writes no result.
#[allow(clippy::too_many_arguments)]
fn train_run(
    scale: &Scale,
    cfg: &TrainConfig,
    seed_index: usize,
    command: &str,
    launch: &Launch,
    progress: &std::sync::Arc<crate::progress::Training>,
    result_path: &Path,
    stop: Option<StopFlag>,
) -> Result<RunResult> {
    // One writer per run directory: taken before anything here is removed or written, held
    // through the training (whose own process or ranks see it held) and the result's write.
    let lock = std::sync::Arc::new(trainer::process::RunLock::acquire(&cfg.out_dir)?);
    prepare_run_dir(cfg, result_path)?;
    let start = Instant::now();
    let fresh = |lr: f64, final_train_loss: f64, tokens_per_s: f64, note: Option<String>| RunResult {
        format: RESULT_FORMAT.into(),
        format_version: RESULT_VERSION,
        scale: scale.name.into(),
        variant: cfg.model.attention.to_string(),
        seed_index,
        config: cfg.to_toml(),
        git_revision: trainer::git_revision(),
        numbers_revision: numbers_revision().into(),
        command: command.into(),
        train_wall_s: start.elapsed().as_secs_f64(),
        eval_wall_s: 0.0,
        tokens_per_s,
        final_train_loss,
        lr,
        note,
        evals: Vec::new(),
        sinks: Vec::new(),
        error: None,
    };
    let mut result = None;
    let mut diverged: Vec<String> = Vec::new();
    for attempt in 0..=MAX_LR_HALVINGS {
        let lr = cfg.lr / f64::from(1u32 << attempt);
        let attempt_cfg = TrainConfig { lr, ..cfg.clone() };
        if attempt > 0 {
            clear_training(&cfg.out_dir)?;
        }
        // Continue from the newest checkpoint if an earlier attempt was interrupted: one whose
        // bytes are whole (a damaged newest one is refused, naming the newest intact one).
        let resume = match train::list_checkpoints(&cfg.out_dir)?.is_empty() {
            true => None,
            false => Some(train::latest_checkpoint(&cfg.out_dir).context(
                "remove the damaged checkpoint and run the same command again: the run continues from the newest intact one",
            )?),
        };
        if resume.is_none() {
            let _ = std::fs::remove_file(cfg.out_dir.join("metrics.jsonl"));
        }
        match train_attempt(&attempt_cfg, resume, launch, command, progress, &lock, stop) {
            Ok((loss, tokens_per_s)) => {
                let note =
                    (!diverged.is_empty()).then(|| format!("diverged at {}; trained at lr {lr}", diverged.join(", ")));
                result = Some(fresh(lr, loss, tokens_per_s, note));
                break;
            }
            Err(e) => match std::fs::read_to_string(cfg.out_dir.join(train::DIVERGED_FILE)) {
                Ok(marker) => {
                    let step = serde_json::from_str::<serde_json::Value>(&marker)
                        .ok()
                        .and_then(|m| m["step"].as_u64())
                        .map_or_else(|| "?".to_string(), |s| s.to_string());
                    say(&format!("{}: {e:#}", cfg.model.attention));
                    diverged.push(format!("lr {lr} (step {step})"));
                }
                // Not a divergence (a crash, a full disk, a killed rank): stop; the next
                // invocation resumes from the last checkpoint.
                Err(_) => return Err(e),
            },
        }
    }
    let r = result.unwrap_or_else(|| RunResult {
        error: Some(format!("training diverged at {}", diverged.join(", "))),
        ..fresh(cfg.lr, f64::NAN, 0.0, None)
    });
    write_json(result_path, &r)?;
    Ok(r)
}

/// The reproduction stopped on a signal before it finished (see the module docs): nothing finished
/// is lost, and the same command continues. `reproduce` exits with
/// [`trainer::process::PREEMPTED_EXIT`].
#[derive(Debug)]
pub struct Stopped {
    /// The signal (`SIGTERM`, `SIGINT`, `SIGUSR1`).
    pub signal: String,
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "stopped by {}: the trainings in flight saved a checkpoint at their step, and every finished result is kept",
            self.signal
        )
    }
}

impl std::error::Error for Stopped {}

/// [`Stopped`] once `stop` is set: what a long loop calls before it starts the next piece of work
/// (a run, an evaluation, a post-training model).
pub fn check_stop(stop: Option<StopFlag>) -> Result<()> {
    match stop.and_then(|s| s.signal()) {
        Some(sig) => Err(Stopped { signal: trainer::process::signal_name(sig) }.into()),
        None => Ok(()),
    }
}

/// Whether `e` is a stop on a signal rather than a failure: [`Stopped`], a training's
/// [`train::Preempted`] or ranks' [`trainer::launch::LaunchError::Preempted`], anywhere in its chain.
pub fn is_stop(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.is::<Stopped>()
            || c.is::<train::Preempted>()
            || matches!(
                c.downcast_ref::<trainer::launch::LaunchError>(),
                Some(trainer::launch::LaunchError::Preempted { .. })
            )
    })
}

/// Readies `cfg`'s run directory (locked by the caller) for training: checkpoints of another config
/// (the scale was edited since) or of other code are not continued but cleared; the old result goes,
/// and the revision file names this build's code.
fn prepare_run_dir(cfg: &TrainConfig, result_path: &Path) -> Result<()> {
    let saved = std::fs::read_to_string(cfg.out_dir.join("config.toml")).ok();
    let revision = std::fs::read_to_string(cfg.out_dir.join(REVISION_FILE)).ok();
    // (A directory without the revision file predates it: its checkpoints are of unknown code.)
    if saved.as_ref().is_some_and(|s| *s != cfg.to_toml())
        || revision.as_ref().is_none_or(|r| r.trim() != numbers_revision())
    {
        if saved.is_some() || revision.is_some() {
            say(&format!(
                "{}: its config or code changed since the last attempt: training from scratch",
                cfg.out_dir.display()
            ));
        }
        clear_training(&cfg.out_dir)?;
    }
    let _ = std::fs::remove_file(result_path);
    std::fs::create_dir_all(&cfg.out_dir).with_context(|| format!("creating {}", cfg.out_dir.display()))?;
    std::fs::write(cfg.out_dir.join(REVISION_FILE), numbers_revision())
        .with_context(|| format!("writing {}", cfg.out_dir.join(REVISION_FILE).display()))?;
    Ok(())
}
