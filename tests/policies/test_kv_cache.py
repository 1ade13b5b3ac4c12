"""HFEngine's preallocated KV cache against transformers' growing cache and against no cache.

Shapes: B prompts, G responses per prompt, N = B*G, H heads, L positions, D head size.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_lm import make_policy

pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer  # noqa: E402

from rlvr.engines import kv_cache  # noqa: E402

PROMPTS = ["123456>", "98>", "5", "3 1 4>"]  # different lengths: left padding
SETTINGS = [{}, {"top_k": 5, "top_p": 0.9, "min_new_tokens": 2, "stop_strings": ["3"]}]


def generate(policy, seed: int, group_size: int = 6, temperature: float = 0.9):
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)  # [B, P]
    sampling = dataclasses.replace(policy.sampling, temperature=temperature)
    return policy.engine.generate(prompt_ids, prompt_mask, group_size, sampling, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("settings", SETTINGS)
def test_preallocated_cache_gives_the_growing_caches_numbers_bit_for_bit(model_dir, settings, monkeypatch):
    # The reference is transformers' DynamicCache, grown by concatenation (the engine's
    # fallback when preallocated_cache returns None). Attention reads the same values in
    # the same order, so tokens and log-probs must be equal, not merely close.
    policy = make_policy(model_dir, max_new_tokens=24, **settings)
    built = []
    original = kv_cache.preallocated_cache
    monkeypatch.setattr(kv_cache, "preallocated_cache", lambda *a: built.append(original(*a)) or built[-1])
    fast = [generate(policy, seed) for seed in range(3)]
    assert len(built) == 3 and all(cache is not None for cache in built)  # the preallocated path ran
    monkeypatch.setattr(kv_cache, "preallocated_cache", lambda *a: None)
    for seed, got in enumerate(fast):
        want = generate(policy, seed)
        assert torch.equal(got.response_ids, want.response_ids)
        assert torch.equal(got.response_mask, want.response_mask)
        assert torch.equal(got.sample_log_probs, want.sample_log_probs)
    lengths = torch.cat([g.lengths for g in fast])
    assert lengths.min() < lengths.max()  # rows ended at different steps: the cache was compacted
    assert lengths.max() > kv_cache.INITIAL_HEADROOM  # and outgrew its first buffers: they doubled


def test_cached_sampling_matches_an_uncached_forward_per_response(model_dir):
    # Slow reference: each response scored alone, unpadded, by one forward over prompt +
    # response, no cache. Float32 sums in another order differ by rounding only: 1e-5 is
    # ~100 float32 ulps at log-probs of magnitude ~3, far below any indexing or position
    # error (those move log-probs by O(0.1) on this random model).
    policy = make_policy(model_dir, max_new_tokens=24)
    generation = generate(policy, seed=5, group_size=8, temperature=1.0)
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)
    for row in range(generation.response_ids.shape[0]):
        prompt = prompt_ids[row // 8][prompt_mask[row // 8]].tolist()
        response = generation.response_ids[row][generation.response_mask[row]].tolist()
        with torch.no_grad():
            logits = policy.module(torch.tensor([prompt + response])).logits[0, len(prompt) - 1: -1]  # [t, V]
        want = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0]
        got = generation.sample_log_probs[row, : len(response)]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_cache_layer_writes_in_place_doubles_when_full_and_compacts_like_indexing():
    gen = torch.Generator().manual_seed(0)
    keys, values = torch.randn(2, 3, 4, 5, generator=gen), torch.randn(2, 3, 4, 5, generator=gen)  # [B, H, P, D]
    prompt = DynamicCache()
    prompt.update(keys, values, 0)
    cache = kv_cache.preallocated_cache(prompt, group_size=3, max_capacity=10, headroom=2)  # [N=6, H, 6, D]
    layer = cache.layers[0]
    want_keys, want_values = keys.repeat_interleave(3, dim=0), values.repeat_interleave(3, dim=0)
    assert torch.equal(layer.keys, want_keys) and cache.get_seq_length() == 4
    capacities, buffers = [], []
    for _ in range(5):  # positions 5..9: room for 6, then doubled (capped at 10)
        new_keys, new_values = torch.randn(6, 3, 1, 5, generator=gen), torch.randn(6, 3, 1, 5, generator=gen)
        got_keys, got_values = cache.update(new_keys, new_values, 0)
        want_keys, want_values = torch.cat([want_keys, new_keys], -2), torch.cat([want_values, new_values], -2)
        assert torch.equal(got_keys, want_keys) and torch.equal(got_values, want_values)
        capacities.append(layer.key_buffer.shape[-2])
        buffers.append(layer.key_buffer.data_ptr())
    assert capacities == [6, 6, 10, 10, 10]
    assert buffers[0] == buffers[1] and buffers[2] == buffers[3] == buffers[4]  # in place between doublings
    rows = torch.tensor([1, 4, 5])
    cache.batch_select_indices(rows)
    assert torch.equal(layer.keys, want_keys[rows]) and torch.equal(layer.values, want_values[rows])
    assert cache.get_seq_length() == 9 and layer.key_buffer.shape == (3, 3, 10, 5)
    cache.update(*(torch.zeros(3, 3, 1, 5) for _ in range(2)), 0)  # position 10 of 10
    with pytest.raises(RuntimeError, match="KV cache full"):
        cache.update(*(torch.zeros(3, 3, 1, 5) for _ in range(2)), 0)


def test_layers_other_than_plain_dynamic_ones_keep_their_own_cache():
    # a sliding-window layer drops old positions: a buffer of every position would be wrong for it
    mixed = DynamicCache()
    mixed.layers = [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=4)]
    for layer in mixed.layers:
        layer.update(torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    assert kv_cache.preallocated_cache(mixed, group_size=2, max_capacity=8) is None
