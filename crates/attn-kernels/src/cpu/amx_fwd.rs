//! The kernels' glue to the AMX products ([`Isa::Amx`](crate::cpu::Isa::Amx), `tile::amx`): a
//! head's keys (and for the forward its values) packed as AMX operands, the value product of a
//! tile's weights; LSSA's row pass, which scales the raw dot products, applies softplus, sums the
//! row and writes the weights straight as the value product's operand, is [`amx::softplus_row`].

use attn_core::{Builtin, Phi, Plan};

use crate::cpu::engine::{Dims, Head};
use crate::cpu::tile::{Aligned, amx};

/// `d` padded for the AMX operands (a multiple of [`amx::INNER`]).
pub(crate) fn padded_d(d: usize) -> usize {
    d.next_multiple_of(amx::INNER)
}

/// Floats of one key tile's keys as the scores' operand ([`amx::pack_keys`]) or its values as the
/// value product's ([`amx::pack_values`]): `PARTS x d_pad / 2 x bk_pad` words either way.
fn tile_len(dims: Dims) -> usize {
    amx::PARTS * padded_d(dims.d) / 2 * dims.bk_pad()
}

/// Floats of one head's AMX operands ([`pack_head`]): every key tile's keys, and with `values` then
/// every key tile's values.
pub(crate) fn packed_len(dims: Dims, values: bool) -> usize {
    dims.t.div_ceil(dims.bk) * tile_len(dims) * if values { 2 } else { 1 }
}

/// Packs every key tile of one head's keys `k` (rows of `d`, stride `ldk`) as the scores' AMX
/// operand, tile after tile, then (given `v`, stride `ldv`) every tile's values as the value
/// product's ([`packed_len`]); `tmp` holds a key tile's transpose on the way (`d x bk_pad`).
pub(crate) fn pack_head(k: (&[f32], usize), v: Option<(&[f32], usize)>, dims: Dims, out: &mut [f32], tmp: &mut [f32]) {
    let (bkp, dp, len, tiles) = (dims.bk_pad(), padded_d(dims.d), tile_len(dims), dims.t.div_ceil(dims.bk));
    let (keys, values) = out.split_at_mut(tiles * len);
    for kt in 0..tiles {
        let (j0, at) = (kt * dims.bk, kt * len..(kt + 1) * len);
        let nk = dims.bk.min(dims.t - j0);
        amx::pack_keys(dims.isa, &k.0[j0 * k.1..], k.1, nk, dims.d, bkp, dp, tmp, &mut keys[at.clone()]);
        if let Some((v, ldv)) = v {
            amx::pack_values(&v[j0 * ldv..], ldv, nk, dims.d, bkp, dp, &mut values[at]);
        }
    }
}

/// Key tile `kt`'s AMX operands in `head.amx`: its keys', and its values' (empty where the head's
/// values are not packed).
pub(super) fn tile<'a>(head: &Head<'a>, dims: Dims, kt: usize) -> (&'a [f32], &'a [f32]) {
    let (len, tiles) = (tile_len(dims), dims.t.div_ceil(dims.bk));
    let values = head.amx.get((tiles + kt) * len..(tiles + kt + 1) * len).unwrap_or(&[]);
    (&head.amx[kt * len..(kt + 1) * len], values)
}

/// `acc[r][..d] += A · V` over key tile `kt` on AMX tiles, `A` the tile's weights: `parts` holds
/// them as the product's operand already (`None`: [`amx::softplus_row`] wrote it), else `a`'s `nq` rows
/// of `nk` weights (row stride `lda`) are split into it first. The tiles add to `acc` where `d` is a
/// multiple of [`amx::INNER`] (`acc`'s rows are then the product's); `stage` takes the product, then
/// added to `acc`, where it is not.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn value_product(
    head: &Head<'_>,
    dims: Dims,
    kt: usize,
    weights: Option<(&[f32], usize)>,
    nq: usize,
    nk: usize,
    (parts, stage): (&mut Aligned<u16>, &mut Aligned<f32>),
    acc: &mut [f32],
) {
    let (d, dp, bkp, rows) = (dims.d, padded_d(dims.d), dims.bk_pad(), nq.next_multiple_of(amx::ROWS));
    if let Some((a, lda)) = weights {
        parts.resize(amx::PARTS * rows * bkp);
        amx::split_rows(a, lda, nq, nk, parts, rows, bkp);
    }
    let values = tile(head, dims, kt).1;
    if d == dp {
        // The accumulators' rows are the product's: the tiles add to them.
        return amx::product_add(parts, bkp, values, dp, nq, acc, d);
    }
    stage.resize(nq * dp);
    amx::product(parts, bkp, values, dp, nq, stage, dp);
    for (acc, st) in acc.chunks_exact_mut(d).zip(stage.chunks_exact(dp)).take(nq) {
        acc.iter_mut().zip(st).for_each(|(a, &x)| *a += x);
    }
}

/// Whether a first sweep under AMX runs [`amx::softplus_row`]: softplus on scores known in range, no
/// running maximum, no re-weighting (whose second sweep reads the activations themselves).
pub(super) fn fuses_softplus(plan: &Plan, head: &Head<'_>, dims: Dims) -> bool {
    !head.amx.is_empty()
        && matches!(plan.phi, Phi::Builtin(Builtin::Softplus))
        && dims.in_range
        && !plan.running_max
        && !plan.signed
        && plan.reweight.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::engine::{Lanes, lane_add};
    use crate::cpu::math::{self, softplus_table};

    /// The fused row ([`amx::softplus_row`]) against separate passes: the scale, the table's
    /// softplus over the slice, `lane_add` and `split_rows`, with scores on both sides of the
    /// table's range, at every visible count of a 256-key row (two chunks, the second maybe with no
    /// visible key; the tails inside a group of 32 and of 16), with and without key scales: the
    /// same parts and lane sums.
    #[test]
    fn softplus_row_is_the_generic_passes_bit_for_bit() {
        if !crate::cpu::Isa::Amx.is_supported() {
            return;
        }
        let k_pad = 256;
        let dots: Vec<f32> = (0..k_pad).map(|c| ((c * 37 % 101) as f32 / 50.0 - 1.0) * 0.9).collect();
        let ink: Vec<f32> = (0..k_pad).map(|c| 0.5 + (c % 7) as f32 / 10.0).collect();
        let (fac, bias) = (30.0, -0.25);
        for vis in [0, 1, 15, 16, 17, 31, 32, 100, 128, 129, 200, 256] {
            for with_ink in [false, true] {
                // As the sweep passes them: the visible keys' scales only.
                let ink = with_ink.then_some(&ink[..vis]);
                let (rows, r) = (32, 3);
                let mut got = vec![0xAAAAu16; amx::PARTS * rows * k_pad];
                let mut zl_got: Lanes = [1.0; 16];
                amx::softplus_row(&dots, vis, (fac, bias), ink, &mut zl_got, &mut got, (r, rows, k_pad));
                // The separate passes.
                let mut f: Vec<f32> = (0..vis)
                    .map(|c| match ink {
                        Some(ink) => math::fmadd::<true>(dots[c] * fac, ink[c], bias),
                        None => math::fmadd::<true>(dots[c], fac, bias),
                    })
                    .collect();
                // SAFETY: AMX implies AVX-512F.
                unsafe { softplus_table::softplus_in_range(&mut f) };
                let mut zl_want: Lanes = [1.0; 16];
                lane_add::<false>(&f, &mut zl_want);
                assert_eq!(zl_got, zl_want, "vis {vis}");
                let mut tile = vec![0.0f32; rows * k_pad];
                tile[r * k_pad..r * k_pad + vis].copy_from_slice(&f);
                let mut want = vec![0u16; amx::PARTS * rows * k_pad];
                amx::split_rows(&tile, k_pad, rows, k_pad, &mut want, rows, k_pad);
                for p in 0..amx::PARTS {
                    for c in 0..k_pad {
                        let at = p * rows * k_pad + amx::a_at(r, c, k_pad);
                        assert_eq!(got[at], want[at], "vis {vis}, ink {with_ink}: part {p}, key {c}");
                    }
                }
            }
        }
    }
}
