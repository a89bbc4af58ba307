//! The fused RoPE head split of `csrc/fused_rope.cpp`, for [`crate::model::qkv_heads`].

use std::ffi::{c_char, c_void};

use tch::Tensor;

unsafe extern "C" {
    fn gpt_model_qkv_heads(
        qkv: *const c_void,
        cos: *const c_void,
        sin: *const c_void,
        heads: i64,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn gpt_model_rope_free_error(msg: *mut c_char);
}

/// `(q, k, v)`, each `(B, T, H, hd)`, of the fused `(B, T, 3 d)` projection, `q` and `k` rotated.
pub(crate) fn qkv_heads(qkv: &Tensor, cos: &Tensor, sin: &Tensor, heads: i64) -> Result<[Tensor; 3], String> {
    let mut out: [*mut c_void; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: the three pointers are live `at::Tensor`s for the call; on success the bridge writes
    // three newly allocated tensors to `out`.
    let err = unsafe {
        gpt_model_qkv_heads(qkv.as_ptr().cast(), cos.as_ptr().cast(), sin.as_ptr().cast(), heads, out.as_mut_ptr())
    };
    // SAFETY: `err` is the call's result, released nowhere else.
    unsafe { super::bridge_error(err, gpt_model_rope_free_error) }?;
    // SAFETY: each entry is a new `at::Tensor*` that nobody else owns.
    Ok(out.map(|t| unsafe { Tensor::from_ptr(t.cast()) }))
}
