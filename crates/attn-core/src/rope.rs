//! Rotary position embeddings (GPT-NeoX rotate-half pairing) and the NTK-scaled RoPE base.

use ndarray::{Array4, ArrayViewMut4, AsArray, Ix4};

use crate::error::{Error, Result};
use crate::real::Real;

/// NTK-scaled RoPE base for evaluating at `scale = T_test / T_train`:
/// `base * scale^(d / (d - 2))` for `scale > 1`, `base` unchanged for `scale <= 1` **\[choice\]**.
/// For `head_dim <= 2` the exponent is undefined and `base` is returned unchanged (with `d = 2`
/// the only frequency is `base^0 = 1`, so the base does not matter).
pub fn ntk_rope_base(base: f64, head_dim: usize, scale: f64) -> f64 {
    if scale > 1.0 && head_dim > 2 {
        let d = head_dim as f64;
        base * scale.powf(d / (d - 2.0))
    } else {
        base
    }
}

fn check_rope(base: f64, head_dim: usize) -> Result<()> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(Error::OddHeadDim { head_dim });
    }
    if !(base.is_finite() && base > 0.0) {
        return Err(Error::InvalidParameter {
            param: "base",
            value: format!("{base:?}"),
            reason: "the RoPE base must be finite and > 0",
        });
    }
    Ok(())
}

/// `inv_freq_c = base^(-2c/d)` for `c = 0 .. d/2`. Errors on odd or zero `d`, or a bad base.
pub fn rope_inv_freq(base: f64, head_dim: usize) -> Result<Vec<f64>> {
    check_rope(base, head_dim)?;
    let d = head_dim as f64;
    Ok((0..head_dim / 2).map(|c| base.powf(-2.0 * c as f64 / d)).collect())
}

/// Rotate one vector of length `d` at absolute position `pos`, in place, rotate-half pairing:
/// for `c < d/2`, with `theta = pos * inv_freq_c`,
/// `x'_c = x_c cos theta - x_{c+d/2} sin theta`, `x'_{c+d/2} = x_{c+d/2} cos theta + x_c sin theta`.
/// `inv_freq` comes from [`rope_inv_freq`]; its length must be `x.len() / 2`.
pub fn rope_rotate(x: &mut [f64], pos: usize, inv_freq: &[f64]) -> Result<()> {
    let half = inv_freq.len();
    if x.len() != 2 * half {
        return Err(Error::ShapeMismatch {
            arg: "x",
            got: vec![x.len()],
            expected: vec![2 * half],
            expected_from: "inv_freq (d / 2 frequencies)",
        });
    }
    let (lo, hi) = x.split_at_mut(half);
    for ((a, b), &f) in lo.iter_mut().zip(hi.iter_mut()).zip(inv_freq) {
        let (sin, cos) = (pos as f64 * f).sin_cos();
        let (x1, x2) = (*a, *b);
        *a = x1 * cos - x2 * sin;
        *b = x2 * cos + x1 * sin;
    }
    Ok(())
}

/// RoPE on a (B, H, T, d) array: token `t` sits at position `position_offset + t`. Computed in
/// `f64`. Errors on odd or zero `d`, or a base that is not finite and positive.
pub fn rope_apply<'a, F: Real>(x: impl AsArray<'a, F, Ix4>, base: f64, position_offset: usize) -> Result<Array4<F>> {
    let mut out = x.into().to_owned();
    rope_apply_in_place(out.view_mut(), base, position_offset)?;
    Ok(out)
}

/// [`rope_apply`] in place.
pub fn rope_apply_in_place<F: Real>(mut x: ArrayViewMut4<'_, F>, base: f64, position_offset: usize) -> Result<()> {
    let d = x.shape()[3];
    let inv_freq = rope_inv_freq(base, d)?;
    let mut buf = vec![0.0; d];
    for mut batch in x.outer_iter_mut() {
        for mut head in batch.outer_iter_mut() {
            for (t, mut row) in head.outer_iter_mut().enumerate() {
                for (o, v) in buf.iter_mut().zip(row.iter()) {
                    *o = v.into_f64();
                }
                rope_rotate(&mut buf, position_offset + t, &inv_freq)?;
                for (o, v) in row.iter_mut().zip(&buf) {
                    *o = F::from_f64(*v);
                }
            }
        }
    }
    Ok(())
}
