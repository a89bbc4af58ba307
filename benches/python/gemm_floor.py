#!/usr/bin/env python3
"""The matrix products of one training step of a config's model (default `configs/small.toml`: 4 layers,
width 128, MLP 512, tied 2048-token head, batches of 16 sequences) at T tokens a sequence, timed alone
with torch's 2 threads: each linear's forward X W^T, and its backward's dX = dY W and dW = dY^T X; the
head's the same. A floor for any implementation's step that calls these products (the trainer and the
PyTorch loops all do); the attention's own products are not counted. Used by
`docs/bench/train-cpu-notes.md`:

    python benches/python/gemm_floor.py 64     # T = 64; 256 for T = 256; a config's path as a second argument
"""
import pathlib
import statistics
import sys
import time
import tomllib

import torch

torch.set_num_threads(2)
T = int(sys.argv[1])
config = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else pathlib.Path(__file__).parents[2] / "configs/small.toml")
cfg = tomllib.loads(config.read_text())
model = cfg["model"]
M = cfg["batch_size"] * T
width, hidden = model["d_model"], model["mlp_ratio"] * model["d_model"]
vocab = -(-model["vocab_size"] // 64) * 64  # gpt_model's padded_vocab
block = [(width, 3 * width), (width, width), (width, hidden), (hidden, width)]
shapes = block * model["n_layer"] + [(width, vocab)]
ops = []
for i, o in shapes:
    x, w, g = torch.randn(M, i), torch.randn(o, i), torch.randn(M, o)
    ops.append(lambda x=x, w=w: x @ w.t())
    ops.append(lambda g=g, w=w: g @ w)
    ops.append(lambda g=g, x=x: g.t() @ x)
flops = sum(2 * M * i * o * 3 for i, o in shapes)


def once():
    s = time.perf_counter()
    for f in ops:
        f()
    return time.perf_counter() - s


for _ in range(5):
    once()
ts = [once() for _ in range(30)]
m = statistics.median(ts)
print(
    f"T={T}: {flops / 1e9:.2f} GFLOP of products a step, median {m * 1e3:.1f} ms "
    f"({min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f}), {flops / m / 1e9:.1f} GFLOP/s"
)
