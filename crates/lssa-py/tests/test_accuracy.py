"""``lssa.attention`` (fused CPU kernels, and the materialised fallback) against the float64 formulas of
``_formulas.py``, forward and gradients, with the tolerance policy of the Rust kernel tests: the error
against float64 may be at most a small multiple of the error of the same formulas run in float32."""

import warnings

import pytest
import torch

import _formulas as formulas
import lssa
from conftest import inputs, tolerance, with_grads

# Every variant the CPU kernels fuse (crates/attn-kernels/tests/against_reference.rs's list).
FUSED = [
    "softmax",
    "lssa",
    "lssa-exp",
    "softmax-logn",
    "softplus-l1",
    "relu-l1",
    "relu2-l1",
    "relu6-l1",
    "gelu-l1",
    "sigmoid-l1",
    "mish-l1",
    "exp-nonorm",
    "linear",
    "linear-l1",
    "sigmoid-bias:t_train=64",
    "sigmoid-rowbias",
    "sigmoid-rowbias-l1",
    "relu-seqlen",
    "relu-rowlen",
    "relu-ln",
    "lssa+rw1",
    "lssa+rw3",
    "lssa+rw15",
    "lssa+rw64",
    "softmax+rw3",
    "softmax+rw15",
    "sigmoid-rowbias-l1+rw3",
    "sigmoid-rowbias-l1+rw15",
    "relu-seqlen+rw3",
    "lssa:d_factor=4.0+rw15",
    "lssa-exp+rw15",
    "softmax-logn+rw15",
]

# Variants without a fused kernel: the Table-1 transforms, and re-weighting before relu-ln's layer norm.
NOT_FUSED = ["inverse", "recentered", "recentered-l1", "recentered+rw3", "relu-ln+rw3"]


def check_against_formulas(name, shape, seed, scale=1.0):
    """Forward and gradients of ``lssa.attention`` in float32 against the float64 formulas."""
    q, k, v, g = inputs(shape, seed, scale)
    q64, k64, v64 = q.double(), k.double(), v.double()
    ref, ref_grads = with_grads(lambda a, b, c: formulas.attention(a, b, c, name), q64, k64, v64, g)
    naive, naive_grads = with_grads(lambda a, b, c: formulas.attention(a, b, c, name, torch.float32), q, k, v, g)
    got, got_grads = with_grads(lambda a, b, c: lssa.attention(a, b, c, name), q, k, v, g)
    assert got.dtype == torch.float32 and got.shape == q.shape
    p = formulas.reweight_power(name)
    what = ["out", "dq", "dk", "dv"]
    for w, a, b, n in zip(what, (got, *got_grads), (ref, *ref_grads), (naive, *naive_grads)):
        err = (a.double() - b).abs().max().item()
        naive_err = (n.double() - b).abs().max().item()
        tol = tolerance(naive_err, b.abs().max(), p)
        case = f"{name} {shape} seed {seed} scale {scale}"
        assert err <= tol, f"{case}: {w} error {err:.3e} > {tol:.3e} (naive f32 {naive_err:.3e})"


def test_the_fused_list_is_what_the_kernels_fuse():
    for name in FUSED:
        assert lssa.is_fused(name), name
    for name in NOT_FUSED:
        assert not lssa.is_fused(name), name


@pytest.mark.parametrize("name", FUSED)
def test_every_fused_variant_matches_the_formulas(name, no_fallback):
    check_against_formulas(name, (1, 2, 53, 40), 7)


@pytest.mark.parametrize("name", FUSED)
def test_large_logits_and_near_uniform_rows(name, no_fallback):
    # |q|, |k| up to 4 at d = 32: dot products of hundreds. Then tiny scores, every key near the row
    # mean: re-weighting's hard case.
    check_against_formulas(name, (1, 1, 40, 32), 11, scale=4.0)
    check_against_formulas(name, (1, 1, 40, 32), 12, scale=1e-3)


@pytest.mark.parametrize("t,d", [(1, 64), (1, 8), (2, 8), (77, 64), (65, 64), (31, 72), (17, 128), (100, 40)])
@pytest.mark.parametrize("name", ["softmax", "lssa", "lssa+rw15", "relu-l1", "sigmoid-rowbias-l1+rw3"])
def test_lengths_and_head_dims_that_do_not_fit_the_tiles(name, t, d, no_fallback):
    check_against_formulas(name, (2, 3, t, d), 100 * t + d)


@pytest.mark.parametrize("p", [1, 3, 15, 64])
@pytest.mark.parametrize("stage1", ["lssa", "softmax"])
def test_reweighting_powers(stage1, p, no_fallback):
    check_against_formulas(f"{stage1}+rw{p}", (1, 2, 77, 64), 1000 + p)


def test_strided_views_of_a_fused_qkv_are_read_in_place(monkeypatch, no_fallback):
    """q, k, v sliced out of one (B, T, 3, H, d) projection: the kernels get the views' own pointers
    and strides (no copy), and the results equal those of contiguous copies, values and gradients."""
    b, t, h, d = 2, 77, 3, 32
    qkv = torch.randn(b, t, 3, h, d, generator=torch.Generator().manual_seed(3))
    seen = []
    real_forward = lssa._ops._lssa.forward

    def spy(*args):
        seen.append(args[5:8])  # the (pointer, strides) of q, k, v
        return real_forward(*args)

    monkeypatch.setattr(lssa._ops._lssa, "forward", spy)
    for name in ["lssa+rw15", "softmax", "relu-ln"]:
        fused = qkv.clone().requires_grad_()
        q, k, v = fused.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, H, T, d), strides (3*h*d*t, d, 3*h*d, 1)
        assert not q.is_contiguous()
        seen.clear()
        out = lssa.attention(q, k, v, name)
        assert seen == [tuple((x.data_ptr(), *x.stride()[:3]) for x in (q, k, v))]
        g = torch.randn_like(out)
        out.backward(g)

        copies = [x.detach().contiguous().requires_grad_() for x in (q, k, v)]
        want = lssa.attention(*copies, name)
        want.backward(g)
        assert torch.equal(out, want), name
        for i, c in enumerate(copies):
            assert torch.equal(fused.grad[:, :, i].transpose(1, 2), c.grad), name


def test_uniform_rows_fall_back_to_stage_one_weights(no_fallback):
    # Identical keys make every stage-1 row exactly uniform: with re-weighting every u_ij <= 0 past
    # row 3, so the weights stay a = 1/N (attn-core's choice): the output is the running mean of v.
    q = torch.randn(1, 1, 37, 16, generator=torch.Generator().manual_seed(5))
    k = torch.full((1, 1, 37, 16), 0.25)
    v = torch.randn(1, 1, 37, 16, generator=torch.Generator().manual_seed(6))
    running_mean = v.cumsum(2) / torch.arange(1, 38).view(1, 1, 37, 1)
    for name in ["lssa+rw15", "softmax+rw3", "lssa+rw1"]:
        got = lssa.attention(q, k, v, name)
        assert (got - running_mean).abs().max() < 1e-5, name


def test_relu_rows_without_a_positive_score_are_zero(no_fallback):
    # relu-l1 with every score negative: all-zero rows and zero gradients, never NaN.
    q = torch.ones(1, 1, 20, 8, requires_grad=True)
    k = torch.full((1, 1, 20, 8), -1.0, requires_grad=True)
    v = torch.randn(1, 1, 20, 8, requires_grad=True)
    out = lssa.attention(q, k, v, "relu-l1")
    out.sum().backward()
    assert torch.equal(out, torch.zeros_like(out))
    for x in (q, k, v):
        assert torch.equal(x.grad, torch.zeros_like(x))


def test_the_thread_count_changes_no_forward_bit(no_fallback):
    q, k, v, g = inputs((2, 4, 300, 64), 9)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, max(before, 2)):
            torch.set_num_threads(threads)
            results.append(with_grads(lambda a, b, c: lssa.attention(a, b, c, "lssa+rw15"), q, k, v, g))
    finally:
        torch.set_num_threads(before)
    (o1, g1), (o2, g2) = results
    assert torch.equal(o1, o2)  # one task per (head, query tile): the same arithmetic at any thread count
    for a, b in zip(g1, g2):  # the dq partials are split by thread count: only the summation order differs
        assert (a - b).abs().max() <= 1e-5 * max(a.abs().max().item(), 1.0)


def test_no_grad_calls_keep_no_backward_helper(monkeypatch):
    # The re-weighting helper (d + 1 floats per row) is kept only when autograd will need it.
    kept = []
    real_forward = lssa._ops._lssa.forward
    monkeypatch.setattr(lssa._ops._lssa, "forward", lambda *a: (kept.append(a[10] != 0), real_forward(*a))[1])
    q, k, v, _ = inputs((1, 2, 40, 16), 4)
    with torch.no_grad():
        lssa.attention(q, k, v, "lssa+rw15")
    lssa.attention(q, k, v, "lssa+rw15")  # inputs do not require gradients
    lssa.attention(q.requires_grad_(), k, v, "lssa+rw15")
    lssa.attention(q, k, v, "lssa")  # no re-weighting: nothing to keep
    assert kept == [False, False, True, False]


@pytest.mark.parametrize("name", FUSED + NOT_FUSED)
def test_the_materialised_fallback_matches_the_formulas_in_float64(name):
    """float64 runs the materialised path (with its one-time warning): every variant, fused or not,
    equals the formulas to float64 rounding, forward and gradients."""
    q, k, v, g = inputs((2, 2, 29, 24), 21, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lssa.LssaFallbackWarning)
        got, got_grads = with_grads(lambda a, b, c: lssa.attention(a, b, c, name), q, k, v, g)
    ref, ref_grads = with_grads(lambda a, b, c: formulas.attention(a, b, c, name), q, k, v, g)
    assert got.dtype == torch.float64
    for w, a, b in zip(["out", "dq", "dk", "dv"], (got, *got_grads), (ref, *ref_grads)):
        err = (a - b).abs().max().item()
        assert err <= 1e-10 * max(b.abs().max().item(), 1.0), f"{name}: {w} error {err:.3e}"


@pytest.mark.parametrize("name", ["recentered", "recentered-l1+rw3", "lssa+rw15", "relu-ln"])
def test_the_fallback_gradients_pass_gradcheck(name):
    q, k, v, _ = inputs((1, 2, 7, 5), 31, dtype=torch.float64)
    args = tuple(x.requires_grad_() for x in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: lssa.reference_attention(a, b, c, name), args)


def test_not_fused_variants_run_the_fallback_once_warned():
    q, k, v, _ = inputs((1, 2, 33, 16), 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = [lssa.attention(q, k, v, "recentered+rw3") for _ in range(3)]
    fallback = [w for w in caught if issubclass(w.category, lssa.LssaFallbackWarning)]
    # One warning per (variant, device, dtype) and process; another test may have shown it already.
    assert len(fallback) <= 1
    assert all("recentered" in str(w.message) and "materialised" in str(w.message) for w in fallback)
    assert fallback == [] or fallback[0].filename == __file__  # it points at the caller's line
    ref = formulas.attention(q, k, v, "recentered+rw3", torch.float64)
    assert (out[0].double() - ref).abs().max() < 1e-5
    assert torch.equal(out[0], out[2])


def test_half_precision_on_the_cpu_is_computed_in_float32():
    q, k, v, _ = inputs((1, 2, 33, 16), 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", lssa.LssaFallbackWarning)
        for dtype in (torch.float16, torch.bfloat16):
            got = lssa.attention(q.to(dtype), k.to(dtype), v.to(dtype), "lssa+rw15")
            assert got.dtype == dtype
            want = formulas.attention(q.to(dtype), k.to(dtype), v.to(dtype), "lssa+rw15")  # exact maths
            unit = torch.finfo(dtype).eps
            assert (got.double() - want).abs().max() <= 2 * unit  # the final rounding, and little more


def test_empty_batch_gives_an_empty_output():
    q = torch.randn(0, 2, 5, 8, requires_grad=True)
    out = lssa.attention(q, q, q, "lssa+rw15")
    assert out.shape == (0, 2, 5, 8)
    out.sum().backward()
    assert q.grad.shape == q.shape


def test_the_kink_jumps_are_the_gradient_across_the_rw1_kink(monkeypatch):
    # The inputs of test_cuda.py's lssa+rw1 case at T = 77, d = 64 in float16: one entry lies 1.6e-5
    # from the kink (N a = 1). Moving the kink by 2e-5 puts it on the other side; test_cuda.py's
    # allowance for such entries must account for exactly that jump, and for nothing in dv.
    t, d, name = 77, 64, "lssa+rw1"
    gen = torch.Generator().manual_seed(t + d)
    q, k = (torch.randn(2, 2, t, d, generator=gen) * 0.8 for _ in range(2))
    v, g = (torch.randn(2, 2, t, d, generator=gen) for _ in range(2))
    q, k, v, g = (x.to(torch.float16).double() for x in (q, k, v, g))

    def grads():
        return with_grads(lambda a, b, c: formulas.attention(a, b, c, name), q, k, v, g)[1]

    ref = grads()
    monkeypatch.setattr(formulas, "_reweight_offset", lambda n: 0.0 if n <= 3 else 1.0 + 2e-5)
    moved = grads()
    monkeypatch.undo()
    jumps = formulas.kink_jumps(q, k, v, g, name, 2e-5)
    assert len(jumps) == 1
    for w in range(2):
        before = ((moved[w] - ref[w]).norm() / ref[w].norm()).item()
        after = ((moved[w] - ref[w] - jumps[0][w]).norm() / ref[w].norm()).item()
        # what is left is the continuous change of moving every entry's threshold by 2e-5 (1e-4)
        assert before > 1e-2 and after < 0.02 * before, (w, before, after)
    assert ((moved[2] - ref[2]).norm() / ref[2].norm()).item() < 1e-4
    assert formulas.kink_jumps(q, k, v, g, "lssa+rw3", 1.0) == []
