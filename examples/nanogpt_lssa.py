"""A nanoGPT-style language model whose attention line is either PyTorch's SDPA softmax or lssa.

    pip install ./crates/lssa-py                      # once, from the repository root
    cargo xtask data --vocab-size 2048 --out data/bpe2k   # the default corpus shards, once (or data/default)
    python examples/nanogpt_lssa.py --attn lssa --variant lssa+rw15 --steps 300
    python examples/nanogpt_lssa.py --attn sdpa --steps 300   # the same model with softmax, to compare

The model is nanoGPT's (Karpathy): token and learned position embeddings, pre-norm blocks of causal
self-attention and a GELU MLP, weight-tied head, AdamW with warm-up and cosine decay. The one line
that differs is in ``CausalSelfAttention.forward``:

    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)      # --attn sdpa
    y = lssa.attention(q, k, v, variant=self.variant)                # --attn lssa

Data: llm.c token shards (``*.bin``: a header of 256 int32 words, magic 20240520, version 1 and the
token count, then uint16 tokens), read with numpy; the vocabulary size comes from the directory's
``manifest.json`` when there is one. Prints the training loss as it goes and the validation loss at
the end (from the ``*_val_*`` shard beside the training one, when there is one).
"""

import argparse
import glob
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import lssa

MAGIC, VERSION, HEADER_WORDS = 20240520, 1, 256


def read_shard(path):
    """The uint16 tokens of one llm.c shard (memory-mapped), after checking its header."""
    header = np.fromfile(path, dtype=np.int32, count=HEADER_WORDS)
    if header.size != HEADER_WORDS or header[0] != MAGIC or header[1] != VERSION:
        raise ValueError(f"{path}: not an llm.c token shard (magic {header[:1]}, expected {MAGIC}, version {VERSION})")
    count = int(header[2])
    tokens = np.memmap(path, dtype=np.uint16, mode="r", offset=HEADER_WORDS * 4, shape=(count,))
    return tokens


def default_train_shard(root):
    for pattern in ("data/default/*train*.bin", "data/bpe2k/*train*.bin"):
        found = sorted(glob.glob(os.path.join(root, pattern)))
        if found:
            return found[0]
    raise SystemExit(
        "no token shards found under data/default or data/bpe2k: run `cargo xtask data --vocab-size 2048 --out "
        "data/bpe2k` first, or pass --data FILE.bin"
    )


def shards(data):
    """The training shard (``data``, else the default corpus's first), its tokens, and the tokens of the
    validation shard beside it (``None`` when there is none)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    shard = data or default_train_shard(root)
    val_path = shard.replace("_train_", "_val_")
    val = read_shard(val_path) if val_path != shard and os.path.exists(val_path) else None
    return shard, read_shard(shard), val


def vocab_size(shard, tokens):
    manifest = os.path.join(os.path.dirname(shard), "manifest.json")
    if os.path.exists(manifest):
        with open(manifest) as f:
            return int(json.load(f)["tokenizer"]["vocab_size"])
    return int(tokens.max()) + 1


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, attn, variant):
        super().__init__()
        self.heads, self.attn, self.variant = heads, attn, variant
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        # (B, T, 3, H, d) -> three (B, H, T, d) views of the one projection: lssa reads them in place.
        q, k, v = self.c_attn(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = lssa.attention(q, k, v, variant=self.variant)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width, heads, attn, variant):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, attn, variant)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab, block_size, layers, width, heads, attn, variant):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, heads, attn, variant) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss


def batch(tokens, batch_size, block_size, gen, device):
    starts = torch.randint(0, len(tokens) - block_size - 1, (batch_size,), generator=gen).tolist()
    rows = np.stack([np.asarray(tokens[s : s + block_size + 1], dtype=np.int64) for s in starts])
    xy = torch.from_numpy(rows).to(device)
    return xy[:, :-1], xy[:, 1:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attn", choices=["lssa", "sdpa"], default="lssa", help="the attention line (default lssa)")
    ap.add_argument("--variant", default="lssa+rw15", help="lssa variant name (default lssa+rw15, LSSAR)")
    ap.add_argument("--data", help="training shard (default: data/default or data/bpe2k, first *train*.bin)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--block", type=int, default=128, help="context length T")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-batches", type=int, default=20)
    ap.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) the model")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    shard, train, val = shards(args.data)
    vocab = vocab_size(shard, train)

    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = GPT(vocab, args.block, args.layers, args.width, args.heads, args.attn, args.variant).to(args.device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    step_fn = torch.compile(model, fullgraph=True) if args.compile else model
    attn = f"lssa.attention({args.variant})" if args.attn == "lssa" else "SDPA softmax"
    params = sum(p.numel() for p in model.parameters())
    print(f"{attn}: {params / 1e6:.2f}M parameters, {len(train):,} training tokens from {shard}, vocab {vocab}, "
          f"T = {args.block}, batch {args.batch}, {args.device}")

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        progress = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    start, smoothed = time.time(), None
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        x, y = batch(train, args.batch, args.block, gen, args.device)
        _, loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smoothed = loss.item() if smoothed is None else 0.9 * smoothed + 0.1 * loss.item()
        if step % args.log_every == 0 or step == args.steps - 1:
            ms = (time.time() - start) / (step + 1) * 1000
            print(f"step {step:5d}  loss {loss.item():.4f}  (smoothed {smoothed:.4f})  lr {lr_at(step):.2e}  "
                  f"{ms:.0f} ms/step")

    if val is not None:
        model.eval()
        vgen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            batches = [batch(val, args.batch, args.block, vgen, args.device) for _ in range(args.eval_batches)]
            losses = [model(x, y)[1].item() for x, y in batches]
        print(f"validation loss {sum(losses) / len(losses):.4f} "
              f"({args.eval_batches} batches of {args.batch} x {args.block} tokens)")


if __name__ == "__main__":
    main()
