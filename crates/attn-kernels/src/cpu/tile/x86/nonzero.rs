//! Re-weighting's value products over each row's nonzero weights only: the lists of a row's
//! nonzero keys, built without branches, and the products over them ([`super`]'s `Lanes`).

use std::arch::x86_64::*;

use super::{Avx2, Avx512, Lanes};

/// Keys a row's list holds at once in [`acc_nonzero`]: a byte each.
const KEYS: usize = 256;

/// The positions of the set bits of each byte, packed one a byte from the lowest (zeros above).
const SET_BITS: [u64; 256] = {
    let mut table = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let (mut packed, mut count, mut bit) = (0u64, 0, 0);
        while bit < 8 {
            if (m >> bit) & 1 == 1 {
                packed |= (bit as u64) << (8 * count);
                count += 1;
            }
            bit += 1;
        }
        table[m] = packed;
        m += 1;
    }
    table
};

/// Writes the positions where any of `rows` (of equal length) is nonzero (NaN included; at most
/// [`KEYS`] entries) to `keys`, a byte each, in order; returns their count. Eight entries at a time
/// without a branch: a compare per row, the masks' union's positions from [`SET_BITS`] stored as
/// one 8-byte word, the count moved on by the mask's bits.
#[inline(always)]
unsafe fn nonzero_keys<const N: usize>(rows: [&[f32]; N], keys: &mut [u8; KEYS + 8]) -> usize {
    let n = rows[0].len();
    debug_assert!(n <= KEYS && rows.iter().all(|r| r.len() == n));
    let (mut len, mut t) = (0, 0);
    // SAFETY: t + 8 <= n entries are read; each 8-byte store starts at len <= t <= KEYS - 8.
    unsafe {
        while t + 8 <= n {
            let mut mask = 0;
            for row in rows {
                let x = _mm256_loadu_ps(row.as_ptr().add(t));
                mask |= _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(x, _mm256_setzero_ps())) as usize;
            }
            let at = SET_BITS[mask] + t as u64 * 0x0101_0101_0101_0101;
            keys.as_mut_ptr().add(len).cast::<u64>().write_unaligned(at);
            len += mask.count_ones() as usize;
            t += 8;
        }
    }
    for t in t..n {
        keys[len] = t as u8;
        len += usize::from(rows.iter().any(|r| r[t] != 0.0));
    }
    len
}

/// `C += A · B` over the nonzero entries of each row of `A` (`a` row-major with row stride `lda`):
/// each row's nonzero keys listed [`KEYS`] at a time, then [`acc_keys`] over them, two rows at once
/// where the ISA holds both rows' accumulators beside its operands ([`Lanes::WIDE`]).
#[inline(always)]
unsafe fn acc_nonzero<L: Lanes>(
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    let mut keys = [[0u8; KEYS + 8]; 2];
    // SAFETY: rows below m, keys below n, columns below k: the dispatcher's extents.
    unsafe {
        let mut i = 0;
        // Pairs of rows on AVX-512: one row at d = 64 is 4 chains, each waiting on the FMA's latency,
        // where two rows are 8. A 64 x 64 tile of weights a third nonzero, values in L1, on an Intel
        // Xeon with AVX-512: 2.30 us a row at a time, 1.93 us in pairs, 2.6 us dense; the one-thread
        // LSSAR forward at T = 4096 from 272-290 to 256-267 ms (`cpu_lab`, three alternations).
        // AVX2's one row already fills 8 chains and most of its 16 registers.
        while L::WIDE && i + 2 <= m {
            for start in (0..n).step_by(KEYS) {
                let w = KEYS.min(n - start);
                let rows: [&[f32]; 2] =
                    std::array::from_fn(|r| std::slice::from_raw_parts(a.add((i + r) * lda + start), w));
                let [k0, k1] = &mut keys;
                let lens = [nonzero_keys([rows[0]], k0), nonzero_keys([rows[1]], k1)];
                acc_keys::<L, 2>(
                    [rows[0].as_ptr(), rows[1].as_ptr()],
                    [&k0[..lens[0]], &k1[..lens[1]]],
                    b.add(start * ldb),
                    ldb,
                    k,
                    [c.add(i * ldc), c.add((i + 1) * ldc)],
                );
            }
            i += 2;
        }
        while i < m {
            for start in (0..n).step_by(KEYS) {
                let row = std::slice::from_raw_parts(a.add(i * lda + start), KEYS.min(n - start));
                let len = nonzero_keys([row], &mut keys[0]);
                if len > 0 {
                    acc_keys::<L, 1>([row.as_ptr()], [&keys[0][..len]], b.add(start * ldb), ldb, k, [c.add(i * ldc)]);
                }
            }
            i += 1;
        }
    }
}

/// `C0 += A0 · B` and `C1 += A1 · B` over the keys where either row of `A0`, `A1` is nonzero: one
/// list a row for both products, each value row loaded once for both (the same sums as two
/// [`acc_nonzero`] calls: a term whose weight is zero adds `+0 · b`). For ISAs whose registers hold
/// both outputs' accumulators beside the values ([`Lanes::WIDE`]).
#[inline(always)]
unsafe fn acc_nonzero_two<L: Lanes>(
    a: [*const f32; 2],
    lda: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: [*mut f32; 2],
    ldc: usize,
) {
    let mut keys = [0u8; KEYS + 8];
    // SAFETY: rows below m, keys below n, columns below k: the dispatcher's extents.
    unsafe {
        for i in 0..m {
            for start in (0..n).step_by(KEYS) {
                let w = KEYS.min(n - start);
                let rows = a.map(|a| std::slice::from_raw_parts(a.add(i * lda + start), w));
                let len = nonzero_keys(rows, &mut keys);
                if len > 0 {
                    let list = &keys[..len];
                    let out = c.map(|c| c.add(i * ldc));
                    acc_keys::<L, 2>(rows.map(<[f32]>::as_ptr), [list, list], b.add(start * ldb), ldb, k, out);
                }
            }
        }
    }
}

/// `C[r][col..col + V W] += sum over t in keys[r] of A[r][t] B[t][col..]` for each of `R` rows, in
/// `R x V` accumulators: all `V W` columns when `FULL`, else the last `k - col < V W` by masked loads
/// and stores. One chain per entry in the order of its row's keys; the rows step through their
/// lists together while both have keys, then each finishes its own.
#[inline(always)]
unsafe fn keys_cols<L: Lanes, const R: usize, const V: usize, const FULL: bool>(
    a: [*const f32; R],
    keys: [&[u8]; R],
    b: *const f32,
    ldb: usize,
    col: usize,
    k: usize,
    c: [*mut f32; R],
) {
    let w: [usize; V] = std::array::from_fn(|q| (k - col).saturating_sub(q * L::W).min(L::W));
    // SAFETY (whole body): every key indexes a row of `a` and `b` inside the checked extents; a
    // partial block touches only the first k - col columns.
    unsafe {
        let ld = |p: *const f32, w: usize| if FULL { L::load(p) } else { L::load_first(p, w) };
        let mut acc: [[L::V; V]; R] =
            std::array::from_fn(|r| std::array::from_fn(|q| ld(c[r].add(col + q * L::W), w[q])));
        let step = |acc: &mut [L::V; V], a: *const f32, t: u8| {
            let t = t as usize;
            let x = L::splat(*a.add(t));
            let row = b.add(t * ldb + col);
            for q in 0..V {
                acc[q] = L::fma(x, ld(row.add(q * L::W), w[q]), acc[q]);
            }
        };
        // Rows over one list (`acc_nonzero_two`'s outputs) load each value row once for all of them.
        let shared = keys.iter().all(|k| std::ptr::eq(*k, keys[0]));
        if R > 1 && shared {
            for &t in keys[0] {
                let t = t as usize;
                let row = b.add(t * ldb + col);
                let vals: [L::V; V] = std::array::from_fn(|q| ld(row.add(q * L::W), w[q]));
                for r in 0..R {
                    let x = L::splat(*a[r].add(t));
                    for q in 0..V {
                        acc[r][q] = L::fma(x, vals[q], acc[r][q]);
                    }
                }
            }
        } else {
            let common = keys.iter().map(|k| k.len()).min().unwrap_or(0);
            for x in 0..common {
                for r in 0..R {
                    step(&mut acc[r], a[r], *keys[r].get_unchecked(x));
                }
            }
            for r in 0..R {
                for &t in &keys[r][common..] {
                    step(&mut acc[r], a[r], t);
                }
            }
        }
        for r in 0..R {
            for q in 0..V {
                let p = c[r].add(col + q * L::W);
                if FULL {
                    L::store(p, acc[r][q]);
                } else {
                    L::store_first(p, w[q], acc[r][q]);
                }
            }
        }
    }
}

/// `C[r] += sum over t in keys[r] of A[r][t] B[t]` for `R` rows over `k` columns: blocks of `8W`
/// columns on AVX2 (8 accumulator chains, what the FMA's latency needs; each key's values loaded
/// once), of `4W` on AVX-512, then `2W` and one masked tail block.
#[inline(always)]
unsafe fn acc_keys<L: Lanes, const R: usize>(
    a: [*const f32; R],
    keys: [&[u8]; R],
    b: *const f32,
    ldb: usize,
    k: usize,
    c: [*mut f32; R],
) {
    // SAFETY: the column blocks split [0, k) exactly.
    unsafe {
        let mut col = 0;
        if !L::WIDE {
            while col + 8 * L::W <= k {
                keys_cols::<L, R, 8, true>(a, keys, b, ldb, col, k, c);
                col += 8 * L::W;
            }
        }
        while col + 4 * L::W <= k {
            keys_cols::<L, R, 4, true>(a, keys, b, ldb, col, k, c);
            col += 4 * L::W;
        }
        while col + 2 * L::W <= k {
            keys_cols::<L, R, 2, true>(a, keys, b, ldb, col, k, c);
            col += 2 * L::W;
        }
        if col < k {
            keys_cols::<L, R, 2, false>(a, keys, b, ldb, col, k, c);
        }
    }
}

#[target_feature(enable = "avx512f")]
pub(in crate::cpu::tile) unsafe fn acc_nonzero_avx512(
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: the dispatcher checked the extents and the ISA.
    unsafe { acc_nonzero::<Avx512>(a, lda, b, ldb, m, n, k, c, ldc) }
}

#[target_feature(enable = "avx512f")]
pub(in crate::cpu::tile) unsafe fn acc_nonzero_two_avx512(
    a: [*const f32; 2],
    lda: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: [*mut f32; 2],
    ldc: usize,
) {
    // SAFETY: the dispatcher checked the extents and the ISA.
    unsafe { acc_nonzero_two::<Avx512>(a, lda, b, ldb, m, n, k, c, ldc) }
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::cpu::tile) unsafe fn acc_nonzero_avx2(
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
) {
    // SAFETY: as above.
    unsafe { acc_nonzero::<Avx2>(a, lda, b, ldb, m, n, k, c, ldc) }
}
