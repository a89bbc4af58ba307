//! Fused CPU attention: the public entry points (ndarray and raw pointers), input checks, the
//! work split (the backward's in `bwd`); the streaming maths is in [`engine`](self) (its
//! backward in `grad`) and the vector code in `tile`, `act` and `math`.
//!
//! Thread count: the kernels run on the caller's rayon pool (`pool.install(|| forward(..))`), or on
//! the OpenMP team of the calling thread where [`Options::helpers`] says so (the PyTorch
//! extension's choice: libtorch's intra-op threads); they spawn no threads of their own.
//! Scratch: per task, a few tiles (`O(block · d)`), and for
//! re-weighting's two sweeps a `block_q x T` stripe of activations within
//! [`Tuning::score_cache_bytes`]; per call,
//! `B·H·T` row statistics, `2·B·H·T` inverse norms for cosine variants, and in the backward one
//! `T x d` `dq` partial per (head, key chunk). Nothing is `T x T`. The packed tiles, the partials and
//! [`backward_with`]'s internal forward output are kept for the next call (at most 96 MiB;
//! [`release_spare_buffers`] frees them), whose pages are then already mapped.

pub(crate) mod act;
mod amx_fwd;
mod bwd;
pub(crate) mod decode;
pub(crate) mod engine;
pub(crate) mod fwd;
pub mod gemm;
pub(crate) mod grad;
pub mod isa;
// The vectorised special functions and their measured error bounds: the lab's (public with the `lab`
// feature); the kernels use a few of them.
#[cfg(feature = "lab")]
pub mod math;
#[cfg(not(feature = "lab"))]
#[allow(dead_code)] // the lab's functions and bounds that only its tests and benches read
pub(crate) mod math;
pub(crate) mod power;
pub mod rows;
pub(crate) mod short;
mod spare;
mod split;
pub(crate) mod team;
pub(crate) mod tile;

use ndarray::{Array4, ArrayView4, ArrayViewMut4, AsArray, Ix4};

use attn_core::{OutputNorm, Plan, Transform, Variant};

use bwd::backward_f32;
use engine::STATS;
pub use engine::Tuning;
use fwd::{FwdScratch, Query};
pub use isa::Isa;
use spare::Spare;
pub use spare::release_spare_buffers;
pub(crate) use split::F32Params;
use split::{
    AmxPack, KeyNorms, PerThread, QueryTask, SendPtr, amx_products, dims, head, inverse_norms, pack, pack_amx,
    write_rows,
};
pub use split::{Options, rw_aux_per_row};
pub use team::Helpers;

use crate::error::{Error, Grads, Result};
use crate::params::{Params, RawTensor};

/// Number of f32 statistics per row that [`forward_raw`] saves for [`backward_raw`].
pub const STATS_PER_ROW: usize = STATS;

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
    let norms = unsafe { inverse_norms(p, isa, opts.helpers, plan.cosine(), KeyNorms::Packed) };
    dims.in_range = engine::scores_in_range(&plan, &norms, p.kv_len, d);
    let amx = amx_products(isa, p, &plan);
    // SAFETY: forwarded.
    let packed = unsafe { pack(p, dims, opts.helpers, !amx, false) };
    // SAFETY: forwarded.
    let amx = if amx { unsafe { pack_amx(p, dims, opts.helpers, true) } } else { AmxPack::none() };
    if p.kv_heads < p.heads {
        // SAFETY: forwarded.
        unsafe { decode::forward_grouped(&plan, p, dims, opts.helpers, &norms, &packed.0, aux) };
        return Ok(());
    }
    let nqt = t.div_ceil(dims.bq);
    let (o, stats) = (SendPtr(p.o), SendPtr(p.stats));
    let aux = SendPtr(aux);
    let scratch = PerThread::new(opts.helpers.threads());
    let band = split::band(opts.tuning, &plan, bh, nqt, opts.helpers.threads());
    if band > 1 {
        opts.helpers.tasks(bh * nqt.div_ceil(band), &|task| {
            scratch.with(
                || (FwdScratch::new(dims, dims.bq), fwd::Sweeps::new(), vec![0.0f32; band * dims.bq * d]),
                |(sc, sweeps, out)| {
                    // Capture the whole SendPtr (not its raw-pointer field) in the closure.
                    #[allow(clippy::redundant_locals)]
                    let (o, stats) = (o, stats);
                    let (x, b, h, tiles) = split::band_task(task, p.heads, bh, nqt, band);
                    let i0 = tiles.start * dims.bq;
                    let rows = (tiles.end * dims.bq).min(t) - i0;
                    // SAFETY: forwarded; this task alone writes rows [i0, i0 + rows) of head (b, h).
                    unsafe {
                        let hd = head(p, &norms, &packed, &amx, dims, b, h);
                        let st = std::slice::from_raw_parts_mut(stats.0.add((x * t + i0) * STATS), rows * STATS);
                        let query = |qt: usize| {
                            let i0 = qt * dims.bq;
                            Query { plan: &plan, head: &hd, dims, i0, nq: dims.bq.min(t - i0) }
                        };
                        let qs: Vec<Query<'_>> = tiles.map(query).collect();
                        fwd::forward_band(isa, &qs, sc, sweeps, &mut out[..rows * d], st);
                        write_rows(o.0, b, h, i0, d, &out[..rows * d]);
                    }
                },
            )
        });
        return Ok(());
    }
    opts.helpers.tasks(bh * nqt, &|task| {
        scratch.with(
            || (FwdScratch::new(dims, dims.bq), fwd::Sweeps::new(), vec![0.0f32; dims.bq * d]),
            |(sc, sweeps, out)| {
                // Capture the whole SendPtr (not its raw-pointer field) in the closure.
                #[allow(clippy::redundant_locals)]
                let (o, stats, aux) = (o, stats, aux);
                let QueryTask { x, b, h, i0, nq } = QueryTask::new(task, p, dims);
                // SAFETY: forwarded; this task alone writes rows [i0, i0 + nq) of head (b, h).
                unsafe {
                    let hd = head(p, &norms, &packed, &amx, dims, b, h);
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

fn raw_mut(x: &mut ArrayViewMut4<'_, f32>) -> RawTensor<*mut f32> {
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
    if [q.view(), k.view(), v.view()].iter().chain(d_out.map(|g| g.view()).as_ref()).all(all_finite) {
        attn_core::reference::check_shapes_cached(variant, q, k, v, d_out)?;
    } else {
        // The first error in attn-core's order: a shape it checks earlier, or the first value that
        // is not finite.
        attn_core::reference::check_inputs_cached(variant, q, k, v, d_out)?;
    }
    if v.shape()[3] != q.shape()[3] {
        return Err(Error::NotFused {
            variant: variant.to_string(),
            reason: "the fused kernels need v to have the head dimension of q and k".into(),
        });
    }
    Ok(())
}

/// Whether every value of `x` is finite, scanned in chunks on the current rayon pool: a long call's
/// inputs are tens of MB (12.6 MB each at `B = 1, H = 12, T = 4096, d = 64`), which one thread
/// scanned in 6-9 ms before a 2-thread forward of about 125 ms.
fn all_finite(x: &ArrayView4<'_, f32>) -> bool {
    use rayon::prelude::*;
    match x.as_slice_memory_order() {
        Some(s) => s.par_chunks(1 << 16).all(attn_core::reference::all_finite_slice),
        None => attn_core::reference::all_finite(x),
    }
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
    let (null_c, null_m) = (crate::params::null_input(), crate::params::null_output());
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
    let sh = q.shape();
    let mut o = Array4::<f32>::zeros((sh[0], sh[1], sh[2], sh[3]));
    forward_stats(variant, &q, &k, &v, opts, false, o.view_mut())?;
    Ok(o)
}

fn forward_stats(
    variant: &Variant,
    q: &ArrayView4<'_, f32>,
    k: &ArrayView4<'_, f32>,
    v: &ArrayView4<'_, f32>,
    opts: &Options,
    keep_aux: bool,
    mut o: ArrayViewMut4<'_, f32>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    let (q, k, v) = (rows_contiguous(q.view()), rows_contiguous(k.view()), rows_contiguous(v.view()));
    let (q, k, v) = (q.view(), k.view(), v.view());
    let sh = q.shape();
    let mut stats = vec![0.0f32; sh[0] * sh[1] * sh[2] * STATS];
    let mut aux = if keep_aux { vec![0.0f32; sh[0] * sh[1] * sh[2] * rw_aux_per_row(sh[3])] } else { Vec::new() };
    let mut p = base_params(&q, &k, &v);
    p.o = raw_mut(&mut o);
    p.stats = stats.as_mut_ptr();
    if keep_aux {
        p.rw_aux = aux.as_mut_ptr();
    }
    // SAFETY: every pointer comes from a live array of the checked shape (`o`: q's, standard layout,
    // from our callers); stats and aux are fresh.
    unsafe { forward_f32(plan(variant)?, &p, opts)? };
    Ok((stats, aux))
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
    let (sh, kv) = (q.shape(), k.shape());
    // The forward's output only feeds the backward: off the shelf (written whole by the forward).
    let mut o_buf = Spare::take(q.len());
    let mut o = ArrayViewMut4::from_shape((sh[0], sh[1], sh[2], sh[3]), &mut o_buf[..]).expect("q's size");
    let (mut stats, mut aux) = forward_stats(variant, &q, &k, &v, opts, keep_aux, o.view_mut())?;
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
    p.dq = raw_mut(&mut dq.view_mut());
    p.dk = raw_mut(&mut dk.view_mut());
    p.dv = raw_mut(&mut dv.view_mut());
    // SAFETY: as in forward_stats; dq, dk, dv are fresh arrays.
    unsafe { backward_f32(plan(variant)?, &p, opts)? };
    Ok(Grads { dq, dk, dv })
}
