//! f32 matrix products `C (+)= A · B` on AMX tiles, at f32 accuracy, for the model's linear layers
//! (gpt-model's `csrc/fused_linear.cpp`) on CPUs that have AMX ([`available`]).
//!
//! Each operand is split into three bf16 parts and the product sums six part products in the tiles'
//! f32 accumulators (`tile::amx`, the forward's products): within `2^-22` of the sum of the terms'
//! magnitudes, where an f32 chain of fused multiply-adds is within `k 2^-24` of it. `B` is packed
//! once ([`pack_b`], chunks of [`KC`] inner indices); `A` is split a block of [`ROW_BLOCK`] rows
//! at a time ([`rows`]), so that a block's parts stay in L2 while every column of `B` passes; a
//! caller runs blocks of rows on as many threads as it likes (each block's rows are one thread's,
//! and a row's result does not depend on the split). On one core of an Intel Xeon (Sapphire
//! Rapids, 2 MiB of L2) at the `small` model's shapes (2048 rows, inner 128 or 512, 128 to 2048
//! columns), splits included: 280-360 GFLOP/s, where MKL's `sgemm` ran at 173-190 (`A B`, `A Bᵀ`)
//! and 102-155 (`Aᵀ B`) (`docs/bench/train-cpu-notes.md`).

use super::Isa;
use super::tile::{self, amx};

/// Inner indices per packed chunk of `B`: a chunk's parts of 128 columns are 384 KiB, and a row
/// block's parts of `A` for it 384 KiB.
pub const KC: usize = 512;
/// Rows of `A` split at a time: 128 rows of 128 inner indices are 96 KiB of parts.
pub const ROW_BLOCK: usize = 128;

/// Whether this CPU and OS run these products (AMX-TILE, AMX-BF16, AVX512-BF16, the tile state
/// granted to the process).
pub fn available() -> bool {
    Isa::Amx.is_supported()
}

fn chunks(k: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..k).step_by(KC).map(move |k0| (k0, KC.min(k - k0)))
}

fn n_pad(n: usize) -> usize {
    n.next_multiple_of(amx::INNER)
}

/// Floats of the chunk of `kc` inner indices in a packed `B` of `n` columns.
fn chunk_len(kc: usize, n: usize) -> usize {
    amx::PARTS * kc.next_multiple_of(amx::INNER) / 2 * n_pad(n)
}

/// Floats [`pack_b`] writes for a `k x n` `B`, and 16 more: the packed operand starts at the first
/// 64-byte boundary of the buffer.
pub fn packed_len(k: usize, n: usize) -> usize {
    chunks(k).map(|(_, kc)| chunk_len(kc, n)).sum::<usize>() + 16
}

/// The 64-byte aligned start of a buffer of [`packed_len`] floats.
fn aligned(buf: &[f32]) -> usize {
    buf.as_ptr().align_offset(64)
}

/// Packs `B` (`k x n`) for [`rows`] into `out` ([`packed_len`] floats): `b` holds `B`'s rows (`k`
/// rows of `n`, stride `ld`), or with `transposed` `Bᵀ`'s (`n` rows of `k`, stride `ld`: a linear
/// layer's weight for `x Wᵀ`). Panics without AMX ([`available`]) or on short buffers.
pub fn pack_b(b: &[f32], ld: usize, k: usize, n: usize, transposed: bool, out: &mut [f32]) {
    assert!(available(), "AMX products on a CPU or OS without AMX");
    assert!(out.len() >= packed_len(k, n), "packed B: {} floats, need {}", out.len(), packed_len(k, n));
    let (start, np) = (aligned(out), n_pad(n));
    let mut at = start;
    let mut tmp = Vec::new();
    for (k0, kc) in chunks(k) {
        let (len, kp) = (chunk_len(kc, n), kc.next_multiple_of(amx::INNER));
        let dst = &mut out[at..at + len];
        if transposed {
            assert!(n == 0 || b.len() >= (n - 1) * ld + k);
            tmp.resize(kc * np, 0.0);
            amx::pack_keys(Isa::Amx, &b[k0..], ld, n, kc, np, kp, &mut tmp, dst);
        } else {
            assert!(k == 0 || b.len() >= (k - 1) * ld + n);
            amx::pack_values(&b[k0 * ld..], ld, kc, n, kp, np, dst);
        }
        at += len;
    }
}

/// A thread's scratch: a row block's parts, a staging block.
struct Scratch {
    parts: tile::Aligned<u16>,
    stage: Vec<f32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> =
        const { std::cell::RefCell::new(Scratch { parts: tile::Aligned::empty(), stage: Vec::new() }) };
}

/// `C[0..m] = A[0..m] · B`, or with `add` `C[0..m] += A[0..m] · B`: `A`'s rows are `a`'s (`m` rows
/// of `k`, stride `lda`), or with `a_transposed` `a`'s columns (`A = Xᵀ` for `X` of `k` rows of
/// `m`, stride `lda`: the weight gradient `dYᵀ X` of a linear layer); `packed` is `B` (`k x n`) from
/// [`pack_b`]; `C`'s rows are `n` floats `ldc` apart. With `row_sums` (`m` floats), also the sums of
/// `A`'s rows (with `dYᵀ X`, the bias's gradient), from the parts' source as it is split: f32 sums
/// of at most 32 values (a lane of 16 over a row's chunk of [`KC`], or 32 rows of `X`'s column),
/// added in f64. Runs on the calling thread, [`ROW_BLOCK`] rows at a time. Panics without AMX
/// ([`available`]) or on short buffers.
#[allow(clippy::too_many_arguments)]
pub fn rows(
    a: &[f32],
    lda: usize,
    a_transposed: bool,
    m: usize,
    k: usize,
    packed: &[f32],
    n: usize,
    c: &mut [f32],
    ldc: usize,
    add: bool,
    mut row_sums: Option<&mut [f32]>,
) {
    assert!(available(), "AMX products on a CPU or OS without AMX");
    assert!(row_sums.as_ref().is_none_or(|s| s.len() >= m));
    assert!(packed.len() >= packed_len(k, n) && n <= ldc);
    assert!(m == 0 || c.len() >= (m - 1) * ldc + n);
    if a_transposed {
        assert!(k == 0 || m == 0 || a.len() >= (k - 1) * lda + m);
    } else {
        assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !add {
            c.chunks_mut(ldc).take(m).for_each(|row| row[..n].fill(0.0));
        }
        row_sums.iter_mut().for_each(|s| s[..m].fill(0.0));
        return;
    }
    let np = n_pad(n);
    let start = aligned(packed);
    SCRATCH.with_borrow_mut(|sc| {
        for i0 in (0..m).step_by(ROW_BLOCK) {
            let mb = ROW_BLOCK.min(m - i0);
            let m_pad = mb.next_multiple_of(amx::ROWS);
            // Columns of `B` padded to 32 go through a staging block (the tiles write 32 at a time).
            let staged = np != n;
            let (out, ld) = if staged {
                sc.stage.resize(mb * np, 0.0);
                for r in 0..mb {
                    let row = &mut sc.stage[r * np..(r + 1) * np];
                    row.fill(0.0);
                    if add {
                        row[..n].copy_from_slice(&c[(i0 + r) * ldc..(i0 + r) * ldc + n]);
                    }
                }
                (&mut sc.stage[..], np)
            } else {
                (&mut c[i0 * ldc..], ldc)
            };
            let mut at = start;
            let mut sums = [0.0f64; ROW_BLOCK];
            for (chunk, (k0, kc)) in chunks(k).enumerate() {
                let kp = kc.next_multiple_of(amx::INNER);
                sc.parts.resize(amx::PARTS * m_pad * kp);
                if a_transposed {
                    let sums = row_sums.is_some().then_some(&mut sums[..m_pad]);
                    amx::split_columns(&a[k0 * lda + i0..], lda, (kc, mb), &mut sc.parts, (m_pad, kp), sums);
                } else {
                    let rows = &a[i0 * lda + k0..];
                    amx::split_rows(rows, lda, mb, kc, &mut sc.parts, m_pad, kp);
                    if row_sums.is_some() {
                        add_row_sums(Isa::Amx, rows, lda, kc, &mut sums[..mb]);
                    }
                }
                let b = &packed[at..at + chunk_len(kc, n)];
                if add || chunk > 0 || staged {
                    amx::product_add(&sc.parts, kp, b, np, mb, out, ld);
                } else {
                    amx::product(&sc.parts, kp, b, np, mb, out, ld);
                }
                at += chunk_len(kc, n);
            }
            if staged {
                for r in 0..mb {
                    c[(i0 + r) * ldc..(i0 + r) * ldc + n].copy_from_slice(&sc.stage[r * np..r * np + n]);
                }
            }
            if let Some(out) = row_sums.as_deref_mut() {
                out[i0..i0 + mb].iter_mut().zip(&sums).for_each(|(o, &s)| *o = s as f32);
            }
        }
    });
}

crate::multiversion! {
    /// `sums[r] += x[r * ld..r * ld + k]`'s sum for every `r < sums.len()`: f32 lanes of 16, then
    /// their sum in f64.
    fn add_row_sums<const FMA: bool>(isa: Isa, x: &[f32], ld: usize, k: usize, sums: &mut [f64]) {
        for (r, s) in sums.iter_mut().enumerate() {
            let row = &x[r * ld..r * ld + k];
            let mut lanes = [0.0f32; 16];
            let mut chunks = row.chunks_exact(16);
            for c in &mut chunks {
                lanes.iter_mut().zip(c).for_each(|(l, &x)| *l += x);
            }
            lanes.iter_mut().zip(chunks.remainder()).for_each(|(l, &x)| *l += x);
            *s += lanes.iter().map(|&l| f64::from(l)).sum::<f64>();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tile::lcg;
    use super::*;

    /// Every form a linear layer needs (`x Wᵀ`, `dY W`, `dYᵀ X`), with and without `add`, at shapes
    /// that cross a row block, a chunk of `B` and a column block, and columns that are no multiple
    /// of 32: within `2^-22` of the terms' magnitudes (the tiles' bound) of f64 sums, `C`'s other
    /// columns untouched; and `A`'s row sums within their lanes' roundings.
    #[test]
    fn every_form_is_within_f32_accuracy_of_the_exact_products() {
        if !available() {
            return;
        }
        let mut seed = 5;
        for (m, k, n) in
            [(130usize, 40usize, 64usize), (33, 600, 48), (1, 32, 32), (200, 1030, 96), (5, 7, 3), (1, 32, 3)]
        {
            for (a_t, b_t) in [(false, false), (false, true), (true, false)] {
                for add in [false, true] {
                    // A[i][t] and B[t][j], stored as the form asks.
                    let av: Vec<f32> = (0..m * k).map(|_| lcg(&mut seed)).collect();
                    let bv: Vec<f32> = (0..k * n).map(|_| lcg(&mut seed)).collect();
                    let (a, lda) = if a_t {
                        ((0..k * m).map(|x| av[(x % m) * k + x / m]).collect::<Vec<_>>(), m)
                    } else {
                        (av.clone(), k)
                    };
                    let (b, ldb) = if b_t {
                        ((0..n * k).map(|x| bv[(x % k) * n + x / k]).collect::<Vec<_>>(), k)
                    } else {
                        (bv.clone(), n)
                    };
                    let mut packed = vec![f32::NAN; packed_len(k, n)];
                    pack_b(&b, ldb, k, n, b_t, &mut packed);
                    let ldc = n + 5;
                    let c0: Vec<f32> = (0..m * ldc).map(|_| lcg(&mut seed)).collect();
                    let mut c = c0.clone();
                    let mut sums = vec![f32::NAN; m];
                    rows(&a, lda, a_t, m, k, &packed, n, &mut c, ldc, add, Some(&mut sums));
                    for (i, &got) in sums.iter().enumerate() {
                        let row = &av[i * k..(i + 1) * k];
                        let (exact, size) =
                            row.iter().fold((0.0f64, 0.0f64), |(e, s), &x| (e + f64::from(x), s + f64::from(x).abs()));
                        // Lanes of f32 over at most `KC` values: `KC / 16` roundings a lane.
                        let bound = size * (KC / 16 + 2) as f64 * 2f64.powi(-24);
                        assert!(
                            (f64::from(got) - exact).abs() <= bound,
                            "({m}, {k}, {n}) row {i}'s sum: {got} vs {exact}"
                        );
                    }
                    for i in 0..m {
                        for j in 0..n {
                            let start = if add { f64::from(c0[i * ldc + j]) } else { 0.0 };
                            let (mut exact, mut size) = (start, start.abs());
                            for t in 0..k {
                                let term = f64::from(av[i * k + t]) * f64::from(bv[t * n + j]);
                                exact += term;
                                size += term.abs();
                            }
                            let got = f64::from(c[i * ldc + j]);
                            let at = format!("({m}, {k}, {n}), A transposed {a_t}, B transposed {b_t}, add {add}");
                            assert!((got - exact).abs() <= size * 2f64.powi(-22), "{at} [{i}][{j}]: {got} vs {exact}");
                        }
                        assert_eq!(c[i * ldc + n..(i + 1) * ldc], c0[i * ldc + n..(i + 1) * ldc], "columns past n");
                    }
                }
            }
        }
    }
}
