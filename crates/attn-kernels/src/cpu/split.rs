//! What the CPU forward and backward share below the entry points: the call's options
//! ([`Options`]), its pointers typed `f32` ([`F32Params`]), the tiles of a call ([`dims`]), the
//! per-head views and packed copies of the inputs, the inverse norms, the tasks of the work split
//! ([`QueryTask`]) and a scratch per worker thread ([`PerThread`]). A leaf below `mod.rs`: it uses
//! `engine`, `isa`, `short` and `team` and nothing that uses it back (`xtask/tests/tidy.rs`).

use std::ops::Range;

use attn_core::Plan;

use super::amx_fwd;
use super::engine::{self, Dims, Head, Tuning};
use super::isa::Isa;
use super::short;
use super::spare::Spare;
use super::team::Helpers;
use crate::error::{Error, Result};
use crate::params::{Dtype, Params, RawTensor};

/// Floats per row of [`Params::rw_aux`] at head dimension `head_dim`: `c_i` and `y_i`.
pub const fn rw_aux_per_row(head_dim: usize) -> usize {
    head_dim + 1
}

/// Execution options: tile sizes, the instruction set and the threads a call runs on. Defaults:
/// [`Isa::detect`], that ISA's tiles ([`Tuning::for_isa`]) and [`Helpers::Rayon`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Tile sizes.
    pub tuning: Tuning,
    /// The instruction set to run (tests force [`Isa::Scalar`] to cover the fallback).
    pub isa: Isa,
    /// The threads a call runs on: the caller's rayon pool, or the OpenMP team of the calling
    /// thread (what a PyTorch extension picks, so that the kernels run on libtorch's intra-op threads
    /// instead of beside them). A short call (a decoding step) starts on the calling thread either way.
    pub helpers: Helpers,
}

impl Default for Options {
    fn default() -> Self {
        let isa = Isa::detect();
        Self { tuning: Tuning::for_isa(isa), isa, helpers: Helpers::Rayon }
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
    pub(super) fn kv_head(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }

    pub(super) fn new(p: &Params) -> Result<Self> {
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
pub(super) struct SendPtr<P>(pub(super) P);
// SAFETY: the raw entry points' contract makes every task write disjoint rows and only read inputs.
unsafe impl<P> Send for SendPtr<P> {}
// SAFETY: as above.
unsafe impl<P> Sync for SendPtr<P> {}

/// The tile sizes and instruction set of one call, its tiles checked. Tiles no larger than the call:
/// a key tile of at most `T_k` keys and a query tile of at most `T_q` rows, so that a short sequence
/// does not compute and zero a whole default tile's padding (at `T = 16` a 128-key tile is 8 times
/// the scores, and its packed copies 8 times the memory to clear). The same values either way: a
/// row's terms are the same, in the same order.
pub(super) fn dims(p: &F32Params, tuning: Tuning, isa: Isa) -> Result<Dims> {
    if tuning.block_q == 0 || tuning.block_k == 0 {
        return Err(Error::BadParams(format!("tile sizes must be >= 1, got {tuning:?}")));
    }
    Ok(Dims {
        isa: isa.assert_supported(),
        t: p.kv_len,
        off: p.kv_len - p.seq_len,
        d: p.head_dim,
        group: 1,
        bq: tuning.block_q.min(p.seq_len.max(1)),
        bk: tuning.block_k.min(p.kv_len.max(1)),
        cache_bytes: tuning.score_cache_bytes,
        in_range: false, // set once the norms are known (`engine::scores_in_range`)
    })
}

/// The `(b, h)` head of a raw tensor as a slice covering its `T` rows.
///
/// # Safety
/// `x` must be valid for reads of `T` rows of `d` elements at the given strides.
pub(super) unsafe fn head_slice<'a>(
    x: RawTensor<*const f32>,
    b: usize,
    h: usize,
    t: usize,
    d: usize,
) -> (&'a [f32], usize) {
    let ld = x.strides[2];
    // SAFETY: the caller guarantees the rows exist; the span covers rows 0..t.
    let s = unsafe { std::slice::from_raw_parts(x.ptr.add(b * x.strides[0] + h * x.strides[1]), (t - 1) * ld + d) };
    (s, ld)
}

/// Which key norms [`inverse_norms`] computes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum KeyNorms {
    /// Every key's, as the packed scores take them.
    Packed,
    /// Every key's, as a short call's forward takes them with its dot products
    /// ([`short::inv_norms_short`]): the backward of a short call.
    Short,
}

/// Inverse L2 norms of every `q` and `k` row (cosine variants): `(B·H, T_q)` for the queries, then
/// `(B·H_kv, T_k)` for the keys. (A short forward takes its keys' norms with its dot products.)
pub(super) unsafe fn inverse_norms(
    p: &F32Params,
    isa: Isa,
    helpers: Helpers,
    cosine: bool,
    keys: KeyNorms,
) -> Vec<f32> {
    let (tq, tk, d) = (p.seq_len, p.kv_len, p.head_dim);
    if !cosine {
        return Vec::new();
    }
    let mut out = vec![0.0f32; p.batch * (p.heads * tq + p.kv_heads * tk)];
    let (qn, kn) = out.split_at_mut(p.batch * p.heads * tq);
    let one = |x: RawTensor<*const f32>, heads: usize, t: usize, dst: &mut [f32], short: bool| {
        let x = SendPtr(x);
        helpers.chunks_mut(dst, t, &|i, buf| {
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
pub(super) unsafe fn pack(p: &F32Params, dims: Dims, helpers: Helpers, keys: bool, values: bool) -> (Spare, Spare) {
    let (bh, t, d) = (p.batch * p.kv_heads, p.kv_len, p.head_dim);
    let len = engine::packed_len(dims);
    let one = |x: RawTensor<*const f32>| -> Spare {
        // `pack_head` writes every value, its tiles' padding included.
        let mut out = Spare::take(bh * len);
        let x = SendPtr(x);
        helpers.chunks_mut(&mut out, len, &|i, dst| {
            // Capture the whole SendPtr (not its raw-pointer field) in the closure.
            #[allow(clippy::redundant_locals)]
            let x = x;
            // SAFETY: forwarded from the caller of the raw entry point.
            let (src, ld) = unsafe { head_slice(x.0, i / p.kv_heads, i % p.kv_heads, t, d) };
            engine::pack_head(src, ld, dims, dst);
        });
        out
    };
    (if keys { one(p.k) } else { Spare::none() }, if values { one(p.v) } else { Spare::none() })
}

/// Every head's AMX operands ([`amx_fwd::pack_head`]), `amx_packed_len` floats a head from a
/// 64-byte boundary, for a forward under [`Isa::Amx`](crate::cpu::Isa::Amx); or none.
pub(super) struct AmxPack {
    buf: Spare,
    start: usize,
    len: usize,
}

impl AmxPack {
    pub(super) fn none() -> Self {
        Self { buf: Spare::none(), start: 0, len: 0 }
    }

    /// Key head `x`'s operands (`b * H_kv + h`); empty for none.
    pub(super) fn head(&self, x: usize) -> &[f32] {
        let at = self.start + x * self.len;
        if self.len == 0 { &[] } else { &self.buf[at..at + self.len] }
    }
}

/// Whether a forward (and its backward) runs its products on AMX tiles: under [`Isa::Amx`], in
/// calls of more query rows than [`short::DIRECT_MAX_ROWS`], one key head a query head (a
/// grouped-query call runs `decode`'s grouped path, on the f32 products) and no re-weighting (whose
/// forward measured 3-5% slower with AMX scores: its value products run over each row's nonzero
/// weights, on AVX-512, and it keeps the scaled scores). The backward recomputes the scores on the
/// products the forward used, so that both see the same bits (with f32 scores under an AMX
/// forward, a ReLU's kink moved gradients of `relu-l1` by 1e-4).
pub(super) fn amx_products(isa: Isa, p: &F32Params, plan: &Plan) -> bool {
    isa == Isa::Amx && p.seq_len > short::DIRECT_MAX_ROWS && p.kv_heads == p.heads && plan.reweight.is_none()
}

/// [`AmxPack`] of every key head of the call, with its values for a forward (`values`).
/// `O(B·H_kv·T_k·d)`: three bf16 parts a key (and value) element, `d` padded to 32, 1.5x the f32
/// keys (and values) at `d = 64`.
///
/// # Safety
/// As [`forward_raw`].
pub(super) unsafe fn pack_amx(p: &F32Params, dims: Dims, helpers: Helpers, values: bool) -> AmxPack {
    let (bh, t, d) = (p.batch * p.kv_heads, p.kv_len, p.head_dim);
    let len = amx_fwd::packed_len(dims, values);
    // `pack_head` writes every value of a head's tiles, their padding included.
    let mut buf = Spare::take(bh * len + 16);
    let start = buf.as_ptr().align_offset(64);
    let (k, v) = (SendPtr(p.k), SendPtr(p.v));
    helpers.chunks_mut(&mut buf[start..start + bh * len], len, &|i, dst| {
        // Capture the whole SendPtrs (not their raw-pointer fields) in the closure.
        #[allow(clippy::redundant_locals)]
        let (k, v) = (k, v);
        let (b, h) = (i / p.kv_heads, i % p.kv_heads);
        // SAFETY: forwarded from the caller of the raw entry point.
        let (k, v) = unsafe { (head_slice(k.0, b, h, t, d), values.then(|| head_slice(v.0, b, h, t, d))) };
        let mut tmp = vec![0.0f32; d * dims.bk_pad()];
        amx_fwd::pack_head(k, v, dims, dst, &mut tmp);
    });
    AmxPack { buf, start, len }
}

/// # Safety
/// As [`forward_raw`]; `packed` from [`pack`] and `amx` from [`pack_amx`] (or none) for the same
/// call.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn head<'a>(
    p: &F32Params,
    norms: &'a [f32],
    packed: &'a (Spare, Spare),
    amx: &'a AmxPack,
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
    Head { q, k, v, ldq, ldk, ldv, inq, ink, kt, vt, amx: amx.head(x) }
}

/// Writes `rows` (row-major, `d` wide) to rows `[i0, ..)` of head `(b, h)` of `x`.
///
/// # Safety
/// `x` must be valid for writes there, and no other thread may write those rows.
pub(super) unsafe fn write_rows(x: RawTensor<*mut f32>, b: usize, h: usize, i0: usize, d: usize, rows: &[f32]) {
    for (r, row) in rows.chunks_exact(d).enumerate() {
        // SAFETY: see the function contract.
        unsafe {
            let dst = x.ptr.add(b * x.strides[0] + h * x.strides[1] + (i0 + r) * x.strides[2]);
            std::ptr::copy_nonoverlapping(row.as_ptr(), dst, d);
        }
    }
}

/// A task of the forward or of the backward's row phase: query tile `task % nqt` of head
/// `x = task / nqt` (batch `b`, head `h`), rows `[i0, i0 + nq)`.
pub(super) struct QueryTask {
    pub(super) x: usize,
    pub(super) b: usize,
    pub(super) h: usize,
    pub(super) i0: usize,
    pub(super) nq: usize,
}

impl QueryTask {
    pub(super) fn new(task: usize, p: &F32Params, dims: Dims) -> Self {
        let nqt = p.seq_len.div_ceil(dims.bq);
        let (x, qt) = (task / nqt, task % nqt);
        let i0 = qt * dims.bq;
        Self { x, b: x / p.heads, h: x % p.heads, i0, nq: dims.bq.min(p.seq_len - i0) }
    }
}

/// Query tiles a forward task runs in lockstep ([`Tuning::band`]): the tuning's, at most the
/// `nqt` tiles of a head, 1 under re-weighting (whose second sweep needs the first's end), and
/// fewer where the call's `bh` heads would make fewer than 8 tasks for each of `threads`.
pub(super) fn band(tuning: Tuning, plan: &Plan, bh: usize, nqt: usize, threads: usize) -> usize {
    if plan.reweight.is_some() {
        return 1;
    }
    tuning.band.min(nqt).min(bh * nqt / (8 * threads.max(1))).max(1)
}

/// Task `task` of a forward in bands of `band` query tiles over `bh` heads (`heads` a batch) of
/// `nqt` query tiles each: head `x` (batch `b`, head `h`) and its query tiles `tiles`. The bands of
/// a head's last rows come first: under a causal mask they see the most keys, and a thread's last
/// tasks are then its lightest.
pub(super) fn band_task(
    task: usize,
    heads: usize,
    bh: usize,
    nqt: usize,
    band: usize,
) -> (usize, usize, usize, Range<usize>) {
    let bands = nqt.div_ceil(band);
    let (x, k) = (task % bh, bands - 1 - task / bh);
    (x, x / heads, x % heads, k * band..((k + 1) * band).min(nqt))
}

/// One scratch per thread of a call's team ([`Helpers::threads`]), made on first use and kept for
/// the call. `for_each_init` makes one per rayon split instead, many per call, and re-weighting's
/// scratch holds a score cache of up to 16 MiB: after the first such block is freed, glibc serves
/// the later ones from its heap (its dynamic mmap threshold) and keeps them, so LSSAR's peak memory
/// at T = 65536 rose from 50 to 75 MiB when faster kernels changed the splits (`bench-kernels memory`).
pub(super) struct PerThread<S> {
    slots: Vec<std::sync::Mutex<Option<S>>>,
}

impl<S> PerThread<S> {
    /// Slots for the `threads` threads of a team.
    pub(super) fn new(threads: usize) -> Self {
        Self { slots: (0..threads.max(1)).map(|_| std::sync::Mutex::new(None)).collect() }
    }

    /// Runs `f` on a scratch of this call's (made by `make` on first use): a rayon worker's own slot,
    /// else (an OpenMP thread, or a rayon task that re-entered the pool) the first free one; `f` gets
    /// a scratch of its own only when every slot is in use.
    pub(super) fn with<R>(&self, make: impl FnOnce() -> S, f: impl FnOnce(&mut S) -> R) -> R {
        let slot = rayon::current_thread_index()
            .and_then(|i| self.slots.get(i))
            .and_then(|m| m.try_lock().ok())
            .or_else(|| self.slots.iter().find_map(|m| m.try_lock().ok()));
        match slot {
            Some(mut held) => f(held.get_or_insert_with(make)),
            None => f(&mut make()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_band_shrinks_to_keep_eight_tasks_a_thread_and_is_one_under_re_weighting() {
        let plan = |name: &str| name.parse::<attn_core::Variant>().unwrap().plan().unwrap();
        let (plain, rw) = (plan("lssa"), plan("lssa+rw15"));
        let tuning = Tuning { band: 8, ..Tuning::default() };
        // 12 heads of 32 query tiles on 2 threads: 384 tiles, bands of 8 leave 48 tasks.
        assert_eq!(band(tuning, &plain, 12, 32, 2), 8);
        // On 16 threads bands of 8 would leave 48 tasks, under 8 a thread: 384 / 128 = 3.
        assert_eq!(band(tuning, &plain, 12, 32, 16), 3);
        // No more than a head's tiles; never 0.
        assert_eq!(band(tuning, &plain, 64, 5, 1), 5);
        assert_eq!(band(tuning, &plain, 1, 4, 8), 1);
        assert_eq!(band(tuning, &rw, 12, 32, 2), 1);
        assert_eq!(band(Tuning { band: 1, ..tuning }, &plain, 12, 32, 2), 1);
    }

    #[test]
    fn band_tasks_cover_every_query_tile_once_the_last_rows_first() {
        // 2 batches of 3 heads, 10 query tiles in bands of 4: bands [8, 10), [4, 8), [0, 4).
        let (heads, bh, nqt, band) = (3, 6, 10, 4);
        let mut seen = vec![0; bh * nqt];
        for task in 0..bh * nqt.div_ceil(band) {
            let (x, b, h, tiles) = band_task(task, heads, bh, nqt, band);
            assert_eq!((b, h), (x / heads, x % heads));
            let want = [8..10, 4..8, 0..4][task / bh].clone();
            assert_eq!(tiles, want, "task {task}");
            tiles.for_each(|qt| seen[x * nqt + qt] += 1);
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
    }
}
