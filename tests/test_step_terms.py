"""What one inner step computes beyond the policy loss: the KL term it accepts, the
metrics it reports, and Dr. GRPO's constant normalizer.

Shapes: B prompts, G group size, N = B*G responses, T response tokens, V vocab.
"""

import math

import pytest
import torch

from helpers import QUIET
from rlvr import core
from rlvr.batch.interfaces import Policy, Task
from rlvr.batch.rollout import Grades, Samples
from rlvr.config import ConfigError, load_config
from rlvr.loop.state import TrainState
from rlvr.loop.step import optimizer_step
from rlvr.loop.trainer import collect_rollout, setup
from rlvr.policies.positional import PositionalPolicy
from rlvr.runs.metrics import without_timings

# --- item 1: k1 cannot be a loss term ------------------------------------------------


def test_config_refuses_k1_as_a_loss_term():
    with pytest.raises(ConfigError, match=r"algo.kl_estimator='k1'.*zero in expectation.*k1\+.*k2.*k3\+.*reward"):
        load_config(None, QUIET + ["algo.kl_estimator=k1", "algo.kl_coef=0.1"])
    # Without a penalty there is nothing to refuse; the straight-through forms are fine.
    load_config(None, QUIET + ["algo.kl_estimator=k1", "algo.kl_coef=0"])
    for estimator in ("k1+", "k3+"):
        config = load_config(None, QUIET + [f"algo.kl_estimator={estimator}", "algo.kl_coef=0.1"])
        assert config.algo.kl_estimator == estimator


def test_trainer_refuses_k1_even_past_validation():
    config = load_config(None, QUIET + ["algo.kl_coef=0.1", "algo.epochs=1"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    config.algo.kl_estimator = "k1"  # set after validation, as a script might
    with pytest.raises(ValueError, match="zero in expectation"):
        optimizer_step(config, st, rollout)


# --- item 3: clip_frac, entropy and kl are token-level means ------------------------


def _masked_means(config, st, rollout):
    """clip_frac, entropy and kl as plain masked means over all response tokens of the
    batch, from the current policy (what the next inner step sees before it updates)."""
    a, mask = config.algo, rollout.samples.response_mask  # [N, T]
    with torch.no_grad():
        log_probs, entropy = st.policy.log_probs(rollout.samples, config.policy.temperature, with_entropy=True)
        _, stats = core.policy_loss(log_probs, rollout.deltas, a.loss, rollout.old_log_probs, a.clip_eps)
        kl = core.kl_penalty(log_probs, rollout.ref_log_probs, a.kl_estimator)
    return {name: core.masked_mean(x.double(), mask).item()
            for name, x in (("clip_frac", stats["clipped"]), ("entropy", entropy), ("kl", kl))}


def _steps(micro_batches):
    # normalizer=1 makes the aggregation weights 1/N per token, T = 3 times the token
    # mean's 1/(N T): metrics weighted like the loss would be 3x too large. A small
    # embedding_std starts the policy near uniform, entropy near ln V.
    config = load_config(None, QUIET + [
        "algo.aggregation=seq_mean_token_sum", "algo.normalizer=1", "algo.loss=clipped", "algo.clip_eps=0.01",
        "algo.kl_coef=0.05", "algo.epochs=1", "algo.inner_steps=4", "optim.lr=0.05", "policy.embedding_std=0.1",
        f"optim.micro_batches={micro_batches}"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    records = []
    for _ in range(config.algo.inner_steps):
        expected = _masked_means(config, st, rollout)
        records.append(optimizer_step(config, st, rollout))
        for name, value in expected.items():
            assert records[-1][name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
    return config, records


def test_clip_frac_entropy_kl_are_token_means_under_seq_mean_token_sum():
    config, records = _steps(micro_batches=1)
    ln_v = math.log(config.task.options.vocab_size)
    for r in records:
        assert 0.0 <= r["clip_frac"] <= 1.0
        assert 0.0 < r["entropy"] <= ln_v + 1e-6
    # The check is not vacuous: some tokens were clipped, the KL moved off 0, and the
    # entropy starts within 10% of ln V, far above ln V / 3.
    assert max(r["clip_frac"] for r in records) > 0.05
    assert records[-1]["kl"] > 0
    assert records[0]["entropy"] > 0.9 * ln_v


def test_micro_batching_does_not_change_the_metrics():
    _, one = _steps(micro_batches=1)
    _, three = _steps(micro_batches=3)  # N = 9 responses: 3 of 3
    for a, b in zip(without_timings(one), without_timings(three)):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


# --- item 4: Dr. GRPO's normalizer is the policy's longest possible response --------


class LengthsPolicy(Policy):
    """Responses of lengths 1..longest (cycling) out of at most max_response_length."""

    max_response_length = 8

    def __init__(self, longest):
        self.longest = longest
        self.module = torch.nn.Linear(1, 1)

    def sample(self, prompts, group_size, temperature, generator):
        n = len(prompts) * group_size
        lengths = torch.arange(n) % self.longest + 1  # [N]
        mask = torch.arange(self.longest) < lengths.unsqueeze(1)  # [N, T = longest]
        ids = torch.zeros(n, self.longest, dtype=torch.long)
        return Samples(None, ids, mask, torch.zeros(n, 1, dtype=torch.long), torch.ones(n, 1, dtype=torch.bool))


class CountingTask(Task):
    def sample_prompts(self, num_prompts, generator):
        return list(range(num_prompts))

    def grade(self, prompts, responses, **reward_arguments):
        rewards = torch.arange(6.0).reshape(len(prompts), -1)  # [B, G]
        return Grades(rewards, rewards > 2, {})


def test_default_normalizer_is_the_longest_possible_response_not_the_batch_width():
    config = load_config(None, QUIET + ["algo.aggregation=seq_mean_token_sum", "task.prompts_per_epoch=2",
                                       "task.prompts=null", "algo.group_size=3"])
    n = 2 * 3
    weights = []
    for longest in (3, 6):  # two rollouts whose longest responses differ
        st = TrainState(LengthsPolicy(longest), None, torch.Generator().manual_seed(0), None)
        rollout = collect_rollout(config, CountingTask(), st)
        mask = rollout.samples.response_mask
        assert mask.shape == (n, longest)
        assert torch.all(rollout.weights[~mask] == 0)
        weights.append(rollout.weights[mask])
    # 1 / (max_response_length * N) = 1 / 48 for every real token of either rollout.
    for w in weights:
        torch.testing.assert_close(w, torch.full_like(w, 1 / (8 * n)), rtol=1e-7, atol=0)
    # An explicit normalizer still wins.
    config.algo.normalizer = 2.0
    st = TrainState(LengthsPolicy(3), None, torch.Generator().manual_seed(0), None)
    rollout = collect_rollout(config, CountingTask(), st)
    w = rollout.weights[rollout.samples.response_mask]
    torch.testing.assert_close(w, torch.full_like(w, 1 / (2 * n)), rtol=1e-7, atol=0)


def test_policies_report_their_longest_response():
    positional = PositionalPolicy(vocab_size=5, embedding_dim=4, num_numbers=3)
    samples = positional.sample(torch.tensor([[0, 1, 2]]), 2, 1.0, torch.Generator().manual_seed(0))
    assert positional.max_response_length == samples.response_ids.shape[1] == 3

    pytest.importorskip("transformers")
    from rlvr.modeling import build_char_tokenizer, build_model
    from rlvr.policies.causal_lm import CausalLMPolicy

    tokenizer = build_char_tokenizer()
    model = build_model("llama", len(tokenizer), hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2)
    assert CausalLMPolicy(model, tokenizer, max_new_tokens=5).max_response_length == 5


def test_max_grad_norm_clips_the_step_to_that_norm():
    """The gradient the optimizer steps with is scaled to norm max_grad_norm, its direction
    kept; clip_gradients returns (and the record logs) the norm before clipping."""
    from rlvr.loop.step import accumulate_gradients, clip_gradients

    config = load_config(None, QUIET + ["optim.max_grad_norm=0.01"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    accumulate_gradients(config, st.policy, rollout, 1)
    before = [p.grad.clone() for p in st.policy.module.parameters()]
    norm = clip_gradients(st.policy.module, config.optim.max_grad_norm)
    assert norm > 0.1  # far above the cap, so clipping must act
    after = [p.grad for p in st.policy.module.parameters()]
    clipped = torch.linalg.vector_norm(torch.stack([g.norm() for g in after]))
    assert clipped == pytest.approx(0.01, rel=1e-4)
    for b, a in zip(before, after):  # the direction is kept
        torch.testing.assert_close(a, b * (0.01 / norm), rtol=1e-5, atol=1e-12)
