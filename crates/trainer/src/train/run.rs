//! The training loop of [`super::train`] once everything is set up: one optimiser step at a time,
//! its evaluation, its record (metrics, progress, the caller's hook), its checkpoint, and the
//! pre-emption check that ends every step.

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use gpt_model::model::{ForwardOptions, Gpt};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use super::{
    BatchSource, Collective, DIVERGED_FILE, Diverged, Preempted, RunOptions, RunSummary, StepMetrics, progress_line,
};
use crate::config::TrainConfig;
use crate::eval;
use crate::optim::{self, AdamW};
use crate::state::save_state;

/// A training between its set-up and its summary.
pub(super) struct Run<'a> {
    pub(super) cfg: &'a TrainConfig,
    pub(super) opts: &'a RunOptions,
    pub(super) coll: &'a dyn Collective,
    pub(super) data: &'a mut dyn BatchSource,
    pub(super) vs: &'a VarStore,
    pub(super) model: &'a Gpt,
    pub(super) opt: AdamW,
    /// The CPU shards of each micro-batch (`None`: one forward and backward of the whole batch).
    pub(super) shards: Option<super::shards::Shards>,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) accum: usize,
    pub(super) device: Device,
    pub(super) autocast: bool,
    pub(super) tokenizer: String,
    /// Rank 0's `metrics.jsonl`.
    pub(super) metrics: Option<std::fs::File>,
    pub(super) bar: Option<indicatif::ProgressBar>,
    pub(super) start: Instant,
    pub(super) first_step: usize,
    pub(super) steps: Vec<StepMetrics>,
    pub(super) last_ckpt: PathBuf,
    pub(super) tokens_seen: usize,
}

impl Run<'_> {
    /// Steps from `step` to `max_steps` (or a divergence, or a stop signal).
    pub(super) fn until_done(mut self, mut step: usize) -> Result<RunSummary> {
        while step < self.cfg.max_steps {
            let t0 = Instant::now();
            let lr = optim::lr_at(step, self.cfg.max_steps, self.cfg.warmup_steps, self.cfg.lr, self.cfg.min_lr_ratio);
            let (loss, grad_norm) = self.optimiser_step(lr)?;
            step += 1;
            if !loss.is_finite() {
                return Err(self.diverged(step, loss));
            }
            let tokens_per_s = self.cfg.tokens_per_step as f64 / t0.elapsed().as_secs_f64();
            self.tokens_seen += self.cfg.tokens_per_step;
            let is_last = step == self.cfg.max_steps;
            let val_loss = self.evaluate(step, is_last)?;
            let peak = self.cfg.peak_flops * self.world as f64;
            let flops = self.cfg.model.flops_per_token(self.cfg.model.context_len);
            let m = StepMetrics {
                step,
                loss,
                lr,
                grad_norm,
                tokens_per_s,
                mfu: (self.cfg.peak_flops > 0.0).then(|| tokens_per_s * flops / peak),
                val_loss,
                elapsed_s: self.start.elapsed().as_secs_f64(),
            };
            self.record(&m)?;
            self.steps.push(m);
            let saved_now = is_last || (self.cfg.ckpt_every > 0 && step.is_multiple_of(self.cfg.ckpt_every));
            if self.rank == 0 && saved_now {
                self.last_ckpt = self.save(step)?;
            }
            if !is_last {
                self.stop_if_signalled(step, saved_now)?;
            }
        }
        if let Some(bar) = self.bar {
            bar.finish();
        }
        let wall_s = self.start.elapsed().as_secs_f64();
        Ok(RunSummary {
            steps: self.steps,
            checkpoint: self.last_ckpt,
            wall_s,
            tokens_per_s: self.tokens_seen as f64 / wall_s,
        })
    }

    /// One optimiser step at learning rate `lr` over `accum` micro-batches, gradients averaged over
    /// the ranks: the mean loss over ranks and the gradient norm before clipping.
    fn optimiser_step(&mut self, lr: f64) -> Result<(f64, f64)> {
        let (b, t) = (self.cfg.batch_size as i64, self.cfg.model.context_len as i64);
        self.opt.zero_grad().map_err(anyhow::Error::msg)?;
        let mut loss_sum = 0.0;
        for _ in 0..self.accum {
            let (x, y) = self.data.next_batch()?;
            if let Some(shards) = &mut self.shards {
                loss_sum += shards.micro_batch(&x, &y, b as usize, t as usize, 1.0 / self.accum as f64)?;
                continue;
            }
            let to = |v: Vec<i64>| Tensor::from_slice(&v).view([b, t]).to_device(self.device);
            let (x, y) = (to(x), to(y));
            let loss = tch::autocast(self.autocast, || self.model.loss(&x, &y, &ForwardOptions::default()))?;
            let scaled = &loss / self.accum as f64;
            scaled.backward();
            loss_sum += loss.to_kind(Kind::Double).double_value(&[]);
        }
        if let Some(shards) = &self.shards {
            shards.gather(&self.opt)?;
        }
        self.coll.all_reduce_mean_(&self.opt.grads())?;
        let grad_norm = self.opt.clip_grad_norm(self.cfg.grad_clip).map_err(anyhow::Error::msg)?;
        self.opt.step(lr).map_err(anyhow::Error::msg)?;
        let loss = self.coll.all_reduce_sum_f64(loss_sum / self.accum as f64)? / self.world as f64;
        Ok((loss, grad_norm))
    }

    /// [`Diverged`] at `step`, after rank 0 left a marker for whoever launched this run in another
    /// process (the experiment runner); an error writing it is returned instead.
    fn diverged(&self, step: usize, loss: f64) -> anyhow::Error {
        if self.rank == 0 {
            let marker = serde_json::json!({ "step": step, "loss": loss.to_string() }).to_string();
            let path = self.cfg.out_dir.join(DIVERGED_FILE);
            if let Err(e) = crate::data::io::write_atomic(&path, |w| w.write_all(marker.as_bytes())) {
                return e.into();
            }
        }
        Diverged { step, loss }.into()
    }

    /// The validation loss after `step`, at the configured interval and at the last step.
    fn evaluate(&self, step: usize, is_last: bool) -> Result<Option<f64>> {
        let val = &self.opts.val_tokens;
        if val.is_empty() || !(is_last || (self.cfg.eval_every > 0 && step.is_multiple_of(self.cfg.eval_every))) {
            return Ok(None);
        }
        let n = self.cfg.eval_tokens.min(val.len());
        let (l, _, _) = eval::span_loss(
            self.model,
            &val[..n],
            self.cfg.model.context_len,
            self.cfg.batch_size,
            &ForwardOptions::default(),
            self.device,
        )?;
        Ok(Some(l))
    }

    /// A step's record: its `metrics.jsonl` line, the bar or a progress line, the caller's hook.
    fn record(&mut self, m: &StepMetrics) -> Result<()> {
        if let Some(f) = self.metrics.as_mut() {
            writeln!(f, "{}", serde_json::to_string(m)?).context("writing metrics.jsonl")?;
        }
        let (step, loss, val_loss) = (m.step, m.loss, m.val_loss);
        if let Some(bar) = &self.bar {
            bar.set_position(step as u64);
            bar.set_message(match val_loss {
                Some(v) => format!("loss {loss:.4} val {v:.4}"),
                None => format!("loss {loss:.4}"),
            });
        } else if self.rank == 0 && self.opts.progress {
            if val_loss.is_some() || step.is_multiple_of(self.cfg.max_steps.div_ceil(10)) {
                eprintln!("{}", progress_line(m, self.cfg.max_steps, self.first_step));
            }
        } else if self.rank == 0 && (val_loss.is_some() || step.is_multiple_of(50) || step == 1) {
            let (lr, grad_norm, tokens_per_s) = (m.lr, m.grad_norm, m.tokens_per_s);
            tracing::info!(step, loss, lr, grad_norm, tokens_per_s, val_loss, "step");
        }
        if let Some(hook) = self.opts.on_step.as_ref().filter(|_| self.rank == 0) {
            (hook.0)(m);
        }
        Ok(())
    }

    /// Rank 0's checkpoint after `step`.
    fn save(&self, step: usize) -> Result<PathBuf> {
        let position = self.data.position();
        save_state(self.vs, &self.opt, self.cfg, step, &position, self.world, &self.tokenizer, &self.opts.command)
    }

    /// Pre-emption: every rank learns at this boundary whether any was signalled (one scalar
    /// all-reduced per step), so all stop after the same step and rank 0's checkpoint is whole.
    fn stop_if_signalled(&mut self, step: usize, saved_now: bool) -> Result<()> {
        let Some(stop) = self.opts.stop.as_ref() else { return Ok(()) };
        let local = stop.signal().unwrap_or(0);
        let any = if self.world > 1 { self.coll.all_reduce_sum_f64(f64::from(local))? } else { f64::from(local) };
        if any <= 0.0 {
            return Ok(());
        }
        let signal = match local {
            0 => "a signal to another rank".to_string(),
            s => crate::process::signal_name(s),
        };
        let mut checkpoint = None;
        if self.rank == 0 {
            if !saved_now {
                self.last_ckpt = self.save(step)?;
            }
            checkpoint = Some(self.last_ckpt.clone());
            if let Some(f) = self.metrics.as_mut() {
                let event = serde_json::json!({
                    "event": "preempted", "step": step, "signal": signal, "checkpoint": self.last_ckpt,
                });
                writeln!(f, "{event}").context("writing metrics.jsonl")?;
            }
            if let Some(bar) = &self.bar {
                bar.abandon();
            }
        }
        Err(Preempted { step, signal, checkpoint }.into())
    }
}
