//! The dot products and key norms of short calls against float64 and against each other, on every
//! ISA this CPU has.

use super::*;

fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = attn_core::fixtures::Rng::new(seed);
    (0..n).map(|_| rng.uniform() as f32 * 2.0 - 1.0).collect()
}

/// [`inv_norms_from`] over a group is [`inv_norm_from`] key by key, bit for bit, on every ISA:
/// zero keys (the 1e-12 floor), subnormal and ordinary square sums, and a group with a key above
/// 1e19, whose squares overflow (the f64 path, for that key only).
#[test]
fn inv_norms_of_a_group_are_each_keys_bits() {
    let d = 3;
    let mut keys: Vec<[f32; 3]> = vec![[0.0; 3], [1e-30, 0.0, 0.0], [3.0, 4.0, 0.0], [1e-3, 2e-3, -5e-4]];
    keys.extend((0..29).map(|j| [j as f32 * 0.37 - 4.0, 1.0 / (j as f32 + 1.0), 1e6 * j as f32]));
    for huge in [false, true] {
        if huge {
            keys[7] = [3e19, -4e19, 0.0];
        }
        let k: Vec<f32> = keys.iter().flatten().copied().collect();
        let k2: Vec<f32> = keys.iter().map(|x| x.iter().map(|v| v * v).sum()).collect();
        assert_eq!(k2[7].is_finite(), !huge);
        let want: Vec<f32> = k2.iter().enumerate().map(|(j, &x)| inv_norm_from(x, &k[j * d..j * d + d])).collect();
        assert_eq!(want[0], 1e12, "a zero key's norm is the floor");
        if huge {
            assert!((f64::from(want[7]) - 2e-20).abs() < 1e-26, "the overflowed key from f64: {}", want[7]);
        }
        for isa in Isa::all_supported() {
            crate::multiversion! {
                fn group<const FMA: bool>(_isa: Isa, k2: &mut [f32], k: &[f32], d: usize) {
                    inv_norms_from(k2, k, d, d)
                }
            }
            let mut got = k2.clone();
            group(isa, &mut got, &k, d);
            assert_eq!(
                got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{isa:?}, huge key {huge}"
            );
        }
    }
}

/// Every ISA's dot products and key norms against float64, at head dimensions around the
/// register widths and key counts around the group sizes; and a key's values do not depend on
/// the keys beside it (what lets a short forward and its backward agree bit for bit).
#[test]
fn dots_and_key_norms_match_float64_and_do_not_depend_on_the_group() {
    for isa in Isa::all_supported() {
        for d in [1, 7, 8, 15, 16, 17, 64, 100, 128] {
            let (n, ldk) = (37, d + 3);
            let (q, k) = (data(d, d as u64), data(n * ldk, 7 + d as u64));
            let (mut got, mut norms) = (vec![0.0f32; n], vec![0.0f32; n]);
            crate::multiversion! {
                fn both<const FMA: bool>(isa: Isa, which: Isa, q: &[f32], k: &[f32], ldk: usize, n: usize, d: usize, o: &mut [f32], kn: &mut [f32]) {
                    dots::<FMA>(which, q, k, ldk, n, d, o);
                    key_inv_norms::<FMA>(which, k, ldk, n, d, kn);
                }
            }
            both(isa, isa, &q, &k, ldk, n, d, &mut got, &mut norms);
            // One pass for both: the same dot products, and the squared norms `key_inv_norms` starts from.
            crate::multiversion! {
                fn fused<const FMA: bool>(isa: Isa, which: Isa, q: &[f32], k: &[f32], ldk: usize, n: usize, d: usize, o: &mut [f32], kn: &mut [f32]) {
                    dots_and_sq_norms::<FMA>(which, q, d, 1, k, ldk, n, d, o, n, kn, true);
                    for (j, x) in kn[..n].iter_mut().enumerate() {
                        *x = inv_norm_from(*x, &k[j * ldk..j * ldk + d]);
                    }
                }
            }
            let (mut fd, mut fnorm) = (vec![0.0f32; n], vec![0.0f32; n]);
            fused(isa, isa, &q, &k, ldk, n, d, &mut fd, &mut fnorm);
            assert_eq!(fd, got, "{isa:?} d={d}: dot products in one pass with the norms");
            assert_eq!(fnorm, norms, "{isa:?} d={d}: key norms in one pass with the dot products");
            for j in 0..n {
                let key = &k[j * ldk..j * ldk + d];
                let want: f64 = q.iter().zip(key).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                let scale: f64 = q.iter().zip(key).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
                assert!(
                    (f64::from(got[j]) - want).abs() <= 1e-6 * scale,
                    "{isa:?} d={d} key {j}: {} vs {want}",
                    got[j]
                );
                let n2: f64 = key.iter().map(|&b| f64::from(b) * f64::from(b)).sum();
                let inv = 1.0 / n2.sqrt();
                assert!((f64::from(norms[j]) - inv).abs() <= 1e-6 * inv, "{isa:?} d={d} key {j} norm");
            }
            // Each key alone, and from an offset that shifts the groups: the same bits.
            for j0 in [0, 1, 5, 17] {
                let (mut part, mut pn) = (vec![0.0f32; n - j0], vec![0.0f32; n - j0]);
                both(isa, isa, &q, &k[j0 * ldk..], ldk, n - j0, d, &mut part, &mut pn);
                assert_eq!(part, got[j0..], "{isa:?} d={d}: dots from key {j0}");
                assert_eq!(pn, norms[j0..], "{isa:?} d={d}: norms from key {j0}");
            }
        }
    }
}

/// Several query rows through one pass with the key norms (a grouped-query step's rows): each
/// row's dot products are [`dots`]' bits and the squared norms those of one row's pass, on every
/// ISA, for 1 to 5 rows (beyond [`FUSED_ROWS`] the first rows take [`dots`]), partial key groups
/// and column tails included.
#[test]
fn rows_in_one_pass_with_the_norms_are_each_rows_dots() {
    crate::multiversion! {
        #[allow(clippy::too_many_arguments)]
        fn rows_pass<const FMA: bool>(isa: Isa, which: Isa, q: &[f32], ldq: usize, rows: usize, k: &[f32], ldk: usize, n: usize, d: usize, o: &mut [f32], lds: usize, sq: &mut [f32]) {
            dots_and_sq_norms::<FMA>(which, q, ldq, rows, k, ldk, n, d, o, lds, sq, false);
        }
    }
    crate::multiversion! {
        fn one_row<const FMA: bool>(isa: Isa, which: Isa, q: &[f32], k: &[f32], ldk: usize, n: usize, d: usize, o: &mut [f32], sq: &mut [f32]) {
            dots::<FMA>(which, q, k, ldk, n, d, o);
            row_dots::<FMA, true>(which, q, k, ldk, n, d, sq);
        }
    }
    for isa in Isa::all_supported() {
        for d in [1, 7, 8, 13, 64, 72] {
            for n in [1, 2, 3, 9, 64] {
                let (ldq, ldk, lds) = (d + 5, d + 3, n + 2);
                let (q, k) = (data(5 * ldq, 11 + d as u64), data(n * ldk, 3 + n as u64));
                let mut want_sq = vec![0.0f32; n];
                let mut want = vec![vec![0.0f32; n]; 5];
                for (r, w) in want.iter_mut().enumerate() {
                    one_row(isa, isa, &q[r * ldq..r * ldq + d], &k, ldk, n, d, w, &mut want_sq);
                }
                for rows in 1..=5 {
                    let (mut got, mut sq) = (vec![f32::NAN; rows * lds], vec![f32::NAN; n]);
                    rows_pass(isa, isa, &q, ldq, rows, &k, ldk, n, d, &mut got, lds, &mut sq);
                    for (r, w) in want.iter().enumerate().take(rows) {
                        let row = &got[r * lds..r * lds + n];
                        assert_eq!(
                            row.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            w.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                            "{isa:?} d={d} n={n} rows={rows}: row {r}"
                        );
                        assert!(
                            got[r * lds + n..(r + 1) * lds].iter().all(|x| x.is_nan()),
                            "{isa:?} d={d} n={n} rows={rows}: row {r} wrote past its keys"
                        );
                    }
                    assert_eq!(sq, want_sq, "{isa:?} d={d} n={n} rows={rows}: squared norms");
                }
            }
        }
    }
}
