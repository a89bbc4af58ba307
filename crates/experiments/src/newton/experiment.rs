//! The physics experiment (SPEC section 9): a small transformer learns to predict the next positions
//! of simulated two-body orbits; the forces implied by its predictions are read back and fitted with a
//! power law, once per attention variant and seed (the paper: the LSSAR model recovers
//! `F ~ m1 m2 / r^2`, the softmax model does not).
//!
//! Set-up (choices, since the paper gives no details):
//!
//! - Data: random bound two-body systems ([`super::sim::random_two_body`], `G = 1`), sampled every
//!   `dt`. The masses are **not** an input: the model must infer them from the history, which is what
//!   its attention is for. Training sequences have `seq_len` steps; held-out sequences have
//!   `eval_multiple` times as many, so the forces are read where the model attends further back than
//!   in training.
//! - Input per step: both positions and their change since the previous step (zero at the first).
//!   Positions enter attention through RoPE (NTK-scaled beyond the training length), as in the
//!   language models, so a sequence longer than any in training is well defined.
//! - Objective: the next positions, `x_{t+1} = x_t + dt · y_t` (the model outputs the step), mean
//!   squared error in units of `dt^2` over every step but the first. Nothing in the objective
//!   singles out the acceleration.
//! - Readout, by finite differences of the predicted positions: the implied acceleration of body `i`
//!   at step `t` is `(x̂_{t+1} - 2 x_t + x_{t-1}) / dt^2`, its force `m_i |a|` with the true masses.
//! - Error floor: the root mean squared error of the implied accelerations beyond the training length;
//!   only samples whose true acceleration exceeds [`Settings::floor_factor`] times it enter the fit, so
//!   forces the model cannot resolve do not dominate it.
//! - Fit: `ln F = ln c + a ln m1 + b ln m2 + k ln r` by least squares over the samples beyond the
//!   training length, per seed; intervals from a bootstrap over orbits and seeds ([`super::fit`]); the
//!   grid search of [`super::regress::search`] names the best law of its grammar (first seed).

use std::path::Path;

use anyhow::{Context, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor, nn, nn::Module, nn::OptimizerConfig};

use attn_core::Variant;
use gpt_model::AttnImpl;

use super::fit::{self, SeedOrbits};
use super::regress::{self, Normal, Sample};
use super::sim;
use crate::stats::{Interval, Verdict};

/// Sizes of one physics run; see [`Settings::for_scale`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Orbits to train on.
    pub train_orbits: usize,
    /// Held-out orbits the forces are read from.
    pub test_orbits: usize,
    /// Steps per training sequence (the training length).
    pub seq_len: usize,
    /// Held-out sequences are this many times longer.
    pub eval_multiple: usize,
    /// Time between steps.
    pub dt: f64,
    /// Width of the residual stream.
    pub d_model: i64,
    /// Attention heads (head dimension `d_model / n_head`, even for RoPE).
    pub n_head: i64,
    /// Transformer blocks.
    pub n_layer: i64,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Adam learning rate (cosine decay to a tenth).
    pub lr: f64,
    /// Models per variant (seeds of the initial weights and batch order; the orbits are shared).
    pub seeds: usize,
    /// Samples enter the fit when their true acceleration exceeds this many times the error floor.
    pub floor_factor: f64,
    /// Seed of the orbits and of the first model.
    pub seed: u64,
}

impl Settings {
    /// The settings of a reproduction scale: `smoke` (seconds, in the test suite), `small` (a few
    /// minutes per variant and seed on two CPU cores), `gpu` and `paper` (larger model, more orbits).
    pub fn for_scale(scale: &str) -> Self {
        let base = Settings {
            train_orbits: 2000,
            test_orbits: 100,
            seq_len: 64,
            eval_multiple: 4,
            dt: 0.05,
            d_model: 128,
            n_head: 2,
            n_layer: 2,
            steps: 1500,
            batch: 32,
            lr: 2e-3,
            seeds: 3,
            floor_factor: 2.0,
            seed: 2026,
        };
        match scale {
            "smoke" => Settings {
                train_orbits: 64,
                test_orbits: 8,
                seq_len: 24,
                eval_multiple: 2,
                d_model: 64,
                n_head: 1,
                n_layer: 1,
                steps: 20,
                batch: 8,
                seeds: 2,
                ..base
            },
            "gpu" | "paper" => Settings {
                train_orbits: 20000,
                test_orbits: 400,
                d_model: 256,
                n_head: 4,
                n_layer: 4,
                steps: 10000,
                ..base
            },
            _ => base,
        }
    }
}

/// One seed's model: its errors and the data of its fit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedResult {
    /// Seed index (the model's seed is the settings' plus it).
    pub seed_index: usize,
    /// Training loss (next-position squared error in units of `dt^2`) over the last tenth of the steps.
    pub final_train_loss: f64,
    /// Root mean squared error of the implied accelerations over that of the exact ones, within the
    /// training length (steps `T/4..T` of the held-out orbits).
    pub accel_rel_rmse_within: f64,
    /// The same beyond the training length (steps `T..eval_multiple T`).
    pub accel_rel_rmse_beyond: f64,
    /// The error floor beyond the training length (root mean squared acceleration error).
    pub floor: f64,
    /// Samples above the floor (of all samples beyond the training length).
    pub kept: usize,
    /// All samples beyond the training length.
    pub samples: usize,
    /// Per held-out orbit, the normal equations of its samples above the floor.
    pub orbits: SeedOrbits,
    /// The best law of the grammar ([`regress::search`]) on this seed's samples above the floor, as
    /// text; `-` with fewer than 5 samples.
    pub best_law: String,
    /// Training and evaluation time, seconds.
    pub wall_s: f64,
}

/// What one variant's physics runs found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhysicsResult {
    /// The attention variant.
    pub variant: String,
    /// The settings it ran with (a cached result is reused only for the same settings).
    pub settings: Settings,
    /// The code that computed it ([`crate::runner::task_revision`]; a cached result is reused only
    /// from the same code).
    pub revision: String,
    /// One entry per seed.
    pub seeds: Vec<SeedResult>,
    /// Median of implied force / Newton force in bins of distance, first seed, beyond the training
    /// length: `(r, ratio)`.
    pub ratio_by_r: Vec<(f64, f64)>,
}

impl PhysicsResult {
    /// The exponents `(a, b, k)` with intervals over orbits and seeds, if every seed can be fitted.
    pub fn exponents(&self) -> Option<[Interval; 3]> {
        let seeds: Vec<SeedOrbits> = self.seeds.iter().map(|s| s.orbits.clone()).collect();
        fit::exponents(&[(1.0, &seeds)], 0x4e45_5754)
    }

    /// Whether the variant's law is Newton's ([`fit::is_newton`]); inconclusive without a fit.
    pub fn newton(&self) -> Verdict {
        self.exponents().map_or(Verdict::Inconclusive, |e| fit::is_newton(&e))
    }

    /// Seed `i`'s exponents alone, with intervals from the bootstrap over orbits; `None` when that
    /// seed cannot be fitted. The orbit draws are those of [`Self::exponents`].
    pub fn seed_exponents(&self, i: usize) -> Option<[Interval; 3]> {
        let one = [self.seeds.get(i)?.orbits.clone()];
        fit::exponents(&[(1.0, &one)], 0x4e45_5754)
    }

    /// Total time, seconds.
    pub fn wall_s(&self) -> f64 {
        self.seeds.iter().map(|s| s.wall_s).sum()
    }
}

struct Orbits {
    /// `(n, len + 1, 4)` positions `x1, y1, x2, y2`.
    pos: Vec<f32>,
    /// `(n, len + 1, 4)` exact accelerations.
    acc: Vec<f64>,
    masses: Vec<[f64; 2]>,
    n: usize,
    len: usize,
}

fn orbits(n: usize, len: usize, dt: f64, rng: &mut ChaCha8Rng) -> Orbits {
    let mut pos = Vec::with_capacity(n * (len + 1) * 4);
    let mut acc = Vec::with_capacity(n * (len + 1) * 4);
    let mut masses = Vec::with_capacity(n);
    for _ in 0..n {
        let mut system = sim::random_two_body(rng, 1.0);
        masses.push([system.bodies[0].mass, system.bodies[1].mass]);
        let traj = sim::simulate(&mut system, dt, len + 1, 20);
        for (step, a) in traj.pos.iter().zip(&traj.acc) {
            for (body, ab) in step.iter().zip(a) {
                pos.extend([body[0] as f32, body[1] as f32]);
                acc.extend([ab[0], ab[1]]);
            }
        }
    }
    Orbits { pos, acc, masses, n, len }
}

/// The model: input projection, pre-norm blocks with the chosen attention and RoPE, output head.
struct OrbitModel {
    inp: nn::Linear,
    blocks: Vec<(nn::LayerNorm, nn::Linear, nn::Linear, nn::LayerNorm, nn::Linear, nn::Linear)>,
    ln_f: nn::LayerNorm,
    out: nn::Linear,
    n_head: i64,
    attention: gpt_model::attention::Attention,
}

/// RoPE's base (as the language models').
const ROPE_BASE: f64 = 10_000.0;

impl OrbitModel {
    fn new(vs: &nn::Path<'_>, s: &Settings, variant: Variant) -> Result<Self> {
        let attention = gpt_model::attention::Attention::new(variant, AttnImpl::Fused)?;
        let d = s.d_model;
        let ln = |p: nn::Path<'_>| nn::layer_norm(p, vec![d], Default::default());
        let blocks = (0..s.n_layer)
            .map(|i| {
                let b = vs / format!("h{i}");
                (
                    ln(&b / "ln1"),
                    nn::linear(&b / "qkv", d, 3 * d, Default::default()),
                    nn::linear(&b / "proj", d, d, Default::default()),
                    ln(&b / "ln2"),
                    nn::linear(&b / "fc", d, 4 * d, Default::default()),
                    nn::linear(&b / "fc2", 4 * d, d, Default::default()),
                )
            })
            .collect();
        Ok(OrbitModel {
            inp: nn::linear(vs / "inp", 8, d, Default::default()),
            blocks,
            ln_f: ln(vs / "ln_f"),
            out: nn::linear(vs / "out", d, 4, Default::default()),
            n_head: s.n_head,
            attention,
        })
    }

    /// `(B, T, 8)` features to `(B, T, 4)` steps (next position minus this one, over `dt`), with
    /// RoPE NTK-scaled for sequences `length_scale` times the training length.
    fn forward(&self, x: &Tensor, length_scale: f64) -> Result<Tensor> {
        let (b, t, _) = x.size3()?;
        let mut h = self.inp.forward(x);
        let d = h.size()[2];
        let hd = d / self.n_head;
        let base = if length_scale > 1.0 {
            attn_core::rope::ntk_rope_base(ROPE_BASE, hd as usize, length_scale)
        } else {
            ROPE_BASE
        };
        let inv_freq = Tensor::from_slice(&attn_core::rope::rope_inv_freq(base, hd as usize)?).to_device(x.device());
        let angles = Tensor::arange(t, (Kind::Double, x.device())).unsqueeze(1) * inv_freq.unsqueeze(0);
        let (cos, sin) = (angles.cos().to_kind(h.kind()), angles.sin().to_kind(h.kind()));
        for (ln1, qkv, proj, ln2, fc, fc2) in &self.blocks {
            let y = qkv.forward(&ln1.forward(&h));
            let split = |i: i64| y.narrow(2, i * d, d).reshape([b, t, self.n_head, hd]).transpose(1, 2);
            let (q, k, v) = (split(0), split(1), split(2));
            let (q, k) = (gpt_model::model::rope(&q, &cos, &sin), gpt_model::model::rope(&k, &cos, &sin));
            let a = gpt_model::attention::attend(&q, &k, &v, &self.attention, 0)?;
            h = &h + proj.forward(&a.transpose(1, 2).reshape([b, t, d]));
            h = &h + fc2.forward(&fc.forward(&ln2.forward(&h)).gelu("none"));
        }
        Ok(self.out.forward(&self.ln_f.forward(&h)))
    }
}

/// Features and targets of orbits `idx`: `(B, T, 8)` inputs, `(B, T, 4)` positions `x_t`, `x_{t-1}`
/// and the true `x_{t+1}`.
fn batch(o: &Orbits, idx: &[usize], device: Device) -> (Tensor, Tensor, Tensor, Tensor) {
    let (t, stride) = (o.len, (o.len + 1) * 4);
    let mut cur = Vec::with_capacity(idx.len() * t * 4);
    let mut prev = Vec::with_capacity(cur.capacity());
    let mut next = Vec::with_capacity(cur.capacity());
    for &i in idx {
        let seq = &o.pos[i * stride..(i + 1) * stride];
        for s in 0..t {
            cur.extend_from_slice(&seq[s * 4..s * 4 + 4]);
            let p = if s == 0 { 0 } else { s - 1 };
            prev.extend_from_slice(&seq[p * 4..p * 4 + 4]);
            next.extend_from_slice(&seq[(s + 1) * 4..(s + 1) * 4 + 4]);
        }
    }
    let shape = [idx.len() as i64, t as i64, 4];
    let cur = Tensor::from_slice(&cur).reshape(shape).to_device(device);
    let prev = Tensor::from_slice(&prev).reshape(shape).to_device(device);
    let next = Tensor::from_slice(&next).reshape(shape).to_device(device);
    let vel = (&cur - &prev) * 10.0;
    let feats = Tensor::cat(&[&cur, &vel], 2);
    (feats, cur, prev, next)
}

/// One seed's result and its `(r, implied / Newton)` ratios.
type SeedRun = (SeedResult, Vec<(f64, f64)>);

/// Trains seed `seed_index` on `train` and reads the forces of `test` back.
fn run_seed(
    settings: &Settings,
    variant: &Variant,
    seed_index: usize,
    train: &Orbits,
    test: &Orbits,
) -> Result<SeedRun> {
    let start = std::time::Instant::now();
    let device = Device::cuda_if_available();
    let seed = settings.seed + seed_index as u64;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0062_6174_6368_6573);
    let vs = nn::VarStore::new(device);
    let model = gpt_model::model::with_seed(seed as i64, || OrbitModel::new(&vs.root(), settings, variant.clone()))?;
    let mut opt = nn::Adam::default().build(&vs, settings.lr)?;
    let dt = settings.dt;
    let mut tail = Vec::new();
    for step in 0..settings.steps {
        let frac = step as f64 / settings.steps.max(1) as f64;
        opt.set_lr(settings.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * frac).cos())));
        let idx: Vec<usize> = (0..settings.batch).map(|_| rand::Rng::random_range(&mut rng, 0..train.n)).collect();
        let (feats, cur, _, next) = batch(train, &idx, device);
        let y = model.forward(&feats, 1.0)?;
        // The next positions, in units of dt^2; step 0 (no previous position) is left out.
        let pred = &cur + &y * dt;
        let t = y.size()[1];
        let loss = (pred - &next).narrow(1, 1, t - 1).square().mean(Kind::Float) / (dt * dt * dt * dt);
        opt.backward_step(&loss);
        let l = loss.double_value(&[]);
        anyhow::ensure!(l.is_finite(), "physics run `{variant}` seed {seed_index} diverged at step {step}");
        if step >= settings.steps - settings.steps.div_ceil(10) {
            tail.push(l);
        }
    }
    // Held-out orbits, `eval_multiple` times longer: implied accelerations by finite differences.
    let all: Vec<usize> = (0..test.n).collect();
    let (feats, cur, prev, _) = batch(test, &all, device);
    let y = tch::no_grad(|| model.forward(&feats, settings.eval_multiple as f64))?;
    let implied = ((&cur + &y * dt - &cur * 2.0 + &prev) / (dt * dt)).to_device(Device::Cpu).to_kind(Kind::Double);
    let flat = |x: &Tensor| -> Result<Vec<f64>> { Ok(Vec::<f64>::try_from(x.contiguous().view([-1]))?) };
    let (av, cv) = (flat(&implied)?, flat(&cur.to_device(Device::Cpu).to_kind(Kind::Double))?);
    let (t, len) = (settings.seq_len, test.len);
    let stride = (len + 1) * 4;
    // Errors within and beyond the training length; the floor is the latter.
    let rel_rmse = |from: usize, to: usize| {
        let (mut e2, mut a2) = (0.0, 0.0);
        for o in 0..test.n {
            for s in from..to {
                for c in 0..4 {
                    let (got, want) = (av[(o * len + s) * 4 + c], test.acc[o * stride + s * 4 + c]);
                    e2 += (got - want).powi(2);
                    a2 += want * want;
                }
            }
        }
        ((e2 / a2).sqrt(), (e2 / (test.n * (to - from) * 2) as f64).sqrt())
    };
    let (within, _) = rel_rmse((t / 4).max(1), t);
    let (beyond, floor) = rel_rmse(t, len);
    let mut per_orbit = Vec::with_capacity(test.n);
    let (mut all_kept, mut ratios, mut samples) = (Vec::new(), Vec::new(), 0usize);
    for (o, m) in test.masses.iter().enumerate() {
        let mut kept = Vec::new();
        for s in t..len {
            let base = (o * len + s) * 4;
            let r = sim::distance([cv[base], cv[base + 1]], [cv[base + 2], cv[base + 3]]);
            for body in 0..2 {
                samples += 1;
                let ta = &test.acc[o * stride + s * 4 + 2 * body..];
                let true_a = (ta[0].powi(2) + ta[1].powi(2)).sqrt();
                let a = (av[base + 2 * body].powi(2) + av[base + 2 * body + 1].powi(2)).sqrt();
                let f = m[body] * a;
                if true_a > settings.floor_factor * floor && f.is_finite() && f > 0.0 {
                    kept.push(Sample { m1: m[body], m2: m[1 - body], r, f });
                    ratios.push((r, f / (m[0] * m[1] / (r * r))));
                }
            }
        }
        per_orbit.push(Normal::of(&kept));
        all_kept.extend(kept);
    }
    let kept = per_orbit.iter().map(|n| n.n).sum();
    // The grid search is quadratic in the grid, linear in the samples: an evenly spaced subset suffices.
    let sub: Vec<Sample> = all_kept.iter().step_by(all_kept.len().div_ceil(3000).max(1)).copied().collect();
    let best_law = if sub.len() >= 5 { regress::search(&sub)[0].to_string() } else { "-".into() };
    let result = SeedResult {
        seed_index,
        final_train_loss: tail.iter().sum::<f64>() / tail.len().max(1) as f64,
        accel_rel_rmse_within: within,
        accel_rel_rmse_beyond: beyond,
        floor,
        kept,
        samples,
        orbits: SeedOrbits { orbits: per_orbit },
        best_law,
        wall_s: start.elapsed().as_secs_f64(),
    };
    Ok((result, ratios))
}

/// Runs (or reuses from `cache`) the physics experiment for `variant`: one model per seed. Once
/// `stop` is set no further seed's model starts and the error is [`crate::runner::Stopped`] (the
/// result is cached per variant, so the seeds of an unfinished variant are trained again).
pub fn run(
    settings: &Settings,
    variant: &crate::spec::TrainedVariant,
    cache: &Path,
    stop: Option<trainer::process::StopFlag>,
) -> Result<PhysicsResult> {
    let file = cache.join(format!("{}.json", crate::runner::run_dir_name(variant)));
    if let Ok(text) = std::fs::read_to_string(&file)
        && let Ok(r) = serde_json::from_str::<PhysicsResult>(&text)
        && r.settings == *settings
        && r.variant == variant.as_str()
        && r.revision == crate::runner::task_revision()
    {
        crate::progress::say(&format!("physics experiment, `{variant}`: cached in {}", file.display()));
        return Ok(r);
    }
    let parsed: Variant = variant.variant().clone();
    anyhow::ensure!(
        settings.d_model % settings.n_head == 0 && (settings.d_model / settings.n_head) % 2 == 0,
        "physics: head dimension {} / {} must be an even integer (RoPE)",
        settings.d_model,
        settings.n_head
    );
    let mut rng = ChaCha8Rng::seed_from_u64(settings.seed);
    let train = orbits(settings.train_orbits, settings.seq_len, settings.dt, &mut rng);
    let test = orbits(settings.test_orbits, settings.seq_len * settings.eval_multiple, settings.dt, &mut rng);
    let work = crate::progress::Work::start(&format!("physics `{variant}`"), settings.seeds, "seeds");
    let (mut seeds, mut ratio_by_r) = (Vec::new(), Vec::new());
    for s in 0..settings.seeds {
        crate::runner::check_stop(stop)?;
        let (r, ratios) = run_seed(settings, &parsed, s, &train, &test)?;
        if s == 0 {
            ratio_by_r = median_by_log_bins(&ratios, 12);
        }
        seeds.push(r);
        work.inc();
    }
    let result = PhysicsResult {
        variant: variant.to_string(),
        settings: settings.clone(),
        revision: crate::runner::task_revision(),
        seeds,
        ratio_by_r,
    };
    std::fs::create_dir_all(cache)?;
    let text = serde_json::to_string_pretty(&result)?;
    trainer::data::io::write_atomic(&file, |w| w.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(result)
}

/// Median of `y` in `bins` log-spaced bins of `x` (empty bins skipped): `(geometric bin centre, median)`.
fn median_by_log_bins(points: &[(f64, f64)], bins: usize) -> Vec<(f64, f64)> {
    let (lo, hi) = points.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
    if points.is_empty() || lo >= hi {
        return Vec::new();
    }
    let (llo, lhi) = (lo.ln(), hi.ln());
    let mut buckets = vec![Vec::new(); bins];
    for &(x, y) in points {
        let i = (((x.ln() - llo) / (lhi - llo)) * bins as f64).floor() as usize;
        buckets[i.min(bins - 1)].push(y);
    }
    buckets
        .into_iter()
        .enumerate()
        .filter(|(_, b)| !b.is_empty())
        .map(|(i, mut b)| {
            b.sort_by(|a, c| a.total_cmp(c));
            ((llo + (i as f64 + 0.5) * (lhi - llo) / bins as f64).exp(), b[b.len() / 2])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_bins_take_medians_and_skip_empty_bins() {
        let pts = vec![(1.0, 5.0), (1.1, 1.0), (1.05, 3.0), (100.0, 7.0)];
        let m = median_by_log_bins(&pts, 4);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].1, 3.0);
        assert_eq!(m[1].1, 7.0);
        assert!(m[0].0 > 1.0 && m[0].0 < 4.0, "{m:?}");
    }

    #[test]
    fn the_smoke_run_trains_every_seed_caches_and_reads_forces_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings::for_scale("smoke");
        let r = run(&s, &"softmax".parse().unwrap(), dir.path(), None).unwrap();
        assert_eq!(r.seeds.len(), s.seeds);
        for x in &r.seeds {
            assert!(x.final_train_loss.is_finite() && x.accel_rel_rmse_beyond.is_finite() && x.floor > 0.0);
            assert_eq!(x.orbits.orbits.len(), s.test_orbits, "one set of normal equations per held-out orbit");
            assert_eq!(
                x.samples,
                s.test_orbits * 2 * s.seq_len * (s.eval_multiple - 1),
                "every body and step beyond T"
            );
            assert!(x.kept <= x.samples);
        }
        assert_ne!(r.seeds[0].final_train_loss, r.seeds[1].final_train_loss, "seeds differ");
        // A second call reuses the cached result (same settings), a changed setting reruns.
        // (JSON may move the last bit of a float; a rerun would move its wall time by milliseconds.)
        let again = run(&s, &"softmax".parse().unwrap(), dir.path(), None).unwrap();
        assert_eq!(again.seeds.len(), r.seeds.len());
        for (a, b) in again.seeds.iter().zip(&r.seeds) {
            assert!((a.wall_s - b.wall_s).abs() < 1e-9 && a.kept == b.kept, "the cached result was not reused");
        }
        let s2 = Settings { steps: 3, ..s };
        assert_eq!(run(&s2, &"softmax".parse().unwrap(), dir.path(), None).unwrap().settings.steps, 3);
    }
}
