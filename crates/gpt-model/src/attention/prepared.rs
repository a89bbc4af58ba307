//! The attention of a model, prepared once: the typed variant, its plan, the implementation, the
//! CUDA kernel choice and the fused kernels' plan per target, which every call of [`super::attend`]
//! reads instead of re-deriving them.

use std::sync::Arc;

use attn_core::{Plan, Variant};
use attn_kernels::{Kernels, Prepared, Target, cuda};

use crate::config::AttnImpl;

/// A variant ready to run: parsed and validated, with its [`Plan`] derived once and its fused
/// kernels prepared once per target and head dimension (attn-kernels' [`Kernels`], whose plan this
/// is), the implementation that runs it and the CUDA kernels it asks for. [`crate::Gpt`] holds one
/// (and prepares another only for a post-hoc re-weighting power); [`super::attend`] takes it.
#[derive(Clone, Debug)]
pub struct Attention {
    /// The variant, its plan and its prepared kernels, shared by the clones (a clone prepares
    /// nothing again).
    kernels: Arc<Kernels>,
    imp: AttnImpl,
    cuda_kernel: cuda::Kernel,
    softmax: bool,
}

impl Attention {
    /// `variant` run by `imp`, with [`cuda::Kernel::Auto`] on CUDA tensors. Errors when the variant
    /// misses a parameter or has an invalid one.
    pub fn new(variant: Variant, imp: AttnImpl) -> Result<Self, attn_core::Error> {
        let softmax = Variant::preset("softmax").is_some_and(|s| s == variant);
        let kernels = Arc::new(Kernels::new(variant)?);
        Ok(Self { kernels, imp, cuda_kernel: cuda::Kernel::Auto, softmax })
    }

    /// The same attention with the CUDA kernels `kernel` (a benchmark's or a test's choice; the
    /// lab's versions exist only in a build with attn-kernels' `lab` feature).
    pub fn with_cuda_kernel(self, kernel: cuda::Kernel) -> Self {
        Self { cuda_kernel: kernel, ..self }
    }

    /// The fused kernels of `target` (this attention's CUDA kernel choice applied) for heads of
    /// `head_dim`, prepared once per pair ([`Kernels::prepared`]); `Err` is why there are none.
    pub fn kernels(&self, target: Target, head_dim: usize) -> Result<Arc<Prepared>, String> {
        self.kernels.prepared(target.with_cuda_kernel(self.cuda_kernel), head_dim).map_err(|e| match e {
            attn_kernels::Error::NotFused { reason, .. } => reason.to_string(),
            other => other.to_string(),
        })
    }

    /// The same attention run by `imp`.
    pub fn with_impl(&self, imp: AttnImpl) -> Self {
        Self { imp, ..self.clone() }
    }

    /// The same attention with re-weighting power `p` (post-hoc re-weighting), planned anew.
    pub fn with_reweight(&self, p: u32) -> Result<Self, attn_core::Error> {
        let variant = self.variant().clone().with_reweight(p)?;
        Ok(Self::new(variant, self.imp)?.with_cuda_kernel(self.cuda_kernel))
    }

    /// The variant.
    pub fn variant(&self) -> &Variant {
        self.kernels.variant()
    }

    /// Its backend-neutral plan, derived once.
    pub fn plan(&self) -> &Plan {
        self.kernels.plan()
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
