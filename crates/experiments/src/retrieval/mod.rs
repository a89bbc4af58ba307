//! The retrieval benchmark (the paper's later versions: "LSSAR achieves superior results on
//! challenging long-context retrieval tasks"): small models trained from scratch on synthetic
//! associative recall ([`task`]) at the scale's training length, then asked in prompts of 1x to 16x
//! it, for every row of `defs/retrieval/experiment.toml` (softmax, LSSA, LSSAR trained with `p = 15`,
//! LSSA with `p = 15` after training, and the two ablations of LSSA's ingredients, `lssa-exp` and
//! `softmax-logn`), several seeds each, under NTK-scaled and plain RoPE, in every task regime of
//! `defs/retrieval/regimes.toml` ([`Regime`]: where the needles and questions sit, and how dense the
//! distractors are, the same in training and in prompts).
//!
//! - Training: the project's GPT ([`gpt_model::Gpt`], fused attention) of [`Settings`]' size, AdamW
//!   with warm-up and a cosine decay, next-token loss on the answers only; seed `k` sets the initial
//!   weights and the training windows, and seed `k` of every row is paired with seed `k` of the others.
//! - Evaluation: the same prompts for every model of a regime ([`task::Layout::prompt`]). Each
//!   question is scored twice: *exact recall*, the answer is the argmax over the whole vocabulary (as
//!   MQAR and passkey retrieval score it; the headline score), and *key-conditional*, the answer
//!   scores highest among its key's 8 value tokens (chance 1 in 8). Every answer is kept, with its
//!   distance, so the report bins them (inside the training length or beyond it) and the verdicts pair
//!   rows on identical questions.
//! - Results: one JSON per (regime, trained variant, seed) under `runs/<scale>/retrieval/<regime>/`,
//!   reused only for the same settings and task revision; an interrupted run keeps the models it
//!   finished.
//! - The verdicts (`[[retrieval]]` in `defs/claims.toml`, fixed before the runs) and the report section
//!   are in [`report`].

pub mod recipe;
pub mod report;
pub mod task;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context as _, Result, ensure};
use serde::{Deserialize, Serialize};
use tch::{Device, Kind as DType, Tensor, nn};

use gpt_model::{AttnImpl, ForwardOptions, Init, ModelConfig};

use crate::post::{Figures, Inputs, PostTraining};
use crate::spec::{Experiment, Kind, Scope};

pub use recipe::Recipe;
pub use task::Placement;

/// The name `--only` accepts for the retrieval benchmark (its models are its own).
pub const ONLY: &str = "retrieval";

const REGIMES: &str = include_str!("../../defs/retrieval/regimes.toml");

/// A named task regime (`defs/retrieval/regimes.toml`): where the needles and questions sit and how
/// dense the distractors are, in training windows and prompts alike. [`cells`] crosses it with its
/// initialisations (the recipe axis): each cell is a `Regime` of one initialisation, named after it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Regime {
    /// Stable name (`spread-25`), also its results' directory; a cell of another initialisation than
    /// GPT-2's is `<regime>@<init>` (`spread-0@torch-default`).
    pub name: String,
    /// Where the needles and the questions sit.
    pub placement: Placement,
    /// Share of background positions that are distractors, per mille.
    pub distractors_permille: u32,
    /// Whether the default reproduction runs the ablation rows here (`--all` runs them everywhere).
    #[serde(default)]
    pub ablations: bool,
    /// Whether only `reproduce --all` runs this regime (the default runs the others).
    #[serde(default)]
    pub all_only: bool,
    /// What it is and why it is in the grid, for the report.
    pub about: String,
    /// The initialisations its models are trained with, each a cell of its own ([`cells`]; the
    /// recipe axis of issue 61): `["gpt2"]` unless the file says otherwise.
    #[serde(default = "gpt2_only")]
    pub inits: Vec<Init>,
}

fn gpt2_only() -> Vec<Init> {
    vec![Init::Gpt2]
}

impl Regime {
    /// The cell's initialisation (a regime read from the file: its first).
    pub fn init(&self) -> Init {
        self.inits.first().copied().unwrap_or_default()
    }
}

/// Every (regime, initialisation) cell, in report order: each regime of [`regimes`] with GPT-2's
/// initialisation under its own name, then its other initialisations as `<regime>@<init>`, which run
/// no ablation rows (those read the regimes' GPT-2 cells only).
pub fn cells() -> Result<Vec<Regime>> {
    let mut out = Vec::new();
    for r in regimes()? {
        for &init in &r.inits {
            out.push(match init {
                Init::Gpt2 => Regime { inits: vec![init], ..r.clone() },
                other => Regime {
                    name: format!("{}@{other}", r.name),
                    ablations: false,
                    about: format!(
                        "As `{}`, with every linear layer of the models initialised as PyTorch's `nn.Linear` does (`model.init = \"{other}\"`) instead of GPT-2's: the recipe axis.",
                        r.name
                    ),
                    inits: vec![init],
                    ..r.clone()
                },
            });
        }
    }
    Ok(out)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegimeFile {
    regime: Vec<Regime>,
}

/// Every regime, in report order, checked (names unique and usable as directory names, densities
/// within 0-1000).
pub fn regimes() -> Result<Vec<Regime>> {
    let f: RegimeFile = toml::from_str(REGIMES).context("defs/retrieval/regimes.toml")?;
    for (i, r) in f.regime.iter().enumerate() {
        ensure!(
            !r.name.is_empty() && r.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "regime `{}`: a name of letters, digits and '-'",
            r.name
        );
        ensure!(f.regime[..i].iter().all(|o| o.name != r.name), "regime `{}` is defined twice", r.name);
        ensure!(r.distractors_permille <= 1000, "regime `{}`: {} per mille", r.name, r.distractors_permille);
        ensure!(
            r.inits.first() == Some(&Init::Gpt2) && (1..r.inits.len()).all(|j| !r.inits[..j].contains(&r.inits[j])),
            "regime `{}`: `inits` must start with \"gpt2\" and name each initialisation once",
            r.name
        );
    }
    ensure!(!f.regime.is_empty(), "defs/retrieval/regimes.toml defines no regime");
    Ok(f.regime)
}

/// Sizes of the benchmark at one scale; see [`Settings::for_scale`] and docs/PILOT.md.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Filler ids (the vocabulary is these, the keys' values and the keys' questions).
    pub filler: u32,
    /// Keys.
    pub keys: usize,
    /// Values per key (chance is one in this many).
    pub values: usize,
    /// Keys asked per sequence (8 questions per prompt).
    pub asked: usize,
    /// Share of background positions that are distractors (needles of keys not asked), per mille.
    pub density_permille: u32,
    /// Where the needles and the questions sit.
    pub placement: Placement,
    /// Training length.
    pub t_train: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Training windows per step.
    pub batch: usize,
    /// Peak learning rate (linear warm-up, cosine to a tenth).
    pub lr: f64,
    /// Initialisation and optimiser.
    pub recipe: Recipe,
    /// Warm-up steps.
    pub warmup: usize,
    /// Seeds per trained row.
    pub seeds: usize,
    /// Seed of seed index 0 (the others follow), for weights and training windows.
    pub seed: u64,
    /// Seed of the evaluation prompts (the same for every model).
    pub prompt_seed: u64,
    /// Evaluation prompts per length, 8 questions each.
    pub prompts: usize,
    /// Prompt lengths, multiples of the training length.
    pub multiples: Vec<usize>,
    /// Accuracy at 1x every seed of a row must reach for the row to be judged.
    pub gate: f64,
}

impl Settings {
    /// `smoke`: a few steps and prompts (the test suite). Every other scale: the sizes the pilots of
    /// docs/PILOT.md chose (each row >= 95% at 1x; 4 seeds by issue 61's power calculation, about 40
    /// minutes for the default's 48 models), the same at every scale: a test of the attention, not
    /// of the language model. Seeds from 5200: not the pilots' (9300 up) nor the 5100 read before.
    pub fn for_scale(scale: &str) -> Self {
        let base = Settings {
            n_layer: 2,
            n_head: 2,
            d_model: 128,
            filler: 64,
            keys: 32,
            values: 8,
            asked: 8,
            density_permille: 250,
            placement: Placement::Spread,
            t_train: 64,
            steps: 1000,
            batch: 32,
            lr: 1e-3,
            recipe: Recipe::language_models(Init::Gpt2),
            warmup: 50,
            seeds: 4,
            seed: 5200,
            prompt_seed: 0x005E_C411,
            prompts: 128,
            multiples: vec![1, 2, 4, 8, 16],
            gate: 0.95,
        };
        match scale {
            "smoke" => Settings {
                n_layer: 1,
                d_model: 64,
                n_head: 1,
                steps: 12,
                batch: 4,
                warmup: 2,
                seeds: 2,
                prompts: 4,
                multiples: vec![1, 2, 4],
                ..base
            },
            _ => base,
        }
    }

    /// The scale's settings in task cell `r` (a regime and its initialisation, [`cells`]).
    pub fn for_regime(scale: &str, r: &Regime) -> Self {
        let base = Self::for_scale(scale);
        Settings {
            placement: r.placement,
            density_permille: r.distractors_permille,
            recipe: Recipe { init: r.init(), ..base.recipe },
            ..base
        }
    }

    /// The task's layout.
    pub fn layout(&self) -> Result<task::Layout> {
        task::Layout::new(
            self.filler,
            self.keys,
            self.values,
            self.asked,
            self.density_permille,
            self.t_train,
            self.placement,
        )
    }

    /// The model of trained variant `variant`.
    pub fn model(&self, variant: &crate::spec::TrainedVariant) -> Result<ModelConfig> {
        let cfg = ModelConfig {
            n_layer: self.n_layer,
            n_head: self.n_head,
            d_model: self.d_model,
            vocab_size: self.layout()?.vocab(),
            context_len: self.t_train,
            attention: variant.variant().clone(),
            attn_impl: AttnImpl::Fused,
            init: self.recipe.init,
            ..ModelConfig::preset("tiny")?
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// One model's answers under one evaluation (RoPE treatment, post-hoc power) at one prompt length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Answers {
    /// NTK-scaled RoPE (`false`: plain; at 1x the two are the same model and only `true` is kept).
    pub ntk: bool,
    /// Post-hoc re-weighting power.
    pub posthoc: Option<u32>,
    /// Prompt length, a multiple of the training length.
    pub multiple: usize,
    /// Per question, in the prompts' order: whether its answer scored highest among its key's values
    /// (key-conditional).
    pub correct: Vec<bool>,
    /// Per question: whether its answer scored highest over the whole vocabulary (exact recall).
    pub exact: Vec<bool>,
    /// Per question: tokens from its needle to the question.
    pub distance: Vec<u32>,
}

/// One trained model (a seed of a trained variant) and its answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedRun {
    /// The trained variant.
    pub variant: String,
    /// Seed index (paired across variants).
    pub seed_index: usize,
    /// The recipe it was trained with.
    pub recipe: Recipe,
    /// Mean training loss (nats, answers only) over the last tenth of the steps.
    pub train_loss: f64,
    /// Training seconds.
    pub train_s: f64,
    /// Evaluation seconds.
    pub eval_s: f64,
    /// Every evaluation.
    pub answers: Vec<Answers>,
}

impl SeedRun {
    /// The answers of one evaluation, if it ran.
    pub fn get(&self, ntk: bool, posthoc: Option<u32>, multiple: usize) -> Option<&Answers> {
        let ntk = ntk || multiple == 1;
        self.answers.iter().find(|a| a.ntk == ntk && a.posthoc == posthoc && a.multiple == multiple)
    }
}

/// What a cached result must match to be reused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Cached {
    provenance: String,
    settings: Settings,
    powers: Vec<Option<u32>>,
    run: SeedRun,
}

/// What a training reads at every step boundary: the stop flag a signal sets, and where it then
/// saves its state ([`recipe::Partial`]), which the next call with the same file continues.
pub struct Stopping<'a> {
    /// Set by `reproduce`'s stop handlers (SIGTERM, SIGINT, SIGUSR1).
    pub flag: trainer::process::StopFlag,
    /// Where the state goes, and what it must match to be continued.
    pub partial: &'a recipe::Partial,
    /// Stop at this step as if signalled there (a deadline known in advance; the tests' way to stop
    /// at a chosen step).
    pub at_step: Option<usize>,
}

/// Trains seed `seed_index` of `variant` and evaluates it with each post-hoc power of `powers`
/// (`None`: as trained) under both RoPE treatments. With `stopping`, a training stopped by a signal
/// saves its state there and returns [`trainer::train::Preempted`]; a saved state is continued, and
/// the model ends with the weights an uninterrupted training would have.
pub fn train_and_evaluate(
    s: &Settings,
    variant: &crate::spec::TrainedVariant,
    seed_index: usize,
    powers: &[Option<u32>],
    stopping: Option<&Stopping<'_>>,
) -> Result<SeedRun> {
    let device = Device::cuda_if_available();
    let layout = s.layout()?;
    let cfg = s.model(variant)?;
    let seed = s.seed + seed_index as u64;
    let start = Instant::now();
    let mut vs = nn::VarStore::new(device);
    let model = gpt_model::Gpt::new_seeded(&vs.root(), &cfg, seed as i64)?;
    let mut opt = s.recipe.optimiser(&vs);
    let mut done = match stopping {
        Some(st) => st.partial.load(&mut vs, &cfg, &mut opt)?.unwrap_or_default(),
        None => recipe::Progress::default(),
    };
    let vocab = cfg.vocab_size as i64;
    for step in done.step..s.steps {
        if let Some(st) = stopping {
            let signal = match st.flag.signal() {
                Some(sig) => Some(trainer::process::signal_name(sig)),
                None => (st.at_step == Some(step)).then(|| format!("its deadline at step {step}")),
            };
            if let Some(signal) = signal {
                done.step = step;
                done.train_s += start.elapsed().as_secs_f64();
                st.partial.save(&vs, &cfg, &opt, &done)?;
                return Err(
                    trainer::train::Preempted { step, signal, checkpoint: Some(st.partial.path.clone()) }.into()
                );
            }
        }
        let (mut ids, mut at, mut targets) = (Vec::new(), Vec::new(), Vec::new());
        for b in 0..s.batch {
            let seq = layout.training(seed, (step * s.batch + b) as u64);
            for q in &seq.queries {
                at.push((b * s.t_train + q.at) as i64);
                targets.push(i64::from(seq.tokens[q.at + 1]));
            }
            ids.extend(seq.tokens.iter().map(|&t| i64::from(t)));
        }
        let x = Tensor::from_slice(&ids).view([s.batch as i64, s.t_train as i64]).to(device);
        let logits = model.forward(&x, &ForwardOptions::default())?;
        let picked = logits
            .view([-1, logits.size()[2]])
            .index_select(0, &Tensor::from_slice(&at).to(device))
            .narrow(1, 0, vocab)
            .to_kind(DType::Float);
        let loss = picked.cross_entropy_for_logits(&Tensor::from_slice(&targets).to(device));
        opt.zero_grad().map_err(anyhow::Error::msg)?;
        loss.backward();
        opt.clip_grad_norm(s.recipe.grad_clip).map_err(anyhow::Error::msg)?;
        opt.step(trainer::optim::lr_at(step, s.steps, s.warmup, s.lr, 0.1)).map_err(anyhow::Error::msg)?;
        let l = loss.double_value(&[]);
        ensure!(l.is_finite(), "retrieval model `{variant}` seed {seed_index} diverged at step {step}");
        if step >= s.steps - s.steps.div_ceil(10) {
            done.tail.push(l);
        }
    }
    let train_s = done.train_s + start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut answers = Vec::new();
    for &posthoc in powers {
        for &m in &s.multiples {
            for ntk in if m == 1 { vec![true] } else { vec![true, false] } {
                let opts = ForwardOptions { length_scale: Some(m as f64), ntk, reweight: posthoc, attn_impl: None };
                answers.push(evaluate(&model, &layout, s, m, &opts, device)?);
            }
        }
    }
    Ok(SeedRun {
        variant: variant.to_string(),
        seed_index,
        recipe: s.recipe,
        train_loss: done.tail.iter().sum::<f64>() / done.tail.len().max(1) as f64,
        train_s,
        eval_s: start.elapsed().as_secs_f64(),
        answers,
    })
}

/// The answers of `model` to every prompt of `multiple` training lengths.
fn evaluate(
    model: &gpt_model::Gpt,
    layout: &task::Layout,
    s: &Settings,
    multiple: usize,
    opts: &ForwardOptions,
    device: Device,
) -> Result<Answers> {
    let len = multiple * s.t_train;
    let prompts: Vec<task::Sequence> =
        (0..s.prompts as u64).map(|i| layout.prompt(s.prompt_seed, multiple, i)).collect::<Result<_>>()?;
    let (mut correct, mut exact, mut distance) = (Vec::new(), Vec::new(), Vec::new());
    // Batches of about 16K tokens.
    for chunk in prompts.chunks((16_384 / len).max(1)) {
        let ids: Vec<i64> = chunk.iter().flat_map(|p| p.tokens.iter().map(|&t| i64::from(t))).collect();
        let x = Tensor::from_slice(&ids).view([chunk.len() as i64, len as i64]).to(device);
        let logits = tch::no_grad(|| model.forward(&x, opts))?;
        let flat = logits.view([-1, logits.size()[2]]);
        let (mut rows, mut cands) = (Vec::new(), Vec::new());
        for (b, p) in chunk.iter().enumerate() {
            for q in &p.queries {
                rows.push((b * len + q.at) as i64);
                cands.extend(layout.candidates(q.key).iter().map(|&c| i64::from(c)));
            }
        }
        let n = rows.len() as i64;
        let picked = flat.index_select(0, &Tensor::from_slice(&rows).to(device)).narrow(1, 0, layout.vocab() as i64);
        let scores = picked.gather(1, &Tensor::from_slice(&cands).view([n, -1]).to(device), false);
        let best = Vec::<i64>::try_from(scores.argmax(-1, false).to_device(Device::Cpu))?;
        let top = Vec::<i64>::try_from(picked.argmax(-1, false).to_device(Device::Cpu))?;
        let queries = chunk.iter().flat_map(|p| &p.queries);
        for ((q, &b), &t) in queries.zip(&best).zip(&top) {
            correct.push(b == q.answer as i64);
            exact.push(t == i64::from(layout.needle(q.key, q.answer)));
            distance.push(q.distance as u32);
        }
    }
    Ok(Answers { ntk: opts.ntk || multiple == 1, posthoc: opts.reweight, multiple, correct, exact, distance })
}

/// What one regime trains: its settings, and each trained variant with the post-hoc powers it is
/// evaluated with.
#[derive(Clone, Debug, PartialEq)]
pub struct RegimePlan {
    /// The regime.
    pub regime: Regime,
    /// Its settings ([`Settings::for_regime`]).
    pub settings: Settings,
    /// Trained variant -> post-hoc powers (`None`: as trained), ascending.
    pub rows: BTreeMap<crate::spec::TrainedVariant, Vec<Option<u32>>>,
}

/// One regime's results.
#[derive(Clone, Debug, PartialEq)]
pub struct RegimeRuns {
    /// The regime.
    pub regime: Regime,
    /// The settings its models were trained with.
    pub settings: Settings,
    /// Every model's answers by trained variant, seeds in order.
    pub runs: BTreeMap<String, Vec<SeedRun>>,
}

/// Trains and evaluates every seed of every trained variant of every regime of `plans` on `jobs`
/// threads, reusing cached results under `dir/<regime>/`; returns them per regime, in `plans`' order.
///
/// Once `stop` is set (`reproduce`'s signal handlers) no new model starts, and the models in training
/// save their state at their next step ([`recipe::Partial`], beside their results) and end with
/// [`trainer::train::Preempted`] (else [`crate::runner::Stopped`]); the next call continues them.
pub fn run(
    plans: &[RegimePlan],
    dir: &Path,
    jobs: usize,
    stop: Option<trainer::process::StopFlag>,
) -> Result<Vec<RegimeRuns>> {
    let provenance = crate::runner::task_revision();
    let path = |i: usize, v: &str, k: usize| -> PathBuf {
        dir.join(&plans[i].regime.name).join(format!("{}_seed{k}.json", crate::runner::run_dir_name(v)))
    };
    let mut done: BTreeMap<(usize, String, usize), SeedRun> = BTreeMap::new();
    let mut todo = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let d = dir.join(&plan.regime.name);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        for (v, powers) in &plan.rows {
            for k in 0..plan.settings.seeds {
                let cached = std::fs::read_to_string(path(i, v, k))
                    .ok()
                    .and_then(|t| serde_json::from_str::<Cached>(&t).ok())
                    .filter(|c| c.provenance == provenance && c.settings == plan.settings && &c.powers == powers);
                match cached {
                    Some(c) => {
                        done.insert((i, v.to_string(), k), c.run);
                    }
                    None => todo.push((i, v.clone(), k, powers.clone())),
                }
            }
        }
    }
    // Seeds first by index, so an interrupted run has every regime's and row's first seeds.
    todo.sort_by_key(|(i, v, k, _)| (*k, *i, v.clone()));
    if !todo.is_empty() {
        crate::progress::say(&format!(
            "retrieval: {} models to train in {} regimes ({} cached) on {jobs} threads",
            todo.len(),
            plans.len(),
            done.len()
        ));
    }
    let work = crate::progress::Work::start("retrieval models", todo.len(), "models");
    // These models are small: on the CPU each job runs on its share of the cores rather than on all
    // of them (libtorch's default), which oversubscribes them: models of the pilot of docs/PILOT.md,
    // two one-thread processes side by side on 2 cores, took 80-95 s each, against about 115 s two at
    // a time at the default count in the last reproduction. The process's count is put back after.
    let _threads = (!tch::Cuda::is_available() && jobs > 1).then(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        ThreadShare::set((cores / jobs).max(1))
    });
    let queue = Mutex::new(todo.into_iter());
    let finished = Mutex::new(Vec::new());
    let failed: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs.max(1) {
            scope.spawn(|| {
                loop {
                    if failed.lock().expect("no panic holds it").is_some() {
                        return;
                    }
                    if let Err(e) = crate::runner::check_stop(stop) {
                        failed.lock().expect("no panic holds it").get_or_insert(e);
                        return;
                    }
                    let Some((i, v, k, powers)) = queue.lock().expect("no panic holds it").next() else { return };
                    let (regime, settings) = (&plans[i].regime.name, &plans[i].settings);
                    let partial = recipe::Partial {
                        path: recipe::Partial::path_in(&dir.join(regime), &v, k),
                        provenance: format!("{provenance} {}", serde_json::to_string(settings).expect("serialisable")),
                    };
                    let stopping = stop.map(|flag| Stopping { flag, partial: &partial, at_step: None });
                    let outcome = train_and_evaluate(settings, &v, k, &powers, stopping.as_ref())
                        .with_context(|| format!("retrieval model `{v}` seed {k} in regime {regime}"))
                        .and_then(|r| {
                            let c = Cached { provenance: provenance.clone(), settings: settings.clone(), powers, run: r };
                            let text = serde_json::to_string(&c)?;
                            trainer::data::io::write_atomic(&path(i, &v, k), |w| w.write_all(text.as_bytes()))?;
                            partial.remove();
                            Ok(c.run)
                        });
                    match outcome {
                        Ok(r) => {
                            let at_1x = |a: &Answers, exact: bool| {
                                100.0 * report::share(if exact { &a.exact } else { &a.correct })
                            };
                            let one = r.get(true, None, 1);
                            crate::progress::say(&format!(
                                "retrieval {regime} `{v}` seed {k}: answer loss {:.3}, 1x exact recall {:.1}% (key-conditional {:.1}%) ({:.0} s + {:.0} s)",
                                r.train_loss,
                                one.map_or(f64::NAN, |a| at_1x(a, true)),
                                one.map_or(f64::NAN, |a| at_1x(a, false)),
                                r.train_s,
                                r.eval_s
                            ));
                            work.inc();
                            finished.lock().expect("no panic holds it").push((i, r));
                        }
                        Err(e) => {
                            failed.lock().expect("no panic holds it").get_or_insert(e);
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().expect("no panic holds it") {
        return Err(e);
    }
    for (i, r) in finished.into_inner().expect("no panic holds it") {
        done.insert((i, r.variant.clone(), r.seed_index), r);
    }
    let mut out: Vec<RegimeRuns> = plans
        .iter()
        .map(|p| RegimeRuns { regime: p.regime.clone(), settings: p.settings.clone(), runs: BTreeMap::new() })
        .collect();
    for ((i, v, _), r) in done {
        out[i].runs.entry(v).or_default().push(r);
    }
    Ok(out)
}

/// libtorch's thread count set for a while, and put back when dropped.
struct ThreadShare(i32);

impl ThreadShare {
    fn set(threads: usize) -> ThreadShare {
        let before = tch::get_num_threads();
        tch::set_num_threads(i32::try_from(threads).unwrap_or(1));
        ThreadShare(before)
    }
}

impl Drop for ThreadShare {
    fn drop(&mut self) {
        tch::set_num_threads(self.0);
    }
}

/// Each task cell's plan for experiment `e` at `scale`: the rows' trained variants with their post-hoc
/// powers; the regimes marked `all_only` and the ablation rows (but where the regime asks for them)
/// only when `e` is run whole ([`Scope::All`]).
pub fn plans(e: &Experiment, scale: &str) -> Result<Vec<RegimePlan>> {
    Ok(cells()?
        .into_iter()
        .filter(|regime| !regime.all_only || e.scope == Scope::All)
        .map(|regime| {
            let mut rows: BTreeMap<crate::spec::TrainedVariant, Vec<Option<u32>>> = BTreeMap::new();
            let ablations = regime.init() == Init::Gpt2 && (regime.ablations || e.scope == Scope::All);
            for r in e.rows.iter().filter(|r| !r.ablation || ablations) {
                let powers = rows.entry(r.train.clone()).or_default();
                if !powers.contains(&r.posthoc) {
                    powers.push(r.posthoc);
                    powers.sort();
                }
            }
            RegimePlan { settings: Settings::for_regime(scale, &regime), regime, rows }
        })
        .collect())
}

/// The retrieval benchmark as a [`PostTraining`] kind.
#[derive(Debug, Default)]
pub struct Experiments {
    /// Every regime's settings and models' answers (empty until run).
    pub results: Option<Vec<RegimeRuns>>,
}

impl PostTraining for Experiments {
    fn kind(&self) -> Kind {
        Kind::Retrieval
    }

    fn only_name(&self) -> Option<&'static str> {
        Some(ONLY)
    }

    fn needs_trained_rows(&self) -> bool {
        false
    }

    fn run(&mut self, e: &Experiment, inputs: &Inputs<'_>) -> Result<()> {
        let plans = plans(e, inputs.scale.name)?;
        let jobs = crate::runner::small_model_jobs(tch::Cuda::is_available());
        let results =
            run(&plans, &inputs.out.join("retrieval"), jobs, inputs.stop).context("the retrieval benchmark")?;
        self.results = Some(results);
        Ok(())
    }

    fn wall_s(&self) -> f64 {
        self.results.iter().flatten().flat_map(|g| g.runs.values().flatten()).map(|r| r.train_s + r.eval_s).sum()
    }

    fn verdicts(&self) -> Vec<String> {
        let groups = self.results.as_deref().unwrap_or_default();
        match self.results.as_deref().map(report::verdicts) {
            Some(Ok(judged)) => {
                judged.iter().map(report::Judged::line).chain(report::passkey_line(groups, &judged)).collect()
            }
            Some(Err(e)) => vec![format!("the retrieval claims could not be read: {e:#}")],
            None => Vec::new(),
        }
    }

    fn counted(&self) -> Vec<crate::family::Counted> {
        let judged = self.results.as_deref().map(report::verdicts).and_then(Result::ok).unwrap_or_default();
        judged.iter().flat_map(report::Judged::counted).collect()
    }

    fn section(&self, e: &Experiment, figures: Figures<'_>) -> Result<Vec<crate::doc::Block>> {
        report::section(e, self.results.as_deref(), figures)
    }
}

#[cfg(test)]
mod tests;
