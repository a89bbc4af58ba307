"""The PyTorch eager training loop a user would write (nanoGPT style) at the trainer's shape.

The model is the trainer's GPT (crates/gpt-model): pre-LayerNorm blocks, rotate-half RoPE on q and
k, GELU MLP (erf), tied embedding and head, mean cross-entropy; torch.optim.AdamW (decay on
matrices only) and clip_grad_norm_, one optimiser step per batch of random token ids. Attention is
F.scaled_dot_product_attention(is_causal=True) for softmax, and lssa.attention (the project's fused
op) for every other variant, so the two loops run the same attention kernels; with --materialised,
lssa.reference_attention instead: the variant as plain PyTorch ops with (B, H, T, T) weights, what a
PyTorch user without the fused kernels writes. With --compile the model runs under torch.compile
(Inductor; on the CPU its C++ backend), what a PyTorch user runs to go faster; its compilation
happens in the untimed warm-up steps.

    python benches/python/train_eager.py --attention softmax --threads 2 --steps 200 --json

prints one JSON line: the median tokens/s over the timed steps (and their count), after --warmup
untimed steps.
"""

import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, n_head, mlp_ratio, attend):
        super().__init__()
        self.n_head = n_head
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.attn_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, mlp_ratio * d)
        self.mlp_proj = nn.Linear(mlp_ratio * d, d)
        self.attend = attend

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        heads = lambda z: z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
        q, k, v = rope(heads(q), cos, sin), rope(heads(k), cos, sin), heads(v)
        y = self.attend(q, k, v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.attn_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Gpt(nn.Module):
    def __init__(self, n_layer, n_head, d, vocab, context, mlp_ratio, attend, rope_base=10000.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.h = nn.ModuleList(Block(d, n_head, mlp_ratio, attend) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        hd = d // n_head
        inv_freq = rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        angles = torch.arange(context, dtype=torch.float64)[:, None] * inv_freq[None, :]
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.h:
            x = blk(x, cos, sin)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def attention_for(name, materialised=False):
    if name == "softmax":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    import lssa

    if materialised:
        return lambda q, k, v: lssa.reference_attention(q, k, v, variant=name)
    return lambda q, k, v: lssa.attention(q, k, v, variant=name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", default="softmax")
    ap.add_argument("--materialised", action="store_true", help="the variant as PyTorch ops, not the fused op")
    ap.add_argument("--compile", action="store_true", help="the model under torch.compile (Inductor)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="print torch.profiler's op table instead")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Gpt(args.layers, args.heads, args.width, args.vocab, args.context, 4, attention_for(args.attention, args.materialised))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    if args.compile:
        model = torch.compile(model)
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=2e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    gen = torch.Generator().manual_seed(args.seed)
    shape = (args.batch, args.context)

    def step():
        x = torch.randint(args.vocab, shape, generator=gen)
        y = torch.randint(args.vocab, shape, generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        return
    rates = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        rates.append(args.batch * args.context / (time.perf_counter() - t0))
    out = {"attention": args.attention, "compiled": args.compile, "threads": args.threads, "steps": len(rates), "tokens_per_s": statistics.median(rates)}
    print(json.dumps(out) if args.json else f"{args.attention}: {out['tokens_per_s']:.0f} tokens/s (median of {len(rates)} steps)")


if __name__ == "__main__":
    main()
