"""LSSA, LSSAR and every other variant as an attention implementation of Hugging Face transformers.

    import lssa.hf                     # registers "lssa", "lssa+rw15", "softmax", "softmax+rw15"
    model = AutoModelForCausalLM.from_config(config, attn_implementation="lssa+rw15")
    model.set_attn_implementation("lssa+rw15")   # post-hoc re-weighting of a model trained with "lssa"
    model = AutoModelForCausalLM.from_pretrained(d)                               # a `trainer export --format hf`
    model = AutoModelForCausalLM.from_pretrained(d, attn_implementation="lssa+rw3")   # ... re-weighted post hoc

**Any variant name, on demand.** Besides the four presets, importing this module makes every name
attn-core parses (``lssa.canonical_name``) a valid ``attn_implementation``: it is registered at the
moment transformers checks the name (``PreTrainedModel.get_correct_attn_implementation``, which
``from_config``, ``from_pretrained`` and ``set_attn_implementation`` all call; this module wraps it
once). So a model exported by ``trainer export --format hf``, whose ``config.json`` records its variant
as ``attn_implementation`` (``"lssa"``, ``"lssa+rw15"``, ``"softplus-l1"``, ...), loads with a plain
``from_pretrained(dir)``, and ``from_pretrained(dir, attn_implementation="lssa+rw15")`` re-weights an
LSSA model post hoc. :func:`register` still registers a name explicitly (another name for a variant, or
the materialised ``backend="reference"``). A name that is neither registered nor a variant is left to
transformers, whose ``ValueError`` lists the valid ones. **Without** ``import lssa.hf`` nothing is
registered: loading such an export fails with transformers' own ``ValueError`` (``Specified
`attn_implementation="lssa"` is not supported``), never silently as softmax attention. A softmax
export records no ``attn_implementation`` and loads in stock transformers (its ``sdpa``).

Each name is registered twice, as transformers (4.51 and later; tested with 5.24) requires of a custom
implementation: with ``AttentionInterface`` (the attention itself: :func:`lssa.attention` on the
layer's query, key and value, with the key and value heads as the model has them, so grouped-query
attention reads each key head in place) and with ``AttentionMaskInterface`` (the mask: none, since every
variant is causal by definition, with the checks below). The model keeps its own RoPE (and its NTK or
other ``rope_scaling``) and its KV cache: a decoding step is a query row that continues the cached
sequence, which the fused kernels take as it is (``N_i`` from its absolute position).

What cannot be honoured is an error, never a silently different model:

- **Padding.** The kernels attend to every earlier position of a row, so a padded position before a
  real token would count in its ``N_i`` and its weights. Right padding (each row's mask ones, then
  zeros) is exact for the real tokens (causal rows never see later positions; ignore the padded
  positions' outputs, e.g. labels of -100), and is accepted. Left padding, or any mask with a hole (a
  right-padded batch that ``generate`` extends), raises ``ValueError``: batch prompts of one length, or
  generate one prompt at a time.
- Sliding-window, chunked or bidirectional layers (a mask other than plain causal), dropout inside the
  attention and an explicit 4-D mask raise ``ValueError``.
- The layer's ``scaling`` is not used: each variant defines its scores' scale (``softmax``'s is
  ``1 / sqrt(d)``, the usual one; LSSA's is ``ln(d) ln(N_i)`` on cosine scores).

Devices and dtypes are :func:`lssa.attention`'s: CPU float32 and CUDA run fused, other cases the
materialised reference with a one-time warning.
"""

import functools
from typing import Optional

import torch
from torch import Tensor

from . import attention, canonical_name

__all__ = ["register", "registered", "PRESETS"]

#: The names registered on import.
PRESETS = ("lssa", "lssa+rw15", "softmax", "softmax+rw15")

_registered = {}


def registered() -> dict:
    """The implementation names registered so far, each with the variant and backend it runs."""
    return dict(_registered)


def register(variant: str, name: Optional[str] = None, backend: str = "auto") -> str:
    """Registers ``variant`` with transformers under ``name`` (default: ``variant`` as written) and
    returns the name, for ``attn_implementation=name``. ``backend`` is :func:`lssa.attention`'s
    (``"reference"`` registers the materialised version, to compare with). ``ValueError`` for a
    variant name attn-core rejects; registering a name again replaces it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    canonical = canonical_name(variant)  # ValueError with attn-core's message
    name = variant if name is None else name
    AttentionInterface.register(name, functools.partial(_attention_forward, variant=canonical, backend=backend))
    AttentionMaskInterface.register(name, functools.partial(_mask, name=name))
    _registered[name] = (canonical, backend)
    return name


def _mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset=0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: Optional[Tensor] = None,
    *,
    name: str,
    **kwargs,
) -> None:
    """transformers' mask function for ``name``: no mask (the kernels are causal), after checking that
    the model asks for nothing else."""
    from transformers.masking_utils import causal_mask_function

    if mask_function is not None and mask_function is not causal_mask_function:
        raise ValueError(
            f"attn_implementation={name!r}: this layer asks for a mask other than plain causal attention (sliding "
            f"window, chunked, bidirectional or packed sequences); the lssa kernels are causal over the whole "
            f"sequence only: use full-attention layers, one sequence per batch row"
        )
    if kv_offset:
        raise ValueError(
            f"attn_implementation={name!r}: a cache that drops early keys (kv_offset {kv_offset}) changes every "
            f"row's N_i; the lssa kernels need the whole sequence (a DynamicCache)"
        )
    if attention_mask is not None and attention_mask.dim() == 2:
        keep = attention_mask.to(torch.bool)
        right_padded = bool((keep[:, 1:] <= keep[:, :-1]).all()) and bool(keep[:, 0].all())
        if not right_padded:
            raise ValueError(
                f"attn_implementation={name!r}: the attention mask pads on the left or has holes (as a right-padded "
                f"batch does once generate() extends it); the lssa kernels attend to every earlier position, so "
                f"padding before a token would change its N_i and its weights. Pad on the right for training "
                f"(tokenizer.padding_side = 'right', labels -100 on the padding), and generate from prompts of one "
                f"length (or one prompt at a time)"
            )
    return None


def _attention_forward(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Optional[Tensor],
    scaling: Optional[float] = None,
    dropout: float = 0.0,
    *,
    variant: str,
    backend: str,
    **kwargs,
):
    """transformers' attention function: ``query`` ``(B, H, T, d)``, ``key`` and ``value``
    ``(B, H_kv, T_k, d)`` (the whole cached sequence); returns ``((B, T, H, d), None)``."""
    if attention_mask is not None:
        raise ValueError(
            f"lssa.hf ({variant}): got an explicit attention mask of shape {tuple(attention_mask.shape)}; the lssa "
            f"kernels are causal and take no mask (see lssa.hf's docs on padding)"
        )
    if dropout:
        raise ValueError(f"lssa.hf ({variant}): attention dropout {dropout} is not implemented; set attention_dropout=0")
    if kwargs.get("sliding_window") or getattr(module, "sliding_window", None):
        raise ValueError(f"lssa.hf ({variant}): sliding-window layers are not supported (the kernels see every key)")
    out = attention(query, key, value, variant=variant, backend=backend)
    return out.transpose(1, 2).contiguous(), None


def _register_on_demand(name) -> None:
    """Registers ``name`` when it is a variant attn-core parses and transformers does not know it yet;
    anything else is left as it is, for transformers to accept or refuse."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if not isinstance(name, str) or name == "eager" or name in ALL_ATTENTION_FUNCTIONS:
        return
    try:
        canonical_name(name)
    except ValueError:
        return  # not a variant: transformers' own error names the valid implementations
    register(name)


def _register_variants_on_demand() -> None:
    """Wraps ``PreTrainedModel.get_correct_attn_implementation``, where transformers (5.x; tested with
    5.24) validates an ``attn_implementation`` name on every path (``from_config``, ``from_pretrained``,
    ``set_attn_implementation``, sub-models), so that a variant name is registered just before it is
    checked. Idempotent; a transformers without that method gets the presets and :func:`register` only."""
    from transformers.modeling_utils import PreTrainedModel

    check = getattr(PreTrainedModel, "get_correct_attn_implementation", None)
    if check is None or getattr(check, "_lssa_on_demand", False):
        return

    @functools.wraps(check)
    def get_correct_attn_implementation(self, requested_attention, *args, **kwargs):
        _register_on_demand(requested_attention)
        return check(self, requested_attention, *args, **kwargs)

    get_correct_attn_implementation._lssa_on_demand = True
    PreTrainedModel.get_correct_attn_implementation = get_correct_attn_implementation


for _name in PRESETS:
    register(_name)
del _name
_register_variants_on_demand()
