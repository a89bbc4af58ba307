//! The f64 reference forward, backward and weights on (B, H, T, d) arrays: causal, row by row,
//! with analytic gradients (SPEC section 5).

use ndarray::{Array4, ArrayView4, AsArray, Ix4};

use crate::error::{Error, Result};
use crate::real::Real;
use crate::stage::{L2_NORM_EPS, LAYER_NORM_EPS, OutputNorm, Row, Scores, row_backward, row_forward};
use crate::variant::Variant;

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

/// Sizes shared by the inputs: `q` (B, H, T_q, d), `k` (B, H_kv, T_k, d), `v` (B, H_kv, T_k, d_v).
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    h: usize,
    /// Key and value heads; query head `h` reads key head `h / (H / H_kv)` (grouped-query attention).
    h_kv: usize,
    /// Query rows: the last `T_q` rows of the `T_k`-long causal sequence.
    t_q: usize,
    /// Keys (the sequence so far).
    t: usize,
    d: usize,
    dv: usize,
}

impl Dims {
    /// The key head of query head `h`.
    fn kv_head(&self, h: usize) -> usize {
        h / (self.h / self.h_kv)
    }
}

fn dims_of(shape: &[usize]) -> [usize; 4] {
    [shape[0], shape[1], shape[2], shape[3]]
}

/// The checks of a kernel that takes whole sequences with one key head per query head, for kernels
/// that must refuse exactly what the reference refuses there (same typed errors, same order): the
/// variant's parameters ([`Variant::validate`]), `T >= 1`, `d >= 1`, `k` of `q`'s shape, `v` of shape
/// (B, H, T, d_v >= 1), `d_out` (if given) of the output's shape, and every value finite (`q`, `k`,
/// `v`, then `d_out`). [`forward`] and [`backward`] take more: queries that continue a sequence and
/// grouped-query attention ([`check_inputs_cached`]).
pub fn check_inputs<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
    d_out: Option<&ArrayView4<'_, F>>,
) -> Result<()> {
    variant.validate()?;
    if k.shape() != q.shape() && !q.shape().contains(&0) {
        return Err(Error::ShapeMismatch {
            arg: "k",
            got: k.shape().to_vec(),
            expected: q.shape().to_vec(),
            expected_from: "q",
        });
    }
    check_inputs_cached(variant, q, k, v, d_out)
}

/// The checks of [`forward`] and [`backward`]: the variant's parameters, `T_q >= 1`, `d >= 1`; `k` of
/// shape (B, H_kv, T_k, d) with `H` a multiple of `H_kv` and `T_k >= T_q` (the queries are the last
/// `T_q` rows of the `T_k`-long sequence); `v` of shape (B, H_kv, T_k, d_v >= 1); `d_out` (if given)
/// of the output's shape (B, H, T_q, d_v); every value finite (`q`, `k`, `v`, then `d_out`).
pub fn check_inputs_cached<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
    d_out: Option<&ArrayView4<'_, F>>,
) -> Result<()> {
    check_cached(variant, q, k, v, d_out, true)
}

/// [`check_inputs_cached`] less its scan of every value for finiteness: for a caller that scans the
/// values itself ([`all_finite`]; the fused CPU kernels, on all their threads) and, where one is not
/// finite, calls [`check_inputs_cached`] for the error (in its order: an earlier shape error first).
pub fn check_shapes_cached<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
    d_out: Option<&ArrayView4<'_, F>>,
) -> Result<()> {
    check_cached(variant, q, k, v, d_out, false)
}

/// [`check_inputs_cached`], the values' finiteness where `values`.
fn check_cached<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
    d_out: Option<&ArrayView4<'_, F>>,
    values: bool,
) -> Result<()> {
    let dims = if values { check(variant, q, k, v)? } else { check_shapes(variant, q, k, v)? };
    if let Some(g) = d_out {
        check_d_out_shape(dims, g)?;
        if values {
            check_finite(g, "d_out")?;
        }
    }
    Ok(())
}

fn check_d_out<F: Real>(dims: Dims, g: &ArrayView4<'_, F>) -> Result<()> {
    check_d_out_shape(dims, g)?;
    check_finite(g, "d_out")
}

fn check_d_out_shape<F: Real>(dims: Dims, g: &ArrayView4<'_, F>) -> Result<()> {
    let expected = [dims.b, dims.h, dims.t_q, dims.dv];
    if g.shape() != expected {
        return Err(Error::ShapeMismatch {
            arg: "d_out",
            got: g.shape().to_vec(),
            expected: expected.to_vec(),
            expected_from: "the output (B, H, T_q, d_v)",
        });
    }
    Ok(())
}

/// Check shapes (see [`check_inputs_cached`]), finiteness and the variant's parameters.
fn check<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
) -> Result<Dims> {
    let dims = check_shapes(variant, q, k, v)?;
    check_finite(q, "q")?;
    check_finite(k, "k")?;
    check_finite(v, "v")?;
    Ok(dims)
}

/// [`check`] less the finiteness.
fn check_shapes<F: Real>(
    variant: &Variant,
    q: &ArrayView4<'_, F>,
    k: &ArrayView4<'_, F>,
    v: &ArrayView4<'_, F>,
) -> Result<Dims> {
    variant.validate()?;
    let [b, h, t_q, d] = dims_of(q.shape());
    if t_q == 0 {
        return Err(Error::EmptyAxis { arg: "q", axis: "T", got: 0, min: 1 });
    }
    if d == 0 {
        return Err(Error::EmptyAxis { arg: "q", axis: "d", got: 0, min: 1 });
    }
    let [kb, h_kv, t, kd] = dims_of(k.shape());
    let groups_fit = if h_kv == 0 { h == 0 } else { h % h_kv == 0 };
    if kb != b || kd != d || !groups_fit || t < t_q {
        return Err(Error::ShapeMismatch {
            arg: "k",
            got: k.shape().to_vec(),
            expected: vec![b, h_kv.max(1), t.max(t_q), d],
            expected_from: "q: k is (B, H_kv, T_k, d) with H a multiple of H_kv and T_k >= T_q (q holds the last T_q rows of the T_k-long sequence)",
        });
    }
    let vs = dims_of(v.shape());
    if vs[..3] != [b, h_kv, t] {
        return Err(Error::ShapeMismatch {
            arg: "v",
            got: v.shape().to_vec(),
            expected: vec![b, h_kv, t, usize::MAX],
            expected_from: "k (B, H_kv, T_k; any d_v)",
        });
    }
    if vs[3] == 0 {
        return Err(Error::EmptyAxis { arg: "v", axis: "d", got: 0, min: 1 });
    }
    Ok(Dims { b, h, h_kv, t_q, t, d, dv: vs[3] })
}

/// Whether every value of `x` is finite: over memory order where `x` is one block of memory, in
/// chunks tested without an early exit (a plain `all` tests one value at a time; the fold compiles to
/// vector compares).
pub fn all_finite<F: Real>(x: &ArrayView4<'_, F>) -> bool {
    match x.as_slice_memory_order() {
        Some(s) => all_finite_slice(s),
        None => x.iter().all(|v| v.is_finite()),
    }
}

/// [`all_finite`] of a slice.
pub fn all_finite_slice<F: Real>(s: &[F]) -> bool {
    s.chunks(1024).all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()))
}

fn check_finite<F: Real>(x: &ArrayView4<'_, F>, arg: &'static str) -> Result<()> {
    if all_finite(x) {
        return Ok(());
    }
    match x.indexed_iter().find(|(_, v)| !v.is_finite()) {
        Some(((b, h, t, c), v)) => Err(Error::NonFinite { arg, index: [b, h, t, c], value: v.into_f64() }),
        None => Ok(()),
    }
}

/// One head, widened to f64, contiguous row-major, with the (possibly L2-normalised) q', k'.
struct Head {
    /// The sequence length `T_k` (keys of the whole sequence).
    t: usize,
    /// `T_k - T_q`: query row `r` is row `offset + r` of the sequence.
    offset: usize,
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
    /// Query head `h` of batch `b` with its key head (grouped-query attention).
    fn new<F: Real>(
        scores: Scores,
        dims: Dims,
        (q, k, v): (&ArrayView4<'_, F>, &ArrayView4<'_, F>, &ArrayView4<'_, F>),
        b: usize,
        h: usize,
    ) -> Head {
        let hk = dims.kv_head(h);
        let (mut qw, mut kw) = (widen(q, b, h), widen(k, b, hk));
        let (qnorm, knorm) = match scores {
            Scores::Dot => (Vec::new(), Vec::new()),
            Scores::Cosine => (l2_normalise_rows(&mut qw, dims.d), l2_normalise_rows(&mut kw, dims.d)),
        };
        let offset = dims.t - dims.t_q;
        Head { t: dims.t, offset, d: dims.d, dv: dims.dv, q: qw, qnorm, k: kw, knorm, v: widen(v, b, hk) }
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

    /// Query row `r`, row `i = offset + r` of the sequence (0-based; `N_i = i + 1`): its scale and its
    /// scores `s_ij`, `j <= i`.
    fn scores(&self, variant: &Variant, r: usize) -> Result<(f64, Vec<f64>)> {
        let n = self.offset + r + 1;
        let scale = variant.stage1().scale.value(n, self.d);
        let bias = variant.stage1().bias.value(n)?;
        let qi = self.qi(r);
        let s = (0..n).map(|j| scale * dot(qi, self.kj(j)) + bias).collect();
        Ok((scale, s))
    }

    /// Query row `i` of a causal sequence of `T_k` keys (the length
    /// [`Norm::DivLen`](crate::Norm::DivLen) divides by).
    fn row(&self, variant: &Variant, i: usize, grad: bool) -> Result<(f64, Row)> {
        let (scale, s) = self.scores(variant, i)?;
        Ok((scale, row_forward(variant.stage1(), variant.reweight(), &s, self.t, grad)))
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

/// Causal attention output `y` (B, H, T_q, d_v) of `variant` (SPEC sections 2-3).
///
/// Inputs may be `f32` or `f64` (anything that is `AsArray`: `&Array4`, `ArrayView4`); the maths
/// runs in `f64` and the result is rounded to `F`. Memory beyond the output is O(T) per row.
/// `v` may have its own head dimension `d_v`.
///
/// `q` (B, H, T_q, d) may hold only the last `T_q` rows of a `T_k`-long causal sequence whose keys
/// and values `k`, `v` (B, H_kv, T_k, ·) hold (a KV cache, chunked prefill): query row `r` is row
/// `T_k - T_q + r` of the sequence, with its count `N`, scale, bias and re-weighting offset, exactly
/// as in the full sequence. `H` may be a multiple of `H_kv` (grouped-query attention: query head `h`
/// reads key head `h / (H / H_kv)`). One variant depends on more than the rows so far: `relu-seqlen`
/// divides by the sequence's length `T_k`, so its rows change as the sequence grows.
pub fn forward<'a, F: Real>(
    variant: &Variant,
    q: impl AsArray<'a, F, Ix4>,
    k: impl AsArray<'a, F, Ix4>,
    v: impl AsArray<'a, F, Ix4>,
) -> Result<Array4<F>> {
    let (q, k, v) = (q.into(), k.into(), v.into());
    let dims = check(variant, &q, &k, &v)?;
    let mut out = Array4::<F>::zeros((dims.b, dims.h, dims.t_q, dims.dv));
    for b in 0..dims.b {
        for h in 0..dims.h {
            let head = Head::new(variant.stage1().scores, dims, (&q, &k, &v), b, h);
            for i in 0..dims.t_q {
                let (_, row) = head.row(variant, i, false)?;
                let mut o = head.output(row.w());
                if variant.stage1().output_norm == OutputNorm::LayerNorm {
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

/// Final attention weights `w` (B, H, T_q, T_k) of `variant` (queries and heads as in [`forward`]);
/// zero above the diagonal. For `relu-ln` these are the weights before the output layer norm.
pub fn weights<'a, F: Real>(
    variant: &Variant,
    q: impl AsArray<'a, F, Ix4>,
    k: impl AsArray<'a, F, Ix4>,
) -> Result<Array4<F>> {
    let (q, k) = (q.into(), k.into());
    // v is not needed: k stands in for it.
    let dims = check(variant, &q, &k, &k)?;
    let mut out = Array4::<F>::zeros((dims.b, dims.h, dims.t_q, dims.t));
    for b in 0..dims.b {
        for h in 0..dims.h {
            let head = Head::new(variant.stage1().scores, dims, (&q, &k, &k), b, h);
            for i in 0..dims.t_q {
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
/// layer-norm Jacobians), for every input [`forward`] takes. `d_out` has the output's shape
/// (B, H, T_q, d_v); with grouped-query attention, the gradients of a key head sum over its query
/// heads.
pub fn backward<'a, F: Real>(
    variant: &Variant,
    q: impl AsArray<'a, F, Ix4>,
    k: impl AsArray<'a, F, Ix4>,
    v: impl AsArray<'a, F, Ix4>,
    d_out: impl AsArray<'a, F, Ix4>,
) -> Result<Grads<F>> {
    let (q, k, v, g) = (q.into(), k.into(), v.into(), d_out.into());
    let dims = check(variant, &q, &k, &v)?;
    check_d_out(dims, &g)?;
    let Dims { b: nb, h: nh, h_kv, t_q, t, d, dv } = dims;
    let mut grads = Grads {
        dq: Array4::<F>::zeros((nb, nh, t_q, d)),
        dk: Array4::<F>::zeros((nb, h_kv, t, d)),
        dv: Array4::<F>::zeros((nb, h_kv, t, dv)),
    };
    let stage1 = &variant.stage1();
    for b in 0..nb {
        // Per key head: dL/dk (after the L2 Jacobian, which is linear, so the group's heads add) and dL/dv.
        let mut dk_acc = vec![vec![0.0; t * d]; h_kv];
        let mut dv_acc = vec![vec![0.0; t * dv]; h_kv];
        for h in 0..nh {
            let head = Head::new(stage1.scores, dims, (&q, &k, &v), b, h);
            let gh = widen(&g, b, h); // (T_q, d_v)
            let mut dq = vec![0.0; t_q * d]; // dL/dq' (T_q, d)
            let mut dk = vec![0.0; t * d]; // dL/dk' (T_k, d)
            let dvv = &mut dv_acc[dims.kv_head(h)]; // (T_k, d_v)
            for i in 0..t_q {
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
                let mut dw = vec![0.0; w.len()];
                for (j, &wj) in w.iter().enumerate() {
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
            for (acc, x) in dk_acc[dims.kv_head(h)].iter_mut().zip(&dk) {
                *acc += x;
            }
            for i in 0..t_q {
                for e in 0..d {
                    grads.dq[[b, h, i, e]] = F::from_f64(dq[i * d + e]);
                }
            }
        }
        for (hk, (dk, dvv)) in dk_acc.iter().zip(&dv_acc).enumerate() {
            for j in 0..t {
                for e in 0..d {
                    grads.dk[[b, hk, j, e]] = F::from_f64(dk[j * d + e]);
                }
                for e in 0..dv {
                    grads.dv[[b, hk, j, e]] = F::from_f64(dvv[j * dv + e]);
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
