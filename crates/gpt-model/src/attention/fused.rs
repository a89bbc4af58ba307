//! Fused attention inside libtorch's autograd: whether a call runs fused, asked of attn-kernels'
//! [`Target`], and the call itself through the crate's FFI (the crate's `ffi` module, `csrc/fused_attention.cpp`).
//!
//! The eligibility rules (which devices, dtypes, variants and head dimensions have kernels) and the
//! layout of the statistics (with or without re-weighting's helper) are attn-kernels': [`Target::new`]
//! and [`attn_kernels::Kernels::prepared`], whose cache the model's [`Attention`] holds. This module
//! only maps tch's devices and dtypes onto attn-kernels' and checks the shapes.
//!
//! Errors: a kernel error (or a panic, caught) comes back as [`FusedError::Bridge`]; a failure in the
//! backward surfaces where tch's `backward()` reports libtorch errors.

use attn_kernels::{Dtype, Target, cuda};
use tch::{Device, Kind, Tensor};

use super::Attention;
use crate::ffi::attention::{FusedCall, apply};

/// Why the fused path did not run. [`FusedError::Cuda`], [`FusedError::NotFused`] and
/// [`FusedError::Unsupported`] make the dispatch fall back to the reference; the others are real errors.
#[derive(Debug, thiserror::Error)]
pub enum FusedError {
    /// The tensors are on a GPU and the CUDA kernels cannot run there (no NVRTC, say): the reason.
    #[error("fused CUDA attention unavailable: {0}")]
    Cuda(String),
    /// The variant has no fused kernel here (Table 1-2 transforms; custom activations on CUDA).
    #[error("variant `{variant}` has no fused kernel ({reason})")]
    NotFused {
        /// The variant's name.
        variant: String,
        /// attn-kernels' reason.
        reason: String,
    },
    /// The tensors are not what the kernels take (the CPU needs f32; CUDA takes f32, f16 and bf16).
    #[error("fused attention does not take {0:?} tensors on this device")]
    Unsupported(Kind),
    /// Shapes do not fit.
    #[error("fused attention input: {0}")]
    Shape(String),
    /// An error raised inside the bridge or the kernels.
    #[error("fused attention: {0}")]
    Bridge(String),
}

/// The kernels' target for tensors of `kind` on `device` ([`Target::new`]).
fn target(device: Device, kind: Kind) -> Result<Target, FusedError> {
    let device = match device {
        Device::Cpu => attn_kernels::Device::Cpu,
        Device::Cuda(_) => attn_kernels::Device::Cuda,
        other => return Err(FusedError::Cuda(format!("no fused kernels for {other:?}"))),
    };
    let dtype = match kind {
        Kind::Float => Dtype::F32,
        Kind::Half => Dtype::F16,
        Kind::BFloat16 => Dtype::Bf16,
        _ => return Err(FusedError::Unsupported(kind)),
    };
    Target::new(device, dtype).map_err(|_| FusedError::Unsupported(kind))
}

/// Fused causal attention of `(B, H, T, d)` queries on `(B, H_kv, T_k, d)` keys and values,
/// differentiable through libtorch's autograd: `H` a multiple of `H_kv` (grouped-query attention),
/// `T_k >= T` (the queries are the last `T` rows of the `T_k`-long sequence: a decoding step against
/// a KV cache; on CUDA the SIMT kernels run those).
///
/// On the CPU the output is a `(B, H, T, d)` view of `(B, T, H, d)` rows: `transpose(1, 2)` of it is
/// contiguous, the layout the model's output projection reads.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, att: &Attention) -> Result<Tensor, FusedError> {
    let target = target(q.device(), q.kind())?;
    let head_dim = q.size().last().copied().unwrap_or(1).max(1) as usize;
    let kernels = att
        .kernels(target, head_dim)
        .map_err(|reason| FusedError::NotFused { variant: att.variant().to_string(), reason })?;
    if matches!(target, Target::Cuda { .. }) {
        cuda::nvrtc_location().map_err(|e| FusedError::Cuda(e.to_string()))?;
    }
    for x in [k, v] {
        if x.kind() != q.kind() || x.device() != q.device() {
            return Err(FusedError::Unsupported(x.kind()));
        }
    }
    check_shapes(q, k, v)?;
    // A forward that autograd will differentiate keeps the helper the prepared kernels ask for (a
    // re-weighted CPU forward's, which spares the backward its E_i sweep), in the same buffer as the
    // statistics.
    let aux_per_row = kernels.aux_per_row([q, k, v].iter().any(|x| x.requires_grad()));
    let aux = aux_per_row > 0;
    let per_row = kernels.stats_per_row() + aux_per_row;
    let call = FusedCall { kernels, aux };
    apply(q, k, v, call, per_row).map_err(FusedError::Bridge)
}

/// `Ok` when `q` is `(B, H, T, d)` and `k`, `v` are `(B, H_kv, T_k, d)` with `H` a multiple of
/// `H_kv`, `T_k >= T` and no empty axis.
fn check_shapes(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(), FusedError> {
    let (qs, ks, vs) = (q.size(), k.size(), v.size());
    let fits = qs.len() == 4
        && ks.len() == 4
        && vs == ks
        && ks[0] == qs[0]
        && ks[3] == qs[3]
        && ks[1] > 0
        && qs[1] % ks[1] == 0
        && ks[2] >= qs[2];
    if !fits {
        return Err(FusedError::Shape(format!(
            "q must be (B, H, T, d) and k, v (B, H_kv, T_k, d) with H a multiple of H_kv and T_k >= T, got {qs:?}, \
             {ks:?}, {vs:?}"
        )));
    }
    if qs.contains(&0) {
        return Err(FusedError::Shape(format!("every size must be >= 1, got {qs:?}")));
    }
    Ok(())
}
