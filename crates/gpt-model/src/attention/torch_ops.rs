//! LSSA, LSSAR and softmax attention as plain tch tensor ops with a materialised `(B, H, T, T)` matrix.
//!
//! Every function takes `q, k, v` of shape `(B, H, T, d)` (any floating kind, any device), is causal
//! (row `i` sees keys `j <= i`), and is differentiable by libtorch's autograd. Rows are 1-indexed in
//! the maths (SPEC section 1), so row index `i` below means tensor index `i - 1`.
//!
//! Formulas (SPEC sections 2.1 and 3):
//!
//! ```text
//! LSSA     s_ij = ln(d) ln(i) <q_i/max(|q_i|,1e-12), k_j/max(|k_j|,1e-12)>
//!          a_ij = softplus(s_ij) M_ij / sum_{k<=i} softplus(s_ik)
//! softmax  a_ij = exp(s_ij - max_k s_ik) M_ij / sum_k ...,   s_ij = <q_i, k_j> / sqrt(d)
//! stage 2  u_ij = N_i a_ij - off_i   (off_i = 0 for i <= 3, else 1; N_i = i)
//!          m_i  = max_j ReLU(u_ij),  r_ij = (ReLU(u_ij) / m_i)^p,  w_ij = r_ij / sum_k r_ik
//!          rows with m_i = 0 (no key above the row mean) fall back to w_ij = a_ij
//! output   o_i  = sum_j w_ij v_j
//! ```
//!
//! Memory: besides the inputs, the forward keeps about four `(B, H, T, T)` tensors alive at its peak
//! without autograd (measured: 4.1 for LSSA and LSSAR at `T = 4096`); with autograd recording every
//! intermediate is saved for the backward (measured forward+backward peaks: 8.3 for LSSA, 12.3 for
//! LSSAR; `bench-kernels memory` reproduces these numbers).

use tch::{Device, Kind, Tensor};

/// The epsilon of the L2 normalisation `x / max(||x||, NORM_EPS)`: it only guards zero vectors.
pub const NORM_EPS: f64 = 1e-12;

/// Rows `i <= OFFSET_FREE_ROWS` (1-based) get no `-1` offset in the re-weighting stage, so that row 1
/// and uniform early rows are never emptied (SPEC section 3).
pub const OFFSET_FREE_ROWS: i64 = 3;

/// The `(B, H, T, d)` sizes of `q`, after checking that `q`, `k`, `v` are 4-D with identical shapes.
///
/// # Panics
/// When a tensor is not 4-D or the shapes differ (the message names the arguments and both shapes).
pub fn check_qkv(q: &Tensor, k: &Tensor, v: &Tensor) -> [i64; 4] {
    let qs = q.size();
    assert_eq!(qs.len(), 4, "q must be (B, H, T, d), got shape {qs:?}");
    for (name, x) in [("k", k), ("v", v)] {
        let xs = x.size();
        assert_eq!(xs, qs, "{name} must have the shape of q: q is {qs:?}, {name} is {xs:?}");
    }
    [qs[0], qs[1], qs[2], qs[3]]
}

/// The 1-based row indices `i = 1..=T` as a `(T, 1)` column of `kind`, for broadcasting over keys.
fn row_index(t: i64, kind: Kind, device: Device) -> Tensor {
    Tensor::arange_start(1, t + 1, (kind, device)).unsqueeze(-1) // (T, 1)
}

/// The multiplicative causal mask `M_ij = 1` for `j <= i`, else 0, as a `(T, T)` tensor of `kind`.
pub fn causal_mask(t: i64, kind: Kind, device: Device) -> Tensor {
    Tensor::ones([t, t], (kind, device)).tril(0) // (T, T)
}

/// Row-wise L2 normalisation over the last dimension: `x / max(||x||, NORM_EPS)`.
pub fn l2_normalise(x: &Tensor) -> Tensor {
    let norm = x.norm_scalaropt_dim(2.0, [-1i64], true).clamp_min(NORM_EPS); // (B, H, T, 1)
    x / norm // (B, H, T, d)
}

/// The LSSA row scale `ln(d) · ln(i)` for 1-based rows `i = 1..=T`, as a `(T, 1)` column.
pub fn lssa_scale(t: i64, d: i64, kind: Kind, device: Device) -> Tensor {
    lssa_scale_with(t, (d as f64).ln(), kind, device)
}

/// The LSSA row scale `head_scale · ln(i)` with a configurable head factor (the paper's is `ln(d)`,
/// validated only at `d = 64`; SPEC section 2.1 keeps it configurable), as a `(T, 1)` column.
pub fn lssa_scale_with(t: i64, head_scale: f64, kind: Kind, device: Device) -> Tensor {
    row_index(t, kind, device).log() * head_scale // (T, 1)
}

/// The LSSA stage-1 weights `a` (SPEC 2.1), `(B, H, T, T)`, zero above the diagonal, rows summing to 1.
///
/// # Panics
/// When `q` and `k` are not 4-D tensors of the same shape.
pub fn lssa_weights(q: &Tensor, k: &Tensor) -> Tensor {
    lssa_weights_with(q, k, (q.size()[3] as f64).ln())
}

/// [`lssa_weights`] with the head factor `head_scale` in place of `ln(d)`.
///
/// # Panics
/// When `q` and `k` are not 4-D tensors of the same shape.
pub fn lssa_weights_with(q: &Tensor, k: &Tensor, head_scale: f64) -> Tensor {
    let [_, _, t, _] = check_qkv(q, k, k);
    let (kind, device) = (q.kind(), q.device());
    let cos = l2_normalise(q).matmul(&l2_normalise(k).transpose(-2, -1)); // (B, H, T, T), in [-1, 1]
    let s = cos * lssa_scale_with(t, head_scale, kind, device); // (B, H, T, T)
    // torch's softplus is the stable form (it returns x itself above its threshold 20).
    let f = s.softplus() * causal_mask(t, kind, device); // (B, H, T, T), f_ij > 0 for j <= i
    let z = f.sum_dim_intlist(&[-1i64][..], true, kind); // (B, H, T, 1), > 0: the diagonal is always there
    f / z // (B, H, T, T)
}

/// The softmax stage-1 weights (scale `1/sqrt(d)`, row maximum subtracted), `(B, H, T, T)`, causal.
///
/// # Panics
/// When `q` and `k` are not 4-D tensors of the same shape.
pub fn softmax_weights(q: &Tensor, k: &Tensor) -> Tensor {
    let [_, _, t, d] = check_qkv(q, k, k);
    let (kind, device) = (q.kind(), q.device());
    let s = q.matmul(&k.transpose(-2, -1)) / (d as f64).sqrt(); // (B, H, T, T)
    let future = causal_mask(t, Kind::Float, device).eq(0.0); // (T, T) bool, true above the diagonal
    // `softmax` subtracts the row maximum itself; masked entries become exactly 0.
    s.masked_fill(&future, f64::NEG_INFINITY).softmax(-1, kind) // (B, H, T, T)
}

/// The re-weighting stage (SPEC section 3) applied to causal, l1-normalised stage-1 weights `a` of
/// shape `(B, H, T, T)`, with sharpening power `p` (the paper uses 3 and 15).
///
/// Computed in the overflow-free form `r = (ReLU(u) / m)^p`; `m` is detached because it cancels in
/// `w = r / sum r` (no gradient flows through it). Rows where every `u <= 0` (e.g. an exactly uniform
/// row past row 3) fall back to `w = a`, **[choice]** of SPEC section 3, without any division by zero
/// (so autograd stays finite there too).
///
/// # Panics
/// When `p == 0` or `a` is not `(B, H, T, T)`.
pub fn reweight(a: &Tensor, p: u32) -> Tensor {
    assert!(p >= 1, "re-weighting power p must be a positive integer, got {p}");
    let size = a.size();
    assert!(size.len() == 4 && size[2] == size[3], "a must be (B, H, T, T), got shape {size:?}");
    let (t, kind, device) = (size[2], a.kind(), a.device());
    let n = row_index(t, kind, device); // (T, 1): N_i = i, the unmasked count of row i
    let off = n.gt(OFFSET_FREE_ROWS as f64).to_kind(kind); // (T, 1): 0 for i <= 3, else 1
    let relu_u = (a * &n - off).relu(); // (B, H, T, T)
    let m = relu_u.amax([-1i64], true).detach(); // (B, H, T, 1)
    let sharpened = m.gt(0.0); // (B, H, T, 1) bool: false for rows that fall back to `a`
    let ones = m.ones_like();
    let r = (relu_u / m.where_self(&sharpened, &ones)).pow_tensor_scalar(p as i64); // (B, H, T, T), in [0, 1]
    let w_sum = r.sum_dim_intlist(&[-1i64][..], true, kind); // (B, H, T, 1), >= 1 where sharpened
    let w = r / w_sum.where_self(&sharpened, &ones); // (B, H, T, T)
    w.where_self(&sharpened, a) // (B, H, T, T)
}

/// LSSA attention (SPEC 2.1), optionally followed by re-weighting with power `p` (LSSAR, SPEC 3).
/// `q, k, v` are `(B, H, T, d)`; the result is `(B, H, T, d)`.
///
/// # Panics
/// When the shapes differ or are not 4-D, or `reweight_p == Some(0)`.
pub fn lssa(q: &Tensor, k: &Tensor, v: &Tensor, reweight_p: Option<u32>) -> Tensor {
    check_qkv(q, k, v);
    attend(&stage2(lssa_weights(q, k), reweight_p), v)
}

/// Causal softmax attention (scale `1/sqrt(d)`, stable), optionally followed by re-weighting with
/// power `p` (e.g. `softmax+rw3`). `q, k, v` are `(B, H, T, d)`; the result is `(B, H, T, d)`.
///
/// # Panics
/// When the shapes differ or are not 4-D, or `reweight_p == Some(0)`.
pub fn softmax(q: &Tensor, k: &Tensor, v: &Tensor, reweight_p: Option<u32>) -> Tensor {
    check_qkv(q, k, v);
    attend(&stage2(softmax_weights(q, k), reweight_p), v)
}

/// `o_i = sum_j w_ij v_j`: `(B, H, T, T) x (B, H, T, d) -> (B, H, T, d)`.
pub fn attend(w: &Tensor, v: &Tensor) -> Tensor {
    w.matmul(v) // (B, H, T, d)
}

fn stage2(a: Tensor, reweight_p: Option<u32>) -> Tensor {
    match reweight_p {
        Some(p) => reweight(&a, p),
        None => a,
    }
}
