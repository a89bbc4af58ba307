//! The streaming algorithms of SPEC section 6 on f32 tiles: stage 1 in one sweep, stage 1 +
//! re-weighting in two, and the backward with recomputation (its kernels are in
//! [`grad`](super::grad), on the tile helpers here). Never allocates anything `T x T`.
//!
//! Work split (rayon, inside the caller's pool):
//!
//! - forward: one task per `(batch, head, query tile)`; each task streams the key tiles `j <= i`.
//! - backward phase A (re-weighting only): per query tile, one sweep for `E_i` (SPEC section 5).
//! - backward phase B: one task per `(batch, head, key chunk)`, FlashAttention-2 style: a key tile
//!   owns its `dk`, `dv` rows and streams the query tiles `i >= j`; the `dq` contributions go to a
//!   per-task partial buffer (`T x d`), summed in phase C. A head is split into several key chunks
//!   only when there are fewer heads than threads; chunk `c` takes key tiles `c, c + chunks, ...`,
//!   which balances the causal triangle.
//!
//! Precision: tiles and accumulators of `o`, `dq`, `dk`, `dv` are f32; row normalisers (`Z_i`, `W_i`,
//! `E_i`) are summed per tile in f32 and across tiles in f64.

use attn_core::{Norm, OutputNorm, Plan};

use crate::cpu::act;
use crate::cpu::isa::Isa;
use crate::cpu::math;
use crate::cpu::short::{dot, fold_lanes, inv_norm_from, lanes_sq_norm};
use crate::cpu::tile::{self, pad_nr};

/// Tile sizes and scratch budgets: tuning knobs, separate from the maths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuning {
    /// Query rows per tile (and per forward task).
    pub block_q: usize,
    /// Keys per tile.
    pub block_k: usize,
    /// Re-weighted forwards: the largest per-task scratch, in bytes, for keeping a query tile's
    /// activations `f_ij` from the first sweep for the second (`block_q x T` floats: linear in `T`,
    /// never `T x T`). Within it the second sweep reads `f` instead of recomputing the scores and
    /// the activation (under a running maximum, as in `softmax+rw`, it keeps the scores and
    /// recomputes only `exp(s - max)`); above it (or at 0) it recomputes both. The results are the
    /// same bit for bit either way.
    pub score_cache_bytes: usize,
    /// Re-weighted variants: whether the ndarray [`backward`](super::backward) keeps the forward's
    /// re-weighting helper ([`super::Params::rw_aux`]), which spares the backward its `E_i` sweep
    /// over the keys. Off, the backward runs that sweep (as the raw entry points do without the
    /// helper). Same gradients up to rounding.
    pub reweight_helper: bool,
}

impl Default for Tuning {
    /// 64 x 64: at d = 64 a tile's `q`, `k`, `v` and scores (64 KiB in all) stay in L2 of any x86
    /// core; 128-key tiles measured no faster and waste more of the diagonal tile. A 16 MiB score
    /// cache per task covers `T` up to 64K at 64 query rows.
    fn default() -> Self {
        Self { block_q: 64, block_k: 64, score_cache_bytes: 16 << 20, reweight_helper: true }
    }
}

/// Number of f32 statistics saved per row by the forward for the backward.
pub(crate) const STATS: usize = 4;
// Layout of a row's statistics.
pub(super) const ST_Z: usize = 0; // l1 normaliser Z_i (relative to the running max for softmax)
pub(super) const ST_MAX: usize = 1; // running max of s (softmax), or sigma of the layer norm (relu-ln)
pub(super) const ST_UMAX: usize = 2; // m_i = max_j relu(u_ij) (re-weighting; <= 0 means the fallback w = a)
pub(super) const ST_W: usize = 3; // W_i = sum_j (relu(u_ij)/m_i)^p

/// One head's inputs: `T` rows of `d` contiguous floats each, with row strides.
#[derive(Clone, Copy)]
pub(crate) struct Head<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub ldq: usize,
    pub ldk: usize,
    pub ldv: usize,
    /// `1 / max(||q_i||, 1e-12)` per row for cosine scores, else empty.
    pub inq: &'a [f32],
    /// Same for keys; empty in a forward of at most [`DIRECT_MAX_ROWS`](super::short::DIRECT_MAX_ROWS) query rows, whose scores
    /// take each key's norm in the pass that reads it for the dot products.
    pub ink: &'a [f32],
    /// `K` packed per key tile as `d x pad_nr(bk)` transposes ([`pack_head`]), tile after tile; empty
    /// in a forward of at most [`DIRECT_MAX_ROWS`](super::short::DIRECT_MAX_ROWS) query rows, whose scores are dot products of `q`
    /// with `k`'s rows as they are.
    pub kt: &'a [f32],
    /// `V` packed the same way (backward only; empty in the forward).
    pub vt: &'a [f32],
}

/// Packs every key tile of one head's `x` (rows of `d`, stride `ld`) transposed, for
/// [`tile::matmul_nt`]: tile `kt` occupies `out[kt * d * pad_nr(bk)..][..d * pad_nr(bk)]`. Done once per
/// head and call, instead of once per (query tile, key tile) pair: the scalar transpose cost as much
/// as the score product itself when repeated (measured, see `tile.rs`).
pub(crate) fn pack_head(x: &[f32], ld: usize, dims: Dims, out: &mut [f32]) {
    let tile = dims.d * dims.bk_pad();
    for (kt, dst) in out.chunks_exact_mut(tile).enumerate() {
        let j0 = kt * dims.bk;
        if j0 >= dims.t {
            break;
        }
        let nk = dims.bk.min(dims.t - j0);
        // Full tiles use the stride of the full block so that every tile has the same layout.
        tile::pack_transposed_padded(&x[j0 * ld..], ld, nk, dims.d, dims.bk_pad(), dst);
    }
}

/// Floats of one head's packed tiles.
pub(crate) fn packed_len(dims: Dims) -> usize {
    dims.t.div_ceil(dims.bk) * dims.d * dims.bk_pad()
}

/// Key tiles per fold: a row's 16 lane sums (and maxima) run over this many key tiles before they
/// fold into the row's f64 normaliser. A fold of 16 lanes costs about as much as summing a 64-key
/// row itself (LLVM extracts the lanes one by one): folding once per tile took 9% of the LSSA
/// forward and 14% of LSSAR's (T = 4096, AVX-512, measured by leaving the fold out). Each lane
/// adds at most `FOLD_TILES * block_k / 16` terms in f32 (32 at the default tiles) before its f64
/// fold.
pub(super) const FOLD_TILES: usize = 8;

/// 16 lanes of running sums or maxima of one row, folded every [`FOLD_TILES`] key tiles.
pub(super) type Lanes = [f32; 16];

/// `acc[l] += sum of xs[l + 16 c]` (of `|x|` when `ABS`): 16 independent lanes, so it vectorises
/// (a plain `iter().sum()` is a serial chain of scalar adds under IEEE ordering); no fold.
#[inline(always)]
pub(super) fn lane_add<const ABS: bool>(xs: &[f32], acc: &mut Lanes) {
    let term = |x: f32| if ABS { x.abs() } else { x };
    let chunks = xs.chunks_exact(16);
    let rem = chunks.remainder();
    for c in chunks {
        for l in 0..16 {
            acc[l] += term(c[l]);
        }
    }
    rem.iter().zip(acc.iter_mut()).for_each(|(&x, a)| *a += term(x));
}

/// `acc[l] = max(acc[l], max of xs[l + 16 c])`: [`lane_add`] for the maximum.
#[inline(always)]
fn lane_max_into(xs: &[f32], acc: &mut Lanes) {
    let chunks = xs.chunks_exact(16);
    let rem = chunks.remainder();
    for c in chunks {
        for l in 0..16 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    rem.iter().zip(acc.iter_mut()).for_each(|(&x, a)| *a = if x > *a { x } else { *a });
}

/// The sum of `acc`'s lanes as f64, resetting them to 0.
#[inline(always)]
pub(super) fn take_sum(acc: &mut Lanes) -> f64 {
    let s = fold_lanes(*acc, |a, b| a + b);
    *acc = [0.0; 16];
    f64::from(s)
}

/// The maximum of `acc`'s lanes, resetting them to `-inf`.
#[inline(always)]
fn take_max(acc: &mut Lanes) -> f32 {
    let m = fold_lanes(*acc, |a, b| if b > a { b } else { a });
    *acc = [f32::NEG_INFINITY; 16];
    m
}

/// Whether a row's lanes fold after key tile `kt` of `nkt`.
#[inline(always)]
pub(super) fn fold_after(kt: usize, nkt: usize) -> bool {
    (kt + 1).is_multiple_of(FOLD_TILES) || kt + 1 == nkt
}

/// Maximum of a slice (`-inf` when empty), vectorisable.
#[inline(always)]
fn lane_max(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    lane_max_into(xs, &mut acc);
    take_max(&mut acc)
}

/// Sizes shared by every tile of a call.
#[derive(Clone, Copy)]
pub(crate) struct Dims {
    /// The instruction set of this call (the micro-kernels dispatch on it).
    pub isa: Isa,
    /// Keys `T_k`: the length of the causal sequence.
    pub t: usize,
    /// Rows of the sequence before the first query row (`T_k - T_q`): query row `r` (the index into
    /// every per-row array) is row `off + r` of the sequence, with `N = off + r + 1` keys visible.
    pub off: usize,
    pub d: usize,
    pub bq: usize,
    pub bk: usize,
    /// [`Tuning::score_cache_bytes`].
    pub cache_bytes: usize,
    /// Every score of the call lies within `±math::IN_RANGE_MAX` ([`scores_in_range`]), so `phi`
    /// may skip its range handling.
    pub in_range: bool,
}

impl Dims {
    pub(crate) fn bk_pad(&self) -> usize {
        pad_nr(self.bk)
    }

    /// Query rows `T_q`.
    pub(crate) fn tq(&self) -> usize {
        self.t - self.off
    }

    /// `N` of query row `r`: the keys it sees.
    #[inline(always)]
    pub(crate) fn n(&self, r: usize) -> usize {
        self.off + r + 1
    }

    /// Keys of tile `[j0, j0 + nk)` visible from query row `r` (causal).
    #[inline(always)]
    pub(crate) fn visible(&self, r: usize, j0: usize, nk: usize) -> usize {
        self.n(r).saturating_sub(j0).min(nk)
    }

    /// Key tiles that query rows `[0, end)` see.
    pub(crate) fn key_tiles(&self, end: usize) -> usize {
        (self.off + end).div_ceil(self.bk)
    }
}

/// Whether every score `s_ij = scale_i cos(q_i, k_j) + b_i` of a call lies within
/// `±math::IN_RANGE_MAX`, for cosine scores at length `t` and head dimension `d`, given every row's
/// inverse norm (`inv_norms`: the `inq` and `ink` of every head). Two conditions: no dot product
/// `q_i . k_j` overflows f32 (`max |q| max |k| < 1e30`), and `|scale_i| + |b_i|` stays below the range
/// with a margin of 1e-3 for the rounding of the cosine (at most `d` ulps of it: 4e-6 at `d = 64`)
/// and of the constants. Always false for dot-product scores, which no such bound covers.
pub(crate) fn scores_in_range(plan: &Plan, inv_norms: &[f32], t: usize, d: usize) -> bool {
    if !plan.cosine() || inv_norms.is_empty() {
        return false;
    }
    // inv = 1 / max(|x|, 1e-12), so the largest norm of any row is 1 / (smallest inv).
    let smallest = inv_norms.iter().fold(f32::INFINITY, |m, &x| m.min(x));
    let largest_norm = 1.0 / f64::from(smallest);
    let no_overflow = largest_norm * largest_norm < 1e30;
    if !no_overflow {
        return false;
    }
    let bound = (1..=t)
        .map(|n| {
            let (scale, b) = plan.row_constants(n, d);
            scale.abs() + b.abs()
        })
        .fold(0.0f64, f64::max);
    bound * 1.001 <= f64::from(math::IN_RANGE_MAX)
}

/// Per-row constants of a query tile: `fac = scale_i * inq_i`, `bias`, `n = N_i`.
pub(super) struct Rows {
    pub(super) fac: Vec<f32>,
    bias: Vec<f32>,
}

impl Rows {
    pub(super) fn new(plan: &Plan, head: &Head<'_>, dims: Dims, i0: usize, nq: usize) -> Self {
        let mut fac = Vec::with_capacity(nq);
        let mut bias = Vec::with_capacity(nq);
        for r in 0..nq {
            let (scale, b) = plan.row_constants(dims.n(i0 + r), dims.d);
            let inq = if plan.cosine() { head.inq[i0 + r] as f64 } else { 1.0 };
            fac.push((scale * inq) as f32);
            bias.push(b as f32);
        }
        Self { fac, bias }
    }
}

/// Scores `s_ij` of rows `[i0, i0 + nq)` against keys `[j0, j0 + nk)` into `s` (row stride `lds`),
/// with `kt` as scratch for the packed key tile. Entries beyond the visible keys are left unspecified.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn scores<const FMA: bool>(
    plan: &Plan,
    head: &Head<'_>,
    dims: Dims,
    rows: &Rows,
    i0: usize,
    nq: usize,
    j0: usize,
    nk: usize,
    s: &mut [f32],
    lds: usize,
) {
    if head.kt.is_empty() {
        // Unpacked keys (a short forward): with cosine scores and no precomputed key norms, each
        // key's norm comes from the same read as its dot product, and the scale is applied here.
        let d = dims.d;
        let fused_norms = plan.cosine() && head.ink.is_empty();
        let key = |j: usize| &head.k[j * head.ldk..j * head.ldk + d];
        for r in 0..nq {
            let q = &head.q[(i0 + r) * head.ldq..(i0 + r) * head.ldq + d];
            let row = &mut s[r * lds..r * lds + dims.visible(i0 + r, j0, nk)];
            if !fused_norms {
                for (c, x) in row.iter_mut().enumerate() {
                    *x = dot::<FMA>(q, key(j0 + c));
                }
                continue;
            }
            // The keys' norms as the backward's `inv_norms_short` takes them, in chunks of 64.
            let (a, b) = (rows.fac[r], rows.bias[r]);
            let (mut k2, mut kn) = ([0.0f32; 64], [0.0f32; 64]);
            for (c0, part) in row.chunks_mut(64).enumerate() {
                let (k2, kn) = (&mut k2[..part.len()], &mut kn[..part.len()]);
                for c in 0..part.len() {
                    let k = key(j0 + 64 * c0 + c);
                    (part[c], k2[c]) = (dot::<FMA>(q, k), lanes_sq_norm(k));
                }
                for c in 0..part.len() {
                    kn[c] = 1.0 / k2[c].sqrt().max(1e-12);
                }
                for c in 0..part.len() {
                    if !k2[c].is_finite() {
                        kn[c] = inv_norm_from(k2[c], key(j0 + 64 * c0 + c));
                    }
                }
                for c in 0..part.len() {
                    part[c] = math::fmadd::<FMA>(part[c] * a, kn[c], b);
                }
            }
        }
        if fused_norms {
            return;
        }
    } else {
        let kt = &head.kt[j0 / dims.bk * dims.d * dims.bk_pad()..];
        tile::matmul_nt::<FMA>(dims.isa, &head.q[i0 * head.ldq..], head.ldq, kt, dims.bk_pad(), dims.d, nq, s, lds);
    }
    for r in 0..nq {
        let vis = dims.visible(i0 + r, j0, nk);
        let row = &mut s[r * lds..r * lds + vis];
        let (a, b) = (rows.fac[r], rows.bias[r]);
        if plan.cosine() {
            let ink = &head.ink[j0..j0 + vis];
            row.iter_mut().zip(ink).for_each(|(x, &kn)| *x = math::fmadd::<FMA>(*x * a, kn, b));
        } else {
            row.iter_mut().for_each(|x| *x = math::fmadd::<FMA>(*x, a, b));
        }
    }
}

/// `x^P` with `P` known at compile time: the squarings unroll and stay in registers.
#[inline(always)]
fn pow_one<const P: u32>(x: f32) -> f32 {
    let (mut base, mut acc, mut e) = (x, 1.0f32, P);
    while e > 0 {
        if e & 1 == 1 {
            acc *= base;
        }
        base *= base;
        e >>= 1;
    }
    acc
}

/// `xs <- g(xs)^p` (`g` element-wise): the powers the paper and its sweeps use (and their `p - 1`
/// for gradients) are compiled as constants, one pass with `g` fused in and the squarings in
/// registers; any other `p` applies `g`, then runs repeated squaring over the slice (`tmp` is
/// scratch of the same length), one pass per bit of `p`. The same values either way.
#[inline(always)]
pub(super) fn map_pow(xs: &mut [f32], p: u32, tmp: &mut [f32], g: impl Fn(f32) -> f32) {
    macro_rules! compiled {
        ($($p:literal)*) => {
            match p {
                $($p => return xs.iter_mut().for_each(|x| *x = pow_one::<$p>(g(*x))),)*
                _ => {}
            }
        };
    }
    compiled!(1 2 3 4 5 7 8 14 15 24 25 49 50 63 64);
    xs.iter_mut().for_each(|x| *x = g(*x));
    if p == 0 {
        return xs.fill(1.0);
    }
    let n = xs.len();
    let base = &mut tmp[..n];
    base.copy_from_slice(xs);
    xs.fill(1.0);
    let mut e = p;
    loop {
        if e & 1 == 1 {
            xs.iter_mut().zip(base.iter()).for_each(|(x, &b)| *x *= b);
        }
        e >>= 1;
        if e == 0 {
            break;
        }
        base.iter_mut().for_each(|b| *b *= *b);
    }
}

/// `xs <- xs^p` ([`map_pow`] with no map).
#[inline(always)]
pub(super) fn pow_slice(xs: &mut [f32], p: u32, tmp: &mut [f32]) {
    map_pow(xs, p, tmp, |x| x)
}

/// Stage-1 normalising factor of a row with `n = N_i` keys in a sequence of `t = T` keys:
/// `a_ij = f_ij * anorm`.
#[inline(always)]
pub(super) fn anorm(norm: Norm, z: f64, n: usize, t: usize) -> f32 {
    match norm {
        Norm::L1 => {
            if z == 0.0 {
                0.0
            } else {
                (1.0 / z) as f32
            }
        }
        Norm::None => 1.0,
        Norm::DivN => 1.0 / n as f32,
        Norm::DivLen => 1.0 / t as f32,
    }
}

#[inline(always)]
pub(super) fn offset(n: usize) -> f32 {
    attn_core::reweight_offset(n) as f32
}

/// Per-task scratch of the forward, sized for one query tile.
pub(crate) struct FwdScratch {
    s: Vec<f32>,
    acc: Vec<f32>,
    tmp: Vec<f32>,
    /// Re-weighting: each row's largest `f` per group of [`FOLD_TILES`] key tiles (`bq x groups`).
    tmax: Vec<f32>,
    /// The first sweep's activations of a query tile, key tile after key tile (`nq x bk_pad`
    /// each), for re-weighting's second sweep; allocated once, on first use.
    stripe: Vec<f32>,
    /// Re-weighting's backward helper: `f_ij rho_ij^(p-1)` of one tile (`bq x bk_pad`), a row of
    /// `rho^(p-1)`, and `sum_j f_ij rho_ij^(p-1) v_j` (`bq x d`); sized on first use.
    aux_w: Vec<f32>,
    aux_row: Vec<f32>,
    aux_acc: Vec<f32>,
}

impl FwdScratch {
    pub(crate) fn new(dims: Dims) -> Self {
        let bkp = dims.bk_pad();
        let nkt = dims.t.div_ceil(dims.bk);
        Self {
            s: vec![0.0; dims.bq * bkp],
            acc: vec![0.0; dims.bq * dims.d],
            tmp: vec![0.0; bkp],
            tmax: vec![0.0; dims.bq * nkt.div_ceil(FOLD_TILES)],
            stripe: Vec::new(),
            aux_w: Vec::new(),
            aux_row: Vec::new(),
            aux_acc: Vec::new(),
        }
    }
}

crate::multiversion! {
    /// Forward of query rows `[i0, i0 + nq)` of one head: writes `nq x d` outputs to `out` (row
    /// stride `d`) and `nq x STATS` statistics to `stats`; with re-weighting and `aux`, also the
    /// `nq x (d + 1)` backward helper (see [`super::Params::rw_aux`]).
    pub(crate) fn forward_tile<const FMA: bool>(
        isa: Isa,
        plan: &Plan,
        head: &Head<'_>,
        dims: Dims,
        i0: usize,
        nq: usize,
        sc: &mut FwdScratch,
        out: &mut [f32],
        stats: &mut [f32],
        aux: Option<&mut [f32]>,
    ) {
        forward_body::<FMA>(plan, head, dims, i0, nq, sc, out, stats, aux)
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn forward_body<const FMA: bool>(
    plan: &Plan,
    head: &Head<'_>,
    dims: Dims,
    i0: usize,
    nq: usize,
    sc: &mut FwdScratch,
    out: &mut [f32],
    stats: &mut [f32],
    mut aux: Option<&mut [f32]>,
) {
    let d = dims.d;
    let lds = dims.bk_pad();
    let rows = Rows::new(plan, head, dims, i0, nq);
    let nkt = dims.key_tiles(i0 + nq);
    let acc = &mut sc.acc[..nq * d];
    acc.fill(0.0);
    let mut z = vec![0.0f64; nq];
    let mut mx = vec![f32::NEG_INFINITY; nq];
    let mut fmax = vec![f32::NEG_INFINITY; nq];
    // Per row, the lane sums of Z and the lane maxima of f since the last fold (FOLD_TILES).
    let mut zl = vec![[0.0f32; 16]; nq];
    let mut ml = vec![[f32::NEG_INFINITY; 16]; nq];
    // Re-weighting's skip test works per group of FOLD_TILES key tiles: `tmax` holds each row's
    // largest f (or raw score, under a running maximum) per group.
    let ngroups = nkt.div_ceil(FOLD_TILES);
    let reweight = plan.reweight;
    // Re-weighting keeps the first sweep's activations (the scores, under a running maximum, which
    // moves until the sweep ends) for the second, where they fit the budget: the same values the
    // second sweep would recompute, bit for bit.
    let tile_len = nq * lds;
    let cacheable = reweight.is_some();
    if cacheable && sc.stripe.is_empty() {
        // Once per scratch, at the size of the last query tile's stripe (or the budget): growing it
        // tile by tile would double its capacity and copy it on the way.
        let most = (dims.bq * lds * dims.t.div_ceil(dims.bk)).min(dims.cache_bytes / 4);
        sc.stripe = vec![0.0; most];
    }
    let cached = cacheable && nkt * tile_len <= sc.stripe.len();

    // Sweep 1: stage 1 (and, with re-weighting, only its statistics).
    for kt in 0..nkt {
        let j0 = kt * dims.bk;
        let nk = dims.bk.min(dims.t - j0);
        let s: &mut [f32] = if cached {
            let tile = &mut sc.stripe[kt * tile_len..(kt + 1) * tile_len];
            scores::<FMA>(plan, head, dims, &rows, i0, nq, j0, nk, tile, lds);
            if plan.running_max {
                sc.s[..tile_len].copy_from_slice(tile); // the stripe keeps the raw scores
                &mut sc.s[..]
            } else {
                tile
            }
        } else {
            scores::<FMA>(plan, head, dims, &rows, i0, nq, j0, nk, &mut sc.s, lds);
            &mut sc.s[..]
        };
        for r in 0..nq {
            let vis = dims.visible(i0 + r, j0, nk);
            let row = &mut s[r * lds..r * lds + lds];
            let (live, dead) = row.split_at_mut(vis);
            dead.fill(0.0);
            if vis > 0 {
                if plan.running_max {
                    let tile_max = lane_max(live);
                    if reweight.is_some() {
                        ml[r][0] = ml[r][0].max(tile_max); // raw score; f = exp(s - final max) later
                    }
                    if tile_max > mx[r] {
                        let rescale = math::exp::<FMA>(mx[r] - tile_max);
                        z[r] = (z[r] + take_sum(&mut zl[r])) * rescale as f64;
                        acc[r * d..(r + 1) * d].iter_mut().for_each(|a| *a *= rescale);
                        mx[r] = tile_max;
                    }
                    let m = mx[r];
                    live.iter_mut().for_each(|x| *x -= m);
                }
                act::apply::<FMA>(&plan.phi, dims.in_range, live);
                if plan.signed {
                    lane_add::<true>(live, &mut zl[r]);
                } else {
                    lane_add::<false>(live, &mut zl[r]);
                }
                if reweight.is_some() && !plan.running_max {
                    lane_max_into(live, &mut ml[r]);
                }
            }
            if fold_after(kt, nkt) {
                z[r] += take_sum(&mut zl[r]);
                if reweight.is_some() {
                    let m = take_max(&mut ml[r]);
                    sc.tmax[r * ngroups + kt / FOLD_TILES] = m;
                    if !plan.running_max {
                        fmax[r] = fmax[r].max(m);
                    }
                }
            }
        }
        if reweight.is_none() {
            let v = &head.v[j0 * head.ldv..];
            tile::matmul_acc::<FMA>(dims.isa, s, lds, v, head.ldv, nq, nk, d, acc, d);
        }
    }

    let Some(p) = reweight else {
        for r in 0..nq {
            let n = dims.n(i0 + r);
            let a = anorm(plan.norm, z[r], n, dims.t);
            let o = &mut out[r * d..(r + 1) * d];
            o.iter_mut().zip(&acc[r * d..(r + 1) * d]).for_each(|(o, &x)| *o = x * a);
            let st = &mut stats[r * STATS..(r + 1) * STATS];
            st.fill(0.0);
            st[ST_Z] = z[r] as f32;
            st[ST_MAX] = if plan.running_max { mx[r] } else { 0.0 };
            if plan.output_norm == OutputNorm::LayerNorm {
                st[ST_MAX] = layer_norm(o);
            }
        }
        return;
    };

    // Between the sweeps: m_i, the fallback rows, and the threshold f > off / (N anorm) for u > 0.
    let mut umax = vec![0.0f32; nq];
    let mut thr = vec![0.0f32; nq];
    let mut an = vec![0.0f32; nq];
    for r in 0..nq {
        let n = dims.n(i0 + r);
        // Z as the backward will see it (stored in f32), so both passes compute identical u.
        z[r] = z[r] as f32 as f64;
        an[r] = anorm(plan.norm, z[r], n, dims.t);
        let f_top = if plan.running_max { 1.0 } else { fmax[r] };
        // The same expression (and rounding) as each entry's u in sweep 2, so the largest key gets
        // rho = 1 exactly.
        umax[r] = math::fmadd::<FMA>(f_top, n as f32 * an[r], -offset(n)).max(0.0);
        thr[r] = if an[r] > 0.0 { offset(n) / (n as f32 * an[r]) } else { f32::INFINITY };
        if plan.running_max {
            // Stored group maxima are raw scores: turn them into f relative to the final maximum.
            for g in 0..ngroups {
                let t = &mut sc.tmax[r * ngroups + g];
                *t = if *t == f32::NEG_INFINITY { 0.0 } else { math::exp::<FMA>(*t - mx[r]) };
            }
        }
    }
    acc.fill(0.0);
    let mut wsum = vec![0.0f64; nq];
    let mut wl = vec![[0.0f32; 16]; nq];
    // The backward helper: c_i = sum_j f_ij rho_ij^(p-1) and y_i = sum_j f_ij rho_ij^(p-1) v_j, so the
    // backward's E_i is (<g_i, y_i> - D'_i c_i) times a row constant, without a sweep of its own.
    let keep_aux = aux.is_some();
    let mut csum = vec![0.0f64; nq];
    let mut cl = vec![[0.0f32; 16]; nq];
    if keep_aux {
        sc.aux_w.resize(dims.bq * lds, 0.0);
        sc.aux_row.resize(lds, 0.0);
        sc.aux_acc.resize(dims.bq * d, 0.0);
        sc.aux_acc[..nq * d].fill(0.0);
    }
    for kt in 0..nkt {
        // A group of key tiles where no row has an above-mean key (and no row falls back to w = a)
        // adds nothing.
        let g = kt / FOLD_TILES;
        let needed = (0..nq).any(|r| umax[r] <= 0.0 || sc.tmax[r * ngroups + g] > thr[r]);
        if !needed {
            continue;
        }
        let j0 = kt * dims.bk;
        let nk = dims.bk.min(dims.t - j0);
        let s = if cached {
            // f (zero beyond the visible keys), or the raw scores under a running maximum
            &mut sc.stripe[kt * tile_len..(kt + 1) * tile_len]
        } else {
            scores::<FMA>(plan, head, dims, &rows, i0, nq, j0, nk, &mut sc.s, lds);
            &mut sc.s[..]
        };
        for r in 0..nq {
            let n = dims.n(i0 + r);
            let vis = dims.visible(i0 + r, j0, nk);
            let row = &mut s[r * lds..r * lds + lds];
            let (live, dead) = row.split_at_mut(vis);
            if !cached || plan.running_max {
                dead.fill(0.0);
                if plan.running_max {
                    let m = mx[r];
                    live.iter_mut().for_each(|x| *x -= m);
                }
                act::apply::<FMA>(&plan.phi, dims.in_range, live);
            }
            let a = an[r];
            if keep_aux {
                sc.aux_w[r * lds..(r + 1) * lds].fill(0.0);
            }
            if umax[r] <= 0.0 {
                // Empty row: w = a (SPEC section 3 [choice]).
                live.iter_mut().for_each(|x| *x *= a);
            } else {
                let (na, off, inv_m) = (n as f32 * a, offset(n), 1.0 / umax[r]);
                if keep_aux {
                    // f rho^(p-1), from f before `live` becomes rho^p (rho^0 = [rho > 0], as the backward).
                    let rp = &mut sc.aux_row[..vis];
                    rp.iter_mut()
                        .zip(live.iter())
                        .for_each(|(x, &f)| *x = (math::fmadd::<FMA>(f, na, -off)).max(0.0) * inv_m);
                    if p == 1 {
                        rp.iter_mut().for_each(|x| *x = if *x > 0.0 { 1.0 } else { 0.0 });
                    } else {
                        pow_slice(rp, p - 1, &mut sc.tmp);
                    }
                    let w = &mut sc.aux_w[r * lds..r * lds + vis];
                    w.iter_mut().zip(rp.iter().zip(live.iter())).for_each(|(w, (&x, &f))| *w = x * f);
                    lane_add::<false>(w, &mut cl[r]);
                }
                map_pow(live, p, &mut sc.tmp, |x| (math::fmadd::<FMA>(x, na, -off)).max(0.0) * inv_m);
            }
            lane_add::<false>(live, &mut wl[r]);
            if fold_after(kt, nkt) {
                wsum[r] += take_sum(&mut wl[r]);
                csum[r] += take_sum(&mut cl[r]);
            }
        }
        let v = &head.v[j0 * head.ldv..];
        tile::matmul_acc::<FMA>(dims.isa, s, lds, v, head.ldv, nq, nk, d, acc, d);
        if keep_aux {
            tile::matmul_acc::<FMA>(dims.isa, &sc.aux_w, lds, v, head.ldv, nq, nk, d, &mut sc.aux_acc, d);
        }
    }
    for r in 0..nq {
        // (The lanes are empty here: a skipped group skips every one of its tiles, the last included.)
        debug_assert!(wl[r] == [0.0; 16] && cl[r] == [0.0; 16]);
        let scale = if umax[r] <= 0.0 { 1.0 } else { 1.0 / (wsum[r] as f32) };
        let o = &mut out[r * d..(r + 1) * d];
        o.iter_mut().zip(&acc[r * d..(r + 1) * d]).for_each(|(o, &x)| *o = x * scale);
        let st = &mut stats[r * STATS..(r + 1) * STATS];
        st[ST_Z] = z[r] as f32;
        st[ST_MAX] = if plan.running_max { mx[r] } else { 0.0 };
        st[ST_UMAX] = umax[r];
        st[ST_W] = wsum[r] as f32;
        if let Some(aux) = aux.as_deref_mut() {
            let row = &mut aux[r * (d + 1)..(r + 1) * (d + 1)];
            row[0] = csum[r] as f32;
            row[1..].copy_from_slice(&sc.aux_acc[r * d..(r + 1) * d]);
        }
    }
}

/// In-place parameter-free layer norm over the row (eps 1e-5, biased variance); returns sigma.
fn layer_norm(o: &mut [f32]) -> f32 {
    let n = o.len() as f64;
    let mean = o.iter().map(|&x| x as f64).sum::<f64>() / n;
    let var = o.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n;
    let sigma = (var + 1e-5).sqrt();
    o.iter_mut().for_each(|x| *x = ((*x as f64 - mean) / sigma) as f32);
    sigma as f32
}

crate::multiversion! {
    /// `1 / max(||x||, 1e-12)` for every row of a head. The squares are summed in f64 in 8 independent
    /// lanes (one add chain per lane instead of one per row), with plain multiplies and adds: the
    /// same value under every [`Isa`]. Multiversioned because the portable build converts and adds
    /// two f64 at a time: at T = 64 the norms took about as long as the score products
    /// (`docs/bench/train-cpu-notes.md`).
    pub(crate) fn inv_norms<const FMA: bool>(isa: Isa, x: &[f32], ld: usize, t: usize, d: usize, out: &mut [f32]) {
        let _ = FMA; // no fused multiply-adds here: the result must not depend on the ISA
        for (i, o) in out[..t].iter_mut().enumerate() {
            let row = &x[i * ld..i * ld + d];
            let mut acc = [0.0f64; 8];
            let chunks = row.chunks_exact(8);
            for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
                *a = f64::from(v) * f64::from(v);
            }
            // Zipped iterators, not indexed lanes: LLVM vectorises the former.
            for c in chunks {
                for (a, &v) in acc.iter_mut().zip(c) {
                    *a += f64::from(v) * f64::from(v);
                }
            }
            let n2 = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
            *o = (1.0 / n2.sqrt().max(1e-12)) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str) -> Plan {
        name.parse::<attn_core::Variant>().unwrap().plan().unwrap()
    }

    #[test]
    fn cosine_scores_are_in_range_up_to_long_sequences_and_dot_scores_never() {
        let unit = vec![1.0f32; 8];
        // LSSA: |s| <= ln(d) ln(T): 34.6 at d = 64, T = 4096; 53.8 at d = 128, T = 2^16.
        assert!(scores_in_range(&plan("lssa"), &unit, 4096, 64));
        assert!(scores_in_range(&plan("lssa+rw15"), &unit, 1 << 16, 128));
        // ln(256) ln(T) passes 87 near T = 6.5e6.
        assert!(!scores_in_range(&plan("lssa"), &unit, 7_000_000, 256));
        // Dot-product scores have no bound; without norms there is nothing to bound.
        assert!(!scores_in_range(&plan("softmax"), &unit, 64, 64));
        assert!(!scores_in_range(&plan("lssa"), &[], 64, 64));
        // A row with |x| = 1e16 could overflow q . k (1e32 > 1e30): not in range.
        let huge = [1.0f32, 1e-16, 1.0];
        assert!(!scores_in_range(&plan("lssa"), &huge, 64, 64));
    }
}
