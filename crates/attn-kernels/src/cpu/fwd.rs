//! The forward's sweeps (SPEC section 6) over a range of key tiles: stage 1 ([`Stage1`]), and with
//! re-weighting the row constants between the sweeps ([`Between`]) and the second sweep
//! ([`Stage2`]). A whole query tile runs them over all its key tiles ([`forward_tile`]); a short call
//! may split the keys of its rows into ranges run by different threads, whose states then merge
//! ([`Stage1::merge`], [`Stage2::merge`]; `decode` drives that).
//!
//! Ranges start at a multiple of [`FOLD_TILES`] key tiles, so a range folds its row sums into f64
//! where the whole sweep would; merging adds those f64 partials (and the f32 accumulators of `o`)
//! in another order, so a split call agrees with an unsplit one to rounding, not bit for bit.

use std::ops::Range;

use attn_core::{OutputNorm, Plan};

use crate::cpu::act;
use crate::cpu::amx_fwd;
use crate::cpu::engine::{
    Dims, FOLD_TILES, Head, Lanes, Rows, ST_MAX, ST_UMAX, ST_W, ST_Z, STATS, anorm, fold_after, lane_add, lane_max,
    lane_max_into, map_pow_from, negligible_below, offset, scores, take_max, take_sum,
};
use crate::cpu::isa::Isa;
use crate::cpu::math;
use crate::cpu::tile::{self, Aligned};

/// Per-task scratch of the forward, sized for `rows` query rows (a query tile, or a short call's
/// rows).
pub(crate) struct FwdScratch {
    rows: usize,
    /// The most key tiles one sweep of this scratch covers (the stripe's size).
    tiles: usize,
    s: Vec<f32>,
    tmp: Vec<f32>,
    /// The first sweep's activations of the rows, key tile after key tile (`nq x bk_pad` each),
    /// for re-weighting's second sweep; allocated once, on first use.
    stripe: Vec<f32>,
    /// Whether the stripe holds the activations of the last first sweep's range, for the second.
    cached: bool,
    /// Re-weighting's backward helper: `f_ij rho_ij^(p-1)` of one tile (`rows x bk_pad`) and a row
    /// of `rho^(p-1)`; sized on first use.
    aux_w: Vec<f32>,
    aux_row: Vec<f32>,
    /// Under AMX, a tile's weights as the value product's `A` operand, and the product.
    amx_parts: Aligned<u16>,
    amx_stage: Aligned<f32>,
}

impl FwdScratch {
    pub(crate) fn new(dims: Dims, rows: usize) -> Self {
        Self::for_tiles(dims, rows, dims.t.div_ceil(dims.bk))
    }

    /// `slot`'s scratch if it serves `rows` rows at `dims` (the same key tiles, enough rows, a stripe
    /// for every key tile of the call), else a new one there with room for twice the key tiles, so a
    /// cache that grows a key per call re-allocates once per doubling.
    pub(crate) fn reuse(slot: &mut Option<FwdScratch>, dims: Dims, rows: usize) -> &mut FwdScratch {
        let tiles = dims.t.div_ceil(dims.bk);
        let fits = |sc: &FwdScratch| sc.rows >= rows && sc.tiles >= tiles && sc.tmp.len() == dims.bk_pad();
        if !slot.as_ref().is_some_and(fits) {
            *slot = Some(Self::for_tiles(dims, rows, 2 * tiles));
        }
        slot.as_mut().expect("set above")
    }

    /// For sweeps over at most `tiles` key tiles.
    pub(crate) fn for_tiles(dims: Dims, rows: usize, tiles: usize) -> Self {
        let bkp = dims.bk_pad();
        Self {
            rows,
            tiles,
            s: vec![0.0; rows * bkp],
            tmp: vec![0.0; bkp],
            stripe: Vec::new(),
            cached: false,
            aux_w: Vec::new(),
            aux_row: Vec::new(),
            amx_parts: Aligned::empty(),
            amx_stage: Aligned::empty(),
        }
    }
}

/// The rows a sweep runs: rows `[i0, i0 + nq)` of `head` (row `r` of the call is query `r / group`
/// of the sequence, [`Dims::n`]).
#[derive(Clone, Copy)]
pub(crate) struct Query<'a> {
    pub plan: &'a Plan,
    pub head: &'a Head<'a>,
    pub dims: Dims,
    pub i0: usize,
    pub nq: usize,
}

impl Query<'_> {
    /// Key tiles the rows see.
    pub(crate) fn key_tiles(&self) -> usize {
        self.dims.key_tiles(self.i0 + self.nq)
    }
}

/// Stage 1's state of `nq` rows over the key tiles swept so far.
pub(crate) struct Stage1 {
    /// `sum_j f_ij v_j` (`nq x d`), without re-weighting (relative to the running maximum, if any);
    /// from a 64-byte boundary, as AMX's value product loads and stores its rows as tiles.
    acc: Aligned<f32>,
    /// `Z_i` folded so far, and its lanes since the last fold.
    z: Vec<f64>,
    zl: Vec<Lanes>,
    /// The running maximum of the scores (softmax-like `phi`).
    mx: Vec<f32>,
    /// Re-weighting: the largest `f` (the largest raw score, under a running maximum) so far, its
    /// lanes, and per group of [`FOLD_TILES`] key tiles (`nq x groups`).
    fmax: Vec<f32>,
    ml: Vec<Lanes>,
    tmax: Vec<f32>,
    groups: usize,
    /// The rows' constants (scale and bias), which both sweeps apply.
    rows: Rows,
}

impl Stage1 {
    pub(crate) fn new(q: &Query<'_>) -> Self {
        let mut st = Self::empty();
        st.reset(q);
        st
    }

    /// No rows, no buffers.
    const fn empty() -> Self {
        Self {
            acc: Aligned::empty(),
            z: Vec::new(),
            zl: Vec::new(),
            mx: Vec::new(),
            fmax: Vec::new(),
            ml: Vec::new(),
            tmax: Vec::new(),
            groups: 0,
            rows: Rows::empty(),
        }
    }

    /// The state before any key tile, for `q`'s rows, in the buffers it has (no allocation once they
    /// are large enough).
    pub(crate) fn reset(&mut self, q: &Query<'_>) {
        let nq = q.nq;
        self.groups = q.key_tiles().div_ceil(FOLD_TILES);
        self.acc.resize(if q.plan.reweight.is_none() { nq * q.dims.d } else { 0 });
        self.acc.fill(0.0);
        refill(&mut self.z, nq, 0.0);
        refill(&mut self.zl, nq, [0.0; 16]);
        refill(&mut self.mx, nq, f32::NEG_INFINITY);
        refill(&mut self.fmax, nq, f32::NEG_INFINITY);
        refill(&mut self.ml, nq, [f32::NEG_INFINITY; 16]);
        refill(&mut self.tmax, nq * self.groups, f32::NEG_INFINITY);
        self.rows.fill(q.plan, q.head, q.dims, q.i0, nq);
    }

    /// Adds `other`, the state of another range of the same rows: exact up to rounding (under a
    /// running maximum both are first rescaled to the larger maximum, as the sweep rescales).
    pub(crate) fn merge<const FMA: bool>(&mut self, other: &Stage1, d: usize, running_max: bool) {
        for r in 0..self.z.len() {
            let (mut sa, mut sb) = (1.0f32, 1.0f32);
            if running_max {
                let m = self.mx[r].max(other.mx[r]);
                if m > f32::NEG_INFINITY {
                    sa = if self.mx[r] == m { 1.0 } else { math::exp::<FMA>(self.mx[r] - m) };
                    sb = if other.mx[r] == m { 1.0 } else { math::exp::<FMA>(other.mx[r] - m) };
                }
                self.mx[r] = m;
            }
            self.z[r] = self.z[r] * f64::from(sa) + other.z[r] * f64::from(sb);
            self.fmax[r] = self.fmax[r].max(other.fmax[r]);
            if !self.acc.is_empty() {
                let (a, b) = (&mut self.acc[r * d..(r + 1) * d], &other.acc[r * d..(r + 1) * d]);
                a.iter_mut().zip(b).for_each(|(a, &b)| *a = *a * sa + b * sb);
            }
        }
        self.tmax.iter_mut().zip(&other.tmax).for_each(|(a, &b)| *a = a.max(b));
    }
}

/// Stage 1 over key tiles `kts` (starting at a multiple of [`FOLD_TILES`]).
#[inline(always)]
pub(crate) fn sweep1<const FMA: bool>(q: &Query<'_>, kts: Range<usize>, st: &mut Stage1, sc: &mut FwdScratch) {
    let (dims, lds, reweight) = (q.dims, q.dims.bk_pad(), q.plan.reweight);
    // Re-weighting keeps the first sweep's activations (the scores, under a running maximum, which
    // moves until the sweep ends) for the second, where they fit the budget: the same values the
    // second sweep would recompute, bit for bit.
    let tile_len = q.nq * lds;
    if reweight.is_some() && sc.stripe.is_empty() {
        // Once per scratch, at the size of the longest stripe (or the budget): growing it tile by
        // tile would double its capacity and copy it on the way.
        let most = (sc.rows * lds * sc.tiles).min(dims.cache_bytes / 4);
        sc.stripe = vec![0.0; most];
    }
    sc.cached = reweight.is_some() && kts.len() * tile_len <= sc.stripe.len();
    for kt in kts.clone() {
        step1::<FMA>(q, kt, &kts, st, sc);
    }
}

/// Stage 1's step over key tile `kt` of a sweep over `kts` (folding the row sums where that sweep
/// folds them): the tile's scores, their activations and row sums, and (without re-weighting) the
/// value product.
#[inline(always)]
fn step1<const FMA: bool>(q: &Query<'_>, kt: usize, kts: &Range<usize>, st: &mut Stage1, sc: &mut FwdScratch) {
    let (plan, head, dims, i0, nq) = (q.plan, q.head, q.dims, q.i0, q.nq);
    let (d, lds) = (dims.d, dims.bk_pad());
    let rows = &st.rows;
    let reweight = plan.reweight;
    let tile_len = nq * lds;
    // LSSA under AMX: each row in one pass from its raw dot products to the value product's operand.
    let fused = amx_fwd::fuses_softplus(plan, head, dims);
    let rows_pad = nq.next_multiple_of(tile::amx::ROWS);
    if fused {
        sc.amx_parts.resize(tile::amx::PARTS * rows_pad * lds);
        // Rows past `nq` enter the product (which writes none of their outputs): zero, not stale
        // (another tile's rows, under `forward_band`). Empty for whole tiles.
        for p in sc.amx_parts.chunks_exact_mut(rows_pad * lds) {
            p[nq * lds..].fill(0);
        }
    }
    let end = kts.end;
    let j0 = kt * dims.bk;
    let nk = dims.bk.min(dims.t - j0);
    let s: &mut [f32] = if sc.cached {
        let x = kt - kts.start;
        let tile = &mut sc.stripe[x * tile_len..(x + 1) * tile_len];
        scores::<FMA>(plan, head, dims, rows, i0, nq, (j0, nk), tile, lds, false);
        if plan.running_max {
            sc.s[..tile_len].copy_from_slice(tile); // the stripe keeps the raw scores
            &mut sc.s[..]
        } else {
            tile
        }
    } else {
        scores::<FMA>(plan, head, dims, rows, i0, nq, (j0, nk), &mut sc.s, lds, fused);
        &mut sc.s[..]
    };
    for r in 0..nq {
        let vis = dims.visible(i0 + r, j0, nk);
        if fused {
            let ink = plan.cosine().then(|| &head.ink[j0..j0 + vis]);
            let (fb, at) = ((rows.fac[r], rows.bias[r]), (r, rows_pad, lds));
            tile::amx::softplus_row(&s[r * lds..], vis, fb, ink, &mut st.zl[r], &mut sc.amx_parts, at);
        } else {
            let row = &mut s[r * lds..r * lds + lds];
            let (live, dead) = row.split_at_mut(vis);
            dead.fill(0.0);
            if vis > 0 {
                if plan.running_max {
                    let tile_max = lane_max(live);
                    if reweight.is_some() {
                        st.ml[r][0] = st.ml[r][0].max(tile_max); // raw score; f = exp(s - final max) later
                    }
                    if tile_max > st.mx[r] {
                        let rescale = math::exp::<FMA>(st.mx[r] - tile_max);
                        st.z[r] = (st.z[r] + take_sum(&mut st.zl[r])) * rescale as f64;
                        if reweight.is_none() {
                            st.acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= rescale);
                        }
                        st.mx[r] = tile_max;
                    }
                    let m = st.mx[r];
                    live.iter_mut().for_each(|x| *x -= m);
                }
                act::apply::<FMA>(&plan.phi, dims.in_range, dims.isa, live);
                if plan.signed {
                    lane_add::<true>(live, &mut st.zl[r]);
                } else {
                    lane_add::<false>(live, &mut st.zl[r]);
                }
                if reweight.is_some() && !plan.running_max {
                    lane_max_into(live, &mut st.ml[r]);
                }
            }
        }
        if fold_after(kt, end) {
            st.z[r] += take_sum(&mut st.zl[r]);
            if reweight.is_some() {
                let m = take_max(&mut st.ml[r]);
                st.tmax[r * st.groups + kt / FOLD_TILES] = m;
                if !plan.running_max {
                    st.fmax[r] = st.fmax[r].max(m);
                }
            }
        }
    }
    if reweight.is_some() {
        return;
    }
    if head.amx.is_empty() {
        let v = &head.v[j0 * head.ldv..];
        tile::matmul_acc::<FMA>(dims.isa, s, lds, v, head.ldv, nq, nk, d, &mut st.acc, d);
    } else {
        let weights = (!fused).then_some((&s[..], lds));
        let stage = (&mut sc.amx_parts, &mut sc.amx_stage);
        amx_fwd::value_product(head, dims, kt, weights, nq, nk, stage, &mut st.acc);
    }
}

/// Writes the outputs and statistics of a finished stage 1 without re-weighting.
pub(crate) fn finish_plain(q: &Query<'_>, st: &Stage1, out: &mut [f32], stats: &mut [f32]) {
    let (plan, dims, d) = (q.plan, q.dims, q.dims.d);
    for r in 0..q.nq {
        let a = anorm(plan.norm, st.z[r], dims.n(q.i0 + r), dims.t);
        let o = &mut out[r * d..(r + 1) * d];
        o.iter_mut().zip(&st.acc[r * d..(r + 1) * d]).for_each(|(o, &x)| *o = x * a);
        let s = &mut stats[r * STATS..(r + 1) * STATS];
        s.fill(0.0);
        s[ST_Z] = st.z[r] as f32;
        s[ST_MAX] = if plan.running_max { st.mx[r] } else { 0.0 };
        if plan.output_norm == OutputNorm::LayerNorm {
            s[ST_MAX] = layer_norm(o);
        }
    }
}

/// Re-weighting's row constants, from a finished stage 1: `m_i` (`umax`, `<= 0` for a row that
/// falls back to `w = a`), the threshold `f > off / (N anorm)` for `u > 0`, and `anorm`.
pub(crate) struct Between {
    umax: Vec<f32>,
    thr: Vec<f32>,
    an: Vec<f32>,
}

impl Between {
    /// Also rounds `st`'s `Z` to f32 (as the backward will read it, so both compute identical `u`)
    /// and turns its stored group maxima of raw scores (under a running maximum) into `f`.
    #[inline(always)]
    pub(crate) fn new<const FMA: bool>(q: &Query<'_>, st: &mut Stage1) -> Self {
        let mut bt = Self::empty();
        bt.compute::<FMA>(q, st);
        bt
    }

    /// No rows, no buffers.
    const fn empty() -> Self {
        Self { umax: Vec::new(), thr: Vec::new(), an: Vec::new() }
    }

    /// [`Between::new`] into these buffers.
    #[inline(always)]
    pub(crate) fn compute<const FMA: bool>(&mut self, q: &Query<'_>, st: &mut Stage1) {
        let (plan, dims, nq) = (q.plan, q.dims, q.nq);
        let (umax, thr, an) = (&mut self.umax, &mut self.thr, &mut self.an);
        refill(umax, nq, 0.0);
        refill(thr, nq, 0.0);
        refill(an, nq, 0.0);
        for r in 0..nq {
            let n = dims.n(q.i0 + r);
            st.z[r] = st.z[r] as f32 as f64;
            an[r] = anorm(plan.norm, st.z[r], n, dims.t);
            let f_top = if plan.running_max { 1.0 } else { st.fmax[r] };
            // The same expression (and rounding) as each entry's u in sweep 2, so the largest key
            // gets rho = 1 exactly.
            umax[r] = math::fmadd::<FMA>(f_top, n as f32 * an[r], -offset(n)).max(0.0);
            thr[r] = if an[r] > 0.0 { offset(n) / (n as f32 * an[r]) } else { f32::INFINITY };
            if plan.running_max {
                for t in &mut st.tmax[r * st.groups..(r + 1) * st.groups] {
                    *t = if *t == f32::NEG_INFINITY { 0.0 } else { math::exp::<FMA>(*t - st.mx[r]) };
                }
            }
        }
    }
}

/// Re-weighting's second sweep's state of `nq` rows.
pub(crate) struct Stage2 {
    /// `sum_j w_ij v_j` unnormalised (`nq x d`), `W_i` folded and its lanes.
    acc: Vec<f32>,
    wsum: Vec<f64>,
    wl: Vec<Lanes>,
    /// The backward helper: `c_i = sum_j f_ij rho_ij^(p-1)`, its lanes, and
    /// `y_i = sum_j f_ij rho_ij^(p-1) v_j` (`nq x d`; empty when not kept).
    csum: Vec<f64>,
    cl: Vec<Lanes>,
    aux_acc: Vec<f32>,
}

impl Stage2 {
    pub(crate) fn new(q: &Query<'_>, keep_aux: bool) -> Self {
        let mut s2 = Self::empty();
        s2.reset(q, keep_aux);
        s2
    }

    /// No rows, no buffers.
    const fn empty() -> Self {
        Self {
            acc: Vec::new(),
            wsum: Vec::new(),
            wl: Vec::new(),
            csum: Vec::new(),
            cl: Vec::new(),
            aux_acc: Vec::new(),
        }
    }

    /// The state before any key tile, in the buffers it has.
    pub(crate) fn reset(&mut self, q: &Query<'_>, keep_aux: bool) {
        let (nq, d) = (q.nq, q.dims.d);
        refill(&mut self.acc, nq * d, 0.0);
        refill(&mut self.wsum, nq, 0.0);
        refill(&mut self.wl, nq, [0.0; 16]);
        refill(&mut self.csum, nq, 0.0);
        refill(&mut self.cl, nq, [0.0; 16]);
        refill(&mut self.aux_acc, if keep_aux { nq * d } else { 0 }, 0.0);
    }

    /// Adds `other`, the state of another range of the same rows.
    pub(crate) fn merge(&mut self, other: &Stage2) {
        self.acc.iter_mut().zip(&other.acc).for_each(|(a, &b)| *a += b);
        self.wsum.iter_mut().zip(&other.wsum).for_each(|(a, &b)| *a += b);
        self.csum.iter_mut().zip(&other.csum).for_each(|(a, &b)| *a += b);
        self.aux_acc.iter_mut().zip(&other.aux_acc).for_each(|(a, &b)| *a += b);
    }
}

/// Re-weighting's second sweep over key tiles `kts`, the range of the first sweep that `sc` ran;
/// `st` is the stage-1 state of the whole row (merged, for a split call).
#[inline(always)]
pub(crate) fn sweep2<const FMA: bool>(
    q: &Query<'_>,
    kts: Range<usize>,
    st: &Stage1,
    bt: &Between,
    s2: &mut Stage2,
    sc: &mut FwdScratch,
) {
    let (plan, head, dims, i0, nq) = (q.plan, q.head, q.dims, q.i0, q.nq);
    let Some(p) = plan.reweight else { return };
    let (d, lds) = (dims.d, dims.bk_pad());
    let rows = &st.rows;
    let tile_len = nq * lds;
    let keep_aux = !s2.aux_acc.is_empty();
    if keep_aux {
        sc.aux_w.resize(sc.rows * lds, 0.0);
        sc.aux_row.resize(lds, 0.0);
    }
    let end = kts.end;
    // Weights too small to move the output are dropped, so the value products skip their keys; so
    // are the backward helper's terms `f rho^(p-1)` with `rho^(p-1)` as small (`rho^0` is 1).
    let low = negligible_below(p, dims.t);
    let low_aux = negligible_below(p.saturating_sub(1), dims.t);
    for kt in kts.clone() {
        // A group of key tiles where no row has an above-mean key (and no row falls back to w = a)
        // adds nothing.
        let g = kt / FOLD_TILES;
        let needed = (0..nq).any(|r| bt.umax[r] <= 0.0 || st.tmax[r * st.groups + g] > bt.thr[r]);
        if !needed {
            continue;
        }
        let j0 = kt * dims.bk;
        let nk = dims.bk.min(dims.t - j0);
        let s = if sc.cached {
            // f (zero beyond the visible keys), or the raw scores under a running maximum
            let x = kt - kts.start;
            &mut sc.stripe[x * tile_len..(x + 1) * tile_len]
        } else {
            scores::<FMA>(plan, head, dims, rows, i0, nq, (j0, nk), &mut sc.s, lds, false);
            &mut sc.s[..]
        };
        for r in 0..nq {
            let n = dims.n(i0 + r);
            let vis = dims.visible(i0 + r, j0, nk);
            let row = &mut s[r * lds..r * lds + lds];
            let (live, dead) = row.split_at_mut(vis);
            if !sc.cached || plan.running_max {
                dead.fill(0.0);
                if plan.running_max {
                    let m = st.mx[r];
                    live.iter_mut().for_each(|x| *x -= m);
                }
                act::apply::<FMA>(&plan.phi, dims.in_range, dims.isa, live);
            }
            let a = bt.an[r];
            if keep_aux {
                sc.aux_w[r * lds..(r + 1) * lds].fill(0.0);
            }
            if bt.umax[r] <= 0.0 {
                // Empty row: w = a (SPEC section 3 [choice]).
                live.iter_mut().for_each(|x| *x *= a);
            } else {
                let (na, off, inv_m) = (n as f32 * a, offset(n), 1.0 / bt.umax[r]);
                if keep_aux {
                    // f rho^(p-1), from f before `live` becomes rho^p (rho^0 = [rho > 0], as the backward).
                    let rp = &mut sc.aux_row[..vis];
                    rp.iter_mut()
                        .zip(live.iter())
                        .for_each(|(x, &f)| *x = (math::fmadd::<FMA>(f, na, -off)).max(0.0) * inv_m);
                    if p == 1 {
                        rp.iter_mut().for_each(|x| *x = if *x > 0.0 { 1.0 } else { 0.0 });
                    } else {
                        map_pow_from(rp, p - 1, &mut sc.tmp, low_aux, |x| x);
                    }
                    let w = &mut sc.aux_w[r * lds..r * lds + vis];
                    w.iter_mut().zip(rp.iter().zip(live.iter())).for_each(|(w, (&x, &f))| *w = x * f);
                    lane_add::<false>(w, &mut s2.cl[r]);
                }
                map_pow_from(live, p, &mut sc.tmp, low, |x| (math::fmadd::<FMA>(x, na, -off)).max(0.0) * inv_m);
            }
            lane_add::<false>(live, &mut s2.wl[r]);
            if fold_after(kt, end) {
                s2.wsum[r] += take_sum(&mut s2.wl[r]);
                s2.csum[r] += take_sum(&mut s2.cl[r]);
            }
        }
        let v = &head.v[j0 * head.ldv..];
        // Most weights are zero (every key at or below its row's mean activation): the products
        // run over each row's nonzero ones.
        if keep_aux {
            let (a, c) = ([&*s, &sc.aux_w[..]], [&mut s2.acc[..], &mut s2.aux_acc[..]]);
            tile::matmul_acc_nonzero_two::<FMA>(dims.isa, a, lds, v, head.ldv, nq, nk, d, c, d);
        } else {
            tile::matmul_acc_nonzero::<FMA>(dims.isa, s, lds, v, head.ldv, nq, nk, d, &mut s2.acc, d);
        }
    }
}

/// Writes the outputs, statistics and (when kept) the backward helper of finished re-weighted rows.
pub(crate) fn finish_reweighted(
    q: &Query<'_>,
    st: &Stage1,
    bt: &Between,
    s2: &Stage2,
    out: &mut [f32],
    stats: &mut [f32],
    aux: Option<&mut [f32]>,
) {
    let (plan, d) = (q.plan, q.dims.d);
    let mut aux = aux;
    for r in 0..q.nq {
        // (The lanes are empty here: a skipped group skips every one of its tiles, the last included.)
        debug_assert!(s2.wl[r] == [0.0; 16] && s2.cl[r] == [0.0; 16]);
        let scale = if bt.umax[r] <= 0.0 { 1.0 } else { 1.0 / (s2.wsum[r] as f32) };
        let o = &mut out[r * d..(r + 1) * d];
        o.iter_mut().zip(&s2.acc[r * d..(r + 1) * d]).for_each(|(o, &x)| *o = x * scale);
        let s = &mut stats[r * STATS..(r + 1) * STATS];
        s[ST_Z] = st.z[r] as f32;
        s[ST_MAX] = if plan.running_max { st.mx[r] } else { 0.0 };
        s[ST_UMAX] = bt.umax[r];
        s[ST_W] = s2.wsum[r] as f32;
        if let Some(aux) = aux.as_deref_mut() {
            let row = &mut aux[r * (d + 1)..(r + 1) * (d + 1)];
            row[0] = s2.csum[r] as f32;
            row[1..].copy_from_slice(&s2.aux_acc[r * d..(r + 1) * d]);
        }
    }
}

/// `v` holding `n` copies of `x`, in the buffer it has; a buffer that must grow gets room for twice
/// `n`, so that sizes growing with a cache (a key per decoding step) re-allocate once per doubling.
pub(crate) fn refill<T: Copy>(v: &mut Vec<T>, n: usize, x: T) {
    v.clear();
    if v.capacity() < n {
        v.reserve_exact(2 * n);
    }
    v.resize(n, x);
}

/// The states of a query tile's sweeps, kept by a task (or a thread) from one tile to the next so that
/// a tile allocates nothing once the buffers have grown to its sizes.
pub(crate) struct Sweeps {
    st: Stage1,
    bt: Between,
    s2: Stage2,
    /// [`forward_band`]'s states past the first tile's (`st`).
    band: Vec<Stage1>,
}

impl Sweeps {
    pub(crate) const fn new() -> Self {
        Self { st: Stage1::empty(), bt: Between::empty(), s2: Stage2::empty(), band: Vec::new() }
    }

    /// The stage-1 states of a band, first tile first.
    fn states(&mut self) -> impl Iterator<Item = &mut Stage1> {
        std::iter::once(&mut self.st).chain(self.band.iter_mut())
    }
}

crate::multiversion! {
    /// Forward of query rows `[i0, i0 + nq)` of one head over every key they see: writes `nq x d`
    /// outputs to `out` (row stride `d`) and `nq x STATS` statistics to `stats`; with re-weighting
    /// and `aux`, also the `nq x (d + 1)` backward helper (see [`super::Params::rw_aux`]).
    pub(crate) fn forward_tile<const FMA: bool>(
        isa: Isa,
        q: &Query<'_>,
        sc: &mut FwdScratch,
        sw: &mut Sweeps,
        out: &mut [f32],
        stats: &mut [f32],
        aux: Option<&mut [f32]>,
    ) {
        let kts = 0..q.key_tiles();
        let Sweeps { st, bt, s2, .. } = sw;
        st.reset(q);
        sweep1::<FMA>(q, kts.clone(), st, sc);
        if q.plan.reweight.is_none() {
            return finish_plain(q, st, out, stats);
        }
        bt.compute::<FMA>(q, st);
        s2.reset(q, aux.is_some());
        sweep2::<FMA>(q, kts, st, bt, s2, sc);
        finish_reweighted(q, st, bt, s2, out, stats, aux)
    }
}

crate::multiversion! {
    /// [`forward_tile`] of `qs`, consecutive query tiles of one head, without re-weighting, in
    /// lockstep: key tile after key tile, each query tile that sees it, so that a key tile's
    /// operands are read from memory once for all of `qs` (then from L2) instead of once a query
    /// tile. The same values, bit for bit, as `forward_tile` of each: every tile runs the same steps
    /// in the same order. `out` and `stats` take `qs`' rows in turn.
    pub(crate) fn forward_band<const FMA: bool>(
        isa: Isa,
        qs: &[Query<'_>],
        sc: &mut FwdScratch,
        sw: &mut Sweeps,
        out: &mut [f32],
        stats: &mut [f32],
    ) {
        let Some((first, rest)) = qs.split_first() else { return };
        assert!(first.plan.reweight.is_none(), "a band runs no re-weighting");
        if sw.band.len() < rest.len() {
            sw.band.resize_with(rest.len(), Stage1::empty);
        }
        qs.iter().zip(sw.states()).for_each(|(q, st)| st.reset(q));
        sc.cached = false;
        let tiles = qs.iter().map(Query::key_tiles).max().unwrap_or(0);
        for kt in 0..tiles {
            for (q, st) in qs.iter().zip(sw.states()) {
                let kts = 0..q.key_tiles();
                if kts.contains(&kt) {
                    step1::<FMA>(q, kt, &kts, st, sc);
                }
            }
        }
        let (d, mut out, mut stats) = (first.dims.d, out, stats);
        for (q, st) in qs.iter().zip(sw.states()) {
            let (o, o_rest) = out.split_at_mut(q.nq * d);
            let (s, s_rest) = stats.split_at_mut(q.nq * STATS);
            finish_plain(q, st, o, s);
            (out, stats) = (o_rest, s_rest);
        }
    }
}

crate::multiversion! {
    /// Stage 1 of `q`'s rows over key tiles `kts` ([`sweep1`]), for a split call.
    pub(crate) fn range1<const FMA: bool>(isa: Isa, q: &Query<'_>, kts: Range<usize>, st: &mut Stage1, sc: &mut FwdScratch) {
        sweep1::<FMA>(q, kts, st, sc)
    }
}

crate::multiversion! {
    /// Merges the stage-1 states of a split call's ranges into the first one, then (with
    /// re-weighting) the row constants between the sweeps.
    pub(crate) fn merge1<const FMA: bool>(isa: Isa, q: &Query<'_>, states: &mut [Stage1]) -> Option<Between> {
        let (first, rest) = states.split_first_mut().expect("a split call has ranges");
        for other in rest.iter() {
            first.merge::<FMA>(other, q.dims.d, q.plan.running_max);
        }
        q.plan.reweight.map(|_| Between::new::<FMA>(q, first))
    }
}

crate::multiversion! {
    /// Re-weighting's second sweep over key tiles `kts` ([`sweep2`]), for a split call.
    pub(crate) fn range2<const FMA: bool>(
        isa: Isa,
        q: &Query<'_>,
        kts: Range<usize>,
        st: &Stage1,
        bt: &Between,
        s2: &mut Stage2,
        sc: &mut FwdScratch,
    ) {
        sweep2::<FMA>(q, kts, st, bt, s2, sc)
    }
}

/// In-place parameter-free layer norm over the row (eps 1e-5, biased variance); returns sigma.
fn layer_norm(o: &mut [f32]) -> f32 {
    let n = o.len() as f64;
    let mean = o.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = o.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    let sigma = (var + attn_core::stage::LAYER_NORM_EPS).sqrt();
    o.iter_mut().for_each(|x| *x = ((*x as f64 - mean) / sigma) as f32);
    sigma as f32
}
