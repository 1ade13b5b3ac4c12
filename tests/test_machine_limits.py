"""benchmarks/machine_limits.py: the FLOPs and bytes of a step counted from a model's shapes, by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def limits(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import machine_limits

    return machine_limits


def small(limits, parameters: int = 1000):
    return limits.Shapes(hidden=4, intermediate=8, layers=2, heads=2, kv_heads=1, head_dim=2, vocab=10,
                         parameters=parameters, bytes_per_parameter=4)


def test_update_flops_by_hand(limits):
    tokens = limits.StepTokens(prompt_lengths=[3], response_lengths=[2, 1], prompt_of_row=[0, 0])
    flops = limits.update_flops(small(limits), tokens)
    # per token, forward: 2 * (q 4x4 + k, v 4x2 + o 4x4 + gate, up 4x8 + down 8x4) per layer, 2 layers = 576;
    # 6 body tokens (the prompt once, 3 response tokens), backward twice the forward
    assert flops["linear"] == 3 * 576 * 6
    assert flops["head"] == 3 * 2 * 4 * 10 * 3  # at the 3 response tokens only
    # causal (query, key) pairs: the prompt 1 + 2 + 3, row 0's tokens see 4 and 5, row 1's 4
    assert flops["attention"] == 3 * 4 * (6 + 9 + 4) * 2 * 2 * 2


def test_decode_bound_by_hand(limits):
    shapes = small(limits, parameters=1000)
    tokens = limits.StepTokens(prompt_lengths=[3], response_lengths=[2, 1], prompt_of_row=[0, 0])
    bound = limits.decode_limit(shapes, tokens, bandwidth=1e6)
    kv = 2 * 2 * 1 * 2 * 4  # bytes of K and V per cached position
    # position 0: both rows, contexts 3 and 3; position 1: row 0 alone, context 4; the weights each time
    assert bound["bandwidth_seconds"] == pytest.approx((2 * 4000 + kv * (6 + 4)) / 1e6)
    assert bound["compute_seconds"] > 0
    assert max(bound["bandwidth_seconds"], bound["compute_seconds"]) <= bound["seconds"]
    assert bound["seconds"] <= bound["bandwidth_seconds"] + bound["compute_seconds"]
    assert bound["tokens_per_s"] == pytest.approx(3 / bound["seconds"])


def test_shapes_of_a_llama(limits):
    from rlvr.modeling import build_model

    model = build_model("llama", vocab_size=17, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                        tie_embeddings=True, seed=0)
    shapes = limits.Shapes.of(model)
    assert (shapes.hidden, shapes.intermediate, shapes.layers, shapes.heads, shapes.head_dim) == (32, 64, 2, 4, 8)
    assert shapes.parameters == sum(p.numel() for p in model.parameters()) and shapes.bytes_per_parameter == 4
    linear = sum(i * o * n for i, o, n in shapes.linears())
    norms = (2 * 2 + 1) * 32
    assert shapes.parameters == linear + 17 * 32 + norms  # the tied head counted once
    assert limits.update_limit(shapes, limits.StepTokens([4], [3, 2], [0, 0]))["flops_per_s"] > 0


def test_positions_run_are_the_real_tokens_without_padding(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import grpo_step

    def samples(response_lengths, prompt_width=5):
        rows = len(response_lengths)
        mask = torch.arange(max(response_lengths))[None, :] < torch.tensor(response_lengths)[:, None]
        return type("Samples", (), {"prompt_ids": torch.zeros(rows, prompt_width, dtype=torch.long),
                                    "prompt_mask": torch.ones(rows, prompt_width, dtype=torch.bool),
                                    "response_mask": mask})()

    even = samples([4, 4, 4, 4])
    tokens = grpo_step.step_tokens(even, group_size=2)
    assert tokens == grpo_step.StepTokens([5, 5], [4, 4, 4, 4], [0, 0, 1, 1])
    assert grpo_step.positions_run(even, tokens, share=True) == (2 * 5 + 16, 2 * 5 + 16)
    assert grpo_step.positions_run(even, tokens, share=False) == (4 * 5 + 16, 4 * 5 + 16)
    split = samples([1, 9, 2, 9])  # a bucket per width: no padding run
    assert grpo_step.positions_run(split, grpo_step.step_tokens(split, 2), share=True) == (2 * 5 + 21, 2 * 5 + 21)
    close = samples([8, 9, 8, 9])  # splitting would save under a quarter: one pass, 9 wide
    assert grpo_step.positions_run(close, grpo_step.step_tokens(close, 2), share=True) == (2 * 5 + 36, 2 * 5 + 34)
    assert sys.modules["machine_limits"].StepTokens is grpo_step.StepTokens
