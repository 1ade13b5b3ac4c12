"""``ToyLearner``, the positional toy's fused steps, against ``LocalLearner``'s autograd
path: every record's numbers equal (==), the timings aside, under the options it takes;
the learner is picked where it applies, and the options it does not take name why."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rlvr
from rlvr.config import AlgoConfig
from rlvr.loop.batched import TIMING_KEYS
from rlvr.loop.seams import TOY_STEP_ALGO, LocalLearner, LocalRolloutSource, ToyLearner, local_learner, toy_step_needs
from rlvr.loop.trainer import setup, train
from rlvr.policies.positional_step import naive_batch, naive_gradients


def run(overrides, learner_cls):
    config = rlvr.load_config(None, ["log.progress=false", "algo.epochs=3", "algo.inner_steps=3",
                                     "log.eval_every=2", *overrides])
    state = setup(config)
    records = train(config, state=state, source=LocalRolloutSource(config), learner=learner_cls(config))
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records], state[1]


@pytest.mark.parametrize("overrides", [
    [],  # the lecture's configuration
    ["algo.deltas=raw", "log.entropy=false", "optim.max_grad_norm=0.5", "policy.temperature=0.7"],
    ["algo.deltas=normalized", "algo.aggregation=token_mean", "task.prompts=null", "task.prompts_per_epoch=4",
     "optim.name=adamw", "optim.weight_decay=0.1", "optim.warmup_steps=2", "optim.schedule=cosine"],
    ["task.prompts=null", "task.num_numbers=5", "task.vocab_size=8", "algo.group_size=4", "algo.deltas=max_only",
     "algo.dynamic_sampling=true"],
])
def test_fused_steps_equal_autograd_steps(overrides):
    fused, fused_state = run(overrides, ToyLearner)
    autograd, autograd_state = run(overrides, LocalLearner)
    assert [r["kind"] for r in fused].count("train") == 9
    assert fused == autograd  # bit for bit: float == float
    for a, b in zip(fused_state.policy.module.parameters(), autograd_state.policy.module.parameters()):
        assert torch.equal(a, b)


def test_fused_gradient_equals_autograd_with_zero_weights():
    # tokens of weight 0 are left out of the loss (core.weighted_sum's where), not multiplied
    config = rlvr.load_config(None, ["log.progress=false"])
    _, st = setup(config)
    samples = st.policy.sample(torch.tensor([[1, 0, 2], [3, 2, 4]]), 4, 1.0, st.generator)
    deltas = torch.randn(8)
    weights = torch.rand(8, 3) * (torch.rand(8, 3) > 0.3)
    m = st.policy.module
    log_probs, entropy = st.policy.log_probs(samples, 1.0, with_entropy=True)
    loss = torch.where(weights > 0, -deltas[:, None] * log_probs * weights, 0.0).sum()
    loss.backward()
    batch = naive_batch(samples.prompt_ids, samples.response_ids, deltas, weights, samples.policy_mask, 5)
    grads, sums = naive_gradients(m.embedding.weight, m.encode, m.decode, batch, 1.0, with_entropy=True)
    assert not batch.all_weighted
    assert torch.equal(sums["loss"], loss.detach())
    assert torch.equal(sums["entropy"], entropy.detach().sum())
    for name, p in (("embedding", m.embedding.weight), ("encode", m.encode), ("decode", m.decode)):
        assert torch.equal(grads[name], p.grad), name  # bit for bit, as the records


def test_the_toy_learner_is_picked_where_it_applies():
    assert isinstance(local_learner(rlvr.load_config(None, [])), ToyLearner)
    assert type(local_learner(rlvr.load_config(None, ["algo.loss=clipped"]))) is LocalLearner
    assert toy_step_needs(rlvr.load_config(None, ["optim.micro_batches=2", "algo.kl_coef=0.1"])) == [
        "optim.micro_batches=1", "algo.kl_coef=0"]
    base = rlvr.load_config(None, [])
    others = {"loss": "clipped", "kl_coef": 0.1, "entropy_coef": 0.01, "tis_cap": 2.0, "is_correction": "token_mis",
              "top_entropy_q": 0.2}
    assert set(others) == set(TOY_STEP_ALGO) <= {f.name for f in dataclasses.fields(AlgoConfig)}
    for name, value in others.items():
        config = dataclasses.replace(base, algo=dataclasses.replace(base.algo, **{name: value}))
        assert len(toy_step_needs(config)) == 1 and toy_step_needs(config)[0].startswith(f"algo.{name}=")
