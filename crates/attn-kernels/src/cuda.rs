//! CUDA kernels, with the same API as [`crate::cpu`]. Not written yet (CUDA issue): every entry point
//! returns [`Error::BuiltWithoutCuda`] so callers can already be written against it.

use ndarray::{Array4, AsArray, Ix4};

use attn_core::Variant;

use crate::{Error, Grads, Result};

/// Whether CUDA kernels are available in this build and on this machine (always `false` for now).
pub fn is_available() -> bool {
    false
}

/// Fused causal attention on the GPU; see [`crate::cpu::forward`].
pub fn forward<'a>(
    _variant: &Variant,
    _q: impl AsArray<'a, f32, Ix4>,
    _k: impl AsArray<'a, f32, Ix4>,
    _v: impl AsArray<'a, f32, Ix4>,
) -> Result<Array4<f32>> {
    Err(Error::BuiltWithoutCuda)
}

/// Gradients on the GPU; see [`crate::cpu::backward`].
pub fn backward<'a>(
    _variant: &Variant,
    _q: impl AsArray<'a, f32, Ix4>,
    _k: impl AsArray<'a, f32, Ix4>,
    _v: impl AsArray<'a, f32, Ix4>,
    _d_out: impl AsArray<'a, f32, Ix4>,
) -> Result<Grads> {
    Err(Error::BuiltWithoutCuda)
}

/// Raw-pointer forward on device memory; see [`crate::cpu::forward_raw`].
///
/// # Safety
/// As [`crate::cpu::forward_raw`], with device pointers.
pub unsafe fn forward_raw(_variant: &Variant, _p: &crate::cpu::Params) -> Result<()> {
    Err(Error::BuiltWithoutCuda)
}

/// Raw-pointer backward on device memory; see [`crate::cpu::backward_raw`].
///
/// # Safety
/// As [`crate::cpu::backward_raw`], with device pointers.
pub unsafe fn backward_raw(_variant: &Variant, _p: &crate::cpu::Params) -> Result<()> {
    Err(Error::BuiltWithoutCuda)
}
