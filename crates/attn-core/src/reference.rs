//! The f64 reference forward, backward and weights on (B, H, T, d) arrays: causal, row by row,
//! with analytic gradients (SPEC section 5).

use ndarray::{Array4, ArrayView4, AsArray, Ix4};

use crate::real::Real;
use crate::stage::{L2_NORM_EPS, LAYER_NORM_EPS, OutputNorm, Row, Scores, row_backward, row_forward};
use crate::variant::Variant;
use crate::{Error, Result};

/// Gradients of a scalar loss with respect to `q`, `k`, `v` (same shapes as the inputs).
#[derive(Debug, Clone, PartialEq)]
pub struct Grads<F> {
    /// `dL/dq`, (B, H, T, d).
    pub dq: Array4<F>,
    /// `dL/dk`, (B, H, T, d).
    pub dk: Array4<F>,
    /// `dL/dv`, (B, H, T, d_v).
    pub dv: Array4<F>,
}

/// Sizes shared by the inputs.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    h: usize,
    t: usize,
    d: usize,
    dv: usize,
}

fn dims_of(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// The checks every entry point makes, for kernels that must refuse exactly what the reference
/// refuses (same typed errors, same order): the variant's parameters ([`Variant::validate`]),
/// `T >= 1`, `d >= 1`, `k` of `q`'s shape, `v` of shape (B, H, T, d_v >= 1), `d_out` (if given) of
/// `v`'s shape, and every value finite (`q`, `k`, `v`, then `d_out`).
pub fn check_inputs<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
    d_out: Option<&ArrayView4<'_, F>>,
) -> Result<()> {
    check(variant, q, k, v)?;
    if let Some(g) = d_out {
        check_d_out(v, g)?;
    }
    Ok(())
}

fn check_d_out<F: Real>(v: &ArrayView4<'_, F>, g: &ArrayView4<'_, F>) -> Result<()> {
    if g.shape() != v.shape() {
        return Err(Error::ShapeMismatch {
            arg: "d_out",
            got: g.shape().to_vec(),
            expected: v.shape().to_vec(),
            expected_from: "the output (B, H, T, d_v)",
        });
    }
    check_finite(g, "d_out")
}

/// Check shapes (`k` = `q`; `v` = (B, H, T, any d_v >= 1)), `T >= 1`, `d >= 1`, finiteness and
/// the variant's parameters.
fn check<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
) -> Result<Dims> {
    variant.validate()?;
    let [b, h, t, d] = dims_of(q.shape());
    if t == 0 {
        return Err(Error::EmptyAxis { arg: "q", axis: "T", got: 0, min: 1 });
    }
    if d == 0 {
        return Err(Error::EmptyAxis { arg: "q", axis: "d", got: 0, min: 1 });
    }
    if k.shape() != q.shape() {
        return Err(Error::ShapeMismatch {
            arg: "k",
            got: k.shape().to_vec(),
            expected: q.shape().to_vec(),
            expected_from: "q",
        });
    }
    let vs = dims_of(v.shape());
    if vs[..3] != [b, h, t] {
        return Err(Error::ShapeMismatch {
            arg: "v",
            got: v.shape().to_vec(),
            expected: vec![b, h, t, usize::MAX],
            expected_from: "q (B, H, T; any d_v)",
        });
    }
    if vs[3] == 0 {
        return Err(Error::EmptyAxis { arg: "v", axis: "d", got: 0, min: 1 });
    }
    check_finite(q, "q")?;
    check_finite(k, "k")?;
    check_finite(v, "v")?;
    Ok(Dims { b, h, t, d, dv: vs[3] })
}

fn check_finite<F: Real>(x: &ArrayView4<'_, F>, arg: &'static str) -> Result<()> {
    // Fast path over memory order; the indexed search only runs when something is wrong.
    if x.iter().all(|v| v.is_finite()) {
        return Ok(());
    }
    match x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        Some(((b, h, t, c), v)) => Err(Error::NonFinite { arg, index: [b, h, t, c], value: v.into_f64() }),
        None => Ok(()),
    }
}

/// One head, widened to f64, contiguous row-major, with the (possibly L2-normalised) q', k'.
struct Head {
    /// The sequence length `T` (keys of the whole sequence).
    t: usize,
    d: usize,
    dv: usize,
    /// q' (T * d) and ||q_i|| (T).
    q: Vec<f64>,
    qnorm: Vec<f64>,
    k: Vec<f64>,
    knorm: Vec<f64>,
    /// v (T * d_v).
    v: Vec<f64>,
}

fn widen<F: Real>(x: &ArrayView4<'_, F>, b: usize, h: usize) -> Vec<f64> {
    x.slice(ndarray::s![b, h, .., ..]).iter().map(|v| v.into_f64()).collect()
}

/// `x / max(||x||, 1e-12)` on each row of length `d`, returning the norms.
fn l2_normalise_rows(x: &mut [f64], d: usize) -> Vec<f64> {
    x.chunks_mut(d)
        .map(|row| {
            let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
            let den = norm.max(L2_NORM_EPS);
            for v in row.iter_mut() {
                *v /= den;
            }
            norm
        })
        .collect()
}

impl Head {
    fn new<F: Real>(
        scores: Scores,
        dims: Dims,
        (q, k, v): (&ArrayView4<'_, F>, &ArrayView4<'_, F>, &ArrayView4<'_, F>),
        b: usize,
        h: usize,
    ) -> Head {
        let (mut qw, mut kw) = (widen(q, b, h), widen(k, b, h));
        let (qnorm, knorm) = match scores {
            Scores::Dot => (Vec::new(), Vec::new()),
            Scores::Cosine => (l2_normalise_rows(&mut qw, dims.d), l2_normalise_rows(&mut kw, dims.d)),
        };
        Head { t: dims.t, d: dims.d, dv: dims.dv, q: qw, qnorm, k: kw, knorm, v: widen(v, b, h) }
    }

    fn qi(&self, i: usize) -> &[f64] {
        &self.q[i * self.d..(i + 1) * self.d]
    }
    fn kj(&self, j: usize) -> &[f64] {
        &self.k[j * self.d..(j + 1) * self.d]
    }
    fn vj(&self, j: usize) -> &[f64] {
        &self.v[j * self.dv..(j + 1) * self.dv]
    }

    /// Row `i` (0-based; `N_i = i + 1`): its scale and its scores `s_ij`, `j <= i`.
    fn scores(&self, variant: &Variant, i: usize) -> Result<(f64, Vec<f64>)> {
        let n = i + 1;
        let scale = variant.stage1.scale.value(n, self.d);
        let bias = variant.stage1.bias.value(n)?;
        let qi = self.qi(i);
        let s = (0..n).map(|j| scale * dot(qi, self.kj(j)) + bias).collect();
        Ok((scale, s))
    }

    /// Row `i` of a causal sequence of `T` keys (the length [`Norm::DivLen`](crate::Norm::DivLen)
    /// divides by).
    fn row(&self, variant: &Variant, i: usize, grad: bool) -> Result<(f64, Row)> {
        let (scale, s) = self.scores(variant, i)?;
        Ok((scale, row_forward(&variant.stage1, variant.reweight, &s, self.t, grad)))
    }

    /// `o_i = sum_j w_ij v_j` (before any output norm).
    fn output(&self, w: &[f64]) -> Vec<f64> {
        let mut o = vec![0.0; self.dv];
        for (j, &wj) in w.iter().enumerate() {
            if wj != 0.0 {
                for (oc, vc) in o.iter_mut().zip(self.vj(j)) {
                    *oc += wj * vc;
                }
            }
        }
        o
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Parameter-free layer norm of one row: returns `(x_hat, sigma)`.
fn layer_norm(o: &[f64]) -> (Vec<f64>, f64) {
    let n = o.len() as f64;
    let mean = o.iter().sum::<f64>() / n;
    let var = o.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let sigma = (var + LAYER_NORM_EPS).sqrt();
    (o.iter().map(|x| (x - mean) / sigma).collect(), sigma)
}

/// Causal attention output `y` (B, H, T, d_v) of `variant` (SPEC sections 2-3).
///
/// Inputs may be `f32` or `f64` (anything that is `AsArray`: `&Array4`, `ArrayView4`); the maths
/// runs in `f64` and the result is rounded to `F`. Memory beyond the output is O(T) per row.
/// `v` may have its own head dimension `d_v`.
pub fn forward<'a, F: Real>(
    variant: &Variant,
    q: impl AsArray<'a, F, Ix4>,
    k: impl AsArray<'a, F, Ix4>,
    v: impl AsArray<'a, F, Ix4>,
) -> Result<Array4<F>> {
    let (q, k, v) = (q.into(), k.into(), v.into());
    let dims = check(variant, &q, &k, &v)?;
    let mut out = Array4::<F>::zeros((dims.b, dims.h, dims.t, dims.dv));
    for b in 0..dims.b {
        for h in 0..dims.h {
            let head = Head::new(variant.stage1.scores, dims, (&q, &k, &v), b, h);
            for i in 0..dims.t {
                let (_, row) = head.row(variant, i, false)?;
                let mut o = head.output(row.w());
                if variant.stage1.output_norm == OutputNorm::LayerNorm {
                    o = layer_norm(&o).0;
                }
                for (c, x) in o.into_iter().enumerate() {
                    out[[b, h, i, c]] = F::from_f64(x);
                }
            }
        }
    }
    Ok(out)
}

/// Final attention weights `w` (B, H, T, T) of `variant`; zero above the diagonal. For `relu-ln`
/// these are the weights before the output layer norm.
pub fn weights<'a, F: Real>(
    variant: &Variant,
    q: impl AsArray<'a, F, Ix4>,
    k: impl AsArray<'a, F, Ix4>,
) -> Result<Array4<F>> {
    let (q, k) = (q.into(), k.into());
    // v is not needed: check q and k against themselves as a stand-in.
    let dims = check(variant, &q, &k, &q)?;
    let mut out = Array4::<F>::zeros((dims.b, dims.h, dims.t, dims.t));
    for b in 0..dims.b {
        for h in 0..dims.h {
            let head = Head::new(variant.stage1.scores, dims, (&q, &k, &q), b, h);
            for i in 0..dims.t {
                let (_, row) = head.row(variant, i, false)?;
                for (j, &w) in row.w().iter().enumerate() {
                    out[[b, h, i, j]] = F::from_f64(w);
                }
            }
        }
    }
    Ok(out)
}

/// Analytic gradients of `L = sum(d_out * forward(q, k, v))` with respect to `q`, `k`, `v`
/// (SPEC section 5; every variant, including re-weighting, transforms, the L2-normalisation and
/// layer-norm Jacobians). `d_out` has the output's shape (B, H, T, d_v).
pub fn backward<'a, F: Real>(
    variant: &Variant,
    q: impl AsArray<'a, F, Ix4>,
    k: impl AsArray<'a, F, Ix4>,
    v: impl AsArray<'a, F, Ix4>,
    d_out: impl AsArray<'a, F, Ix4>,
) -> Result<Grads<F>> {
    let (q, k, v, g) = (q.into(), k.into(), v.into(), d_out.into());
    let dims = check(variant, &q, &k, &v)?;
    check_d_out(&v, &g)?;
    let Dims { b: nb, h: nh, t, d, dv } = dims;
    let mut grads = Grads {
        dq: Array4::<F>::zeros((nb, nh, t, d)),
        dk: Array4::<F>::zeros((nb, nh, t, d)),
        dv: Array4::<F>::zeros((nb, nh, t, dv)),
    };
    let stage1 = &variant.stage1;
    for b in 0..nb {
        for h in 0..nh {
            let head = Head::new(stage1.scores, dims, (&q, &k, &v), b, h);
            let gh = widen(&g, b, h); // (T, d_v)
            let mut dq = vec![0.0; t * d]; // dL/dq' (T, d)
            let mut dk = vec![0.0; t * d]; // dL/dk' (T, d)
            let mut dvv = vec![0.0; t * dv]; // (T, d_v)
            for i in 0..t {
                let (scale, row) = head.row(variant, i, true)?;
                let w = row.w();
                let gi = &gh[i * dv..(i + 1) * dv];
                // Through the output layer norm: do = (g - mean g - x_hat mean(g x_hat)) / sigma.
                let go: Vec<f64> = if stage1.output_norm == OutputNorm::LayerNorm {
                    let (xh, sigma) = layer_norm(&head.output(w));
                    let n = dv as f64;
                    let mg = gi.iter().sum::<f64>() / n;
                    let mgx = dot(gi, &xh) / n;
                    gi.iter().zip(&xh).map(|(g, x)| (g - mg - x * mgx) / sigma).collect()
                } else {
                    gi.to_vec()
                };
                // dv_j += w_ij go_i; dw_ij = <go_i, v_j>.
                let mut dw = vec![0.0; i + 1];
                for j in 0..=i {
                    let wj = w[j];
                    for (c, &goc) in go.iter().enumerate() {
                        dvv[j * dv + c] += wj * goc;
                    }
                    dw[j] = dot(&go, head.vj(j));
                }
                let ds = row_backward(stage1, &row, &dw);
                // s_ij = scale_i <q'_i, k'_j> + b_i.
                for (j, &dsj) in ds.iter().enumerate() {
                    if dsj == 0.0 {
                        continue;
                    }
                    let c = scale * dsj;
                    for e in 0..d {
                        dq[i * d + e] += c * head.k[j * d + e];
                        dk[j * d + e] += c * head.q[i * d + e];
                    }
                }
            }
            if stage1.scores == Scores::Cosine {
                l2_backward(&head.q, &head.qnorm, &mut dq, d);
                l2_backward(&head.k, &head.knorm, &mut dk, d);
            }
            for i in 0..t {
                for e in 0..d {
                    grads.dq[[b, h, i, e]] = F::from_f64(dq[i * d + e]);
                    grads.dk[[b, h, i, e]] = F::from_f64(dk[i * d + e]);
                }
                for e in 0..dv {
                    grads.dv[[b, h, i, e]] = F::from_f64(dvv[i * dv + e]);
                }
            }
        }
    }
    Ok(grads)
}

/// Through `x' = x / max(||x||, eps)`: `dx = (dx' - x' <x', dx'>) / ||x||`, or `dx'/eps` when
/// `||x|| <= eps`. `xn` holds x', `dx` holds dx' on entry and dx on exit.
fn l2_backward(xn: &[f64], norms: &[f64], dx: &mut [f64], d: usize) {
    for ((x, g), &norm) in xn.chunks(d).zip(dx.chunks_mut(d)).zip(norms) {
        if norm > L2_NORM_EPS {
            let proj = dot(x, g);
            for (ge, xe) in g.iter_mut().zip(x) {
                *ge = (*ge - xe * proj) / norm;
            }
        } else {
            for ge in g.iter_mut() {
                *ge /= L2_NORM_EPS;
            }
        }
    }
}
