//! Stage 1 (score, activation, normaliser, transform) and stage 2 (re-weighting): the per-row maths
//! that every kernel must reproduce, with its constants exposed as functions.

use std::fmt;
use std::sync::Arc;

use crate::activation::Activation;
use crate::error::{Error, Result};

/// Epsilon of the L2 normalisation `x / max(||x||, L2_NORM_EPS)` of cosine scores.
pub const L2_NORM_EPS: f64 = 1e-12;
/// Epsilon of the parameter-free output layer norm of `relu-ln`: `(x - mean) / sqrt(var + eps)`.
pub const LAYER_NORM_EPS: f64 = 1e-5;
/// Largest accepted re-weighting power `p` (`+rw<p>`). `(u/m)^p` never overflows, so this only
/// bounds nonsense; at `p = 1024` the weights are the arg-max to within rounding.
pub const MAX_REWEIGHT_POWER: u32 = 1024;

/// How the dot product is formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scores {
    /// `<q_i, k_j>` on the raw vectors.
    Dot,
    /// `<q'_i, k'_j>` with `x' = x / max(||x||, 1e-12)` (cosine similarity, in `[-1, 1]`).
    Cosine,
}

/// The per-row score scale `scale_i`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// `1 / sqrt(d)`.
    InvSqrtD,
    /// LSSA: `d_factor * ln(N_i)`, with `d_factor = ln(d)` unless overridden.
    LssaLog {
        /// Replaces `ln(d)` when set (`lssa:d_factor=4.0`).
        d_factor: Option<f64>,
    },
    /// `ln(N_i) / sqrt(d)` (Chiang & Cholak; SSMax-style): the `softmax-logn` preset.
    LogNOverSqrtD,
}

impl Scale {
    /// `scale_i` for a row with `row_len_n = N_i` unmasked keys and head dimension `head_dim`.
    pub fn value(&self, row_len_n: usize, head_dim: usize) -> f64 {
        let n = row_len_n as f64;
        let d = head_dim as f64;
        match *self {
            Scale::InvSqrtD => 1.0 / d.sqrt(),
            Scale::LssaLog { d_factor } => d_factor.unwrap_or_else(|| d.ln()) * n.ln(),
            Scale::LogNOverSqrtD => n.ln() / d.sqrt(),
        }
    }
}

/// The additive score bias `b_i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bias {
    /// `b = 0`.
    None,
    /// `b = -ln(T_train)` (Ramapuram et al.); `t_train` must be set before use.
    LogTrainLen {
        /// The training sequence length `T_train` (>= 1).
        t_train: Option<usize>,
    },
    /// `b_i = -ln(N_i)`.
    LogRowLen,
}

impl Bias {
    /// `b_i` for a row with `n = N_i` unmasked keys. Errors when `t_train` is unset or 0.
    pub fn value(&self, n: usize) -> Result<f64> {
        match *self {
            Bias::None => Ok(0.0),
            Bias::LogTrainLen { t_train: None } => {
                Err(Error::MissingParameter { variant: "sigmoid-bias".into(), param: "t_train" })
            }
            Bias::LogTrainLen { t_train: Some(0) } => Err(Error::InvalidParameter {
                param: "t_train",
                value: "0".into(),
                reason: "the training length must be >= 1",
            }),
            Bias::LogTrainLen { t_train: Some(t) } => Ok(-(t as f64).ln()),
            Bias::LogRowLen => Ok(-(n as f64).ln()),
        }
    }
}

/// The row normaliser applied to `f_i.`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Norm {
    /// `a_ij = f_ij / sum_k |f_ik|`; a row with `sum |f| = 0` gives all-zero weights.
    L1,
    /// `a_ij = f_ij`.
    None,
    /// `a_ij = f_ij / N_i`: each row divided by its own number of visible keys (`relu-rowlen`).
    DivN,
    /// `a_ij = f_ij / L`, with `L` the number of keys of the whole sequence the row belongs to (the
    /// window being processed; `L = T` in the causal reference on `(B, H, T, d)` arrays). Wortsman
    /// et al.'s "divide by the sequence length" (`relu-seqlen`): unlike [`Norm::DivN`], the same
    /// row gets smaller weights in a longer window.
    DivLen,
}

/// A transform of the normalised row (Table 1 of the paper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transform {
    /// Unchanged.
    None,
    /// `-a` (`inverse`).
    Inverse,
    /// Rows `N_i > 3`: `a_ij - mean_k a_ik` over the unmasked keys (= `a_ij - 1/N_i` for a
    /// row-stochastic stage 1), mask re-applied; rows 1..3 unmodified (`recentered`).
    Recentered,
    /// `Recentered`, then divided by the row's `sum |.|` (0 if that sum is 0) (`recentered-l1`).
    RecenteredL1,
}

/// A normalisation of each output row `o_i` (over the head dimension).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutputNorm {
    /// Unchanged.
    None,
    /// Parameter-free layer norm `(o - mean) / sqrt(var + 1e-5)`, biased variance (`relu-ln`).
    LayerNorm,
}

/// Rows `N_i <= OFFSET_FREE_ROWS` get no `-1` offset in the re-weighting, so that the first rows
/// (whose few keys make `N_i a_ij - 1` small or empty) are never emptied (SPEC section 3).
pub const OFFSET_FREE_ROWS: usize = 3;

/// The offset `off_i` of the re-weighting: 0 for rows with `n = N_i <= OFFSET_FREE_ROWS`, else 1.
pub fn reweight_offset(n: usize) -> f64 {
    if n <= OFFSET_FREE_ROWS { 0.0 } else { 1.0 }
}

/// Stage 1: `s_ij = scale_i <q'_i, k'_j> + b_i`, `f_ij = phi(s_ij)`, `a_i = transform(norm(f_i))`.
///
/// Build one from parts with [`Stage1::new`] and the public fields, or take a named preset
/// with [`Stage1::preset`]. Equality compares built-in activations by identity and users' by
/// [`Activation::name`] (see [`Activation`]).
#[derive(Clone)]
pub struct Stage1 {
    /// The positivity map `phi`.
    pub activation: Arc<dyn Activation>,
    /// Dot or cosine scores.
    pub scores: Scores,
    /// `scale_i`.
    pub scale: Scale,
    /// `b_i`.
    pub bias: Bias,
    /// The row normaliser.
    pub norm: Norm,
    /// A transform after the normaliser.
    pub transform: Transform,
    /// A normalisation of the output rows.
    pub output_norm: OutputNorm,
}

impl fmt::Debug for Stage1 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Stage1")
            .field("activation", &self.activation.name())
            .field("scores", &self.scores)
            .field("scale", &self.scale)
            .field("bias", &self.bias)
            .field("norm", &self.norm)
            .field("transform", &self.transform)
            .field("output_norm", &self.output_norm)
            .finish()
    }
}

impl PartialEq for Stage1 {
    fn eq(&self, other: &Self) -> bool {
        let same_phi = match (self.activation.builtin(), other.activation.builtin()) {
            (Some(a), Some(b)) => a == b,
            (None, None) => self.activation.name() == other.activation.name(),
            _ => false, // a user's activation never equals a built-in, whatever its name
        };
        same_phi
            && self.scores == other.scores
            && self.scale == other.scale
            && self.bias == other.bias
            && self.norm == other.norm
            && self.transform == other.transform
            && self.output_norm == other.output_norm
    }
}

impl Stage1 {
    /// `phi` with dot scores, scale `1/sqrt(d)`, no bias, l1, no transform, no output norm
    /// (`Stage1::new(Arc::new(Exp))` is `softmax`).
    pub fn new(activation: Arc<dyn Activation>) -> Self {
        Stage1 {
            activation,
            scores: Scores::Dot,
            scale: Scale::InvSqrtD,
            bias: Bias::None,
            norm: Norm::L1,
            transform: Transform::None,
            output_norm: OutputNorm::None,
        }
    }

    /// The score `s_ij = scale_i * dot + b_i` for a row with `n = N_i` keys.
    pub fn score(&self, dot: f64, n: usize, head_dim: usize) -> Result<f64> {
        Ok(self.scale.value(n, head_dim) * dot + self.bias.value(n)?)
    }

    /// Whether the l1 rows are evaluated as `phi(s - max s)`: an activation that
    /// [needs a running maximum](Activation::needs_running_max) under [`Norm::L1`].
    pub fn needs_running_max(&self) -> bool {
        self.activation.needs_running_max() && self.norm == Norm::L1
    }

    /// Whether every row of `a` is non-negative and sums to 1 (or is all zero when
    /// `sum_j f_ij = 0`, e.g. `relu-l1` with every score negative): non-negative `phi`, l1, no
    /// transform.
    pub fn rows_sum_to_one(&self) -> bool {
        self.activation.is_non_negative() && self.norm == Norm::L1 && self.transform == Transform::None
    }

    /// Whether a fused kernel can evaluate the row in one or two sweeps over key tiles keeping only
    /// O(1) numbers per row besides the output accumulator: no [`Transform`] (the Table-1
    /// transforms need the full row), and for [`Norm::L1`] a non-negative `phi` (so that
    /// `Z = sum f` accumulates without a second pass).
    pub fn is_streamable(&self) -> bool {
        self.transform == Transform::None && (self.norm != Norm::L1 || self.activation.is_non_negative())
    }

    /// Check the parameters: `t_train` set and >= 1, `d_factor` finite.
    pub fn validate(&self) -> Result<()> {
        self.bias.value(1)?;
        if let Scale::LssaLog { d_factor: Some(f) } = self.scale
            && !f.is_finite()
        {
            return Err(Error::InvalidParameter {
                param: "d_factor",
                value: format!("{f:?}"),
                reason: "must be finite",
            });
        }
        Ok(())
    }

    /// Stage-1 weights `a_i` of one row from its `N_i = scores.len()` unmasked scores `s_ij`.
    ///
    /// The row is taken as the last row of its sequence: under [`Norm::DivLen`] the sequence length
    /// is `L = N_i` (an earlier row of a longer window would be divided by that window's length;
    /// use [`weights`](crate::weights) on the whole sequence for that).
    pub fn weights_from_scores(&self, scores: &[f64]) -> Vec<f64> {
        row_forward(self, None, scores, scores.len(), false).a
    }
}

/// Stage 2 on one row of weights `a` (`N_i = a.len()`): `u = N a - off`,
/// `r = (ReLU(u)/m)^p` with `m = max ReLU(u)`, `w = r / sum r`; an empty row (`m == 0`) returns `a`.
pub fn reweight_row(a: &[f64], p: u32) -> Vec<f64> {
    reweight_forward(a, p).w
}

/// Intermediates of stage 2 on one row, kept for the backward pass.
#[derive(Debug, Clone)]
pub(crate) struct RwRow {
    pub(crate) u: Vec<f64>,
    /// `max_j ReLU(u_ij)`; 0 means the empty-row fallback `w = a`.
    pub(crate) m: f64,
    /// `sum_j (ReLU(u_ij)/m)^p`.
    pub(crate) wsum: f64,
    pub(crate) w: Vec<f64>,
}

pub(crate) fn reweight_forward(a: &[f64], p: u32) -> RwRow {
    let n = a.len();
    let nf = n as f64;
    let off = reweight_offset(n);
    let u: Vec<f64> = a.iter().map(|&x| nf * x - off).collect();
    let m = u.iter().fold(0.0_f64, |acc, &x| acc.max(x));
    if m <= 0.0 {
        // [choice] empty row (every key at or below the mean): no sharpening, w = a.
        return RwRow { u, m: 0.0, wsum: 0.0, w: a.to_vec() };
    }
    let pi = p.min(i32::MAX as u32) as i32;
    let mut w: Vec<f64> = u.iter().map(|&x| if x > 0.0 { (x / m).powi(pi) } else { 0.0 }).collect();
    let wsum: f64 = w.iter().sum(); // >= 1: the arg-max contributes exactly 1
    for x in &mut w {
        *x /= wsum;
    }
    RwRow { u, m, wsum, w }
}

/// Intermediates of one row of stage 1 (+ stage 2), kept for the backward pass.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// `phi'(s - c)` (c = row max under a running max, else 0).
    pub(crate) fprime: Vec<f64>,
    /// Sign used in the l1 denominator (`+1` for non-negative `phi`, `signum(f)` else, 0 at 0).
    pub(crate) sign: Vec<f64>,
    /// `sum_k |f_ik|` (l1 only).
    pub(crate) z: f64,
    /// The length `L` of the sequence the row belongs to ([`Norm::DivLen`]'s divisor).
    pub(crate) seq_len: usize,
    /// Weights after the normaliser, before the transform.
    pub(crate) a0: Vec<f64>,
    /// Recentered row and its `sum |.|` (RecenteredL1 only).
    pub(crate) c: Vec<f64>,
    pub(crate) c_abs: f64,
    /// Stage-1 weights (after the transform).
    pub(crate) a: Vec<f64>,
    pub(crate) rw: Option<(u32, RwRow)>,
}

impl Row {
    /// Final weights of the row.
    pub(crate) fn w(&self) -> &[f64] {
        match &self.rw {
            Some((_, r)) => &r.w,
            None => &self.a,
        }
    }
}

fn signum0(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// Stage 1 (+ stage 2) of one row from its scores, in a sequence of `seq_len` keys (`L >= N_i`,
/// used by [`Norm::DivLen`] only; the causal reference passes `T`); `grad` keeps what the backward
/// pass needs (`phi'` and the l1 signs), which the forward pass skips.
pub(crate) fn row_forward(stage1: &Stage1, reweight: Option<u32>, s: &[f64], seq_len: usize, grad: bool) -> Row {
    let n = s.len();
    let nf = n as f64;
    let act = &*stage1.activation;
    let shift = if stage1.needs_running_max() { s.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x)) } else { 0.0 };
    let f: Vec<f64> = s.iter().map(|&x| act.value(x - shift)).collect();
    let (fprime, sign) = if grad {
        let fprime: Vec<f64> = s.iter().map(|&x| act.derivative(x - shift)).collect();
        let sign: Vec<f64> = if act.is_non_negative() { vec![1.0; n] } else { f.iter().map(|&x| signum0(x)).collect() };
        (fprime, sign)
    } else {
        (Vec::new(), Vec::new())
    };
    let (z, mut a0) = match stage1.norm {
        Norm::L1 => {
            let z: f64 = f.iter().map(|x| x.abs()).sum();
            // [choice] a zero-sum l1 row gives all-zero weights (and zero gradient).
            let a0 = if z > 0.0 { f.iter().map(|&x| x / z).collect() } else { vec![0.0; n] };
            (z, a0)
        }
        Norm::None => (0.0, f),
        Norm::DivN => (0.0, f.iter().map(|&x| x / nf).collect()),
        Norm::DivLen => {
            let l = seq_len as f64;
            (0.0, f.iter().map(|&x| x / l).collect())
        }
    };
    let recenter = |x: &[f64]| -> Vec<f64> {
        if n <= 3 {
            x.to_vec()
        } else {
            let mean = x.iter().sum::<f64>() / nf;
            x.iter().map(|&y| y - mean).collect()
        }
    };
    let (c, c_abs, a) = match stage1.transform {
        Transform::None if !grad => (Vec::new(), 0.0, std::mem::take(&mut a0)),
        Transform::None => (Vec::new(), 0.0, a0.clone()),
        Transform::Inverse => (Vec::new(), 0.0, a0.iter().map(|&x| -x).collect()),
        Transform::Recentered => (Vec::new(), 0.0, recenter(&a0)),
        Transform::RecenteredL1 => {
            let c = recenter(&a0);
            let c_abs: f64 = c.iter().map(|x| x.abs()).sum();
            let a = if c_abs > 0.0 { c.iter().map(|&x| x / c_abs).collect() } else { vec![0.0; n] };
            (c, c_abs, a)
        }
    };
    let rw = reweight.map(|p| (p, reweight_forward(&a, p)));
    Row { fprime, sign, z, seq_len, a0, c, c_abs, a, rw }
}

/// `dL/ds` of one row from `dL/dw` (the gradient with respect to the final weights); the sequence
/// length of [`Norm::DivLen`] is the one `row` was computed with.
pub(crate) fn row_backward(stage1: &Stage1, row: &Row, dw: &[f64]) -> Vec<f64> {
    let n = dw.len();
    let nf = n as f64;
    // Stage 2: w = r / W, r = (ReLU(u)/m)^p, u = N a - off; no gradient through m (w is
    // invariant to m).
    let da: Vec<f64> = match &row.rw {
        Some((p, rw)) if rw.m > 0.0 => {
            let d_prime: f64 = rw.w.iter().zip(dw).map(|(w, g)| w * g).sum(); // D'_i = <g_i, o_i>
            let pf = f64::from(*p);
            let pm1 = p.saturating_sub(1).min(i32::MAX as u32) as i32;
            rw.u.iter()
                .zip(dw)
                .map(|(&u, &g)| {
                    if u > 0.0 {
                        // h_ij = (g_ij - D'_i)/W_i * p (u/m)^(p-1) / m ; da = N h
                        let h = (g - d_prime) / rw.wsum * pf * (u / rw.m).powi(pm1) / rw.m;
                        nf * h
                    } else {
                        0.0
                    }
                })
                .collect()
        }
        _ => dw.to_vec(),
    };
    let recenter_back = |g: &[f64]| -> Vec<f64> {
        if n <= 3 {
            g.to_vec()
        } else {
            let mean = g.iter().sum::<f64>() / nf;
            g.iter().map(|&y| y - mean).collect()
        }
    };
    let da0: Vec<f64> = match stage1.transform {
        Transform::None => da,
        Transform::Inverse => da.iter().map(|&x| -x).collect(),
        Transform::Recentered => recenter_back(&da),
        Transform::RecenteredL1 => {
            let dc: Vec<f64> = if row.c_abs > 0.0 {
                let dot: f64 = row.a.iter().zip(&da).map(|(a, g)| a * g).sum();
                row.c.iter().zip(&da).map(|(&c, &g)| (g - signum0(c) * dot) / row.c_abs).collect()
            } else {
                vec![0.0; n]
            };
            recenter_back(&dc)
        }
    };
    let df: Vec<f64> = match stage1.norm {
        Norm::L1 => {
            if row.z > 0.0 {
                let dot: f64 = row.a0.iter().zip(&da0).map(|(a, g)| a * g).sum();
                da0.iter().zip(&row.sign).map(|(&g, &sg)| (g - sg * dot) / row.z).collect()
            } else {
                vec![0.0; n]
            }
        }
        Norm::None => da0,
        Norm::DivN => da0.iter().map(|&g| g / nf).collect(),
        Norm::DivLen => {
            let l = row.seq_len as f64;
            da0.iter().map(|&g| g / l).collect()
        }
    };
    df.iter().zip(&row.fprime).map(|(&g, &fp)| if g == 0.0 { 0.0 } else { g * fp }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::{Exp, Relu};

    /// [choice] the empty-row fallback: with every `u <= 0` the weights and the gradient are
    /// exactly stage 1's.
    #[test]
    fn empty_row_fallback_passes_stage_one_gradient() {
        let softmax = Stage1::new(Arc::new(Exp));
        let s = [0.7; 4]; // exactly uniform: a = 1/4, u = 4 * 1/4 - 1 = 0
        let plain = row_forward(&softmax, None, &s, 4, true);
        let rw = row_forward(&softmax, Some(15), &s, 4, true);
        assert_eq!(rw.rw.as_ref().unwrap().1.m, 0.0);
        assert_eq!(rw.w(), plain.w());
        let dw = [0.3, -1.0, 2.0, 0.5];
        assert_eq!(row_backward(&softmax, &rw, &dw), row_backward(&softmax, &plain, &dw));
    }

    /// [choice] a zero-sum l1 row: zero weights and zero score gradient.
    #[test]
    fn zero_sum_l1_row_is_zero() {
        let relu = Stage1::new(Arc::new(Relu));
        let row = row_forward(&relu, Some(3), &[-1.0, -2.0, -0.5, -3.0, -0.1], 5, true);
        assert!(row.w().iter().all(|&x| x == 0.0));
        assert!(row_backward(&relu, &row, &[1.0; 5]).iter().all(|&x| x == 0.0));
    }
}
