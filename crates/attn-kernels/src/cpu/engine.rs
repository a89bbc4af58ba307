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

use attn_core::{Norm, Plan};

use crate::cpu::amx_fwd;
use crate::cpu::isa::Isa;
use crate::cpu::math;
use crate::cpu::short::{self, fold_lanes};
use crate::cpu::tile::{self, Aligned, amx, pad_nr};

/// Tile sizes and scratch budgets: tuning knobs, separate from the maths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// Calls of a few query rows (a decoding step): the fewest keys of a range when each key head's
    /// cache is split across threads (split-K), used only when there are fewer key heads than
    /// threads to keep busy. Rounded up to whole groups of `8 x block_k` keys.
    pub split_keys: usize,
    /// Forwards without re-weighting: the query tiles one task runs in lockstep, key tile after key
    /// tile (`fwd::forward_band`), so that a key tile's operands, once read from memory, serve them
    /// all from L2; fewer where a call would make fewer than 8 tasks a thread. 1: a task a tile.
    /// The same values either way, bit for bit.
    pub band: usize,
}

impl Default for Tuning {
    /// 64 x 64: at d = 64 a tile's `q`, `k`, `v` and scores (64 KiB in all) stay in L2 of any x86
    /// core; 128-key tiles measured no faster on AVX2 (Zen 1 and Zen 3 EPYCs) and waste more of the
    /// diagonal tile. A 16 MiB score cache per task covers `T` up to 64K at 64 query rows.
    /// [`Options::default`](super::Options::default) takes [`Tuning::for_isa`] of the detected ISA.
    fn default() -> Self {
        Self { block_q: 64, block_k: 64, score_cache_bytes: 16 << 20, reweight_helper: true, split_keys: 2048, band: 1 }
    }
}

impl Tuning {
    /// The default tiles for kernels that run `isa`: 64 x 128 on AVX-512, 128 x 128 under AMX, else
    /// [`Tuning::default`]'s 64 x 64. On AVX-512 a key tile's row of scores is 4 or 8 registers, and what every tile pays
    /// once (the per-row loops and lane sums, re-weighting's key lists and its check for key groups
    /// without an above-mean key) weighs more against that than on AVX2. On an Intel Xeon with
    /// AVX-512 (2 MiB of L2 a core; `cpu_lab 4096 1 5`, two alternations), 128-key tiles took the
    /// one-thread LSSAR forward from 1.18-1.21x LSSA's time to 1.13-1.14x and its forward + backward
    /// from 1.35-1.36x to 1.26x, LSSA's own within the runs' spread either way. Under
    /// [`Isa::Amx`] query tiles of 128 rows: each key tile's operands, streamed from L3 as AMX's
    /// three bf16 parts, then serve twice the rows (the one-thread LSSA forward 4-6% faster;
    /// LSSAR's 2% faster and its forward + backward 1% slower, in one process against 64 rows), in
    /// bands of 8 ([`Tuning::band`]: LSSA's forward 0.96-0.97x the time of a task a tile at T =
    /// 4096 on two threads, 0.95x at 8192; the kernels' softmax 1.02-1.03x; no gain on AVX-512 or
    /// AVX2, whose keys and values are f32: two thirds of the bytes of the AMX operands).
    pub fn for_isa(isa: Isa) -> Self {
        let block_k = if isa.simd() == Isa::Avx512 { 128 } else { 64 };
        let (block_q, band) = if isa == Isa::Amx { (128, 8) } else { (64, 1) };
        Self { block_q, block_k, band, ..Self::default() }
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
    /// Under AMX products (`split::amx_products`), every key tile's keys (and in the forward its
    /// values) as AMX operands ([`amx_fwd::pack_head`]): the scores (and the forward's value
    /// product) then run on AMX tiles. Empty otherwise.
    pub amx: &'a [f32],
}

/// Packs every key tile of one head's `x` (rows of `d`, stride `ld`) transposed, for
/// [`tile::matmul_nt`]: tile `kt` occupies `out[kt * d * pad_nr(bk)..][..d * pad_nr(bk)]`. Done once per
/// head and call, instead of once per (query tile, key tile) pair: the scalar transpose cost as much
/// as the score product itself when repeated (measured, see `tile.rs`); 8 x 8 blocks in registers on
/// AVX2 and AVX-512 CPUs.
pub(crate) fn pack_head(x: &[f32], ld: usize, dims: Dims, out: &mut [f32]) {
    let tile = dims.d * dims.bk_pad();
    for (kt, dst) in out.chunks_exact_mut(tile).enumerate() {
        let j0 = kt * dims.bk;
        if j0 >= dims.t {
            break;
        }
        let nk = dims.bk.min(dims.t - j0);
        // Full tiles use the stride of the full block so that every tile has the same layout.
        tile::pack_transposed_padded(dims.isa, &x[j0 * ld..], ld, nk, dims.d, dims.bk_pad(), dst);
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
/// adds at most `FOLD_TILES * block_k / 16` terms in f32 (32 at 64-key tiles, 64 at 128) before its f64
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
pub(super) fn lane_max_into(xs: &[f32], acc: &mut Lanes) {
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
pub(super) fn take_max(acc: &mut Lanes) -> f32 {
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
pub(super) fn lane_max(xs: &[f32]) -> f32 {
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
    /// Rows of the call per query position: 1, or a short call's query heads that share a key head
    /// (grouped-query attention), which run as the rows of one task (row `r` is position `r / group`).
    pub group: usize,
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
        self.off + r / self.group + 1
    }

    /// Keys of tile `[j0, j0 + nk)` visible from query row `r` (causal).
    #[inline(always)]
    pub(crate) fn visible(&self, r: usize, j0: usize, nk: usize) -> usize {
        self.n(r).saturating_sub(j0).min(nk)
    }

    /// Key tiles that query rows `[0, end)` see (`end >= 1`).
    pub(crate) fn key_tiles(&self, end: usize) -> usize {
        self.n(end - 1).div_ceil(self.bk)
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

/// Per-row constants of a query tile: `fac = scale_i * inq_i`, `bias`, `n = N_i`; and under AMX
/// (`head.amx` not empty) the rows of `q` as the scores' `A` operand.
pub(super) struct Rows {
    pub(super) fac: Vec<f32>,
    pub(super) bias: Vec<f32>,
    qa: Aligned<u16>,
}

impl Rows {
    pub(super) fn new(plan: &Plan, head: &Head<'_>, dims: Dims, i0: usize, nq: usize) -> Self {
        let mut rows = Self::empty();
        rows.fill(plan, head, dims, i0, nq);
        rows
    }

    pub(super) const fn empty() -> Self {
        Self { fac: Vec::new(), bias: Vec::new(), qa: Aligned::empty() }
    }

    /// [`Rows::new`] into the buffers these rows have.
    pub(super) fn fill(&mut self, plan: &Plan, head: &Head<'_>, dims: Dims, i0: usize, nq: usize) {
        self.fac.clear();
        self.bias.clear();
        // (The backward makes these per tile: growing them push by push re-allocated 7 times each.)
        self.fac.reserve(nq);
        self.bias.reserve(nq);
        for r in 0..nq {
            let (scale, b) = plan.row_constants(dims.n(i0 + r), dims.d);
            let inq = if plan.cosine() { head.inq[i0 + r] as f64 } else { 1.0 };
            self.fac.push((scale * inq) as f32);
            self.bias.push(b as f32);
        }
        if !head.amx.is_empty() {
            let (rows, dp) = (nq.next_multiple_of(amx::ROWS), amx_fwd::padded_d(dims.d));
            self.qa.resize(amx::PARTS * rows * dp);
            amx::split_rows(&head.q[i0 * head.ldq..], head.ldq, nq, dims.d, &mut self.qa, rows, dp);
        }
    }
}

/// Key tiles up to this wide (padded) have their scores scaled by the micro-kernels.
const MAX_SCALED_COLS: usize = 256;

/// Scores `s_ij` of rows `[i0, i0 + nq)` against keys `[j0, j0 + nk)` into `s` (row stride `lds`),
/// with `kt` as scratch for the packed key tile. Entries beyond the visible keys are left unspecified.
/// `raw` (AMX only, whose caller scales them itself: `amx::softplus_row`): the dot products,
/// unscaled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn scores<const FMA: bool>(
    plan: &Plan,
    head: &Head<'_>,
    dims: Dims,
    rows: &Rows,
    i0: usize,
    nq: usize,
    (j0, nk): (usize, usize),
    s: &mut [f32],
    lds: usize,
    raw: bool,
) {
    debug_assert!(!raw || !head.amx.is_empty());
    if !head.amx.is_empty() {
        // The dot products on AMX tiles (scaled by the pass below).
        let keys = amx_fwd::tile(head, dims, j0 / dims.bk).0;
        amx::product(&rows.qa, amx_fwd::padded_d(dims.d), keys, dims.bk_pad(), nq, s, lds);
        if raw {
            return;
        }
    } else if head.kt.is_empty() {
        // Unpacked keys (a short call). With cosine scores and no precomputed key norms, the tile's key
        // norms come from the pass of the rows' dot products (`short::dots_and_sq_norms`), the same
        // bits as the backward's `inv_norms_short`, and the scale is applied here.
        let (d, isa, ldk) = (dims.d, dims.isa, head.ldk);
        let keys = &head.k[j0 * ldk..];
        let q_row = |r: usize| &head.q[(i0 + r) * head.ldq..(i0 + r) * head.ldq + d];
        let fused_norms = plan.cosine() && head.ink.is_empty();
        if !fused_norms {
            for r in 0..nq {
                short::dots::<FMA>(isa, q_row(r), keys, ldk, dims.visible(i0 + r, j0, nk), d, &mut s[r * lds..]);
            }
        } else {
            // Every row over the keys the last one sees (the others' extra entries are beyond their
            // visible keys).
            let most = dims.visible(i0 + nq - 1, j0, nk);
            let q = &head.q[i0 * head.ldq..];
            let mut kn = [0.0f32; 64];
            for c0 in (0..most).step_by(64) {
                let m = (most - c0).min(64);
                let part = &keys[c0 * ldk..];
                // With one row, its pass is the first over these keys (see `first`).
                short::dots_and_sq_norms::<FMA>(
                    isa,
                    q,
                    head.ldq,
                    nq,
                    part,
                    ldk,
                    m,
                    d,
                    &mut s[c0..],
                    lds,
                    &mut kn,
                    nq == 1,
                );
                short::inv_norms_from(&mut kn[..m], part, ldk, d);
                for r in 0..nq {
                    let vis = dims.visible(i0 + r, j0, nk).saturating_sub(c0).min(m);
                    let (a, b) = (rows.fac[r], rows.bias[r]);
                    let row = &mut s[r * lds + c0..r * lds + c0 + vis];
                    row.iter_mut().zip(&kn).for_each(|(x, &kn)| *x = math::fmadd::<FMA>(*x * a, kn, b));
                }
            }
            return;
        }
    } else {
        let (kt, q, n_pad) =
            (&head.kt[j0 / dims.bk * dims.d * dims.bk_pad()..], &head.q[i0 * head.ldq..], dims.bk_pad());
        if n_pad <= MAX_SCALED_COLS {
            // The micro-kernels scale each score as they store it (4% of LSSA's forward as a pass).
            let mut kn = [0.0f32; MAX_SCALED_COLS];
            let col = plan.cosine().then(|| {
                kn[..nk].copy_from_slice(&head.ink[j0..j0 + nk]);
                &kn[..n_pad]
            });
            let scale = (&rows.fac[..nq], col, &rows.bias[..nq]);
            return tile::matmul_nt_scaled::<FMA>(dims.isa, q, head.ldq, kt, n_pad, dims.d, nq, s, lds, scale);
        }
        tile::matmul_nt::<FMA>(dims.isa, q, head.ldq, kt, n_pad, dims.d, nq, s, lds);
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

pub(super) use crate::cpu::power::{map_pow_from, negligible_below, pow_slice};

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
    attn_core::stage::reweight_offset(n) as f32
}

/// `1 / max(||x||, 1e-12)` for every row of a head (`t` rows of `d` floats, row stride `ld`). The
/// squares are summed in f64 in 8 independent lanes (lane `l` starts from the square of entry
/// `l` of the row's last `d % 8` entries, if there is one, and adds the squares of entries `8 c + l`
/// in order), the lanes added as
/// `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`: the same value under every [`Isa`] (a
/// product of two f32 is exact in f64, so a fused multiply-add would give the same sums too). At
/// T = 64 the norms took about as long as the score products (`docs/bench/train-cpu-notes.md`);
/// LLVM vectorised the portable form two f64 at a time with shuffles between (63 cycles a row at
/// `d = 64` on an Intel Xeon), so AVX-512 and AVX2 sum a row in whole registers
/// (`kernels-cpu-notes.md`).
pub(crate) fn inv_norms(isa: Isa, x: &[f32], ld: usize, t: usize, d: usize, out: &mut [f32]) {
    if t == 0 {
        return;
    }
    assert!(out.len() >= t && x.len() >= (t - 1) * ld + d);
    match isa.simd() {
        // SAFETY: extents checked above; the ISA was checked supported by the caller's dispatch.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { norms_x86::inv_norms_avx512(x.as_ptr(), ld, t, d, out.as_mut_ptr()) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { norms_x86::inv_norms_avx2(x.as_ptr(), ld, t, d, out.as_mut_ptr()) },
        _ => inv_norms_lanes(x, ld, t, d, out),
    }
}

/// [`inv_norms`] in plain Rust over the 8 lanes: the portable path's (AVX-512 and AVX2 have their
/// own, so this is compiled for the baseline only).
fn inv_norms_lanes(x: &[f32], ld: usize, t: usize, d: usize, out: &mut [f32]) {
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
        *o = inv_norm(n2);
    }
}

/// `1 / max(sqrt(n2), 1e-12)` in f64, rounded to f32.
#[inline(always)]
fn inv_norm(n2: f64) -> f32 {
    (1.0 / n2.sqrt().max(attn_core::stage::L2_NORM_EPS)) as f32
}

#[cfg(target_arch = "x86_64")]
mod norms_x86 {
    //! [`inv_norms`](super::inv_norms) in AVX-512 and AVX2: the 8 lanes in one zmm (two ymm).
    //! Every function requires the extents its dispatcher checked.
    use std::arch::x86_64::*;

    /// The lanes' sum `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))` from `lo = a0..a3` and
    /// `hi = a4..a7`.
    #[inline(always)]
    unsafe fn lanes_sum(lo: __m256d, hi: __m256d) -> f64 {
        // SAFETY: register operations only; AVX is enabled wherever this inlines.
        unsafe {
            let b = _mm256_add_pd(lo, hi); // a0 + a4, a1 + a5, a2 + a6, a3 + a7
            let (b01, b23) = (_mm256_castpd256_pd128(b), _mm256_extractf128_pd::<1>(b));
            let s01 = _mm_add_sd(b01, _mm_unpackhi_pd(b01, b01));
            let s23 = _mm_add_sd(b23, _mm_unpackhi_pd(b23, b23));
            _mm_cvtsd_f64(_mm_add_sd(s01, s23))
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn inv_norms_avx512(x: *const f32, ld: usize, t: usize, d: usize, out: *mut f32) {
        let body = d - d % 8;
        let tail = ((1u32 << (d % 8)) - 1) as __mmask8;
        // SAFETY (whole body): rows [0, t) of d floats at stride ld, and t outputs, were checked.
        unsafe {
            for i in 0..t {
                let row = x.add(i * ld);
                let v = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(tail, row.add(body)));
                let mut acc = _mm512_mul_pd(v, v);
                for c in (0..body).step_by(8) {
                    let v = _mm512_cvtps_pd(_mm256_loadu_ps(row.add(c)));
                    acc = _mm512_add_pd(acc, _mm512_mul_pd(v, v));
                }
                let n2 = lanes_sum(_mm512_castpd512_pd256(acc), _mm512_extractf64x4_pd::<1>(acc));
                *out.add(i) = super::inv_norm(n2);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn inv_norms_avx2(x: *const f32, ld: usize, t: usize, d: usize, out: *mut f32) {
        let body = d - d % 8;
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((d % 8) as i32), lanes);
        // SAFETY (whole body): as inv_norms_avx512.
        unsafe {
            for i in 0..t {
                let row = x.add(i * ld);
                let v = _mm256_maskload_ps(row.add(body), tail);
                let (lo, hi) =
                    (_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
                let (mut a, mut b) = (_mm256_mul_pd(lo, lo), _mm256_mul_pd(hi, hi));
                for c in (0..body).step_by(8) {
                    let v = _mm256_loadu_ps(row.add(c));
                    let (lo, hi) =
                        (_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
                    a = _mm256_add_pd(a, _mm256_mul_pd(lo, lo));
                    b = _mm256_add_pd(b, _mm256_mul_pd(hi, hi));
                }
                *out.add(i) = super::inv_norm(lanes_sum(a, b));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str) -> Plan {
        name.parse::<attn_core::Variant>().unwrap().plan().unwrap()
    }

    /// Every ISA's inverse norms are the lanes' sums in the documented order, bit for bit: lane `l`
    /// starts from the square of entry `body + l` of the last `d % 8` (if any) and adds the squares of
    /// entries `8 c + l` in order; the lanes add as `((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7))`.
    /// Every `d` from 1 to 70 and two past 128, rows at a stride, magnitudes from 1e-3 to 1e3, and a
    /// zero row (`1 / 1e-12`).
    #[test]
    fn inverse_norms_sum_the_documented_lanes_on_every_isa() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            unit * 10f32.powi((state % 7) as i32 - 3)
        };
        for d in (1..=70).chain([128, 131]) {
            let (t, ld) = (6, d + 3);
            let mut x: Vec<f32> = (0..t * ld).map(|_| next()).collect();
            x[2 * ld..2 * ld + d].fill(0.0);
            let body = d - d % 8;
            let want: Vec<f32> = (0..t)
                .map(|i| {
                    let row = &x[i * ld..i * ld + d];
                    let mut a = [0.0f64; 8];
                    for (l, &v) in row[body..].iter().enumerate() {
                        a[l] = f64::from(v) * f64::from(v);
                    }
                    for (j, &v) in row[..body].iter().enumerate() {
                        a[j % 8] += f64::from(v) * f64::from(v);
                    }
                    let n2 = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
                    (1.0 / n2.sqrt().max(1e-12)) as f32
                })
                .collect();
            assert_eq!(want[2], 1e12, "d = {d}: a zero row");
            for isa in Isa::all_supported() {
                let mut got = vec![f32::NAN; t];
                inv_norms(isa, &x, ld, t, d, &mut got);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{isa:?}, d = {d}");
            }
        }
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
