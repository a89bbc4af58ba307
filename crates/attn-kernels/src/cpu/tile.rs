//! Register-tiled f32 micro-kernels for the two small products every attention tile needs:
//! `C = A · Bᵀ` (scores `q·k`, and `g·v` in the backward) and `C += A · B` (`a·v`, `dv`, `dk`, `dq`).
//!
//! They are `#[inline(always)]` and generic over `FMA`, so each ISA instantiation of a kernel task
//! (see `isa.rs`) compiles them with its own vector width: `MR` rows times `NR` columns of
//! accumulators stay in registers while the shared dimension streams through. With `FMA = false`
//! (the scalar fallback) we use `a * b + c`, because `f32::mul_add` without the `fma` target feature
//! is a libm call.
//!
//! Register blocks (tuning notes): `MR = 4, NR = 32` keeps 8 accumulator vectors live on AVX-512
//! (16 on AVX2, which has 16 ymm registers: spills were measured to cost less than halving `NR`
//! because the `k` loop is short). Wider `NR = 64` blocks gave no gain at d = 64 and hurt the tails.

/// Fused multiply-add when the instantiation has FMA, else a plain multiply and add.
#[inline(always)]
pub(crate) fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// Rows per register block.
pub(crate) const MR: usize = 4;
/// Columns per register block; packed operands are padded to a multiple of this.
pub(crate) const NR: usize = 32;

/// Rounds `n` up to a multiple of [`NR`].
#[inline(always)]
pub(crate) const fn pad_nr(n: usize) -> usize {
    n.div_ceil(NR) * NR
}

/// Packs rows `b[0..n]` (each `k` long, row stride `ldb`) transposed into `bt` as a `k x n_pad`
/// row-major matrix with zero padding, for [`matmul_nt`].
#[inline(always)]
pub(crate) fn pack_transposed(b: &[f32], ldb: usize, n: usize, k: usize, bt: &mut [f32]) {
    let n_pad = pad_nr(n);
    debug_assert!(bt.len() >= k * n_pad);
    for j in 0..n {
        let row = &b[j * ldb..j * ldb + k];
        for (c, &x) in row.iter().enumerate() {
            bt[c * n_pad + j] = x;
        }
    }
    for c in 0..k {
        bt[c * n_pad + n..c * n_pad + n_pad].fill(0.0);
    }
}

/// `c[i][j] = sum_t a[i][t] * bt[t][j]` for `i < m`, `j < n_pad`: `a` has row stride `lda`, `bt` is
/// `k x n_pad` (from [`pack_transposed`]), `c` has row stride `ldc >= n_pad`. Overwrites `c`.
#[inline(always)]
pub(crate) fn matmul_nt<const FMA: bool>(
    a: &[f32],
    lda: usize,
    bt: &[f32],
    n_pad: usize,
    k: usize,
    m: usize,
    c: &mut [f32],
    ldc: usize,
) {
    debug_assert!(n_pad % NR == 0);
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
pub(crate) fn matmul_acc<const FMA: bool>(
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
                    let x = a[(i + r) * lda + t];
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
                let x = a[i * lda + t];
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
                let x = a[i * lda + t];
                let brow = &b[t * ldb + k_main..t * ldb + k];
                for (cv, &bv) in crow.iter_mut().zip(brow) {
                    *cv = fmadd::<FMA>(x, bv, *cv);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive_nt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|t| a[i * k + t] as f64 * b[j * k + t] as f64).sum();
            }
        }
        c
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len).map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect()
    }

    #[test]
    fn matmul_nt_matches_naive_on_awkward_sizes() {
        for &(m, n, k) in &[(1, 1, 1), (4, 32, 64), (7, 33, 40), (64, 64, 72), (5, 100, 128), (3, 31, 1)] {
            let a = data(m * k, 1);
            let b = data(n * k, 2);
            let n_pad = pad_nr(n);
            let mut bt = vec![f32::NAN; k * n_pad];
            pack_transposed(&b, k, n, k, &mut bt);
            let mut c = vec![0.0; m * n_pad];
            for fma in [false, true] {
                if fma {
                    matmul_nt::<true>(&a, k, &bt, n_pad, k, m, &mut c, n_pad);
                } else {
                    matmul_nt::<false>(&a, k, &bt, n_pad, k, m, &mut c, n_pad);
                }
                let want = naive_nt(&a, &b, m, n, k);
                for i in 0..m {
                    for j in 0..n {
                        let err = (c[i * n_pad + j] as f64 - want[i * n + j]).abs();
                        assert!(err < 1e-4, "({m},{n},{k}) fma={fma} [{i},{j}] err {err}");
                    }
                    assert!(c[i * n_pad + n..(i + 1) * n_pad].iter().all(|&x| x == 0.0), "padding must be zero");
                }
            }
        }
    }

    #[test]
    fn matmul_acc_matches_naive_on_awkward_sizes() {
        for &(m, n, k) in &[(1, 1, 1), (4, 64, 64), (9, 17, 40), (64, 64, 72), (6, 5, 128), (2, 3, 33)] {
            let a = data(m * n, 3);
            let b = data(n * k, 4);
            let init = data(m * k, 5);
            for fma in [false, true] {
                let mut c = init.clone();
                if fma {
                    matmul_acc::<true>(&a, n, &b, k, m, n, k, &mut c, k);
                } else {
                    matmul_acc::<false>(&a, n, &b, k, m, n, k, &mut c, k);
                }
                for i in 0..m {
                    for col in 0..k {
                        let want: f64 = init[i * k + col] as f64
                            + (0..n).map(|t| a[i * n + t] as f64 * b[t * k + col] as f64).sum::<f64>();
                        let err = (c[i * k + col] as f64 - want).abs();
                        assert!(err < 1e-4, "({m},{n},{k}) fma={fma} [{i},{col}] err {err}");
                    }
                }
            }
        }
    }
}
