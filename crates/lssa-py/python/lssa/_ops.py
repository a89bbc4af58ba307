"""The fused kernels as ``torch.library`` custom ops: ``lssa::attention_fwd`` and ``lssa::attention_bwd``.

``q`` is ``(B, H, T, d)``; ``k`` and ``v`` are ``(B, H_kv, T_k, d)``: grouped-query attention (``H`` a
multiple of ``H_kv``) and queries that continue a sequence (``q`` holds its last ``T <= T_k`` rows).

The forward returns the output, the row statistics the backward needs (``(B, H, T, 4)`` float32:
``Z_i``, the running max or layer-norm sigma, ``m_i``, ``W_i``) and, for a re-weighted variant on the
CPU that will be differentiated, re-weighting's backward helper (``(B, H, T, d + 1)`` float32; an
empty tensor otherwise), which spares the backward one sweep over the keys. Autograd saves ``q``,
``k``, ``v``, the output and those two tensors: nothing ``T x T``. Both ops have fake (meta)
implementations, so ``torch.compile(fullgraph=True)`` and ``torch.export`` trace through them.

Tensors cross into Rust as ``(data pointer, batch stride, head stride, row stride)``; the ops make a
row-contiguous copy only of a tensor whose last axis is not contiguous (``lssa.attention`` refuses
such inputs; a gradient in such a layout can still arrive from autograd).

CUDA: the kernels run on the device's legacy default stream (``attn_kernels::cuda`` takes no stream).
When torch's current stream is another one, the default stream first waits for it and, after the
call, it waits for the default stream: the ordering of the libtorch bridge, without host syncs.
"""

import contextlib
from typing import Iterator, Tuple

import torch
from torch import Tensor

from . import _lssa

STATS_PER_ROW: int = _lssa.STATS_PER_ROW


def _layout(variant: str, q: Tensor, keep_aux: bool) -> Tuple[int, int]:
    """Floats per row of the statistics and of re-weighting's backward helper that the forward of
    ``variant`` on ``q``'s device and dtype writes (the helper's 0 when it keeps none, or when
    ``keep_aux`` is false): the prepared kernels decide, not this package."""
    return _lssa.layout(variant, q.device.type, dtype_name(q.dtype), q.shape[-1], keep_aux)

_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def dtype_name(dtype: torch.dtype) -> str:
    """The dtype as the extension names it (``"float32"``, ...; others as torch prints them)."""
    return _DTYPE_NAMES.get(dtype) or str(dtype).replace("torch.", "")


def _rows(x: Tensor) -> Tensor:
    """``x`` with a contiguous last axis: itself when it has one, else a contiguous copy."""
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def _raw(x: Tensor) -> Tuple[int, int, int, int]:
    s = x.stride()  # one call: three `stride(i)` calls cost 2 us more per decoding step
    return (x.data_ptr(), s[0], s[1], s[2])


@contextlib.contextmanager
def _kernel_stream(x: Tensor) -> Iterator[int]:
    """The stream handle to pass to the extension (always 0), ordered after torch's current stream."""
    if x.device.type != "cuda":
        yield 0
        return
    current = torch.cuda.current_stream(x.device)
    default = torch.cuda.default_stream(x.device)
    side = current.cuda_stream != default.cuda_stream
    if side:
        default.wait_stream(current)
    yield default.cuda_stream
    if side:
        current.wait_stream(default)


def _check_same(what: str, q: Tensor, k: Tensor, v: Tensor, **like_q: Tensor) -> None:
    """The checks that keep the kernels' reads and writes in bounds when the ops are called directly
    (``torch.ops.lssa.*``); ``lssa.attention`` has made them already, with friendlier messages."""
    if q.dim() != 4 or 0 in q.shape:
        raise ValueError(f"{what}: q must be a (B, H, T, d) tensor with every size >= 1, got {tuple(q.shape)}")
    b, h, t, d = q.shape
    if k.dim() != 4 or 0 in k.shape or k.shape[0] != b or h % k.shape[1] or k.shape[2] < t or k.shape[3] != d:
        raise ValueError(
            f"{what}: k must be (B, H_kv, T_k, d) with H a multiple of H_kv and T_k >= T for q {tuple(q.shape)}, "
            f"got {tuple(k.shape)}"
        )
    shapes = dict(v=k.shape, **{name: q.shape for name in like_q})
    for name, x in dict(v=v, **like_q).items():
        if x.shape != shapes[name]:
            raise ValueError(f"{what}: {name} must have the shape {tuple(shapes[name])}, got {tuple(x.shape)}")
    for name, x in dict(k=k, v=v, **like_q).items():
        if x.dtype != q.dtype or x.device != q.device:
            raise TypeError(f"{what}: {name} is {x.dtype} on {x.device}, q is {q.dtype} on {q.device}")


def _threads(x: Tensor) -> int:
    # The CPU kernels use as many threads as torch does (torch.set_num_threads governs both).
    return torch.get_num_threads() if x.device.type == "cpu" else 0


def plain_tensors(*xs: Tensor) -> bool:
    """Whether every one of ``xs`` is a plain ``torch.Tensor`` (not a subclass such as the fake and
    functional tensors of tracing, whose data pointers are not memory)."""
    return all(type(x) is Tensor for x in xs)


def attention_inference(q: Tensor, k: Tensor, v: Tensor, variant: str) -> Tensor:
    """The fused forward's output for CPU tensors that need no gradient, called without the custom op
    (eager inference: ``lssa.attention`` has checked the arguments, and each row's last axis is
    contiguous). The statistics are dropped: ``stats`` 0 asks the extension to keep them in a buffer
    of its own, which costs less than a tensor (5 us a call on a Zen 1 EPYC)."""
    b, h, t, d = q.shape
    # `empty_like` skips the dtype and device arguments' parsing: 1.3 us fewer a call than
    # `torch.empty` (q is a CPU float32 tensor here). `out` is contiguous: its strides are known.
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    ks = k.shape
    _lssa.forward(
        variant, "cpu", "float32", (b, h, t, d), (ks[1], ks[2]),
        _raw(q), _raw(k), _raw(v), (out.data_ptr(), h * t * d, t * d, d), 0, 0, 0, torch.get_num_threads(),
    )
    return out


@torch.library.custom_op("lssa::attention_fwd", mutates_args=())
def attention_fwd(q: Tensor, k: Tensor, v: Tensor, variant: str, keep_aux: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """Fused causal attention of ``(B, H, T, d)`` queries on ``(B, H_kv, T_k, d)`` keys and values:
    ``(out, stats, aux)``. ``keep_aux``: the output will be differentiated, so keep the backward's
    helper where the kernels have one (``aux`` is empty otherwise)."""
    _check_same("lssa::attention_fwd", q, k, v)
    q, k, v = _rows(q), _rows(k), _rows(v)
    b, h, t, d = q.shape
    out = torch.empty((b, h, t, d), dtype=q.dtype, device=q.device)
    # Zeroed, not empty: the kernels leave the helper unwritten for variants without re-weighting and on
    # CUDA, and an op's outputs must not depend on stale memory (opcheck compares two runs). The
    # statistics (4 floats a row) are zeroed too, so nothing depends on which ones a kernel writes.
    stats_per_row, aux_per_row = _layout(variant, q, keep_aux)
    stats = torch.zeros((b, h, t, stats_per_row), dtype=torch.float32, device=q.device)
    aux = torch.zeros((b, h, t, aux_per_row) if aux_per_row else (0,), dtype=torch.float32, device=q.device)
    with _kernel_stream(q) as stream:
        _lssa.forward(
            variant,
            q.device.type,
            dtype_name(q.dtype),
            (b, h, t, d),
            (k.shape[1], k.shape[2]),
            _raw(q),
            _raw(k),
            _raw(v),
            _raw(out),
            stats.data_ptr(),
            aux.data_ptr() if aux_per_row else 0,
            stream,
            _threads(q),
        )
    return out, stats, aux


@attention_fwd.register_fake
def _attention_fwd_fake(q: Tensor, k: Tensor, v: Tensor, variant: str, keep_aux: bool) -> Tuple[Tensor, Tensor, Tensor]:
    b, h, t, d = q.shape
    stats_per_row, aux_per_row = _layout(variant, q, keep_aux)
    out = q.new_empty((b, h, t, d))
    stats = q.new_empty((b, h, t, stats_per_row), dtype=torch.float32)
    aux = q.new_empty((b, h, t, aux_per_row) if aux_per_row else (0,), dtype=torch.float32)
    return out, stats, aux


@torch.library.custom_op("lssa::attention_bwd", mutates_args=())
def attention_bwd(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, stats: Tensor, aux: Tensor, variant: str
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients ``(dq, dk, dv)`` of the fused forward, from its saved tensors and ``dL/d out``."""
    _check_same("lssa::attention_bwd", q, k, v, out=out)
    b, h, t, d = q.shape
    if grad.shape != q.shape:
        raise ValueError(
            f"lssa::attention_bwd: grad must have the shape of q {tuple(q.shape)}, got {tuple(grad.shape)}"
        )
    stats_per_row, aux_per_row = _layout(variant, q, True)
    want_aux = [(0,), (b, h, t, aux_per_row)] if aux_per_row else [(0,)]
    for name, x, shapes in (("stats", stats, [(b, h, t, stats_per_row)]), ("aux", aux, want_aux)):
        if tuple(x.shape) not in shapes or x.dtype != torch.float32 or x.device != q.device:
            raise ValueError(
                f"lssa::attention_bwd: {name} must be float32 of shape {' or '.join(map(str, shapes))} on {q.device} "
                f"(from lssa::attention_fwd), got {x.dtype} {tuple(x.shape)} on {x.device}"
            )
    q, k, v, out = _rows(q), _rows(k), _rows(v), _rows(out)
    grad = _rows(grad.to(q.dtype))
    stats, aux = stats.contiguous(), aux.contiguous()  # locals: the pointers below must stay valid for the call
    dq = torch.empty((b, h, t, d), dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    keep_aux = aux.numel() > 0
    with _kernel_stream(q) as stream:
        _lssa.backward(
            variant,
            q.device.type,
            dtype_name(q.dtype),
            (b, h, t, d),
            (k.shape[1], k.shape[2]),
            _raw(q),
            _raw(k),
            _raw(v),
            _raw(out),
            stats.data_ptr(),
            aux.data_ptr() if keep_aux else 0,
            _raw(grad),
            _raw(dq),
            _raw(dk),
            _raw(dv),
            stream,
            _threads(q),
        )
    return dq, dk, dv


@attention_bwd.register_fake
def _attention_bwd_fake(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, stats: Tensor, aux: Tensor, variant: str
) -> Tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(v.shape)


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, variant, _keep_aux = inputs
    out, stats, aux = output
    ctx.save_for_backward(q, k, v, out, stats, aux)
    ctx.variant = variant


def _backward(ctx, grad_out, _grad_stats, _grad_aux):
    q, k, v, out, stats, aux = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = attention_bwd(grad_out, q, k, v, out, stats, aux, ctx.variant)
    return dq, dk, dv, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)
