//! gpt-model's one FFI module: every `unsafe` of the crate lives under `src/ffi/` (ARCHITECTURE.md
//! invariant 6; `xtask/tests/tidy.rs` keeps it here). Each C++ file of `csrc/` has its Rust half here,
//! one module per concern, and the safe modules of the crate call only the safe functions below:
//!
//! - [`attention`]: the fused attention inside libtorch's autograd (`csrc/fused_attention.cpp`), for
//!   [`crate::attention::fused`];
//! - [`loss`]: the fused cross-entropy (`csrc/fused_loss.cpp`), for [`crate::loss::cross_entropy`],
//!   whose CPU float32 rows call back into attn-kernels' `cpu::rows`;
//! - [`rope`]: the fused RoPE head split (`csrc/fused_rope.cpp`), for [`crate::model::qkv_heads`];
//! - [`linear`]: the linear layers on AMX tiles (`csrc/fused_linear.cpp`), for [`crate::model`]'s
//!   linears, whose products call back into attn-kernels' `cpu::gemm`;
//! - [`autocast`]: libtorch's CUDA autocast dtype, for [`crate::runtime::Bf16Autocast`].
//!
//! Errors: a Rust callback's error (or a panic, caught: no unwinding crosses `extern "C"`) becomes a
//! Rust-owned string that C++ turns into a `c10::Error`; the C++ entry points catch every exception
//! and return its message as a `malloc`ed string, released by the file's own `free` function.

pub(crate) mod attention;
pub(crate) mod autocast;
pub(crate) mod linear;
pub(crate) mod loss;
pub(crate) mod rope;

use std::ffi::{CStr, CString, c_char};

/// `Err` with the message of a failed C++ entry point, which it then releases with `free`.
///
/// # Safety
/// `err` is what a C++ entry point returned: null, or a NUL-terminated string that the C++ file
/// `malloc`ed and nobody has released; `free` is that file's release function.
unsafe fn bridge_error(err: *mut c_char, free: unsafe extern "C" fn(*mut c_char)) -> Result<(), String> {
    if err.is_null() {
        return Ok(());
    }
    // SAFETY: see the function contract; read before the one release below.
    let msg = unsafe { CStr::from_ptr(err) }.to_string_lossy().into_owned();
    // SAFETY: as above.
    unsafe { free(err) };
    Err(msg)
}

/// A Rust-owned message for C++ (released by [`attention::gpt_model_fused_free_error`]).
fn error_string(msg: String) -> *mut c_char {
    CString::new(msg.replace('\0', " ")).expect("NULs removed").into_raw()
}

/// Runs a callback's body: `Ok` is null, an error or a panic a Rust-owned message.
fn guarded<E: std::fmt::Display>(f: impl FnOnce() -> Result<(), E>) -> *mut c_char {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => error_string(e.to_string()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            error_string(format!("panic in the fused kernel: {what}"))
        }
    }
}
