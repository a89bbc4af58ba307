"""LSSA, LSSAR and the variants of the same form, written for PyTorch's FlexAttention.

FlexAttention computes ``softmax(score_mod(s))``. A stage-1 variant with an l1 normaliser over a
positive activation is ``a_ij = phi(s_ij) / sum_k phi(s_ik)`` = ``softmax_j(log phi(s_ij))``, so the
``score_mod`` ``log(phi(scale_i * <q'_i, k'_j> + b_i))`` on the (L2-normalised, for cosine scores)
``q`` and ``k`` with FlexAttention's own scale set to 1 is exactly that variant. Re-weighting
(``+rw<p>``, SPEC section 3) takes a second call: the first returns each row's log-sum-exp
``log Z_i``; the second's ``score_mod`` is ``p log(ReLU(N_i phi(s_ij) / Z_i - off_i))``, whose softmax
is ``ReLU(u)^p / sum ReLU(u)^p``. The row-dependent ``N_i`` comes from ``q_idx``.

What fits: the activations ``exp``, ``softplus`` and ``sigmoid`` (positive everywhere, so their log is
finite), an l1 normaliser, any scale and bias, dot or cosine scores, and re-weighting. Everything else
(the Table-1 transforms, no normaliser, ``/N``, ``/L``, relu's zeros, a layer norm on the output) is a
``ValueError`` naming why. One difference from SPEC: a row that re-weighting leaves empty (no key
above the row's mean: an exactly uniform row past row 3) falls back to its stage-1 weights in SPEC,
and to zeros here (FlexAttention gives a row whose scores are all ``-inf`` no weight). Random inputs
never have such rows.

FlexAttention has no backward on the CPU in PyTorch 2.11, so on the CPU this path is forward-only
(eager; inputs that require gradients are a ``ValueError`` pointing to the fused backend); on CUDA
it is compiled (``torch.compile(flex_attention)``) and differentiable.
"""

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ._reference import L2_NORM_EPS, OFFSET_FREE_ROWS, Spec

_ACTIVATIONS = {
    "exp": lambda s: s,  # log(exp(s))
    "softplus": lambda s: torch.log(torch.logaddexp(s, torch.zeros_like(s))),
    "sigmoid": lambda s: F.logsigmoid(s),
}


def unsupported_reason(spec: Spec):
    """Why ``spec`` does not fit FlexAttention's ``softmax(score_mod)`` form, or ``None``."""
    if spec.activation not in _ACTIVATIONS:
        return f"FlexAttention computes softmax(score_mod): the log of `{spec.activation}` is not finite everywhere"
    if spec.norm != "l1":
        return f"FlexAttention normalises every row to 1: the `{spec.norm}` normaliser does not"
    if spec.transform != "none":
        return f"the `{spec.transform}` transform is not a softmax of scores"
    if spec.output_norm != "none":
        return "a layer norm of the output is not part of FlexAttention"
    if spec.bias == "log_train_len" and spec.t_train is None:
        return f"variant `{spec.name}` needs t_train (write `sigmoid-bias:t_train=<value>`)"
    return None


def _flex():
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention


@functools.lru_cache(maxsize=None)
def _compiled():
    return torch.compile(_flex(), dynamic=False)


def _row_scale(spec: Spec, d: int, n: Tensor) -> Tensor:
    if spec.scale == "inv_sqrt_d":
        return torch.full_like(n, 1.0 / math.sqrt(d))
    if spec.scale == "lssa_log":
        factor = spec.d_factor if spec.d_factor is not None else math.log(d)
        return factor * torch.log(n)
    if spec.scale == "log_n_over_sqrt_d":
        return torch.log(n) / math.sqrt(d)
    raise ValueError(f"unknown scale `{spec.scale}`")


def _row_bias(spec: Spec, n: Tensor) -> Tensor:
    if spec.bias == "log_train_len":
        return torch.full_like(n, -math.log(spec.t_train))
    if spec.bias == "log_row_len":
        return -torch.log(n)
    return torch.zeros_like(n)


def attention(q: Tensor, k: Tensor, v: Tensor, spec: Spec) -> Tensor:
    """Causal attention of ``spec`` by FlexAttention; see the module docs for what fits."""
    reason = unsupported_reason(spec)
    if reason is not None:
        raise ValueError(f"lssa.attention(backend='flex'): `{spec.name}` does not fit: {reason}")
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            "lssa.attention(backend='flex'): this backend takes whole sequences with a key head per query head "
            f"(q {tuple(q.shape)}, k {tuple(k.shape)}); use backend='fused' or 'reference' for a KV cache or "
            "grouped-query attention"
        )
    on_cpu = q.device.type == "cpu"
    if on_cpu and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError(
            "lssa.attention(backend='flex'): FlexAttention has no backward on the CPU (PyTorch 2.11); "
            "use backend='fused' (the CPU kernels, forward and backward) or run under torch.no_grad()"
        )
    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask

    flex = _flex() if on_cpu else _compiled()
    t, d = q.shape[-2], q.shape[-1]
    if spec.scores == "cosine":
        q = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(L2_NORM_EPS)
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(L2_NORM_EPS)
    # Per-row constants, captured by the score_mods (indexed by q_idx: traceable, no Python branches).
    # In float32 at least (float64 inputs: float64), as FlexAttention computes its scores.
    n = torch.arange(1, t + 1, device=q.device, dtype=torch.promote_types(q.dtype, torch.float32))
    scale, bias = _row_scale(spec, d, n), _row_bias(spec, n)
    log_phi = _ACTIVATIONS[spec.activation]

    def stage1(score, b, h, q_idx, kv_idx):
        return log_phi(score * scale[q_idx] + bias[q_idx])

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    mask = create_block_mask(causal, None, None, t, t, device=q.device.type)
    if spec.reweight is None:
        return flex(q, k, v, score_mod=stage1, block_mask=mask, scale=1.0)
    _, aux = flex(q, k, v, score_mod=stage1, block_mask=mask, scale=1.0, return_aux=AuxRequest(lse=True))
    lse = aux.lse
    # An int, not a float: under torch.compile a captured Python float becomes a SymFloat, which
    # FlexAttention (torch 2.15) refuses among a score_mod's captured values; an int stays a SymInt.
    p = int(spec.reweight)
    off = (n > OFFSET_FREE_ROWS).to(n.dtype)  # attn_core::stage::reweight_offset: rows 1-3 have none

    def stage2(score, b, h, q_idx, kv_idx):
        a = torch.exp(log_phi(score * scale[q_idx] + bias[q_idx]) - lse[b, h, q_idx])
        return p * torch.log(torch.relu(n[q_idx] * a - off[q_idx]))

    return flex(q, k, v, score_mod=stage2, block_mask=mask, scale=1.0)
