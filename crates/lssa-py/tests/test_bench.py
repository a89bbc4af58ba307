"""``bench.py``'s cells run against the extension as built: its boundary table calls the raw entry point
directly, whose signature the package's own calls keep up to date but nothing else did (a full run crashed
at its end when the entry point took a new argument)."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench  # noqa: E402


def test_the_boundary_table_times_every_call_at_a_small_shape():
    times = bench.boundary_overhead(4, 2, 16, 1)
    assert sorted(times) == sorted(
        ["lssa.attention", "torch.ops.lssa.attention_fwd", "_lssa.forward (raw kernel call)", "SDPA"]
    )
    assert all(math.isfinite(us) and us > 0 for us in times.values())
