//! A variant resolved into the kernels' preprocessor macros and constants ([`Config`]), or why it has
//! no CUDA kernel: what every compiled module is specialised on. It uses no other module of `cuda`
//! (`compile` and `plan` use it), so the module graph has no cycle (`xtask/tests/tidy.rs`).

use attn_core::{Bias, Builtin, Norm, OutputNorm, Phi, Plan, Scale, Transform, Variant};

use crate::error::{Error, Result};
use crate::params::Dtype;

/// A variant resolved into the macros and constants of the kernels.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub(super) act: DeviceActivation,
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
        // The code of `NORM` in common.cuh.
        let norm = match plan.norm {
            Norm::L1 => 0,
            Norm::None => 1,
            Norm::DivN => 2,
            Norm::DivLen => {
                return Err(not_fused(variant, "the sequence-length divisor (relu-seqlen) has no CUDA kernel"));
            }
        };
        let act = match plan.phi {
            Phi::Builtin(b) => DeviceActivation::of(b),
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
            self.act.code,
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

/// A built-in activation in the kernels: the number `ACT` (which v5 and v7 read to work in log2
/// units for exp and softplus, and a module's cache key) and the CUDA bodies of `act(x)` and
/// `act_grad(x, f)` (f = act(x)) that `common.cuh` wraps (`ACT_BODY`, `ACT_GRAD_BODY`). The one
/// place the kernels define an activation, an exhaustive `match`: a new built-in gets its device
/// code here, where the compiler points.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct DeviceActivation {
    pub(super) code: u32,
    pub(super) body: &'static str,
    pub(super) grad_body: &'static str,
}

impl DeviceActivation {
    fn of(b: Builtin) -> Self {
        let (code, body, grad_body) = match b {
            Builtin::Exp => (0, "return __expf(x);", "return f;"),
            Builtin::Softplus => (1, "return softplus_f(x);", "return sigmoid_f(x);"),
            Builtin::Relu => (2, "return fmaxf(x, 0.f);", "return x > 0.f ? 1.f : 0.f;"),
            Builtin::Relu2 => (3, "return fmaxf(x, 0.f) * fmaxf(x, 0.f);", "return 2.f * fmaxf(x, 0.f);"),
            Builtin::Relu6 => (4, "return fminf(fmaxf(x, 0.f), 6.f);", "return (x > 0.f && x < 6.f) ? 1.f : 0.f;"),
            Builtin::Gelu => (
                5,
                "return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));",
                "return 0.5f * (1.f + erff(x * 0.70710678118654752f)) + x * 0.3989422804014327f * __expf(-0.5f * x * x);",
            ),
            Builtin::Sigmoid => (6, "return sigmoid_f(x);", "return f * (1.f - f);"),
            Builtin::Mish => (
                7,
                "return x * tanh_softplus_f(x);",
                "float t = tanh_softplus_f(x); return t + x * (1.f - t * t) * sigmoid_f(x);",
            ),
            Builtin::Identity => (8, "return x;", "return 1.f;"),
        };
        DeviceActivation { code, body, grad_body }
    }
}
