"""A pytest plugin that orders ``crates/lssa-py/tests/test_cuda.py`` so that a run cut by its time limit
has run the cases that matter most first (``benches/gpu-session.sh ship1``). Nothing is installed: the
script puts ``benches/`` on ``PYTHONPATH`` and loads it with ``-p pytest_auto_first``.

The order, each tier in the file's own order:

0. the kernel tests in bfloat16 at head dimension 64 of the variants the reproduction trains
   (``softmax``, ``lssa``, ``lssa+rw15``): what the ``gpu`` scale's training runs under ``Auto``;
1. the same in float16;
2. the other variants in 16 bits at head dimension 64 (v5 + v7 under ``Auto``);
3. 16 bits at head dimension 128 (v3 + v7);
4. strided views and side streams (the bridge to torch);
5. float32 and head dimension 48 (v1, the SIMT kernels) and the one-row calls;
6. the rest (the fallback check);
7. the compiled model, whose ``torch.compile`` takes longest.
"""

import torch

#: The variants the reproduction trains (crates/experiments/defs/claims.toml's headline rows).
TRAINED = ("softmax", "lssa", "lssa+rw15")


def tier(name, params):
    """The tier of a test called ``name`` (its function) with parameters ``params`` (empty if none)."""
    if name == "test_compiled_model_on_cuda":
        return 7
    if name in ("test_strided_qkv_views_on_cuda", "test_a_side_stream_is_ordered_around_the_kernels"):
        return 4
    if name != "test_fused_cuda_matches_the_formulas":
        return 6
    dtype, d, t = params.get("dtype"), params.get("d"), params.get("t")
    if dtype == torch.float32 or d not in (64, 128) or t == 1:
        return 5
    if d == 128:
        return 3
    if params.get("name") in TRAINED:
        return 0 if dtype == torch.bfloat16 else 1
    return 2


def pytest_collection_modifyitems(session, config, items):
    """Sorts the collected tests by tier, stably (within a tier, the file's order)."""
    order = {id(item): i for i, item in enumerate(items)}

    def key(item):
        params = item.callspec.params if hasattr(item, "callspec") else {}
        return (tier(item.originalname, params), order[id(item)])

    items.sort(key=key)


def pytest_report_header(config):
    return "test order: benches/pytest_auto_first.py (the trained variants in bf16 at d = 64 first)"
