//! The physics experiment (SPEC section 9): a small transformer learns to predict the next positions
//! of simulated two-body orbits; the forces implied by its predictions are read back with the
//! symbolic regression of [`super::regress`], once per attention variant (the paper: the LSSAR model
//! recovers `F ~ m1 m2 / r^2`, the softmax model does not).
//!
//! Set-up (choices, since the paper gives no details):
//!
//! - Data: random bound two-body systems ([`super::sim::random_two_body`], `G = 1`), sampled every
//!   `dt` for `seq_len + 1` steps. The masses are **not** an input: the model must infer them from
//!   the history, which is what its attention is for.
//! - Input per step: both positions and their change since the previous step (zero at the first).
//!   A learned position embedding gives the order.
//! - Output: the next positions, parametrised as `x_{t+1} = 2 x_t - x_{t-1} + dt^2 · y_t` (constant-
//!   velocity extrapolation plus a learned correction): the loss is the mean squared error of the
//!   predicted positions, in units of `dt^2` so that it reads as an acceleration error.
//! - Implied force on body `i` at step `t`: `m_i |x̂_{t+1} - 2 x_t + x_{t-1}| / dt^2`, with the true
//!   masses; one regression sample per body and step of held-out orbits, `(m_i, m_other, r, F)`,
//!   from the second quarter of each sequence on (so the model has seen some history).
//! - Regression: the grid search over power laws and sums of two ([`super::regress::search`]), and a
//!   continuous power-law fit with standard errors ([`super::regress::power_law`]).

use std::path::Path;

use anyhow::{Context, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor, nn, nn::Module, nn::OptimizerConfig};

use attn_core::Variant;
use gpt_model::AttnImpl;

use super::regress::{self, Sample};
use super::sim;

/// Sizes of one physics run; see [`Settings::for_scale`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Orbits to train on.
    pub train_orbits: usize,
    /// Held-out orbits the forces are read from.
    pub test_orbits: usize,
    /// Steps per sequence.
    pub seq_len: usize,
    /// Time between steps.
    pub dt: f64,
    /// Width of the residual stream.
    pub d_model: i64,
    /// Attention heads (head dimension `d_model / n_head`).
    pub n_head: i64,
    /// Transformer blocks.
    pub n_layer: i64,
    /// Optimiser steps.
    pub steps: usize,
    /// Sequences per step.
    pub batch: usize,
    /// Adam learning rate (cosine decay to a tenth).
    pub lr: f64,
    /// Seed of the orbits and of the initial weights.
    pub seed: u64,
}

impl Settings {
    /// The settings of a reproduction scale: `smoke` (seconds, in the test suite), `small` (a few
    /// minutes per variant on two CPU cores), `gpu` and `paper` (larger model, more orbits).
    pub fn for_scale(scale: &str) -> Self {
        let base = Settings {
            train_orbits: 2000,
            test_orbits: 100,
            seq_len: 64,
            dt: 0.05,
            d_model: 128,
            n_head: 2,
            n_layer: 2,
            steps: 1500,
            batch: 32,
            lr: 2e-3,
            seed: 2026,
        };
        match scale {
            "smoke" => Settings {
                train_orbits: 64,
                test_orbits: 8,
                seq_len: 24,
                d_model: 64,
                n_head: 1,
                n_layer: 1,
                steps: 20,
                batch: 8,
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

/// What one variant's physics run found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhysicsResult {
    /// The attention variant.
    pub variant: String,
    /// The settings it ran with (a cached result is reused only for the same settings).
    pub settings: Settings,
    /// The code that computed it ([`crate::runner::task_revision`]; a cached result is reused only
    /// from the same code).
    #[serde(default)]
    pub revision: String,
    /// Root mean squared error of the implied accelerations over that of the exact ones (held-out).
    pub accel_rel_rmse: f64,
    /// The same for the constant-velocity extrapolation alone (no model): the bar to beat.
    pub baseline_rel_rmse: f64,
    /// Training loss (mean squared acceleration error) over the last tenth of the steps.
    pub final_train_loss: f64,
    /// The best law of the grammar (lowest BIC), as text.
    pub best_law: String,
    /// Its root mean squared relative error.
    pub best_law_rel_rmse: f64,
    /// The continuous power-law fit `[ln c, a, b, k]` and its standard errors.
    pub power_law: Option<([f64; 4], [f64; 4])>,
    /// Whether the best law is Newton's (one term, exponents 1, 1, -2).
    pub newton_recovered: bool,
    /// Median of implied force / Newton force in bins of distance: `(r, ratio)`.
    pub ratio_by_r: Vec<(f64, f64)>,
    /// Training and evaluation time, seconds.
    pub wall_s: f64,
}

struct Orbits {
    /// `(n, seq_len + 1, 4)` positions `x1, y1, x2, y2`.
    pos: Vec<f32>,
    masses: Vec<[f64; 2]>,
    n: usize,
    len: usize,
}

fn orbits(n: usize, len: usize, dt: f64, rng: &mut ChaCha8Rng) -> Orbits {
    let mut pos = Vec::with_capacity(n * (len + 1) * 4);
    let mut masses = Vec::with_capacity(n);
    for _ in 0..n {
        let mut system = sim::random_two_body(rng, 1.0);
        masses.push([system.bodies[0].mass, system.bodies[1].mass]);
        let traj = sim::simulate(&mut system, dt, len + 1, 20);
        for step in &traj.pos {
            for body in step {
                pos.extend([body[0] as f32, body[1] as f32]);
            }
        }
    }
    Orbits { pos, masses, n, len }
}

/// The model: input projection, learned positions, pre-norm blocks with the chosen attention, output head.
struct OrbitModel {
    inp: nn::Linear,
    wpe: nn::Embedding,
    blocks: Vec<(nn::LayerNorm, nn::Linear, nn::Linear, nn::LayerNorm, nn::Linear, nn::Linear)>,
    ln_f: nn::LayerNorm,
    out: nn::Linear,
    n_head: i64,
    variant: Variant,
}

impl OrbitModel {
    fn new(vs: &nn::Path<'_>, s: &Settings, variant: Variant) -> Self {
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
        OrbitModel {
            inp: nn::linear(vs / "inp", 8, d, Default::default()),
            wpe: nn::embedding(vs / "wpe", s.seq_len as i64, d, Default::default()),
            blocks,
            ln_f: ln(vs / "ln_f"),
            out: nn::linear(vs / "out", d, 4, Default::default()),
            n_head: s.n_head,
            variant,
        }
    }

    /// `(B, T, 8)` features to `(B, T, 4)` acceleration estimates.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, _) = x.size3()?;
        let pos = Tensor::arange(t, (Kind::Int64, x.device()));
        let mut h = self.inp.forward(x) + self.wpe.forward(&pos);
        let d = h.size()[2];
        let hd = d / self.n_head;
        for (ln1, qkv, proj, ln2, fc, fc2) in &self.blocks {
            let y = qkv.forward(&ln1.forward(&h));
            let split = |i: i64| y.narrow(2, i * d, d).reshape([b, t, self.n_head, hd]).transpose(1, 2);
            let (q, k, v) = (split(0), split(1), split(2));
            let a = gpt_model::attention::attend(&q, &k, &v, &self.variant, AttnImpl::Fused, 0)?;
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

/// Runs (or reuses from `cache`) the physics experiment for `variant`.
pub fn run(settings: &Settings, variant: &str, cache: &Path) -> Result<PhysicsResult> {
    let file = cache.join(format!("{}.json", crate::runner::run_dir_name(variant)));
    if let Ok(text) = std::fs::read_to_string(&file)
        && let Ok(r) = serde_json::from_str::<PhysicsResult>(&text)
        && r.settings == *settings
        && r.variant == variant
        && r.revision == crate::runner::task_revision()
    {
        crate::runner::say(&format!("physics experiment, `{variant}`: cached in {}", file.display()));
        return Ok(r);
    }
    crate::runner::say(&format!("physics experiment, `{variant}` ..."));
    let start = std::time::Instant::now();
    let parsed: Variant = variant.parse().with_context(|| format!("physics variant `{variant}`"))?;
    let device = Device::cuda_if_available();
    let mut rng = ChaCha8Rng::seed_from_u64(settings.seed);
    let train = orbits(settings.train_orbits, settings.seq_len, settings.dt, &mut rng);
    let test = orbits(settings.test_orbits, settings.seq_len, settings.dt, &mut rng);
    let vs = nn::VarStore::new(device);
    let model = gpt_model::model::with_seed(settings.seed as i64, || OrbitModel::new(&vs.root(), settings, parsed));
    let mut opt = nn::Adam::default().build(&vs, settings.lr)?;
    let dt2 = (settings.dt * settings.dt) as f32;
    let step_loss = |feats: &Tensor, cur: &Tensor, prev: &Tensor, next: &Tensor| -> Result<Tensor> {
        let y = model.forward(feats)?;
        // Positions in units of dt^2: the error of the implied acceleration. Step 0 has no previous position.
        let pred_acc = y.narrow(1, 1, y.size()[1] - 1);
        let true_acc = (next - cur * 2.0 + prev).narrow(1, 1, y.size()[1] - 1) / f64::from(dt2);
        Ok((pred_acc - true_acc).square().mean(Kind::Float))
    };
    let mut tail = Vec::new();
    for step in 0..settings.steps {
        let frac = step as f64 / settings.steps.max(1) as f64;
        opt.set_lr(settings.lr * (0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * frac).cos())));
        let idx: Vec<usize> = (0..settings.batch).map(|_| rand::Rng::random_range(&mut rng, 0..train.n)).collect();
        let (feats, cur, prev, next) = batch(&train, &idx, device);
        let loss = step_loss(&feats, &cur, &prev, &next)?;
        opt.backward_step(&loss);
        let l = loss.double_value(&[]);
        anyhow::ensure!(l.is_finite(), "physics run `{variant}` diverged at step {step}");
        if step >= settings.steps - settings.steps.div_ceil(10) {
            tail.push(l);
        }
    }
    // Held-out orbits: implied accelerations and forces.
    let all: Vec<usize> = (0..test.n).collect();
    let (feats, cur, prev, next) = batch(&test, &all, device);
    let y = tch::no_grad(|| model.forward(&feats))?.to_device(Device::Cpu).to_kind(Kind::Double);
    let true_acc = ((&next - &cur * 2.0 + &prev) / f64::from(dt2)).to_device(Device::Cpu).to_kind(Kind::Double);
    let cur = cur.to_device(Device::Cpu).to_kind(Kind::Double);
    let t = settings.seq_len;
    let from = (t / 4).max(1);
    let window = |x: &Tensor| x.narrow(1, from as i64, (t - from) as i64);
    let rel = |e: &Tensor, r: &Tensor| {
        (e.square().mean(Kind::Double).double_value(&[]) / r.square().mean(Kind::Double).double_value(&[])).sqrt()
    };
    let accel_rel_rmse = rel(&(window(&y) - window(&true_acc)), &window(&true_acc));
    let baseline_rel_rmse = rel(&window(&true_acc), &window(&true_acc));
    let flat = |x: &Tensor| -> Result<Vec<f64>> { Ok(Vec::<f64>::try_from(x.contiguous().view([-1]))?) };
    let (yv, cv) = (flat(&y)?, flat(&cur)?);
    let mut samples = Vec::new();
    let mut ratios = Vec::new();
    for (o, m) in test.masses.iter().enumerate() {
        for s in from..t {
            let base = (o * t + s) * 4;
            let (p1, p2) = ([cv[base], cv[base + 1]], [cv[base + 2], cv[base + 3]]);
            let r = sim::distance(p1, p2);
            for body in 0..2 {
                let a = (yv[base + 2 * body].powi(2) + yv[base + 2 * body + 1].powi(2)).sqrt();
                let f = m[body] * a;
                let newton = m[0] * m[1] / (r * r);
                if f.is_finite() && f > 0.0 {
                    samples.push(Sample { m1: m[body], m2: m[1 - body], r, f });
                    ratios.push((r, f / newton));
                }
            }
        }
    }
    anyhow::ensure!(samples.len() >= 5, "physics run `{variant}`: too few positive implied forces");
    // The grid search is quadratic in the grid, linear in the samples: an evenly spaced subset suffices.
    let every = samples.len().div_ceil(3000);
    let sub: Vec<Sample> = samples.iter().step_by(every).copied().collect();
    let laws = regress::search(&sub);
    let best = &laws[0];
    let newton_recovered = best.terms.len() == 1 && best.terms[0].same_shape(1.0, 1.0, -2.0);
    let power_law = regress::power_law(&samples).map(|p| (p.params, p.stderr));
    let result = PhysicsResult {
        variant: variant.to_string(),
        settings: settings.clone(),
        revision: crate::runner::task_revision(),
        accel_rel_rmse,
        baseline_rel_rmse,
        final_train_loss: tail.iter().sum::<f64>() / tail.len().max(1) as f64,
        best_law: best.to_string(),
        best_law_rel_rmse: best.rel_rmse,
        power_law,
        newton_recovered,
        ratio_by_r: median_by_log_bins(&ratios, 12),
        wall_s: start.elapsed().as_secs_f64(),
    };
    std::fs::create_dir_all(cache)?;
    std::fs::write(&file, serde_json::to_string_pretty(&result)?)
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
    fn the_smoke_run_trains_caches_and_reads_forces_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings::for_scale("smoke");
        let r = run(&s, "softmax", dir.path()).unwrap();
        assert!(r.accel_rel_rmse.is_finite() && r.final_train_loss.is_finite());
        assert!((r.baseline_rel_rmse - 1.0).abs() < 1e-12, "the baseline predicts zero correction");
        assert!(!r.best_law.is_empty());
        // A second call reuses the cached result (same settings), a changed setting reruns.
        // (JSON may move the last bit of a float; a rerun would move its wall time by milliseconds.)
        let again = run(&s, "softmax", dir.path()).unwrap();
        assert_eq!(again.best_law, r.best_law);
        assert!((again.wall_s - r.wall_s).abs() < 1e-9, "the cached result was not reused");
        let s2 = Settings { steps: 3, ..s };
        assert_eq!(run(&s2, "softmax", dir.path()).unwrap().settings.steps, 3);
    }
}
