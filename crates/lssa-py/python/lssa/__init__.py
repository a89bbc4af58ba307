"""Softplus attention with re-weighting (LSSA / LSSAR) and its baselines, as a fused PyTorch op.

    import lssa
    y = lssa.attention(q, k, v, variant="lssa+rw15")   # where you called F.scaled_dot_product_attention

``q`` is ``(B, H, T, d)``, ``k`` and ``v`` are ``(B, H_kv, T_k, d)``, attention is causal: grouped-query
attention (``H`` a multiple of ``H_kv``, keys read without copies) and queries that continue a sequence
(``q`` holds its last ``T <= T_k`` rows: a decoding step against a KV cache, a chunk of a prefill) work
on the fused and reference backends (``flex`` refuses them). ``lssa.hf`` plugs the variants into
Hugging Face transformers. Any variant name that attn-core parses works: a stage-1 preset of :func:`variants` (``softmax``, ``lssa``, the paper's Table 1-4 baselines),
optionally with parameters and re-weighting, ``<stage1>[:<key>=<value>,...][+rw<p>]`` (``GRAMMAR``);
``lssa+rw15`` is LSSAR, and post-hoc re-weighting of an LSSA model is just ``lssa+rw<p>`` at inference.

Backends (``backend=``): ``auto`` (fused where a kernel exists, else the reference), ``fused``,
``flex`` (PyTorch's FlexAttention, for the variants of its form) and ``reference``; see
:func:`attention` and :func:`backend_for`.

Devices and dtypes: CPU float32 runs the fused CPU kernels (SIMD, multi-threaded with torch's thread
count), CUDA float32 / float16 / bfloat16 the CUDA kernels (compiled at first use by NVRTC, on the
device's default stream). Every other case (a variant without a fused kernel such as ``recentered``,
float64, half precision on the CPU, another device, CUDA without NVRTC) runs
:func:`reference_attention`, the materialised PyTorch version, with a one-time warning. Neither path
allocates anything ``T x T`` except that fallback.

Autograd, ``torch.compile(fullgraph=True)`` and ``torch.export`` work through the ops
``torch.ops.lssa.attention_fwd`` / ``attention_bwd`` (see ``lssa._ops``). Errors are Python
exceptions: ``ValueError`` for shapes, layouts and variant names, ``TypeError`` for dtypes and devices.
"""

import functools
import os
import warnings
from typing import List, Tuple

import torch
from torch import Tensor

from . import _flex
from . import _lssa
from . import _ops
from . import _reference
from ._reference import Spec

try:
    from importlib.metadata import PackageNotFoundError, version as _version

    __version__ = _version("lssa")
except (ImportError, PackageNotFoundError):  # pragma: no cover - running from a source tree
    __version__ = "0+unknown"

__all__ = [
    "attention",
    "reference_attention",
    "variants",
    "release_cpu_buffers",
    "is_fused",
    "backend_for",
    "BACKENDS",
    "canonical_name",
    "GRAMMAR",
    "LssaFallbackWarning",
]

#: The variant-name grammar (attn-core's).
GRAMMAR: str = _lssa.GRAMMAR

#: The values of ``attention(..., backend=...)``.
BACKENDS = ("auto", "fused", "flex", "reference")


class LssaFallbackWarning(UserWarning):
    """``lssa.attention`` ran the materialised PyTorch version instead of a fused kernel (once per case)."""


def _point_at_torch_nvrtc() -> None:
    # The CUDA kernels are compiled by NVRTC 13 at first use; torch's CUDA 13 wheels ship it in
    # site-packages/nvidia/cu13/lib. Tell the kernels (LSSA_NVRTC_DIR) unless the user already did.
    if "LSSA_NVRTC_DIR" in os.environ:
        return
    lib = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "cu13", "lib")
    if os.path.exists(os.path.join(lib, "libnvrtc.so.13")):
        os.environ["LSSA_NVRTC_DIR"] = lib


_point_at_torch_nvrtc()


def variants() -> List[str]:
    """The stage-1 preset names (SPEC section 4), in table order. Each takes ``+rw<p>`` (re-weighting,
    ``1 <= p <= 1024``); ``lssa`` takes ``d_factor=<float>`` and ``sigmoid-bias`` needs
    ``t_train=<int>`` (see ``GRAMMAR``)."""
    return list(_lssa.variants())


def release_cpu_buffers() -> int:
    """Frees the buffers the CPU kernels keep from one call to the next and returns their size in
    bytes. A long call's packed keys and values (and a backward's partial sums) are kept, at most
    96 MiB in all, because a fresh block's pages are mapped in again by every call; the next call
    after this allocates afresh."""
    return int(_lssa.release_cpu_buffers())


def canonical_name(variant: str) -> str:
    """The variant's canonical name; ``ValueError`` (attn-core's message) for a name it rejects."""
    return _lssa.canonical(variant)


def is_fused(variant: str, device="cpu", dtype: torch.dtype = torch.float32, head_dim: int = 64) -> bool:
    """Whether :func:`attention` runs ``variant`` through a fused kernel for tensors on ``device`` of
    ``dtype`` with heads of ``head_dim`` (else it falls back to :func:`reference_attention`).
    ``ValueError`` for a bad name."""
    device_type = torch.device(device).type
    return _lssa.not_fused_reason(variant, device_type, _ops.dtype_name(dtype), head_dim) is None


# _plan, _spec and _warn_fallback below call into Rust or warn, which torch.compile cannot trace: marked
# as constant results, they run once while a graph is traced (so does the one-time warning) and the
# graph keeps their values. Eager calls hit the lru_caches (a few hundred nanoseconds).


@functools.lru_cache(maxsize=256)
def _plan_cached(variant: str, device_type: str, dtype: torch.dtype) -> Tuple[str, str]:
    try:
        reason = _lssa.not_fused_reason(variant, device_type, _ops.dtype_name(dtype))
    except ValueError as e:
        return str(e), ""
    return "", "" if reason is None else reason


@torch.compiler.assume_constant_result
def _plan(variant: str, device_type: str, dtype: torch.dtype) -> Tuple[str, str]:
    """``(error, reason)``: attn-core's message for a name it rejects, and why ``variant`` does not run
    fused there ("" when it does). It returns the error rather than raising it: an exception inside a
    constant-result function is an internal error to torch.compile, one raised by the caller is not."""
    return _plan_cached(variant, device_type, dtype)


@functools.lru_cache(maxsize=256)
def _spec_cached(variant: str) -> Tuple:
    d = _lssa.describe(variant)
    return tuple(d[f] for f in Spec._fields)


@torch.compiler.assume_constant_result
def _spec(variant: str) -> Tuple:
    """The variant's parts (a tuple of ``Spec``'s fields); ValueError for a bad name."""
    return _spec_cached(variant)


_warned = set()


@torch.compiler.assume_constant_result
def _warn_fallback(variant: str, device_type: str, dtype: torch.dtype, reason: str) -> bool:
    key = (variant, device_type, dtype, reason)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"lssa.attention: `{variant}` on {device_type} {_ops.dtype_name(dtype)} runs the materialised PyTorch "
            f"version (O(T^2) memory, slower): {reason}. This warning is shown once.",
            LssaFallbackWarning,
            stacklevel=3,
        )
    return True


def _check(q: Tensor, k: Tensor, v: Tensor, variant: str, causal: bool, rows_contiguous: bool) -> None:
    """The input checks shared by both paths (plain Python on shapes, so torch.compile traces them)."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor):
            raise TypeError(f"lssa.attention: {name} must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(variant, str):
        raise TypeError(f"lssa.attention: variant must be a str such as 'lssa+rw15', got {type(variant).__name__}")
    if causal is not True:
        raise ValueError(
            "lssa.attention: only causal attention is implemented (causal=True): every variant is defined on "
            "causal rows (row i sees keys j <= i, and N_i = i enters its scale, bias and re-weighting)"
        )
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"lssa.attention: q, k, v must be (B, H, T, d) tensors, got shapes {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    (b, h, t, d), (kb, h_kv, t_k, kd) = q.shape, k.shape
    if kb != b or kd != d or h_kv == 0 or h % h_kv or t_k < t:
        raise ValueError(
            f"lssa.attention: k must be (B, H_kv, T_k, d) for q (B, H, T, d) = {tuple(q.shape)}, with H a multiple "
            f"of H_kv (grouped-query attention) and T_k >= T (q holds the last T rows of the T_k-long sequence), "
            f"got {tuple(k.shape)}"
        )
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(
            f"lssa.attention: v must have the (B, H_kv, T_k) of k: k is {tuple(k.shape)}, v is {tuple(v.shape)}"
        )
    if q.shape[2] == 0 or q.shape[3] == 0 or v.shape[3] == 0:
        raise ValueError(
            f"lssa.attention: T and d must be >= 1, got q {tuple(q.shape)}, v {tuple(v.shape)}"
        )
    if not (q.dtype.is_floating_point and k.dtype.is_floating_point and v.dtype.is_floating_point):
        raise TypeError(f"lssa.attention: q, k, v must be floating-point tensors, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"lssa.attention: q, k, v must have one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise TypeError(f"lssa.attention: q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if rows_contiguous:
        for name, x in (("q", q), ("k", k), ("v", v)):
            if x.shape[-1] > 1 and x.stride(-1) != 1:
                raise ValueError(
                    f"lssa.attention: the last dimension of {name} is not contiguous (strides {tuple(x.stride())}): "
                    f"the kernels read each row as d contiguous elements; pass {name}.contiguous() (other strides, "
                    f"such as slices of a fused qkv projection, are read as they are, without a copy)"
                )


_CHECKED: set = set()

_F32 = torch.float32

#: Signatures of CPU float32 calls in eager inference that ran the kernels through
#: ``_ops.attention_inference``: checked, with a fused kernel. :func:`attention` sends a call of such a
#: signature there before anything else. A signature is everything the general path decides on but
#: the cache's length: the variant, the backend, ``q``'s shape and strides, ``k``'s batch, key heads
#: and head dimension, and the last strides of ``k`` and ``v``, for ``v`` of ``k``'s shape and ``T_k >=
#: T`` (checked each call). So a decoding step whose cache grew by a token keeps the short way, where
#: the general path's checks and dispatch took 25 of its 55 us a call on a Zen 1 EPYC (SDPA's whole
#: call: 18 us).
_INFERENCE: set = set()


def _check_once(q: Tensor, k: Tensor, v: Tensor, variant: str, causal: bool, rows_contiguous: bool) -> None:
    """:func:`_check`, once per signature (shapes, strides, dtypes, devices and the other arguments) of
    plain tensors in eager mode: a decoding step repeats one signature per layer and cache length,
    and the lookup costs 1.3 us against the checks' 3 us."""
    if torch.compiler.is_compiling() or not (_ops.plain_tensors(q, k, v) and isinstance(variant, str)):
        return _check(q, k, v, variant, causal, rows_contiguous)
    key = (
        q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype,
        q.device, k.device, v.device, variant, causal, rows_contiguous,
    )
    if key in _CHECKED:
        return None
    _check(q, k, v, variant, causal, rows_contiguous)
    _remember(_CHECKED, key)
    return None


def _remember(seen: set, key) -> None:
    """Adds ``key`` to ``seen`` (``_CHECKED``, ``_INFERENCE``), which is bounded: shapes that never
    repeat must not grow it forever."""
    if len(seen) >= 4096:
        seen.clear()
    seen.add(key)


def backend_for(variant: str, device="cpu", dtype: torch.dtype = torch.float32, head_dim: int = 64) -> str:
    """Which backend ``attention(..., backend="auto")`` runs ``variant`` on for tensors on ``device`` of
    ``dtype`` with heads of ``head_dim``: ``"fused"`` where a fused kernel exists, else ``"reference"``.
    FlexAttention (``"flex"``) is never chosen by ``auto`` until a GPU table measured by
    ``benches/gpu-session.sh`` shows it faster there (on the CPU the fused kernels are 1.9-2.4x faster
    than compiled FlexAttention's forward, ``docs/bench/kernels-cpu.md``). ``ValueError`` for a bad name."""
    return "fused" if is_fused(variant, device, dtype, head_dim) else "reference"


def attention(
    q: Tensor, k: Tensor, v: Tensor, variant: str = "lssa+rw15", causal: bool = True, backend: str = "auto"
) -> Tensor:
    """Causal attention of ``variant``: the output ``(B, H, T, d_v)`` of ``(B, H, T, d)`` queries on
    ``(B, H_kv, T_k, d)`` keys and ``(B, H_kv, T_k, d_v)`` values. ``H`` a multiple of ``H_kv``
    (grouped-query attention: query head ``h`` reads key head ``h // (H // H_kv)``); ``T_k >= T``: the
    queries are the last ``T`` rows of the causal sequence of ``T_k`` keys, so query row ``r`` sees keys
    ``0 .. T_k - T + r`` and its ``N`` (the LSSA scale, re-weighting's offset) is ``T_k - T + r + 1``,
    exactly as that row of the whole sequence. Decoding one token against a cache is ``T = 1``.

    ``backend``: ``"auto"`` (the default) runs a fused kernel where one exists (CPU float32; CUDA
    float32, float16, bfloat16), else the materialised :func:`reference_attention` with a one-time
    :class:`LssaFallbackWarning` (:func:`backend_for` says which in advance). ``"fused"`` insists on the
    kernels (a ``ValueError`` saying why where none exists), ``"reference"`` runs the materialised
    version, and ``"flex"`` PyTorch's FlexAttention (``lssa._flex``: the variants of the form
    ``phi(s) / sum phi(s)`` with ``phi`` exp, softplus or sigmoid, re-weighting included; compiled and
    differentiable on CUDA, forward-only on the CPU, where PyTorch 2.11's FlexAttention has no backward).
    ``q, k, v`` may be any strided views whose last dimension is contiguous (``qkv.unbind`` / slices of a
    fused projection are read in place); differentiable with respect to all three.

    Raises ``ValueError`` for shapes (not 4-D, ``k`` not ``(B, H_kv, T_k, d)`` as above, ``T`` or ``d`` of 0), a
    last dimension that is not contiguous, ``causal=False``, variant names attn-core rejects (its
    message) and an unknown backend; ``TypeError`` for non-tensors, non-floating or mixed dtypes and
    mixed devices.
    """
    sig = None
    if (
        type(q) is Tensor and type(k) is Tensor and type(v) is Tensor and type(variant) is str
        and q.dtype is _F32 and k.dtype is _F32 and v.dtype is _F32 and q.is_cpu and k.is_cpu and v.is_cpu
        and causal is True and (backend == "auto" or backend == "fused")
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        and not torch.compiler.is_compiling()
    ):
        # Eager CPU inference: a signature that ran the kernels before runs them straight away.
        qs, ks = q.shape, k.shape
        if len(qs) == 4 and len(ks) == 4 and v.shape == ks and ks[2] >= qs[2]:
            sig = (variant, backend, qs, q.stride(), ks[0], ks[1], ks[3], k.stride()[3], v.stride()[3])
            if sig in _INFERENCE:
                return _ops.attention_inference(q, k, v, variant)
    if backend not in BACKENDS:
        raise ValueError(f"lssa.attention: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    _check_once(q, k, v, variant, causal, rows_contiguous=backend in ("auto", "fused"))
    error, reason = _plan(variant, q.device.type, q.dtype)
    if error:
        raise ValueError(error)
    if backend == "reference":
        return _reference.attention(q, k, v, Spec(*_spec(variant)))
    if backend == "flex":
        return _flex.attention(q, k, v, Spec(*_spec(variant)))
    if not reason and v.shape[-1] != q.shape[-1]:
        reason = "the fused kernels need v to have the head dimension of q and k"
    if not reason and q.device.type == "cuda" and q.shape[-1] > _lssa.CUDA_MAX_HEAD_DIM:
        reason = f"the CUDA kernels take head dimensions up to {_lssa.CUDA_MAX_HEAD_DIM}"
    if reason and backend == "fused":
        raise ValueError(f"lssa.attention(backend='fused'): `{variant}` has no fused kernel here: {reason}")
    if reason or q.numel() == 0:
        if reason:
            _warn_fallback(variant, q.device.type, q.dtype, reason)
        return _reference.attention(q, k, v, Spec(*_spec(variant)))
    differentiable = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not differentiable and q.device.type == "cpu" and _ops.plain_tensors(q, k, v) and not torch.compiler.is_compiling():
        # Inference in eager mode (a decoding step): the kernels straight away, without the custom op's
        # dispatch (which cost 25 us a call, more than a one-row step's work at a 1K cache).
        if sig is not None:
            _remember(_INFERENCE, sig)
        return _ops.attention_inference(q, k, v, variant)
    out, _stats, _aux = _ops.attention_fwd(q, k, v, variant, differentiable)
    return out


def reference_attention(q: Tensor, k: Tensor, v: Tensor, variant: str = "lssa+rw15", causal: bool = True) -> Tensor:
    """The materialised PyTorch version of :func:`attention`: ``(B, H, T, T)`` weights, any variant,
    dtype and device, autograd-native. Slow and ``O(T^2)`` in memory; the fallback of
    :func:`attention` and a baseline to compare it with. Same checks and errors, except that it
    takes any layout."""
    _check(q, k, v, variant, causal, rows_contiguous=False)
    error, _reason = _plan(variant, q.device.type, q.dtype)
    if error:
        raise ValueError(error)
    return _reference.attention(q, k, v, Spec(*_spec(variant)))
