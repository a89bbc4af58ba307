"""CPU decoding speed of ``lssa.attention``: one new query row against a KV cache, the fused op (LSSA and
LSSAR) beside PyTorch's SDPA (softmax), per attention call; the per-call floor (a 1-key cache); and
transformers' ``generate`` on a small grouped-query Llama with ``attn_implementation="lssa"`` against
``"sdpa"``, same weights. Writes ``docs/bench/decode-cpu.md`` (and ``.json`` beside it).

    python crates/lssa-py/bench_decode.py               # caches of 1K, 8K, 32K keys; H = 12 (and GQA 12/4), d = 64
    python crates/lssa-py/bench_decode.py --quick       # fewer rounds, to try it

A cell runs ``--calls`` decoding steps back to back (each one query row of ``(1, H, 1, d)`` against the
whole ``(1, H_kv, T_k, d)`` cache, under ``torch.no_grad()``): tokens per second are calls per second
of one layer's attention. Beside them, in the same rounds, a cell that reads the same keys and values
once (``k.sum()`` and ``v.sum()``, torch's threads): the bandwidth a step that streams its cache can
reach on this machine, against which each step's bytes per second are given. SDPA gets ``is_causal=False``, which for a last-row query is the causal
answer (its ``is_causal`` aligns the mask top-left). Timing policy as ``bench.py``: the cells of one
shape in rounds, ratios the median of per-round ratios.
"""

import argparse
import datetime
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

import lssa
import bench_sections
from bench import cpu_name, git_revision, median_ratio, rounds


def decode_cell(attend, heads, kv_heads, t_k, d, calls, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, 1, d, generator=gen)
    k, v = (torch.randn(1, kv_heads, t_k, d, generator=gen) for _ in range(2))

    def run():
        with torch.no_grad():
            for _ in range(calls):
                attend(q, k, v)

    return run


def generate_cells(prompt_len, new_tokens, seed=0):
    """``generate`` of ``new_tokens`` greedy tokens after a ``prompt_len``-token prompt on a Llama built
    from a config (hidden 512, 4 layers, 8 query heads of 64 on 2 key/value heads, vocabulary 32000),
    once with each attention implementation, the same weights."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    import lssa.hf  # noqa: F401 (registers the implementations)

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=prompt_len + new_tokens,
    )
    torch.manual_seed(seed)
    models = {}
    for impl in ("sdpa", "lssa"):
        torch.manual_seed(seed)
        models[impl] = AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
    models["lssa"].load_state_dict(models["sdpa"].state_dict())
    prompt = torch.randint(1, config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))

    def cell(model):
        def run():
            with torch.no_grad():
                out = model.generate(
                    prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                )
            assert out.shape[1] == prompt_len + new_tokens
        return run

    return {f"generate {impl}": cell(m) for impl, m in models.items()}


def read_once(q, k, v):
    """Reads every byte of ``k`` and ``v`` once (torch's reductions, its threads): a decoding step's floor."""
    return k.sum() + v.sum()


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=k.shape[1] != q.shape[1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caches", default="1024,8192,32768")
    ap.add_argument("--prompt", type=int, default=2048, help="generate: prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=128, help="generate: new tokens")
    ap.add_argument("--no-generate", action="store_true")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", default="12,4", help="key/value head counts to run (12: plain; 4: GQA)")
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--calls", type=int, default=50, help="decoding steps per timed cell")
    ap.add_argument("--min-rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--note", default="")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "docs", "bench", "decode-cpu.md"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    caches = [int(x) for x in args.caches.split(",")]
    kv_heads = [int(x) for x in args.kv_heads.split(",")]
    min_rounds = 3 if args.quick else args.min_rounds
    h, d = args.heads, args.head_dim
    impls = {"sdpa softmax": sdpa, "fused lssa": None, "fused lssa+rw15": None}

    results = {}
    for hk in kv_heads:
        for t_k in caches:
            cells = {}
            for name in impls:
                attend = impls[name] or (lambda q, k, v, var=name.split()[1]: lssa.attention(q, k, v, var))
                cells[name] = decode_cell(attend, h, hk, t_k, d, args.calls)
            cells["read k, v"] = decode_cell(read_once, h, hk, t_k, d, args.calls)
            print(f"H_kv={hk} T_k={t_k}: {len(cells)} cells in rounds", flush=True)
            results[(hk, t_k)] = rounds(cells, min_rounds, args.budget)
    # The per-call floor: a 1-key cache, where the call's fixed cost is all there is.
    floor = rounds({name: decode_cell(impls[name] or (lambda q, k, v: lssa.attention(q, k, v, "lssa")), h, h, 1, d,
                                      args.calls) for name in ("sdpa softmax", "fused lssa")}, min_rounds, args.budget)
    gen = None
    if not args.no_generate:
        print(f"generate: {args.new_tokens} tokens after {args.prompt}", flush=True)
        gen = rounds(generate_cells(args.prompt, args.new_tokens), 3 if args.quick else 5, args.budget)

    lines = [
        "# Decoding from Python (CPU): one query row against a KV cache, fused lssa vs SDPA",
        "",
        f"- CPU: {cpu_name()} ({os.cpu_count()} logical CPUs); threads: {torch.get_num_threads()}",
        f"- torch {torch.__version__}, lssa {lssa.__version__}, Python {platform.python_version()}; "
        f"git revision `{git_revision()}`; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- command: `python crates/lssa-py/bench_decode.py{' --quick' if args.quick else ''}"
        f"{f' --threads {args.threads}' if args.threads else ''}`",
        f"- q (1, {h}, 1, {d}) against k, v (1, H_kv, T_k, {d}), float32, `torch.no_grad()`; {args.calls} calls per "
        f"timed cell, at least {min_rounds} rounds; tokens/s = calls per second of one attention call (one layer)",
        "- `fused`: `lssa.attention(q, k, v, variant)` (the CPU kernels; query row N = T_k); `sdpa`: "
        "`F.scaled_dot_product_attention(q, k, v, is_causal=False, enable_gqa=...)`",
    ]
    if args.note:
        lines.append(f"- **machine state: {args.note}**")
    lines += ["", "| H_kv | T_k | " + " | ".join(impls) + " |", "|---:|---:|" + "---:|" * len(impls)]
    js = {"config": {"heads": h, "kv_heads": kv_heads, "caches": caches, "head_dim": d, "calls": args.calls,
                     "threads": torch.get_num_threads(), "torch": torch.__version__}, "cells": {}}
    for (hk, t_k), times in results.items():
        row = []
        for name in impls:
            tps = args.calls / statistics.median(times[name])
            js["cells"][f"H_kv={hk} T_k={t_k} {name}"] = times[name]
            if name.startswith("sdpa"):
                row.append(f"{tps:,.0f}")
            else:
                # time / SDPA's time, per round: above 1 is slower than SDPA
                row.append(f"{tps:,.0f} ({median_ratio(times[name], times['sdpa softmax']):.2f}x SDPA's time)")
        lines.append(f"| {hk} | {t_k} | " + " | ".join(row) + " |")
    lines += [
        "",
        "Cells: tokens per second (median over rounds), and in brackets the fused call's time over SDPA's "
        "(median of per-round ratios). What bounds each cell, and the next steps: "
        "[`decode-cpu-notes.md`](decode-cpu-notes.md).",
        "",
        "Bandwidth: a step reads its keys and values, 2 H_kv T_k d 4 bytes; each cell's GB/s is those bytes over "
        "its median time, and `read k, v` reads the same bytes once (`k.sum()`, `v.sum()`, the same threads), "
        "in the same rounds: the rate this machine streams them at. In brackets: the step's time over that "
        "read's (median of per-round ratios; 1.00x is a step bound by memory bandwidth alone).",
        "",
        "| H_kv | T_k | MB a step | read k, v (GB/s) | " + " | ".join(f"{n} (GB/s)" for n in impls) + " |",
        "|---:|---:|---:|---:|" + "---:|" * len(impls),
    ]
    for (hk, t_k), times in results.items():
        nbytes = 2 * hk * t_k * d * 4
        gbs = lambda name: nbytes * args.calls / statistics.median(times[name]) / 1e9
        js["cells"][f"H_kv={hk} T_k={t_k} read k, v"] = times["read k, v"]
        row = [f"{gbs(n):.1f} ({median_ratio(times[n], times['read k, v']):.2f}x)" for n in impls]
        lines.append(f"| {hk} | {t_k} | {nbytes / 1e6:.1f} | {gbs('read k, v'):.1f} | " + " | ".join(row) + " |")
    lines += [
        "",
        f"Per-call floor (T_k = 1, H = H_kv = {h}): SDPA {statistics.median(floor['sdpa softmax']) / args.calls * 1e6:.1f} us, "
        f"`lssa.attention` {statistics.median(floor['fused lssa']) / args.calls * 1e6:.1f} us a call "
        f"({median_ratio(floor['fused lssa'], floor['sdpa softmax']):.2f}x SDPA's time).",
    ]
    js["floor"] = floor
    if gen is not None:
        tps = {k: args.new_tokens / statistics.median(v) for k, v in gen.items()}
        lines += [
            "",
            f"`generate` of {args.new_tokens} new tokens after a {args.prompt}-token prompt (greedy, one sequence), "
            "Llama from a config: hidden 512, 4 layers, 8 query heads of 64 on 2 key/value heads, vocabulary "
            "32000; the same weights under both implementations; the prompt's prefill included:",
            "",
            "| attn_implementation | new tokens / s | time / SDPA's |",
            "|---|---:|---:|",
            f"| sdpa | {tps['generate sdpa']:.1f} | 1.00x |",
            f"| lssa | {tps['generate lssa']:.1f} | "
            f"{median_ratio(gen['generate lssa'], gen['generate sdpa']):.2f}x |",
        ]
        js["generate"] = gen
    # One section per CPU model in the file: this run replaces its own machine's, keeps the others.
    bench_sections.write(args.out, bench_sections.cpu_key(), "\n".join(lines) + "\n", js)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
