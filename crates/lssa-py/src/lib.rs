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
//! - the row statistics (`(B, H, T, STATS_PER_ROW)` f32, contiguous) and re-weighting's backward
//!   helper (`(B, H, T, aux)` f32, contiguous; 0 when not kept) as bare pointers, laid out as
//!   [`layout`] says: the prepared kernels decide both ([`Prepared::aux_per_row`]), the Python side
//!   allocates them;
//! - on CUDA, the stream the caller ordered the work on (see [`forward`]), and on the CPU the number
//!   of threads (torch's `get_num_threads()`, so `torch.set_num_threads` governs the kernels too). A
//!   decoding step runs on the calling thread's OpenMP team, libtorch's own intra-op threads, where
//!   the process has libgomp (PyTorch's Linux wheels), so that it shares one set of threads with the
//!   model's other operations; longer calls run on a rayon pool of that many threads.
//!
//! These are exactly the fields of [`attn_kernels::Params`], which [`Prepared::forward_raw`] /
//! [`Prepared::backward_raw`] take: the same struct the libtorch bridge of `gpt-model` fills from
//! C++. The variant's kernels come from attn-kernels' [`Kernels`] cache, one per variant name, kept
//! in the module's state (`State`), not in a Rust static.
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
use std::sync::{Arc, Mutex};

use attn_core::{Bias, Norm, OutputNorm, Scale, Scores, Transform, Variant};
use attn_kernels::cpu;
use attn_kernels::{Dtype, Params, RawTensor};
use attn_kernels::{Error, Kernels, Prepared, Target, cuda};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// One `(B, H, T, d)` tensor as Python passes it: `(data pointer, batch stride, head stride, row
/// stride)`, strides in elements; the last axis is contiguous.
type PyTensor = (usize, usize, usize, usize);

/// What the extension keeps between calls, owned by the module object (its `_state` attribute, a
/// module's state as PEP 489 means it) rather than by Rust statics: it lives and dies with the
/// module, and a second interpreter's module has its own. Every function that needs it takes the
/// module (`pass_module`).
#[pyclass(frozen)]
struct State {
    /// The variants by name: each parsed once, with its plan and its kernels prepared once per
    /// target and head dimension (attn-kernels' [`Kernels`]; a decoding step passes the same name
    /// every call, and parsing took a few microseconds of a step's fixed cost).
    known: Mutex<HashMap<String, Arc<Kernels>>>,
    /// Rayon thread pools by thread count, built at first use (a model uses one or two counts).
    pools: Mutex<HashMap<usize, Arc<rayon::ThreadPool>>>,
    /// The CUDA kernels to run, read from `LSSA_CUDA_KERNEL` at import ([`cuda::Kernel::from_env`],
    /// as bench-cuda's model check reads it): `auto` when unset; why it is refused otherwise.
    cuda_kernel: Result<cuda::Kernel, String>,
}

/// A bound on the names the state keeps: names come from code, but a caller looping over generated
/// names must not grow it forever.
const MAX_NAMES: usize = 256;

impl State {
    fn new() -> Self {
        let cuda_kernel = cuda::Kernel::from_env().map_err(|e| e.to_string());
        Self { known: Mutex::default(), pools: Mutex::default(), cuda_kernel }
    }

    /// The module's state.
    fn of<'py>(module: &Bound<'py, PyModule>) -> PyResult<Bound<'py, State>> {
        Ok(module.getattr("_state")?.cast_into::<State>()?)
    }

    /// The kernels for `device` and `dtype` ([`Target::for_tensors`]), the CUDA kernel choice applied.
    fn target(&self, device: &str, dtype: &str) -> Result<Target, String> {
        match Target::for_tensors(device, dtype)? {
            gpu @ Target::Cuda { .. } => Ok(gpu.with_cuda_kernel(self.cuda_kernel.clone()?)),
            cpu @ Target::Cpu(_) => Ok(cpu),
        }
    }

    /// The variant of `name`, its parameters checked (attn-core's messages as `ValueError`), with its
    /// kernels' cache.
    fn kernels(&self, name: &str) -> PyResult<Arc<Kernels>> {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = known.get(name) {
            return Ok(Arc::clone(k));
        }
        let variant: Variant = name.parse().map_err(|e: attn_core::Error| PyValueError::new_err(e.to_string()))?;
        variant.validate().map_err(|e| PyValueError::new_err(e.to_string()))?;
        let kernels = Arc::new(Kernels::new(variant).map_err(|e| PyValueError::new_err(e.to_string()))?);
        if known.len() >= MAX_NAMES {
            known.clear();
        }
        known.insert(name.to_string(), Arc::clone(&kernels));
        Ok(kernels)
    }

    /// `name`'s kernels on `target` at head dimension `head_dim` (a kernel refusal as its exception).
    fn prepared(&self, name: &str, target: Target, head_dim: usize) -> PyResult<Arc<Prepared>> {
        self.kernels(name)?.prepared(target, head_dim).map_err(kernel_error)
    }

    /// The rayon pool of `threads` threads, built at its first use (`None` for 0: the caller's pool).
    fn pool(&self, threads: usize) -> PyResult<Option<Arc<rayon::ThreadPool>>> {
        if threads == 0 {
            return Ok(None);
        }
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
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

/// Where a CPU call of `threads` threads runs, set in `target`'s options; returns the module's
/// pool to enter (0: none, the calling thread).
///
/// With libgomp loaded (PyTorch's Linux wheels) every call runs on the OpenMP team of this thread,
/// libtorch's intra-op pool, the threads torch's own operations have just used: a pool of the
/// module's beside it took the cores from libtorch's spinning workers and the other way round (from
/// Python on 2 cores, B = 16, H = 2, T = 64: forward + backward at 2.8x SDPA's time, 2.0x with
/// libgomp's spinning cut, 1.4-1.6x on the team; `docs/bench/python-cpu-notes.md`). Without it, a
/// short call (a decoding step, `short`) starts on this thread with helpers from rayon's global pool
/// when that has `threads` threads (entering a pool would cost more than a step); a longer call runs
/// in a pool of the module's.
fn cpu_threads(target: &mut Target, threads: usize, short: bool) -> usize {
    let Target::Cpu(opts) = target else { return threads };
    match cpu::Helpers::openmp(threads) {
        Some(helpers) => {
            opts.helpers = helpers;
            0
        }
        None if short && (threads == 0 || threads == rayon::current_num_threads()) => 0,
        None => threads,
    }
}

/// The CUDA kernel request the extension runs (`auto`, or the lab version `LSSA_CUDA_KERNEL` names
/// in a wheel built with the `lab` feature); a `ValueError` says why the variable is refused.
#[pyfunction(name = "cuda_kernel", pass_module)]
fn cuda_kernel_name(module: &Bound<'_, PyModule>) -> PyResult<&'static str> {
    State::of(module)?.get().cuda_kernel.clone().map(|k| k.name()).map_err(PyValueError::new_err)
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

/// The built-in activations' names (attn-core's `Builtin::ALL`), in its order: the Python
/// references (`lssa._reference`, the tests' formulas) are tested to cover each.
#[pyfunction]
fn activations() -> Vec<&'static str> {
    attn_core::Builtin::ALL.into_iter().map(attn_core::Builtin::name).collect()
}

/// The variant's canonical name (attn-core's `Display`: `"lssa+rw15"` stays `"lssa+rw15"`); a
/// `ValueError` with attn-core's message for a name it does not accept.
#[pyfunction(pass_module)]
fn canonical(module: &Bound<'_, PyModule>, name: &str) -> PyResult<String> {
    Ok(State::of(module)?.get().kernels(name)?.variant().to_string())
}

/// The variant as the materialised PyTorch path needs it: a dict of its stage-1 parts
/// (`activation`, `scores`, `scale`, `d_factor`, `bias`, `t_train`, `norm`, `transform`,
/// `output_norm`, `running_max`) and stage 2's `reweight` (`p` or `None`).
#[pyfunction(pass_module)]
fn describe<'py>(module: &Bound<'py, PyModule>, name: &str) -> PyResult<Bound<'py, PyDict>> {
    let py = module.py();
    let kernels = State::of(module)?.get().kernels(name)?;
    let v = kernels.variant();
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
#[pyfunction(pass_module)]
#[pyo3(signature = (name, device, dtype, head_dim = 64, value_dim = None))]
fn not_fused_reason(
    module: &Bound<'_, PyModule>,
    name: &str,
    device: &str,
    dtype: &str,
    head_dim: usize,
    value_dim: Option<usize>,
) -> PyResult<Option<String>> {
    let state = State::of(module)?;
    let kernels = state.get().kernels(name)?;
    let target = match state.get().target(device, dtype) {
        Ok(t) => t,
        Err(why) => return Ok(Some(why)),
    };
    if value_dim.is_some_and(|dv| dv != head_dim) {
        return Ok(Some("the fused kernels need v to have the head dimension of q and k".into()));
    }
    match kernels.not_fused_reason(target, head_dim) {
        Some(why) => Ok(Some(why)),
        None if matches!(target, Target::Cuda { .. }) => Ok(cuda_unavailable_reason()),
        None => Ok(None),
    }
}

/// Frees the buffers the CPU kernels keep between calls (packed key and value tiles, the backward's
/// partials: at most 96 MiB, [`attn_kernels::cpu::release_spare_buffers`]); the bytes freed.
#[pyfunction]
fn release_cpu_buffers() -> usize {
    attn_kernels::cpu::release_spare_buffers()
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

/// The buffers a forward of `name` on `device` in `dtype` at head dimension `head_dim` writes beside
/// its output, as floats per row: `(statistics, re-weighting's backward helper)`, the helper's 0
/// when the forward keeps none (it keeps one only when its output will be `differentiable`). The
/// prepared kernels decide ([`Prepared::aux_per_row`]); the Python side allocates what this says.
#[pyfunction(pass_module)]
fn layout(
    module: &Bound<'_, PyModule>,
    name: &str,
    device: &str,
    dtype: &str,
    head_dim: usize,
    differentiable: bool,
) -> PyResult<(usize, usize)> {
    let state = State::of(module)?;
    let target = state.get().target(device, dtype).map_err(PyTypeError::new_err)?;
    let kernels = state.get().prepared(name, target, head_dim)?;
    Ok((kernels.stats_per_row(), kernels.aux_per_row(differentiable)))
}

/// Fused causal forward: writes `out` and the row statistics (and, on the CPU for a re-weighted
/// variant, the backward helper when `aux` is not 0).
///
/// CUDA: the kernels are queued on the legacy default stream of the GPU holding `q` and not waited
/// for; `stream` must be 0 (see `check_stream`): the Python caller makes the default stream wait for
/// its current stream before the call and its current stream wait for the default one after.
///
/// `stats` 0 on the CPU: the caller drops the statistics (eager inference,
/// `lssa._ops.attention_inference`); they go to a buffer of this call, which costs far less than the
/// tensor the caller would allocate (`Tensor.new_empty` took 5 us of a decoding step's 56 on a Zen 1
/// EPYC, a Rust allocation of a step's 48 floats well under one).
///
/// Safety contract (the Python side keeps it; it cannot be checked here): every pointer addresses
/// live memory of the given sizes and strides on `device` in `dtype` (statistics and helper f32,
/// contiguous), `out`, `stats` and `aux` alias nothing else.
#[pyfunction(pass_module)]
#[pyo3(signature = (variant, device, dtype, shape, kv, q, k, v, out, stats, aux, stream, threads))]
fn forward(
    module: &Bound<'_, PyModule>,
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
    let state = State::of(module)?;
    let state = state.get();
    let mut target = state.target(device, dtype).map_err(PyTypeError::new_err)?;
    let mut dropped = Vec::new();
    let stats = match (stats, &target) {
        (0, Target::Cpu(_)) => {
            let (b, h, t, _) = shape;
            let len = [h, t, cpu::STATS_PER_ROW].iter().try_fold(b, |n, &x| n.checked_mul(x));
            dropped = vec![0.0f32; len.ok_or_else(|| PyValueError::new_err(format!("shape {shape:?} overflows")))?];
            dropped.as_mut_ptr() as usize
        }
        _ => stats,
    };
    let p = params(shape, kv, q, k, v, out, stats, target.dtype())?;
    let threads = cpu_threads(&mut target, threads, cpu::forward_starts_on_caller(&p));
    let kernels = state.prepared(variant, target, p.head_dim)?;
    let pool = state.pool(threads)?;
    // SAFETY: the module's contract: live tensors of these sizes and strides (see above); `dropped`,
    // where it holds the statistics, lives to the end of this function, after the call.
    let done = unsafe { launch(module.py(), kernels, p, aux, stream, pool, Prepared::forward_raw) };
    drop(dropped);
    done
}

/// Fused causal backward: reads `q`, `k`, `v`, `out`, the statistics (and the helper, when the
/// forward kept it) and the upstream gradient `grad`; writes `dq`, `dk`, `dv`. Same stream and
/// safety contract as [`forward`]; `dq`, `dk`, `dv` alias nothing else.
#[pyfunction(pass_module)]
#[pyo3(signature = (variant, device, dtype, shape, kv, q, k, v, out, stats, aux, grad, dq, dk, dv, stream, threads))]
fn backward(
    module: &Bound<'_, PyModule>,
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
    let state = State::of(module)?;
    let state = state.get();
    let mut target = state.target(device, dtype).map_err(PyTypeError::new_err)?;
    let mut p = params(shape, kv, q, k, v, out, stats, target.dtype())?;
    let threads = cpu_threads(&mut target, threads, false);
    let kernels = state.prepared(variant, target, p.head_dim)?;
    non_null(&[("grad", grad.0), ("dq", dq.0), ("dk", dk.0), ("dv", dv.0)])?;
    p.d_out = raw(grad);
    p.dq = raw_mut(dq);
    p.dk = raw_mut(dk);
    p.dv = raw_mut(dv);
    let pool = state.pool(threads)?;
    // SAFETY: the module's contract (see `forward`).
    unsafe { launch(module.py(), kernels, p, aux, stream, pool, Prepared::backward_raw) }
}

/// The raw entry point of one direction: [`Prepared::forward_raw`] or [`Prepared::backward_raw`].
type Entry = unsafe fn(&Prepared, &Params) -> attn_kernels::Result<()>;

/// Runs `entry` on the prepared kernels with the GIL released: on the CPU in `pool` (`None`: the
/// calling thread, with the threads its options name, see [`cpu_threads`]) with the re-weighting
/// helper `aux` when the prepared kernels keep one; on CUDA in the chosen kernel generation, after
/// the stream check.
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
    pool: Option<Arc<rayon::ThreadPool>>,
    entry: Entry,
) -> PyResult<()> {
    // Where the call runs (a thread pool on the CPU, the stream check on CUDA) is the caller's
    // business; which kernels run is `entry`'s, on the prepared target.
    let pool = match kernels.target() {
        Target::Cpu(_) => {
            if aux != 0 && kernels.aux_per_row(true) > 0 {
                p.rw_aux = aux as *mut f32;
            }
            pool
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
    m.add("_state", State::new())?;
    m.add("STATS_PER_ROW", cpu::STATS_PER_ROW)?;
    m.add("GRAMMAR", attn_core::variant::GRAMMAR)?;
    m.add("MAX_REWEIGHT_POWER", attn_core::stage::MAX_REWEIGHT_POWER)?;
    m.add("L2_NORM_EPS", attn_core::stage::L2_NORM_EPS)?;
    m.add("LAYER_NORM_EPS", attn_core::stage::LAYER_NORM_EPS)?;
    m.add("OFFSET_FREE_ROWS", attn_core::stage::OFFSET_FREE_ROWS)?;
    m.add("CUDA_MAX_HEAD_DIM", cuda::MAX_HEAD_DIM)?;
    m.add_function(wrap_pyfunction!(variants, m)?)?;
    m.add_function(wrap_pyfunction!(activations, m)?)?;
    m.add_function(wrap_pyfunction!(canonical, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_function(wrap_pyfunction!(not_fused_reason, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(release_cpu_buffers, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_kernel_name, m)?)?;
    m.add_function(wrap_pyfunction!(layout, m)?)?;
    m.add_function(wrap_pyfunction!(forward, m)?)?;
    m.add_function(wrap_pyfunction!(backward, m)?)?;
    Ok(())
}
