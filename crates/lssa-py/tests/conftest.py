"""Shared helpers: deterministic inputs, the tolerance policy, outputs with their gradients."""

import warnings

import pytest
import torch

import lssa

EPS32 = torch.finfo(torch.float32).eps


def inputs(shape, seed, scale=1.0, dtype=torch.float32):
    """``q, k, v, g`` uniform in ``[-scale, scale]`` (``q``, ``k``) and ``[-1, 1]`` (``v``, ``g``)."""
    gen = torch.Generator().manual_seed(seed)

    def r(s):
        return ((torch.rand(shape, generator=gen, dtype=torch.float64) * 2 - 1) * s).to(dtype)

    return r(scale), r(scale), r(1.0), r(1.0)


def tolerance(naive_err, ref_scale, p):
    """crates/attn-kernels/tests/against_reference.rs's bound: ``factor`` times the naive float32 error
    plus a floor of 64 float32 ulps of the result's scale; both grow with the re-weighting power ``p``
    (its gradient carries ``p rho^(p-1)``, which multiplies any rounding of ``u`` by ``p``)."""
    factor, floor = (max(p / 4, 8.0), max(p / 4, 1.0)) if p else (2.0, 1.0)
    return factor * naive_err + floor * 64 * EPS32 * max(float(ref_scale), 1.0)


def with_grads(fn, q, k, v, g):
    """``fn(q, k, v)`` and its gradients for the upstream gradient ``g``, on fresh leaves."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), g.to(out.dtype))
    return out.detach(), grads


@pytest.fixture
def no_fallback():
    """Makes a fallback to the materialised path an error: the test must exercise the kernels."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", lssa.LssaFallbackWarning)
        yield


def pytest_report_header(config):
    """The CUDA kernel request of the session, as the extension reads ``LSSA_CUDA_KERNEL``."""
    try:
        kernel = lssa._lssa.cuda_kernel()
    except ValueError as e:
        kernel = f"refused: {e}"
    return f"lssa CUDA kernel: {kernel} (LSSA_CUDA_KERNEL; auto when unset)"
