"""The generation seam: SamplingParams, HFEngine behind CausalLMPolicy, weights, scoring with another module.

Shapes: B prompts, G responses per prompt, N = B*G, P prompt tokens, T response tokens.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from tiny_lm import PROMPTS, make_policy

from rlvr.engines import SamplingParams
from rlvr.engines.hf import HFEngine
from rlvr.modeling import load_model_and_tokenizer
from rlvr.policies.causal_lm import CausalLMPolicy


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """``module`` with every weight moved by noise of std 0.05 (in place; returned)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module


def test_sampling_params_validate_and_hold_tuples():
    params = SamplingParams(stop_strings=["=", "+"], eos_token_ids=[2], stop_token_ids=[7, 2])
    assert params.stop_strings == ("=", "+") and params.end_token_ids == (2, 7)
    assert not params.greedy and dataclasses.replace(params, temperature=0.0).greedy
    for bad, match in ((dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
                       (dict(max_new_tokens=0), "max_new_tokens"), (dict(min_new_tokens=65), "min_new_tokens"),
                       (dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
                       (dict(stop_strings="3"), "stop_strings"), (dict(stop_strings=[""]), "stop_strings")):
        with pytest.raises(ValueError, match=match):
            SamplingParams(**bad)


@pytest.mark.parametrize("settings", [{}, {"top_k": 5, "top_p": 0.9, "min_new_tokens": 2, "stop_strings": ["3"]}])
def test_policy_sample_is_its_engine_plus_decoding(llama_dir, settings):
    # the whole of generation lies behind the seam: the engine alone gives the same
    # tokens and log-probs, and the policy adds only prompt encoding and text
    policy = make_policy(llama_dir, **settings)
    samples = policy.sample(PROMPTS, 4, 0.8, torch.Generator().manual_seed(3))
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)  # [B, P]
    sampling = dataclasses.replace(policy.sampling, temperature=0.8)
    generation = policy.engine.generate(prompt_ids, prompt_mask, 4, sampling, torch.Generator().manual_seed(3))
    assert torch.equal(generation.response_ids, samples.response_ids)
    assert torch.equal(generation.response_mask, samples.response_mask)
    assert torch.equal(generation.sample_log_probs, samples.sample_log_probs)
    assert [t for group in samples.responses for t in group] == policy.decode(generation)
    assert torch.equal(generation.lengths, samples.response_mask.sum(-1))


def test_greedy_is_temperature_zero_through_the_engine(llama_dir):
    policy = make_policy(llama_dir)
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)
    greedy = dataclasses.replace(policy.sampling, temperature=0.0)
    generation = policy.engine.generate(prompt_ids, prompt_mask, 2, greedy)  # no generator needed
    texts = policy.decode(generation)
    assert texts[0::2] == texts[1::2] == [text for [text] in policy.greedy(PROMPTS)]
    assert (generation.sample_log_probs == 0).all()  # no tau > 0 to score under
    with pytest.raises(ValueError, match="Generator"):
        policy.engine.generate(prompt_ids, prompt_mask, 2, policy.sampling)
    with pytest.raises(ValueError, match="group_size"):
        policy.engine.generate(prompt_ids, prompt_mask, 0, greedy)


def test_stop_token_ids_end_responses_after_min_new_tokens(llama_dir):
    policy = make_policy(llama_dir)
    prompt_ids, prompt_mask = policy.encode_prompts(PROMPTS)
    greedy = dataclasses.replace(policy.sampling, temperature=0.0)
    free = policy.engine.generate(prompt_ids, prompt_mask, 1, greedy)
    first = free.response_ids[0, 0].item()  # prompt 0's argmax first token, not EOS
    assert first not in greedy.eos_token_ids
    stopped = policy.engine.generate(prompt_ids, prompt_mask, 1, dataclasses.replace(greedy, stop_token_ids=(first,)))
    assert stopped.lengths[0] == 1 and stopped.response_ids[0, 0] == first  # kept, like EOS
    held = dataclasses.replace(greedy, stop_token_ids=(first,), min_new_tokens=1)
    assert policy.engine.generate(prompt_ids, prompt_mask, 1, held).response_ids[0, 0] != first


def test_shared_engine_takes_weights_without_copying(llama_dir):
    policy = make_policy(llama_dir)
    before = [p.data_ptr() for p in policy.engine.module.parameters()]
    assert policy.engine.module is policy.module and policy.engine.weights_version == 0
    policy.sample(PROMPTS, 2, 1.0, torch.Generator().manual_seed(0))
    policy.greedy(PROMPTS)
    assert policy.engine.weights_version == 0  # generation hands nothing over; the trainer syncs
    assert policy.sync_engine() == {"engine/weights_version": 1.0}
    assert [p.data_ptr() for p in policy.engine.module.parameters()] == before


def test_engine_with_its_own_weights_samples_the_policys_after_load_weights(llama_dir):
    # an engine holding another copy (as a vLLM or Ray worker will) gets the trainer's
    # weights when the policy is built and at each sync: same samples as the in-process
    # engine, bit for bit
    plain = make_policy(llama_dir)
    model, tokenizer = load_model_and_tokenizer(llama_dir)
    stale, _ = load_model_and_tokenizer(llama_dir)
    engine = HFEngine(perturbed(stale, seed=0), tokenizer, plain.pad_id)
    policy = CausalLMPolicy(model, tokenizer, max_new_tokens=12, engine=engine)
    first = policy.sample(PROMPTS, 3, 1.0, torch.Generator().manual_seed(5))
    want = plain.sample(PROMPTS, 3, 1.0, torch.Generator().manual_seed(5))
    assert engine.weights_version == 1 and engine.module is stale
    assert torch.equal(first.response_ids, want.response_ids)
    assert torch.equal(first.sample_log_probs, want.sample_log_probs)
    perturbed(policy.module, seed=1)  # a training step, say
    engine.load_weights(policy.module.state_dict())  # a state dict works too
    for got, new in zip(stale.parameters(), policy.module.parameters()):
        assert torch.equal(got, new) and got.data_ptr() != new.data_ptr()


@pytest.mark.parametrize("share_prompts", [True, False])
def test_log_probs_of_another_module_leave_the_policy_alone(llama_dir, share_prompts):
    # the KL reference is scored through ``module=``, not by swapping ``policy.module``
    policy = make_policy(llama_dir, share_prompts=share_prompts)
    reference = make_policy(llama_dir, share_prompts=share_prompts)
    perturbed(reference.module, seed=2).requires_grad_(False).eval()
    own = policy.module
    samples = policy.sample(PROMPTS, 3, 1.0, torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, got_entropy = policy.log_probs(samples, 0.9, with_entropy=True, module=reference.module)
        want, want_entropy = reference.log_probs(samples, 0.9, with_entropy=True)
        assert not torch.equal(policy.log_probs(samples, 0.9)[0], want)  # the weights differ
    assert torch.equal(got, want) and torch.equal(got_entropy, want_entropy)
    assert policy.module is own and policy.engine.module is own
