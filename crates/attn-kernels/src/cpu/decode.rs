//! The forward of a short call (at most [`DIRECT_MAX_ROWS`](super::short::DIRECT_MAX_ROWS) query
//! rows: a decoding step, a few rows of speculative decoding) against a cache of `T_k` keys.
//!
//! - **One pass per key head.** The `G = H / H_kv` query heads that share a key head (grouped-query
//!   attention) run as the `G T_q` rows of one task, gathered position-major ([`Dims::group`]), so
//!   each key head's cache is read once per call, as SDPA's `enable_gqa` reads it.
//! - **Split-K.** With fewer key heads than threads to keep busy, each key head's keys are split
//!   into ranges of at least [`Tuning::split_keys`](super::Tuning::split_keys) (flash-decoding):
//!   stage 1 runs per range, the ranges' states merge (`Z_i` and `sum f v` are plain sums; under a
//!   running maximum both are rescaled to the larger one first), and only then, with the row's
//!   `Z_i` and `m_i = max_j relu(N a_ij - 1)` known, does re-weighting's second stage run per range
//!   and merge its sums `W_i`, `sum w v`. Every merge is a sum of what the unsplit sweep sums, so a
//!   split call is the unsplit one up to rounding (`fwd` explains the order).
//! - **No hand-off.** A call starts on the calling thread: alone when it reads at most
//!   [`SERIAL_BYTES`] of keys and values ([`runs_serially`]), else with helpers that join as they
//!   wake ([`team`](super::team)); waking a pool's worker took 40 us and more on a 2-core VM, more
//!   than a 1K-key step's work.
//!
//! Allocation: none once a thread's buffers have grown to a step's sizes (`tests/decode_alloc.rs`);
//! they hold `O(G T_q d)` floats and, for re-weighting, the stripe of activations for the second sweep
//! (`G T_q x T_k` floats at most, within `Tuning::score_cache_bytes`). A split call allocates its
//! ranges' states.

use std::cell::RefCell;
use std::ops::Range;

use attn_core::Plan;

use super::engine::{self, Dims, FOLD_TILES, Head, STATS};
use super::fwd::{self, FwdScratch, Query, Stage1, Stage2, Sweeps};
use super::isa::Isa;
use super::split::{F32Params, SendPtr, head_slice, rw_aux_per_row};
use super::team::Helpers;

/// The most bytes of keys and values (`B H_kv T_k d` floats each) that a short call reads on the
/// calling thread alone.
const SERIAL_BYTES: usize = 1 << 20;

/// Whether a short call of these sizes runs on the calling thread, without its rayon pool: a caller
/// about to enter a pool (`install`) for such a call may call it directly instead.
fn runs_serially(p: &F32Params) -> bool {
    2 * p.batch * p.kv_heads * p.kv_len * p.head_dim * 4 <= SERIAL_BYTES
}

/// One key head's rows: batch `b`, key head `hk`, and its `G` query heads' rows of query positions
/// `[p0, p0 + n)` gathered position-major (row `r` is position `p0 + r / G` of head `hk G + r % G`).
pub(super) struct Group {
    b: usize,
    hk: usize,
    p0: usize,
    /// The gathered query rows (`rows x d`) and, for cosine scores, their inverse norms.
    q: Vec<f32>,
    inq: Vec<f32>,
}

impl Group {
    /// # Safety
    /// As [`super::forward_raw`] for `p`'s `q`.
    unsafe fn new(p: &F32Params, isa: Isa, cosine: bool, b: usize, hk: usize) -> Self {
        let mut g = Self::empty();
        // SAFETY: forwarded.
        unsafe { g.fill(p, isa, cosine, b, hk, 0..p.seq_len) };
        g
    }

    pub(super) const fn empty() -> Self {
        Self { b: 0, hk: 0, p0: 0, q: Vec::new(), inq: Vec::new() }
    }

    /// Gathers key head `hk`'s rows into the buffers this group has (no allocation once they are
    /// large enough).
    ///
    /// # Safety
    /// As [`super::forward_raw`] for `p`'s `q`.
    pub(super) unsafe fn fill(
        &mut self,
        p: &F32Params,
        isa: Isa,
        cosine: bool,
        b: usize,
        hk: usize,
        positions: Range<usize>,
    ) {
        let (g, tq, d) = (p.heads / p.kv_heads, p.seq_len, p.head_dim);
        let rows = g * positions.len();
        (self.b, self.hk, self.p0) = (b, hk, positions.start);
        let q = &mut self.q;
        q.clear();
        q.resize(rows * d, 0.0);
        for (r, row) in q.chunks_exact_mut(d).enumerate() {
            let (t, h) = (positions.start + r / g, hk * g + r % g);
            // SAFETY: forwarded; row t of head (b, h) exists.
            let (src, ld) = unsafe { head_slice(p.q, b, h, tq, d) };
            row.copy_from_slice(&src[t * ld..t * ld + d]);
        }
        self.inq.clear();
        if cosine {
            self.inq.resize(rows, 0.0);
            engine::inv_norms(isa, q, d, rows, d, &mut self.inq);
        }
    }

    pub(super) fn rows(&self, d: usize) -> usize {
        self.q.len() / d
    }

    /// The call's sizes for these rows: `G` rows per position, the first at position `p0`.
    pub(super) fn dims(&self, p: &F32Params, dims: Dims) -> Dims {
        Dims { group: p.heads / p.kv_heads, off: dims.off + self.p0, ..dims }
    }

    /// # Safety
    /// As [`super::forward_raw`] for `p`'s `k` and `v`.
    pub(super) unsafe fn head<'a>(&'a self, p: &F32Params, kt: &'a [f32], ink: &'a [f32]) -> Head<'a> {
        let (t, d) = (p.kv_len, p.head_dim);
        // SAFETY: forwarded.
        let ((k, ldk), (v, ldv)) =
            unsafe { (head_slice(p.k, self.b, self.hk, t, d), head_slice(p.v, self.b, self.hk, t, d)) };
        Head { q: &self.q, k, v, ldq: d, ldk, ldv, inq: &self.inq, ink, kt, vt: &[], amx: &[] }
    }

    /// Writes the rows' outputs, statistics and (when `aux` is not null) re-weighting's helper to
    /// their places in `p`.
    ///
    /// # Safety
    /// As [`super::forward_raw`]; no other thread writes this group's rows.
    pub(super) unsafe fn scatter(&self, p: &F32Params, aux: *mut f32, out: &[f32], stats: &[f32], helper: &[f32]) {
        let (g, tq, d) = (p.heads / p.kv_heads, p.seq_len, p.head_dim);
        let w = rw_aux_per_row(d);
        for r in 0..self.rows(d) {
            let (t, h) = (self.p0 + r / g, self.hk * g + r % g);
            let x = (self.b * p.heads + h) * tq + t;
            // SAFETY: forwarded; row t of head (b, h), and its statistics and helper rows, are this
            // group's alone.
            unsafe {
                let o = p.o.ptr.add(self.b * p.o.strides[0] + h * p.o.strides[1] + t * p.o.strides[2]);
                std::ptr::copy_nonoverlapping(out[r * d..].as_ptr(), o, d);
                std::ptr::copy_nonoverlapping(stats[r * STATS..].as_ptr(), p.stats.add(x * STATS), STATS);
                if !aux.is_null() {
                    std::ptr::copy_nonoverlapping(helper[r * w..].as_ptr(), aux.add(x * w), w);
                }
            }
        }
    }
}

/// The buffers of one task of rows ([`Group`]) besides its scratch tile: the gathered rows, the
/// sweeps' states, the rows' outputs, statistics and helper. Kept by a thread (a short call) or for a
/// call (the tiled forward) from one task to the next, so a task allocates nothing once they have
/// grown to its sizes (a decoding step made about 25 allocations per key head before).
struct GroupBuffers {
    group: Group,
    sweeps: Sweeps,
    out: Vec<f32>,
    stats: Vec<f32>,
    helper: Vec<f32>,
}

impl GroupBuffers {
    const fn new() -> Self {
        Self { group: Group::empty(), sweeps: Sweeps::new(), out: Vec::new(), stats: Vec::new(), helper: Vec::new() }
    }

    /// The forward of key head `x`'s rows of query positions `positions` over every key they see,
    /// written to their places in `p` (outputs, statistics and, when `aux` is not null, the
    /// re-weighting helper). `kt` and `ink`: the key head's packed tiles and key norms, or empty (a
    /// short call, whose scores read the keys as they are).
    ///
    /// # Safety
    /// As [`super::forward_raw`]; no other thread writes these rows.
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        &mut self,
        sc: &mut FwdScratch,
        plan: &Plan,
        p: &F32Params,
        dims: Dims,
        x: usize,
        positions: Range<usize>,
        (kt, ink): (&[f32], &[f32]),
        aux: *mut f32,
    ) {
        let Self { group, sweeps, out, stats, helper } = self;
        let d = dims.d;
        // SAFETY: forwarded.
        unsafe { group.fill(p, dims.isa, plan.cosine(), x / p.kv_heads, x % p.kv_heads, positions) };
        // SAFETY: forwarded.
        let head = unsafe { group.head(p, kt, ink) };
        let rows = group.rows(d);
        let q = Query { plan, head: &head, dims: group.dims(p, dims), i0: 0, nq: rows };
        fwd::refill(out, rows * d, 0.0);
        fwd::refill(stats, rows * STATS, 0.0);
        fwd::refill(helper, if aux.is_null() { 0 } else { rows * rw_aux_per_row(d) }, 0.0);
        let h = (!aux.is_null()).then_some(&mut helper[..]);
        fwd::forward_tile(dims.isa, &q, sc, sweeps, out, stats, h);
        // SAFETY: forwarded; these rows are this task's alone.
        unsafe { group.scatter(p, aux, out, stats, helper) };
    }
}

/// Runs `f` on this thread's buffers for short calls, kept from one call to the next (on fresh ones
/// if they are in use: `f` re-entered). They live as long as the thread: `O(rows d)` floats, and
/// after a re-weighted step the stripe of activations, at most
/// [`Tuning::score_cache_bytes`](super::Tuning::score_cache_bytes) (16 MiB).
fn with_thread_buffers<R>(f: impl FnOnce(&mut GroupBuffers, &mut Option<FwdScratch>) -> R) -> R {
    thread_local! {
        static BUFFERS: RefCell<(GroupBuffers, Option<FwdScratch>)> = const { RefCell::new((GroupBuffers::new(), None)) };
    }
    BUFFERS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut held) => {
            let (bufs, sc) = &mut *held;
            f(bufs, sc)
        }
        Err(_) => f(&mut GroupBuffers::new(), &mut None),
    })
}

/// Ranges of key tiles per key head: `chunks` ranges of whole fold groups over `tiles` tiles.
fn ranges(tiles: usize, chunks: usize) -> Vec<Range<usize>> {
    let groups = tiles.div_ceil(FOLD_TILES);
    let per = groups.div_ceil(chunks);
    (0..groups.div_ceil(per)).map(|c| c * per * FOLD_TILES..((c + 1) * per * FOLD_TILES).min(tiles)).collect()
}

/// How many ranges each of `heads` key heads' `tiles` key tiles split into on `threads` threads:
/// 1 when the heads alone spread evenly (or are many), else enough ranges for about two tasks per
/// thread, each at least `min_tiles` long.
fn chunks_per_head(heads: usize, threads: usize, tiles: usize, min_tiles: usize) -> usize {
    if threads <= 1 || heads.is_multiple_of(threads) || heads >= 2 * threads {
        return 1;
    }
    (2 * threads).div_ceil(heads).min(tiles / min_tiles.max(1)).max(1)
}

/// The forward of a short call: writes `p.o`, the statistics and (when `aux` is not null) the
/// re-weighting helper. `dims` as the caller made them (`group` 1).
///
/// # Safety
/// As [`super::forward_raw`].
pub(super) unsafe fn forward(
    plan: &Plan,
    p: &F32Params,
    mut dims: Dims,
    split_keys: usize,
    helpers: Helpers,
    aux: *mut f32,
) {
    dims.group = p.heads / p.kv_heads;
    let heads = p.batch * p.kv_heads;
    let tiles = p.kv_len.div_ceil(dims.bk);
    let serial = runs_serially(p);
    let threads = if serial { 1 } else { helpers.threads() };
    let min_tiles = split_keys.div_ceil(dims.bk * FOLD_TILES).saturating_mul(FOLD_TILES);
    let chunks = chunks_per_head(heads, threads, tiles, min_tiles);
    let aux = SendPtr(aux);
    // SAFETY (every block below): forwarded from our caller; each group writes its own rows.
    let one = |x: usize| {
        // Capture the whole SendPtr (not its raw-pointer field) in the closure.
        #[allow(clippy::redundant_locals)]
        let aux = aux;
        with_thread_buffers(|bufs, sc| {
            let sc = FwdScratch::reuse(sc, dims, dims.group * p.seq_len);
            // SAFETY: forwarded from our caller; this task alone writes key head x's rows.
            unsafe { bufs.run(sc, plan, p, dims, x, 0..p.seq_len, (&[], &[]), aux.0) }
        })
    };
    if chunks == 1 {
        if serial {
            (0..heads).for_each(one);
        } else {
            // This thread starts at once; helpers join as they wake (`team`).
            helpers.run(heads, &one);
        }
        return;
    }
    // SAFETY: as above.
    unsafe { split(plan, p, dims, helpers, &ranges(tiles, chunks), aux.0) }
}

/// The tiled forward of grouped-query attention (`H_kv < H`, more than a short call's rows): the `G`
/// query heads of a key head run as the `G block_q` rows of one task per `block_q` positions, so each
/// packed key tile is read once for the group rather than once per query head. `norms` and `packed`
/// as the plain forward made them.
///
/// # Safety
/// As [`super::forward_raw`].
pub(super) unsafe fn forward_grouped(
    plan: &Plan,
    p: &F32Params,
    dims: Dims,
    helpers: Helpers,
    norms: &[f32],
    packed: &[f32],
    aux: *mut f32,
) {
    let (g, tq, tk) = (p.heads / p.kv_heads, p.seq_len, p.kv_len);
    let per = dims.bq;
    let tiles = tq.div_ceil(per);
    let len = engine::packed_len(dims);
    let key_norms = |x: usize| {
        let at = p.batch * p.heads * tq + x * tk;
        norms.get(at..at + tk).unwrap_or(&[])
    };
    let scratch = super::PerThread::new(helpers.threads());
    let aux = SendPtr(aux);
    helpers.tasks(p.batch * p.kv_heads * tiles, &|task| {
        // Capture the whole SendPtr (not its raw-pointer field) in the closure.
        #[allow(clippy::redundant_locals)]
        let aux = aux;
        let (x, tile) = (task / tiles, task % tiles);
        let positions = tile * per..((tile + 1) * per).min(tq);
        scratch.with(
            || (FwdScratch::new(dims, g * per), GroupBuffers::new()),
            |(sc, bufs)| {
                let keys = (&packed[x * len..(x + 1) * len], key_norms(x));
                // SAFETY: forwarded; this task alone writes its positions' rows of the group's heads.
                unsafe { bufs.run(sc, plan, p, dims, x, positions, keys, aux.0) }
            },
        )
    });
}

/// A split call: stage 1 per (key head, range), merged per key head; with re-weighting the second
/// stage per (key head, range), merged; then each key head's rows are finished and written.
///
/// # Safety
/// As [`super::forward_raw`].
unsafe fn split(plan: &Plan, p: &F32Params, dims: Dims, helpers: Helpers, ranges: &[Range<usize>], aux: *mut f32) {
    let isa = dims.isa;
    let heads = p.batch * p.kv_heads;
    // SAFETY: forwarded.
    let groups: Vec<Group> =
        helpers.map(heads, &|x| unsafe { Group::new(p, isa, plan.cosine(), x / p.kv_heads, x % p.kv_heads) });
    // SAFETY: forwarded.
    let heads_of: Vec<Head<'_>> = groups.iter().map(|g| unsafe { g.head(p, &[], &[]) }).collect();
    let query = |x: usize| {
        let rows = groups[x].rows(dims.d);
        Query { plan, head: &heads_of[x], dims, i0: 0, nq: rows }
    };
    let n = ranges.len();
    let longest = ranges.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut tasks: Vec<(Stage1, FwdScratch)> = (0..heads * n)
        .map(|i| {
            let q = query(i / n);
            (Stage1::new(&q), FwdScratch::for_tiles(dims, q.nq, longest))
        })
        .collect();
    helpers.for_each_mut(&mut tasks, &|i, (st, sc)| {
        fwd::range1(isa, &query(i / n), ranges[i % n].clone(), st, sc);
    });
    let (mut states, mut scratch): (Vec<Stage1>, Vec<FwdScratch>) = tasks.into_iter().unzip();
    // Each key head's ranges merge into its first range's state.
    let between: Vec<_> =
        states.chunks_mut(n).enumerate().map(|(x, per_head)| fwd::merge1(isa, &query(x), per_head)).collect();
    let firsts: Vec<Stage1> = states.into_iter().step_by(n).collect();
    let keep_aux = !aux.is_null();
    let mut second: Vec<Stage2> = (0..heads * n).map(|i| Stage2::new(&query(i / n), keep_aux)).collect();
    if plan.reweight.is_some() {
        let mut pairs: Vec<(&mut Stage2, &mut FwdScratch)> = second.iter_mut().zip(scratch.iter_mut()).collect();
        helpers.for_each_mut(&mut pairs, &|i, (s2, sc)| {
            let x = i / n;
            let bt = between[x].as_ref().expect("re-weighting has its row constants");
            fwd::range2(isa, &query(x), ranges[i % n].clone(), &firsts[x], bt, s2, sc);
        });
    }
    let aux = SendPtr(aux);
    let mut second = second.into_iter();
    for x in 0..heads {
        let mut s2 = second.next().expect("one state per range");
        for other in second.by_ref().take(n - 1) {
            s2.merge(&other);
        }
        let q = query(x);
        let (mut out, mut stats) = (vec![0.0f32; q.nq * dims.d], vec![0.0f32; q.nq * STATS]);
        let mut helper = vec![0.0f32; if keep_aux { q.nq * rw_aux_per_row(dims.d) } else { 0 }];
        match &between[x] {
            None => fwd::finish_plain(&q, &firsts[x], &mut out, &mut stats),
            Some(bt) => {
                let h = keep_aux.then_some(&mut helper[..]);
                fwd::finish_reweighted(&q, &firsts[x], bt, &s2, &mut out, &mut stats, h);
            }
        }
        // SAFETY: forwarded; the rows of group x are written here alone.
        unsafe { groups[x].scatter(p, aux.0, &out, &stats, &helper) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_tiles_in_whole_fold_groups() {
        for tiles in [1, 7, 8, 9, 64, 100, 513] {
            for chunks in 1..6 {
                let r = ranges(tiles, chunks);
                assert!(!r.is_empty() && r.len() <= chunks, "{tiles} tiles, {chunks} chunks: {r:?}");
                assert_eq!(r[0].start, 0);
                assert_eq!(r.last().unwrap().end, tiles);
                for w in r.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                }
                assert!(r.iter().all(|x| x.start % FOLD_TILES == 0 && !x.is_empty()), "{r:?}");
            }
        }
    }

    #[test]
    fn the_cache_splits_only_when_the_key_heads_leave_threads_idle() {
        // 12 or 4 key heads on 2 threads: whole heads. One head on 2 threads: 4 ranges if long enough.
        assert_eq!(chunks_per_head(12, 2, 128, 32), 1);
        assert_eq!(chunks_per_head(4, 2, 128, 32), 1);
        assert_eq!(chunks_per_head(1, 2, 128, 32), 4);
        assert_eq!(chunks_per_head(1, 2, 64, 32), 2);
        assert_eq!(chunks_per_head(1, 2, 16, 32), 1);
        assert_eq!(chunks_per_head(3, 8, 1024, 32), 6);
        assert_eq!(chunks_per_head(1, 1, 1024, 32), 1);
    }
}
