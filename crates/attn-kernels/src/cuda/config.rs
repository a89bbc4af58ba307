//! A variant resolved into the kernels' preprocessor macros and constants ([`Config`]), or why it has
//! no CUDA kernel: what every compiled module is specialised on. It uses no other module of `cuda`
//! (`compile` and `plan` use it), so the module graph has no cycle (`xtask/tests/tidy.rs`).

use attn_core::{Bias, Builtin, Norm, OutputNorm, Phi, Plan, Scale, Transform, Variant};

use crate::params::Dtype;
use crate::{Error, Result};

/// A variant resolved into the macros and constants of the kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub(super) act: u32,
    pub(super) norm: u32,
    pub(super) running_max: bool,
    pub(super) signed: bool,
    pub(super) cosine: bool,
    pub(super) p: u32,
    pub(super) scale_c: f32,
    pub(super) scale_log: bool,
    pub(super) bias_c: f32,
    pub(super) bias_log: bool,
}

pub(super) fn not_fused(variant: &Variant, reason: &'static str) -> Error {
    Error::NotFused { variant: variant.to_string(), reason: reason.into() }
}

impl Config {
    /// Resolves `variant` for head dimension `head_dim`, or says why it has no CUDA kernel.
    pub fn new(variant: &Variant, head_dim: usize) -> Result<Self> {
        Self::planned(variant, &variant.plan()?, head_dim)
    }

    /// [`Config::new`] from `variant`'s plan, derived once by its owner ([`crate::Kernels`]).
    pub(crate) fn planned(variant: &Variant, plan: &Plan, head_dim: usize) -> Result<Self> {
        match plan.transform {
            Transform::None => {}
            Transform::Inverse | Transform::Recentered | Transform::RecenteredL1 => {
                return Err(not_fused(variant, "the Table-1 transforms (inverse, recentered) need the whole row"));
            }
        }
        match plan.output_norm {
            OutputNorm::None => {}
            OutputNorm::LayerNorm => {
                return Err(not_fused(variant, "the output layer norm (relu-ln) has no CUDA kernel"));
            }
        }
        // The codes of `ACT` and `NORM` in common.cuh.
        let norm = match plan.norm {
            Norm::L1 => 0,
            Norm::None => 1,
            Norm::DivN => 2,
            Norm::DivLen => {
                return Err(not_fused(variant, "the sequence-length divisor (relu-seqlen) has no CUDA kernel"));
            }
        };
        let act = match plan.phi {
            Phi::Builtin(Builtin::Exp) => 0,
            Phi::Builtin(Builtin::Softplus) => 1,
            Phi::Builtin(Builtin::Relu) => 2,
            Phi::Builtin(Builtin::Relu2) => 3,
            Phi::Builtin(Builtin::Relu6) => 4,
            Phi::Builtin(Builtin::Gelu) => 5,
            Phi::Builtin(Builtin::Sigmoid) => 6,
            Phi::Builtin(Builtin::Mish) => 7,
            Phi::Builtin(Builtin::Identity) => 8,
            Phi::Custom(_) => return Err(not_fused(variant, "user-defined activations have no CUDA kernel")),
        };
        let d = head_dim as f64;
        let (scale_c, scale_log) = match plan.scale {
            Scale::InvSqrtD => (1.0 / d.sqrt(), false),
            Scale::LssaLog { d_factor } => (d_factor.unwrap_or_else(|| d.ln()), true),
            Scale::LogNOverSqrtD => (1.0 / d.sqrt(), true),
        };
        let (bias_c, bias_log) = match plan.bias {
            Bias::None => (0.0, false),
            Bias::LogTrainLen { .. } => (plan.bias.value(1)?, false),
            Bias::LogRowLen => (0.0, true),
        };
        Ok(Self {
            act,
            norm,
            running_max: plan.running_max,
            signed: plan.signed,
            cosine: plan.cosine(),
            p: plan.reweight.unwrap_or(0),
            scale_c: scale_c as f32,
            scale_log,
            bias_c: bias_c as f32,
            bias_log,
        })
    }

    /// The compile-time part: what a compiled module is specialised on.
    /// `generation` is the name of the module's [`Generation`](super::compile::Generation).
    pub(super) fn key(&self, head_dim: usize, dtype: Dtype, generation: &str) -> String {
        format!(
            "act{}-norm{}-max{}-signed{}-cos{}-p{}-hd{}-dt{}-{}",
            self.act,
            self.norm,
            self.running_max as u8,
            self.signed as u8,
            self.cosine as u8,
            self.p,
            head_dim,
            dtype.code(),
            generation
        )
    }
}
