//! Data parallelism across the cores of one CPU process: each micro-batch's sequences split into
//! as many shards as the training has threads, each shard's forward and backward run by a replica
//! of the model on a thread of its own (libtorch's operations and the fused kernels on one core
//! each), and the replicas' gradients summed into the model's, in shard order, before the
//! optimiser step.
//!
//! Why: at the `small` scale's shapes (batches of 1024 tokens of width 128) most of libtorch's
//! operations are too small for its intra-op threads: below their grain size they run on one core
//! while the other waits, and the rest pay a fork and a join each. Split by sequences, every
//! operation runs on every core at once. On a 2-core Zen 1 EPYC two such halves (8 sequences each,
//! one thread each, in two processes) trained at 7357-7530 tokens/s together against 6786-7027 for
//! one process of 16 sequences on 2 threads (`docs/bench/train-cpu-notes.md`).
//!
//! The replicas' parameters are the model's: each replica's variables are separate autograd
//! leaves (with gradients of their own) whose data is the model's parameters' memory, so the
//! optimiser's in-place update is every replica's. The step is deterministic: the same shards, the
//! same sums in the same order, the same bits every time (a resumed run continues to the numbers of
//! an uninterrupted one). It is not bit for bit the unsharded step's: a sum over a batch's rows
//! is made in one part per shard, and the parts added.

use anyhow::{Context, Result, ensure};
use gpt_model::config::ModelConfig;
use gpt_model::model::{ForwardOptions, Gpt};
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};

use crate::optim::AdamW;

/// The shard count of a training on `device` with `threads` threads (libtorch's count for it),
/// batches of `batch` sequences and the configuration's `shards` (0: automatic): `shards` where
/// given, else the threads where they divide the batch, the largest count below that does
/// otherwise; 1 (no shards) on a GPU.
pub(crate) fn count(device: Device, threads: usize, batch: usize, shards: usize) -> usize {
    if device != Device::Cpu {
        return 1;
    }
    if shards > 0 {
        return shards;
    }
    (1..=threads.min(batch)).rev().find(|n| batch.is_multiple_of(*n)).unwrap_or(1)
}

/// Makes libtorch's operations on the calling thread run on it alone, without changing the
/// process's thread count (which the other threads keep): libtorch's intra-op threads are an OpenMP
/// team whose size is each thread's own OpenMP setting (`omp_set_num_threads`, after libtorch set it
/// from its count at the thread's first use, which `get_num_threads` makes), and MKL's matrix
/// products take a thread's own count (`MKL_Set_Num_Threads_Local`). Either missing from the process
/// (another OpenMP runtime, no MKL) leaves that part at the process's count.
fn one_thread_here() {
    type SetThreads = unsafe extern "C" fn(i32) -> i32;
    let _ = tch::get_num_threads();
    let this = libloading::os::unix::Library::this();
    // (MKL's C entry is the mixed-case name, which its header maps `mkl_set_num_threads_local` to;
    // the lower-case symbols are the Fortran ones, which take a pointer.)
    for name in [&b"omp_set_num_threads\0"[..], b"MKL_Set_Num_Threads_Local\0"] {
        // SAFETY: both take the thread count as a C int by value (`omp_set_num_threads` returns
        // nothing; the value read as its return is ignored) and change only the calling thread's
        // setting.
        if let Ok(f) = unsafe { this.get::<SetThreads>(name) } {
            unsafe { f(1) };
        }
    }
    // The handle of the process itself: closing it unloads nothing.
    std::mem::forget(this);
}

/// One replica: its variables (the model's parameters' memory), its model, and the one-thread pool
/// its shard runs in (so the fused kernels' work split runs on that thread too).
struct Replica {
    _vs: VarStore,
    model: Gpt,
    /// The variables in the optimiser's slot order.
    params: Vec<Tensor>,
    pool: rayon::ThreadPool,
}

/// The replicas of a training's model.
pub(crate) struct Shards {
    replicas: Vec<Replica>,
}

impl Shards {
    /// `n` replicas of the model whose parameters `opt` updates (configuration `cfg`, seed `seed`
    /// for the replicas' throwaway initial values).
    pub(crate) fn new(cfg: &ModelConfig, opt: &AdamW, seed: i64, n: usize) -> Result<Self> {
        let replicas = (0..n)
            .map(|i| {
                let vs = VarStore::new(Device::Cpu);
                let model = Gpt::new_seeded(&vs.root(), cfg, seed)?;
                let mut vars = vs.variables();
                let mut params = Vec::with_capacity(opt.slots.len());
                for slot in &opt.slots {
                    let mut v = vars.remove(&slot.name).with_context(|| format!("replica {i}: no `{}`", slot.name))?;
                    ensure!(v.size() == slot.param.size(), "replica {i}: `{}` has another shape", slot.name);
                    v.set_data(&slot.param.detach());
                    params.push(v);
                }
                ensure!(vars.is_empty(), "replica {i}: variables the model has not: {:?}", vars.keys());
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .thread_name(move |_| format!("shard-{i}"))
                    .build()
                    .context("a shard's thread")?;
                pool.install(one_thread_here);
                Ok(Replica { _vs: vs, model, params, pool })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { replicas })
    }

    /// Forward and backward of one micro-batch (`x`, `y`: `batch` rows of `t` token ids), its
    /// rows split over the replicas in order; each shard's loss scaled by `scale` and its share of
    /// the rows before its backward, so that the gathered gradient is the whole batch's times
    /// `scale`. Returns the batch's mean loss.
    pub(crate) fn micro_batch(&mut self, x: &[i64], y: &[i64], batch: usize, t: usize, scale: f64) -> Result<f64> {
        let n = self.replicas.len();
        let rows = batch / n;
        ensure!(
            rows * n == batch && x.len() == batch * t && y.len() == batch * t,
            "a batch of {batch} x {t} in {n} shards"
        );
        let share = rows as f64 / batch as f64;
        let losses: Vec<Result<f64>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .replicas
                .iter_mut()
                .enumerate()
                .map(|(i, r)| {
                    let span = i * rows * t..(i + 1) * rows * t;
                    let (x, y) = (&x[span.clone()], &y[span]);
                    // `&mut` (not `&`): a tensor may move between threads but not be shared by them.
                    let (model, pool) = (&mut r.model, &r.pool);
                    s.spawn(move || {
                        pool.install(move || -> Result<f64> {
                            let to = |v: &[i64]| Tensor::from_slice(v).view([rows as i64, t as i64]);
                            let loss = model.loss(&to(x), &to(y), &ForwardOptions::default())?;
                            (&loss * (scale * share)).backward();
                            Ok(loss.to_kind(Kind::Double).double_value(&[]))
                        })
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
        });
        let mut mean = 0.0;
        for loss in losses {
            mean += loss? * share;
        }
        Ok(mean)
    }

    /// The model's gradients: the sum of the replicas' in shard order (theirs dropped).
    pub(crate) fn gather(&self, opt: &AdamW) -> Result<()> {
        let params: Vec<&[Tensor]> = self.replicas.iter().map(|r| r.params.as_slice()).collect();
        opt.gather_grads(&params).map_err(anyhow::Error::msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny(attention: &str) -> ModelConfig {
        ModelConfig {
            vocab_size: 64,
            context_len: 16,
            attention: attention.parse().unwrap(),
            ..ModelConfig::preset("tiny").unwrap()
        }
    }

    fn grads(opt: &AdamW) -> Vec<Vec<f32>> {
        opt.slots.iter().map(|s| Vec::<f32>::try_from(s.param.grad().flatten(0, -1)).unwrap()).collect()
    }

    /// Sharded, the step's loss and gradient are the whole batch's (up to float rounding), the same
    /// bits on every repetition, and the replicas see the optimiser's update of the model.
    #[test]
    fn shards_give_the_batch_gradient_deterministically_and_follow_the_model() {
        for attention in ["softmax", "lssa+rw15"] {
            let cfg = tiny(attention);
            let vs = VarStore::new(Device::Cpu);
            let model = Gpt::new_seeded(&vs.root(), &cfg, 5).unwrap();
            let mut opt = AdamW::new(vs.variables().into_iter().collect(), 0.9, 0.95, 1e-8, 0.1);
            let (batch, t) = (4usize, cfg.context_len);
            let ids: Vec<i64> = (0..batch * (t + 1)).map(|i| ((i * 37 + i / 7) % 64) as i64).collect();
            let x: Vec<i64> = (0..batch).flat_map(|r| ids[r * (t + 1)..r * (t + 1) + t].to_vec()).collect();
            let y: Vec<i64> = (0..batch).flat_map(|r| ids[r * (t + 1) + 1..(r + 1) * (t + 1)].to_vec()).collect();
            let to = |v: &[i64]| Tensor::from_slice(v).view([batch as i64, t as i64]);
            let whole = |model: &Gpt| model.loss(&to(&x), &to(&y), &ForwardOptions::default()).unwrap();

            let loss = whole(&model);
            (&loss * 0.5).backward();
            let (want_loss, want) = (loss.double_value(&[]), grads(&opt));
            opt.zero_grad().unwrap();

            let mut shards = Shards::new(&cfg, &opt, 99, 2).unwrap();
            let mut runs = Vec::new();
            for _ in 0..2 {
                let got_loss = shards.micro_batch(&x, &y, batch, t, 0.5).unwrap();
                shards.gather(&opt).unwrap();
                runs.push((got_loss, grads(&opt)));
                opt.zero_grad().unwrap();
            }
            let (got_loss, got) = &runs[0];
            assert!((got_loss - want_loss).abs() < 1e-6 * want_loss, "{attention}: loss {got_loss} vs {want_loss}");
            for ((g, w), slot) in got.iter().zip(&want).zip(&opt.slots) {
                let scale = w.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
                let err = g.iter().zip(w).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(err <= 1e-5 * scale, "{attention}: `{}` differs by {err:e} (scale {scale:e})", slot.name);
            }
            assert_eq!(runs[0].0.to_bits(), runs[1].0.to_bits(), "{attention}: the same loss bits");
            assert_eq!(runs[0].1, runs[1].1, "{attention}: the same gradient bits");

            // An update of the model's parameters is the replicas'.
            shards.micro_batch(&x, &y, batch, t, 1.0).unwrap();
            shards.gather(&opt).unwrap();
            opt.step(0.05).unwrap();
            let after = whole(&model).double_value(&[]);
            let got = shards.micro_batch(&x, &y, batch, t, 1.0).unwrap();
            assert!((after - want_loss).abs() > 1e-3, "{attention}: the step moved the loss");
            assert!((got - after).abs() < 1e-6 * after, "{attention}: replicas {got} vs the model {after}");
        }
    }

    #[test]
    fn the_count_is_the_threads_that_divide_the_batch_or_the_configured_one() {
        assert_eq!(count(Device::Cpu, 2, 16, 0), 2);
        assert_eq!(count(Device::Cpu, 3, 16, 0), 2, "3 does not divide 16");
        assert_eq!(count(Device::Cpu, 8, 4, 0), 4, "no more shards than sequences");
        assert_eq!(count(Device::Cpu, 1, 16, 0), 1);
        assert_eq!(count(Device::Cpu, 2, 16, 1), 1, "1 turns them off");
        assert_eq!(count(Device::Cpu, 2, 16, 4), 4);
        assert_eq!(count(Device::Cuda(0), 2, 16, 0), 1);
    }
}
