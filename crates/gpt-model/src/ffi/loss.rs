//! The fused cross-entropy of `csrc/fused_loss.cpp`, for [`crate::loss::cross_entropy`]: the entry
//! point, and the row callbacks its CPU float32 path makes into attn-kernels' `cpu::rows`.

use std::ffi::{c_char, c_void};

use attn_kernels::cpu;
use tch::Tensor;

unsafe extern "C" {
    fn gpt_model_cross_entropy(logits: *const c_void, targets: *const c_void, out: *mut *mut c_void) -> *mut c_char;
    fn gpt_model_loss_free_error(msg: *mut c_char);
}

/// Mean cross-entropy of `logits` `(N, V)` against `targets` `(N,)` as one autograd node.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor, String> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: both pointers are live `at::Tensor`s for the call; on success the bridge writes a newly
    // allocated tensor to `out`.
    let err = unsafe { gpt_model_cross_entropy(logits.as_ptr().cast(), targets.as_ptr().cast(), &mut out) };
    // SAFETY: `err` is the call's result, released nowhere else.
    unsafe { super::bridge_error(err, gpt_model_loss_free_error) }?;
    // SAFETY: `out` is a new `at::Tensor*` that nobody else owns.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// The fused cross-entropy's forward rows (`csrc/fused_loss.cpp`): `lse[r]` = the log-sum-exp of
/// row `r` of `x` (`v` floats from `x + r * stride`), for `r < rows`.
///
/// # Safety
/// `x` points to `rows` readable rows of `v` floats `stride` apart, `lse` to `rows` writable floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpt_model_loss_logsumexp_rows(
    x: *const f32,
    rows: usize,
    v: usize,
    stride: usize,
    lse: *mut f32,
) {
    let isa = cpu::Isa::detect();
    for r in 0..rows {
        // SAFETY: see the function contract.
        let row = unsafe { std::slice::from_raw_parts(x.add(r * stride), v) };
        // SAFETY: as above.
        unsafe { *lse.add(r) = cpu::rows::logsumexp(isa, row) };
    }
}

/// The fused cross-entropy's backward rows: row `r` of `grad` (`v` contiguous floats from
/// `grad + r * v`) = `softmax(x[r]) * scale`, minus `scale` at `targets[r]` (skipped if outside `0..v`,
/// which the forward's `gather` has already refused).
///
/// # Safety
/// As [`gpt_model_loss_logsumexp_rows`], plus `lse` and `targets` hold `rows` readable values and
/// `grad` `rows * v` writable floats that overlap nothing else.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpt_model_loss_grad_rows(
    x: *const f32,
    rows: usize,
    v: usize,
    stride: usize,
    lse: *const f32,
    targets: *const i64,
    scale: f32,
    grad: *mut f32,
) {
    let isa = cpu::Isa::detect();
    for r in 0..rows {
        // SAFETY: see the function contract.
        let (row, out, lse, target) = unsafe {
            (
                std::slice::from_raw_parts(x.add(r * stride), v),
                std::slice::from_raw_parts_mut(grad.add(r * v), v),
                *lse.add(r),
                *targets.add(r),
            )
        };
        cpu::rows::softmax_scaled(isa, row, lse, scale, out);
        if let Some(g) = usize::try_from(target).ok().and_then(|t| out.get_mut(t)) {
            *g -= scale;
        }
    }
}
