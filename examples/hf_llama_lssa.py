"""A Hugging Face transformers Llama trained with LSSA, then evaluated beyond its training length with
and without post-hoc re-weighting, by switching its attention implementation.

    pip install "./crates/lssa-py[hf]"                       # once, from the repository root
    cargo xtask data                                         # the default corpus -> data/default, once
    python examples/hf_llama_lssa.py                         # LSSA, 300 steps at T = 128, then 1x-4x
    python examples/hf_llama_lssa.py --attn softmax          # the same model with softmax, to compare

The model is transformers' ``LlamaForCausalLM`` built from a config (nothing downloaded): RMSNorm,
SwiGLU, RoPE, grouped-query attention (4 query heads on 2 key/value heads). The only LSSA-specific
line is ``attn_implementation=`` after ``import lssa.hf``; RoPE and its scaling (``--rope-scaling
dynamic`` for NTK-aware scaling) are transformers'. After training, the validation loss is read at 1x,
2x and 4x the training length with the trained implementation and with ``<attn>+rw15``, the
re-weighting the paper applies after training (``model.set_attn_implementation``). Data: llm.c token
shards, read as ``examples/nanogpt_lssa.py`` reads them.
"""

import argparse
import math
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import lssa.hf
from nanogpt_lssa import shards, vocab_size


def windows(tokens, count, length, gen):
    """``count`` random windows of ``length + 1`` tokens as ``(inputs, labels)``: the labels are the
    inputs themselves (transformers shifts them)."""
    starts = torch.randint(0, len(tokens) - length - 1, (count,), generator=gen).tolist()
    rows = np.stack([np.asarray(tokens[s : s + length], dtype=np.int64) for s in starts])
    x = torch.from_numpy(rows)
    return x, x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attn", default="lssa", help="lssa variant to train with (default lssa; softmax to compare)")
    ap.add_argument("--data", help="training shard (default: data/default or data/bpe2k, first *train*.bin)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=128, help="training length T")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--rope-scaling", choices=["none", "dynamic"], default="none",
                    help="transformers' rope_scaling beyond the training length (dynamic: NTK-aware)")
    ap.add_argument("--lengths", default="1,2,4", help="evaluation lengths, as multiples of T")
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    shard, train, val = shards(args.data)
    val = train if val is None else val
    lengths = [int(m) * args.block for m in args.lengths.split(",")]

    trained_as = lssa.hf.register(args.attn)
    post_hoc = lssa.hf.register(f"{args.attn}+rw15")
    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=vocab_size(shard, train),
        hidden_size=args.width,
        intermediate_size=4 * args.width,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=args.block,
        rope_scaling=None if args.rope_scaling == "none" else {"rope_type": "dynamic", "factor": max(lengths) / args.block},
        tie_word_embeddings=True,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation=trained_as)
    params = sum(p.numel() for p in model.parameters())
    print(f"Llama, attn_implementation={trained_as!r}: {params / 1e6:.2f}M parameters, {len(train):,} training "
          f"tokens from {shard}, T = {args.block}, batch {args.batch}")

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.time()
    for step in range(args.steps):
        warm = (step + 1) / args.warmup
        cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = args.lr * min(warm, cosine)
        x, y = windows(train, args.batch, args.block, gen)
        loss = model(x, labels=y).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step:4d}  loss {loss.item():.4f}  {(time.time() - start) / (step + 1) * 1000:.0f} ms/step")

    model.eval()
    print(f"\nvalidation loss (nats/token), {args.eval_windows} windows per length, rope_scaling {args.rope_scaling}:")
    print(f"{'length':>8}  " + "  ".join(f"{name:>14}" for name in (trained_as, post_hoc)))
    for length in lengths:
        vgen = torch.Generator().manual_seed(0)  # the same windows for both implementations
        x, y = windows(val, args.eval_windows, length, vgen)
        row = []
        for name in (trained_as, post_hoc):
            model.set_attn_implementation(name)
            with torch.no_grad():
                row.append(model(x, labels=y).loss.item())
        print(f"{length:>5} ({length // args.block}x)  " + "  ".join(f"{v:>14.4f}" for v in row))
    model.set_attn_implementation(trained_as)


if __name__ == "__main__":
    main()
