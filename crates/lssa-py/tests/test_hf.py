"""``lssa.hf``: the variants as attention implementations of Hugging Face transformers, on a tiny
Llama-shaped model built from a config (nothing downloaded): grouped-query attention, training,
``generate`` with and without the KV cache, the materialised reference, padding, post-hoc re-weighting."""

import os

import pytest
import torch

if os.environ.get("LSSA_REQUIRE_TRANSFORMERS") == "1":
    import transformers  # noqa: F401 (cargo xtask test installs it: these tests must run, never skip)
else:
    transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

import lssa  # noqa: E402
import lssa.hf  # noqa: E402

VOCAB = 97


def tiny_llama(attn, seed=0, layers=2):
    """4 query heads on 2 key/value heads (grouped-query attention), head dimension 16."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn)


def tokens(b, t, seed):
    return torch.randint(1, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


def count_fused_calls(monkeypatch):
    """The shapes of every call into the fused kernels: through the custom op (training) or, for
    eager inference, straight to the kernels."""
    calls = []
    real_op, real_inference = lssa._ops.attention_fwd, lssa._ops.attention_inference

    def counting(q, k, v, variant, keep_aux):
        calls.append((tuple(q.shape), tuple(k.shape)))
        return real_op(q, k, v, variant, keep_aux)

    def counting_inference(q, k, v, variant):
        calls.append((tuple(q.shape), tuple(k.shape)))
        return real_inference(q, k, v, variant)

    monkeypatch.setattr(lssa._ops, "attention_fwd", counting)
    monkeypatch.setattr(lssa._ops, "attention_inference", counting_inference)
    return calls


def test_the_presets_are_registered_and_any_variant_can_be():
    assert set(lssa.hf.PRESETS) <= set(lssa.hf.registered())
    assert lssa.hf.register("lssa+rw3") == "lssa+rw3"
    assert tiny_llama("lssa+rw3").config._attn_implementation == "lssa+rw3"
    with pytest.raises(ValueError, match="unknown attention variant"):
        lssa.hf.register("lsa+rw15")


def test_grouped_query_llama_trains_fused(monkeypatch, no_fallback):
    model = tiny_llama("lssa+rw15")
    calls = count_fused_calls(monkeypatch)
    x = tokens(4, 32, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = model(x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses
    # Every layer of every step ran the kernels on the grouped heads as they are (no repeat).
    assert len(calls) == 20 * 2 and set(calls) == {((4, 4, 32, 16), (4, 2, 32, 16))}


@pytest.mark.parametrize("attn", ["lssa", "lssa+rw15"])
def test_generate_with_the_cache_equals_generate_without(attn, monkeypatch, no_fallback):
    model = tiny_llama(attn, seed=3).eval()
    prompt = tokens(2, 9, 2)
    mask = torch.ones_like(prompt)
    calls = count_fused_calls(monkeypatch)
    with torch.no_grad():
        cached = model.generate(prompt, attention_mask=mask, max_new_tokens=12, do_sample=False, use_cache=True)
        # The prefill, then one query row per layer and step against the growing cache, all fused.
        assert calls[:2] == [((2, 4, 9, 16), (2, 2, 9, 16))] * 2
        assert calls[2:] == [((2, 4, 1, 16), (2, 2, t, 16)) for t in range(10, 21) for _layer in range(2)]
        uncached = model.generate(prompt, attention_mask=mask, max_new_tokens=12, do_sample=False, use_cache=False)
    assert torch.equal(cached, uncached)
    assert cached.shape == (2, 21)


@pytest.mark.parametrize("attn", ["lssa", "lssa+rw15", "softmax"])
def test_logits_equal_the_materialised_reference(attn, no_fallback):
    model = tiny_llama(attn, seed=4)
    x = tokens(2, 40, 5)
    with torch.no_grad():
        fused = model(x).logits
        model.set_attn_implementation(lssa.hf.register(attn, name=f"{attn}-reference", backend="reference"))
        reference = model(x).logits
    err = (fused - reference).abs().max().item()
    assert err < 1e-4 * max(reference.abs().max().item(), 1.0), err


def test_softmax_through_lssa_equals_transformers_sdpa():
    model = tiny_llama("softmax", seed=6)
    x = tokens(2, 33, 7)
    with torch.no_grad():
        ours = model(x).logits
        model.set_attn_implementation("sdpa")
        theirs = model(x).logits
    assert (ours - theirs).abs().max().item() < 1e-4


def test_right_padding_is_exact_for_the_real_tokens_and_left_padding_is_an_error():
    model = tiny_llama("lssa+rw15", seed=8).eval()
    x = tokens(2, 12, 9)
    with torch.no_grad():
        alone = model(x[:1, :7]).logits
        right = torch.cat([x[:1, :7], torch.zeros(1, 5, dtype=torch.long)], 1)
        batch = torch.cat([right, x[1:]], 0)
        mask = torch.cat([torch.tensor([[1] * 7 + [0] * 5]), torch.ones(1, 12, dtype=torch.long)], 0)
        padded = model(batch, attention_mask=mask).logits
        assert (padded[:1, :7] - alone).abs().max().item() < 1e-5
        left = torch.cat([torch.zeros(1, 5, dtype=torch.long), x[:1, :7]], 1)
        left_mask = torch.tensor([[0] * 5 + [1] * 7])
        with pytest.raises(ValueError, match="pads on the left or has holes"):
            model(left, attention_mask=left_mask)


def test_post_hoc_reweighting_is_switching_the_implementation_name():
    trained = tiny_llama("lssa", seed=10)
    x = tokens(1, 48, 11)
    with torch.no_grad():
        plain = trained(x).logits
        trained.set_attn_implementation("lssa+rw15")
        sharpened = trained(x).logits
        built = tiny_llama("lssa+rw15", seed=10)  # the same weights, built with LSSAR from the start
        assert torch.equal(built(x).logits, sharpened)
    assert (plain - sharpened).abs().max().item() > 1e-3
