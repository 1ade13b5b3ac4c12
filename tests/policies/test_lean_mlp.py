"""The lean gated MLP: every number of the model's own MLP, forward and gradients, with two of its four wide
activations kept for backward instead of four."""

from __future__ import annotations

import copy

import torch
from tiny_lm import saved_bytes

from rlvr.modeling import build_model
from rlvr.policies.lean_mlp import lean_mlps


def test_lean_mlp_gives_the_same_numbers_and_keeps_less():
    plain = build_model("llama", vocab_size=40, hidden_size=64, intermediate_size=256, num_layers=3, num_heads=4,
                        tie_embeddings=True, seed=0)
    lean = copy.deepcopy(plain)
    assert lean_mlps(lean) == 3 and lean_mlps(lean) == 0  # once each
    ids = torch.randint(0, 40, (5, 11), generator=torch.Generator().manual_seed(0))
    runs = []
    for model in (plain, lean):
        logits, kept = saved_bytes(model, ids)
        (logits.square().mean() + logits[:, -1].sum()).backward()
        runs.append((logits, kept, {name: p.grad for name, p in model.named_parameters()}))
    (plain_logits, plain_kept, plain_grads), (lean_logits, lean_kept, lean_grads) = runs
    assert torch.equal(lean_logits, plain_logits)
    assert plain_grads.keys() == lean_grads.keys()
    assert all(torch.equal(lean_grads[name], plain_grads[name]) for name in plain_grads)
    wide = 5 * 11 * 256 * 4  # one [tokens, intermediate] float32 activation
    assert plain_kept - lean_kept == 3 * 2 * wide  # silu(gate) and the product, in each of 3 layers


def test_lean_mlp_without_autograd_is_the_models_own_forward():
    model = build_model("llama", vocab_size=40, hidden_size=64, intermediate_size=256, num_layers=2, num_heads=4,
                        seed=1)
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        lean_mlps(model)
        assert torch.equal(model(input_ids=ids).logits, expected)
