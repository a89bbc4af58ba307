"""The API's contract: variant names, what is fused, and a Python exception with a clear message for
every bad input, at the public functions and at the raw extension boundary (never a crash)."""

import pytest
import torch

import _formulas as formulas
import lssa
from lssa import _lssa


def qkv(shape=(1, 2, 8, 16), dtype=torch.float32):
    return tuple(torch.randn(shape, dtype=dtype) for _ in range(3))


def test_variants_are_the_stage1_presets_in_table_order():
    assert lssa.variants() == list(formulas.PRESETS)


def test_both_python_references_define_every_built_in_activation():
    # A new built-in in attn-core is listed by the extension; each reference must evaluate it.
    from lssa import _reference

    names = _lssa.activations()
    assert names[:2] == ["exp", "softplus"] and "identity" in names
    x = torch.linspace(-3, 3, 7, dtype=torch.float64)
    for name in names:
        assert torch.allclose(_reference._phi(name, x), formulas.phi(name, x), atol=1e-12), name


def test_the_cpu_buffers_a_long_call_keeps_can_be_freed():
    # B = 1, H = 4, T = 1024, d = 64: packed keys of 1 MiB and a backward's keys, values and partials,
    # each kept for the next call (from 256 KiB).
    q, k, v = (t.requires_grad_() for t in qkv((1, 4, 1024, 64)))
    lssa.attention(q, k, v, variant="lssa").sum().backward()
    assert lssa.release_cpu_buffers() >= 3 * (1 << 20)
    assert lssa.release_cpu_buffers() == 0


def test_every_preset_and_its_reweighted_form_has_a_canonical_name():
    for name in lssa.variants():
        if name == "sigmoid-bias":
            name = "sigmoid-bias:t_train=1024"
        assert lssa.canonical_name(name) == name
        assert lssa.canonical_name(name + "+rw15") == name + "+rw15"
    assert lssa.canonical_name("lssa:d_factor=4+rw15") == "lssa:d_factor=4.0+rw15"


def test_what_is_fused():
    assert lssa.is_fused("lssa+rw15")
    assert lssa.is_fused("softmax", "cpu", torch.float32)
    assert not lssa.is_fused("lssa", "cpu", torch.float64)
    assert not lssa.is_fused("lssa", "cpu", torch.float16)
    assert not lssa.is_fused("recentered")
    assert not lssa.is_fused("lssa", "meta")
    if not torch.cuda.is_available():
        assert not lssa.is_fused("lssa", "cuda", torch.float16)
    assert not lssa.is_fused("lssa", "cuda", torch.float16, head_dim=320)
    assert "head dimensions up to 256, got 320" in _lssa.not_fused_reason("lssa", "cuda", "float16", 320)
    assert "relu-seqlen) has no CUDA kernel" in _lssa.not_fused_reason("relu-seqlen", "cuda", "float32")
    with pytest.raises(ValueError, match="unknown attention variant"):
        lssa.is_fused("nonsense")


def test_the_kernels_decide_the_buffers_beside_the_output_and_the_module_holds_the_state():
    # Statistics: 4 floats a row (Z_i, max or sigma, m_i, W_i); re-weighting's helper, d + 1 floats,
    # only for a differentiated re-weighted forward on the CPU (SPEC: the backward's E_i sweep).
    assert _lssa.layout("lssa+rw15", "cpu", "float32", 64, True) == (4, 65)
    assert _lssa.layout("lssa+rw15", "cpu", "float32", 32, False) == (4, 0)
    assert _lssa.layout("lssa", "cpu", "float32", 64, True) == (4, 0)
    assert _lssa.layout("lssa+rw15", "cuda", "bfloat16", 64, True) == (4, 0)
    with pytest.raises(TypeError, match="float32"):
        _lssa.layout("lssa", "cpu", "float16", 64, True)
    with pytest.raises(ValueError, match="not fused"):
        _lssa.layout("recentered", "cpu", "float32", 64, True)
    # What the extension keeps between calls is the module's, not a process-wide static's.
    assert type(_lssa._state).__name__ == "State"
    q = torch.randn(1, 2, 5, 8, requires_grad=True)
    out, stats, aux = torch.ops.lssa.attention_fwd(q, q, q, "lssa+rw15", True)
    assert tuple(stats.shape) == (1, 2, 5, 4) and tuple(aux.shape) == (1, 2, 5, 9)
    assert tuple(torch.ops.lssa.attention_fwd(q, q, q, "lssa", True)[2].shape) == (0,)


@pytest.mark.parametrize(
    "name, message",
    [
        ("lsa", "unknown attention variant `lsa`; valid stage-1 names: softmax, inverse"),
        ("lssa+rw0", "re-weighting power p = 0 is out of range; need 1 <= p <= 1024"),
        ("lssa+rw2000", "re-weighting power p = 2000 is out of range"),
        ("lssa+w15", "expected `+rw<p>` after the stage-1 name"),
        ("lssa+rwx", "p must be a positive integer"),
        ("sigmoid-bias", "needs parameter `t_train`"),
        ("sigmoid-bias:t_train=0", "the training length must be >= 1"),
        ("lssa:t_train=5", "takes no parameter `t_train`"),
        ("lssa:d_factor=abc", "invalid value `abc` for `d_factor`: not a number"),
        ("lssa:d_factor=inf", "must be finite"),
    ],
)
def test_bad_variant_names_are_value_errors_with_attn_cores_message(name, message):
    q, k, v = qkv()
    for fn in (lssa.attention, lssa.reference_attention):
        with pytest.raises(ValueError) as e:
            fn(q, k, v, name)
        assert message in str(e.value)
    with pytest.raises(ValueError, match="unknown attention variant|out of range|rw|t_train|d_factor"):
        lssa.canonical_name(name)


def test_bad_inputs_raise_the_right_exception_with_a_clear_message():
    q, k, v = qkv()
    ints = torch.ones(1, 1, 4, 8, dtype=torch.long)
    k_columns = k.transpose(2, 3).contiguous().transpose(2, 3)  # k's values, rows not contiguous
    cases = [
        (TypeError, "q must be a torch.Tensor, got ndarray", lambda: lssa.attention(q.numpy(), k, v)),
        (TypeError, "variant must be a str", lambda: lssa.attention(q, k, v, 15)),
        (ValueError, "only causal attention is implemented", lambda: lssa.attention(q, k, v, causal=False)),
        (ValueError, "must be (B, H, T, d) tensors, got shapes (2, 8, 16)", lambda: lssa.attention(q[0], k[0], v[0])),
        (
            ValueError,
            "for q (B, H, T, d) = (1, 2, 8, 16), with H a multiple of H_kv (grouped-query attention) and T_k >= T",
            lambda: lssa.attention(q, k[:, :, :7], v),
        ),
        (ValueError, "k must be (B, H_kv, T_k, d) for q (B, H, T, d)", lambda: lssa.attention(q, k[..., :8], v)),
        (ValueError, "got (1, 3, 8, 16)", lambda: lssa.attention(q, torch.randn(1, 3, 8, 16), v)),
        (ValueError, "v must have the (B, H_kv, T_k) of k", lambda: lssa.attention(q, k, v[:, :1])),
        (ValueError, "T and d must be >= 1", lambda: lssa.attention(q[:, :, :0], k[:, :, :0], v[:, :, :0])),
        (TypeError, "must be floating-point tensors, got torch.int64", lambda: lssa.attention(ints, ints, ints)),
        (TypeError, "must have one dtype, got torch.float32, torch.float64", lambda: lssa.attention(q, k.double(), v)),
        (TypeError, "must be on one device, got cpu, meta", lambda: lssa.attention(q, k.to("meta"), v)),
        (ValueError, "the last dimension of k is not contiguous", lambda: lssa.attention(q, k_columns, v)),
    ]
    for exc, message, call in cases:
        with pytest.raises(exc) as e:
            call()
        assert message in str(e.value), (message, str(e.value))


def test_a_non_contiguous_last_dimension_says_what_to_do():
    q, k, v = qkv(shape=(1, 2, 16, 8))
    q = q.transpose(2, 3).contiguous().transpose(2, 3)  # same shape, column-major rows
    with pytest.raises(ValueError, match=r"pass q.contiguous\(\)"):
        lssa.attention(q, k, v)
    assert lssa.attention(q.contiguous(), k, v).shape == q.shape
    # The materialised reference takes any layout.
    assert lssa.reference_attention(q, k, v).shape == q.shape


def raw_call(**overrides):
    """One forward through the raw extension on valid CPU tensors, with some arguments replaced."""
    q, k, v = qkv()
    out, stats = torch.empty_like(q), torch.empty(1, 2, 8, 4)
    raw = lambda x: (x.data_ptr(), *x.stride()[:3])  # noqa: E731
    args = dict(
        variant="lssa+rw15", device="cpu", dtype="float32", shape=(1, 2, 8, 16), kv=(2, 8), q=raw(q), k=raw(k), v=raw(v),
        out=raw(out), stats=stats.data_ptr(), aux=0, stream=0, threads=1,
    )
    args.update(overrides)
    _lssa.forward(**args)
    return out


def test_the_raw_extension_refuses_what_it_cannot_run_with_python_exceptions():
    assert torch.isfinite(raw_call()).all()
    # A null `stats` on the CPU drops the statistics (eager inference): the same output, bit for bit.
    torch.manual_seed(3)
    dropped = raw_call(stats=0)
    torch.manual_seed(3)
    assert torch.equal(dropped, raw_call())
    cases = [
        (ValueError, "unknown attention variant", dict(variant="nope")),
        (TypeError, "the fused CPU kernels take float32 tensors, got float64", dict(dtype="float64")),
        (TypeError, "no fused kernels for device `mps`", dict(device="mps")),
        (ValueError, "every size must be >= 1, got (B, H, T, d) = (1, 2, 0, 16)", dict(shape=(1, 2, 0, 16))),
        # attn-kernels' own check (Params::check_kv), before any memory is read.
        (ValueError, "2 query heads cannot share 3 key heads: H must be a multiple of H_kv", dict(kv=(3, 8))),
        (ValueError, "8 query rows continue a sequence of only 7 keys: T_k must be >= T_q", dict(kv=(2, 7))),
        (ValueError, "`q` is a null pointer", dict(q=(0, 256, 128, 16))),
        (ValueError, "legacy default stream", dict(device="cuda", stream=0x1234)),
        (OverflowError, "", dict(shape=(1, 2, -8, 16))),
    ]
    for exc, message, over in cases:
        with pytest.raises(exc) as e:
            raw_call(**over)
        assert message in str(e.value), (message, str(e.value))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_the_cuda_entry_without_a_gpu_is_a_runtime_error():
    # The CUDA path refuses before it touches memory: no driver, or no NVRTC, said in the message.
    with pytest.raises(RuntimeError, match="CUDA"):
        raw_call(device="cuda")
    reason = _lssa.cuda_unavailable_reason()
    assert reason and "CUDA kernels cannot run" in reason


def test_fallback_warning_names_the_reason():
    q, k, v = qkv(dtype=torch.float64)
    lssa._warned.clear()
    with pytest.warns(lssa.LssaFallbackWarning, match="fused CPU kernels take float32 tensors, got float64"):
        lssa.attention(q, k, v, "lssa+rw3")
    q, k, v = qkv()
    with pytest.warns(lssa.LssaFallbackWarning, match="no fused CPU kernel: the Table-1 transforms"):
        lssa.attention(q, k, v, "inverse")
    with pytest.warns(lssa.LssaFallbackWarning, match="v to have the head dimension of q and k"):
        lssa.attention(q, k, torch.randn(1, 2, 8, 5), "lssa")


def test_a_value_head_dimension_of_its_own_runs_the_materialised_path():
    q, k, _ = qkv(dtype=torch.float64)
    v = torch.randn(1, 2, 8, 5, dtype=torch.float64)
    lssa._warned.clear()
    with pytest.warns(lssa.LssaFallbackWarning):
        got = lssa.attention(q, k, v, "lssa+rw15")
    assert got.shape == (1, 2, 8, 5)
    assert (got - formulas.attention(q, k, v, "lssa+rw15")).abs().max() < 1e-12


def test_the_ops_called_directly_check_what_keeps_the_kernels_in_bounds():
    q, k, v = qkv()
    fwd, bwd = torch.ops.lssa.attention_fwd, torch.ops.lssa.attention_bwd
    with pytest.raises(ValueError, match=r"k must be \(B, H_kv, T_k, d\)"):
        fwd(q, k[:, :, :4], v, "lssa", False)
    with pytest.raises(TypeError, match="v is torch.float64 on cpu, q is torch.float32"):
        fwd(q, k, v.double(), "lssa", False)
    with pytest.raises(ValueError, match="every size >= 1"):
        fwd(q[:, :, :0], k[:, :, :0], v[:, :, :0], "lssa", False)
    out, stats, aux = fwd(q, k, v, "lssa+rw15", True)
    assert stats.shape == (1, 2, 8, 4) and aux.shape == (1, 2, 8, 17)
    with pytest.raises(ValueError, match="grad must have the shape of q"):
        bwd(out[:, :1], q, k, v, out, stats, aux, "lssa+rw15")
    with pytest.raises(ValueError, match=r"stats must be float32 of shape \(1, 2, 8, 4\)"):
        bwd(out, q, k, v, out, stats[:, :, :4], aux, "lssa+rw15")
    with pytest.raises(ValueError, match="aux must be float32 of shape"):
        bwd(out, q, k, v, out, stats, aux[..., :3], "lssa+rw15")
    dq, dk, dv = bwd(torch.ones_like(out), q, k, v, out, stats, aux, "lssa+rw15")
    assert dq.shape == dk.shape == dv.shape == q.shape


def test_argument_checks_run_once_per_signature_and_still_refuse_what_they_refused():
    """``lssa.attention`` checks a (shapes, strides, dtypes, devices, arguments) signature once; a call
    that differs in any of them is checked again, so a bad call is refused after a good one of the
    same shapes."""
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    with torch.no_grad():
        lssa.attention(q, k, k, "lssa")
        lssa.attention(q, k, k, "lssa")
        with pytest.raises(ValueError, match="causal"):
            lssa.attention(q, k, k, "lssa", causal=False)
        with pytest.raises(TypeError, match="one dtype"):
            lssa.attention(q, k.double(), k, "lssa")
        with pytest.raises(ValueError, match="not contiguous"):
            lssa.attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), k, "lssa")
        with pytest.raises(TypeError, match="variant must be a str"):
            lssa.attention(q, k, k, ["lssa"])
        # The short way of a known inference signature leaves the cache's length out: keys shorter than
        # the queries, or values of another length, are still refused after good calls.
        with pytest.raises(ValueError, match="T_k >= T"):
            lssa.attention(q, k[:, :, :2], k[:, :, :2], "lssa")
        with pytest.raises(ValueError, match="v must have the"):
            lssa.attention(q, k, torch.randn(1, 2, 4, 8), "lssa")
        with pytest.raises(ValueError, match="k must be"):
            lssa.attention(q, torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), "lssa")
