"""The FlexAttention backend (``lssa.attention(..., backend="flex")``) against the float64 formulas
of ``_formulas.py``, on the CPU in eager mode (forward only: PyTorch's FlexAttention has no CPU
backward), and the backend choice. The CUDA half (compiled, with gradients) is in test_cuda.py's
reach only on a GPU; ``benches/gpu-session.sh`` runs it."""

import warnings

import pytest
import torch

import lssa
from _formulas import attention as formula

FITS = ["lssa", "lssa+rw15", "lssa+rw3", "softmax", "softmax+rw15", "sigmoid-l1", "softplus-l1",
        "sigmoid-rowbias-l1+rw15", "lssa-exp+rw15", "softmax-logn", "lssa:d_factor=4.0+rw15"]


def inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        # Eager FlexAttention warns that it materialises the scores (it does, on the CPU).
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.mark.parametrize("name", FITS)
def test_flex_matches_the_float64_formulas(name):
    q, k, v = inputs((2, 2, 37, 16), 5)
    got = lssa.attention(q, k, v, variant=name, backend="flex")
    want = formula(q, k, v, name)
    assert got.dtype == torch.float64
    assert torch.allclose(got, want, rtol=0, atol=1e-12), (got - want).abs().max()


def test_flex_in_float32_is_within_float32_rounding():
    q, k, v = inputs((1, 2, 64, 32), 6)
    got = lssa.attention(q.float(), k.float(), v.float(), variant="lssa+rw15", backend="flex")
    want = formula(q, k, v, "lssa+rw15")
    assert (got.double() - want).abs().max() < 1e-4


@pytest.mark.parametrize("name", ["relu-l1", "recentered", "exp-nonorm", "relu-ln", "relu-rowlen"])
def test_variants_of_another_form_are_refused_with_the_reason(name):
    q, k, v = inputs((1, 1, 8, 4), 7)
    with pytest.raises(ValueError, match="does not fit"):
        lssa.attention(q, k, v, variant=name, backend="flex")


def test_cpu_flex_refuses_gradients_and_points_to_the_fused_backend():
    q, k, v = inputs((1, 1, 8, 4), 8)
    q.requires_grad_(True)
    with pytest.raises(ValueError, match="no backward on the CPU.*backend='fused'"):
        lssa.attention(q, k, v, variant="lssa", backend="flex")
    with torch.no_grad():
        lssa.attention(q, k, v, variant="lssa", backend="flex")


def test_backends_agree_and_the_choice_is_stated():
    q, k, v = (x.float() for x in inputs((1, 2, 48, 16), 9))
    ref = lssa.attention(q, k, v, variant="lssa+rw15", backend="reference")
    for b in ("auto", "fused", "flex"):
        assert (lssa.attention(q, k, v, variant="lssa+rw15", backend=b) - ref).abs().max() < 1e-5, b
    assert lssa.backend_for("lssa+rw15") == "fused"
    assert lssa.backend_for("recentered") == "reference"
    assert lssa.backend_for("lssa", dtype=torch.float64) == "reference"
    with pytest.raises(ValueError, match="backend='fused'.*no fused kernel"):
        lssa.attention(q, k, v, variant="recentered", backend="fused")
    with pytest.raises(ValueError, match="backend must be one of"):
        lssa.attention(q, k, v, backend="triton")
