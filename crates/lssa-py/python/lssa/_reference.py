"""Every variant as plain PyTorch ops with a materialised ``(B, H, T, T)`` weight matrix.

This is the path ``lssa.attention`` falls back to where no fused kernel exists (the Table-1
transforms such as ``recentered``, float64, half precision on the CPU, devices other than CPU and
CUDA): slow (``O(T^2)`` memory) but exact, differentiable by autograd, and traceable by
``torch.compile``. It mirrors ``gpt-model``'s ``torch_ops.rs``; the variant's parts come from
attn-core (``_lssa.describe``), the formulas are those of docs/SPEC.md (sections 2-4; also in the attn-core crate docs):

    stage 1   s_ij = scale_i <q'_i, k'_j> + b_i        q', k': raw, or x / max(||x||, 1e-12)
              f_ij = phi(s_ij) M_ij                     (phi(s - max_j s) for exp under l1)
              a_i. = transform(norm_i(f_i.))
    stage 2   u_ij = N_i a_ij - off_i                   off_i = 0 if N_i <= 3 else 1
    (+rw<p>)  r_ij = (ReLU(u_ij) / m_i)^p               m_i = max_j ReLU(u_ij) (no gradient: it cancels)
              w_ij = r_ij / sum_j r_ij                  (m_i == 0: w_ij = a_ij)
    output    o_i  = sum_j w_ij v_j                     (relu-ln: then a layer norm over d)

Rows are 1-indexed in the maths: row ``i`` sees keys ``j <= i`` and ``N_i = i``. ``q`` may hold the
last ``T_q`` rows of a ``T_k``-long sequence (``k``, ``v``: all ``T_k``; a decoding step against a KV
cache), so its row ``r`` is row ``T_k - T_q + r + 1``; and ``k``, ``v`` may have fewer heads than ``q``
(grouped-query attention: each key head serves ``H / H_kv`` consecutive query heads). Half-precision
inputs are computed in float32 and the result is rounded back; float64 stays float64.
"""

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

# The maths' constants, from the Rust side that defines them (attn_core::stage): the epsilon of the
# L2 normalisation of cosine scores, that of relu-ln's output layer norm, and the rows without the
# re-weighting's offset.
from ._lssa import L2_NORM_EPS, LAYER_NORM_EPS, OFFSET_FREE_ROWS


class Spec(NamedTuple):
    """A variant's parts, as ``_lssa.describe`` gives them."""

    name: str
    activation: str
    scores: str
    scale: str
    d_factor: Optional[float]
    bias: str
    t_train: Optional[int]
    norm: str
    transform: str
    output_norm: str
    running_max: bool
    reweight: Optional[int]


def _phi(name: str, x: Tensor) -> Tensor:
    """attn-core's built-in activations as differentiable ops (the exact, overflow-free forms)."""
    if name == "exp":
        return torch.exp(x)
    if name == "softplus":
        # log(1 + e^x) without overflow and without torch's linear cut-off above 20.
        return torch.logaddexp(x, torch.zeros_like(x))
    if name == "relu":
        return torch.relu(x)
    if name == "relu2":
        return torch.square(torch.relu(x))
    if name == "relu6":
        return torch.clamp(x, 0.0, 6.0)
    if name == "gelu":
        return F.gelu(x, approximate="none")
    if name == "sigmoid":
        return torch.sigmoid(x)
    if name == "mish":
        return F.mish(x)
    if name == "identity":
        return x
    raise ValueError(f"activation `{name}` has no PyTorch implementation here")


def _guarded_div(x: Tensor, z: Tensor) -> Tensor:
    """``x / z`` where ``z > 0``, else 0 (attn-core's choice: a zero-sum l1 row has zero weights)."""
    pos = z > 0
    return (x / torch.where(pos, z, torch.ones_like(z))) * pos.to(x.dtype)


def attention(q: Tensor, k: Tensor, v: Tensor, spec: Spec) -> Tensor:
    """Causal attention of ``spec``: ``q`` ``(B, H, T_q, d)``, ``k`` ``(B, H_kv, T_k, d)`` and ``v``
    ``(B, H_kv, T_k, d_v)`` with ``T_k >= T_q`` and ``H`` a multiple of ``H_kv``."""
    out_dtype = q.dtype
    ct = torch.promote_types(q.dtype, torch.float32)
    q, k, v = q.to(ct), k.to(ct), v.to(ct)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    t_q, t, d = q.shape[-2], k.shape[-2], q.shape[-1]
    dev = q.device
    n = torch.arange(t - t_q + 1, t + 1, dtype=ct, device=dev).unsqueeze(-1)  # (T_q, 1): N_i
    future = torch.ones(t_q, t, dtype=torch.bool, device=dev).triu(t - t_q + 1)  # (T_q, T_k): key j > row i

    if spec.scores == "cosine":
        q = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(L2_NORM_EPS)
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(L2_NORM_EPS)
    dot = q @ k.transpose(-2, -1)  # (B, H, T, T)

    if spec.scale == "inv_sqrt_d":
        s = dot * (1.0 / math.sqrt(d))
    elif spec.scale == "lssa_log":
        factor = spec.d_factor if spec.d_factor is not None else math.log(d)
        s = dot * (factor * torch.log(n))
    elif spec.scale == "log_n_over_sqrt_d":
        s = dot * (torch.log(n) / math.sqrt(d))
    else:
        raise ValueError(f"unknown scale `{spec.scale}`")
    if spec.bias == "log_train_len":
        if spec.t_train is None:
            raise ValueError(f"variant `{spec.name}` needs t_train (write `sigmoid-bias:t_train=<value>`)")
        s = s - math.log(spec.t_train)
    elif spec.bias == "log_row_len":
        s = s - torch.log(n)

    if spec.running_max:
        s = s.masked_fill(future, float("-inf"))
        shift = s.amax(dim=-1, keepdim=True).detach()  # cancels in the l1 ratio
        f = _phi(spec.activation, s - shift)
    else:
        f = _phi(spec.activation, s.masked_fill(future, 0.0)).masked_fill(future, 0.0)

    if spec.norm == "l1":
        a = _guarded_div(f, f.abs().sum(dim=-1, keepdim=True))
    elif spec.norm == "none":
        a = f
    elif spec.norm == "div_n":
        a = f / n
    elif spec.norm == "div_len":
        a = f / float(t)
    else:
        raise ValueError(f"unknown normaliser `{spec.norm}`")

    if spec.transform != "none":
        if spec.transform == "inverse":
            a = -a
        else:
            # Rows N_i > 3: a - its mean over the visible keys, mask re-applied; rows 1..3 unchanged.
            mean = a.sum(dim=-1, keepdim=True) / n
            centred = (a - mean).masked_fill(future, 0.0)
            c = torch.where(n > 3, centred, a)
            a = _guarded_div(c, c.abs().sum(dim=-1, keepdim=True)) if spec.transform == "recentered_l1" else c

    if spec.reweight is not None:
        off = (n > OFFSET_FREE_ROWS).to(ct)  # attn_core::stage::reweight_offset
        relu_u = torch.relu(a * n - off)
        m = relu_u.amax(dim=-1, keepdim=True).detach()
        sharpened = m > 0
        ones = torch.ones_like(m)
        r = (relu_u / torch.where(sharpened, m, ones)) ** spec.reweight  # in [0, 1]: no overflow
        w_sum = r.sum(dim=-1, keepdim=True)
        a = torch.where(sharpened, r / torch.where(sharpened, w_sum, ones), a)  # empty rows keep a

    o = a @ v
    if spec.output_norm == "layer_norm":
        centred = o - o.mean(dim=-1, keepdim=True)
        var = centred.square().mean(dim=-1, keepdim=True)
        o = centred / torch.sqrt(var + LAYER_NORM_EPS)
    return o.to(out_dtype)
