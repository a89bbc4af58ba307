//! The fused attention inside libtorch's autograd: the Rust half of `csrc/fused_attention.cpp`.
//!
//! tch has no custom-autograd API. The C++ file defines a `torch::autograd::Function` whose static
//! forward and backward call back into the `extern "C"` functions below, which run
//! `attn_kernels::Prepared::forward_raw` / `backward_raw` of the call's prepared kernels over the
//! tensors' memory. What crosses:
//!
//! - Rust -> C++ ([`apply`]): the three `at::Tensor*` of `q`, `k`, `v`, one boxed [`FusedCall`] (the
//!   variant prepared for the kernels' target, with the model's CUDA kernel choice, and whether the
//!   helper below is kept) as an opaque pointer that C++ owns from then on, and the number of statistics per row.
//!   The node keeps the call for its lifetime (a `CallRef` in its saved data) and releases it through
//!   [`gpt_model_fused_release`], so the backward, however long after the forward it runs, sees the
//!   forward's variant and target, and nothing is registered process-wide. The result comes back as
//!   a new `at::Tensor*` that Rust owns (`Tensor::from_ptr`).
//! - C++ -> Rust (callbacks): the call and one `AttnParams` struct, which is [`attn_kernels::Params`]
//!   field for field (`#[repr(C)]`; the sizes are compared on first use).
//!
//! Ownership: libtorch allocates and owns every tensor (output, `(B, H, T, S)` row statistics,
//! gradients); the callbacks only read and write through the pointers while they run. The autograd
//! context saves `q`, `k`, `v`, the output and the statistics, nothing `T x T`. For a re-weighted
//! variant on the CPU whose inputs require gradients, `S` also counts re-weighting's backward helper
//! ([`Params::rw_aux`], `d + 1` floats per row): the buffer holds the `B·H·T` rows of statistics,
//! then the helper's, and [`FusedCall::aux`] tells the callbacks so.

use std::cell::Cell;
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

use std::sync::Arc;

use attn_kernels::{Params, Prepared, cpu};
use tch::Tensor;

unsafe extern "C" {
    fn gpt_model_fused_apply(
        q: *mut c_void,
        k: *mut c_void,
        v: *mut c_void,
        call: *mut c_void,
        stats_per_row: i64,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn gpt_model_bridge_free(msg: *mut c_char);
    fn gpt_model_bridge_params_size() -> usize;
}

/// What one fused attention node needs in its forward and in its backward. C++ owns it from
/// [`apply`] on, for the node's lifetime.
#[derive(Debug)]
pub(crate) struct FusedCall {
    /// The variant prepared for the tensors' target (the CPU, or CUDA with their dtype and the model's
    /// kernel choice), shared with the model that prepared it once.
    pub(crate) kernels: Arc<Prepared>,
    /// The CPU statistics buffer also holds re-weighting's backward helper ([`Params::rw_aux`]) after
    /// the `B·H·T` rows of statistics.
    pub(crate) aux: bool,
}

/// The fused attention of `q`, `k`, `v` as one autograd node running `call`, with `stats_per_row`
/// f32 statistics per row. The tensors' devices, dtypes and shapes are the caller's to check.
pub(crate) fn apply(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    call: FusedCall,
    stats_per_row: usize,
) -> Result<Tensor, String> {
    static LAYOUT: OnceLock<Result<(), String>> = OnceLock::new();
    LAYOUT.get_or_init(check_layout).clone()?;
    let call = Box::into_raw(Box::new(call));
    LIVE_CALLS.with(|n| n.set(n.get() + 1));
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the three pointers are live `at::Tensor*` owned by `q`, `k`, `v` for the call; `call`
    // is a fresh box whose ownership passes to the bridge, which releases it through
    // `gpt_model_fused_release` exactly once (also when it fails); the bridge writes a freshly
    // allocated tensor to `out`.
    let err = unsafe {
        gpt_model_fused_apply(
            q.as_ptr().cast_mut().cast(),
            k.as_ptr().cast_mut().cast(),
            v.as_ptr().cast_mut().cast(),
            call.cast(),
            stats_per_row as i64,
            &mut out,
        )
    };
    // SAFETY: `err` is the call's result, released nowhere else.
    unsafe { super::bridge_error(err, gpt_model_bridge_free) }?;
    // SAFETY: `out` is a new `at::Tensor*` that nobody else owns.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

fn check_layout() -> Result<(), String> {
    // SAFETY: a plain function returning sizeof of the C struct.
    let c_size = unsafe { gpt_model_bridge_params_size() };
    let rust_size = std::mem::size_of::<Params>();
    if c_size != rust_size {
        return Err(format!(
            "AttnParams is {c_size} bytes in C++ but attn_kernels::Params is {rust_size} bytes in Rust"
        ));
    }
    Ok(())
}

/// The kernels' parameters of a callback: the bridge's, plus, for a call with [`FusedCall::aux`]
/// (CPU calls only), the helper, which lives after the `B·H·T` rows of statistics in the buffer the
/// bridge allocated for both.
fn with_helper(p: &Params, aux: bool) -> Params {
    if !aux {
        return *p;
    }
    let rows = p.batch * p.heads * p.seq_len;
    // SAFETY (of the pointer arithmetic): the bridge allocated `rows * (STATS_PER_ROW +
    // rw_aux_per_row(d))` floats at `p.stats` for such a call.
    Params { rw_aux: p.stats.wrapping_add(rows * cpu::STATS_PER_ROW), ..*p }
}

/// Forward callback: writes `o` and the row statistics.
///
/// # Safety
/// `call` is the live call the bridge owns, and `p` points to a valid `AttnParams` whose forward
/// pointers are valid (the bridge allocates them).
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn gpt_model_fused_forward(call: *const FusedCall, p: *const Params) -> *mut c_char {
    // SAFETY: see the function contract; `Params` is the C struct's layout (checked).
    let (call, p) = unsafe { (&*call, &*p) };
    // SAFETY: as above.
    super::guarded(|| unsafe { call.kernels.forward_raw(&with_helper(p, call.aux)) })
}

/// Backward callback: writes `dq`, `dk`, `dv`.
///
/// # Safety
/// As [`gpt_model_fused_forward`], for every pointer of `p`.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn gpt_model_fused_backward(call: *const FusedCall, p: *const Params) -> *mut c_char {
    // SAFETY: see the function contract.
    let (call, p) = unsafe { (&*call, &*p) };
    // SAFETY: as above.
    super::guarded(|| unsafe { call.kernels.backward_raw(&with_helper(p, call.aux)) })
}

/// Releases the call [`apply`] handed over, when its node dies (or its `apply` failed).
///
/// # Safety
/// `call` comes from [`apply`]'s box and is released once, after its last callback.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn gpt_model_fused_release(call: *mut FusedCall) {
    if !call.is_null() {
        // SAFETY: see the function contract.
        drop(unsafe { Box::from_raw(call) });
        LIVE_CALLS.with(|n| n.set(n.get() - 1));
    }
}

thread_local! {
    /// Calls handed over by this thread minus calls released on it: what the tests read to see that
    /// a node releases its call when it dies (on the CPU the graph is freed on the thread that drops
    /// its last tensor).
    static LIVE_CALLS: Cell<isize> = const { Cell::new(0) };
}

/// Releases an error string returned by a callback.
///
/// # Safety
/// `msg` must come from a callback above (a `CString::into_raw`), released once.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn gpt_model_fused_free_error(msg: *mut c_char) {
    if !msg.is_null() {
        // SAFETY: see the function contract.
        drop(unsafe { std::ffi::CString::from_raw(msg) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn live() -> isize {
        LIVE_CALLS.with(Cell::get)
    }

    #[test]
    fn a_node_owns_its_call_until_it_dies_and_an_inference_call_is_released_at_once() {
        let variant: attn_core::Variant = "lssa+rw15".parse().unwrap();
        let target = attn_kernels::Target::Cpu(cpu::Options::default());
        let kernels = attn_kernels::Kernels::new(variant).unwrap().prepared(target, 8).unwrap();
        let x = crate::model::with_seed(3, || Tensor::randn([1, 2, 9, 8], (Kind::Float, Device::Cpu)));
        let per_row = cpu::STATS_PER_ROW;
        let call = |aux| FusedCall { kernels: kernels.clone(), aux };
        let before = live();
        // No autograd: the context dies inside `apply`.
        drop(apply(&x, &x, &x, call(false), per_row).unwrap());
        assert_eq!(live(), before);
        // Autograd: the node keeps its call through the backward, until its graph is freed.
        let q = x.detach().set_requires_grad(true);
        let out = apply(&q, &x, &x, call(true), per_row + cpu::rw_aux_per_row(8)).unwrap();
        assert_eq!(live(), before + 1);
        out.sum(Kind::Float).backward();
        assert!(q.grad().abs().sum(Kind::Float).double_value(&[]) > 0.0, "the backward ran with its call");
        drop(out);
        assert_eq!(live(), before, "the node released its call with its graph");
    }
}
