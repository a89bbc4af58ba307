"""CPU benchmark of ``lssa.attention`` from Python: the fused op against PyTorch's SDPA (softmax) and
against the same maths as materialised PyTorch ops (``lssa.reference_attention``), forward and
forward+backward, and the cost of the Python boundary at small T. Writes ``docs/bench/python-cpu.md``
(and ``.json`` beside it).

    python crates/lssa-py/bench.py            # T = 256, 1024, 4096; B = 1, H = 12, d = 64, float32
    python crates/lssa-py/bench.py --quick    # T = 256, 1024 and fewer rounds, to try it

Timing policy (the Rust benchmarks', ARCHITECTURE.md "Timing decision"): the cells of one length and
pass run in rounds, one timed repetition of each per round, so that load from elsewhere hits both
sides of a ratio; every ratio is the median of its per-round ratios. A timed run of a cell that takes
under a second follows an untimed run of the same cell (the first run after another library pays for
its thread pool waking up or spinning down).
"""

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

import lssa
from lssa import _lssa, _ops

import bench_sections

VARIANTS = ["lssa", "lssa+rw15"]
# The materialised path keeps about four (B, H, T, T) float32 tensors alive in the forward and about
# twelve with autograd (gpt-model's torch_ops.rs measured 4.1 and 8.3-12.3): 0.8 GB each at H = 12,
# T = 4096. These limits keep it within a few GB.
MATERIALISED_MAX_T = {"fwd": 4096, "fwd+bwd": 2048}


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_revision():
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def make_cell(fn, shape, backward, seed=0):
    """A closure running ``fn(q, k, v)`` (no autograd) or ``fn(q, k, v).backward(g)`` on fixed inputs."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, g = (torch.randn(shape, generator=gen) for _ in range(4))
    if not backward:

        def run():
            with torch.no_grad():
                fn(q, k, v)

        return run
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]

    def run_bwd():
        for x in leaves:
            x.grad = None
        fn(*leaves).backward(g)

    return run_bwd


def timed(cell):
    start = time.perf_counter()
    cell()
    return time.perf_counter() - start


def rounds(cells, min_rounds, budget_s):
    """Times ``cells`` (name -> closure) in rounds: ``{name: [seconds per round]}``."""
    times = {name: [] for name in cells}
    short = {}
    for name, cell in cells.items():  # warm-up, which also tells the short cells
        short[name] = timed(cell) < 1.0
    start = time.perf_counter()
    done = 0
    while done < min_rounds or (time.perf_counter() - start < budget_s and done < 15):
        for name, cell in cells.items():
            if short[name]:
                cell()  # untimed lead-in
            times[name].append(timed(cell))
        done += 1
    return times


def median_ratio(num, den):
    return statistics.median(a / b for a, b in zip(num, den))


def fused(variant):
    return lambda q, k, v: lssa.attention(q, k, v, variant)


def materialised(variant):
    return lambda q, k, v: lssa.reference_attention(q, k, v, variant)


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def boundary_overhead(t, heads, d, reps):
    """Per-call microseconds at a small T: the public call, the custom op, the raw Rust call on
    preallocated tensors, and SDPA, each the median of ``reps`` batches of 50 calls (no autograd)."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, heads, t, d, generator=gen) for _ in range(3))
    out = torch.empty_like(q)
    stats = torch.empty(1, heads, t, _ops.STATS_PER_ROW)
    raw = lambda x: (x.data_ptr(), *x.stride()[:3])  # noqa: E731
    threads = torch.get_num_threads()
    calls = {
        "lssa.attention": lambda: lssa.attention(q, k, v, "lssa+rw15"),
        "torch.ops.lssa.attention_fwd": lambda: torch.ops.lssa.attention_fwd(q, k, v, "lssa+rw15", False),
        "_lssa.forward (raw kernel call)": lambda: _lssa.forward(
            "lssa+rw15", "cpu", "float32", (1, heads, t, d), (heads, t), raw(q), raw(k), raw(v), raw(out),
            stats.data_ptr(), 0, 0, threads,
        ),
        "SDPA": lambda: sdpa(q, k, v),
    }
    result = {}
    with torch.no_grad():
        for name, call in calls.items():
            for _ in range(50):
                call()
        samples = {name: [] for name in calls}
        for _ in range(reps):
            for name, call in calls.items():
                start = time.perf_counter()
                for _ in range(50):
                    call()
                samples[name].append((time.perf_counter() - start) / 50 * 1e6)
    for name, s in samples.items():
        result[name] = statistics.median(s)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="256,1024,4096")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--min-rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=20.0, help="seconds of rounds per (T, pass) beyond the minimum")
    ap.add_argument("--quick", action="store_true", help="T = 256, 1024; 3 rounds")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (lssa follows it); default: torch's")
    ap.add_argument("--note", default="", help="a line about the machine's state, printed in the report")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "docs", "bench", "python-cpu.md"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = [256, 1024] if args.quick else [int(x) for x in args.lengths.split(",")]
    min_rounds = 3 if args.quick else args.min_rounds
    h, d = args.heads, args.head_dim
    began = time.time()

    results = {}  # (pass, T) -> {cell: [seconds]}
    for pass_ in ("fwd", "fwd+bwd"):
        backward = pass_ == "fwd+bwd"
        for t in lengths:
            shape = (1, h, t, d)
            cells = {"sdpa softmax": make_cell(sdpa, shape, backward)}
            for variant in VARIANTS:
                cells[f"fused {variant}"] = make_cell(fused(variant), shape, backward)
                if t <= MATERIALISED_MAX_T[pass_]:
                    cells[f"materialised {variant}"] = make_cell(materialised(variant), shape, backward)
            print(f"{pass_} T={t}: {len(cells)} cells in rounds", flush=True)
            results[(pass_, t)] = rounds(cells, min_rounds, args.budget)

    overhead = {t: boundary_overhead(t, h, d, reps=21 if not args.quick else 7) for t in (1, 16, 64)}

    # The report.
    lines = [
        "# lssa from Python (CPU): the fused op vs SDPA vs materialised PyTorch",
        "",
        f"- CPU: {cpu_name()} ({os.cpu_count()} logical CPUs); threads: {torch.get_num_threads()} "
        "(torch's intra-op pool and the kernels' pool alike: lssa uses `torch.get_num_threads()`)",
        f"- torch {torch.__version__}, lssa {lssa.__version__}, Python {platform.python_version()}; "
        f"git revision `{git_revision()}`; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `python crates/lssa-py/bench.py{' --quick' if args.quick else ''}"
        f"{f' --threads {args.threads}' if args.threads else ''}`",
        f"- shape: B=1, H={h}, d={d}, causal, float32; forward under `torch.no_grad()`, forward+backward "
        "through autograd (`out.backward(g)`)",
        "- `fused`: `lssa.attention(q, k, v, variant)`; `sdpa`: `F.scaled_dot_product_attention(q, k, v, "
        "is_causal=True)`; `materialised`: `lssa.reference_attention(q, k, v, variant)`, the same maths as "
        "PyTorch ops with (B, H, T, T) weights (what a user would write without the kernels)",
        "- timing: the cells of one (pass, T) in rounds, one timed run of each per round after an untimed "
        f"lead-in where a run takes under 1 s; at least {min_rounds} rounds, more within {args.budget:.0f} s; "
        "every ratio is the median of per-round ratios, every time the median of its runs",
    ]
    if args.note:
        lines.append(f"- **machine state: {args.note}**")
    config = {"heads": h, "head_dim": d, "lengths": lengths, "threads": torch.get_num_threads()}
    config["torch"] = torch.__version__
    js = {"config": config, "cells": {}, "overhead_us": {}}
    for pass_ in ("fwd", "fwd+bwd"):
        lines += ["", f"## {pass_}: median ms (time / SDPA's, median of per-round ratios)", ""]
        lines.append("| implementation | variant | " + " | ".join(f"T={t}" for t in lengths) + " |")
        lines.append("|---|---|" + "---:|" * len(lengths))
        rows = [("sdpa", "softmax")] + [("fused", v) for v in VARIANTS] + [("materialised", v) for v in VARIANTS]
        for impl, variant in rows:
            cells = []
            for t in lengths:
                times = results[(pass_, t)]
                key = f"{impl} {variant}"
                if key not in times:
                    cells.append("-")
                    continue
                ms = statistics.median(times[key]) * 1e3
                js["cells"][f"{pass_} T={t} {key}"] = times[key]
                if impl == "sdpa":
                    cells.append(f"{ms:.3g}")
                else:
                    cells.append(f"{ms:.3g} ({median_ratio(times[key], times['sdpa softmax']):.2f}x)")
            lines.append(f"| {impl} | {variant} | " + " | ".join(cells) + " |")
        lines += ["", f"{pass_}: materialised / fused (same variant; how much faster the fused op is):", ""]
        for variant in VARIANTS:
            parts = []
            for t in lengths:
                times = results[(pass_, t)]
                if f"materialised {variant}" in times:
                    ratio = median_ratio(times[f"materialised {variant}"], times[f"fused {variant}"])
                    parts.append(f"T={t}: {ratio:.1f}x")
            lines.append(f"- {variant}: " + (", ".join(parts) if parts else "not run"))
    lines += [
        "",
        f"Not run: materialised forward above T = {MATERIALISED_MAX_T['fwd']} and forward+backward above "
        f"T = {MATERIALISED_MAX_T['fwd+bwd']} (its (B, H, T, T) tensors: about 12 of 0.8 GB each with autograd "
        "at T = 4096, H = 12).",
        "",
        "## The Python boundary at small T: microseconds per forward call (no autograd)",
        "",
        "Median of batches of 50 calls, variant `lssa+rw15`, B=1, H=12, d=64. `lssa.attention` is the public "
        "call (checks, variant look-up, the custom op); `torch.ops.lssa.attention_fwd` the op alone (dispatcher, "
        "output allocation, pointers); `_lssa.forward` the raw Rust entry on preallocated tensors (variant "
        "parse, GIL release, the kernel, which itself packs the keys of every head and runs on libtorch's "
        "OpenMP team). "
        "The boundary costs the difference between the first and the third row.",
        "",
        "| call | " + " | ".join(f"T={t}" for t in overhead) + " |",
        "|---|" + "---:|" * len(overhead),
    ]
    for name in next(iter(overhead.values())):
        lines.append(f"| {name} | " + " | ".join(f"{overhead[t][name]:.0f}" for t in overhead) + " |")
        js["overhead_us"][name] = {str(t): overhead[t][name] for t in overhead}
    boundary = [overhead[t]["lssa.attention"] - overhead[t]["_lssa.forward (raw kernel call)"] for t in overhead]
    lines.append("| boundary (lssa.attention - _lssa.forward) | " + " | ".join(f"{b:.0f}" for b in boundary) + " |")
    lines += ["", f"Total time of this run: {time.time() - began:.0f} s.", ""]
    out = os.path.abspath(args.out)
    # One section per CPU model in the file: this run replaces its own machine's, keeps the others.
    bench_sections.write(out, bench_sections.cpu_key(), "\n".join(lines), js)
    print("\n".join(lines))
    print(f"wrote {out} (the section of {bench_sections.cpu_key()})")


if __name__ == "__main__":
    main()
