"""Partial rollouts in the hf engine (``Engine.new_weights``): weights loaded between two
tokens reach the running responses at once; the tokens before came from the old weights,
the ones after from the new, each scored by the weights that drew it and tagged with their
version.

Shapes: B prompts, G responses per prompt, N = B*G, T response tokens.
"""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_lm import PROMPTS, make_policy

pytest.importorskip("transformers")

G = 3


def moved(module: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """``module``'s state dict with every weight moved by noise of std 0.3: new weights."""
    gen = torch.Generator().manual_seed(seed)
    return {k: v + 0.3 * torch.randn(v.shape, generator=gen) for k, v in module.state_dict().items()}


class SwapAt:
    """``new_weights`` that loads ``state`` into the engine's module at its ``at``-th call
    (the call after token ``at`` of every running response) and says so."""

    def __init__(self, engine, state, at: int):
        self.engine, self.state, self.at, self.calls = engine, state, at, 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls != self.at + 1:
            return False
        self.engine.module.load_state_dict(self.state)
        self.engine.weights_version = 7
        return True


def test_new_weights_mid_generation_reach_the_running_responses(llama_dir):
    policy = make_policy(llama_dir, max_new_tokens=10, min_new_tokens=10)  # every response 10 tokens long
    old = copy.deepcopy(policy.module.state_dict())
    new = moved(policy.module, 1)
    swap = SwapAt(policy.engine, new, at=4)
    policy.engine.new_weights = swap
    samples = policy.sample(PROMPTS, G, 1.0, torch.Generator().manual_seed(0))
    policy.engine.new_weights = None
    versions = samples.token_versions  # [N, T]
    assert versions.shape == samples.response_ids.shape
    assert (versions[:, :5] == 0).all() and (versions[:, 5:] == 7).all()  # tokens 0..4 old, 5.. new
    # each token's recorded log-prob is that of the weights that drew it, scored on the same prefix
    scored_new, _ = policy.log_probs(samples, 1.0)  # the module holds the new weights now
    policy.module.load_state_dict(old)
    scored_old, _ = policy.log_probs(samples, 1.0)
    recorded = samples.sample_log_probs
    assert torch.allclose(recorded[:, :5], scored_old[:, :5], atol=1e-5)
    assert torch.allclose(recorded[:, 5:], scored_new[:, 5:], atol=1e-5)
    assert not torch.allclose(scored_old[:, 5:], scored_new[:, 5:], atol=1e-3)  # the weights did change


def test_without_new_weights_the_responses_are_unchanged(llama_dir):
    policy = make_policy(llama_dir, max_new_tokens=10)
    plain = policy.sample(PROMPTS, G, 1.0, torch.Generator().manual_seed(0))
    policy.engine.new_weights = lambda: False  # asked between tokens, never any new weights
    asked = policy.sample(PROMPTS, G, 1.0, torch.Generator().manual_seed(0))
    policy.engine.new_weights = None
    assert plain.token_versions is None and (asked.token_versions[asked.response_mask] == 0).all()
    assert torch.equal(plain.response_ids, asked.response_ids)
    assert torch.equal(plain.sample_log_probs, asked.sample_log_probs)
