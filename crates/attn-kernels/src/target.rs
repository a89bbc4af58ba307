//! The one typed entry point of the raw kernels: a [`Target`] says where a call runs (the CPU with
//! its options, or CUDA with a dtype and a kernel choice), [`Kernels`] holds a variant with its plan
//! derived once and prepares it for each target and head dimension a caller meets ([`Prepared`],
//! cached by `(Target, head_dim)`), and [`Prepared::forward_raw`] / [`Prepared::backward_raw`] run
//! it. Consumers (the model's autograd bridge, the Python extension) build a [`Params`] and a
//! `Target` and keep no CPU/CUDA branching and no cache of their own; adding a backend is a `Target`
//! variant and its arm in [`Prepared`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use attn_core::{Plan, Variant};

use crate::cpu;
use crate::cuda;
use crate::error::{Error, Result};
use crate::params::{Dtype, Params};

/// The device of a call's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// An NVIDIA GPU's memory.
    Cuda,
}

/// Where a raw call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// The fused CPU kernels: `f32` host memory, on the calling thread's rayon pool.
    Cpu(cpu::Options),
    /// The CUDA kernels: device memory of `dtype`, on the legacy default stream.
    Cuda {
        /// Element type of every tensor the call reads and writes (the statistics are always `f32`).
        dtype: cuda::Dtype,
        /// Which kernel versions run ([`cuda::Kernel::Auto`] unless a benchmark asks).
        kernel: cuda::Kernel,
    },
}

impl Target {
    /// The target of tensors on `device` with elements `dtype`, with default options
    /// ([`cpu::Options::default`], [`cuda::Kernel::Auto`]); the error says what the kernels take
    /// instead.
    pub fn new(device: Device, dtype: Dtype) -> std::result::Result<Target, String> {
        match (device, dtype) {
            (Device::Cpu, Dtype::F32) => Ok(Target::Cpu(cpu::Options::default())),
            (Device::Cpu, other) => {
                Err(format!("the fused CPU kernels take float32 tensors, got {}", other.torch_name()))
            }
            (Device::Cuda, dtype) => Ok(Target::Cuda { dtype, kernel: cuda::Kernel::Auto }),
        }
    }

    /// [`Target::new`] for a device (`"cpu"` or `"cuda"`) and a dtype (`"float32"`, `"float16"`,
    /// `"bfloat16"`) named as PyTorch names them.
    pub fn for_tensors(device: &str, dtype: &str) -> std::result::Result<Target, String> {
        let device = match device {
            "cpu" => Device::Cpu,
            "cuda" => Device::Cuda,
            other => return Err(format!("no fused kernels for device `{other}` (only cpu and cuda)")),
        };
        let dtype = match dtype {
            "float32" => Dtype::F32,
            "float16" => Dtype::F16,
            "bfloat16" => Dtype::Bf16,
            other => {
                return Err(match device {
                    Device::Cpu => format!("the fused CPU kernels take float32 tensors, got {other}"),
                    Device::Cuda => {
                        format!("the fused CUDA kernels take float32, float16 or bfloat16 tensors, got {other}")
                    }
                });
            }
        };
        Target::new(device, dtype)
    }

    /// This target running the CUDA kernels `kernel` (a CPU target is returned unchanged).
    pub fn with_cuda_kernel(self, kernel: cuda::Kernel) -> Target {
        match self {
            Target::Cuda { dtype, .. } => Target::Cuda { dtype, kernel },
            cpu @ Target::Cpu(_) => cpu,
        }
    }

    /// The element type of the tensors this target runs on ([`Params::dtype`]).
    pub fn dtype(&self) -> Dtype {
        match self {
            Target::Cpu(_) => Dtype::F32,
            Target::Cuda { dtype, .. } => *dtype,
        }
    }

    /// `variant` (whose plan is `plan`) prepared for this target at head dimension `head_dim` (the
    /// CPU kernels take any), or [`Error::NotFused`] with the reason it has no kernel here.
    fn prepare(&self, variant: &Variant, plan: &Plan, head_dim: usize) -> Result<Prepared> {
        let backend = match *self {
            Target::Cpu(options) => {
                cpu::check_fused(variant, plan)?;
                Backend::Cpu(plan.clone(), options)
            }
            Target::Cuda { dtype, kernel } => {
                if head_dim > cuda::MAX_HEAD_DIM {
                    return Err(Error::NotFused {
                        variant: variant.to_string(),
                        reason: format!(
                            "the CUDA kernels take head dimensions up to {}, got {head_dim}",
                            cuda::MAX_HEAD_DIM
                        )
                        .into(),
                    });
                }
                Backend::Cuda { cfg: cuda::Config::planned(variant, plan, head_dim.max(1))?, dtype, kernel }
            }
        };
        Ok(Prepared { variant: variant.clone(), head_dim, backend })
    }
}

/// A variant with its [`Plan`] derived once and its kernels prepared once per target and head
/// dimension: the one cache of prepared kernels (a model keeps one per attention variant, the
/// Python extension one per variant name). Refusals are kept too, so a variant without a fused
/// kernel on a target is not re-examined at every call. Shared across threads.
#[derive(Debug)]
pub struct Kernels {
    variant: Variant,
    plan: Plan,
    prepared: Mutex<HashMap<(Target, usize), Preparation>>,
}

/// One (target, head dimension)'s outcome: the prepared kernels, or why there are none.
type Preparation = Result<Arc<Prepared>>;

impl Kernels {
    /// `variant` with its plan derived (its parameters checked: attn-core's errors).
    pub fn new(variant: Variant) -> std::result::Result<Self, attn_core::Error> {
        let plan = variant.plan()?;
        Ok(Self { variant, plan, prepared: Mutex::default() })
    }

    /// The variant.
    pub fn variant(&self) -> &Variant {
        &self.variant
    }

    /// Its backend-neutral plan, derived once.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The variant prepared for `target` at head dimension `head_dim` (the CPU kernels take any), or
    /// [`Error::NotFused`] with the reason it has no kernel there ([`Kernels::not_fused_reason`] says
    /// the same as a sentence). Prepared at the first call for that pair; whether a GPU can run it
    /// is [`cuda::is_available`]'s question.
    pub fn prepared(&self, target: Target, head_dim: usize) -> Result<Arc<Prepared>> {
        let mut prepared = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
        prepared
            .entry((target, head_dim))
            .or_insert_with(|| target.prepare(&self.variant, &self.plan, head_dim).map(Arc::new))
            .clone()
    }

    /// Why the variant at head dimension `head_dim` has no fused kernel on `target`, or `None` when
    /// it has one ([`Kernels::prepared`]'s refusal as a sentence).
    pub fn not_fused_reason(&self, target: Target, head_dim: usize) -> Option<String> {
        let device = match target {
            Target::Cpu(_) => "CPU",
            Target::Cuda { .. } => "CUDA",
        };
        match self.prepared(target, head_dim) {
            Ok(_) => None,
            Err(Error::NotFused { reason, .. }) => Some(format!("no fused {device} kernel: {reason}")),
            Err(e) => Some(e.to_string()),
        }
    }
}

/// A variant prepared for one [`Target`] and head dimension ([`Kernels::prepared`]): the kernels'
/// plan derived once (the CPU engine's [`Plan`], or the CUDA kernels' [`cuda::Config`]), so its
/// calls neither parse nor re-plan, and the layout of the buffers its calls take beside the tensors.
#[derive(Clone, Debug)]
pub struct Prepared {
    variant: Variant,
    head_dim: usize,
    backend: Backend,
}

/// What a prepared variant's calls run, with the rest of their target.
#[derive(Clone, Debug)]
enum Backend {
    /// The CPU engine's plan, and the CPU's options.
    Cpu(Plan, cpu::Options),
    /// The CUDA kernels' configuration, and the tensors' dtype and the kernel choice.
    Cuda { cfg: cuda::Config, dtype: cuda::Dtype, kernel: cuda::Kernel },
}

impl Prepared {
    /// The variant.
    pub fn variant(&self) -> &Variant {
        &self.variant
    }

    /// The target it was prepared for.
    pub fn target(&self) -> Target {
        match self.backend {
            Backend::Cpu(_, options) => Target::Cpu(options),
            Backend::Cuda { dtype, kernel, .. } => Target::Cuda { dtype, kernel },
        }
    }

    /// The head dimension it was prepared for.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Floats per row of the row statistics a forward writes and its backward reads
    /// ([`Params::stats`]): [`cpu::STATS_PER_ROW`] on every target.
    pub fn stats_per_row(&self) -> usize {
        cpu::STATS_PER_ROW
    }

    /// Floats per row of re-weighting's backward helper ([`Params::rw_aux`]) that a forward keeps
    /// when its output will be `differentiable`: `d + 1` for a re-weighted variant on the CPU, where
    /// it spares the backward one sweep over the keys; 0 otherwise (no helper: leave the pointer
    /// null). The one place the helper's layout is decided.
    pub fn aux_per_row(&self, differentiable: bool) -> usize {
        match self.backend {
            Backend::Cpu(ref plan, _) if differentiable && plan.reweight.is_some() => {
                cpu::rw_aux_per_row(self.head_dim)
            }
            Backend::Cpu(..) | Backend::Cuda { .. } => 0,
        }
    }

    /// The fused forward of the prepared variant (a CUDA call's head dimension must be the prepared
    /// one).
    ///
    /// # Safety
    /// Every pointer of `p` the forward uses (`q`, `k`, `v`, `o`, `stats`, and `rw_aux` when not null)
    /// addresses memory of the target's kind (host or device) and element type that covers the sizes
    /// and strides `p` states, outputs not aliasing inputs: the contract of [`cpu::forward_raw`] and
    /// [`cuda::forward_raw`].
    pub unsafe fn forward_raw(&self, p: &Params) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run(p, cpu::forward_planned, cuda::forward_configured) }
    }

    /// The fused backward of the prepared variant, from the forward's `o` and `stats`.
    ///
    /// # Safety
    /// As [`Prepared::forward_raw`], for every pointer of `p` (the backward also reads `d_out` and
    /// writes `dq`, `dk`, `dv`).
    pub unsafe fn backward_raw(&self, p: &Params) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.run(p, cpu::backward_planned, cuda::backward_configured) }
    }

    /// `on_cpu` or `on_cuda` (a forward's or a backward's entry point) on the prepared plan.
    ///
    /// # Safety
    /// As the entry point's.
    unsafe fn run(&self, p: &Params, on_cpu: CpuEntry, on_cuda: CudaEntry) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            match &self.backend {
                Backend::Cpu(plan, options) => on_cpu(plan, p, options),
                Backend::Cuda { cfg, dtype, kernel } => {
                    same_head_dim(p, self.head_dim)?;
                    on_cuda(cfg, p, *dtype, *kernel)
                }
            }
        }
    }
}

/// A CPU entry point on a prepared plan ([`cpu::forward_planned`], [`cpu::backward_planned`]).
type CpuEntry = unsafe fn(&Plan, &Params, &cpu::Options) -> Result<()>;
/// A CUDA entry point on a resolved configuration.
type CudaEntry = unsafe fn(&cuda::Config, &Params, cuda::Dtype, cuda::Kernel) -> Result<()>;

/// A CUDA configuration is resolved for one head dimension (it sets the kernels' `HD`).
fn same_head_dim(p: &Params, prepared: usize) -> Result<()> {
    if p.head_dim != prepared {
        return Err(Error::BadParams(format!(
            "the call's head dimension is {}, the variant was prepared for {prepared}",
            p.head_dim
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::RawTensor;

    #[test]
    fn targets_are_named_as_frameworks_name_tensors_and_refusals_say_why() {
        assert!(matches!(Target::for_tensors("cpu", "float32"), Ok(Target::Cpu(_))));
        assert!(matches!(
            Target::for_tensors("cuda", "bfloat16"),
            Ok(Target::Cuda { dtype: cuda::Dtype::Bf16, kernel: cuda::Kernel::Auto })
        ));
        assert!(Target::for_tensors("cpu", "float16").unwrap_err().contains("float32"));
        assert!(Target::for_tensors("mps", "float32").unwrap_err().contains("`mps`"));
        assert_eq!(Target::new(Device::Cuda, Dtype::F16), Target::for_tensors("cuda", "float16"));
        assert!(Target::new(Device::Cpu, Dtype::Bf16).unwrap_err().contains("bfloat16"));
        let cpu = Target::new(Device::Cpu, Dtype::F32).unwrap();
        let gpu = Target::new(Device::Cuda, Dtype::F32).unwrap();
        let k = |s: &str| Kernels::new(s.parse::<Variant>().unwrap()).unwrap();
        assert_eq!(k("lssa+rw15").not_fused_reason(cpu, 64), None);
        assert!(k("recentered").not_fused_reason(cpu, 64).unwrap().starts_with("no fused CPU kernel"));
        assert_eq!(k("lssa").not_fused_reason(gpu, 64), None);
        assert!(k("lssa").not_fused_reason(gpu, 512).unwrap().contains("up to 256"));
        assert!(k("relu-seqlen").not_fused_reason(gpu, 64).unwrap().starts_with("no fused CUDA kernel"));
    }

    #[test]
    fn kernels_are_prepared_once_per_target_and_head_dimension_and_decide_the_helper() {
        let lssar = Kernels::new("lssa+rw15".parse().unwrap()).unwrap();
        let cpu = Target::new(Device::Cpu, Dtype::F32).unwrap();
        let gpu = Target::new(Device::Cuda, Dtype::Bf16).unwrap();
        let a = lssar.prepared(cpu, 64).unwrap();
        assert!(Arc::ptr_eq(&a, &lssar.prepared(cpu, 64).unwrap()), "a second call prepares again");
        let b = lssar.prepared(cpu, 32).unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        assert_eq!((a.head_dim(), b.head_dim()), (64, 32));
        // The helper: d + 1 floats on the CPU for a differentiated re-weighted forward, else none.
        assert_eq!((a.aux_per_row(true), a.aux_per_row(false)), (65, 0));
        assert_eq!(lssar.prepared(gpu, 64).unwrap().aux_per_row(true), 0);
        let lssa = Kernels::new("lssa".parse().unwrap()).unwrap();
        assert_eq!(lssa.prepared(cpu, 64).unwrap().aux_per_row(true), 0);
        assert_eq!(a.stats_per_row(), cpu::STATS_PER_ROW);
        assert_eq!(lssar.prepared(gpu, 64).unwrap().target(), gpu);
    }

    #[test]
    fn the_entry_point_runs_the_cpu_backend_on_a_cpu_target() {
        // The same numbers as the CPU kernels' own ndarray entry point, through raw pointers.
        let v: Variant = "lssa+rw15".parse().unwrap();
        let (b, h, t, d) = (1, 2, 37, 16);
        let q = ndarray::Array4::<f32>::from_shape_fn((b, h, t, d), |(_, h, t, c)| {
            ((h * 7 + t * 3 + c) % 11) as f32 / 11.0 - 0.5
        });
        let want = cpu::forward(&v, &q, &q, &q).unwrap();
        let mut o = ndarray::Array4::<f32>::zeros((b, h, t, d));
        let mut stats = vec![0f32; b * h * t * cpu::STATS_PER_ROW];
        let strides = [h * t * d, t * d, d];
        let c = |x: *const f32| RawTensor { ptr: x.cast(), strides };
        let mut p = Params {
            batch: b,
            heads: h,
            kv_heads: h,
            seq_len: t,
            kv_len: t,
            head_dim: d,
            q: c(q.as_ptr()),
            k: c(q.as_ptr()),
            v: c(q.as_ptr()),
            o: RawTensor { ptr: o.as_mut_ptr().cast(), strides },
            stats: stats.as_mut_ptr(),
            rw_aux: std::ptr::null_mut(),
            d_out: crate::params::null_input(),
            dq: crate::params::null_output(),
            dk: crate::params::null_output(),
            dv: crate::params::null_output(),
            dtype: crate::Dtype::F32,
        };
        // Another dtype is refused before anything is read.
        p.dtype = crate::Dtype::Bf16;
        // SAFETY: refused before any pointer is read.
        let kernels = Kernels::new(v).unwrap().prepared(Target::Cpu(cpu::Options::default()), p.head_dim).unwrap();
        let err = unsafe { kernels.forward_raw(&p) }.unwrap_err();
        assert!(err.to_string().contains("f32"), "{err}");
        p.dtype = crate::Dtype::F32;
        // SAFETY: every pointer covers its contiguous (b, h, t, d) tensor or the statistics.
        unsafe { kernels.forward_raw(&p) }.unwrap();
        assert_eq!(o, want);
    }
}
