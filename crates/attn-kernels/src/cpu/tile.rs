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
//! kernels, so a block shape can change without changing a trained model's numbers. (The exception:
//! a lone row of `C += A · B`, a decoding step's, keeps two chains, even and odd keys, added at the
//! end.)
//!
//! [`matmul_acc_nonzero`] is `C += A · B` over only the nonzero entries of each row of `A`
//! (re-weighting's weights, two thirds of them zero with random inputs): each row alone, one chain
//! per output entry over its nonzero terms in order, the dense blocks' sums less their `+0 · b`
//! terms. The intrinsics live in `tile/x86.rs`.
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
    assert_nt_extents(a, lda, bt, n_pad, k, m, c, ldc);
    match isa.simd() {
        // SAFETY: extents checked above; the ISA was checked supported by the caller's dispatch.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::nt_avx512(a.as_ptr(), lda, bt.as_ptr(), n_pad, k, m, c.as_mut_ptr(), ldc) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { x86::nt_avx2(a.as_ptr(), lda, bt.as_ptr(), n_pad, k, m, c.as_mut_ptr(), ldc) },
        _ => portable_nt::<FMA>(a, lda, bt, n_pad, k, m, c, ldc),
    }
}

/// The extents the `A · Bᵀ` micro-kernels index by raw pointers (`m, k >= 1`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn assert_nt_extents(a: &[f32], lda: usize, bt: &[f32], n_pad: usize, k: usize, m: usize, c: &[f32], ldc: usize) {
    assert!(n_pad.is_multiple_of(NR) && a.len() >= (m - 1) * lda + k && bt.len() >= k * n_pad);
    assert!(c.len() >= (m - 1) * ldc + n_pad);
}

/// [`matmul_nt`] with the scores' scaling applied to every entry, the `n_pad` columns' padding
/// included: for cosine scores (`col` given, an entry per column) `c[r][j] = (dot · row[r]) ·
/// col[j] + bias[r]` (a multiplication, then a fused multiply-add where `FMA`), for dot scores
/// `dot · row[r] + bias[r]`. The x86 micro-kernels scale each entry as they store it, instead of
/// a pass over the stored tile; the same bits either way.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_nt_scaled<const FMA: bool>(
    isa: Isa,
    a: &[f32],
    lda: usize,
    bt: &[f32],
    n_pad: usize,
    k: usize,
    m: usize,
    c: &mut [f32],
    ldc: usize,
    (row, col, bias): (&[f32], Option<&[f32]>, &[f32]),
) {
    assert!(row.len() >= m && bias.len() >= m && col.is_none_or(|col| col.len() >= n_pad));
    #[cfg(target_arch = "x86_64")]
    if FMA && m > 0 && k > 0 && matches!(isa.simd(), Isa::Avx512 | Isa::Avx2Fma) {
        assert_nt_extents(a, lda, bt, n_pad, k, m, c, ldc);
        let col = col.map_or(std::ptr::null(), <[f32]>::as_ptr);
        let sc = x86::Scale { row: row.as_ptr(), col, bias: bias.as_ptr() };
        let (pa, pb, pc) = (a.as_ptr(), bt.as_ptr(), c.as_mut_ptr());
        // SAFETY: extents checked above; the ISA was checked supported by the caller's dispatch.
        return unsafe {
            if isa.simd() == Isa::Avx512 {
                x86::nt_scaled_avx512(pa, lda, pb, n_pad, k, m, pc, ldc, sc)
            } else {
                x86::nt_scaled_avx2(pa, lda, pb, n_pad, k, m, pc, ldc, sc)
            }
        };
    }
    matmul_nt::<FMA>(isa, a, lda, bt, n_pad, k, m, c, ldc);
    for r in 0..m {
        let (f, b) = (row[r], bias[r]);
        let out = &mut c[r * ldc..r * ldc + n_pad];
        match col {
            Some(col) => out.iter_mut().zip(col).for_each(|(x, &kn)| *x = fmadd::<FMA>(*x * f, kn, b)),
            None => out.iter_mut().for_each(|x| *x = fmadd::<FMA>(*x, f, b)),
        }
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
    match isa.simd() {
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

/// [`matmul_acc_nonzero`] of two weight matrices against the same `B`: `c0 += a0 · B` and
/// `c1 += a1 · B` (re-weighting's weights and its backward helper's, over one key tile's values).
/// On AVX-512 one pass over the keys where either is nonzero, each value row loaded once for both
/// outputs; elsewhere two passes. The same values either way (a zero's sign aside).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_acc_nonzero_two<const FMA: bool>(
    isa: Isa,
    a: [&[f32]; 2],
    lda: usize,
    b: &[f32],
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: [&mut [f32]; 2],
    ldc: usize,
) {
    let [c0, c1] = c;
    #[cfg(target_arch = "x86_64")]
    if isa.simd() == Isa::Avx512 && m > 0 && n > 0 && k > 0 {
        let fits = |a: &[f32]| a.len() >= (m - 1) * lda + n;
        let fits_c = |c: &[f32]| c.len() >= (m - 1) * ldc + k;
        assert!(a.iter().all(|a| fits(a)) && b.len() >= (n - 1) * ldb + k && fits_c(c0) && fits_c(c1));
        let (pa, pc) = (a.map(<[f32]>::as_ptr), [c0.as_mut_ptr(), c1.as_mut_ptr()]);
        // SAFETY: extents checked above; the ISA was checked supported by the caller's dispatch.
        return unsafe { x86::acc_nonzero_two_avx512(pa, lda, b.as_ptr(), ldb, m, n, k, pc, ldc) };
    }
    matmul_acc_nonzero::<FMA>(isa, a[0], lda, b, ldb, m, n, k, c0, ldc);
    matmul_acc_nonzero::<FMA>(isa, a[1], lda, b, ldb, m, n, k, c1, ldc);
}

/// `C += A · B` as [`matmul_acc`] (`A` row-major, row stride `lda`), over only the nonzero entries of
/// each row of `A`: re-weighting's weights, zero for every key at or below a row's mean activation
/// (SPEC section 3), which is most of a row's keys. Each row runs over the list of its nonzero keys
/// (on AVX-512 two rows step through their lists together), one chain of fused multiply-adds per
/// output entry in key order: the sums of [`matmul_acc`]'s blocks of rows less their `+0 · b` terms,
/// so the same values for finite `B` (a zero's sign aside; a lone row there splits its chain in
/// two).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_acc_nonzero<const FMA: bool>(
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
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(a.len() >= (m - 1) * lda + n && b.len() >= (n - 1) * ldb + k && c.len() >= (m - 1) * ldc + k);
    let (pa, pb, pc) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
    match isa.simd() {
        // SAFETY: extents checked above; the ISA was checked supported by the caller's dispatch.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::acc_nonzero_avx512(pa, lda, pb, ldb, m, n, k, pc, ldc) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2Fma => unsafe { x86::acc_nonzero_avx2(pa, lda, pb, ldb, m, n, k, pc, ldc) },
        _ => {
            for i in 0..m {
                let out = &mut c[i * ldc..i * ldc + k];
                for (t, &x) in a[i * lda..i * lda + n].iter().enumerate().filter(|&(_, &x)| x != 0.0) {
                    out.iter_mut().zip(&b[t * ldb..t * ldb + k]).for_each(|(o, &y)| *o = fmadd::<FMA>(x, y, *o));
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
mod x86;

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;

/// [`Isa::Amx`] is never supported off x86-64: its operations are never called there.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(crate) mod amx {
    pub(crate) const PARTS: usize = 3;
    pub(crate) const ROWS: usize = 32;
    pub(crate) const INNER: usize = 32;
    pub(crate) fn enabled() -> bool {
        false
    }
    pub(crate) fn split_rows(_: &[f32], _: usize, _: usize, _: usize, _: &mut [u16], _: usize, _: usize) {
        unreachable!("AMX is x86-64 only")
    }
    pub(crate) fn split_columns(
        _: &[f32],
        _: usize,
        _: (usize, usize),
        _: &mut [u16],
        _: (usize, usize),
        _: Option<&mut [f64]>,
    ) {
        unreachable!("AMX is x86-64 only")
    }
    pub(crate) fn softplus_row(
        _: &[f32],
        _: usize,
        _: (f32, f32),
        _: Option<&[f32]>,
        _: &mut [f32; 16],
        _: &mut [u16],
        _: (usize, usize, usize),
    ) {
        unreachable!("AMX is x86-64 only")
    }
    pub(crate) fn pack_keys(
        _: super::Isa,
        _: &[f32],
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
        _: &mut [f32],
        _: &mut [f32],
    ) {
        unreachable!("AMX is x86-64 only")
    }
    pub(crate) fn pack_values(_: &[f32], _: usize, _: usize, _: usize, _: usize, _: usize, _: &mut [f32]) {
        unreachable!("AMX is x86-64 only")
    }
    pub(crate) fn product(_: &[u16], _: usize, _: &[f32], _: usize, _: usize, _: &mut [f32], _: usize) {
        unreachable!("AMX is x86-64 only")
    }
    pub(crate) fn product_add(_: &[u16], _: usize, _: &[f32], _: usize, _: usize, _: &mut [f32], _: usize) {
        unreachable!("AMX is x86-64 only")
    }
}

/// Test values: the top 24 bits of a 64-bit linear congruential generator's next state, as a value
/// in `[-1, 1)` (the AMX operands' and `cpu::gemm`'s tests).
#[cfg(test)]
pub(crate) fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// A buffer of `T` whose first element is on a 64-byte boundary.
pub(crate) struct Aligned<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T> Aligned<T> {
    /// No values.
    pub(crate) const fn empty() -> Self {
        Self { buf: Vec::new(), start: 0, len: 0 }
    }
}

impl<T: Copy + Default> Aligned<T> {
    /// `len` default values.
    #[cfg(test)]
    pub(crate) fn new(len: usize) -> Self {
        let mut a = Self::empty();
        a.resize(len);
        a
    }

    /// At least `len` values (their contents unspecified after a growth), on a 64-byte boundary.
    pub(crate) fn resize(&mut self, len: usize) {
        if self.buf.len() < self.start + len {
            self.buf = vec![T::default(); len + 64 / size_of::<T>()];
            self.start = self.buf.as_ptr().align_offset(64);
        }
        self.len = len;
    }
}

impl<T> std::ops::Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> std::ops::DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

/// Rounds `n` up to a multiple of [`NR`].
#[inline(always)]
pub(crate) const fn pad_nr(n: usize) -> usize {
    n.div_ceil(NR) * NR
}

/// [`pack_transposed`] into a block of fixed width `n_pad >= pad_nr(n)` (zero padding up to it).
#[inline(always)]
pub(crate) fn pack_transposed_padded(
    isa: Isa,
    b: &[f32],
    ldb: usize,
    n: usize,
    k: usize,
    n_pad: usize,
    bt: &mut [f32],
) {
    assert!(n_pad >= pad_nr(n) && n_pad.is_multiple_of(NR) && bt.len() >= k * n_pad);
    for c in 0..k {
        bt[c * n_pad + n..c * n_pad + n_pad].fill(0.0);
    }
    if n == 0 || k == 0 {
        return;
    }
    assert!(b.len() >= (n - 1) * ldb + k);
    match isa.simd() {
        // SAFETY: extents checked above; AVX-512 CPUs have AVX2, and the ISA was checked supported
        // by the caller's dispatch.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Avx2Fma => unsafe { x86::transpose_avx2(b.as_ptr(), ldb, n, k, bt.as_mut_ptr(), n_pad) },
        _ => transpose_rows(b, ldb, 0..n, 0..k, bt, n_pad),
    }
}

/// `bt[c * n_pad + j] = b[j * ldb + c]` for `j` in `rows`, `c` in `cols`: the scalar transpose.
fn transpose_rows(
    b: &[f32],
    ldb: usize,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
    bt: &mut [f32],
    n_pad: usize,
) {
    for j in rows {
        let row = &b[j * ldb..];
        for c in cols.clone() {
            bt[c * n_pad + j] = row[c];
        }
    }
}

/// Packs rows `b[0..n]` (each `k` long, row stride `ldb`) transposed into `bt` as a `k x pad_nr(n)`
/// row-major matrix with zero padding.
#[cfg(test)]
pub(crate) fn pack_transposed(b: &[f32], ldb: usize, n: usize, k: usize, bt: &mut [f32]) {
    pack_transposed_padded(Isa::Scalar, b, ldb, n, k, pad_nr(n), bt);
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
