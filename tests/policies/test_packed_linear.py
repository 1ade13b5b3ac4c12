"""Linear layers on oneDNN's reordered weights while an engine samples: same numbers within float32 rounding, torch's
own linear wherever autograd records, new weights picked up, every layer restored."""

from __future__ import annotations

import pytest
import torch
from tiny_lm import PROMPTS, make_policy

from rlvr.engines.hf import HFEngine
from rlvr.engines.packed_linear import available, packed_linears

pytestmark = pytest.mark.skipif(not available(), reason="this torch build has no oneDNN linear")


def test_packed_linears_match_torch_and_leave_autograd_alone(llama_dir):
    model = make_policy(llama_dir).module
    ids = torch.randint(3, 17, (6, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    with packed_linears(model, rows=6) as packed:
        assert packed == linears > 0
        with torch.inference_mode():
            got = model(input_ids=ids).logits
        with_grad = model(input_ids=ids).logits  # autograd records: torch's own linear, every number the same
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert torch.equal(with_grad, expected) and with_grad.requires_grad
    assert not any("forward" in vars(m) for m in model.modules() if type(m) is torch.nn.Linear)  # every one restored


def test_packed_linears_follow_weights_changed_in_place(llama_dir):
    model = make_policy(llama_dir).module
    layer = next(m for m in model.modules() if type(m) is torch.nn.Linear)
    x = torch.randn(4, layer.in_features, generator=torch.Generator().manual_seed(1))
    with packed_linears(model, rows=4), torch.inference_mode():
        before = layer(x)
        with torch.no_grad():
            layer.weight.mul_(2.0)  # as load_state_dict writes new weights mid-generation
        after = layer(x)
    torch.testing.assert_close(after, 2.0 * before, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(after, torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=0, atol=1e-5)


def test_packed_linear_with_a_bias_on_batched_input():
    layer = torch.nn.Linear(8, 5)
    x = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = layer(x)
    with packed_linears(layer, rows=12) as packed, torch.inference_mode():
        assert packed == 1
        got = layer(x)
    assert got.shape == (3, 4, 5)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_engine_samples_the_same_with_and_without_packing(llama_dir):
    """Same draws and log-probs within float32 rounding (a fixed seed: no draw lies within rounding of a boundary)."""
    policy = make_policy(llama_dir, max_new_tokens=8)
    plain = HFEngine(policy.module, policy.tokenizer, policy.pad_id, pack_linears=False)
    packed = HFEngine(policy.module, policy.tokenizer, policy.pad_id)
    runs = []
    for engine in (plain, packed):
        policy.engine = engine
        runs.append(policy.sample(PROMPTS, 4, 1.0, torch.Generator().manual_seed(0)))
    assert torch.equal(runs[0].response_ids, runs[1].response_ids)
    torch.testing.assert_close(runs[1].sample_log_probs, runs[0].sample_log_probs, rtol=0, atol=1e-5)
