//! The forward's two products on Intel AMX (Advanced Matrix Extensions), in f32 accuracy from
//! bf16 tiles: [`Isa::Amx`](crate::cpu::Isa::Amx).
//!
//! # Three bf16 parts, six products
//!
//! AMX multiplies bf16 tiles (8 significant bits) into f32 accumulators. An f32 `x` (24 significant
//! bits) is the exact sum of three bf16 parts taken by truncation: `h` its top 8 bits, `m` the top 8
//! of `x - h`, `l = x - h - m` (at most 8 significant bits left, so a bf16 exactly; `x` finite, at
//! least `2^-110` in magnitude for `l` to stay normal: smaller parts are flushed to zero by the
//! tiles, an absolute error under `2^-126`). A product `x y` is then nine products of parts, of
//! relative sizes `2^0` (`h h`), `2^-8` (`h m`, `m h`), `2^-16` (`h l`, `m m`, `l h`), `2^-24`
//! (`m l`, `l m`) and `2^-32` (`l l`); [`product`] sums the first six, so each term of a dot product
//! is within `2^-23 |x y|` of exact (the f32 product's own rounding is `2^-24`), and the tiles add
//! the terms in f32. Against an f64 reference a 64-term dot product of random values came out
//! within 6e-8 of the sum of the terms' magnitudes, where one chain of f32 fused multiply-adds
//! (the AVX-512 micro-kernels) was within 1.6e-7: as accurate as the f32 kernels.
//!
//! On a tile in L1 the six products run at about 390 f32-equivalent GFLOP/s on one core of an
//! Intel Xeon with AMX, where the AVX-512 micro-kernels reach 184 (`kernels-cpu-notes.md`).
//!
//! # Layouts
//!
//! Tiles are 16 rows of 64 bytes: `A` tiles 16 rows x 32 bf16 of the inner index, `B` tiles 16
//! rows x 16 pairs, row `t` holding inner indices `2t, 2t + 1` of each of 16 columns (one 32-bit
//! word a column: the low half the even index). Every operand here is stored as its three parts one
//! after the other, each part tile after tile (a tile's 1 KiB contiguous, so that its loads stream
//! through whole cache lines in order: the products ran 15% faster over operands streamed from L3
//! than with row-major parts):
//!
//! - an `A` operand ([`split_rows`], and LSSA's fused row pass [`softplus_row`]): `m_pad x k_pad`
//!   bf16 a part, element `(r, c)` at [`a_at`], padding zero;
//! - a `B` operand: `k_pad / 2 x n` words a part, word `(t, j)` at [`b_at`] ([`pack_keys`] for the
//!   scores' `Kᵀ`, [`pack_values`] for `V`).
//!
//! Loads of 64 bytes that straddle cache lines take twice as long (a 16-byte offset halved the
//! product's speed), so every buffer here starts on a 64-byte boundary
//! ([`Aligned`](super::Aligned)).
//!
//! The kernels use these where `split::amx_products` says (the long forward without re-weighting,
//! its scores and value product, and its backward's recomputed scores); everything else under
//! [`Isa::Amx`](crate::cpu::Isa::Amx) runs the AVX-512 code.
use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::cpu::engine::lane_add;
use crate::cpu::math::{self, softplus_table::softplus_in_range};

/// Parts of each operand.
pub(crate) const PARTS: usize = 3;
/// Rows of a row block of [`product`] (two tiles of 16), and the padding of `A`'s rows.
pub(crate) const ROWS: usize = 32;
/// The inner index's padding (one `A` tile's width in bf16) and the columns of a column block.
pub(crate) const INNER: usize = 32;

/// Whether this CPU and OS run AMX-BF16 for this process: the CPU reports AMX-TILE and AMX-BF16
/// (CPUID leaf 7) and AVX512-BF16 (the operands' conversions), the OS saves the tile state (XCR0
/// bits 17 and 18), and Linux granted the process the tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM)`,
/// asked once). `false` elsewhere.
pub(crate) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    // SAFETY: CPUID and XGETBV exist on every x86-64 CPU with OSXSAVE, checked before XGETBV.
    *ON.get_or_init(|| {
        is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
            && unsafe { cpu_and_os_support() }
            && request_tile_data()
    })
}

/// CPUID's AMX-TILE and AMX-BF16 bits and the OS's XSAVE of the tile state.
#[target_feature(enable = "xsave")]
unsafe fn cpu_and_os_support() -> bool {
    if __cpuid(0).eax < 7 || __cpuid(1).ecx & (1 << 27) == 0 {
        return false; // no leaf 7, or no OSXSAVE (then XGETBV faults)
    }
    let edx = __cpuid_count(7, 0).edx;
    let (amx_bf16, amx_tile) = (edx & (1 << 22) != 0, edx & (1 << 24) != 0);
    // SAFETY: OSXSAVE checked above.
    let xcr0 = unsafe { _xgetbv(0) };
    amx_bf16 && amx_tile && xcr0 & (0b11 << 17) == 0b11 << 17
}

/// Linux: asks for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// without which the first tile instruction faults. Granted for the whole process.
#[cfg(target_os = "linux")]
fn request_tile_data() -> bool {
    const SYS_ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let mut ret = SYS_ARCH_PRCTL as isize;
    // SAFETY: a system call that only changes this process's permissions; it clobbers rcx and r11.
    unsafe {
        asm!(
            "syscall",
            inout("rax") ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            out("rcx") _,
            out("r11") _,
            options(nostack),
        );
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_data() -> bool {
    false
}

/// Where element `(r, c)` of an `A` part of `k_pad` columns lies: 16 x 32 tiles, a row of tiles
/// after another.
pub(crate) const fn a_at(r: usize, c: usize, k_pad: usize) -> usize {
    ((r / 16) * (k_pad / INNER) + c / INNER) * 512 + (r % 16) * INNER + c % INNER
}

/// Where word `(t, j)` of a `B` part of `n` columns lies: 16 x 16 tiles, a row of tiles after
/// another.
pub(crate) const fn b_at(t: usize, j: usize, n: usize) -> usize {
    ((t / 16) * (n / 16) + j / 16) * 256 + (t % 16) * 16 + j % 16
}

/// `x` as its three bf16 parts, each as an f32 whose low 16 bits are zero (the truncations
/// described in the module docs).
#[inline(always)]
unsafe fn parts(x: __m512) -> [__m512; PARTS] {
    // SAFETY: AVX-512F, enabled by every caller.
    unsafe {
        let top = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        let h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), top));
        let r = _mm512_sub_ps(x, h);
        let m = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(r), top));
        [h, m, _mm512_sub_ps(r, m)]
    }
}

/// The parts of 32 values, `lo` then `hi`, stored as 32 bf16 at each of `out[p]`: exact
/// conversions (the parts are bf16 values already).
#[inline(always)]
unsafe fn store_parts(lo: __m512, hi: __m512, out: [*mut u16; PARTS]) {
    // SAFETY: AVX-512F and AVX512-BF16, enabled by every caller; 64 bytes at each `out[p]`.
    unsafe {
        let (lo, hi) = (parts(lo), parts(hi));
        for p in 0..PARTS {
            let words: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi[p], lo[p]));
            _mm512_storeu_si512(out[p].cast(), words);
        }
    }
}

/// The three parts of `x` (one f32 of the scalar reference): what [`parts`] computes per lane.
#[cfg(test)]
pub(crate) fn parts_scalar(x: f32) -> [f32; PARTS] {
    let top = |x: f32| f32::from_bits(x.to_bits() & 0xFFFF_0000);
    let h = top(x);
    let m = top(x - h);
    [h, m, x - h - m]
}

/// Lanes `[c, c + 16)` of row `r` of `x` (`rows x cols` at stride `ld`), zero past its extent.
#[inline(always)]
unsafe fn load_row(x: *const f32, ld: usize, (rows, cols): (usize, usize), r: usize, c: usize) -> __m512 {
    // SAFETY: AVX-512F, enabled by every caller; only lanes inside the extent are read.
    unsafe {
        if r >= rows || c >= cols {
            return _mm512_setzero_ps();
        }
        let w = (cols - c).min(16);
        _mm512_maskz_loadu_ps(((1u32 << w) - 1) as u16, x.add(r * ld + c))
    }
}

/// Splits `m` rows of `k` f32 (`x`, row stride `ld`) into an `A` operand: [`PARTS`] parts of
/// `m_pad x k_pad` bf16 ([`a_at`]), rows and columns past the data zero.
pub(crate) fn split_rows(x: &[f32], ld: usize, m: usize, k: usize, out: &mut [u16], m_pad: usize, k_pad: usize) {
    assert!(m <= m_pad && m_pad.is_multiple_of(16) && k <= k_pad && k_pad.is_multiple_of(INNER));
    assert!(out.len() >= PARTS * m_pad * k_pad && (m == 0 || x.len() >= (m - 1) * ld + k));
    assert!(enabled(), "AMX operands on a CPU or OS without AMX");
    // SAFETY: extents checked above, the ISA present (`enabled` checks AVX-512BW and AVX512-BF16).
    unsafe { split_rows_avx512(x.as_ptr(), ld, m, k, out.as_mut_ptr(), m_pad, k_pad) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn split_rows_avx512(x: *const f32, ld: usize, m: usize, k: usize, out: *mut u16, m_pad: usize, k_pad: usize) {
    let part = m_pad * k_pad;
    // SAFETY (whole body): reads rows < m, columns < k of `x`; writes inside `out`'s extent.
    unsafe {
        for r in 0..m_pad {
            for c in (0..k_pad).step_by(INNER) {
                let load = |c0: usize| load_row(x, ld, (m, k), r, c0);
                let at = a_at(r, c, k_pad);
                store_parts(load(c), load(c + 16), [out.add(at), out.add(part + at), out.add(2 * part + at)]);
            }
        }
    }
}

/// Splits the transpose of `x` (`k` rows of `m` f32, row stride `ld`) into an `A` operand of `m`
/// rows of `k`: what [`split_rows`] writes for `xᵀ`, the transpose made 16 x 16 values at a time in
/// registers instead of through a transposed copy (the weight gradient `dYᵀ X`). With `sums` (at
/// least `m_pad` floats), also adds the sums of `A`'s rows (`x`'s columns) to it: f32 sums of 32
/// values, each added in f64.
pub(crate) fn split_columns(
    x: &[f32],
    ld: usize,
    (k, m): (usize, usize),
    out: &mut [u16],
    (m_pad, k_pad): (usize, usize),
    sums: Option<&mut [f64]>,
) {
    assert!(m <= m_pad && m_pad.is_multiple_of(16) && k <= k_pad && k_pad.is_multiple_of(INNER));
    assert!(out.len() >= PARTS * m_pad * k_pad && (k == 0 || x.len() >= (k - 1) * ld + m));
    assert!(sums.as_ref().is_none_or(|s| s.len() >= m_pad));
    assert!(enabled(), "AMX operands on a CPU or OS without AMX");
    let sums = sums.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr());
    // SAFETY: extents checked above, the ISA present (`enabled` checks AVX-512BW and AVX512-BF16).
    unsafe { split_columns_avx512(x.as_ptr(), ld, (k, m), out.as_mut_ptr(), (m_pad, k_pad), sums) }
}

/// The 16 x 16 transpose of `v` (row `i` of the result is lane `i` of every `v[j]`): pairs of
/// rows interleaved, then pairs of pairs, then 128-bit lanes exchanged twice.
#[inline(always)]
unsafe fn transpose16(v: &[__m512; 16]) -> [__m512; 16] {
    // SAFETY: AVX-512F, enabled by every caller.
    unsafe {
        let t: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (v[i / 2 * 2], v[i / 2 * 2 + 1]);
            if i % 2 == 0 { _mm512_unpacklo_ps(a, b) } else { _mm512_unpackhi_ps(a, b) }
        });
        // w[4g + j]: rows 4g..4g + 4 of columns 4L + j in 128-bit lane L.
        let w: [__m512; 16] = std::array::from_fn(|i| {
            let (g, j) = (i / 4, i % 4);
            let (a, b) = (_mm512_castps_pd(t[4 * g + j / 2]), _mm512_castps_pd(t[4 * g + 2 + j / 2]));
            _mm512_castpd_ps(if j % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) })
        });
        let mut out = [_mm512_setzero_ps(); 16];
        for j in 0..4 {
            let x0 = _mm512_shuffle_f32x4::<0x44>(w[j], w[4 + j]);
            let x1 = _mm512_shuffle_f32x4::<0xEE>(w[j], w[4 + j]);
            let x2 = _mm512_shuffle_f32x4::<0x44>(w[8 + j], w[12 + j]);
            let x3 = _mm512_shuffle_f32x4::<0xEE>(w[8 + j], w[12 + j]);
            out[j] = _mm512_shuffle_f32x4::<0x88>(x0, x2);
            out[4 + j] = _mm512_shuffle_f32x4::<0xDD>(x0, x2);
            out[8 + j] = _mm512_shuffle_f32x4::<0x88>(x1, x3);
            out[12 + j] = _mm512_shuffle_f32x4::<0xDD>(x1, x3);
        }
        out
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn split_columns_avx512(
    x: *const f32,
    ld: usize,
    (k, m): (usize, usize),
    out: *mut u16,
    (m_pad, k_pad): (usize, usize),
    sums: *mut f64,
) {
    let part = m_pad * k_pad;
    // SAFETY (whole body): reads rows < k, columns < m of `x`; writes inside `out`'s extent and
    // `sums[..m_pad]` (the caller's extents).
    unsafe {
        // Blocks of 32 rows of `x` (the inner index), 16 columns (`A`'s rows) at a time across them.
        for c in (0..k_pad).step_by(INNER) {
            for r0 in (0..m_pad).step_by(16) {
                let v: [__m512; INNER] = std::array::from_fn(|t| load_row(x, ld, (k, m), c + t, r0));
                if !sums.is_null() {
                    let mut s = v;
                    for w in [16, 8, 4, 2, 1] {
                        for i in 0..w {
                            s[i] = _mm512_add_ps(s[i], s[i + w]);
                        }
                    }
                    let s = s[0];
                    for (h, s) in
                        [_mm512_castps512_ps256(s), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s)))]
                            .into_iter()
                            .enumerate()
                    {
                        let at = sums.add(r0 + 8 * h);
                        _mm512_storeu_pd(at, _mm512_add_pd(_mm512_loadu_pd(at), _mm512_cvtps_pd(s)));
                    }
                }
                let lo = transpose16(v[..16].try_into().unwrap());
                let hi = transpose16(v[16..].try_into().unwrap());
                for r in 0..16 {
                    let at = a_at(r0 + r, c, k_pad);
                    store_parts(lo[r], hi[r], [out.add(at), out.add(part + at), out.add(2 * part + at)]);
                }
            }
        }
    }
}

/// Row `r` of a tile in LSSA's first sweep under AMX, in passes over 128 keys at a time in L1 where
/// the generic path makes five over the tile (the scores' scale, softplus's two, the row sum, and
/// the split into the value product's operand): `dots` holds the row's raw dot products (the first
/// `vis` visible), scaled as [`scores`](crate::cpu::engine::scores) scales them (`dot · fac ·
/// ink_j + bias`, or `dot · fac + bias` without `ink`), then `f = softplus` by the table
/// ([`softplus_in_range`]; LSSA's scores are in its range), added to the row's lanes `zl` as
/// `lane_add` adds them, and written as its three bf16 parts to row `r` of `out` (an `A` operand of
/// `rows x k_pad`, `k_pad` a multiple of 32), zero past `vis`: what [`split_rows`] writes there for
/// them. Only under [`Isa::Amx`](crate::cpu::Isa::Amx).
#[allow(clippy::too_many_arguments)]
pub(crate) fn softplus_row(
    dots: &[f32],
    vis: usize,
    (fac, bias): (f32, f32),
    ink: Option<&[f32]>,
    zl: &mut [f32; 16],
    out: &mut [u16],
    (r, rows, k_pad): (usize, usize, usize),
) {
    assert!(r < rows && k_pad.is_multiple_of(INNER) && vis <= k_pad);
    assert!(dots.len() >= vis && ink.is_none_or(|k| k.len() >= vis) && out.len() >= PARTS * rows * k_pad);
    // SAFETY: the row's parts lie inside `out` (checked above); the caller runs under `Isa::Amx`,
    // which `enabled` (AVX-512BW, AVX512-BF16) gates.
    unsafe { softplus_row_avx512(dots, vis, (fac, bias), ink, zl, out.as_mut_ptr(), (r, rows, k_pad)) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16,fma")]
unsafe fn softplus_row_avx512(
    dots: &[f32],
    vis: usize,
    (fac, bias): (f32, f32),
    ink: Option<&[f32]>,
    zl: &mut [f32; 16],
    out: *mut u16,
    (r, rows, k_pad): (usize, usize, usize),
) {
    // Passes over 128 keys at a time in L1, each loop tight (the table's registers stay loaded
    // through the softplus loop). One loop doing all four per 16 keys, in registers, was no faster:
    // the AVX-512 forward over the AMX one read 1.132x with it against 1.146x with these passes
    // (`cpu_lab 4096 2 7`, means of 5 and 7 alternated processes, each within 1.10-1.16x).
    let part = rows * k_pad;
    let mut x = [0.0f32; 128];
    for c0 in (0..k_pad).step_by(128) {
        let (n, w) = (vis.saturating_sub(c0).min(128), (k_pad - c0).min(128));
        if n > 0 {
            let (xs, dot) = (&mut x[..n], &dots[c0..c0 + n]);
            match ink {
                Some(ink) => xs
                    .iter_mut()
                    .zip(dot.iter().zip(&ink[c0..c0 + n]))
                    .for_each(|(x, (&d, &k))| *x = math::fmadd::<true>(d * fac, k, bias)),
                None => xs.iter_mut().zip(dot).for_each(|(x, &d)| *x = math::fmadd::<true>(d, fac, bias)),
            }
            softplus_in_range(xs);
            lane_add::<false>(xs, zl);
        }
        x[n..w].fill(0.0);
        for g in (0..w).step_by(INNER) {
            let at = a_at(r, c0 + g, k_pad);
            // SAFETY: 32 values of `x` from `g` (`w` is a multiple of 32), 64 bytes at each part's
            // `at`, inside `out` (the caller's extents).
            unsafe {
                let (lo, hi) = (_mm512_loadu_ps(x.as_ptr().add(g)), _mm512_loadu_ps(x.as_ptr().add(g + 16)));
                store_parts(lo, hi, [out.add(at), out.add(part + at), out.add(2 * part + at)]);
            }
        }
    }
}

/// Packs `nk` keys (rows of `d`, stride `ld`) as the scores' `B` operand (`Kᵀ`): [`PARTS`] parts of
/// `d_pad / 2 x n_pad` words ([`b_at`]), word `(t, j)` holding dimensions `2t, 2t + 1` of key `j`,
/// zero past the keys and dimensions. `tmp` holds the keys' transpose, `d x n_pad` f32, on the way.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pack_keys(
    isa: crate::cpu::Isa,
    k: &[f32],
    ld: usize,
    nk: usize,
    d: usize,
    n_pad: usize,
    d_pad: usize,
    tmp: &mut [f32],
    out: &mut [f32],
) {
    // `Kᵀ`'s rows, paired as `V`'s are.
    super::pack_transposed_padded(isa, k, ld, nk, d, n_pad, tmp);
    pack_values(tmp, n_pad, d, n_pad, d_pad, n_pad, out);
}

/// Packs `nk` value rows (rows of `d`, stride `ld`) as the value product's `B` operand:
/// [`PARTS`] parts of `nk_pad / 2 x d_pad` words ([`b_at`]), word `(t, c)` holding column `c` of
/// rows `2t` and `2t + 1`, zero past the rows and columns.
pub(crate) fn pack_values(v: &[f32], ld: usize, nk: usize, d: usize, nk_pad: usize, d_pad: usize, out: &mut [f32]) {
    let part = nk_pad / 2 * d_pad;
    assert!(nk_pad.is_multiple_of(32) && d_pad.is_multiple_of(16) && nk <= nk_pad && d <= d_pad);
    assert!(out.len() >= PARTS * part && (nk == 0 || v.len() >= (nk - 1) * ld + d));
    assert!(enabled(), "AMX operands on a CPU or OS without AMX");
    // SAFETY: extents checked above, the ISA present (`enabled` checks AVX-512BW and AVX512-BF16).
    unsafe { pack_values_avx512(v.as_ptr(), ld, nk, d, nk_pad, d_pad, out.as_mut_ptr()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn pack_values_avx512(
    v: *const f32,
    ld: usize,
    nk: usize,
    d: usize,
    nk_pad: usize,
    d_pad: usize,
    out: *mut f32,
) {
    let part = nk_pad / 2 * d_pad;
    // SAFETY (whole body): reads rows < nk, columns < d of `v`; writes inside `out`'s extent.
    unsafe {
        for t in 0..nk_pad / 2 {
            for c in (0..d_pad).step_by(16) {
                let load = |r: usize| load_row(v, ld, (nk, d), r, c);
                let (even, odd) = (parts(load(2 * t)), parts(load(2 * t + 1)));
                for p in 0..PARTS {
                    // The odd row's high half over the even row's, shifted down (low halves are zero).
                    let (e, o) = (_mm512_castps_si512(even[p]), _mm512_castps_si512(odd[p]));
                    let words = _mm512_or_si512(o, _mm512_srli_epi32::<16>(e));
                    _mm512_storeu_si512(out.add(p * part + b_at(t, c, d_pad)).cast(), words);
                }
            }
        }
    }
}

/// Tile configuration: palette 1, tiles 0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = Config {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

macro_rules! tile_load {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(
            concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"),
            p = in(reg) $p,
            s = in(reg) $stride,
            options(nostack, readonly),
        )
    };
}

macro_rules! tile_store {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(
            concat!("tilestored [{p} + {s}*1], tmm", $t),
            p = in(reg) $p,
            s = in(reg) $stride,
            options(nostack),
        )
    };
}

macro_rules! tile_dot {
    ($c:literal, $a:literal, $b:literal) => {
        asm!(concat!("tdpbf16ps tmm", $c, ", tmm", $a, ", tmm", $b), options(nostack, nomem))
    };
}

/// One inner block's six part products, `(A part, B part, load A, load B)` in the order that
/// reuses loaded tiles: 16 tile loads for 24 products of tiles instead of 24.
const STEPS: [(usize, usize, bool, bool); 6] = [
    (0, 2, true, true),
    (0, 1, false, true),
    (0, 0, false, true),
    (1, 0, true, false),
    (2, 0, true, false),
    (1, 1, true, true),
];

/// `C[0..m][0..n] = A · B` over the six part products: `a` an `A` operand of `m_pad =
/// m.next_multiple_of(ROWS)` rows and `k_pad` bf16 columns, `b` a `B` operand of `k_pad / 2` rows
/// and `n` columns (`n` a multiple of [`INNER`]), `c` with row stride `ldc`. Writes rows `< m` and
/// columns `< n` of `C` only.
pub(crate) fn product(a: &[u16], k_pad: usize, b: &[f32], n: usize, m: usize, c: &mut [f32], ldc: usize) {
    product_checked(a, k_pad, b, n, m, c, ldc, false);
}

/// [`product`] added to `C`: `C[0..m][0..n] += A · B`, the part products added to `C`'s values in
/// the tiles (where `product` and an add of its result would round the product once more and pass
/// over `C` twice).
pub(crate) fn product_add(a: &[u16], k_pad: usize, b: &[f32], n: usize, m: usize, c: &mut [f32], ldc: usize) {
    product_checked(a, k_pad, b, n, m, c, ldc, true);
}

#[allow(clippy::too_many_arguments)]
fn product_checked(a: &[u16], k_pad: usize, b: &[f32], n: usize, m: usize, c: &mut [f32], ldc: usize, add: bool) {
    let m_pad = m.next_multiple_of(ROWS);
    assert!(k_pad.is_multiple_of(INNER) && n.is_multiple_of(INNER) && n <= ldc);
    assert!(a.len() >= PARTS * m_pad * k_pad && b.len() >= PARTS * k_pad / 2 * n);
    assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    assert!(enabled(), "AMX products on a CPU or OS without AMX");
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: extents checked above; AMX enabled for this process.
    unsafe { product_amx(a.as_ptr(), m_pad, k_pad, b.as_ptr().cast(), n, m, c.as_mut_ptr(), ldc, add) }
}

/// [`product`] on tiles: blocks of `ROWS x INNER` outputs in 4 tiles (tmm0-3, rows `i`, `i + 16`
/// times columns `j`, `j + 16`), their `A` tiles in tmm4-5 and `B` tiles in tmm6-7; with `add` the
/// output tiles start from `C`'s values instead of zero ([`product_add`]).
#[allow(clippy::too_many_arguments)]
unsafe fn product_amx(
    a: *const u16,
    m_pad: usize,
    k_pad: usize,
    b: *const u32,
    n: usize,
    m: usize,
    c: *mut f32,
    ldc: usize,
    add: bool,
) {
    let (a_part, b_part) = (m_pad * k_pad, k_pad / 2 * n);
    // Tiles are contiguous (rows of 64 bytes); the second row tile of a block is a row of tiles
    // further in `A`, the second column tile the next tile in `B`.
    let (stride, a_next, b_next) = (64usize, a_at(16, 0, k_pad), b_at(0, 16, n));
    // A last row block past `m` goes through this (its rows past `m` are not `C`'s).
    #[repr(C, align(64))]
    struct Spill([f32; ROWS * INNER]);
    let mut spill = Spill([0.0; ROWS * INNER]);
    let spill = spill.0.as_mut_ptr();
    // SAFETY (whole body): tiles stay inside the operands' extents (blocks of ROWS rows of `m_pad`,
    // INNER columns of `n` and of `k_pad`); stores go to rows < m of `c` or to `spill`.
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly));
        for j in (0..n).step_by(INNER) {
            for i in (0..m_pad).step_by(ROWS) {
                let whole = i + ROWS <= m;
                let (out, ld) = if whole { (c.add(i * ldc + j), ldc) } else { (spill, INNER) };
                let s = ld * 4;
                if add {
                    if !whole {
                        std::ptr::write_bytes(spill, 0, ROWS * INNER);
                        for r in 0..m - i {
                            std::ptr::copy_nonoverlapping(c.add((i + r) * ldc + j), spill.add(r * INNER), INNER);
                        }
                    }
                    tile_load!("0", out, s);
                    tile_load!("1", out.add(16), s);
                    tile_load!("2", out.add(16 * ld), s);
                    tile_load!("3", out.add(16 * ld + 16), s);
                } else {
                    asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
                }
                for kc in (0..k_pad).step_by(INNER) {
                    for (pa, pb, load_a, load_b) in STEPS {
                        let at = a.add(pa * a_part + a_at(i, kc, k_pad));
                        let bt = b.add(pb * b_part + b_at(kc / 2, j, n));
                        if load_a {
                            tile_load!("4", at, stride);
                        }
                        if load_b {
                            tile_load!("6", bt, stride);
                        }
                        tile_dot!("0", "4", "6");
                        if load_b {
                            tile_load!("7", bt.add(b_next), stride);
                        }
                        tile_dot!("1", "4", "7");
                        if load_a {
                            tile_load!("5", at.add(a_next), stride);
                        }
                        tile_dot!("2", "5", "6");
                        tile_dot!("3", "5", "7");
                    }
                }
                tile_store!("0", out, s);
                tile_store!("1", out.add(16), s);
                tile_store!("2", out.add(16 * ld), s);
                tile_store!("3", out.add(16 * ld + 16), s);
                if !whole {
                    for r in 0..m - i {
                        std::ptr::copy_nonoverlapping(spill.add(r * INNER), c.add((i + r) * ldc + j), INNER);
                    }
                }
            }
        }
        asm!("tilerelease", options(nostack, nomem));
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Aligned, lcg};
    use super::*;

    #[test]
    fn three_parts_are_bf16_and_sum_to_the_value_exactly() {
        let mut seed = 1;
        for i in 0..100_000 {
            let x = lcg(&mut seed) * 2f32.powi(i % 60 - 30);
            let p = parts_scalar(x);
            assert!(p.iter().all(|p| p.to_bits() & 0xFFFF == 0), "{x}: {p:?}");
            assert_eq!(p[0] + p[1] + p[2], x);
            assert_eq!((p[0] as f64) + (p[1] as f64) + (p[2] as f64), x as f64);
        }
    }

    /// `split_columns` against the scalar parts of the transpose, element by element, at tails in
    /// both directions and several 32-row blocks; the column sums added to what `sums` held.
    #[test]
    fn split_columns_writes_the_transposes_parts_and_adds_its_row_sums() {
        if !enabled() {
            return;
        }
        let mut seed = 3;
        let (k, m, ld) = (77, 45, 50); // `x`: 77 rows of 45; `A = xᵀ`: 45 rows of 77
        let x: Vec<f32> = (0..k * ld).map(|_| lcg(&mut seed)).collect();
        let (m_pad, k_pad) = (64, 96);
        let mut a = vec![0xFFFFu16; PARTS * m_pad * k_pad];
        let mut sums: Vec<f64> = (0..m_pad).map(|r| r as f64).collect();
        split_columns(&x, ld, (k, m), &mut a, (m_pad, k_pad), Some(&mut sums));
        let bf = |p: f32| (p.to_bits() >> 16) as u16;
        for p in 0..PARTS {
            for r in 0..m_pad {
                for c in 0..k_pad {
                    let want = if r < m && c < k { bf(parts_scalar(x[c * ld + r])[p]) } else { 0 };
                    assert_eq!(a[p * m_pad * k_pad + a_at(r, c, k_pad)], want, "A part {p} ({r}, {c})");
                }
            }
        }
        for (r, &got) in sums.iter().enumerate() {
            let col = (0..k).filter(|_| r < m).map(|c| f64::from(x[c * ld + r]));
            let (exact, size) = col.fold((r as f64, r as f64), |(e, s), x| (e + x, s + x.abs()));
            // f32 sums of 32 values: 31 roundings each.
            assert!((got - exact).abs() <= size * 32.0 * 2f64.powi(-24), "row {r}'s sum: {got} vs {exact}");
        }
        // Without sums: the same parts.
        let mut again = vec![0u16; a.len()];
        split_columns(&x, ld, (k, m), &mut again, (m_pad, k_pad), None);
        assert_eq!(again, a);
    }

    /// The vector split and packings against the scalar parts, element by element.
    #[test]
    fn operands_hold_each_values_parts_where_the_tiles_read_them() {
        if !enabled() {
            return;
        }
        let mut seed = 7;
        let (m, k, ld) = (37, 45, 50); // tails in both directions
        let x: Vec<f32> = (0..m * ld).map(|_| lcg(&mut seed)).collect();
        let (m_pad, k_pad) = (64, 64);
        let mut a = vec![0xFFFFu16; PARTS * m_pad * k_pad];
        split_rows(&x, ld, m, k, &mut a, m_pad, k_pad);
        let bf = |p: f32| (p.to_bits() >> 16) as u16;
        let mut seen = vec![false; m_pad * k_pad];
        for p in 0..PARTS {
            for r in 0..m_pad {
                for c in 0..k_pad {
                    let want = if r < m && c < k { bf(parts_scalar(x[r * ld + c])[p]) } else { 0 };
                    assert_eq!(a[p * m_pad * k_pad + a_at(r, c, k_pad)], want, "A part {p} ({r}, {c})");
                    seen[a_at(r, c, k_pad)] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "a_at is not a permutation");
        let (nk, d, n_pad, d_pad) = (m, k, 64, 64);
        let mut tmp = vec![f32::NAN; d * n_pad];
        let mut kt = vec![f32::NAN; PARTS * d_pad / 2 * n_pad];
        pack_keys(crate::cpu::Isa::Avx512, &x, ld, nk, d, n_pad, d_pad, &mut tmp, &mut kt);
        let mut vt = vec![f32::NAN; PARTS * n_pad / 2 * d_pad];
        pack_values(&x, ld, nk, d, n_pad, d_pad, &mut vt);
        let at = |r: usize, c: usize, p: usize| if r < nk && c < d { bf(parts_scalar(x[r * ld + c])[p]) } else { 0 };
        for p in 0..PARTS {
            for t in 0..d_pad / 2 {
                for j in 0..n_pad {
                    let w = kt[p * d_pad / 2 * n_pad + b_at(t, j, n_pad)].to_bits();
                    assert_eq!(
                        (w as u16, (w >> 16) as u16),
                        (at(j, 2 * t, p), at(j, 2 * t + 1, p)),
                        "K part {p} ({t}, {j})"
                    );
                }
            }
            for t in 0..n_pad / 2 {
                for c in 0..d_pad {
                    let w = vt[p * n_pad / 2 * d_pad + b_at(t, c, d_pad)].to_bits();
                    assert_eq!(
                        (w as u16, (w >> 16) as u16),
                        (at(2 * t, c, p), at(2 * t + 1, c, p)),
                        "V part {p} ({t}, {c})"
                    );
                }
            }
        }
    }

    /// The product against f64 sums of the f32 inputs: within `2^-22` of the sum of the terms'
    /// magnitudes (an f32 chain of fused multiply-adds is within `k 2^-24` of it at worst), at
    /// row counts that end inside a row block and on one; rows past `m` untouched. The same for
    /// [`product_add`], `C`'s values among the terms.
    #[test]
    fn product_is_within_f32_accuracy_of_the_exact_sums() {
        if !enabled() {
            return;
        }
        let mut seed = 11;
        for (m, k, n) in [(64usize, 64usize, 128usize), (37, 128, 64), (16, 45, 32), (1, 32, 32), (33, 96, 96)] {
            let (m_pad, k_pad) = (m.next_multiple_of(ROWS), k.next_multiple_of(INNER));
            let x: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed) * 3.0).collect();
            let y: Vec<f32> = (0..k * n).map(|_| lcg(&mut seed)).collect(); // y[t][j]
            let mut a = Aligned::<u16>::new(PARTS * m_pad * k_pad);
            split_rows(&x, k, m, k, &mut a, m_pad, k_pad);
            let mut b = Aligned::<f32>::new(PARTS * k_pad / 2 * n);
            pack_values(&y, n, k, n, k_pad, n, &mut b);
            let ldc = n + 16;
            // `product`, and `product_add` onto values of the products' size.
            let c0: Vec<f32> = (0..m * ldc).map(|_| lcg(&mut seed) * k as f32).collect();
            for add in [false, true] {
                let mut c = vec![f32::NAN; (m + 1) * ldc];
                for i in 0..m {
                    c[i * ldc..i * ldc + n].copy_from_slice(&c0[i * ldc..i * ldc + n]);
                }
                if add {
                    product_add(&a, k_pad, &b, n, m, &mut c, ldc);
                } else {
                    product(&a, k_pad, &b, n, m, &mut c, ldc);
                }
                for i in 0..m {
                    for j in 0..n {
                        let start = if add { c0[i * ldc + j] as f64 } else { 0.0 };
                        let (mut exact, mut size) = (start, start.abs());
                        for t in 0..k {
                            let term = x[i * k + t] as f64 * y[t * n + j] as f64;
                            exact += term;
                            size += term.abs();
                        }
                        let (got, err) = (c[i * ldc + j], (c[i * ldc + j] as f64 - exact).abs());
                        assert!(
                            err <= size * 2f64.powi(-22),
                            "({m}, {k}, {n}), add {add}, [{i}][{j}]: {got} vs {exact}"
                        );
                    }
                    assert!(c[i * ldc + n..(i + 1) * ldc].iter().all(|x| x.is_nan()), "columns past n written");
                }
                assert!(c[m * ldc..].iter().all(|x| x.is_nan()), "rows past m written");
            }
        }
    }
}
