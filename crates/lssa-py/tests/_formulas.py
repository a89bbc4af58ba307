"""The attention variants written again from SPEC's formulas (docs/SPEC.md sections 2-4), row by row.

This is the tests' ground truth, deliberately independent of the package: its own table of the
stage-1 presets (SPEC section 4), its own activations (the spec's closed forms, not
torch.nn.functional), one row at a time as the spec states it, differentiable by autograd. Evaluated
in float64 it is the reference; evaluated in float32 it is the "naive float32 implementation" whose
error sets the tolerance (the policy of crates/attn-kernels/tests/against_reference.rs).

    s_ij = scale_i <q'_i, k'_j> + b_i        (q', k' = x / max(||x||, 1e-12) for cosine scores)
    f_ij = phi(s_ij)                          (phi(s_ij - max_j s_ij) for exp under l1)
    a_i  = transform(norm_i(f_i))
    u_ij = N_i a_ij - off_i,  off_i = [N_i > 3];  r_ij = (ReLU(u_ij) / m_i)^p,  m_i = max_j ReLU(u_ij)
    w_ij = r_ij / sum_j r_ij  (w = a when m_i = 0);  o_i = sum_j w_ij v_j  (relu-ln: layer norm of o_i)
"""

import math
from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

import torch
from torch import Tensor


@dataclass(frozen=True)
class Stage1:
    act: str
    cosine: bool = False
    scale: str = "1/sqrt(d)"  # or "ln(d) ln(N)" (LSSA), "ln(N)/sqrt(d)" (length scale only)
    bias: str = "0"  # or "-ln(T_train)", "-ln(N)"
    norm: str = "l1"  # or "none", "/N", "/L"
    transform: str = "none"  # or "inverse", "recentered", "recentered-l1"
    layer_norm: bool = False


SOFTMAX = Stage1("exp")
PRESETS = {
    "softmax": SOFTMAX,
    "inverse": replace(SOFTMAX, transform="inverse"),
    "recentered": replace(SOFTMAX, transform="recentered"),
    "recentered-l1": replace(SOFTMAX, transform="recentered-l1"),
    "linear": Stage1("identity", norm="none"),
    "exp-nonorm": Stage1("exp", norm="none"),
    "linear-l1": Stage1("identity"),
    "relu-l1": Stage1("relu"),
    "relu2-l1": Stage1("relu2"),
    "relu6-l1": Stage1("relu6"),
    "gelu-l1": Stage1("gelu"),
    "sigmoid-l1": Stage1("sigmoid"),
    "softplus-l1": Stage1("softplus"),
    "mish-l1": Stage1("mish"),
    "sigmoid-bias": Stage1("sigmoid", norm="none", bias="-ln(T_train)"),
    "sigmoid-rowbias": Stage1("sigmoid", norm="none", bias="-ln(N)"),
    "sigmoid-rowbias-l1": Stage1("sigmoid", bias="-ln(N)"),
    "relu-seqlen": Stage1("relu", norm="/L"),
    "relu-rowlen": Stage1("relu", norm="/N"),
    "relu-ln": Stage1("relu", norm="none", layer_norm=True),
    "lssa": Stage1("softplus", cosine=True, scale="ln(d) ln(N)"),
    "lssa-exp": Stage1("exp", cosine=True, scale="ln(d) ln(N)"),
    "softmax-logn": Stage1("exp", scale="ln(N)/sqrt(d)"),
}


def phi(name: str, x: Tensor) -> Tensor:
    """The activations in SPEC's closed forms."""
    if name == "exp":
        return torch.exp(x)
    if name == "softplus":
        return torch.clamp(x, min=0) + torch.log1p(torch.exp(-torch.abs(x)))
    if name == "relu":
        return torch.clamp(x, min=0)
    if name == "relu2":
        return torch.clamp(x, min=0) ** 2
    if name == "relu6":
        return torch.clamp(torch.clamp(x, min=0), max=6)
    if name == "gelu":
        return x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    if name == "sigmoid":
        return 1 / (1 + torch.exp(-x))
    if name == "mish":
        return x * torch.tanh(torch.clamp(x, min=0) + torch.log1p(torch.exp(-torch.abs(x))))
    if name == "identity":
        return x
    raise AssertionError(name)


def parse(name: str):
    """``(stage1, p, t_train, d_factor)`` of the names the tests use."""
    head, _, rw = name.partition("+rw")
    base, _, params = head.partition(":")
    kv = dict(item.split("=") for item in params.split(",")) if params else {}
    return PRESETS[base], (int(rw) if rw else None), int(kv.get("t_train", 0)) or None, (
        float(kv["d_factor"]) if "d_factor" in kv else None
    )


def attention(q: Tensor, k: Tensor, v: Tensor, name: str, dtype: torch.dtype = torch.float64) -> Tensor:
    """Causal attention of the variant ``name`` on ``(B, H, T, d)`` tensors, computed in ``dtype``."""
    s1, p, t_train, d_factor = parse(name)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    rows = []
    for i, a in enumerate(_stage1_rows(q, k, s1, t_train, d_factor)):
        n = i + 1
        if p is not None:
            u = torch.clamp(n * a - _reweight_offset(n), min=0)
            m = u.amax(-1, keepdim=True).detach()
            ok = m > 0
            r = (u / torch.where(ok, m, torch.ones_like(m))) ** p
            r_sum = r.sum(-1, keepdim=True)
            w = torch.where(ok, r / torch.where(ok, r_sum, torch.ones_like(r_sum)), a)
        else:
            w = a
        o = (w.unsqueeze(-1) * v[:, :, :n, :]).sum(-2)  # (B, H, d_v)
        if s1.layer_norm:
            mu = o.mean(-1, keepdim=True)
            var = ((o - mu) ** 2).mean(-1, keepdim=True)
            o = (o - mu) / torch.sqrt(var + 1e-5)
        rows.append(o)
    return torch.stack(rows, dim=2)


def kink_jumps(q: Tensor, k: Tensor, v: Tensor, g: Tensor, name: str, margin: float) -> List[Tuple[Tensor, Tensor]]:
    """The jumps of the gradient at the re-weighting's kink, for p = 1.

    With p = 1, ``w_ij = u_ij / sum_l u_il`` with ``u = ReLU(N_i a_ij - off)`` (``off`` = 1, or 0 in the
    first three rows): the output is continuous where an entry crosses ``N_i a_ij = off``, but ``dw/da``
    jumps there, so dq and dk jump by ``dL/du_ij * N_i * grad(a_ij)`` (dv does not move). A kernel
    whose rounding of ``N_i a_ij`` exceeds an entry's distance to the kink may return the gradient of
    either side. For every entry closer than ``margin`` (in float64, on the inputs as given) this
    returns the change of ``(dq, dk)`` of the loss ``sum(o * g)`` when that entry crosses to the side
    the inputs do not put it on. Empty for other variants."""
    s1, p, t_train, d_factor = parse(name)
    if p != 1:
        return []
    q, k, v, g = (x.detach().double() for x in (q, k, v, g))
    with torch.no_grad():
        o = attention(q, k, v, name)
    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    jumps = []
    for i, a in enumerate(_stage1_rows(q, k, s1, t_train, d_factor)):
        n = i + 1
        x = n * a.detach() - _reweight_offset(n)
        z = torch.clamp(x, min=0).sum(-1)  # (B, H): the row's sum of u
        for b, h, j in (x.abs() < margin).nonzero().tolist():
            if z[b, h] <= 0:
                continue  # no entry of the row above the kink: w falls back to a, continuously
            dl_du = (g[b, h, i] * (v[b, h, j] - o[b, h, i])).sum() / z[b, h]
            dq, dk = torch.autograd.grad(a[b, h, j], (q, k), retain_graph=True)
            side = -1.0 if x[b, h, j] > 0 else 1.0  # active in float64: the other side drops the term
            jumps.append((side * n * dl_du * dq, side * n * dl_du * dk))
    return jumps


def _reweight_offset(n: int) -> float:
    return 0.0 if n <= 3 else 1.0


def _stage1_rows(q: Tensor, k: Tensor, s1, t_train, d_factor):
    """The stage-1 weights ``a_i`` (B, H, N_i) of each row i, in the inputs' dtype."""
    t, d = q.shape[2], q.shape[3]
    if s1.cosine:
        q = q / torch.clamp(torch.sqrt((q * q).sum(-1, keepdim=True)), min=1e-12)
        k = k / torch.clamp(torch.sqrt((k * k).sum(-1, keepdim=True)), min=1e-12)
    for i in range(t):
        n = i + 1  # N_i: row i (1-based) sees keys 1..i
        dots = (q[:, :, i : i + 1, :] * k[:, :, :n, :]).sum(-1)  # (B, H, N)
        if s1.scale == "1/sqrt(d)":
            scale = 1 / math.sqrt(d)
        elif s1.scale == "ln(N)/sqrt(d)":
            scale = math.log(n) / math.sqrt(d)
        else:  # LSSA: ln(d) ln(N_i), the ln(d) replaceable by d_factor
            scale = (d_factor if d_factor is not None else math.log(d)) * math.log(n)
        bias = {"0": 0.0, "-ln(T_train)": -math.log(t_train or 1), "-ln(N)": -math.log(n)}[s1.bias]
        s = scale * dots + bias
        if s1.act == "exp" and s1.norm == "l1":
            s = s - s.amax(-1, keepdim=True).detach()  # cancels in the ratio
        f = phi(s1.act, s)
        if s1.norm == "l1":
            z = f.abs().sum(-1, keepdim=True)
            a = torch.where(z > 0, f / torch.where(z > 0, z, torch.ones_like(z)), torch.zeros_like(f))
        elif s1.norm == "none":
            a = f
        elif s1.norm == "/N":
            a = f / n
        else:  # "/L": the length of the whole sequence
            a = f / t
        if s1.transform == "inverse":
            a = -a
        elif s1.transform.startswith("recentered") and n > 3:
            a = a - a.mean(-1, keepdim=True)
            if s1.transform == "recentered-l1":
                c = a.abs().sum(-1, keepdim=True)
                a = torch.where(c > 0, a / torch.where(c > 0, c, torch.ones_like(c)), torch.zeros_like(a))
        yield a


def reweight_power(name: str) -> Optional[int]:
    return parse(name)[1]
