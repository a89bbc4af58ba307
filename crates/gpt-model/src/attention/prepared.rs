//! The attention of a model, prepared once: the typed variant, its plan, the implementation, the
//! CUDA kernel choice and the fused kernels' plan per target, which every call of [`super::attend`]
//! reads instead of re-deriving them.

use std::sync::{Arc, OnceLock};

use attn_core::{Plan, Variant};
use attn_kernels::{Prepared, Target, cuda};

use crate::config::AttnImpl;

/// A variant ready to run: parsed and validated, with its [`Plan`] derived once, the implementation
/// that runs it and the CUDA kernels it asks for. [`crate::Gpt`] holds one (and prepares another
/// only for a post-hoc re-weighting power); [`super::attend`] takes it.
#[derive(Clone, Debug)]
pub struct Attention {
    variant: Variant,
    plan: Plan,
    imp: AttnImpl,
    cuda_kernel: cuda::Kernel,
    softmax: bool,
    /// The fused kernels' plan per target (the CPU, CUDA f32, f16, bf16), prepared at its first call
    /// for that call's head dimension: `Err` holds attn-kernels' reason when there is no kernel.
    /// Shared by the clones, so a clone prepares nothing again.
    kernels: Arc<[OnceLock<KernelSlot>; 4]>,
}

/// One target's prepared kernels and the head dimension they were prepared for (`Err`: why there
/// are none).
type KernelSlot = (usize, Result<Arc<Prepared>, String>);

impl Attention {
    /// `variant` run by `imp`, with [`cuda::Kernel::Auto`] on CUDA tensors. Errors when the variant
    /// misses a parameter or has an invalid one.
    pub fn new(variant: Variant, imp: AttnImpl) -> Result<Self, attn_core::Error> {
        let plan = variant.plan()?;
        let softmax = Variant::preset("softmax").is_some_and(|s| s == variant);
        Ok(Self { variant, plan, imp, cuda_kernel: cuda::Kernel::Auto, softmax, kernels: Default::default() })
    }

    /// The same attention with the CUDA kernels `kernel` (a benchmark's or a test's choice; the
    /// lab's versions exist only in a build with attn-kernels' `lab` feature).
    pub fn with_cuda_kernel(self, kernel: cuda::Kernel) -> Self {
        Self { cuda_kernel: kernel, kernels: Default::default(), ..self }
    }

    /// The fused kernels of `target` (this attention's CUDA kernel choice applied) for heads of
    /// `head_dim`, prepared once per target ([`Target::prepare`]); `Err` is why there are none.
    pub fn kernels(&self, target: Target, head_dim: usize) -> Result<Arc<Prepared>, String> {
        let target = target.with_cuda_kernel(self.cuda_kernel);
        let prepare = || {
            target.prepare(&self.variant, head_dim).map(Arc::new).map_err(|e| match e {
                attn_kernels::Error::NotFused { reason, .. } => reason.to_string(),
                other => other.to_string(),
            })
        };
        let slot = match target {
            Target::Cpu(_) => 0,
            Target::Cuda { dtype: cuda::Dtype::F32, .. } => 1,
            Target::Cuda { dtype: cuda::Dtype::F16, .. } => 2,
            Target::Cuda { dtype: cuda::Dtype::Bf16, .. } => 3,
        };
        match self.kernels[slot].get_or_init(|| (head_dim, prepare())) {
            (d, prepared) if *d == head_dim => prepared.clone(),
            _ => prepare(), // another head dimension than the first call's: not cached
        }
    }

    /// The same attention run by `imp`.
    pub fn with_impl(&self, imp: AttnImpl) -> Self {
        Self { imp, ..self.clone() }
    }

    /// The same attention with re-weighting power `p` (post-hoc re-weighting), planned anew.
    pub fn with_reweight(&self, p: u32) -> Result<Self, attn_core::Error> {
        let variant = self.variant.clone().with_reweight(p)?;
        Ok(Self::new(variant, self.imp)?.with_cuda_kernel(self.cuda_kernel))
    }

    /// The variant.
    pub fn variant(&self) -> &Variant {
        &self.variant
    }

    /// Its backend-neutral plan, derived once.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The implementation that runs it.
    pub fn imp(&self) -> AttnImpl {
        self.imp
    }

    /// The CUDA kernels it asks for.
    pub fn cuda_kernel(&self) -> cuda::Kernel {
        self.cuda_kernel
    }

    /// Whether the variant is exactly `softmax` (no parameters, no re-weighting): what libtorch's
    /// SDPA computes.
    pub fn is_softmax(&self) -> bool {
        self.softmax
    }
}
