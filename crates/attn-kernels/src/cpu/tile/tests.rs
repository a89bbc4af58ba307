//! The micro-kernels against naive products, on every ISA this CPU has.

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
    for &(m, n, k) in
        &[(1, 1, 1), (4, 32, 64), (7, 33, 40), (64, 64, 72), (5, 100, 128), (3, 31, 1), (9, 64, 64), (17, 5, 8)]
    {
        let a = data(m * k, 1);
        let b = data(n * k, 2);
        let n_pad = pad_nr(n);
        let mut bt = vec![f32::NAN; k * n_pad];
        pack_transposed(&b, k, n, k, &mut bt);
        let mut c = vec![0.0; m * n_pad];
        for isa in Isa::all_supported() {
            let fma = isa != Isa::Scalar;
            if fma {
                matmul_nt::<true>(isa, &a, k, &bt, n_pad, k, m, &mut c, n_pad);
            } else {
                matmul_nt::<false>(isa, &a, k, &bt, n_pad, k, m, &mut c, n_pad);
            }
            let want = naive_nt(&a, &b, m, n, k);
            for i in 0..m {
                for j in 0..n {
                    let err = (c[i * n_pad + j] as f64 - want[i * n + j]).abs();
                    assert!(err < 1e-4, "({m},{n},{k}) {isa} [{i},{j}] err {err}");
                }
                assert!(c[i * n_pad + n..(i + 1) * n_pad].iter().all(|&x| x == 0.0), "padding must be zero");
            }
        }
    }
}

#[test]
fn matmul_tn_acc_matches_naive() {
    for &(m, n, k) in &[(1, 1, 1), (64, 64, 64), (9, 17, 40), (13, 5, 72), (6, 4, 27)] {
        let at = data(n * m, 6); // A^T, n x m
        let b = data(n * k, 7);
        let init = data(m * k, 8);
        for isa in Isa::all_supported() {
            let mut c = init.clone();
            if isa == Isa::Scalar {
                matmul_tn_acc::<false>(isa, &at, m, &b, k, m, n, k, &mut c, k);
            } else {
                matmul_tn_acc::<true>(isa, &at, m, &b, k, m, n, k, &mut c, k);
            }
            for i in 0..m {
                for col in 0..k {
                    let want: f64 = init[i * k + col] as f64
                        + (0..n).map(|t| at[t * m + i] as f64 * b[t * k + col] as f64).sum::<f64>();
                    assert!((c[i * k + col] as f64 - want).abs() < 1e-4, "({m},{n},{k}) {isa}");
                }
            }
        }
    }
}

#[test]
fn matmul_acc_matches_naive_on_awkward_sizes() {
    for &(m, n, k) in &[
        (1, 1, 1),
        (4, 64, 64),
        (9, 17, 40),
        (64, 64, 72),
        (6, 5, 128),
        (2, 3, 33),
        (17, 24, 100),
        (8, 8, 16),
        (5, 7, 13),
        (9, 3, 27),
        // One row alone (`acc_row`), an odd key count, one or more whole 4W-column blocks.
        (1, 5, 64),
        (9, 9, 136),
    ] {
        // C's rows are k wide in rows of ldc > k: the gap (after the last row too) holds a
        // sentinel that no write may touch, so masked tails that spill show up.
        let ldc = k + 5;
        let a = data(m * n, 3);
        let b = data(n * k, 4);
        let init: Vec<f32> =
            data(m * ldc, 5).iter().enumerate().map(|(x, &v)| if x % ldc < k { v } else { 7.5 }).collect();
        for isa in Isa::all_supported() {
            let fma = isa != Isa::Scalar;
            let mut c = init.clone();
            if fma {
                matmul_acc::<true>(isa, &a, n, &b, k, m, n, k, &mut c, ldc);
            } else {
                matmul_acc::<false>(isa, &a, n, &b, k, m, n, k, &mut c, ldc);
            }
            for i in 0..m {
                for col in 0..k {
                    let want: f64 = init[i * ldc + col] as f64
                        + (0..n).map(|t| a[i * n + t] as f64 * b[t * k + col] as f64).sum::<f64>();
                    let err = (c[i * ldc + col] as f64 - want).abs();
                    assert!(err < 1e-4, "({m},{n},{k}) {isa} [{i},{col}] err {err}");
                }
                assert!(c[i * ldc + k..(i + 1) * ldc].iter().all(|&x| x == 7.5), "({m},{n},{k}) {isa}: wrote past k");
            }
        }
    }
}

/// The register blocks (their rows and column widths differ by ISA: `6 x 64` on AVX-512, `4 x 16`
/// on AVX2) may not change any result: every entry is one chain of fused multiply-adds over `t` in
/// order, exactly what the portable kernels compute with `FMA`, so a change of block shape leaves a
/// trained model's numbers the same to the bit. The one exception is `C += A B`'s single-row tail
/// (`acc_row`, an odd `m`'s last row), which adds two keys' partial sums at the end.
#[test]
fn micro_kernels_sum_in_the_portable_order_bit_for_bit() {
    for &(m, n, k) in &[(64, 64, 64), (6, 64, 64), (10, 64, 64), (12, 33, 72), (4, 17, 128), (7, 64, 96), (13, 5, 40)] {
        let a = data(m * k, 11);
        let b = data(n * k, 12);
        let n_pad = pad_nr(n);
        let mut bt = vec![0.0; k * n_pad];
        pack_transposed(&b, k, n, k, &mut bt);
        let mut want = vec![0.0; m * n_pad];
        portable_nt::<true>(&a, k, &bt, n_pad, k, m, &mut want, n_pad);
        // C += A B with A m x n (the scores) and B n x k (the values).
        let (p, v) = (data(m * n, 13), data(n * k, 14));
        let init = data(m * k, 15);
        let mut want_acc = init.clone();
        portable_acc::<true>(&p, n, 1, &v, k, m, n, k, &mut want_acc, k);
        let exact_rows = if m % 2 == 1 { m - 1 } else { m };
        for isa in Isa::all_supported().into_iter().filter(|&isa| isa != Isa::Scalar) {
            let mut c = vec![f32::NAN; m * n_pad];
            matmul_nt::<true>(isa, &a, k, &bt, n_pad, k, m, &mut c, n_pad);
            let differ = c.iter().zip(&want).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(differ, 0, "A Bt ({m},{n},{k}) {isa}: {differ} entries differ from the portable order");
            let mut c = init.clone();
            matmul_acc::<true>(isa, &p, n, &v, k, m, n, k, &mut c, k);
            let rows = exact_rows * k;
            let differ = c[..rows].iter().zip(&want_acc[..rows]).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            assert_eq!(differ, 0, "A B ({m},{n},{k}) {isa}: {differ} entries differ from the portable order");
        }
    }
}

#[test]
fn matmul_acc_nonzero_is_one_chain_over_the_nonzero_terms() {
    // Rows with no, some, most and all entries zero; rows longer than one list of keys (256); column
    // counts that take every block width and a masked tail. Each entry must be exactly one chain of
    // multiply-adds over its nonzero terms in order (what the dense kernel's blocks of rows compute),
    // and near the naive product.
    for &(m, n, k) in &[(1, 1, 1), (64, 64, 64), (5, 300, 72), (3, 17, 27), (7, 64, 40), (2, 513, 8), (300, 6, 16)] {
        let mut a = data(m * n, 11);
        for (i, x) in a.iter_mut().enumerate() {
            let (row, col) = (i / n, i % n);
            if row % 4 == 1 || (row % 4 != 3 && (col * 7 + row) % (row % 4 + 2) != 0) {
                *x = 0.0;
            }
        }
        let b = data(n * k, 12);
        let init = data(m * k, 13);
        for isa in Isa::all_supported() {
            let fma = isa != Isa::Scalar;
            let mut got = init.clone();
            if fma {
                matmul_acc_nonzero::<true>(isa, &a, n, &b, k, m, n, k, &mut got, k);
            } else {
                matmul_acc_nonzero::<false>(isa, &a, n, &b, k, m, n, k, &mut got, k);
            }
            for i in 0..m {
                for col in 0..k {
                    let (mut chain, mut naive) = (init[i * k + col], init[i * k + col] as f64);
                    for t in 0..n {
                        let (x, y) = (a[i * n + t], b[t * k + col]);
                        naive += x as f64 * y as f64;
                        if x != 0.0 {
                            chain = if fma { x.mul_add(y, chain) } else { x * y + chain };
                        }
                    }
                    let v = got[i * k + col];
                    assert_eq!(v.to_bits(), chain.to_bits(), "({m},{n},{k}) {isa} [{i},{col}]: {v} against {chain}");
                    assert!((v as f64 - naive).abs() < 1e-4, "({m},{n},{k}) {isa} [{i},{col}]: {v} against {naive}");
                }
            }
        }
    }
}

/// Two weight matrices against one value matrix: the same values as two `matmul_acc_nonzero`
/// calls (one list of keys for both on AVX-512, where a term of zero weight adds `+0 · b`), with
/// the rows' nonzero patterns different, nested, or disjoint.
#[test]
fn matmul_acc_nonzero_two_equals_two_single_products() {
    for &(m, n, k) in &[(1, 1, 1), (64, 128, 64), (5, 300, 72), (3, 17, 27), (7, 64, 40), (2, 513, 8)] {
        let mut a0 = data(m * n, 21);
        let mut a1 = data(m * n, 22);
        for i in 0..m * n {
            let (row, col) = (i / n, i % n);
            // a0: nonzero on every third key; a1: a superset (every key with col % 3 != 2), a
            // disjoint set, or nothing, by row.
            if col % 3 != 0 {
                a0[i] = 0.0;
            }
            let keep1 = match row % 3 {
                0 => col % 3 != 2,
                1 => col % 3 == 1,
                _ => false,
            };
            if !keep1 {
                a1[i] = 0.0;
            }
        }
        let b = data(n * k, 23);
        let (i0, i1) = (data(m * k, 24), data(m * k, 25));
        for isa in Isa::all_supported() {
            let fma = isa != Isa::Scalar;
            let (mut want0, mut want1, mut got0, mut got1) = (i0.clone(), i1.clone(), i0.clone(), i1.clone());
            if fma {
                matmul_acc_nonzero::<true>(isa, &a0, n, &b, k, m, n, k, &mut want0, k);
                matmul_acc_nonzero::<true>(isa, &a1, n, &b, k, m, n, k, &mut want1, k);
                matmul_acc_nonzero_two::<true>(isa, [&a0, &a1], n, &b, k, m, n, k, [&mut got0, &mut got1], k);
            } else {
                matmul_acc_nonzero::<false>(isa, &a0, n, &b, k, m, n, k, &mut want0, k);
                matmul_acc_nonzero::<false>(isa, &a1, n, &b, k, m, n, k, &mut want1, k);
                matmul_acc_nonzero_two::<false>(isa, [&a0, &a1], n, &b, k, m, n, k, [&mut got0, &mut got1], k);
            }
            for (got, want, which) in [(&got0, &want0, 0), (&got1, &want1, 1)] {
                for (x, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    assert!(g == w, "({m},{n},{k}) {isa} output {which} [{x}]: {g} against {w}");
                }
            }
        }
    }
}

/// The scaled product equals the product followed by the scalar scaling pass, bit for bit, on every
/// ISA, for cosine and dot scores: row counts around the 6- and 4-row blocks, panels of 2W and 4W.
#[test]
fn matmul_nt_scaled_is_the_product_then_the_scaling_bit_for_bit() {
    for &(m, n_pad, k) in &[(1, NR, 1), (6, 64, 64), (7, 128, 64), (13, 5 * NR, 40), (64, 128, 64), (3, 3 * NR, 17)] {
        let a = data(m * k, 31);
        let bt = data(k * n_pad, 32);
        let (row, cols, bias) = (data(m, 33), data(n_pad, 34), data(m, 35));
        for col in [Some(&cols[..]), None] {
            for isa in Isa::all_supported() {
                let fma = isa != Isa::Scalar;
                let (mut want, mut got) = (vec![f32::NAN; m * n_pad], vec![f32::NAN; m * n_pad]);
                if fma {
                    matmul_nt::<true>(isa, &a, k, &bt, n_pad, k, m, &mut want, n_pad);
                    matmul_nt_scaled::<true>(isa, &a, k, &bt, n_pad, k, m, &mut got, n_pad, (&row, col, &bias));
                } else {
                    matmul_nt::<false>(isa, &a, k, &bt, n_pad, k, m, &mut want, n_pad);
                    matmul_nt_scaled::<false>(isa, &a, k, &bt, n_pad, k, m, &mut got, n_pad, (&row, col, &bias));
                }
                for (x, (g, w)) in got.iter().zip(&want).enumerate() {
                    let (r, j) = (x / n_pad, x % n_pad);
                    let w = match (col, fma) {
                        (Some(col), true) => fmadd::<true>(*w * row[r], col[j], bias[r]),
                        (Some(col), false) => *w * row[r] * col[j] + bias[r],
                        (None, true) => fmadd::<true>(*w, row[r], bias[r]),
                        (None, false) => *w * row[r] + bias[r],
                    };
                    assert_eq!(g.to_bits(), w.to_bits(), "({m},{n_pad},{k}) {isa} {} [{r},{j}]", col.is_some());
                }
            }
        }
    }
}

#[test]
fn packing_transposes_every_entry_and_zeroes_the_padding_on_every_isa() {
    // Sizes around the 8 x 8 blocks of the AVX2 transpose, a row stride wider than a row, and a
    // destination full of NaN, so an entry left unwritten shows.
    for &(n, k) in &[(1, 1), (7, 8), (8, 8), (9, 13), (63, 64), (64, 64), (70, 65), (33, 3)] {
        let ldb = k + 5;
        let b = data(n * ldb, 3);
        let n_pad = pad_nr(n);
        for isa in Isa::all_supported() {
            let mut bt = vec![f32::NAN; k * n_pad];
            pack_transposed_padded(isa, &b, ldb, n, k, n_pad, &mut bt);
            for c in 0..k {
                for j in 0..n_pad {
                    let want = if j < n { b[j * ldb + c] } else { 0.0 };
                    let got = bt[c * n_pad + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "{isa:?}, n = {n}, k = {k}: entry ({c}, {j})");
                }
            }
        }
    }
}
