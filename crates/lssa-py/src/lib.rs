//! `lssa._lssa`: the fused attention kernels of `attn-kernels` for Python, without libtorch.
//!
//! The Python package `lssa` (`python/lssa`) owns the tensors: it checks shapes, dtypes and devices,
//! allocates every output with torch, and calls the functions here with plain numbers. What crosses
//! the boundary, per call:
//!
//! - the variant's name (parsed here by `attn_core`, so any name attn-core accepts works, and every
//!   naming error is attn-core's message);
//! - the device (`"cpu"` or `"cuda"`) and dtype (`"float32"`, `"float16"`, `"bfloat16"`) as strings;
//! - the sizes `(B, H, T, d)`;
//! - each tensor as `(data pointer, batch stride, head stride, row stride)`, strides in elements; the
//!   last axis must be contiguous (the Python side guarantees it), any other stride is read as given,
//!   so `q, k, v` sliced out of a fused `qkv` projection cross without a copy;
//! - the row statistics (`(B, H, T, STATS_PER_ROW)` f32, contiguous) and, for re-weighted variants on
//!   the CPU that will be differentiated, re-weighting's backward helper (`(B, H, T, d + 1)` f32,
//!   contiguous; 0 when not kept) as bare pointers;
//! - on CUDA, the stream the caller ordered the work on (see [`forward`]), and on the CPU the number
//!   of threads (torch's `get_num_threads()`, so `torch.set_num_threads` governs the kernels too). A
//!   decoding step runs on the calling thread's OpenMP team, libtorch's own intra-op threads, where
//!   the process has libgomp (PyTorch's Linux wheels), so that it shares one set of threads with the
//!   model's other operations; longer calls run on a rayon pool of that many threads.
//!
//! These are exactly the fields of [`attn_kernels::Params`], which the raw entry points
//! [`attn_kernels::cpu::forward_raw`] / [`attn_kernels::cuda::forward_raw`] (and `backward_raw`)
//! take: the same struct the libtorch bridge of `gpt-model` fills from C++.
//!
//! Memory: torch allocates and owns every tensor; Rust reads and writes through the pointers only
//! while a call runs, with the GIL released (the Python caller keeps the tensors alive for the
//! call). Nothing here allocates anything `T x T`.
//!
//! Errors: every failure is a Python exception, never a crash: `ValueError` for bad input (sizes, a
//! null pointer, an unknown or malformed variant name, a variant without a fused kernel),
//! `TypeError` for a device or dtype the kernels do not take, `RuntimeError` for a CUDA failure. A
//! panic inside the kernels is caught ([`std::panic::catch_unwind`]) and becomes a `RuntimeError`
//! too, so no unwinding reaches Python.
#![cfg_attr(not(test), warn(clippy::too_many_lines))] // clippy.toml: 120 lines; tests are exempt

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use attn_core::{Bias, Norm, OutputNorm, Scale, Scores, Transform, Variant};
use attn_kernels::cpu;
use attn_kernels::{Dtype, Params, RawTensor};
use attn_kernels::{Error, Prepared, Target, cuda};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One `(B, H, T, d)` tensor as Python passes it: `(data pointer, batch stride, head stride, row
/// stride)`, strides in elements; the last axis is contiguous.
type PyTensor = (usize, usize, usize, usize);

/// The kernels for `device` and `dtype` ([`Target::for_tensors`]), the CUDA kernel choice applied.
fn target(device: &str, dtype: &str) -> Result<Target, String> {
    match Target::for_tensors(device, dtype)? {
        Target::Cuda { dtype, .. } => Ok(Target::Cuda { dtype, kernel: cuda_kernel().map_err(|e| e.to_string())? }),
        cpu => Ok(cpu),
    }
}

/// What the extension knows of a variant name: the parsed variant and its kernels prepared per
/// (target, head dimension) ([`Target::prepare`]).
struct Known {
    variant: Variant,
    prepared: Vec<(Target, usize, Arc<Prepared>)>,
}

/// The names seen so far. Parsed once per name and prepared once per target: a decoding step passes
/// the same name every call, and parsing it took a few microseconds of a step's fixed cost.
fn known() -> std::sync::MutexGuard<'static, HashMap<String, Known>> {
    static KNOWN: OnceLock<Mutex<HashMap<String, Known>>> = OnceLock::new();
    KNOWN.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// The variant of a name, with its parameters checked (attn-core's messages as `ValueError`).
fn parse(name: &str) -> PyResult<Variant> {
    if let Some(k) = known().get(name) {
        return Ok(k.variant.clone());
    }
    let variant: Variant = name.parse().map_err(|e: attn_core::Error| PyValueError::new_err(e.to_string()))?;
    variant.validate().map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut known = known();
    // A bounded cache: names come from code, but a caller looping over generated names must not grow it forever.
    if known.len() >= 256 {
        known.clear();
    }
    known.insert(name.to_string(), Known { variant: variant.clone(), prepared: Vec::new() });
    Ok(variant)
}

/// The kernels of `name` on `target` at head dimension `head_dim`, prepared once (a decoding step's
/// call takes one lock and one lookup).
fn prepared(name: &str, target: &Target, head_dim: usize) -> PyResult<Arc<Prepared>> {
    if let Some(k) = known().get(name)
        && let Some((_, _, p)) = k.prepared.iter().find(|(t, d, _)| t == target && *d == head_dim)
    {
        return Ok(p.clone());
    }
    let variant = parse(name)?;
    let mut known = known();
    let Some(k) = known.get_mut(name) else {
        // Another thread cleared the cache in between: prepare without keeping it.
        return Ok(Arc::new(target.prepare(&variant, head_dim).map_err(kernel_error)?));
    };
    if let Some((_, _, p)) = k.prepared.iter().find(|(t, d, _)| t == target && *d == head_dim) {
        return Ok(p.clone());
    }
    let p = Arc::new(target.prepare(&k.variant, head_dim).map_err(kernel_error)?);
    k.prepared.push((*target, head_dim, p.clone()));
    Ok(p)
}

/// A kernel error as the Python exception of the module's contract.
fn kernel_error(e: Error) -> PyErr {
    match e {
        Error::Cuda(_) => PyRuntimeError::new_err(e.to_string()),
        Error::Input(_) | Error::NotFused { .. } | Error::BadParams(_) => PyValueError::new_err(e.to_string()),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// Runs `f` (a kernel call) with the GIL released; a kernel error or a panic becomes a Python
/// exception.
fn run_detached(py: Python<'_>, f: impl FnOnce() -> attn_kernels::Result<()> + Send) -> PyResult<()> {
    let outcome = py.detach(move || catch_unwind(AssertUnwindSafe(f)));
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(kernel_error(e)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            Err(PyRuntimeError::new_err(format!("panic in the fused kernel: {what}")))
        }
    }
}

/// Rayon pools by thread count, built once each (a model uses one or two counts).
fn pool(threads: usize) -> PyResult<Option<Arc<rayon::ThreadPool>>> {
    if threads == 0 {
        return Ok(None);
    }
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>> = OnceLock::new();
    let mut pools = POOLS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = pools.get(&threads) {
        return Ok(Some(Arc::clone(p)));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("lssa-{i}"))
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start {threads} kernel threads: {e}")))?;
    let p = Arc::new(p);
    pools.insert(threads, Arc::clone(&p));
    Ok(Some(p))
}

/// The pool a decoding step of `threads` threads runs on: 0 (this thread, with helpers from rayon's
/// global pool) when the global pool has `threads` threads, else `threads` (a pool of ours). The
/// global pool is built at the first such call with that call's count (torch's thread count).
fn short_call_threads(threads: usize) -> usize {
    static GLOBAL: OnceLock<usize> = OnceLock::new();
    let global = *GLOBAL.get_or_init(|| {
        // Fails harmlessly if something else in the process built it first: its size is then read.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("lssa-g{i}"))
            .build_global();
        rayon::current_num_threads()
    });
    if threads == 0 || threads == global { 0 } else { threads }
}

/// The CUDA kernel to run: `LSSA_CUDA_KERNEL` (`auto`, or `v1` to `v9` in a build with the `lab`
/// feature), read once by [`cuda::Kernel::from_env`], as bench-cuda's model check reads it; `auto` when
/// unset.
fn cuda_kernel() -> PyResult<cuda::Kernel> {
    static KERNEL: OnceLock<Result<cuda::Kernel, String>> = OnceLock::new();
    KERNEL.get_or_init(|| cuda::Kernel::from_env().map_err(|e| e.to_string())).clone().map_err(PyValueError::new_err)
}

/// The CUDA kernel request the extension runs (`auto`, or the lab version `LSSA_CUDA_KERNEL` names
/// in a wheel built with the `lab` feature); a `ValueError` says why the variable is refused.
#[pyfunction(name = "cuda_kernel")]
fn cuda_kernel_name() -> PyResult<&'static str> {
    Ok(cuda_kernel()?.name())
}

/// A `ValueError` naming the first of `pointers` that is null.
fn non_null(pointers: &[(&str, usize)]) -> PyResult<()> {
    match pointers.iter().find(|(_, ptr)| *ptr == 0) {
        Some((name, _)) => Err(PyValueError::new_err(format!("`{name}` is a null pointer"))),
        None => Ok(()),
    }
}

/// The parameter struct of one call: sizes, `q`, `k`, `v`, `o` and the statistics, after the
/// checks that do not need the memory (sizes >= 1, pointers not null).
fn params(
    shape: (usize, usize, usize, usize),
    (kv_heads, kv_len): (usize, usize),
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    o: PyTensor,
    stats: usize,
    dtype: Dtype,
) -> PyResult<Params> {
    let (batch, heads, seq_len, head_dim) = shape;
    if [batch, heads, seq_len, head_dim, kv_heads, kv_len].contains(&0) {
        return Err(PyValueError::new_err(format!(
            "every size must be >= 1, got (B, H, T, d) = ({batch}, {heads}, {seq_len}, {head_dim}), (H_kv, T_k) = \
             ({kv_heads}, {kv_len})"
        )));
    }
    non_null(&[("q", q.0), ("k", k.0), ("v", v.0), ("out", o.0), ("stats", stats)])?;
    Ok(Params {
        batch,
        heads,
        kv_heads,
        seq_len,
        kv_len,
        head_dim,
        q: raw(q),
        k: raw(k),
        v: raw(v),
        o: raw_mut(o),
        stats: stats as *mut f32,
        rw_aux: std::ptr::null_mut(),
        d_out: attn_kernels::null_input(),
        dq: attn_kernels::null_output(),
        dk: attn_kernels::null_output(),
        dv: attn_kernels::null_output(),
        dtype,
    })
}

fn raw(x: PyTensor) -> RawTensor<*const c_void> {
    RawTensor { ptr: x.0 as *const c_void, strides: [x.1, x.2, x.3] }
}

fn raw_mut(x: PyTensor) -> RawTensor<*mut c_void> {
    RawTensor { ptr: x.0 as *mut c_void, strides: [x.1, x.2, x.3] }
}

/// The stream the CUDA kernels run on is the legacy default stream (`attn_kernels::cuda` takes no
/// stream argument): a caller on another stream must order its work around the call (the Python
/// side does, with events) and pass 0.
fn check_stream(stream: usize) -> PyResult<()> {
    if stream != 0 {
        return Err(PyValueError::new_err(format!(
            "the CUDA kernels run on the legacy default stream (0), got stream {stream:#x}: order the call after your \
             stream's work (torch.cuda.default_stream().wait_stream(s)) and pass 0"
        )));
    }
    Ok(())
}

/// Stage-1 preset names (SPEC section 4), in table order. Any of them takes `+rw<p>`
/// (re-weighting, 1 <= p <= 1024) and some take parameters: see `GRAMMAR`.
#[pyfunction]
fn variants() -> Vec<&'static str> {
    attn_core::variant::STAGE1_NAMES.to_vec()
}

/// The variant's canonical name (attn-core's `Display`: `"lssa+rw15"` stays `"lssa+rw15"`); a
/// `ValueError` with attn-core's message for a name it does not accept.
#[pyfunction]
fn canonical(name: &str) -> PyResult<String> {
    Ok(parse(name)?.to_string())
}

/// The variant as the materialised PyTorch path needs it: a dict of its stage-1 parts
/// (`activation`, `scores`, `scale`, `d_factor`, `bias`, `t_train`, `norm`, `transform`,
/// `output_norm`, `running_max`) and stage 2's `reweight` (`p` or `None`).
#[pyfunction]
fn describe<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    let v = parse(name)?;
    let s = &v.stage1();
    let d = PyDict::new(py);
    d.set_item("name", v.to_string())?;
    d.set_item("activation", s.activation.name())?;
    d.set_item(
        "scores",
        match s.scores {
            Scores::Dot => "dot",
            Scores::Cosine => "cosine",
        },
    )?;
    let (scale, d_factor) = match s.scale {
        Scale::InvSqrtD => ("inv_sqrt_d", None),
        Scale::LssaLog { d_factor } => ("lssa_log", d_factor),
        Scale::LogNOverSqrtD => ("log_n_over_sqrt_d", None),
    };
    d.set_item("scale", scale)?;
    d.set_item("d_factor", d_factor)?;
    let (bias, t_train) = match s.bias {
        Bias::None => ("none", None),
        Bias::LogTrainLen { t_train } => ("log_train_len", t_train),
        Bias::LogRowLen => ("log_row_len", None),
    };
    d.set_item("bias", bias)?;
    d.set_item("t_train", t_train)?;
    d.set_item(
        "norm",
        match s.norm {
            Norm::L1 => "l1",
            Norm::None => "none",
            Norm::DivN => "div_n",
            Norm::DivLen => "div_len",
        },
    )?;
    d.set_item(
        "transform",
        match s.transform {
            Transform::None => "none",
            Transform::Inverse => "inverse",
            Transform::Recentered => "recentered",
            Transform::RecenteredL1 => "recentered_l1",
        },
    )?;
    d.set_item(
        "output_norm",
        match s.output_norm {
            OutputNorm::None => "none",
            OutputNorm::LayerNorm => "layer_norm",
        },
    )?;
    d.set_item("running_max", s.needs_running_max())?;
    d.set_item("reweight", v.reweight())?;
    Ok(d)
}

/// Why `name` does not run fused on `device` in `dtype` at head dimension `head_dim` with values of
/// dimension `value_dim`, or `None` when it does. A `ValueError` for a name attn-core does not accept
/// (that is no reason to fall back: it is an error).
#[pyfunction]
#[pyo3(signature = (name, device, dtype, head_dim = 64, value_dim = None))]
fn not_fused_reason(
    name: &str,
    device: &str,
    dtype: &str,
    head_dim: usize,
    value_dim: Option<usize>,
) -> PyResult<Option<String>> {
    let variant = parse(name)?;
    let target = match target(device, dtype) {
        Ok(t) => t,
        Err(why) => return Ok(Some(why)),
    };
    if value_dim.is_some_and(|dv| dv != head_dim) {
        return Ok(Some("the fused kernels need v to have the head dimension of q and k".into()));
    }
    match target.not_fused_reason(&variant, head_dim) {
        Some(why) => Ok(Some(why)),
        None if matches!(target, Target::Cuda { .. }) => Ok(cuda_unavailable_reason()),
        None => Ok(None),
    }
}

/// Why the CUDA kernels cannot run in this process (no NVRTC, no driver, no device), or `None`.
#[pyfunction]
fn cuda_unavailable_reason() -> Option<String> {
    if let Err(e) = cuda::nvrtc_location() {
        return Some(format!("the CUDA kernels cannot run: {e}"));
    }
    if !cuda::is_available() {
        return Some("the CUDA kernels cannot run: no CUDA driver or device".into());
    }
    None
}

/// Floats per row that re-weighting's backward helper takes at head dimension `head_dim` (`d + 1`).
#[pyfunction]
fn rw_aux_per_row(head_dim: usize) -> usize {
    cpu::rw_aux_per_row(head_dim)
}

/// Fused causal forward: writes `out` and the row statistics (and, on the CPU for a re-weighted
/// variant, the backward helper when `aux` is not 0).
///
/// CUDA: the kernels are queued on the legacy default stream of the GPU holding `q` and not waited
/// for; `stream` must be 0 (see `check_stream`): the Python caller makes the default stream wait for
/// its current stream before the call and its current stream wait for the default one after.
///
/// Safety contract (the Python side keeps it; it cannot be checked here): every pointer addresses
/// live memory of the given sizes and strides on `device` in `dtype` (statistics and helper f32,
/// contiguous), `out`, `stats` and `aux` alias nothing else.
#[pyfunction]
#[pyo3(signature = (variant, device, dtype, shape, kv, q, k, v, out, stats, aux, stream, threads))]
fn forward(
    py: Python<'_>,
    variant: &str,
    device: &str,
    dtype: &str,
    shape: (usize, usize, usize, usize),
    kv: (usize, usize),
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    out: PyTensor,
    stats: usize,
    aux: usize,
    stream: usize,
    threads: usize,
) -> PyResult<()> {
    let mut target = target(device, dtype).map_err(PyTypeError::new_err)?;
    let p = params(shape, kv, q, k, v, out, stats, target.dtype())?;
    // A decoding step starts on this thread (0: no pool of ours): its helpers are the OpenMP team of
    // this thread, libtorch's intra-op pool, where torch has loaded libgomp (its Linux wheels);
    // else tasks spawned into rayon's global pool, when that has the requested thread count
    // (entering a pool would cost more than a step).
    let threads = match &mut target {
        Target::Cpu(opts) if cpu::forward_starts_on_caller(&p) => match cpu::Helpers::openmp(threads) {
            Some(helpers) => {
                opts.helpers = helpers;
                0
            }
            None => short_call_threads(threads),
        },
        _ => threads,
    };
    let kernels = prepared(variant, &target, p.head_dim)?;
    // SAFETY: the module's contract: live tensors of these sizes and strides (see above).
    unsafe { launch(py, kernels, p, aux, stream, threads, Prepared::forward_raw) }
}

/// Fused causal backward: reads `q`, `k`, `v`, `out`, the statistics (and the helper, when the
/// forward kept it) and the upstream gradient `grad`; writes `dq`, `dk`, `dv`. Same stream and
/// safety contract as [`forward`]; `dq`, `dk`, `dv` alias nothing else.
#[pyfunction]
#[pyo3(signature = (variant, device, dtype, shape, kv, q, k, v, out, stats, aux, grad, dq, dk, dv, stream, threads))]
fn backward(
    py: Python<'_>,
    variant: &str,
    device: &str,
    dtype: &str,
    shape: (usize, usize, usize, usize),
    kv: (usize, usize),
    q: PyTensor,
    k: PyTensor,
    v: PyTensor,
    out: PyTensor,
    stats: usize,
    aux: usize,
    grad: PyTensor,
    dq: PyTensor,
    dk: PyTensor,
    dv: PyTensor,
    stream: usize,
    threads: usize,
) -> PyResult<()> {
    let target = target(device, dtype).map_err(PyTypeError::new_err)?;
    let mut p = params(shape, kv, q, k, v, out, stats, target.dtype())?;
    let kernels = prepared(variant, &target, p.head_dim)?;
    non_null(&[("grad", grad.0), ("dq", dq.0), ("dk", dk.0), ("dv", dv.0)])?;
    p.d_out = raw(grad);
    p.dq = raw_mut(dq);
    p.dk = raw_mut(dk);
    p.dv = raw_mut(dv);
    // SAFETY: the module's contract (see `forward`).
    unsafe { launch(py, kernels, p, aux, stream, threads, Prepared::backward_raw) }
}

/// The raw entry point of one direction: [`Prepared::forward_raw`] or [`Prepared::backward_raw`].
type Entry = unsafe fn(&Prepared, &Params) -> attn_kernels::Result<()>;

/// Runs `entry` on the prepared kernels with the GIL released: on the CPU in `threads` threads (0:
/// rayon's global pool) with the re-weighting helper `aux` when the variant keeps one; on CUDA in the
/// chosen kernel generation, after the stream check.
///
/// # Safety
///
/// `p` (and `aux`, when not 0) describe live tensors of the sizes and strides it states, on
/// `target`'s device, as [`forward`] and [`backward`] require of their callers.
#[allow(clippy::too_many_arguments)]
unsafe fn launch(
    py: Python<'_>,
    kernels: Arc<Prepared>,
    mut p: Params,
    aux: usize,
    stream: usize,
    threads: usize,
    entry: Entry,
) -> PyResult<()> {
    // Where the call runs (a thread pool on the CPU, the stream check on CUDA) is the caller's
    // business; which kernels run is `entry`'s, on the prepared target.
    let pool = match kernels.target() {
        Target::Cpu(_) => {
            if aux != 0 && kernels.variant().reweight().is_some() {
                p.rw_aux = aux as *mut f32;
            }
            pool(threads)?
        }
        Target::Cuda { .. } => {
            check_stream(stream)?;
            None
        }
    };
    run_detached(py, move || {
        // SAFETY: forwarded from our caller (host memory on a CPU target, device memory on CUDA).
        let call = || unsafe { entry(&kernels, &p) };
        match pool {
            Some(pool) => pool.install(call),
            None => call(),
        }
    })
}

/// The fused LSSA / LSSAR attention kernels (attn-kernels), called with tensors' pointers and
/// strides; the Python package `lssa` is the interface.
#[pymodule]
fn _lssa(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("STATS_PER_ROW", cpu::STATS_PER_ROW)?;
    m.add("GRAMMAR", attn_core::variant::GRAMMAR)?;
    m.add("MAX_REWEIGHT_POWER", attn_core::stage::MAX_REWEIGHT_POWER)?;
    m.add("L2_NORM_EPS", attn_core::stage::L2_NORM_EPS)?;
    m.add("LAYER_NORM_EPS", attn_core::stage::LAYER_NORM_EPS)?;
    m.add("OFFSET_FREE_ROWS", attn_core::stage::OFFSET_FREE_ROWS)?;
    m.add("CUDA_MAX_HEAD_DIM", cuda::MAX_HEAD_DIM)?;
    m.add_function(wrap_pyfunction!(variants, m)?)?;
    m.add_function(wrap_pyfunction!(canonical, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(not_fused_reason, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_kernel_name, m)?)?;
    m.add_function(wrap_pyfunction!(rw_aux_per_row, m)?)?;
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    Ok(())
}
