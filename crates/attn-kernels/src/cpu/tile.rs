//! Register-tiled f32 micro-kernels for the two small products every attention tile needs:
//! `C = A · Bᵀ` (scores `q·k`, and `g·v` in the backward) and `C += A · B` (`a·v`, `dv`, `dk`, `dq`).
//!
//! [`matmul_nt`] and [`matmul_acc`] dispatch on the [`Isa`]: explicit AVX-512 and AVX2+FMA
//! intrinsics, else the portable versions ([`portable_nt`], [`portable_acc`]), which are plain Rust
//! generic over `FMA` (with `FMA = false` they use `a * b + c`, because `f32::mul_add` without the
//! `fma` target feature is a libm call).
//!
//! The explicit kernels are written once over a small `Lanes` trait (load, store, splat, fma, masked
//! first-`w`-lanes load/store) and instantiated per ISA: AVX-512 `6 x 64` blocks, AVX2 `4 x 16`
//! blocks, column tails by masked loads/stores on both ISAs. Every entry is one chain of fused
//! multiply-adds over the inner index in order, whatever the block: the same bits as the portable
//! kernels, so a block shape can change without changing a trained model's numbers.
//! Lab history (versions, GFLOP/s, what was rejected): `docs/bench/kernels-cpu-notes.md`.

/// Rows per register block of the portable kernels.
pub(crate) const MR: usize = 4;
/// Columns per register block; packed operands are padded to a multiple of this.
pub(crate) const NR: usize = 32;

use crate::cpu::isa::Isa;
use crate::cpu::math::fmadd;

/// `C = A · Bᵀ`; see [`portable_nt`] for the layout. Dispatches on `isa`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_nt<const FMA: bool>(
    isa: Isa,
    a: &[f32],
    lda: usize,
    bt: &[f32],
    n_pad: usize,
    k: usize,
    m: usize,
    c: &mut [f32],
    ldc: usize,
) {
    if m == 0 || k == 0 {
        c.iter_mut().take(m.saturating_sub(1) * ldc + if m > 0 { n_pad } else { 0 }).for_each(|x| *x = 0.0);
        return;
    }
    // The intrinsics below index with raw pointers: check the extents once here.
    assert!(n_pad.is_multiple_of(NR) && a.len() >= (m - 1) * lda + k && bt.len() >= k * n_pad);
    assert!(c.len() >= (m - 1) * ldc + n_pad);
    match isa {
        // SAFETY: extents checked above; the ISA was checked supported by the caller's dispatch.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::nt_avx512(a.as_ptr(), lda, bt.as_ptr(), n_pad, k, m, c.as_mut_ptr(), ldc) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { x86::nt_avx2(a.as_ptr(), lda, bt.as_ptr(), n_pad, k, m, c.as_mut_ptr(), ldc) },
        _ => portable_nt::<FMA>(a, lda, bt, n_pad, k, m, c, ldc),
    }
}

/// `C += A · B`; see [`portable_acc`] for the layout. Dispatches on `isa`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_acc<const FMA: bool>(
    isa: Isa,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
) {
    matmul_acc_strided::<FMA>(isa, a, lda, 1, b, ldb, m, n, k, c, ldc)
}

/// `C += Aᵀ · B` where `a` holds `Aᵀ` as an `n x m` row-major matrix with row stride `lda`: the
/// backward's `dv += wᵀ g` and `dk += Pᵀ q` without materialising the transposes.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_tn_acc<const FMA: bool>(
    isa: Isa,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
) {
    matmul_acc_strided::<FMA>(isa, a, 1, lda, b, ldb, m, n, k, c, ldc)
}

/// `C += A · B` with `A[i][t] = a[i * a_rs + t * a_cs]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn matmul_acc_strided<const FMA: bool>(
    isa: Isa,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(a.len() > (m - 1) * a_rs + (n - 1) * a_cs && b.len() >= (n - 1) * ldb + k && c.len() >= (m - 1) * ldc + k);
    match isa {
        // SAFETY: extents checked above; ISA checked by the caller's dispatch.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe {
            x86::acc_avx512(a.as_ptr(), a_rs, a_cs, b.as_ptr(), ldb, m, n, k, c.as_mut_ptr(), ldc)
        },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { x86::acc_avx2(a.as_ptr(), a_rs, a_cs, b.as_ptr(), ldb, m, n, k, c.as_mut_ptr(), ldc) },
        _ => portable_acc::<FMA>(a, a_rs, a_cs, b, ldb, m, n, k, c, ldc),
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
mod x86 {
    //! The intrinsics kernels, written once over [`Lanes`] and instantiated per ISA by the
    //! `#[target_feature]` entry points at the bottom. Every function requires the extents checked
    //! by its dispatcher.
    //!
    //! The generic bodies are `#[inline(always)]`: they must be compiled inside a `#[target_feature]`
    //! function, where the intrinsics behind [`Lanes`] inline to single instructions; compiled on
    //! their own they would call the intrinsics out of line.
    use std::arch::x86_64::*;

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

    /// `C[0..R][j..j + V W] = A[0..R] · Bᵀ[.., j..j + V W]`, in `R x V` accumulators.
    #[inline(always)]
    unsafe fn nt_panel<L: Lanes, const R: usize, const V: usize>(
        a: *const f32,
        lda: usize,
        bt: *const f32,
        n_pad: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        j: usize,
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
            for r in 0..R {
                for q in 0..V {
                    L::store(c.add(r * ldc + j + q * L::W), acc[r][q]);
                }
            }
        }
    }

    /// `C[0..R] = A[0..R] · Bᵀ` over all `n_pad` columns: panels of `4W` where the ISA holds
    /// `R x 4` accumulators ([`Lanes::WIDE`]), then of `2W` (`n_pad` is a multiple of `NR`, hence
    /// of `2W`). Every entry sums over `t` in the same order whatever the panel.
    #[inline(always)]
    unsafe fn nt_block<L: Lanes, const R: usize>(
        a: *const f32,
        lda: usize,
        bt: *const f32,
        n_pad: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        let wide = wide_cols::<L>(n_pad);
        // SAFETY: the panels split [0, n_pad) exactly.
        unsafe {
            for j in (0..wide).step_by(4 * L::W) {
                nt_panel::<L, R, 4>(a, lda, bt, n_pad, k, c, ldc, j);
            }
            for j in (wide..n_pad).step_by(2 * L::W) {
                nt_panel::<L, R, 2>(a, lda, bt, n_pad, k, c, ldc, j);
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

    /// `C = A · Bᵀ` for all `m` rows: blocks of `MR` rows, then of 4, 2 and 1.
    #[inline(always)]
    unsafe fn nt<L: Lanes, const MR: usize>(
        a: *const f32,
        lda: usize,
        bt: *const f32,
        n_pad: usize,
        k: usize,
        m: usize,
        c: *mut f32,
        ldc: usize,
    ) {
        // SAFETY: row blocks stay below m.
        unsafe {
            let mut i = 0;
            while i + MR <= m {
                nt_block::<L, MR>(a.add(i * lda), lda, bt, n_pad, k, c.add(i * ldc), ldc);
                i += MR;
            }
            // The rest in blocks of 4, 2 and 1 rows: a single row keeps only two accumulator chains
            // in flight, a quarter of what the FMA pipes need to stay busy.
            if MR > 4 && i + 4 <= m {
                nt_block::<L, 4>(a.add(i * lda), lda, bt, n_pad, k, c.add(i * ldc), ldc);
                i += 4;
            }
            if MR > 2 && i + 2 <= m {
                nt_block::<L, 2>(a.add(i * lda), lda, bt, n_pad, k, c.add(i * ldc), ldc);
                i += 2;
            }
            while i < m {
                nt_block::<L, 1>(a.add(i * lda), lda, bt, n_pad, k, c.add(i * ldc), ldc);
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
    unsafe fn acc_row<L: Lanes>(
        a: *const f32,
        a_cs: usize,
        b: *const f32,
        ldb: usize,
        n: usize,
        k: usize,
        c: *mut f32,
    ) {
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
        unsafe { nt::<Avx512, MR512>(a, lda, bt, n_pad, k, m, c, ldc) }
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
        unsafe { nt::<Avx2, MR256>(a, lda, bt, n_pad, k, m, c, ldc) }
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
}

/// Rounds `n` up to a multiple of [`NR`].
#[inline(always)]
pub(crate) const fn pad_nr(n: usize) -> usize {
    n.div_ceil(NR) * NR
}

/// [`pack_transposed`] into a block of fixed width `n_pad >= pad_nr(n)` (zero padding up to it).
#[inline(always)]
pub(crate) fn pack_transposed_padded(b: &[f32], ldb: usize, n: usize, k: usize, n_pad: usize, bt: &mut [f32]) {
    debug_assert!(n_pad >= pad_nr(n) && n_pad.is_multiple_of(NR) && bt.len() >= k * n_pad);
    for c in 0..k {
        bt[c * n_pad + n..c * n_pad + n_pad].fill(0.0);
    }
    for j in 0..n {
        let row = &b[j * ldb..j * ldb + k];
        for (c, &x) in row.iter().enumerate() {
            bt[c * n_pad + j] = x;
        }
    }
}

/// Packs rows `b[0..n]` (each `k` long, row stride `ldb`) transposed into `bt` as a `k x pad_nr(n)`
/// row-major matrix with zero padding.
#[cfg(test)]
pub(crate) fn pack_transposed(b: &[f32], ldb: usize, n: usize, k: usize, bt: &mut [f32]) {
    pack_transposed_padded(b, ldb, n, k, pad_nr(n), bt);
}

/// `c[i][j] = sum_t a[i][t] * bt[t][j]` for `i < m`, `j < n_pad`: `a` has row stride `lda`, `bt` is
/// `k x n_pad` (from [`pack_transposed`]), `c` has row stride `ldc >= n_pad`. Overwrites `c`.
#[inline(always)]
pub(crate) fn portable_nt<const FMA: bool>(
    a: &[f32],
    lda: usize,
    bt: &[f32],
    n_pad: usize,
    k: usize,
    m: usize,
    c: &mut [f32],
    ldc: usize,
) {
    debug_assert!(n_pad.is_multiple_of(NR));
    let mut i = 0;
    while i + MR <= m {
        let mut j = 0;
        while j < n_pad {
            let mut acc = [[0.0f32; NR]; MR];
            for t in 0..k {
                let b: &[f32; NR] = bt[t * n_pad + j..t * n_pad + j + NR].try_into().unwrap();
                for r in 0..MR {
                    let x = a[(i + r) * lda + t];
                    for q in 0..NR {
                        acc[r][q] = fmadd::<FMA>(x, b[q], acc[r][q]);
                    }
                }
            }
            for r in 0..MR {
                c[(i + r) * ldc + j..(i + r) * ldc + j + NR].copy_from_slice(&acc[r]);
            }
            j += NR;
        }
        i += MR;
    }
    // Row tail, one row at a time.
    while i < m {
        let mut j = 0;
        while j < n_pad {
            let mut acc = [0.0f32; NR];
            for t in 0..k {
                let b: &[f32; NR] = bt[t * n_pad + j..t * n_pad + j + NR].try_into().unwrap();
                let x = a[i * lda + t];
                for q in 0..NR {
                    acc[q] = fmadd::<FMA>(x, b[q], acc[q]);
                }
            }
            c[i * ldc + j..i * ldc + j + NR].copy_from_slice(&acc);
            j += NR;
        }
        i += 1;
    }
}

/// `c[i][col] += sum_t a[i][t] * b[t][col]` for `i < m`, `t < n`, `col < k`: `a` has row stride `lda`,
/// `b` row stride `ldb`, `c` row stride `ldc`. Column blocks of [`NR`] are register-tiled; the column
/// tail (head dims not a multiple of 32) runs one vector-friendly row at a time.
#[inline(always)]
pub(crate) fn portable_acc<const FMA: bool>(
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: &mut [f32],
    ldc: usize,
) {
    let k_main = k / NR * NR;
    let mut i = 0;
    while i + MR <= m {
        let mut col = 0;
        while col < k_main {
            let mut acc = [[0.0f32; NR]; MR];
            for r in 0..MR {
                acc[r].copy_from_slice(&c[(i + r) * ldc + col..(i + r) * ldc + col + NR]);
            }
            for t in 0..n {
                let bv: &[f32; NR] = b[t * ldb + col..t * ldb + col + NR].try_into().unwrap();
                for r in 0..MR {
                    let x = a[(i + r) * a_rs + t * a_cs];
                    for q in 0..NR {
                        acc[r][q] = fmadd::<FMA>(x, bv[q], acc[r][q]);
                    }
                }
            }
            for r in 0..MR {
                c[(i + r) * ldc + col..(i + r) * ldc + col + NR].copy_from_slice(&acc[r]);
            }
            col += NR;
        }
        i += MR;
    }
    // Remaining rows over the main columns.
    for i in i..m {
        let mut col = 0;
        while col < k_main {
            let mut acc: [f32; NR] = c[i * ldc + col..i * ldc + col + NR].try_into().unwrap();
            for t in 0..n {
                let bv: &[f32; NR] = b[t * ldb + col..t * ldb + col + NR].try_into().unwrap();
                let x = a[i * a_rs + t * a_cs];
                for q in 0..NR {
                    acc[q] = fmadd::<FMA>(x, bv[q], acc[q]);
                }
            }
            c[i * ldc + col..i * ldc + col + NR].copy_from_slice(&acc);
            col += NR;
        }
    }
    // Column tail for every row.
    if k_main < k {
        for i in 0..m {
            let crow = &mut c[i * ldc + k_main..i * ldc + k];
            for t in 0..n {
                let x = a[i * a_rs + t * a_cs];
                let brow = &b[t * ldb + k_main..t * ldb + k];
                for (cv, &bv) in crow.iter_mut().zip(brow) {
                    *cv = fmadd::<FMA>(x, bv, *cv);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
