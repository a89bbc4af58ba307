//! attn-kernels: fused, streaming implementations of every attention variant of `attn-core` that
//! can be streamed (SPEC section 6): forward and backward in O(T·d) memory, never materialising the
//! `T x T` matrix.
//!
//! - [`cpu`]: f32 kernels, tiled over (batch, head, query tile) with rayon (the caller's pool),
//!   register-tiled micro-kernels and vectorised special functions compiled for AVX-512, AVX2+FMA
//!   and a portable fallback, selected at run time ([`cpu::Isa`]).
//! - [`cuda`]: the same API on NVIDIA GPUs: CUDA C++ compiled at run time by NVRTC (driver and
//!   NVRTC loaded dynamically through `cudarc`, so this crate builds and tests on machines without
//!   CUDA; calls there return [`Error::Cuda`]).
//! - [`Prepared::forward_raw`] / [`Prepared::backward_raw`]: the one entry point on raw pointers
//!   ([`Params`]) for callers that own their tensors (the model's autograd bridge, the Python
//!   extension): a [`Target`] says where the call runs, and [`Kernels`] (a variant with its plan)
//!   prepares the kernels once per target and head dimension ([`Prepared`]).
//!
//! The ground truth is `attn_core`: every kernel is tested against its f64 reference, forward and
//! backward, and reuses its definitions (variant names, per-row scales and biases, re-weighting
//! offsets) rather than restating them. Variants whose rows cannot be streamed (the Table-1
//! transforms `inverse`, `recentered*`) return [`Error::NotFused`]: use `attn_core::forward`.
//!
//! Owns: fused kernels and their tuning. Must never depend on: libtorch (`tch`), or any crate of this
//! workspace except `attn-core`.
//!
//! ```
//! use attn_core::Variant;
//! use ndarray::Array4;
//!
//! let lssar: Variant = "lssa+rw15".parse().unwrap();
//! let q = Array4::<f32>::from_shape_fn((1, 2, 100, 64), |(_, h, t, c)| ((h * 31 + t * 7 + c) % 13) as f32 / 13.0 - 0.5);
//! let out = attn_kernels::cpu::forward(&lssar, &q, &q, &q).unwrap();
//! let reference = attn_core::forward(&lssar, &q, &q, &q).unwrap();
//! let err = (&out - &reference).iter().fold(0.0f32, |m, x| m.max(x.abs()));
//! assert!(err < 1e-4, "max error {err}");
//! ```
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

pub mod cpu;
pub mod cuda;
mod error;
mod params;
mod target;

pub use error::{Error, Grads, Result};
pub use params::{Dtype, Params, RawTensor, null_input, null_output};
pub use target::{Device, Kernels, Prepared, Target};
