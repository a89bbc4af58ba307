//! libtorch's CUDA autocast dtype (`csrc/fused_attention.cpp` defines the getter and setter), for
//! [`crate::runtime::Bf16Autocast`].

use std::ffi::c_int;

unsafe extern "C" {
    fn gpt_model_autocast_cuda_dtype() -> c_int;
    fn gpt_model_set_autocast_cuda_dtype(dtype: c_int);
    fn gpt_model_scalar_type_bf16() -> c_int;
}

/// libtorch's CUDA autocast dtype, as the number of its `at::ScalarType` (opaque to Rust).
pub(crate) fn cuda_dtype() -> c_int {
    // SAFETY: reads a libtorch global; no pointers cross.
    unsafe { gpt_model_autocast_cuda_dtype() }
}

/// Sets libtorch's CUDA autocast dtype to a value [`cuda_dtype`] or [`bf16`] returned.
pub(crate) fn set_cuda_dtype(dtype: c_int) {
    // SAFETY: sets a libtorch global to a valid `at::ScalarType` (one libtorch gave us); no pointers cross.
    unsafe { gpt_model_set_autocast_cuda_dtype(dtype) }
}

/// bf16's `at::ScalarType` number.
pub(crate) fn bf16() -> c_int {
    // SAFETY: returns a constant.
    unsafe { gpt_model_scalar_type_bf16() }
}
