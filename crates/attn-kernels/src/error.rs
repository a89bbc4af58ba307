//! What every module of the crate returns: the [`Error`] a kernel can refuse with, its [`Result`],
//! and the [`Grads`] of a backward pass. A leaf: it imports nothing of the crate.

use ndarray::Array4;

/// Everything the kernels can refuse.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad input, reported exactly as attn-core reports it (shapes, sizes, non-finite values, `p`).
    #[error(transparent)]
    Input(#[from] attn_core::Error),
    /// The variant has no fused kernel.
    #[error("variant `{variant}` is not fused ({reason}); use the reference `attn_core::forward` / `backward`")]
    NotFused {
        /// The variant's name.
        variant: String,
        /// Why it cannot be fused.
        reason: std::borrow::Cow<'static, str>,
    },
    /// No usable GPU, driver or NVRTC, or a CUDA call failed (the message says which).
    #[error("CUDA: {0}")]
    Cuda(String),
    /// Invalid raw parameters (tile sizes, pointers).
    #[error("invalid kernel parameters: {0}")]
    BadParams(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Gradients of a scalar loss with respect to `q`, `k`, `v`, each `(B, H, T, d)`.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    /// `dL/dq`.
    pub dq: Array4<f32>,
    /// `dL/dk`.
    pub dk: Array4<f32>,
    /// `dL/dv`.
    pub dv: Array4<f32>,
}
