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

use attn_core::{Builtin, Phi};
use tch::{Device, Kind, Tensor};

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

/// Row-wise L2 normalisation over the last dimension: `x / max(||x||, L2_NORM_EPS)`.
pub fn l2_normalise(x: &Tensor) -> Tensor {
    let norm = x.norm_scalaropt_dim(2.0, [-1i64], true).clamp_min(attn_core::stage::L2_NORM_EPS); // (B, H, T, 1)
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
/// row past row 3) fall back to `w = a`, **\[choice\]** of SPEC section 3, without any division by zero
/// (so autograd stays finite there too).
///
/// # Panics
/// When `p == 0` or `a` is not `(B, H, T, T)`.
pub fn reweight(a: &Tensor, p: u32) -> Tensor {
    assert!(p >= 1, "re-weighting power p must be a positive integer, got {p}");
    let size = a.size();
    assert!(size.len() == 4 && size[2] == size[3], "a must be (B, H, T, T), got shape {size:?}");
    reweight_rows(a, p, &row_index(size[2], a.kind(), a.device()))
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

// ---------------------------------------------------------------------------------------------------
// Every variant: the general path used by the model's `reference` implementation.
// ---------------------------------------------------------------------------------------------------

/// Why [`attention`] refused its input.
#[derive(Debug, thiserror::Error)]
pub enum AttnError {
    /// The tensors' shapes do not fit together.
    #[error("attention input: {0}")]
    Shape(String),
    /// The variant misses a parameter or has an invalid one.
    #[error(transparent)]
    Variant(#[from] attn_core::Error),
}

/// `phi(x)` as differentiable tch ops: attn-core's built-ins as libtorch's own functions, a user's
/// activation through its f64 `value` and `derivative` (see [`custom_activation`]).
fn activation(phi: &Phi, x: &Tensor) -> Tensor {
    match phi {
        Phi::Builtin(Builtin::Exp) => x.exp(),
        // The stable form: max(x,0) + log1p(exp(-|x|)) up to torch's threshold.
        Phi::Builtin(Builtin::Softplus) => x.softplus(),
        Phi::Builtin(Builtin::Relu) => x.relu(),
        Phi::Builtin(Builtin::Relu2) => x.relu().square(),
        Phi::Builtin(Builtin::Relu6) => x.clamp(0.0, 6.0),
        Phi::Builtin(Builtin::Gelu) => x.gelu("none"), // the erf form
        Phi::Builtin(Builtin::Sigmoid) => x.sigmoid(),
        Phi::Builtin(Builtin::Mish) => x.mish(),
        Phi::Builtin(Builtin::Identity) => x.shallow_clone(),
        Phi::Custom(a) => custom_activation(&**a, x),
    }
}

/// A user's activation on a tensor of any device and floating kind: `phi(x)` and `phi'(x)` are
/// evaluated element by element in f64 on the host, and combined as
/// `phi(x).detach() + phi'(x).detach() * (x - x.detach())`, whose value is exactly `phi(x)` (the last
/// factor is exactly 0) and whose gradient is `phi'(x)` (0 at an infinite, i.e. masked, score). Correct on every path, slow: meant for
/// trying an activation before it has vectorised code (second derivatives are not supported).
fn custom_activation(a: &dyn attn_core::Activation, x: &Tensor) -> Tensor {
    let (kind, device) = (x.kind(), x.device());
    let host = x.detach().to_kind(Kind::Double).to_device(Device::Cpu).contiguous();
    let xs = Vec::<f64>::try_from(&host.flatten(0, -1)).expect("a contiguous f64 host tensor converts to a Vec");
    let to_tensor = |f: &dyn Fn(f64) -> f64| {
        let ys: Vec<f64> = xs.iter().map(|&v| f(v)).collect();
        Tensor::from_slice(&ys).reshape(x.size()).to_kind(kind).to_device(device)
    };
    let value = to_tensor(&|v| a.value(v));
    // Masked scores of exponential-type activations are -inf: no slope, and no `inf - inf` below.
    let slope = to_tensor(&|v| if v.is_finite() { a.derivative(v) } else { 0.0 });
    let finite = x.masked_fill(&x.isinf(), 0.0);
    value + slope * (&finite - finite.detach())
}

/// A `(T_q, 1)` column holding `value(N_i)` for the absolute 1-based rows `N_i = q_offset + 1 ..= q_offset + T_q`,
/// computed in f64 by attn-core's own per-row functions (never restated here).
fn row_column(t_q: i64, q_offset: i64, kind: Kind, device: Device, value: impl Fn(usize) -> f64) -> Tensor {
    let vals: Vec<f64> = (0..t_q).map(|r| value((q_offset + r + 1) as usize)).collect();
    Tensor::from_slice(&vals).to_kind(kind).to_device(device).unsqueeze(-1) // (T_q, 1)
}

/// Checks `q (B, H, T_q, d)`, `k`, `v (B, H, q_offset + T_q, d)`; returns `(T_q, T_k, d)`.
fn check_offset_shapes(
    q: &Tensor,
    k: &Tensor,
    v: Option<&Tensor>,
    q_offset: i64,
) -> Result<(i64, i64, i64), AttnError> {
    let (qs, ks) = (q.size(), k.size());
    if qs.len() != 4 || ks.len() != 4 {
        return Err(AttnError::Shape(format!("q and k must be (B, H, T, d), got q {qs:?}, k {ks:?}")));
    }
    if let Some(v) = v
        && v.size() != ks
    {
        return Err(AttnError::Shape(format!("v must have the shape of k: k is {ks:?}, v is {:?}", v.size())));
    }
    if qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] {
        return Err(AttnError::Shape(format!("q and k differ in batch, heads or head dim: q {qs:?}, k {ks:?}")));
    }
    if q_offset < 0 || ks[2] != q_offset + qs[2] {
        return Err(AttnError::Shape(format!(
            "k must hold q_offset + T_q = {} + {} rows, it holds {}",
            q_offset, qs[2], ks[2]
        )));
    }
    if qs[2] == 0 || qs[3] == 0 {
        return Err(AttnError::Shape(format!("T and d must be >= 1, got q {qs:?}")));
    }
    Ok((qs[2], ks[2], qs[3]))
}

/// The final weights `w` of a variant's `plan` (stage 1, its transform, then stage 2 if set), derived
/// once by the caller ([`crate::attention::Attention::plan`], `Variant::plan`), for queries at
/// absolute positions `q_offset..q_offset + T_q` over keys `0..q_offset + T_q`: `(B, H, T_q, T_k)`,
/// zero on future keys. Differentiable; every constant per row (`scale_i`, `b_i`, the re-weighting
/// offset) comes from attn-core.
///
/// `attn_core::Norm::DivLen` (`relu-seqlen`) divides by the length of the sequence being
/// processed, which here is `T_k = q_offset + T_q`: the query block is taken to end the sequence.
///
/// Autograd safety: masked scores are filled before any activation (with `-inf` under a running
/// maximum, so `exp` gives exactly 0, else with 0), every division is guarded, so no `0 · inf`
/// reaches a gradient.
pub fn weights(q: &Tensor, k: &Tensor, plan: &attn_core::Plan, q_offset: i64) -> Result<Tensor, AttnError> {
    let (_, t_k, _) = check_offset_shapes(q, k, None, q_offset)?;
    weights_in(q, k, plan, q_offset, t_k)
}

/// [`weights`] for a query block of a sequence of `seq_len >= T_k` keys, of which `k` holds the
/// first `T_k` (those the block sees): `seq_len` is the divisor of `attn_core::Norm::DivLen`, and
/// is what lets [`attention_chunked`] give every block the full sequence's length.
fn weights_in(
    q: &Tensor,
    k: &Tensor,
    plan: &attn_core::Plan,
    q_offset: i64,
    seq_len: i64,
) -> Result<Tensor, AttnError> {
    let (t_q, t_k, d) = check_offset_shapes(q, k, None, q_offset)?;
    if seq_len < t_k {
        return Err(AttnError::Shape(format!("the sequence length {seq_len} is below the {t_k} keys of the block")));
    }
    let (kind, device) = (q.kind(), q.device());
    let hd = d as usize;
    // Causal mask of the queries' absolute rows: key j (0-based) is visible to row r when j <= q_offset + r.
    let rows = Tensor::arange_start(q_offset, q_offset + t_q, (Kind::Int64, device)).unsqueeze(-1); // (T_q, 1)
    let cols = Tensor::arange(t_k, (Kind::Int64, device)).unsqueeze(0); // (1, T_k)
    let future = cols.gt_tensor(&rows); // (T_q, T_k) bool
    let n = row_column(t_q, q_offset, kind, device, |n| n as f64); // (T_q, 1): N_i

    let dot = match plan.scores {
        attn_core::Scores::Dot => q.matmul(&k.transpose(-2, -1)),
        attn_core::Scores::Cosine => l2_normalise(q).matmul(&l2_normalise(k).transpose(-2, -1)),
    }; // (B, H, T_q, T_k)
    let scale = row_column(t_q, q_offset, kind, device, |n| plan.row_constants(n, hd).0);
    let bias = row_column(t_q, q_offset, kind, device, |n| plan.row_constants(n, hd).1);
    let s = dot * scale + bias; // (B, H, T_q, T_k)
    let f = if plan.running_max {
        let s = s.masked_fill(&future, f64::NEG_INFINITY);
        let shift = s.amax([-1i64], true).detach(); // (B, H, T_q, 1); cancels in the l1 ratio
        activation(&plan.phi, &(s - shift))
    } else {
        activation(&plan.phi, &s.masked_fill(&future, 0.0)).masked_fill(&future, 0.0)
    }; // (B, H, T_q, T_k), zero on future keys

    let guarded_div = |x: &Tensor, z: &Tensor| {
        // x / z where z > 0, else 0 ([choice] of attn-core: a zero-sum l1 row gives zero weights).
        let pos = z.gt(0.0);
        (x / z.where_self(&pos, &z.ones_like())) * pos.to_kind(kind)
    };
    let a = match plan.norm {
        attn_core::Norm::L1 => guarded_div(&f, &f.abs().sum_dim_intlist(&[-1i64][..], true, kind)),
        attn_core::Norm::None => f,
        attn_core::Norm::DivN => f / &n,
        attn_core::Norm::DivLen => f / seq_len as f64,
    };
    let recenter = |a: &Tensor| {
        // Rows N_i > 3: a - mean over the unmasked keys, mask re-applied; rows 1..3 unchanged.
        let mean = a.sum_dim_intlist(&[-1i64][..], true, kind) / &n; // (B, H, T_q, 1)
        let late = n.gt(3.0); // (T_q, 1)
        let centred = (a - mean).masked_fill(&future, 0.0);
        centred.where_self(&late, a)
    };
    let a = match plan.transform {
        attn_core::Transform::None => a,
        attn_core::Transform::Inverse => -a,
        attn_core::Transform::Recentered => recenter(&a),
        attn_core::Transform::RecenteredL1 => {
            let c = recenter(&a);
            guarded_div(&c, &c.abs().sum_dim_intlist(&[-1i64][..], true, kind))
        }
    };
    Ok(match plan.reweight {
        Some(p) => reweight_rows(&a, p, &n),
        None => a,
    })
}

/// Stage 2 with the row counts `n` `(T_q, 1)` given explicitly (rows need not start at 1).
fn reweight_rows(a: &Tensor, p: u32, n: &Tensor) -> Tensor {
    let kind = a.kind();
    let off = n.gt(attn_core::stage::OFFSET_FREE_ROWS as f64).to_kind(kind); // (T_q, 1): attn_core::stage::reweight_offset
    let relu_u = (a * n - off).relu(); // (B, H, T_q, T_k)
    let m = relu_u.amax([-1i64], true).detach(); // (B, H, T_q, 1); cancels in w
    let sharpened = m.gt(0.0);
    let ones = m.ones_like();
    let r = (relu_u / m.where_self(&sharpened, &ones)).pow_tensor_scalar(p as i64); // in [0, 1]
    let w_sum = r.sum_dim_intlist(&[-1i64][..], true, kind);
    (r / w_sum.where_self(&sharpened, &ones)).where_self(&sharpened, a) // empty rows fall back to a
}

/// Causal attention of any variant for queries at absolute positions `q_offset..q_offset + T_q`:
/// `q (B, H, T_q, d)`, `k`, `v (B, H, q_offset + T_q, d)` -> `(B, H, T_q, d)`. Materialises the
/// `(B, H, T_q, T_k)` weights (see [`attention_chunked`] for evaluation without autograd). The
/// sequence length of `relu-seqlen` is `T_k` (see [`weights`]).
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    plan: &attn_core::Plan,
    q_offset: i64,
) -> Result<Tensor, AttnError> {
    let (_, t_k, _) = check_offset_shapes(q, k, Some(v), q_offset)?;
    attention_in(q, k, v, plan, q_offset, t_k)
}

/// [`attention`] for a query block of a sequence of `seq_len >= T_k` keys (see [`weights_in`]).
fn attention_in(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    plan: &attn_core::Plan,
    q_offset: i64,
    seq_len: i64,
) -> Result<Tensor, AttnError> {
    check_offset_shapes(q, k, Some(v), q_offset)?;
    let o = weights_in(q, k, plan, q_offset, seq_len)?.matmul(v); // (B, H, T_q, d)
    Ok(match plan.output_norm {
        attn_core::OutputNorm::None => o,
        attn_core::OutputNorm::LayerNorm => {
            // Parameter-free layer norm over the head dimension, biased variance (relu-ln).
            let mean = o.mean_dim(&[-1i64][..], true, o.kind());
            let centred = &o - mean;
            let var = centred.square().mean_dim(&[-1i64][..], true, o.kind());
            centred / (var + attn_core::stage::LAYER_NORM_EPS).sqrt()
        }
    })
}

/// [`attention`] in blocks of `chunk` query rows: each block sees only the keys up to its last row,
/// so the scratch is `B·H·chunk·T_k` instead of `B·H·T_q·T_k`. Meant for evaluation under
/// `tch::no_grad` (with autograd it would still save every block's weights). Every block is
/// normalised as a part of the whole sequence (`relu-seqlen` divides by `T_k`, not by the keys the
/// block sees), so the result equals [`attention`]'s.
pub fn attention_chunked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    plan: &attn_core::Plan,
    q_offset: i64,
    chunk: i64,
) -> Result<Tensor, AttnError> {
    let (t_q, t_k, _) = check_offset_shapes(q, k, Some(v), q_offset)?;
    let chunk = chunk.max(1);
    let mut outs = Vec::with_capacity(((t_q + chunk - 1) / chunk) as usize);
    let mut r0 = 0;
    while r0 < t_q {
        let len = chunk.min(t_q - r0);
        let upto = q_offset + r0 + len; // keys visible to the block's last row
        outs.push(attention_in(
            &q.narrow(2, r0, len),
            &k.narrow(2, 0, upto),
            &v.narrow(2, 0, upto),
            plan,
            q_offset + r0,
            t_k,
        )?);
        r0 += len;
    }
    Ok(Tensor::cat(&outs, 2)) // (B, H, T_q, d)
}
