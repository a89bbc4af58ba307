//! The intrinsics kernels, written once over [`Lanes`] and instantiated per ISA by the
//! `#[target_feature]` entry points at the bottom. Every function requires the extents checked
//! by its dispatcher.
//!
//! The generic bodies are `#[inline(always)]`: they must be compiled inside a `#[target_feature]`
//! function, where the intrinsics behind [`Lanes`] inline to single instructions; compiled on
//! their own they would call the intrinsics out of line.
use std::arch::x86_64::*;

mod nonzero;

pub(super) use nonzero::{acc_nonzero_avx2, acc_nonzero_avx512, acc_nonzero_two_avx512};

/// One SIMD register of `W` f32 lanes: the handful of operations the two micro-kernels use.
///
/// # Safety
///
/// Every method needs the implementing ISA to be available, and the pointer ones need `W`
/// (for `load_first`/`store_first`: the first `w`) valid f32s behind the pointer.
trait Lanes {
    /// f32 lanes per register.
    const W: usize;
    /// Whether blocks of `4W` columns fit the register file (an `R x 4` block of accumulators
    /// plus 4 registers of `B`); else blocks are `2W` wide.
    const WIDE: bool;
    type V: Copy;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `a * b + c`, fused.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// Lanes `[0, w)` from `p`, zeros above; `w <= W` (`w = 0` reads nothing).
    unsafe fn load_first(p: *const f32, w: usize) -> Self::V;
    /// Writes lanes `[0, w)` of `v` to `p` and nothing else.
    unsafe fn store_first(p: *mut f32, w: usize, v: Self::V);
}

/// AVX-512F: 16 lanes, `6 x 64` blocks (24 zmm accumulators + 4 for `B`, of 32 registers).
struct Avx512;
/// Rows of an AVX-512 block.
const MR512: usize = 6;
/// AVX2 + FMA: 8 lanes, `4 x 16` blocks (8 ymm accumulators + 2 for `B`, of 16 registers). On
/// a tile in cache they run at 93-98 GFLOP/s of the 102 an FMA loop reaches on one Zen 3 core
/// (a probe repeating each product on one 64 x 64 tile, `d = 64`); `6 x 16` (12 accumulators,
/// the FMA latency hidden twice over) measured the same for `C = A Bᵀ` and 5% slower for
/// `C += A B`.
struct Avx2;
/// Rows of an AVX2 block.
const MR256: usize = 4;

impl Lanes for Avx512 {
    const W: usize = 16;
    const WIDE: bool = true;
    type V = __m512;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the trait's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: the trait's contract.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, w: usize) -> __m512 {
        // SAFETY: masked-off lanes are not read (no fault past the end).
        unsafe { _mm512_maskz_loadu_ps(mask16(w), p) }
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, w: usize, v: __m512) {
        // SAFETY: masked-off lanes are not written.
        unsafe { _mm512_mask_storeu_ps(p, mask16(w), v) }
    }
}

#[inline(always)]
fn mask16(w: usize) -> __mmask16 {
    if w >= 16 { 0xFFFF } else { (1u16 << w) - 1 }
}

impl Lanes for Avx2 {
    const W: usize = 8;
    const WIDE: bool = false;
    type V = __m256;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        // SAFETY: the trait's contract.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        // SAFETY: the trait's contract.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the trait's contract (the ISA is enabled).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_first(p: *const f32, w: usize) -> __m256 {
        // SAFETY: masked-off lanes are not read (no fault past the end).
        unsafe { _mm256_maskload_ps(p, mask8(w)) }
    }
    #[inline(always)]
    unsafe fn store_first(p: *mut f32, w: usize, v: __m256) {
        // SAFETY: masked-off lanes are not written.
        unsafe { _mm256_maskstore_ps(p, mask8(w), v) }
    }
}

/// All-ones in lanes `[0, w)`: the sign bits `maskload`/`maskstore` read.
#[inline(always)]
fn mask8(w: usize) -> __m256i {
    // SAFETY: AVX2 is enabled wherever this inlines (only Avx2's methods call it).
    unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(w.min(8) as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
}

/// The scores' scaling, applied by [`nt`] to each entry as it stores it (`SCALED`): for cosine
/// scores `c[r][j] = (c[r][j] · row[r]) · col[j] + bias[r]`, one multiplication and one fused
/// multiply-add; for dot scores (`col` null) `c[r][j] · row[r] + bias[r]`, one fused multiply-add:
/// as the scalar pass over a stored tile computes them (so the same bits). `row` and `bias` hold
/// an entry per row of `C`, `col` one per column (`n_pad`, padding included).
#[derive(Clone, Copy)]
pub(super) struct Scale {
    pub(super) row: *const f32,
    pub(super) col: *const f32,
    pub(super) bias: *const f32,
}

impl Scale {
    /// For the unscaled product (never read).
    const NONE: Self = Self { row: std::ptr::null(), col: std::ptr::null(), bias: std::ptr::null() };

    /// The same scaling from row `i` on.
    unsafe fn skip_rows(self, i: usize) -> Self {
        // SAFETY: the caller's rows are inside `row` and `bias`.
        unsafe { Self { row: self.row.add(i), col: self.col, bias: self.bias.add(i) } }
    }
}

/// `C[0..R][j..j + V W] = A[0..R] · Bᵀ[.., j..j + V W]`, in `R x V` accumulators (scaled by `sc`
/// on the way out when `SCALED`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn nt_panel<L: Lanes, const R: usize, const V: usize, const SCALED: bool>(
    a: *const f32,
    lda: usize,
    bt: *const f32,
    n_pad: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
    j: usize,
    sc: Scale,
) {
    // SAFETY (whole body): pointers stay inside the extents the dispatcher checked.
    unsafe {
        let mut acc = [[L::zero(); V]; R];
        for t in 0..k {
            let row = bt.add(t * n_pad + j);
            let b: [L::V; V] = std::array::from_fn(|q| L::load(row.add(q * L::W)));
            for r in 0..R {
                let x = L::splat(*a.add(r * lda + t));
                for q in 0..V {
                    acc[r][q] = L::fma(x, b[q], acc[r][q]);
                }
            }
        }
        let cosine = SCALED && !sc.col.is_null();
        let col: [L::V; V] =
            std::array::from_fn(|q| if cosine { L::load(sc.col.add(j + q * L::W)) } else { L::zero() });
        for r in 0..R {
            let (f, b) =
                if SCALED { (L::splat(*sc.row.add(r)), L::splat(*sc.bias.add(r))) } else { (L::zero(), L::zero()) };
            for q in 0..V {
                let x = match (SCALED, cosine) {
                    (false, _) => acc[r][q],
                    (true, true) => L::fma(L::mul(acc[r][q], f), col[q], b),
                    (true, false) => L::fma(acc[r][q], f, b),
                };
                L::store(c.add(r * ldc + j + q * L::W), x);
            }
        }
    }
}

/// `C[0..R] = A[0..R] · Bᵀ` over all `n_pad` columns: panels of `4W` where the ISA holds
/// `R x 4` accumulators ([`Lanes::WIDE`]), then of `2W` (`n_pad` is a multiple of `NR`, hence
/// of `2W`). Every entry sums over `t` in the same order whatever the panel.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn nt_block<L: Lanes, const R: usize, const SCALED: bool>(
    a: *const f32,
    lda: usize,
    bt: *const f32,
    n_pad: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
    sc: Scale,
) {
    let wide = wide_cols::<L>(n_pad);
    // SAFETY: the panels split [0, n_pad) exactly.
    unsafe {
        for j in (0..wide).step_by(4 * L::W) {
            nt_panel::<L, R, 4, SCALED>(a, lda, bt, n_pad, k, c, ldc, j, sc);
        }
        for j in (wide..n_pad).step_by(2 * L::W) {
            nt_panel::<L, R, 2, SCALED>(a, lda, bt, n_pad, k, c, ldc, j, sc);
        }
    }
}

/// How many of `n` columns both micro-kernels take in blocks of `4W`: the whole blocks that fit
/// where the ISA holds `R x 4` accumulators ([`Lanes::WIDE`]), else none; the rest go in blocks
/// of `2W`. (A plain count, not a walker taking a closure: a closure does not inherit its
/// caller's `#[target_feature]`s, and one measured 48x slower, its intrinsics out of line.)
#[inline(always)]
fn wide_cols<L: Lanes>(n: usize) -> usize {
    if L::WIDE { n / (4 * L::W) * (4 * L::W) } else { 0 }
}

/// `C = A · Bᵀ` for all `m` rows (scaled by `sc` when `SCALED`): blocks of `MR` rows, then of 4,
/// 2 and 1.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn nt<L: Lanes, const MR: usize, const SCALED: bool>(
    a: *const f32,
    lda: usize,
    bt: *const f32,
    n_pad: usize,
    k: usize,
    m: usize,
    c: *mut f32,
    ldc: usize,
    sc: Scale,
) {
    // SAFETY: row blocks stay below m.
    unsafe {
        let block = |i: usize| (a.add(i * lda), c.add(i * ldc), if SCALED { sc.skip_rows(i) } else { sc });
        let mut i = 0;
        while i + MR <= m {
            let (a, c, sc) = block(i);
            nt_block::<L, MR, SCALED>(a, lda, bt, n_pad, k, c, ldc, sc);
            i += MR;
        }
        // The rest in blocks of 4, 2 and 1 rows: a single row keeps only two accumulator chains
        // in flight, a quarter of what the FMA pipes need to stay busy.
        if MR > 4 && i + 4 <= m {
            let (a, c, sc) = block(i);
            nt_block::<L, 4, SCALED>(a, lda, bt, n_pad, k, c, ldc, sc);
            i += 4;
        }
        if MR > 2 && i + 2 <= m {
            let (a, c, sc) = block(i);
            nt_block::<L, 2, SCALED>(a, lda, bt, n_pad, k, c, ldc, sc);
            i += 2;
        }
        while i < m {
            let (a, c, sc) = block(i);
            nt_block::<L, 1, SCALED>(a, lda, bt, n_pad, k, c, ldc, sc);
            i += 1;
        }
    }
}

/// One `V W`-column block of `C[0..R][col..] += A · B[.., col..]`: all `V W` columns when
/// `FULL`, else the last `k - col < V W`, by masked loads and stores.
#[inline(always)]
unsafe fn acc_cols<L: Lanes, const R: usize, const V: usize, const FULL: bool>(
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
    n: usize,
    col: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    let w: [usize; V] = std::array::from_fn(|q| (k - col).saturating_sub(q * L::W).min(L::W));
    // SAFETY (whole body): full blocks lie inside the checked extents; a partial block touches
    // only the first k - col columns.
    unsafe {
        let ld = |p: *const f32, w: usize| if FULL { L::load(p) } else { L::load_first(p, w) };
        let mut acc = [[L::zero(); V]; R];
        for r in 0..R {
            for q in 0..V {
                acc[r][q] = ld(c.add(r * ldc + col + q * L::W), w[q]);
            }
        }
        for t in 0..n {
            let row = b.add(t * ldb + col);
            let bv: [L::V; V] = std::array::from_fn(|q| ld(row.add(q * L::W), w[q]));
            for r in 0..R {
                let x = L::splat(*a.add(r * a_rs + t * a_cs));
                for q in 0..V {
                    acc[r][q] = L::fma(x, bv[q], acc[r][q]);
                }
            }
        }
        for r in 0..R {
            for q in 0..V {
                let p = c.add(r * ldc + col + q * L::W);
                if FULL {
                    L::store(p, acc[r][q]);
                } else {
                    L::store_first(p, w[q], acc[r][q]);
                }
            }
        }
    }
}

/// `C[0..R] += A[0..R] · B` over all `k` columns: full `4W` blocks where the ISA holds `R x 4`
/// accumulators ([`Lanes::WIDE`]), full `2W` blocks, then one masked tail block.
#[inline(always)]
unsafe fn acc_block<L: Lanes, const R: usize>(
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: the column blocks split [0, k) exactly.
    unsafe {
        let wide = wide_cols::<L>(k);
        for col in (0..wide).step_by(4 * L::W) {
            acc_cols::<L, R, 4, true>(a, a_rs, a_cs, b, ldb, n, col, k, c, ldc);
        }
        let mut col = wide;
        while col + 2 * L::W <= k {
            acc_cols::<L, R, 2, true>(a, a_rs, a_cs, b, ldb, n, col, k, c, ldc);
            col += 2 * L::W;
        }
        if col < k {
            acc_cols::<L, R, 2, false>(a, a_rs, a_cs, b, ldb, n, col, k, c, ldc);
        }
    }
}

/// `C += A · B` for all `m` rows: blocks of `MR` rows, then of 4, 2 and 1.
#[inline(always)]
unsafe fn acc<L: Lanes, const MR: usize>(
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: row blocks stay below m.
    unsafe {
        let mut i = 0;
        while i + MR <= m {
            acc_block::<L, MR>(a.add(i * a_rs), a_rs, a_cs, b, ldb, n, k, c.add(i * ldc), ldc);
            i += MR;
        }
        // The rest in blocks of 4, 2 and 1 rows, as in `nt`; 3 rows (a 12/4-head decoding step's
        // group) in one block, which reads `B` once where a block of 2 and a row read it twice
        // (and a block of 2 keeps only 4 AVX2 accumulator chains, fewer than the FMA's latency
        // needs).
        if MR > 4 && i + 4 <= m {
            acc_block::<L, 4>(a.add(i * a_rs), a_rs, a_cs, b, ldb, n, k, c.add(i * ldc), ldc);
            i += 4;
        }
        if MR > 3 && i + 3 == m {
            acc_block::<L, 3>(a.add(i * a_rs), a_rs, a_cs, b, ldb, n, k, c.add(i * ldc), ldc);
            i += 3;
        }
        if MR > 2 && i + 2 <= m {
            acc_block::<L, 2>(a.add(i * a_rs), a_rs, a_cs, b, ldb, n, k, c.add(i * ldc), ldc);
            i += 2;
        }
        while i < m {
            acc_row::<L>(a.add(i * a_rs), a_cs, b, ldb, n, k, c.add(i * ldc));
            i += 1;
        }
    }
}

/// `C[0] += A[0] · B` for one row (a decoding step's value product): `4W` columns at a time with
/// two keys in flight (8 accumulator chains, where `acc_block::<L, 1>` keeps 2 and waits on each
/// FMA's latency), the two keys' partial sums added at the end; the last `< 4W` columns as
/// `acc_block` does them.
#[inline(always)]
unsafe fn acc_row<L: Lanes>(a: *const f32, a_cs: usize, b: *const f32, ldb: usize, n: usize, k: usize, c: *mut f32) {
    // SAFETY (whole body): full blocks lie inside the checked extents; the tail is acc_block's.
    unsafe {
        let mut col = 0;
        while col + 4 * L::W <= k {
            let mut even: [L::V; 4] = std::array::from_fn(|q| L::load(c.add(col + q * L::W)));
            let mut odd = [L::zero(); 4];
            let mut t = 0;
            while t + 2 <= n {
                let (x0, x1) = (L::splat(*a.add(t * a_cs)), L::splat(*a.add((t + 1) * a_cs)));
                let (b0, b1) = (b.add(t * ldb + col), b.add((t + 1) * ldb + col));
                for q in 0..4 {
                    even[q] = L::fma(x0, L::load(b0.add(q * L::W)), even[q]);
                    odd[q] = L::fma(x1, L::load(b1.add(q * L::W)), odd[q]);
                }
                t += 2;
            }
            if t < n {
                let (x, bt) = (L::splat(*a.add(t * a_cs)), b.add(t * ldb + col));
                for (q, e) in even.iter_mut().enumerate() {
                    *e = L::fma(x, L::load(bt.add(q * L::W)), *e);
                }
            }
            let one = L::splat(1.0);
            for q in 0..4 {
                L::store(c.add(col + q * L::W), L::fma(one, odd[q], even[q]));
            }
            col += 4 * L::W;
        }
        if col < k {
            acc_block::<L, 1>(a, 0, a_cs, b.add(col), ldb, n, k - col, c.add(col), 0);
        }
    }
}

#[target_feature(enable = "avx512f")]
pub(super) unsafe fn nt_avx512(
    a: *const f32,
    lda: usize,
    bt: *const f32,
    n_pad: usize,
    k: usize,
    m: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: the dispatcher checked the extents and the ISA.
    unsafe { nt::<Avx512, MR512, false>(a, lda, bt, n_pad, k, m, c, ldc, Scale::NONE) }
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn nt_avx2(
    a: *const f32,
    lda: usize,
    bt: *const f32,
    n_pad: usize,
    k: usize,
    m: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: as above.
    unsafe { nt::<Avx2, MR256, false>(a, lda, bt, n_pad, k, m, c, ldc, Scale::NONE) }
}

#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn nt_scaled_avx512(
    a: *const f32,
    lda: usize,
    bt: *const f32,
    n_pad: usize,
    k: usize,
    m: usize,
    c: *mut f32,
    ldc: usize,
    sc: Scale,
) {
    // SAFETY: the dispatcher checked the extents (the scaling's included) and the ISA.
    unsafe { nt::<Avx512, MR512, true>(a, lda, bt, n_pad, k, m, c, ldc, sc) }
}

#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn nt_scaled_avx2(
    a: *const f32,
    lda: usize,
    bt: *const f32,
    n_pad: usize,
    k: usize,
    m: usize,
    c: *mut f32,
    ldc: usize,
    sc: Scale,
) {
    // SAFETY: as above.
    unsafe { nt::<Avx2, MR256, true>(a, lda, bt, n_pad, k, m, c, ldc, sc) }
}

#[target_feature(enable = "avx512f")]
pub(super) unsafe fn acc_avx512(
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: the dispatcher checked the extents and the ISA.
    unsafe { acc::<Avx512, MR512>(a, a_rs, a_cs, b, ldb, m, n, k, c, ldc) }
}

#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn acc_avx2(
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: as above.
    unsafe { acc::<Avx2, MR256>(a, a_rs, a_cs, b, ldb, m, n, k, c, ldc) }
}

/// `bt[c * n_pad + j] = b[j * ldb + c]` for `j < n`, `c < k`: 8 x 8 blocks transposed in registers
/// (unpack, shuffle, then swap 128-bit halves), the edges by [`super::transpose_rows`]. A copy:
/// the same values as the scalar transpose.
///
/// # Safety
///
/// The CPU has AVX2; `b` holds `n` rows of `k` at stride `ldb`, `bt` holds `k` rows of `n_pad >= n`.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose_avx2(b: *const f32, ldb: usize, n: usize, k: usize, bt: *mut f32, n_pad: usize) {
    let (n8, k8) = (n / 8 * 8, k / 8 * 8);
    // SAFETY (whole body): every access is at row < n, column < k of `b` and row < k, column < n of
    // `bt`, inside the extents of the contract.
    unsafe {
        for j in (0..n8).step_by(8) {
            for c in (0..k8).step_by(8) {
                let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(b.add((j + i) * ldb + c)));
                let t: [__m256; 8] = std::array::from_fn(|i| {
                    let (x, y) = (r[i / 2 * 2], r[i / 2 * 2 + 1]);
                    if i % 2 == 0 { _mm256_unpacklo_ps(x, y) } else { _mm256_unpackhi_ps(x, y) }
                });
                // s[q]: rows 0-3 (q < 4) or 4-7 of columns (q % 4 order: 0, 1, 2, 3) | (4, 5, 6, 7).
                let s: [__m256; 8] = [
                    _mm256_shuffle_ps::<0x44>(t[0], t[2]),
                    _mm256_shuffle_ps::<0xEE>(t[0], t[2]),
                    _mm256_shuffle_ps::<0x44>(t[1], t[3]),
                    _mm256_shuffle_ps::<0xEE>(t[1], t[3]),
                    _mm256_shuffle_ps::<0x44>(t[4], t[6]),
                    _mm256_shuffle_ps::<0xEE>(t[4], t[6]),
                    _mm256_shuffle_ps::<0x44>(t[5], t[7]),
                    _mm256_shuffle_ps::<0xEE>(t[5], t[7]),
                ];
                for q in 0..4 {
                    _mm256_storeu_ps(bt.add((c + q) * n_pad + j), _mm256_permute2f128_ps::<0x20>(s[q], s[q + 4]));
                    _mm256_storeu_ps(bt.add((c + q + 4) * n_pad + j), _mm256_permute2f128_ps::<0x31>(s[q], s[q + 4]));
                }
            }
        }
        let b = std::slice::from_raw_parts(b, if n == 0 { 0 } else { (n - 1) * ldb + k });
        let bt = std::slice::from_raw_parts_mut(bt, k * n_pad);
        super::transpose_rows(b, ldb, 0..n8, k8..k, bt, n_pad);
        super::transpose_rows(b, ldb, n8..n, 0..k, bt, n_pad);
    }
}
