//! Fused attention inside libtorch's autograd: the Rust half of the C++ bridge
//! (`csrc/fused_attention.cpp`). The crate's one FFI module: it also declares the fused loss of
//! `csrc/fused_loss.cpp` ([`crate::loss::cross_entropy`], whose CPU float32 rows call back into
//! `gpt_model_loss_*_rows` below and so into attn-kernels' `cpu::rows`) and the fused RoPE head split
//! of `csrc/fused_rope.cpp` ([`crate::model::qkv_heads`]).
//!
//! tch has no custom-autograd API. The C++ file defines a `torch::autograd::Function` whose static
//! forward and backward call back into the `extern "C"` functions below, which run
//! `attn_kernels::forward_raw` / `backward_raw` on an `attn_kernels::Target` (CPU f32 tensors, or CUDA
//! f32, f16, bf16 tensors) on the tensors' memory: the bridge keeps no CPU/CUDA branching of its own. The C++ side
//! allocates every output on the input's device and dtype (row statistics in f32). What crosses the bridge:
//!
//! - Rust -> C++ ([`attention`]): the three `at::Tensor*` of `q`, `k`, `v` (tch's
//!   `Tensor::as_mut_ptr`), a `#[repr(C)]` variant handle (an index into a process-wide registry of
//!   interned [`Variant`]s, so the backward finds the same variant however long after the forward it
//!   runs; which kernels to run, CPU or CUDA and the dtype; whether the helper below is kept), and the
//!   number of statistics per row. The result comes back as a new `at::Tensor*` that Rust owns
//!   (`Tensor::from_ptr`).
//! - C++ -> Rust (callbacks): the handle and one `AttnParams` struct, which is
//!   [`attn_kernels::Params`] field for field (`#[repr(C)]`; the sizes are checked on first use).
//!
//! Ownership: libtorch allocates and owns every tensor (output, `(B, H, T, S)` row statistics,
//! gradients); the callbacks only read and write through the pointers while they run. The autograd
//! context saves `q`, `k`, `v`, the output and the statistics, nothing `T x T`. For a re-weighted
//! variant on the CPU whose inputs require gradients, `S` also counts re-weighting's backward helper
//! ([`Params::rw_aux`], `d + 1` floats per row): the buffer holds the `B·H·T` rows of
//! statistics, then the helper's, and the handle's `aux` tells the callbacks so.
//!
//! CUDA kernels: [`cuda::Kernel::Auto`] unless `LSSA_CUDA_KERNEL` (`auto`, or with the `lab` feature
//! `v1` to `v9`; read at first use by [`cuda::Kernel::from_env`]) or [`set_cuda_kernel`] says otherwise.
//!
//! Errors: a kernel error (or a panic, caught) becomes a heap string returned to C++, which raises a
//! `c10::Error`; [`attention`] gets every C++ exception back as a message ([`FusedError::Bridge`]). A
//! failure in the backward surfaces where tch's `backward()` reports libtorch errors.

use std::ffi::{CStr, CString, c_char, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use attn_core::Variant;
use attn_kernels::Params;
use attn_kernels::cpu;
use attn_kernels::cuda;
use tch::{Device, Kind, Tensor};

/// Why the fused path did not run. [`FusedError::Cuda`], [`FusedError::NotFused`] and
/// [`FusedError::Unsupported`] make the dispatch fall back to the reference; the others are real errors.
#[derive(Debug, thiserror::Error)]
pub enum FusedError {
    /// The tensors are on a GPU and the CUDA kernels cannot run there (no NVRTC, say): the reason.
    #[error("fused CUDA attention unavailable: {0}")]
    Cuda(String),
    /// The variant has no fused kernel (Table 1-2 transforms, custom activations are fine).
    #[error("variant `{variant}` has no fused kernel")]
    NotFused {
        /// The variant's name.
        variant: String,
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

unsafe extern "C" {
    fn gpt_model_fused_apply(
        q: *mut c_void,
        k: *mut c_void,
        v: *mut c_void,
        handle: *const VariantHandle,
        stats_per_row: i64,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn gpt_model_bridge_free(msg: *mut c_char);
    fn gpt_model_bridge_params_size() -> usize;
    fn gpt_model_bridge_handle_size() -> usize;
    fn gpt_model_autocast_cuda_bf16();
    // csrc/fused_loss.cpp
    fn gpt_model_cross_entropy(logits: *const c_void, targets: *const c_void, out: *mut *mut c_void) -> *mut c_char;
    fn gpt_model_loss_free_error(msg: *mut c_char);
    // csrc/fused_rope.cpp
    fn gpt_model_qkv_heads(
        qkv: *const c_void,
        cos: *const c_void,
        sin: *const c_void,
        heads: i64,
        out: *mut *mut c_void,
    ) -> *mut c_char;
    fn gpt_model_rope_free_error(msg: *mut c_char);
}

/// `Err` with the message of a failed bridge call, which it then releases with `free`.
///
/// # Safety
/// `err` is what a bridge call returned: null, or a NUL-terminated string that the C++ file `malloc`ed
/// and nobody has released; `free` is that file's release function.
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

/// [`crate::model::qkv_heads`]'s call into `csrc/fused_rope.cpp`: `(q, k, v)`, each `(B, T, H, hd)`.
pub(crate) fn qkv_heads(qkv: &Tensor, cos: &Tensor, sin: &Tensor, heads: i64) -> Result<[Tensor; 3], String> {
    let mut out: [*mut c_void; 3] = [std::ptr::null_mut(); 3];
    // SAFETY: the three pointers are live `at::Tensor`s for the call; on success the bridge writes
    // three newly allocated tensors to `out`.
    let err = unsafe {
        gpt_model_qkv_heads(qkv.as_ptr().cast(), cos.as_ptr().cast(), sin.as_ptr().cast(), heads, out.as_mut_ptr())
    };
    // SAFETY: `err` is the call's result, released nowhere else.
    unsafe { bridge_error(err, gpt_model_rope_free_error) }?;
    // SAFETY: each entry is a new `at::Tensor*` that nobody else owns.
    Ok(out.map(|t| unsafe { Tensor::from_ptr(t.cast()) }))
}

/// [`crate::loss::cross_entropy`]'s call into `csrc/fused_loss.cpp`.
pub(crate) fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor, String> {
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: both pointers are live `at::Tensor`s for the call; on success the bridge writes a newly
    // allocated tensor to `out`.
    let err = unsafe { gpt_model_cross_entropy(logits.as_ptr().cast(), targets.as_ptr().cast(), &mut out) };
    // SAFETY: `err` is the call's result, released nowhere else.
    unsafe { bridge_error(err, gpt_model_loss_free_error) }?;
    // SAFETY: `out` is a new `at::Tensor*` that nobody else owns.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

/// Sets libtorch's CUDA autocast dtype to bf16 ([`crate::runtime::use_bf16_autocast`]); this module
/// holds the crate's FFI declarations (`csrc/fused_attention.cpp` defines this one too).
pub(crate) fn autocast_cuda_bf16() {
    // SAFETY: sets a libtorch global; no pointers cross.
    unsafe { gpt_model_autocast_cuda_bf16() }
}

/// Interned variants; a handle is an index. Models use a handful of variants, so this stays tiny.
fn registry() -> &'static Mutex<Vec<Variant>> {
    static R: OnceLock<Mutex<Vec<Variant>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// The registry index of `variant`. Equal variants share one entry, except that a user's activation
/// is only shared with the same instance (two users' activations may share a name).
fn intern(variant: &Variant) -> u32 {
    let same = |v: &Variant| {
        v == variant
            && (variant.stage1().activation.builtin().is_some()
                || Arc::ptr_eq(&v.stage1().activation, &variant.stage1().activation))
    };
    let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
    let i = match r.iter().position(same) {
        Some(i) => i,
        None => {
            r.push(variant.clone());
            r.len() - 1
        }
    };
    u32::try_from(i).expect("fewer than 2^32 distinct variants in one process")
}

fn lookup(index: u32) -> Option<Variant> {
    registry().lock().unwrap_or_else(|e| e.into_inner()).get(index as usize).cloned()
}

fn check_layout() -> Result<(), FusedError> {
    // SAFETY: plain functions returning sizeof of the C structs.
    let (params, handle) = unsafe { (gpt_model_bridge_params_size(), gpt_model_bridge_handle_size()) };
    for (c_name, c_size, rust_name, rust_size) in [
        ("AttnParams", params, "attn_kernels::Params", std::mem::size_of::<Params>()),
        ("VariantHandle", handle, "VariantHandle", std::mem::size_of::<VariantHandle>()),
    ] {
        if c_size != rust_size {
            return Err(FusedError::Bridge(format!(
                "{c_name} is {c_size} bytes in C++ but {rust_name} is {rust_size} bytes in Rust"
            )));
        }
    }
    Ok(())
}

/// Whether [`attention`] would run `variant` fused for tensors on `device` of `kind` (else the
/// dispatch uses the reference).
pub fn supports(variant: &Variant, device: Device, kind: Kind) -> bool {
    match device {
        Device::Cpu => kind == Kind::Float && cpu::is_fused(variant),
        Device::Cuda(_) => cuda_dtype(kind).is_some() && cuda::Config::new(variant, 64).is_ok() && cuda::is_available(),
        _ => false,
    }
}

fn cuda_dtype(kind: Kind) -> Option<cuda::Dtype> {
    match kind {
        Kind::Float => Some(cuda::Dtype::F32),
        Kind::Half => Some(cuda::Dtype::F16),
        Kind::BFloat16 => Some(cuda::Dtype::Bf16),
        _ => None,
    }
}

/// What the bridge hands back to the callbacks (`VariantHandle` in `csrc/fused_attention.cpp`, field
/// for field; the sizes are checked on first use): plain fields, no packed bits. Opaque outside
/// this module; public only because the callbacks that take it are.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VariantHandle {
    /// Index into the registry of interned variants.
    variant: u32,
    /// Which kernels: 0 for the CPU, `1 + i` for CUDA tensors of [`CUDA_TARGETS`]`[i]`.
    target: u32,
    /// 1 when the CPU statistics buffer also holds re-weighting's backward helper
    /// ([`Params::rw_aux`]) after the statistics, else 0.
    aux: u32,
}

/// The CUDA dtypes in the order of their [`VariantHandle::target`] codes (after the CPU's 0).
const CUDA_TARGETS: [cuda::Dtype; 3] = [cuda::Dtype::F32, cuda::Dtype::F16, cuda::Dtype::Bf16];

impl VariantHandle {
    fn new(variant: &Variant, dtype: Option<cuda::Dtype>, aux: bool) -> Self {
        let target = dtype.map_or(0, |dt| {
            1 + CUDA_TARGETS.iter().position(|&d| d == dt).expect("every CUDA dtype has a target code") as u32
        });
        VariantHandle { variant: intern(variant), target, aux: u32::from(aux) }
    }

    /// The CUDA dtype (`None`: CPU tensors), or the unknown target code.
    fn dtype(&self) -> Result<Option<cuda::Dtype>, u32> {
        match self.target {
            0 => Ok(None),
            t => CUDA_TARGETS.get(t as usize - 1).map(|&d| Some(d)).ok_or(t),
        }
    }
}

/// The kernels' parameters of a callback: the bridge's, plus, for a call whose handle has `aux` set
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

/// Fused causal attention of `(B, H, T, d)` queries on `(B, H_kv, T_k, d)` keys and values,
/// differentiable through libtorch's autograd: `H` a multiple of `H_kv` (grouped-query attention),
/// `T_k >= T` (the queries are the last `T` rows of the `T_k`-long sequence: a decoding step against
/// a KV cache; on CUDA the SIMT kernels run those).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, variant: &Variant) -> Result<Tensor, FusedError> {
    let dtype = match q.device() {
        Device::Cpu => {
            if !cpu::is_fused(variant) {
                return Err(FusedError::NotFused { variant: variant.to_string() });
            }
            None
        }
        Device::Cuda(_) => {
            if cuda::Config::new(variant, q.size().last().copied().unwrap_or(64).max(1) as usize).is_err() {
                return Err(FusedError::NotFused { variant: variant.to_string() });
            }
            if let Err(e) = cuda::nvrtc_location() {
                return Err(FusedError::Cuda(e.to_string()));
            }
            Some(cuda_dtype(q.kind()).ok_or(FusedError::Unsupported(q.kind()))?)
        }
        other => return Err(FusedError::Cuda(format!("no fused kernels for {other:?}"))),
    };
    for x in [q, k, v] {
        let ok = match dtype {
            None => x.kind() == Kind::Float,
            Some(_) => x.kind() == q.kind() && x.device() == q.device(),
        };
        if !ok {
            return Err(FusedError::Unsupported(x.kind()));
        }
    }
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
    variant.validate().map_err(|e| FusedError::Bridge(e.to_string()))?;
    static LAYOUT: OnceLock<Result<(), String>> = OnceLock::new();
    LAYOUT.get_or_init(|| check_layout().map_err(|e| e.to_string())).clone().map_err(FusedError::Bridge)?;

    // A re-weighted CPU forward that autograd will differentiate keeps the helper that spares the
    // backward its E_i sweep: d + 1 more floats per row, in the same buffer as the statistics.
    let aux = dtype.is_none() && variant.reweight().is_some() && [q, k, v].iter().any(|x| x.requires_grad());
    let per_row = cpu::STATS_PER_ROW + if aux { cpu::rw_aux_per_row(qs[3] as usize) } else { 0 };
    let handle = VariantHandle::new(variant, dtype, aux);
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: the three pointers are live `at::Tensor*` owned by `q`, `k`, `v` for the call, and
    // `handle` lives on this stack for the call; the bridge only reads them and writes a freshly
    // allocated tensor to `out`.
    let err = unsafe {
        gpt_model_fused_apply(
            q.as_ptr().cast_mut().cast(),
            k.as_ptr().cast_mut().cast(),
            v.as_ptr().cast_mut().cast(),
            &handle,
            per_row as i64,
            &mut out,
        )
    };
    // SAFETY: `err` is the call's result, released nowhere else.
    unsafe { bridge_error(err, gpt_model_bridge_free) }.map_err(FusedError::Bridge)?;
    // SAFETY: `out` is a new `at::Tensor*` that nobody else owns.
    Ok(unsafe { Tensor::from_ptr(out.cast()) })
}

fn error_string(msg: String) -> *mut c_char {
    CString::new(msg.replace('\0', " ")).expect("NULs removed").into_raw()
}

/// Runs `f` for a callback on the handle's variant, kernel target and helper flag: `Ok` is null, an
/// error or a panic a Rust-owned message.
fn callback(
    handle: VariantHandle,
    f: impl FnOnce(&Variant, &attn_kernels::Target, bool) -> attn_kernels::Result<()>,
) -> *mut c_char {
    let Some(variant) = lookup(handle.variant) else {
        return error_string(format!("unknown variant in handle {handle:?}"));
    };
    let target = match handle.dtype() {
        Ok(None) => attn_kernels::Target::Cpu(cpu::Options::default()),
        Ok(Some(dtype)) => match cuda_kernel() {
            Ok(kernel) => attn_kernels::Target::Cuda { dtype, kernel },
            Err(e) => return error_string(e.to_string()),
        },
        Err(_) => return error_string(format!("unknown kernel target in handle {handle:?}")),
    };
    let aux = handle.aux != 0;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&variant, &target, aux))) {
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

/// The CUDA kernel the bridge runs, once set or read from `LSSA_CUDA_KERNEL`.
static CUDA_KERNEL: Mutex<Option<cuda::Kernel>> = Mutex::new(None);

/// Makes the bridge run `kernel` on CUDA tensors from now on, whatever `LSSA_CUDA_KERNEL` says.
pub fn set_cuda_kernel(kernel: cuda::Kernel) {
    *CUDA_KERNEL.lock().unwrap_or_else(|e| e.into_inner()) = Some(kernel);
}

/// The CUDA kernel of the bridge: [`set_cuda_kernel`]'s, else `LSSA_CUDA_KERNEL`'s, else `Auto`.
pub fn cuda_kernel() -> attn_kernels::Result<cuda::Kernel> {
    let mut k = CUDA_KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = *k {
        return Ok(k);
    }
    let chosen = cuda::Kernel::from_env()?;
    *k = Some(chosen);
    Ok(chosen)
}

/// Forward callback: writes `o` and the row statistics.
///
/// # Safety
/// `handle` points to a valid `VariantHandle` and `p` to a valid `AttnParams` whose forward pointers
/// are valid (the bridge allocates them).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpt_model_fused_forward(handle: *const VariantHandle, p: *const Params) -> *mut c_char {
    // SAFETY: see the function contract; `Params` and `VariantHandle` are the C structs' layouts (checked).
    callback(unsafe { *handle }, |variant, target, aux| unsafe {
        attn_kernels::forward_raw(variant, &with_helper(&*p, aux), target)
    })
}

/// Backward callback: writes `dq`, `dk`, `dv`.
///
/// # Safety
/// `handle` points to a valid `VariantHandle` and `p` to a valid `AttnParams` whose every pointer is
/// valid (the bridge allocates them).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpt_model_fused_backward(handle: *const VariantHandle, p: *const Params) -> *mut c_char {
    // SAFETY: see the function contract.
    callback(unsafe { *handle }, |variant, target, aux| unsafe {
        attn_kernels::backward_raw(variant, &with_helper(&*p, aux), target)
    })
}

/// Releases an error string returned by a callback.
///
/// # Safety
/// `msg` must come from a callback above (a `CString::into_raw`), released once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gpt_model_fused_free_error(msg: *mut c_char) {
    if !msg.is_null() {
        // SAFETY: see the function contract.
        drop(unsafe { CString::from_raw(msg) });
    }
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
