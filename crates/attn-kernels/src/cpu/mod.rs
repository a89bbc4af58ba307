//! Fused CPU attention: the public entry points (ndarray and raw pointers), input checks, the
//! rayon work split (the backward's in `bwd`); the streaming maths is in [`engine`](self) (its
//! backward in `grad`) and the vector code in `tile`, `act` and `math`.
//!
//! Thread count: the kernels run on the caller's rayon pool (`pool.install(|| forward(..))`);
//! they spawn no threads of their own. Scratch: per task, a few tiles (`O(block · d)`), and for
//! re-weighting's two sweeps a `block_q x T` stripe of activations within
//! [`Tuning::score_cache_bytes`]; per call,
//! `B·H·T` row statistics, `2·B·H·T` inverse norms for cosine variants, and in the backward one
//! `T x d` `dq` partial per (head, key chunk). Nothing is `T x T`.

pub(crate) mod act;
mod bwd;
pub(crate) mod decode;
pub(crate) mod engine;
pub(crate) mod fwd;
pub(crate) mod grad;
pub mod isa;
// The vectorised special functions and their measured error bounds: the lab's (public with the `lab`
// feature); the kernels use a few of them.
#[cfg(feature = "lab")]
pub mod math;
#[cfg(not(feature = "lab"))]
#[allow(dead_code)] // the lab's functions and bounds that only its tests and benches read
pub(crate) mod math;
pub mod rows;
pub(crate) mod short;
pub(crate) mod team;
pub(crate) mod tile;

use ndarray::{Array4, ArrayView4, AsArray, Ix4};
use rayon::prelude::*;

use attn_core::{OutputNorm, Plan, Transform, Variant};

use bwd::backward_f32;
pub use engine::Tuning;
use engine::{Dims, Head, STATS};
use fwd::{FwdScratch, Query};
pub use isa::Isa;
pub use team::Helpers;

use crate::{Dtype, Error, Grads, Params, RawTensor, Result};

/// Number of f32 statistics per row that [`forward_raw`] saves for [`backward_raw`].
pub const STATS_PER_ROW: usize = STATS;

/// Floats per row of [`Params::rw_aux`] at head dimension `head_dim`: `c_i` and `y_i`.
pub const fn rw_aux_per_row(head_dim: usize) -> usize {
    head_dim + 1
}

/// Execution options: tile sizes, the instruction set and where a decoding step's helpers come
/// from. Defaults: [`Tuning::default`], [`Isa::detect`] and [`Helpers::Rayon`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Tile sizes.
    pub tuning: Tuning,
    /// The instruction set to run (tests force [`Isa::Scalar`] to cover the fallback).
    pub isa: Isa,
    /// The threads of a short call (a decoding step, at most 4 query rows);
    /// longer calls run on the caller's rayon pool whatever this says.
    pub helpers: Helpers,
}

impl Default for Options {
    fn default() -> Self {
        Self { tuning: Tuning::default(), isa: Isa::detect(), helpers: Helpers::Rayon }
    }
}

/// [`Params`] with its pointers typed `f32`, which is all the CPU kernels take: what every function
/// below reads. Made once per call by [`F32Params::new`], which refuses another dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) struct F32Params {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) seq_len: usize,
    pub(crate) kv_len: usize,
    pub(crate) head_dim: usize,
    pub(crate) q: RawTensor<*const f32>,
    pub(crate) k: RawTensor<*const f32>,
    pub(crate) v: RawTensor<*const f32>,
    pub(crate) o: RawTensor<*mut f32>,
    pub(crate) stats: *mut f32,
    pub(crate) rw_aux: *mut f32,
    pub(crate) d_out: RawTensor<*const f32>,
    pub(crate) dq: RawTensor<*mut f32>,
    pub(crate) dk: RawTensor<*mut f32>,
    pub(crate) dv: RawTensor<*mut f32>,
}

// SAFETY: plain data, as `Params`.
unsafe impl Send for F32Params {}
// SAFETY: as above.
unsafe impl Sync for F32Params {}

impl F32Params {
    /// The key head that query head `h` reads.
    fn kv_head(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }

    fn new(p: &Params) -> Result<Self> {
        if p.dtype != Dtype::F32 {
            return Err(Error::BadParams(format!("the CPU kernels take f32 tensors, got {:?}", p.dtype)));
        }
        p.check_kv()?;
        Ok(Self {
            batch: p.batch,
            heads: p.heads,
            kv_heads: p.kv_heads,
            seq_len: p.seq_len,
            kv_len: p.kv_len,
            head_dim: p.head_dim,
            q: p.q.cast(),
            k: p.k.cast(),
            v: p.v.cast(),
            o: p.o.cast_mut(),
            stats: p.stats,
            rw_aux: p.rw_aux,
            d_out: p.d_out.cast(),
            dq: p.dq.cast_mut(),
            dk: p.dk.cast_mut(),
            dv: p.dv.cast_mut(),
        })
    }
}

/// A raw pointer that may cross rayon tasks; every task touches disjoint rows.
#[derive(Clone, Copy)]
struct SendPtr<P>(P);
// SAFETY: the raw entry points' contract makes every task write disjoint rows and only read inputs.
unsafe impl<P> Send for SendPtr<P> {}
// SAFETY: as above.
unsafe impl<P> Sync for SendPtr<P> {}

fn not_fused(variant: &Variant, reason: &'static str) -> Error {
    Error::NotFused { variant: variant.to_string(), reason: reason.into() }
}

/// The variant's plan, or why the engine does not stream it. Every activation runs: the built-ins
/// in vector code, a user's through its own f64 methods.
pub(crate) fn plan(variant: &Variant) -> Result<Plan> {
    let plan = variant.plan()?;
    check_fused(variant, &plan)?;
    Ok(plan)
}

/// `Ok` when the CPU kernels run `plan` (`variant`'s), else [`Error::NotFused`] with the reason.
pub(crate) fn check_fused(variant: &Variant, plan: &Plan) -> Result<()> {
    match plan.transform {
        Transform::None => {}
        Transform::Inverse | Transform::Recentered | Transform::RecenteredL1 => {
            return Err(not_fused(variant, "the Table-1 transforms (inverse, recentered) need the whole row"));
        }
    }
    match (plan.output_norm, plan.reweight) {
        (OutputNorm::LayerNorm, Some(_)) => {
            Err(not_fused(variant, "re-weighting before an output layer norm is not fused"))
        }
        (OutputNorm::LayerNorm, None) | (OutputNorm::None, _) => Ok(()),
    }
}

/// Whether the forward of `p` is a short call (a decoding step: at most 4 query rows), which starts
/// on the calling thread: alone when it reads at most 1 MiB of keys and values, else with helpers
/// spawned into the calling thread's rayon pool (the global pool off any pool) that join as they wake.
/// A caller that would `install` such a call into a pool of its own can call it directly instead when
/// that pool's thread count is the global pool's: handing a job to a pool and waiting for it took
/// 40 us and more on a 2-core VM once its workers slept, more than a 1K-key step's work.
pub fn forward_starts_on_caller(p: &Params) -> bool {
    F32Params::new(p).is_ok_and(|p| p.seq_len <= short::DIRECT_MAX_ROWS)
}

/// Whether `variant` runs fused on the CPU (else use the attn-core reference).
pub fn is_fused(variant: &Variant) -> bool {
    plan(variant).is_ok()
}

fn dims(p: &F32Params, tuning: Tuning, isa: Isa) -> Result<Dims> {
    if tuning.block_q == 0 || tuning.block_k == 0 {
        return Err(Error::BadParams(format!("tile sizes must be >= 1, got {tuning:?}")));
    }
    Ok(Dims {
        isa: isa.assert_supported(),
        t: p.kv_len,
        off: p.kv_len - p.seq_len,
        d: p.head_dim,
        group: 1,
        bq: tuning.block_q,
        bk: tuning.block_k,
        cache_bytes: tuning.score_cache_bytes,
        in_range: false, // set once the norms are known (`engine::scores_in_range`)
    })
}

/// The `(b, h)` head of a raw tensor as a slice covering its `T` rows.
///
/// # Safety
/// `x` must be valid for reads of `T` rows of `d` elements at the given strides.
unsafe fn head_slice<'a>(x: RawTensor<*const f32>, b: usize, h: usize, t: usize, d: usize) -> (&'a [f32], usize) {
    let ld = x.strides[2];
    // SAFETY: the caller guarantees the rows exist; the span covers rows 0..t.
    let s = unsafe { std::slice::from_raw_parts(x.ptr.add(b * x.strides[0] + h * x.strides[1]), (t - 1) * ld + d) };
    (s, ld)
}

/// Which key norms [`inverse_norms`] computes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyNorms {
    /// Every key's, as the packed scores take them.
    Packed,
    /// Every key's, as a short call's forward takes them with its dot products
    /// ([`short::inv_norms_short`]): the backward of a short call.
    Short,
}

/// Inverse L2 norms of every `q` and `k` row (cosine variants): `(B·H, T_q)` for the queries, then
/// `(B·H_kv, T_k)` for the keys. (A short forward takes its keys' norms with its dot products.)
unsafe fn inverse_norms(p: &F32Params, isa: Isa, cosine: bool, keys: KeyNorms) -> Vec<f32> {
    let (tq, tk, d) = (p.seq_len, p.kv_len, p.head_dim);
    if !cosine {
        return Vec::new();
    }
    let mut out = vec![0.0f32; p.batch * (p.heads * tq + p.kv_heads * tk)];
    let (qn, kn) = out.split_at_mut(p.batch * p.heads * tq);
    let one = |x: RawTensor<*const f32>, heads: usize, t: usize, dst: &mut [f32], short: bool| {
        let x = SendPtr(x);
        dst.par_chunks_mut(t).enumerate().for_each(|(i, buf)| {
            // Capture the whole SendPtr (not its raw-pointer field) in the closure.
            #[allow(clippy::redundant_locals)]
            let x = x;
            // SAFETY: forwarded from the caller of the raw entry point.
            let (xs, ld) = unsafe { head_slice(x.0, i / heads, i % heads, t, d) };
            if short {
                short::inv_norms_short(isa, xs, ld, t, d, buf);
            } else {
                engine::inv_norms(isa, xs, ld, t, d, buf);
            }
        });
    };
    one(p.q, p.heads, tq, qn, false);
    one(p.k, p.kv_heads, tk, kn, keys == KeyNorms::Short);
    out
}

/// Every key head's key tiles (when `keys`) and value tiles (when `values`) packed for the score
/// products: `(B·H_kv, packed_len)` each. `O(B·H_kv·T_k·d)`, the size of the input.
///
/// # Safety
/// As [`forward_raw`].
unsafe fn pack(p: &F32Params, dims: Dims, keys: bool, values: bool) -> (Vec<f32>, Vec<f32>) {
    let (bh, t, d) = (p.batch * p.kv_heads, p.kv_len, p.head_dim);
    let len = engine::packed_len(dims);
    let one = |x: RawTensor<*const f32>| -> Vec<f32> {
        let mut out = vec![0.0f32; bh * len];
        let x = SendPtr(x);
        out.par_chunks_mut(len).enumerate().for_each(|(i, dst)| {
            // Capture the whole SendPtr (not its raw-pointer field) in the closure.
            #[allow(clippy::redundant_locals)]
            let x = x;
            // SAFETY: forwarded from the caller of the raw entry point.
            let (src, ld) = unsafe { head_slice(x.0, i / p.kv_heads, i % p.kv_heads, t, d) };
            engine::pack_head(src, ld, dims, dst);
        });
        out
    };
    (if keys { one(p.k) } else { Vec::new() }, if values { one(p.v) } else { Vec::new() })
}

/// # Safety
/// As [`forward_raw`]; `packed` from [`pack`] for the same call.
unsafe fn head<'a>(
    p: &F32Params,
    norms: &'a [f32],
    packed: &'a (Vec<f32>, Vec<f32>),
    dims: Dims,
    b: usize,
    h: usize,
) -> Head<'a> {
    let (tq, tk, d, hk) = (p.seq_len, p.kv_len, p.head_dim, p.kv_head(h));
    // SAFETY: forwarded.
    let ((q, ldq), (k, ldk), (v, ldv)) =
        unsafe { (head_slice(p.q, b, h, tq, d), head_slice(p.k, b, hk, tk, d), head_slice(p.v, b, hk, tk, d)) };
    let (inq, ink) = if norms.is_empty() {
        (&[][..], &[][..])
    } else {
        let xq = (b * p.heads + h) * tq;
        let xk = p.batch * p.heads * tq + (b * p.kv_heads + hk) * tk;
        // Empty key norms: the scores take them with their dot products (a short forward).
        (&norms[xq..xq + tq], norms.get(xk..xk + tk).unwrap_or(&[]))
    };
    let len = engine::packed_len(dims);
    let x = b * p.kv_heads + hk;
    let kt = if packed.0.is_empty() { &[][..] } else { &packed.0[x * len..(x + 1) * len] };
    let vt = if packed.1.is_empty() { &[][..] } else { &packed.1[x * len..(x + 1) * len] };
    Head { q, k, v, ldq, ldk, ldv, inq, ink, kt, vt }
}

/// Writes `rows` (row-major, `d` wide) to rows `[i0, ..)` of head `(b, h)` of `x`.
///
/// # Safety
/// `x` must be valid for writes there, and no other thread may write those rows.
unsafe fn write_rows(x: RawTensor<*mut f32>, b: usize, h: usize, i0: usize, d: usize, rows: &[f32]) {
    for (r, row) in rows.chunks_exact(d).enumerate() {
        // SAFETY: see the function contract.
        unsafe {
            let dst = x.ptr.add(b * x.strides[0] + h * x.strides[1] + (i0 + r) * x.strides[2]);
            std::ptr::copy_nonoverlapping(row.as_ptr(), dst, d);
        }
    }
}

/// Fused forward on raw pointers: writes `o` and the row statistics.
///
/// # Safety
/// Every pointer in `p` used by the forward (`q`, `k`, `v`, `o`, `stats`) must be valid for the
/// sizes and strides given, rows of `d` contiguous elements; `o` and `stats` must not alias anything
/// else. Shapes are not checked here (the ndarray API checks them); `T >= 1`, `d >= 1`.
pub unsafe fn forward_raw(variant: &Variant, p: &Params, opts: &Options) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { forward_f32(plan(variant)?, &F32Params::new(p)?, opts) }
}

/// [`forward_raw`] of a variant whose plan [`Kernels`](crate::Kernels) derived.
///
/// # Safety
/// As [`forward_raw`].
pub(crate) unsafe fn forward_planned(plan: &Plan, p: &Params, opts: &Options) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { forward_f32(plan.clone(), &F32Params::new(p)?, opts) }
}

/// [`forward_raw`] on typed pointers.
///
/// # Safety
/// As [`forward_raw`].
unsafe fn forward_f32(plan: Plan, p: &F32Params, opts: &Options) -> Result<()> {
    let mut dims = dims(p, opts.tuning, opts.isa)?;
    let (bh, t, d) = (p.batch * p.heads, p.seq_len, p.head_dim);
    let isa = opts.isa.assert_supported();
    // A few query rows (a decoding step) read K as it is, once per key head, for both the keys'
    // norms and the scores (`decode`); more pack it once per call.
    let direct = p.seq_len <= short::DIRECT_MAX_ROWS;
    let aux = if plan.reweight.is_some() { p.rw_aux } else { std::ptr::null_mut() };
    if direct {
        // SAFETY: forwarded from our caller.
        unsafe { decode::forward(&plan, p, dims, opts.tuning.split_keys, opts.helpers, aux) };
        return Ok(());
    }
    // SAFETY: forwarded from our caller.
    let norms = unsafe { inverse_norms(p, isa, plan.cosine(), KeyNorms::Packed) };
    dims.in_range = engine::scores_in_range(&plan, &norms, p.kv_len, d);
    // SAFETY: forwarded.
    let packed = unsafe { pack(p, dims, true, false) };
    if p.kv_heads < p.heads {
        // SAFETY: forwarded.
        unsafe { decode::forward_grouped(&plan, p, dims, &norms, &packed.0, aux) };
        return Ok(());
    }
    let nqt = t.div_ceil(dims.bq);
    let (o, stats) = (SendPtr(p.o), SendPtr(p.stats));
    let aux = SendPtr(aux);
    let scratch = PerThread::new();
    (0..bh * nqt).into_par_iter().for_each(|task| {
        scratch.with(
            || (FwdScratch::new(dims, dims.bq), fwd::Sweeps::new(), vec![0.0f32; dims.bq * d]),
            |(sc, sweeps, out)| {
                // Capture the whole SendPtr (not its raw-pointer field) in the closure.
                #[allow(clippy::redundant_locals)]
                let (o, stats, aux) = (o, stats, aux);
                let QueryTask { x, b, h, i0, nq } = QueryTask::new(task, p, dims);
                // SAFETY: forwarded; this task alone writes rows [i0, i0 + nq) of head (b, h).
                unsafe {
                    let hd = head(p, &norms, &packed, dims, b, h);
                    let st = std::slice::from_raw_parts_mut(stats.0.add((x * t + i0) * STATS), nq * STATS);
                    let w = rw_aux_per_row(d);
                    let ax =
                        (!aux.0.is_null()).then(|| std::slice::from_raw_parts_mut(aux.0.add((x * t + i0) * w), nq * w));
                    let q = Query { plan: &plan, head: &hd, dims, i0, nq };
                    fwd::forward_tile(isa, &q, sc, sweeps, &mut out[..nq * d], st, ax);
                    write_rows(o.0, b, h, i0, d, &out[..nq * d]);
                }
            },
        )
    });
    Ok(())
}

/// A task of the forward or of the backward's row phase: query tile `task % nqt` of head
/// `x = task / nqt` (batch `b`, head `h`), rows `[i0, i0 + nq)`.
struct QueryTask {
    x: usize,
    b: usize,
    h: usize,
    i0: usize,
    nq: usize,
}

impl QueryTask {
    fn new(task: usize, p: &F32Params, dims: Dims) -> Self {
        let nqt = p.seq_len.div_ceil(dims.bq);
        let (x, qt) = (task / nqt, task % nqt);
        let i0 = qt * dims.bq;
        Self { x, b: x / p.heads, h: x % p.heads, i0, nq: dims.bq.min(p.seq_len - i0) }
    }
}

/// One scratch per worker thread of the current rayon pool, made on first use and kept for the
/// call. `for_each_init` makes one per rayon split instead, many per call, and re-weighting's
/// scratch holds a score cache of up to 16 MiB: after the first such block is freed, glibc serves
/// the later ones from its heap (its dynamic mmap threshold) and keeps them, so LSSAR's peak memory
/// at T = 65536 rose from 50 to 75 MiB when faster kernels changed the splits (`bench-kernels memory`).
struct PerThread<S> {
    slots: Vec<std::sync::Mutex<Option<S>>>,
}

impl<S> PerThread<S> {
    fn new() -> Self {
        Self { slots: (0..rayon::current_num_threads()).map(|_| std::sync::Mutex::new(None)).collect() }
    }

    /// Runs `f` on this thread's scratch (made by `make` on first use). Off the pool, or should the
    /// thread's slot be in use (a task that re-enters rayon), `f` gets a scratch of its own.
    fn with<R>(&self, make: impl FnOnce() -> S, f: impl FnOnce(&mut S) -> R) -> R {
        let slot = rayon::current_thread_index().and_then(|i| self.slots.get(i)).and_then(|m| m.try_lock().ok());
        match slot {
            Some(mut held) => f(held.get_or_insert_with(make)),
            None => f(&mut make()),
        }
    }
}

/// Fused backward on raw pointers: reads `q`, `k`, `v`, `o`, `stats` (from [`forward_raw`]) and
/// `d_out`; writes `dq`, `dk`, `dv`.
///
/// # Safety
/// As [`forward_raw`], for every pointer of `p`; `dq`, `dk`, `dv` must not alias anything else.
pub unsafe fn backward_raw(variant: &Variant, p: &Params, opts: &Options) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { backward_f32(plan(variant)?, &F32Params::new(p)?, opts) }
}

/// [`backward_raw`] of a variant whose plan [`Kernels`](crate::Kernels) derived.
///
/// # Safety
/// As [`backward_raw`].
pub(crate) unsafe fn backward_planned(plan: &Plan, p: &Params, opts: &Options) -> Result<()> {
    // SAFETY: forwarded.
    unsafe { backward_f32(plan.clone(), &F32Params::new(p)?, opts) }
}

fn raw<P>(ptr: P, x: &ArrayView4<'_, f32>) -> RawTensor<P> {
    let s = x.strides();
    RawTensor { ptr, strides: [s[0] as usize, s[1] as usize, s[2] as usize] }
}

fn raw_mut(x: &mut Array4<f32>) -> RawTensor<*mut f32> {
    let s = x.strides().to_vec();
    RawTensor { ptr: x.as_mut_ptr(), strides: [s[0] as usize, s[1] as usize, s[2] as usize] }
}

/// Checks inputs exactly as attn-core's [`forward`](attn_core::forward) does (same typed errors:
/// queries that continue a sequence and grouped-query attention included), plus what only the
/// kernels need.
fn check(
    variant: &Variant,
    q: &ArrayView4<'_, f32>,
    k: &ArrayView4<'_, f32>,
    v: &ArrayView4<'_, f32>,
    d_out: Option<&ArrayView4<'_, f32>>,
) -> Result<()> {
    attn_core::reference::check_inputs_cached(variant, q, k, v, d_out)?;
    if v.shape()[3] != q.shape()[3] {
        return Err(Error::NotFused {
            variant: variant.to_string(),
            reason: "the fused kernels need v to have the head dimension of q and k".into(),
        });
    }
    Ok(())
}

/// Inputs in a layout the raw entry points take: non-negative strides, rows contiguous.
fn rows_contiguous<'a>(x: ArrayView4<'a, f32>) -> ndarray::CowArray<'a, f32, Ix4> {
    if x.strides().iter().all(|&s| s >= 0) && (x.strides()[3] == 1 || x.shape()[3] == 1) {
        ndarray::CowArray::from(x)
    } else {
        ndarray::CowArray::from(x.as_standard_layout().to_owned())
    }
}

fn base_params(q: &ArrayView4<'_, f32>, k: &ArrayView4<'_, f32>, v: &ArrayView4<'_, f32>) -> F32Params {
    let sh = q.shape();
    let (null_c, null_m) = (crate::null_input(), crate::null_output());
    F32Params {
        batch: sh[0],
        heads: sh[1],
        kv_heads: k.shape()[1],
        seq_len: sh[2],
        kv_len: k.shape()[2],
        head_dim: sh[3],
        q: raw(q.as_ptr(), q),
        k: raw(k.as_ptr(), k),
        v: raw(v.as_ptr(), v),
        o: null_m,
        stats: std::ptr::null_mut(),
        rw_aux: std::ptr::null_mut(),
        d_out: null_c,
        dq: null_m,
        dk: null_m,
        dv: null_m,
    }
}

/// Causal attention output `(B, H, T, d)` of `variant`, fused (never `T x T`), with default
/// [`Options`]. As [`attn_core::forward`], `k` and `v` may be `(B, H_kv, T_k, d)`: grouped-query
/// attention (`H` a multiple of `H_kv`) and queries that continue a sequence (`q` holds its last `T`
/// of `T_k` rows: one decoding step against a KV cache, a chunk of a prefill). Same checks and
/// errors as [`attn_core::forward`]; variants that are not fused give [`Error::NotFused`].
pub fn forward<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
) -> Result<Array4<f32>> {
    forward_with(variant, q, k, v, &Options::default())
}

/// [`forward`] with explicit [`Options`].
pub fn forward_with<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    opts: &Options,
) -> Result<Array4<f32>> {
    let (q, k, v) = (q.into(), k.into(), v.into());
    check(variant, &q, &k, &v, None)?;
    Ok(forward_stats(variant, &q, &k, &v, opts, false)?.0)
}

fn forward_stats(
    variant: &Variant,
    q: &ArrayView4<'_, f32>,
    k: &ArrayView4<'_, f32>,
    v: &ArrayView4<'_, f32>,
    opts: &Options,
    keep_aux: bool,
) -> Result<(Array4<f32>, Vec<f32>, Vec<f32>)> {
    let (q, k, v) = (rows_contiguous(q.view()), rows_contiguous(k.view()), rows_contiguous(v.view()));
    let (q, k, v) = (q.view(), k.view(), v.view());
    let sh = q.shape();
    let mut o = Array4::<f32>::zeros((sh[0], sh[1], sh[2], sh[3]));
    let mut stats = vec![0.0f32; sh[0] * sh[1] * sh[2] * STATS];
    let mut aux = if keep_aux { vec![0.0f32; sh[0] * sh[1] * sh[2] * rw_aux_per_row(sh[3])] } else { Vec::new() };
    let mut p = base_params(&q, &k, &v);
    p.o = raw_mut(&mut o);
    p.stats = stats.as_mut_ptr();
    if keep_aux {
        p.rw_aux = aux.as_mut_ptr();
    }
    // SAFETY: every pointer comes from a live array of the checked shape; o, stats, aux are fresh.
    unsafe { forward_f32(plan(variant)?, &p, opts)? };
    Ok((o, stats, aux))
}

/// Gradients of `sum(d_out * forward(q, k, v))` with respect to `q`, `k`, `v`, fused, with
/// default [`Options`] (runs the forward for its statistics first). Shapes as [`forward`]; `dk` and
/// `dv` have the shape of `k` and `v`, summed over each key head's group of query heads.
pub fn backward<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    d_out: impl AsArray<'a, f32, Ix4>,
) -> Result<Grads> {
    backward_with(variant, q, k, v, d_out, &Options::default())
}

/// [`backward`] with explicit [`Options`].
pub fn backward_with<'a>(
    variant: &Variant,
    q: impl AsArray<'a, f32, Ix4>,
    k: impl AsArray<'a, f32, Ix4>,
    v: impl AsArray<'a, f32, Ix4>,
    d_out: impl AsArray<'a, f32, Ix4>,
    opts: &Options,
) -> Result<Grads> {
    let (q, k, v, g) = (q.into(), k.into(), v.into(), d_out.into());
    check(variant, &q, &k, &v, Some(&g))?;
    let (q, k, v, g) = (rows_contiguous(q), rows_contiguous(k), rows_contiguous(v), rows_contiguous(g));
    let (q, k, v, g) = (q.view(), k.view(), v.view(), g.view());
    let keep_aux = variant.reweight().is_some() && opts.tuning.reweight_helper;
    let (mut o, mut stats, mut aux) = forward_stats(variant, &q, &k, &v, opts, keep_aux)?;
    let (sh, kv) = (q.shape(), k.shape());
    let (mut dq, mut dk, mut dv) = (
        Array4::zeros((sh[0], sh[1], sh[2], sh[3])),
        Array4::zeros((kv[0], kv[1], kv[2], kv[3])),
        Array4::zeros((kv[0], kv[1], kv[2], kv[3])),
    );
    let mut p = base_params(&q, &k, &v);
    p.o = raw_mut(&mut o);
    p.stats = stats.as_mut_ptr();
    if keep_aux {
        p.rw_aux = aux.as_mut_ptr();
    }
    p.d_out = raw(g.as_ptr(), &g);
    p.dq = raw_mut(&mut dq);
    p.dk = raw_mut(&mut dk);
    p.dv = raw_mut(&mut dv);
    // SAFETY: as in forward_stats; dq, dk, dv are fresh arrays.
    unsafe { backward_f32(plan(variant)?, &p, opts)? };
    Ok(Grads { dq, dk, dv })
}
