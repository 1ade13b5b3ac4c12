"""Grouped-query attention without repeated keys and values: transformers' sdpa numbers within float32 rounding,
forward and gradients, a third of the keys and values kept for backward on 3 query heads per key/value head."""

from __future__ import annotations

import copy

import torch
from tiny_lm import saved_bytes
from transformers import AutoModelForCausalLM, LlamaConfig

from rlvr.policies.grouped_attention import NAME, grouped_attention


def grouped_llama() -> torch.nn.Module:
    config = LlamaConfig(vocab_size=40, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config)


def test_grouped_attention_gives_sdpas_numbers_and_keeps_less():
    plain = grouped_llama()
    grouped = copy.deepcopy(plain)
    assert grouped_attention(grouped) and grouped.config._attn_implementation == NAME
    ids = torch.randint(0, 40, (4, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: a mask, where transformers repeats the key/value heads
    runs = []
    for model in (plain, grouped):
        logits, kept = saved_bytes(model, ids, attention_mask=mask)
        (logits.square().mean() + logits[:, -1].sum()).backward()
        runs.append((logits, kept, {name: p.grad for name, p in model.named_parameters()}))
    (plain_logits, plain_kept, plain_grads), (logits, kept, grads) = runs
    torch.testing.assert_close(logits, plain_logits, rtol=0, atol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-6)
    repeated = 2 * 2 * 4 * 6 * 10 * 8 * 4  # 2 layers, keys and values [4, 6 heads, 10, 8] float32
    assert plain_kept - kept >= repeated * 2 // 3  # the repeated copies: 6 heads kept where 2 are the data


def test_other_attention_is_left_alone():
    model = grouped_llama()
    model.set_attn_implementation("eager")
    assert not grouped_attention(model) and model.config._attn_implementation == "eager"
