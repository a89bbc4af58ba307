//! Calls of at most [`DIRECT_MAX_ROWS`] query rows (a decoding step): their scores are dot products of
//! `q` with `k`'s rows as they are ([`dots`]), and their key norms come from the same kernel
//! ([`key_inv_norms`]), which the forward (with the dot products) and the backward (beforehand) both
//! call, so that both see the same scores. Also the 16-lane reduction the engine's row sums use.
//!
//! A dot product of one row with one key leaves 16 (AVX-512) or 8 (AVX2) lane partials to add up; a
//! horizontal sum per key costs about as much as the products themselves (the scalar fold of
//! [`fold_lanes`] took half of a decoding step's time, `perf`, d = 64). [`dots`] instead keeps the
//! partials of 16 (8) keys in registers and adds them up together in a transpose tree of 4 (3)
//! shuffle-and-add levels: about 3 vector operations per key in all.

use attn_core::stage::L2_NORM_EPS;

use crate::cpu::isa::Isa;
use crate::cpu::math;

/// Reduces 16 lanes pairwise (lane `l` with `l + 8`, then `l + 4`, ...): a left-to-right fold is
/// 16 dependent scalar operations.
#[inline(always)]
pub(crate) fn fold_lanes(mut acc: [f32; 16], op: impl Fn(f32, f32) -> f32) -> f32 {
    for w in [8, 4, 2, 1] {
        for l in 0..w {
            acc[l] = op(acc[l], acc[l + w]);
        }
    }
    acc[0]
}

/// The most query rows of a call whose scores skip the packing of `K` (a decoding step, a few rows
/// of speculative decoding): for so few rows, packing every key tile would read and write `K` once
/// more than the scores themselves read it. The forward and the backward of such a call compute the
/// same scores (the same dot products and key norms, bit for bit): a backward that recomputed them
/// otherwise would see rows the forward did not normalise (a near-zero relu row's `a = f / Z` off by
/// 1e-3).
pub(crate) const DIRECT_MAX_ROWS: usize = 4;

/// `sum_c a[c] b[c]` in 16 independent lanes (vectorised by the caller's target features).
#[inline(always)]
pub(crate) fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (at, bt) = (ac.remainder(), bc.remainder());
    // Loops over zipped iterators (which LLVM turns into whole-vector operations; indexed lanes
    // stayed scalar) and no closures (a closure is a function of its own, compiled without the
    // caller's target features: FMA became a libm call).
    for (x, y) in ac.zip(bc) {
        for (a, (&x, &y)) in acc.iter_mut().zip(x.iter().zip(y)) {
            *a = math::fmadd::<FMA>(x, y, *a);
        }
    }
    for (l, (&x, &y)) in at.iter().zip(bt).enumerate() {
        acc[l] = math::fmadd::<FMA>(x, y, acc[l]);
    }
    fold_lanes(acc, |x, y| x + y)
}

/// `sum_c k[c]^2` in 16 lanes of plain multiplies and adds: the same value wherever it is compiled
/// (with FMA or without), so a short call's forward and backward agree on every key norm.
#[inline(always)]
pub(crate) fn lanes_sq_norm(k: &[f32]) -> f32 {
    let mut sq = [0.0f32; 16];
    let chunks = k.chunks_exact(16);
    for (s, &y) in sq.iter_mut().zip(chunks.remainder()) {
        *s += y * y;
    }
    for c in chunks {
        for (s, &y) in sq.iter_mut().zip(c) {
            *s += y * y;
        }
    }
    fold_lanes(sq, |x, y| x + y)
}

/// `1 / max(||k||, 1e-12)` from [`lanes_sq_norm`]'s `k2`; where the squares overflowed f32 (|k|
/// above 1e19), from an f64 sum of them.
#[inline(always)]
pub(crate) fn inv_norm_from(k2: f32, k: &[f32]) -> f32 {
    if k2.is_finite() {
        return 1.0 / k2.sqrt().max(L2_NORM_EPS as f32);
    }
    let mut n2 = 0.0f64;
    for &v in k {
        n2 += f64::from(v) * f64::from(v);
    }
    (1.0 / n2.sqrt().max(L2_NORM_EPS)) as f32
}

/// `out[j] = q . k_j` for the `n` keys `k_j = k[j ldk..][..d]`. Each key's value depends on `q`
/// and that key alone (not on `n` or on the keys beside it), on a given `isa`.
///
/// # Panics
/// If a slice is shorter than the extents say.
#[inline(always)]
pub(crate) fn dots<const FMA: bool>(isa: Isa, q: &[f32], k: &[f32], ldk: usize, n: usize, d: usize, out: &mut [f32]) {
    row_dots::<FMA, false>(isa, q, k, ldk, n, d, out)
}

/// `out[j] = 1 / max(||k_j||, 1e-12)` for the `n` keys `k_j = k[j ldk..][..d]` (from an f64 sum
/// where the squares overflow f32): what a short call's forward computes beside its dot products
/// and its backward beforehand, the same values for a key wherever it is computed, on a given `isa`.
#[inline(always)]
pub(crate) fn key_inv_norms<const FMA: bool>(isa: Isa, k: &[f32], ldk: usize, n: usize, d: usize, out: &mut [f32]) {
    row_dots::<FMA, true>(isa, &[], k, ldk, n, d, out);
    inv_norms_from(&mut out[..n], k, ldk, d);
}

/// [`inv_norm_from`] of every key `j` of `k2` (key `j` at `k[j ldk..][..d]`), in place. Where every
/// square sum is finite (all but keys above 1e19) one branch-free loop, which the caller's ISA
/// vectorises: square roots and quotients are correctly rounded in every lane width, so the values
/// are [`inv_norm_from`]'s bit for bit. One key at a time, a scalar square root and division took a
/// third of a 1K-key decoding step's element-wise time on a first-generation EPYC.
#[inline(always)]
pub(crate) fn inv_norms_from(k2: &mut [f32], k: &[f32], ldk: usize, d: usize) {
    // A fold, not `all`: no early exit, so the test vectorises too.
    if k2.iter().fold(true, |ok, x| ok & x.is_finite()) {
        let eps = L2_NORM_EPS as f32;
        k2.iter_mut().for_each(|x| *x = 1.0 / x.sqrt().max(eps));
    } else {
        for (j, x) in k2.iter_mut().enumerate() {
            *x = inv_norm_from(*x, &k[j * ldk..j * ldk + d]);
        }
    }
}

/// [`dots`] of each of the `rows` query rows (row `r` at `q[r ldq..][..d]`) with the `n` keys into
/// `out[r lds..][..n]`, and each key's squared norm into `sq`, in one pass over the keys: the squared
/// norms are the bits [`key_inv_norms`] starts from (the reduction tree adds every register's lanes in
/// the same order whichever slot it has), so a short call's forward, which takes its key norms here,
/// and its backward, which takes them from [`key_inv_norms`], see the same scores; and each row's dot
/// products are [`dots`]' bits. `first`: the call's first pass over these keys, which are likely not
/// in cache (a decoding step's one query row): the AVX2 kernel then prefetches the keys it will read
/// next (`x86::AHEAD`); the values are the same either way.
///
/// On AVX2 the last [`FUSED_ROWS`] rows (at most) share the pass with the norms, each key chunk
/// loaded once for all of them (the rows of a grouped-query step); rows before those, and every row
/// but the last on the other ISAs, take [`dots`] first.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dots_and_sq_norms<const FMA: bool>(
    isa: Isa,
    q: &[f32],
    ldq: usize,
    rows: usize,
    k: &[f32],
    ldk: usize,
    n: usize,
    d: usize,
    out: &mut [f32],
    lds: usize,
    sq: &mut [f32],
    first: bool,
) {
    if n == 0 || rows == 0 {
        return;
    }
    let last = rows - 1;
    assert!(
        out.len() >= last * lds + n
            && sq.len() >= n
            && q.len() >= last * ldq + d
            && k.len() >= (n - 1) * ldk + d
            && (rows == 1 || lds >= n)
    );
    let fused = if isa == Isa::Avx2Fma { rows.min(FUSED_ROWS) } else { 1 };
    // Row `r` as a slice of `d`: the portable kernel's `dot` runs over the whole of `q`.
    for r in 0..rows - fused {
        row_dots::<FMA, false>(isa, &q[r * ldq..r * ldq + d], k, ldk, n, d, &mut out[r * lds..]);
    }
    let r0 = rows - fused;
    let (q, out) = (&q[r0 * ldq..r0 * ldq + (fused - 1) * ldq + d], &mut out[r0 * lds..]);
    match isa.simd() {
        // SAFETY: extents checked above; the caller's dispatch checked the ISA is supported.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            x86::dots_sq_avx512(q.as_ptr(), k.as_ptr(), ldk, n, d, out.as_mut_ptr(), sq.as_mut_ptr())
        },
        // SAFETY: as above, for the `fused` rows from here.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe {
            let (q, k, o, s) = (q.as_ptr(), k.as_ptr(), out.as_mut_ptr(), sq.as_mut_ptr());
            match fused {
                1 => x86::rows_dots_sq_avx2::<1>(q, ldq, k, ldk, n, d, o, lds, s, first),
                2 => x86::rows_dots_sq_avx2::<2>(q, ldq, k, ldk, n, d, o, lds, s, first),
                _ => x86::rows_dots_sq_avx2::<3>(q, ldq, k, ldk, n, d, o, lds, s, first),
            }
        },
        _ => {
            row_dots::<FMA, false>(isa, q, k, ldk, n, d, out);
            row_dots::<FMA, true>(isa, q, k, ldk, n, d, sq);
        }
    }
}

/// The most query rows [`dots_and_sq_norms`] takes through one pass with the key norms (AVX2): 3 rows
/// and the norms of 2 keys fill 8 accumulators, beside 3 query chunks and 2 key chunks (13 of the
/// 16 registers). A 12/4-head decoding step on a Zen 1 EPYC spent a third of its time in the three
/// passes over every key tile that its three rows took before (`perf`).
pub(crate) const FUSED_ROWS: usize = 3;

/// [`dots`] of `q` (`SQ = false`) or of each key with itself (`SQ = true`, `q` unused).
#[inline(always)]
fn row_dots<const FMA: bool, const SQ: bool>(
    isa: Isa,
    q: &[f32],
    k: &[f32],
    ldk: usize,
    n: usize,
    d: usize,
    out: &mut [f32],
) {
    if n == 0 {
        return;
    }
    // The kernels below index with raw pointers: the extents, once.
    assert!(out.len() >= n && (SQ || q.len() >= d) && k.len() >= (n - 1) * ldk + d);
    match isa.simd() {
        // SAFETY: extents checked above; the caller's dispatch checked the ISA is supported.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::dots_avx512::<SQ>(q.as_ptr(), k.as_ptr(), ldk, n, d, out.as_mut_ptr()) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { x86::dots_avx2::<SQ>(q.as_ptr(), k.as_ptr(), ldk, n, d, out.as_mut_ptr()) },
        _ => {
            for (j, o) in out[..n].iter_mut().enumerate() {
                let key = &k[j * ldk..j * ldk + d];
                *o = if SQ { lanes_sq_norm(key) } else { dot::<FMA>(q, key) };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The dot products of [`row_dots`](super::row_dots) in AVX-512 and AVX2 + FMA.
    #[allow(clippy::wildcard_imports)]
    use std::arch::x86_64::*;

    /// How far ahead (in keys, 4 KiB at d = 64) [`rows_dots_sq_avx2`] prefetches the keys of a first
    /// pass.
    /// A decoding step at 12 heads on a Zen 1 EPYC, lssa over SDPA, 16 alternations of the two wheels
    /// (median of the processes' medians [range]): 8K keys 0.97x [0.92, 1.00] without, 0.88x [0.76,
    /// 0.92] with; 1K 1.16x [0.98, 1.43] without, 1.02x [0.80, 1.37] with. The hardware prefetchers
    /// there did not keep the key stream ahead of the FMAs. With grouped-query attention the first
    /// pass is `dots_avx2`'s; the same prefetch there made a 12/4-head 1K step 2-3% slower (its 2 MB
    /// of keys and values mostly in cache), so it has none. AVX-512 machines were not measured: their
    /// kernels do not prefetch.
    const AHEAD: usize = 16;

    /// Which key each accumulator slot of a 16-key group holds: the transpose tree of [`sum16`] leaves
    /// slot `s`'s sum in lane `SLOTS16[s]`, and this order (an involution) puts key `j` in lane `j`.
    const SLOTS16: [usize; 16] = [0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15];
    /// The same for [`sum8`]'s 8-key groups.
    const SLOTS8: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

    /// The 16 lane sums of `a` in one register: lane `SLOTS16[s]` holds the sum of `a[s]`'s lanes.
    /// Four levels, each pairing registers and adding a shuffle of the pair to another.
    #[inline(always)]
    unsafe fn sum16(a: &[__m512; 16]) -> __m512 {
        // SAFETY (whole body): register operations only; the caller has AVX-512F.
        unsafe {
            // 256-bit halves: b[i] = [a_i lo + a_i hi, a_{i+8} lo + a_{i+8} hi] in 128-bit blocks.
            let b: [__m512; 8] = std::array::from_fn(|i| {
                let lo = _mm512_shuffle_f32x4::<0b01_00_01_00>(a[i], a[i + 8]);
                let hi = _mm512_shuffle_f32x4::<0b11_10_11_10>(a[i], a[i + 8]);
                _mm512_add_ps(lo, hi)
            });
            // 128-bit blocks: c[i] holds 4 partials of each of a_i, a_{i+8}, a_{i+4}, a_{i+12}.
            let c: [__m512; 4] = std::array::from_fn(|i| {
                let lo = _mm512_shuffle_f32x4::<0b10_00_10_00>(b[i], b[i + 4]);
                let hi = _mm512_shuffle_f32x4::<0b11_01_11_01>(b[i], b[i + 4]);
                _mm512_add_ps(lo, hi)
            });
            // Within blocks: two partials each.
            let e: [__m512; 2] = std::array::from_fn(|i| {
                _mm512_add_ps(_mm512_unpacklo_ps(c[i], c[i + 2]), _mm512_unpackhi_ps(c[i], c[i + 2]))
            });
            let lo = _mm512_shuffle_ps::<0b01_00_01_00>(e[0], e[1]);
            let hi = _mm512_shuffle_ps::<0b11_10_11_10>(e[0], e[1]);
            _mm512_add_ps(lo, hi)
        }
    }

    /// [`sum16`] for 8 registers of 8 lanes: lane `SLOTS8[s]` holds the sum of `a[s]`'s lanes.
    #[inline(always)]
    unsafe fn sum8(a: &[__m256; 8]) -> __m256 {
        // SAFETY (whole body): register operations only; the caller has AVX.
        unsafe {
            let b: [__m256; 4] = std::array::from_fn(|i| {
                let lo = _mm256_permute2f128_ps::<0x20>(a[i], a[i + 4]);
                let hi = _mm256_permute2f128_ps::<0x31>(a[i], a[i + 4]);
                _mm256_add_ps(lo, hi)
            });
            let c: [__m256; 2] = std::array::from_fn(|i| {
                _mm256_add_ps(_mm256_unpacklo_ps(b[i], b[i + 2]), _mm256_unpackhi_ps(b[i], b[i + 2]))
            });
            let lo = _mm256_shuffle_ps::<0b01_00_01_00>(c[0], c[1]);
            let hi = _mm256_shuffle_ps::<0b11_10_11_10>(c[0], c[1]);
            _mm256_add_ps(lo, hi)
        }
    }

    /// `out[j] = sum_c x_j[c] k_j[c]` for `n` keys, `x_j = q` (or `k_j` when `SQ`), 16 keys at a
    /// time; the columns in chunks of 16 (the last one masked). A key's products and partial sums are
    /// the same whichever group it falls in: absent keys of the last group contribute zero registers.
    ///
    /// # Safety
    /// AVX-512F available; `q` (unless `SQ`) valid for `d` reads, `k` for `n` rows of `d` at stride
    /// `ldk`, `out` for `n` writes.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn dots_avx512<const SQ: bool>(
        q: *const f32,
        k: *const f32,
        ldk: usize,
        n: usize,
        d: usize,
        out: *mut f32,
    ) {
        let tail = d % 16;
        let tail_mask: __mmask16 = ((1u32 << tail) - 1) as __mmask16;
        // SAFETY (whole body): every read is within the extents the caller vouches for (the column
        // tail masked, keys beyond `n` never read), every write within `out[..n]`.
        unsafe {
            let mut j0 = 0;
            while j0 < n {
                let m = (n - j0).min(16);
                let mut acc = [_mm512_setzero_ps(); 16];
                let mut c0 = 0;
                while c0 < d {
                    let mask = if c0 + 16 <= d { !0 } else { tail_mask };
                    let qc = if SQ { _mm512_setzero_ps() } else { _mm512_maskz_loadu_ps(mask, q.add(c0)) };
                    for (s, a) in acc.iter_mut().enumerate() {
                        let j = SLOTS16[s];
                        if m == 16 || j < m {
                            let kc = _mm512_maskz_loadu_ps(mask, k.add((j0 + j) * ldk + c0));
                            *a = _mm512_fmadd_ps(if SQ { kc } else { qc }, kc, *a);
                        }
                    }
                    c0 += 16;
                }
                _mm512_mask_storeu_ps(out.add(j0), ((1u32 << m) - 1) as __mmask16, sum16(&acc));
                j0 += 16;
            }
        }
    }

    /// [`dots_avx512`] of `q` and of each key with itself at once, 8 keys at a time: slot `s` of a
    /// group holds item `SLOTS16[s]`, the dot product of key `item` (`item < 8`) or the squared norm
    /// of key `item - 8`, so the tree leaves the 8 dot products in lanes 0-7 and the 8 squared norms
    /// in lanes 8-15. Each key chunk is loaded once for both.
    ///
    /// # Safety
    /// As [`dots_avx512`], and `sq` valid for `n` writes.
    #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma")]
    pub(super) unsafe fn dots_sq_avx512(
        q: *const f32,
        k: *const f32,
        ldk: usize,
        n: usize,
        d: usize,
        out: *mut f32,
        sq: *mut f32,
    ) {
        let tail_mask: __mmask16 = ((1u32 << (d % 16)) - 1) as __mmask16;
        // SAFETY (whole body): as dots_avx512.
        unsafe {
            let mut j0 = 0;
            while j0 < n {
                let m = (n - j0).min(8);
                let mut acc = [_mm512_setzero_ps(); 16];
                let mut c0 = 0;
                while c0 < d {
                    let mask = if c0 + 16 <= d { !0 } else { tail_mask };
                    let qc = _mm512_maskz_loadu_ps(mask, q.add(c0));
                    let mut kc = [_mm512_setzero_ps(); 8];
                    for (j, x) in kc.iter_mut().enumerate().take(m) {
                        *x = _mm512_maskz_loadu_ps(mask, k.add((j0 + j) * ldk + c0));
                    }
                    for (s, a) in acc.iter_mut().enumerate() {
                        let item = SLOTS16[s];
                        let x = kc[item % 8];
                        *a = _mm512_fmadd_ps(if item < 8 { qc } else { x }, x, *a);
                    }
                    c0 += 16;
                }
                let sums = sum16(&acc);
                let keep = ((1u32 << m) - 1) as __mmask16;
                _mm512_mask_storeu_ps(out.add(j0), keep, sums);
                let high = _mm512_castps512_ps256(_mm512_shuffle_f32x4::<0b11_10_11_10>(sums, sums));
                _mm256_mask_storeu_ps(sq.add(j0), keep as __mmask8, high);
                j0 += 8;
            }
        }
    }

    /// Prefetches keys `[j, j + count)` (rows of `ldk` floats at `k`) into L1, a 64-byte line at a time,
    /// where the call has them (`j + count <= n`).
    #[inline(always)]
    fn prefetch_keys(k: *const f32, ldk: usize, j: usize, count: usize, n: usize) {
        if j + count <= n {
            // The rows' span (`count ldk` floats) may pass the last key's `d` floats: wrapping pointer
            // arithmetic, and a prefetch neither reads nor faults.
            let base = k.wrapping_add(j * ldk) as *const i8;
            for line in (0..count * ldk * 4).step_by(64) {
                // SAFETY: SSE is part of every x86-64 CPU; a prefetch of any address is harmless.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(line)) };
            }
        }
    }

    /// `w <= 8` floats from `p`, zeros above (a function, not a closure: a closure would be compiled
    /// without the caller's target features).
    #[inline(always)]
    unsafe fn load8(p: *const f32, w: usize) -> __m256 {
        // SAFETY: the caller vouches for `w` readable floats at `p`; AVX available.
        unsafe {
            if w == 8 {
                _mm256_loadu_ps(p)
            } else {
                let mut buf = [0.0f32; 8];
                std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), w);
                _mm256_loadu_ps(buf.as_ptr())
            }
        }
    }

    /// 8 floats from `p` with a plain load where `WHOLE`, else `w` through [`load8`] (a function, not
    /// a closure: see `load8`).
    #[inline(always)]
    unsafe fn ld<const WHOLE: bool>(p: *const f32, w: usize) -> __m256 {
        // SAFETY: as `load8`.
        unsafe { if WHOLE { _mm256_loadu_ps(p) } else { load8(p, w) } }
    }

    /// One column chunk of a group's dot products into its 8 accumulators: columns `[c0, c0 + w)`,
    /// all 8 with plain loads where `WHOLE`. A trait with a const-generic method, not a closure:
    /// a closure is compiled without the caller's target features (see `load8`).
    trait Chunk {
        /// # Safety
        /// `w` columns readable from `c0` in every query row and key the group reads; AVX2 + FMA.
        unsafe fn chunk<const WHOLE: bool>(&self, acc: &mut [__m256; 8], c0: usize, w: usize);
    }

    /// A group's 8 accumulators over `d` columns: whole 8-column chunks with plain loads, `load8`'s
    /// copy (a call) only for the column tail. One loop over every chunk with `load8` (and, in
    /// [`dots_avx2`], a per-slot test of a partial group) in it kept the accumulators in memory (a
    /// store after every FMA): 2.4 cycles a 256-bit FMA on a Zen 1 EPYC, against 1.1 for the one-row
    /// [`rows_dots_sq_avx2`] (`perf`, a 12/4-head decoding step at 1K keys).
    ///
    /// # Safety
    /// As [`Chunk::chunk`] for every chunk of `d` columns.
    #[inline(always)]
    unsafe fn columns<C: Chunk>(group: &C, d: usize) -> [__m256; 8] {
        // SAFETY (whole body): as the caller's.
        unsafe {
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut c0 = 0;
            while c0 + 8 <= d {
                group.chunk::<true>(&mut acc, c0, 8);
                c0 += 8;
            }
            if c0 < d {
                group.chunk::<false>(&mut acc, c0, d - c0);
            }
            acc
        }
    }

    /// [`dots_avx2`]'s group of `m` keys at `k` (slot `s` holds key `SLOTS8[s]`; slots of keys past
    /// `m` stay zero): `FULL` (`m == 8`) drops the per-slot test. Every slot's chain is the same
    /// whichever group a key falls in, so the same bits.
    struct Keys8<const SQ: bool, const FULL: bool> {
        q: *const f32,
        k: *const f32,
        ldk: usize,
        m: usize,
    }

    impl<const SQ: bool, const FULL: bool> Chunk for Keys8<SQ, FULL> {
        #[inline(always)]
        unsafe fn chunk<const WHOLE: bool>(&self, acc: &mut [__m256; 8], c0: usize, w: usize) {
            let Self { q, k, ldk, m } = *self;
            // SAFETY (whole body): as the trait's.
            unsafe {
                let qc = if SQ { _mm256_setzero_ps() } else { ld::<WHOLE>(q.add(c0), w) };
                for (s, a) in acc.iter_mut().enumerate() {
                    let j = SLOTS8[s];
                    if FULL || j < m {
                        let kc = ld::<WHOLE>(k.add(j * ldk + c0), w);
                        *a = _mm256_fmadd_ps(if SQ { kc } else { qc }, kc, *a);
                    }
                }
            }
        }
    }

    /// [`dots_avx512`] in 8-lane registers, 8 keys at a time.
    ///
    /// # Safety
    /// AVX2 and FMA available; extents as [`dots_avx512`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dots_avx2<const SQ: bool>(
        q: *const f32,
        k: *const f32,
        ldk: usize,
        n: usize,
        d: usize,
        out: *mut f32,
    ) {
        // SAFETY (whole body): as dots_avx512; the column tail goes through a zero-padded copy.
        unsafe {
            let mut j0 = 0;
            while j0 < n {
                let m = (n - j0).min(8);
                let kg = k.add(j0 * ldk);
                let acc = if m == 8 {
                    columns(&Keys8::<SQ, true> { q, k: kg, ldk, m: 8 }, d)
                } else {
                    columns(&Keys8::<SQ, false> { q, k: kg, ldk, m }, d)
                };
                let mut sums = [0.0f32; 8];
                _mm256_storeu_ps(sums.as_mut_ptr(), sum8(&acc));
                std::ptr::copy_nonoverlapping(sums.as_ptr(), out.add(j0), m);
                j0 += 8;
            }
        }
    }

    /// [`dots_avx2`] of `R` (1 to 3) query rows at stride `ldq` and of each key with itself at once,
    /// [`Rows::KEYS`] keys at a time (4 with one row, 2 with two or three): slot `s` holds item
    /// `SLOTS8[s]`, the dot product of row `item / KEYS` with key `item % KEYS` (`item < R KEYS`) or the
    /// squared norm of key `item - R KEYS` (with `R = 2` the last two slots stay zero), so [`sum8`]
    /// leaves each row's dot products and then the squared norms in consecutive lanes. Each key chunk
    /// is loaded once for every row and the norm, where [`dots_avx2`] would read every key once a row
    /// and once more for the norms. Every slot's chain and [`sum8`]'s tree are those of [`dots_avx2`]
    /// (the tree adds a register's lanes in one order, whichever slot it has), so each row's values
    /// are its values bit for bit. `first`: the keys' first pass in the call, which prefetches them
    /// [`AHEAD`] keys ahead.
    ///
    /// # Safety
    /// As [`dots_avx2`], for `R` rows of `q` at stride `ldq` and of `out` at stride `lds`, and `sq`
    /// valid for `n` writes.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn rows_dots_sq_avx2<const R: usize>(
        q: *const f32,
        ldq: usize,
        k: *const f32,
        ldk: usize,
        n: usize,
        d: usize,
        out: *mut f32,
        lds: usize,
        sq: *mut f32,
        first: bool,
    ) {
        const { assert!(R >= 1 && R <= 3) };
        let keys = Rows::<R, true>::KEYS;
        // SAFETY (whole body): as dots_avx2; `R` rows of `q` and `out` by the caller.
        unsafe {
            let mut j0 = 0;
            while j0 < n {
                let m = (n - j0).min(keys);
                if first {
                    prefetch_keys(k, ldk, j0 + AHEAD, keys, n);
                }
                let kg = k.add(j0 * ldk);
                let acc = if m == keys {
                    columns(&Rows::<R, true> { q, ldq, k: kg, ldk, m }, d)
                } else {
                    columns(&Rows::<R, false> { q, ldq, k: kg, ldk, m }, d)
                };
                let mut sums = [0.0f32; 8];
                _mm256_storeu_ps(sums.as_mut_ptr(), sum8(&acc));
                for r in 0..R {
                    std::ptr::copy_nonoverlapping(sums.as_ptr().add(keys * r), out.add(r * lds + j0), m);
                }
                std::ptr::copy_nonoverlapping(sums.as_ptr().add(keys * R), sq.add(j0), m);
                j0 += keys;
            }
        }
    }

    /// [`rows_dots_sq_avx2`]'s group of `m <= KEYS` keys at `k` and `R` query rows at stride `ldq`:
    /// `FULL` (`m == KEYS`) drops the test of each key.
    struct Rows<const R: usize, const FULL: bool> {
        q: *const f32,
        ldq: usize,
        k: *const f32,
        ldk: usize,
        m: usize,
    }

    impl<const R: usize, const FULL: bool> Rows<R, FULL> {
        /// Keys a group: the `R + 1` items of a key (its dot products and its norm) fill the 8
        /// accumulators that many times over.
        const KEYS: usize = 8 / (R + 1);
    }

    impl<const R: usize, const FULL: bool> Chunk for Rows<R, FULL> {
        #[inline(always)]
        unsafe fn chunk<const WHOLE: bool>(&self, acc: &mut [__m256; 8], c0: usize, w: usize) {
            let Self { q, ldq, k, ldk, m } = *self;
            // SAFETY (whole body): as the trait's.
            unsafe {
                let mut qc = [_mm256_setzero_ps(); R];
                for (r, x) in qc.iter_mut().enumerate() {
                    *x = ld::<WHOLE>(q.add(r * ldq + c0), w);
                }
                let mut kc = [_mm256_setzero_ps(); 4];
                for (j, x) in kc.iter_mut().enumerate().take(Self::KEYS) {
                    if FULL || j < m {
                        *x = ld::<WHOLE>(k.add(j * ldk + c0), w);
                    }
                }
                for (s, a) in acc.iter_mut().enumerate() {
                    let (row, key) = (SLOTS8[s] / Self::KEYS, SLOTS8[s] % Self::KEYS);
                    if row < R {
                        *a = _mm256_fmadd_ps(qc[row], kc[key], *a);
                    } else if row == R {
                        *a = _mm256_fmadd_ps(kc[key], kc[key], *a);
                    }
                }
            }
        }
    }
}

/// [`key_inv_norms`] of every key of a head: what the backward of a short call reads, the values its
/// forward computed beside the dot products.
pub(crate) fn inv_norms_short(isa: Isa, x: &[f32], ld: usize, t: usize, d: usize, out: &mut [f32]) {
    crate::multiversion! {
        // (The body sees only the arguments after the first, hence `isa` twice.)
        fn norms<const FMA: bool>(isa: Isa, which: Isa, x: &[f32], ld: usize, t: usize, d: usize, out: &mut [f32]) {
            key_inv_norms::<FMA>(which, x, ld, t, d, out)
        }
    }
    norms(isa, isa, x, ld, t, d, out)
}

#[cfg(test)]
mod tests;
