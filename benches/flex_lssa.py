#!/usr/bin/env python3
"""LSSA and LSSAR written for PyTorch's FlexAttention: the tool a user would try first.

FlexAttention computes only softmax, but softmax(log f) = f / sum(f), so a score_mod returning
log(softplus(s)) with s = ln(d) ln(N_i) <q_i/|q_i|, k_j/|k_j|> is exactly LSSA (SPEC section 2.1).
LSSAR (SPEC section 3) takes a second call: the first returns log Z_i (FlexAttention's logsumexp,
natural log), and the second's score_mod is p * log(ReLU(N_i f_ij / Z_i - off_i)), whose softmax is
ReLU(u)^p / sum ReLU(u)^p. Where a row has no key above its mean (an exactly uniform row past row 3)
SPEC falls back to the stage-1 weights; this baseline returns a zero row there instead. Random inputs
never have such rows.

The Rust benchmarks run this script with the Python of the torch venv (`lssa_benches::flex`):

  flex_lssa.py check DIR
      reads DIR/meta.json ({"shape": [B, H, T, d], "p": [...]}) and DIR/{q,k,v}.f64 (raw little-endian
      f64, B x H x T x d), writes DIR/lssa.f64 and DIR/lssa_rw{p}.f64 (eager FlexAttention in f64:
      the formulation, checked against attn-core by benches/tests/flex.rs)
  flex_lssa.py speed --device cpu|cuda --dtype f32|bf16 --head-dim D --lengths T,... [--tokens N]
      [--batch B] [--heads H] [--threads N] [--reps N] [--min-reps N] [--budget-s S] [--lead-in-below-s S]
      [--backward] [--sdpa]
      one JSON object per line and length: the timed runs (ms) of the compiled LSSA forward
      (`lssa_fwd`), LSSAR p = 15 forward (`lssar15_fwd`) and, with --backward (CUDA only: FlexAttention
      has no CPU backward), LSSA forward+backward (`lssa_fwd_bwd`), each with the q/k normalisation
      (the fused kernels normalise inside); with --sdpa also libtorch's SDPA softmax, forward
      (`sdpa_fwd`) and, with --backward, forward+backward (`sdpa_fwd_bwd`); the largest relative
      error of the compiled outputs against a materialised f32 reference at the first length; and,
      per cell that could not run, why (`errors`: PyTorch 2.11 compiles no `return_lse` on the CPU,
      so LSSAR has no CPU row). The cells of one length run in rounds, as the Rust benchmarks time
      theirs (`lssa_benches::measure::time_rounds`): one warm-up each (it compiles), then rounds of
      one timed run of each cell, so sample i of every cell comes from round i + 1 and a cell's
      time over SDPA's is a median of per-round ratios.
"""
import argparse
from array import array
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention


def causal(b, h, qi, kj):
    return qi >= kj


def row_scale(qi, dtype, ln_d):
    # ln(d) * ln(N_i), N_i = i + 1 keys visible to row i (0-based).
    return ln_d * torch.log((qi + 1).to(dtype))


def lssa_mod(ln_d):
    def mod(score, b, h, qi, kj):
        return torch.log(F.softplus(score * row_scale(qi, score.dtype, ln_d)))

    return mod


def reweight_mod(ln_d, lse, p):
    def mod(score, b, h, qi, kj):
        n = (qi + 1).to(score.dtype)
        a = F.softplus(score * row_scale(qi, score.dtype, ln_d)) * torch.exp(-lse[b, h, qi])
        off = torch.where(qi < 3, 0.0, 1.0).to(score.dtype)  # rows 1-3 have no offset
        return p * torch.log(torch.relu(n * a - off))

    return mod


def lssa(attn, q, k, v, mask):
    ln_d = math.log(q.shape[-1])
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    return attn(qn, kn, v, score_mod=lssa_mod(ln_d), block_mask=mask, scale=1.0)


def lssar(attn, q, k, v, mask, p):
    ln_d = math.log(q.shape[-1])
    qn, kn = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    _, aux = attn(qn, kn, v, score_mod=lssa_mod(ln_d), block_mask=mask, scale=1.0, return_aux=AuxRequest(lse=True))
    return attn(qn, kn, v, score_mod=reweight_mod(ln_d, aux.lse, p), block_mask=mask, scale=1.0)


def materialised(q, k, v, p):
    """The same maths as plain tensor ops in f32 with a T x T matrix (the sanity reference)."""
    q, k, v = q.float(), k.float(), v.float()
    t, d = q.shape[-2], q.shape[-1]
    n = torch.arange(1, t + 1, device=q.device, dtype=torch.float32)[:, None]
    s = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)) * (math.log(d) * torch.log(n))
    f = F.softplus(s) * torch.ones(t, t, device=q.device).tril()
    a = f / f.sum(-1, keepdim=True)
    if p is not None:
        off = (torch.arange(t, device=q.device) >= 3).float()[:, None]
        r = torch.relu(n * a - off) ** p
        a = r / r.sum(-1, keepdim=True)
    return a @ v


def check(folder):
    folder = Path(folder)
    meta = json.loads((folder / "meta.json").read_text())
    shape = meta["shape"]

    def read(name):
        values = array("d", (folder / f"{name}.f64").read_bytes())
        return torch.tensor(values, dtype=torch.float64).reshape(shape)

    q, k, v = read("q"), read("k"), read("v")
    mask = create_block_mask(causal, None, None, shape[2], shape[2], device="cpu")
    outputs = {"lssa": lssa(flex_attention, q, k, v, mask)}
    for p in meta["p"]:
        outputs[f"lssa_rw{p}"] = lssar(flex_attention, q, k, v, mask, p)
    for name, o in outputs.items():
        (folder / f"{name}.f64").write_bytes(array("d", o.flatten().tolist()).tobytes())


def failure(e):
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def rounds_ms(cells, sync, args, batch_to_s, errors):
    """Times `cells` ({name: fn}) in rounds and returns {name: [ms, ...]}, sample i from round i + 1.

    The policy of `lssa_benches::measure::time_rounds`: one warm-up per cell (it compiles; a cell
    that fails there or later drops out, its error in `errors`) and, unlike there, one more untimed
    run, since a warm-up that compiles says nothing of a call's time, which the lead-in runs, the
    budget and the CUDA batching below are decided from; then rounds of one timed run of each
    cell in order, up to `args.reps` rounds, stopping early once at least `args.min_reps` rounds ran
    and the next would take the timed total past `args.budget_s` times the number of cells. A cell
    whose last run took under `args.lead_in_below_s` runs once more, untimed, before each timed run
    (the first run after another cell pays for libtorch's OpenMP workers winding down). With
    `batch_to_s > 0` a sample is the mean of as many back-to-back calls (at most 50) as fill that
    long, so launch latency overlaps as it does in a training step (bench-cuda times its kernels so).
    """
    inner, last_ms, samples = {}, {}, {}
    for name, fn in cells.items():
        try:
            fn()
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ms = (time.perf_counter() - t0) * 1e3
        except Exception as e:
            errors[name] = failure(e)
            continue
        inner[name] = min(max(math.ceil(batch_to_s * 1e3 / max(ms, 1e-3)), 1), 50) if batch_to_s > 0 else 1
        last_ms[name], samples[name] = ms, []
    budget_ms = args.budget_s * 1e3 * len(samples)
    while True:
        live = [n for n in samples if len(samples[n]) < args.reps]
        if not live:
            break
        spent_ms = sum(sum(s) for s in samples.values())
        short = any(len(samples[n]) < max(args.min_reps, 1) for n in live)
        if not short and spent_ms + sum(last_ms[n] for n in live) > budget_ms:
            break
        for name in live:
            fn = cells[name]
            try:
                if last_ms[name] < args.lead_in_below_s * 1e3:
                    fn()
                    sync()
                t0 = time.perf_counter()
                for _ in range(inner[name]):
                    fn()
                sync()
                ms = (time.perf_counter() - t0) * 1e3 / inner[name]
            except Exception as e:
                errors[name] = failure(e)
                del samples[name]
                continue
            last_ms[name] = ms
            samples[name].append(ms)
    return samples


def in_grad_mode(fn, grad):
    def run():
        with torch.set_grad_enabled(grad):
            return fn()

    return run


def speed(args):
    dev = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    attn = torch.compile(flex_attention, dynamic=False)
    gen = torch.Generator(device="cpu").manual_seed(1)
    for i, t in enumerate(args.lengths):
        b = args.batch or max(args.tokens // t, 1)
        shape = (b, args.heads, t, args.head_dim)
        q, k, v, g = (torch.randn(shape, generator=gen).to(dev, dtype) for _ in range(4))
        # The causal mask is the same for every batch and head: one T x T block mask, broadcast.
        mask = create_block_mask(causal, None, None, t, t, device=dev)
        row = {"T": t, "B": b, "H": args.heads, "d": args.head_dim, "device": args.device, "dtype": args.dtype}
        errors, rel_errs = {}, []
        forward = {"lssa_fwd": (lambda: lssa(attn, q, k, v, mask), None)}
        forward["lssar15_fwd"] = (lambda: lssar(attn, q, k, v, mask, 15), 15)
        cells = {name: in_grad_mode(fn, False) for name, (fn, _) in forward.items()}
        if args.sdpa:
            cells["sdpa_fwd"] = in_grad_mode(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), False)
        if args.backward:
            qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
            fwd_bwd = {"lssa_fwd_bwd": lambda: lssa(attn, qg, kg, vg, mask)}
            if args.sdpa:
                fwd_bwd["sdpa_fwd_bwd"] = lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
            for name, fn in fwd_bwd.items():
                cells[name] = in_grad_mode(lambda fn=fn: (fn() * g).sum().backward(), True)
        # One failure (out of memory, an unsupported feature) costs one cell, not the row.
        row["samples_ms"] = rounds_ms(cells, sync, args, 0.02 if dev.type == "cuda" else 0.0, errors)
        if i == 0:
            for name, (fn, p) in forward.items():
                if name in row["samples_ms"]:
                    try:
                        want = materialised(q, k, v, p)
                        rel_errs.append(((cells[name]().float() - want).norm() / want.norm()).item())
                    except Exception as e:  # the T x T reference out of memory: no error figure
                        errors[f"{name}_check"] = failure(e)
        if rel_errs:
            row["rel_err_vs_materialised"] = max(rel_errs)
        if errors:
            row["errors"] = errors
        print(json.dumps(row), flush=True)
        del q, k, v, g
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    s = sub.add_parser("speed")
    s.add_argument("--device", default="cpu")
    s.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f16"])
    s.add_argument("--head-dim", type=int, default=64)
    s.add_argument("--heads", type=int, default=12)
    s.add_argument("--lengths", type=lambda x: [int(v) for v in x.split(",")], default=[1024])
    s.add_argument("--batch", type=int, default=0, help="batch size (0: from --tokens)")
    s.add_argument("--tokens", type=int, default=0, help="batch = max(tokens / T, 1) (0: batch 1)")
    s.add_argument("--threads", type=int, default=0)
    s.add_argument("--reps", type=int, default=7)
    s.add_argument("--min-reps", type=int, default=1)
    s.add_argument("--budget-s", type=float, default=4.0, help="timed seconds per cell and length")
    s.add_argument("--lead-in-below-s", type=float, default=0.0)
    s.add_argument("--backward", action="store_true")
    s.add_argument("--sdpa", action="store_true", help="also time libtorch's SDPA softmax, in the same rounds")
    args = parser.parse_args()
    if args.cmd == "check":
        check(args.dir)
    else:
        speed(args)


if __name__ == "__main__":
    sys.exit(main())
