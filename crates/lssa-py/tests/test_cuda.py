"""The CUDA path: float32, float16 and bfloat16 through the CUDA kernels against the float64 formulas,
strided inputs, torch's side streams, and a compiled model. Skipped on machines without a CUDA GPU.

Bounds (those of crates/attn-kernels/tests/cuda_emu.rs): relative Frobenius error 1e-4 in float32; in
16-bit storage 1.5 units of roundoff for the output and 3 for the gradients (6 for the l1-normalised
ReLU family, whose tiny row sums amplify the rounding of the stored output the backward reads). With
p = 1 the re-weighting's gradient jumps where N a = 1; an entry closer to that kink than the kernels'
rounding of N a is compared on the side the kernel put it (``kink_side_of``), not on float64's.
"""

import warnings

import pytest
import torch

import _formulas as formulas
import lssa
from conftest import with_grads

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

#: The session's kernel request, ``LSSA_CUDA_KERNEL`` as the extension reads it: ``auto``, or a version
#: of the kernel lab in a wheel built with the ``lab`` feature (``benches/gpu-session.sh ship1`` runs
#: this file under ``v7``). A lab version above v1 runs its tensor cores only and refuses float32 and
#: head dimensions other than 64 and 128, which ``auto`` runs on v1: those cases skip under it.
KERNEL = lssa._lssa.cuda_kernel()


def skip_unless_the_kernel_runs(dtype, d):
    if KERNEL not in ("auto", "v1") and (dtype == torch.float32 or d not in (64, 128)):
        pytest.skip(f"LSSA_CUDA_KERNEL={KERNEL} runs float16 / bfloat16 at d = 64 or 128 only")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Fused on CUDA: everything the CPU fuses except relu-seqlen's length divisor and relu-ln's layer norm.
CUDA_FUSED = [
    "softmax",
    "lssa",
    "lssa+rw1",
    "lssa+rw15",
    "lssa+rw64",
    "softmax+rw3",
    "relu-l1",
    "sigmoid-rowbias-l1+rw3",
    "gelu-l1",
]
#: The ``(T, d)`` shapes each variant is checked at in every dtype (``bench-cuda warm --python-suite``
#: reads this list and ``CUDA_FUSED`` to compile their modules ahead, ``benches/gpu-session.sh ship1``).
SHAPES = [(77, 64), (130, 128), (33, 48), (1, 64)]


def unit(dtype):
    return {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}[dtype]


def bounds(name, dtype):
    if dtype == torch.float32:
        return 1e-4, 1e-4
    ill = name.startswith("relu") and "-l1" in name
    return 1.5 * unit(dtype), (6.0 if ill else 3.0) * unit(dtype)


def rel_err(x, ref, floor=1e-300):
    """||x - ref|| / ||ref||, with ||ref|| taken as at least `floor`."""
    x = x.double().cpu()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - ref).norm() / ref.norm().clamp_min(floor)).item()


def cuda_inputs(shape, dtype, seed, name):
    gen = torch.Generator().manual_seed(seed)
    scale = 0.5 if name.startswith("softmax") or "sigmoid" in name else 0.8
    q, k = (torch.randn(shape, generator=gen) * scale for _ in range(2))
    v, g = (torch.randn(shape, generator=gen) for _ in range(2))
    return tuple(x.to(dtype).cuda() for x in (q, k, v, g))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", CUDA_FUSED)
@pytest.mark.parametrize("t,d", SHAPES)
def test_fused_cuda_matches_the_formulas(name, dtype, t, d, no_fallback):
    skip_unless_the_kernel_runs(dtype, d)
    assert lssa.is_fused(name, "cuda", dtype)
    q, k, v, g = cuda_inputs((2, 2, t, d), dtype, t + d, name)
    got, got_grads = with_grads(lambda a, b, c: lssa.attention(a, b, c, name), q, k, v, g)
    torch.cuda.synchronize()
    f64 = [x.double().cpu() for x in (q, k, v, g)]
    ref, ref_grads = with_grads(lambda a, b, c: formulas.attention(a, b, c, name), *f64)
    assert got.dtype == dtype and got.device == q.device
    bo, bg = bounds(name, dtype)
    assert rel_err(got, ref) <= bo, f"{name} {dtype} T={t} d={d}: output {rel_err(got, ref):.2e} > {bo:.2e}"
    # A gradient that is exactly zero in exact arithmetic (dq and dk at T = 1, where every weight is 1)
    # comes out of the float64 formulas as rounding noise (1e-17); below 1e-6 of the call's largest
    # gradient a reference counts as zero, and the error is measured against that floor.
    floor = 1e-6 * max(b.norm().item() for b in ref_grads)
    ref_grads = kink_side_of(got_grads, ref_grads, formulas.kink_jumps(*f64, name, KINK_MARGIN), floor)
    for what, a, b in zip(["dq", "dk", "dv"], got_grads, ref_grads):
        err = rel_err(a, b, floor)
        assert err <= bg, f"{name} {dtype} T={t} d={d}: {what} {err:.2e} > {bg:.2e}"


#: How far from the p = 1 re-weighting's kink (N a = 1) a kernel's rounding of N a may reach: v5 - v7
#: compute softplus's log by a polynomial of relative error 5.7e-5, so N a ~ 1 may be off by about
#: twice that (v1 - v4: about 1e-6).
KINK_MARGIN = 2.5e-4


def kink_side_of(got_grads, ref_grads, jumps, floor):
    """The float64 gradients with each entry closer to the kink than KINK_MARGIN on the side the
    kernel's gradients put it (``_formulas.kink_jumps``): where p = 1, the gradient jumps at the kink, and
    an entry within the kernel's rounding of it may land on either side. Chosen one entry at a time,
    largest jump first, where crossing lowers the summed relative error of dq and dk."""
    dq, dk, dv = ref_grads

    def err(q, k):
        return rel_err(got_grads[0], q, floor) ** 2 + rel_err(got_grads[1], k, floor) ** 2

    for jq, jk in sorted(jumps, key=lambda j: -(j[0].norm() + j[1].norm()).item()):
        if err(dq + jq, dk + jk) < err(dq, dk):
            dq, dk = dq + jq, dk + jk
    return dq, dk, dv


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_qkv_views_on_cuda(dtype, no_fallback):
    b, t, h, d = 2, 100, 3, 64
    skip_unless_the_kernel_runs(dtype, d)
    fused = torch.randn(b, t, 3, h, d, generator=torch.Generator().manual_seed(1)).to(dtype).cuda()
    q, k, v = fused.permute(2, 0, 3, 1, 4).unbind(0)
    got = lssa.attention(q, k, v, "lssa+rw15")
    want = lssa.attention(q.contiguous(), k.contiguous(), v.contiguous(), "lssa+rw15")
    assert rel_err(got, want.double().cpu()) <= 2 * unit(dtype)


def test_a_side_stream_is_ordered_around_the_kernels(no_fallback):
    # Inputs produced on a side stream and used at once; the output consumed on it right after.
    q, k, v, _ = cuda_inputs((4, 8, 2048, 64), torch.float16, 5, "lssa")
    want = lssa.attention(q, k, v, "lssa+rw15")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            q2, k2, v2 = q * 1.0, k * 1.0, v * 1.0  # queued on the side stream
            got = lssa.attention(q2, k2, v2, "lssa+rw15")
            got = got * 1.0  # consumed on the side stream
    side.synchronize()
    assert torch.equal(got, want)


def test_compiled_model_on_cuda(no_fallback):
    from test_compile import assert_close, run, two_layers

    skip_unless_the_kernel_runs(torch.float32, 64)
    model = two_layers().cuda()
    x = torch.randn(2, 64, 64, device="cuda")
    want, want_grads = run(model, x)
    got, got_grads = run(torch.compile(model, fullgraph=True), x)
    assert_close(got, want, "output")
    for a, b in zip(got_grads, want_grads):
        assert_close(a, b, "gradient")


def test_variants_without_a_cuda_kernel_fall_back_on_the_gpu():
    q, k, v, _ = cuda_inputs((1, 2, 40, 32), torch.float32, 3, "relu-seqlen")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lssa.LssaFallbackWarning)
        for name in ["relu-seqlen", "relu-ln", "recentered"]:
            assert not lssa.is_fused(name, "cuda", torch.float32)
            got = lssa.attention(q, k, v, name)
            ref = formulas.attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), name)
            assert rel_err(got, ref) <= 1e-4, name
        q, k, v, _ = cuda_inputs((1, 1, 20, 320), torch.float32, 4, "lssa")  # beyond the kernels' d <= 256
        got = lssa.attention(q, k, v, "lssa")
        ref = formulas.attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), "lssa")
        assert rel_err(got, ref) <= 1e-4
