//! The one typed entry point of the raw kernels: a [`Target`] says where a call runs (the CPU with
//! its options, or CUDA with a dtype and a kernel choice), [`Target::prepare`] derives a variant's
//! kernel plan for it once ([`Prepared`]), and [`Prepared::forward_raw`] / [`Prepared::backward_raw`]
//! run it. Consumers (the model's
//! autograd bridge, the Python extension) build a [`Params`] and a `Target` and keep no CPU/CUDA
//! branching of their own; adding a backend is a `Target` variant and its arm in [`Prepared`].

use attn_core::{Plan, Variant};

use crate::Params;
use crate::cpu;
use crate::cuda;
use crate::{Error, Result};

/// Where a raw call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// The target of tensors on `device` (`"cpu"` or `"cuda"`) with elements `dtype` (`"float32"`,
    /// `"float16"`, `"bfloat16"`, as PyTorch names them), with default options; the error says what
    /// the kernels take instead.
    pub fn for_tensors(device: &str, dtype: &str) -> std::result::Result<Target, String> {
        let cuda = |dtype| Ok(Target::Cuda { dtype, kernel: cuda::Kernel::Auto });
        match (device, dtype) {
            ("cpu", "float32") => Ok(Target::Cpu(cpu::Options::default())),
            ("cpu", other) => Err(format!("the fused CPU kernels take float32 tensors, got {other}")),
            ("cuda", "float32") => cuda(cuda::Dtype::F32),
            ("cuda", "float16") => cuda(cuda::Dtype::F16),
            ("cuda", "bfloat16") => cuda(cuda::Dtype::Bf16),
            ("cuda", other) => {
                Err(format!("the fused CUDA kernels take float32, float16 or bfloat16 tensors, got {other}"))
            }
            (other, _) => Err(format!("no fused kernels for device `{other}` (only cpu and cuda)")),
        }
    }

    /// This target running the CUDA kernels `kernel` (a CPU target is returned unchanged).
    pub fn with_cuda_kernel(self, kernel: cuda::Kernel) -> Target {
        match self {
            Target::Cuda { dtype, .. } => Target::Cuda { dtype, kernel },
            cpu @ Target::Cpu(_) => cpu,
        }
    }

    /// The element type of the tensors this target runs on ([`Params::dtype`]).
    pub fn dtype(&self) -> crate::Dtype {
        match self {
            Target::Cpu(_) => crate::Dtype::F32,
            Target::Cuda { dtype, .. } => *dtype,
        }
    }

    /// Why `variant` at head dimension `head_dim` has no fused kernel on this target, or `None`
    /// when it has one ([`Target::prepare`]'s refusal as a sentence; whether the GPU can run it is
    /// [`cuda::is_available`]'s question).
    pub fn not_fused_reason(&self, variant: &Variant, head_dim: usize) -> Option<String> {
        let device = match self {
            Target::Cpu(_) => "CPU",
            Target::Cuda { .. } => "CUDA",
        };
        match self.prepare(variant, head_dim) {
            Ok(_) => None,
            Err(Error::NotFused { reason, .. }) => Some(format!("no fused {device} kernel: {reason}")),
            Err(e) => Some(e.to_string()),
        }
    }
}

/// A variant prepared for one [`Target`] ([`Target::prepare`]): the kernels' plan derived once (the
/// CPU engine's [`Plan`], or the CUDA kernels' [`cuda::Config`] at one head dimension), so its calls
/// neither parse nor re-plan. Cheap to clone (the plan holds a user's activation by `Arc`).
#[derive(Clone, Debug)]
pub struct Prepared {
    variant: Variant,
    kernels: Kernels,
}

/// What a prepared variant's calls run, with the rest of their target.
#[derive(Clone, Debug)]
enum Kernels {
    /// The CPU engine's plan, and the CPU's options.
    Cpu(Plan, cpu::Options),
    /// The CUDA kernels' configuration, the head dimension it was resolved for, and the tensors'
    /// dtype and the kernel choice.
    Cuda { cfg: cuda::Config, head_dim: usize, dtype: cuda::Dtype, kernel: cuda::Kernel },
}

impl Target {
    /// `variant` prepared for this target at head dimension `head_dim` (the CPU kernels take any),
    /// or [`Error::NotFused`] with the reason it has no kernel here ([`Target::not_fused_reason`]
    /// says the same as a sentence). Whether a GPU can run it is [`cuda::is_available`]'s question.
    pub fn prepare(&self, variant: &Variant, head_dim: usize) -> Result<Prepared> {
        let kernels = match *self {
            Target::Cpu(options) => Kernels::Cpu(cpu::plan(variant)?, options),
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
                Kernels::Cuda { cfg: cuda::Config::new(variant, head_dim.max(1))?, head_dim, dtype, kernel }
            }
        };
        Ok(Prepared { variant: variant.clone(), kernels })
    }
}

impl Prepared {
    /// The variant.
    pub fn variant(&self) -> &Variant {
        &self.variant
    }

    /// The target it was prepared for.
    pub fn target(&self) -> Target {
        match self.kernels {
            Kernels::Cpu(_, options) => Target::Cpu(options),
            Kernels::Cuda { dtype, kernel, .. } => Target::Cuda { dtype, kernel },
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
            match &self.kernels {
                Kernels::Cpu(plan, options) => on_cpu(plan, p, options),
                Kernels::Cuda { cfg, head_dim, dtype, kernel } => {
                    same_head_dim(p, *head_dim)?;
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
    use crate::RawTensor;

    #[test]
    fn targets_are_named_as_frameworks_name_tensors_and_refusals_say_why() {
        assert!(matches!(Target::for_tensors("cpu", "float32"), Ok(Target::Cpu(_))));
        assert!(matches!(
            Target::for_tensors("cuda", "bfloat16"),
            Ok(Target::Cuda { dtype: cuda::Dtype::Bf16, kernel: cuda::Kernel::Auto })
        ));
        assert!(Target::for_tensors("cpu", "float16").unwrap_err().contains("float32"));
        assert!(Target::for_tensors("mps", "float32").unwrap_err().contains("`mps`"));
        let cpu = Target::for_tensors("cpu", "float32").unwrap();
        let gpu = Target::for_tensors("cuda", "float32").unwrap();
        let v = |s: &str| s.parse::<Variant>().unwrap();
        assert_eq!(cpu.not_fused_reason(&v("lssa+rw15"), 64), None);
        assert!(cpu.not_fused_reason(&v("recentered"), 64).unwrap().starts_with("no fused CPU kernel"));
        assert_eq!(gpu.not_fused_reason(&v("lssa"), 64), None);
        assert!(gpu.not_fused_reason(&v("lssa"), 512).unwrap().contains("up to 256"));
        assert!(gpu.not_fused_reason(&v("relu-seqlen"), 64).unwrap().starts_with("no fused CUDA kernel"));
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
            d_out: crate::null_input(),
            dq: crate::null_output(),
            dk: crate::null_output(),
            dv: crate::null_output(),
            dtype: crate::Dtype::F32,
        };
        // Another dtype is refused before anything is read.
        p.dtype = crate::Dtype::Bf16;
        // SAFETY: refused before any pointer is read.
        let kernels = Target::Cpu(cpu::Options::default()).prepare(&v, p.head_dim).unwrap();
        let err = unsafe { kernels.forward_raw(&p) }.unwrap_err();
        assert!(err.to_string().contains("f32"), "{err}");
        p.dtype = crate::Dtype::F32;
        // SAFETY: every pointer covers its contiguous (b, h, t, d) tensor or the statistics.
        unsafe { kernels.forward_raw(&p) }.unwrap();
        assert_eq!(o, want);
    }
}
