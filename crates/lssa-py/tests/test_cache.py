"""Queries that continue a sequence (a KV cache: ``q`` holds the last ``T`` of ``T_k`` rows) and
grouped-query attention (``H`` query heads on ``H_kv`` key heads), on every backend that takes them,
against the float64 formulas of ``_formulas.py`` evaluated on the whole sequence with repeated key heads:
an independent check, since those formulas know neither."""

import warnings

import pytest
import torch

import _formulas as formulas
import lssa
from conftest import tolerance
from test_accuracy import FUSED

BY_LENGTH = ("relu-seqlen",)  # divides by the call's T_k: a continuing chunk is its own sequence there


def whole_sequence(name, q, k, v, group, a, dtype):
    """The formulas on the whole sequence (rows before ``a`` get zero upstream gradient): rows ``a..``
    of the output, and a function of the upstream gradient giving ``dq`` of those rows and ``dk``,
    ``dv`` summed over each key head's group."""
    q, k, v = (x.to(dtype).detach().requires_grad_() for x in (q, k, v))
    out = formulas.attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), name, dtype)
    return out[:, :, a:], (q, k, v)


def grads_of(out, leaves, g):
    return torch.autograd.grad(out, leaves, g.to(out.dtype))


@pytest.mark.parametrize("backend", ["auto", "reference"])
@pytest.mark.parametrize("name", [n for n in FUSED if not n.startswith(BY_LENGTH)])
def test_a_continuing_chunk_on_grouped_heads_matches_the_whole_sequence(name, backend):
    gen = torch.Generator().manual_seed(5)
    b, h, h_kv, t, d, a = 2, 4, 2, 45, 24, 31  # q: rows 31..45 of the 45-row sequence
    q = torch.rand(b, h, t, d, generator=gen, dtype=torch.float64) * 2 - 1
    k, v = (torch.rand(b, h_kv, t, d, generator=gen, dtype=torch.float64) * 2 - 1 for _ in range(2))
    g = torch.rand(b, h, t - a, d, generator=gen, dtype=torch.float64) * 2 - 1
    ref, leaves64 = whole_sequence(name, q, k, v, h // h_kv, a, torch.float64)
    ref_grads = grads_of(ref, leaves64, g)
    naive, leaves32 = whole_sequence(name, q, k, v, h // h_kv, a, torch.float32)
    naive_grads = grads_of(naive, leaves32, g)
    qc, kc, vc = (x.float().requires_grad_() for x in (q[:, :, a:], k, v))
    got = lssa.attention(qc, kc, vc, name, backend=backend)
    got_grads = torch.autograd.grad(got, (qc, kc, vc), g.float())
    assert got.shape == (b, h, t - a, d) and got_grads[1].shape == k.shape
    p = formulas.reweight_power(name)
    ref_grads = (ref_grads[0][:, :, a:], *ref_grads[1:])
    naive_grads = (naive_grads[0][:, :, a:], *naive_grads[1:])
    for what, x, want, nv in zip(["out", "dq", "dk", "dv"], (got, *got_grads), (ref, *ref_grads), (naive, *naive_grads)):
        want = want.detach()
        err = (x.double() - want).abs().max().item()
        naive_err = (nv.double() - want).abs().max().item()
        tol = tolerance(naive_err, want.abs().max(), p)
        assert err <= tol, f"{name} ({backend}): {what} error {err:.3e} > {tol:.3e} (naive f32 {naive_err:.3e})"


@pytest.mark.parametrize("name", ["lssa", "lssa+rw15", "softmax", "relu-seqlen+rw3"])
def test_decoding_token_by_token_equals_each_calls_reference(name, no_fallback):
    """One query row at a time against the growing cache, fused, equals the materialised version of
    the same calls (for every variant but relu-seqlen also the whole sequence's rows)."""
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, 30, 16, generator=gen)
    k, v = torch.randn(2, 1, 2, 30, 16, generator=gen).unbind(0)
    steps = [lssa.attention(q[:, :, r : r + 1], k[:, :, : r + 1], v[:, :, : r + 1], name) for r in range(30)]
    refs = [lssa.reference_attention(q[:, :, r : r + 1], k[:, :, : r + 1], v[:, :, : r + 1], name) for r in range(30)]
    decoded, by_call = torch.cat(steps, 2), torch.cat(refs, 2)
    assert (decoded - by_call).abs().max().item() < 1e-5
    whole = lssa.attention(q, k, v, name)
    differs = (decoded - whole).abs().max().item()
    if name.startswith(BY_LENGTH):
        assert differs > 1e-3
    else:
        assert differs < 1e-5


@pytest.mark.parametrize(
    "q_shape, k_shape, message",
    [
        ((1, 4, 8, 16), (1, 3, 8, 16), "H a multiple of H_kv"),
        ((1, 4, 8, 16), (1, 2, 7, 16), "T_k >= T"),
        ((1, 4, 8, 16), (2, 2, 8, 16), "must be (B, H_kv, T_k, d)"),
        ((1, 4, 8, 16), (1, 2, 8, 8), "must be (B, H_kv, T_k, d)"),
    ],
)
def test_keys_that_do_not_continue_the_queries_are_value_errors(q_shape, k_shape, message):
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    for fn in (lssa.attention, lssa.reference_attention):
        with pytest.raises(ValueError) as e:
            fn(q, k, k, "lssa+rw15")
        assert message in str(e.value)
    with pytest.raises(ValueError, match="v must have the"):
        lssa.attention(q, torch.randn(1, 2, 9, 16), torch.randn(1, 2, 8, 16))
    # The raw op checks too (a direct torch.ops call cannot read out of bounds).
    with pytest.raises(ValueError, match="k must be"):
        torch.ops.lssa.attention_fwd(q, k, k, "lssa", False)


def test_flex_refuses_a_cache_by_name():
    q, k = torch.randn(1, 2, 4, 16), torch.randn(1, 2, 9, 16)
    with pytest.raises(ValueError, match="whole sequences"):
        lssa.attention(q, k, k, "lssa", backend="flex")


@pytest.mark.parametrize("name", ["lssa", "lssa+rw15", "softmax+rw3"])
def test_eager_inference_skips_the_custom_op_and_gives_its_output(name, monkeypatch):
    """Without gradients, ``lssa.attention`` calls the kernels directly (a decoding step's fixed cost):
    the custom op's output bit for bit, on a cache long enough to run on the thread pool and on a short
    one that runs on the caller; with gradients it goes through the op."""
    gen = torch.Generator().manual_seed(9)
    for t_k in (40, 3000):
        q = torch.randn(1, 6, 1, 64, generator=gen)
        k, v = (torch.randn(1, 2, t_k, 64, generator=gen) for _ in range(2))
        want = torch.ops.lssa.attention_fwd(q, k, v, name, False)[0]
        ops = []
        real = lssa._ops.attention_fwd
        monkeypatch.setattr(lssa._ops, "attention_fwd", lambda *a: ops.append(a[3]) or real(*a))
        with torch.no_grad():
            got = lssa.attention(q, k, v, name)
            # The second call of a signature takes the short way (`lssa._INFERENCE`): the same output; and
            # so does a cache a token longer or shorter (the signature leaves out T_k).
            assert (name, "auto", q.shape, q.stride(), 1, 2, 64, 1, 1) in lssa._INFERENCE
            again = lssa.attention(q, k, v, name)
            size = len(lssa._INFERENCE)
            for grown in (k.shape[2] + 1, k.shape[2] - 1):
                kg, vg = (torch.randn(1, 2, grown, 64, generator=gen) for _ in range(2))
                want_g = torch.ops.lssa.attention_fwd(q, kg, vg, name, False)[0]
                assert torch.equal(lssa.attention(q, kg, vg, name), want_g) and len(lssa._INFERENCE) == size
            # What the signature leaves out still decides: another dtype, or the reference backend.
            reference = lssa.attention(q, k, v, name, backend="reference")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", lssa.LssaFallbackWarning)  # once per process: maybe seen already
                wide = lssa.attention(q.double(), k.double(), v.double(), name)
        assert ops == [] and torch.equal(got, want) and torch.equal(again, want), f"T_k = {t_k}"
        assert wide.dtype == torch.float64 and (wide - want).abs().max() < 1e-4 and not torch.equal(reference, want)
        qg = q.clone().requires_grad_()
        assert torch.equal(lssa.attention(qg, k, v, name).detach(), want) and ops == [name]
        monkeypatch.undo()
