"""Algorithms checked against hand computations and the reference implementations: the
hacking monitor's top, top-entropy token selection, dynamic sampling with fixed prompts,
REINFORCE++'s token whitening, the gradient-noise meter's batch sizes, CISPO's open lower
clip, the KL with kl_in=reward and GSPO's aggregation."""

import math
import warnings

import pytest
import torch

from conftest import QUIET
from rlvr.config import ConfigError, load_config
from rlvr.core import compute_deltas, kl_penalty, policy_loss, top_entropy_mask
from rlvr.diagnostics import GradientNoiseMeter, max_reward_stats, noise_estimates, noise_scale
from rlvr.rollout import Rollout
from rlvr.step import accumulate_gradients, optimizer_step
from rlvr.trainer import collect_rollout, setup, train
from rlvr.trl_names import trl_hint

# ---------------------------------------------------------------- the hacking monitor



def one_run(rewards, correct, **options):
    """``max_reward_stats`` of one run's [B, G] rewards (R = 1)."""
    return max_reward_stats(rewards[None], correct[None], **options)[0]

def test_a_batch_of_equal_rewards_has_no_top_reward_to_hack():
    # Nothing solved, every reward 0: no response scored above a wrong answer.
    rewards, correct = torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.bool)
    assert one_run(rewards, correct) == {"hack/max_reward_frac": 0.0, "hack/max_reward_not_gold": 0.0}
    # A reward above the rest that fails the gold check still counts: 1 of the 2 at the top.
    rewards = torch.tensor([[0.0, 0.5, 0.5, 0.0]])
    correct = torch.tensor([[False, True, False, False]])
    assert one_run(rewards, correct) == {"hack/max_reward_frac": 0.5, "hack/max_reward_not_gold": 0.5}


def test_a_batch_without_a_right_answer_has_no_top_reward_to_hack():
    # A random model's partial credit: the best is what a wrong answer gets, no right answer scored less.
    rewards, correct = torch.tensor([[0.4, 0.0, 0.2], [0.4, 0.2, 0.0]]), torch.zeros(2, 3, dtype=torch.bool)
    assert one_run(rewards, correct) == {"hack/max_reward_frac": 0.0, "hack/max_reward_not_gold": 0.0}
    # One right answer that scored below the top: the top's wrong answers count.
    correct[1, 1] = True
    assert one_run(rewards, correct) == {"hack/max_reward_frac": 2 / 6, "hack/max_reward_not_gold": 1.0}
    # A known maximum needs no right answer to compare with.
    assert one_run(rewards, torch.zeros(2, 3, dtype=torch.bool), max_reward=0.4)["hack/max_reward_frac"] > 0


def test_a_reward_that_is_the_gold_check_is_not_monitored():
    # Partial credit from the gold spec itself (a grader's score): its top is not a hack.
    rewards, correct = torch.tensor([[0.5, 0.0, 0.5]]), torch.tensor([[False, True, False]])
    assert one_run(rewards, correct)["hack/max_reward_not_gold"] == 1.0
    assert one_run(rewards, correct, reward_is_gold=True) == {"hack/max_reward_frac": 0.0,
                                                                      "hack/max_reward_not_gold": 0.0}


def test_the_dataset_task_knows_when_its_reward_is_the_gold_check():
    from rlvr.compose import build_task

    options = ["task.name=dataset", "policy.name=causal_lm", "task.prompts=null",
               "task.options={path: examples/data/tiny_math.jsonl, answer_column: answer, gold: numeric}"]
    with build_task(load_config(None, QUIET + options)) as task:
        assert task.reward_is_gold
    extra = ["rewards.functions=['rlvr.rewards.verifiers:math_answer']"]
    with build_task(load_config(None, QUIET + options + extra)) as task:
        assert not task.reward_is_gold


# ---------------------------------------------------------------- top-entropy tokens


def test_top_entropy_selection_keeps_the_all_token_normaliser_and_the_kl_on_every_token():
    """The method (and TRL): the selection multiplies the policy-gradient term of the full-mask
    per-token loss; the aggregation's normaliser and the KL term keep every token. By hand,
    seq_mean_token_mean on the toy (n tokens each): w = 1 / (n N) on every token, and
        loss = sum_t w (keep_t * (-delta_i log pi_t) + kl_coef * k3_t)."""
    config = load_config(None, QUIET + ["algo.top_entropy_q=0.25", "algo.kl_coef=0.1", "algo.group_size=4"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    samples, mask = rollout.samples, rollout.samples.response_mask
    st.optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, rollout, 1)
    got = [p.grad.clone() for p in st.policy.module.parameters()]

    log_probs, entropy = st.policy.log_probs(samples, 1.0, with_entropy=True)
    keep = top_entropy_mask(entropy.detach(), mask, 0.25)
    assert 0 < keep.sum() < mask.sum()
    n, num = mask.shape[1], mask.shape[0]
    with torch.no_grad():
        ref, _ = st.policy.log_probs(samples, 1.0, module=st.ref_module)
    pg = torch.where(keep, -rollout.deltas.unsqueeze(1) * log_probs, 0.0)
    per_token = pg + 0.1 * kl_penalty(log_probs, ref, "k3")
    expected = torch.autograd.grad((per_token / (n * num)).sum(), list(st.policy.module.parameters()))
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- dynamic sampling with fixed prompts


@pytest.mark.parametrize("prompts", [[[1, 0, 2], [3, 2, 4]], [[1, 0, 2], [3, 2, 4], [1, 2, 3], [0, 1, 2], [4, 3, 2]]])
def test_dynamic_sampling_with_fixed_prompts_keeps_the_whole_list_as_the_batch(prompts):
    # A fixed list is the batch without dynamic sampling; with it too, whatever prompts_per_epoch.
    overrides = QUIET + [f"task.prompts={prompts}", "algo.dynamic_sampling=true", "algo.max_sampling_tries=1",
                         "algo.group_size=4"]
    config = load_config(None, overrides)
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    assert rollout.samples.num_responses == len(prompts) * 4
    plain = load_config(None, QUIET + [f"task.prompts={prompts}", "algo.group_size=4"])
    task, st = setup(plain)
    assert collect_rollout(plain, task, st).samples.num_responses == len(prompts) * 4


def test_dynamic_sampling_refuses_a_batch_size_that_contradicts_the_fixed_list():
    with pytest.raises(ConfigError, match="task.prompts_per_epoch=5 with 3 fixed task.prompts"):
        load_config(None, ["algo.dynamic_sampling=true", "task.prompts_per_epoch=5"])
    load_config(None, ["algo.dynamic_sampling=true", "task.prompts_per_epoch=5", "task.prompts=null"])


# ---------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_whitens_over_tokens_by_hand():
    """verl's reinforce_plus_plus_baseline: group-center, then whiten over the batch's tokens.
    rewards [[1, 0], [2, 0]] -> c = [[0.5, -0.5], [1, -1]]; lengths [[1, 3], [2, 2]], 8 tokens:
    m = (0.5 - 1.5 + 2 - 2) / 8 = -1/8; c - m = [[5/8, -3/8], [9/8, -7/8]];
    s^2 = (25/64 + 3 * 9/64 + 2 * 81/64 + 2 * 49/64) / 7 = (312/64) / 7 = 39/56."""
    rewards = torch.tensor([[1.0, 0.0], [2.0, 0.0]], dtype=torch.float64)
    lengths = torch.tensor([[1, 3], [2, 2]])
    expected = torch.tensor([[5 / 8, -3 / 8], [9 / 8, -7 / 8]], dtype=torch.float64) / (math.sqrt(39 / 56) + 1e-6)
    torch.testing.assert_close(compute_deltas(rewards, "reinforce_pp", lengths=lengths), expected, rtol=1e-14, atol=0)
    # equal lengths: the token mean is exactly 0, the std over the 4 n tokens (Bessel over tokens)
    equal = compute_deltas(rewards, "reinforce_pp", lengths=torch.full((2, 2), 3))
    c = torch.tensor([[0.5, -0.5], [1.0, -1.0]], dtype=torch.float64)
    torch.testing.assert_close(equal, c / (math.sqrt(3 * 2.5 / 11) + 1e-6), rtol=1e-14, atol=0)
    constant = compute_deltas(torch.tensor([[1.0, 1.0], [2.0, 0.0]]), "reinforce_pp", lengths=torch.full((2, 2), 3))
    assert (constant[0] == 0).all()  # a constant group stays exactly 0 with equal lengths


# ---------------------------------------------------------------- the gradient-noise meter


def test_the_noise_meter_refuses_one_prompt_per_batch():
    with pytest.raises(ConfigError, match="log.grad_noise_every=1 with 1 prompt per batch"):
        load_config(None, ["log.grad_noise_every=1", "task.prompts=null", "task.prompts_per_epoch=1"])


@pytest.mark.parametrize("aggregation", ["seq_mean_token_sum", "seq_mean_token_mean", "token_mean"])
def test_the_noise_meter_counts_prompts_with_varied_lengths(aggregation):
    """Parts of one group each, lengths varied by masking: under the sequence-mean
    aggregations each part holds 1 of the B prompts (its share of the loss is its responses
    / N, whatever their tokens), under token_mean its share of the tokens times B. By hand:
    each part's gradient g_k (its own backward), G_k = (B / b_k) g_k, the pairs of
    ``noise_estimates`` averaged, B_simple = tr(Sigma) / |G|^2."""
    from rlvr.core import aggregation_weights

    g = 3
    config = load_config(None, QUIET + ["task.prompts=null", "task.prompts_per_epoch=4", f"algo.group_size={g}",
                                        f"algo.aggregation={aggregation}", "algo.deltas=raw",
                                        "log.grad_noise_parts=4"])
    task, st = setup(config)
    r = collect_rollout(config, task, st)
    lengths = torch.tensor([1, 2, 3, 3, 1, 1, 2, 2, 3, 1, 3, 3])  # [N]
    mask = torch.arange(3).unsqueeze(0) < lengths.unsqueeze(1)  # [N, T]
    samples = r.samples.rows(slice(None))
    samples.response_mask = mask
    weights = aggregation_weights(mask, aggregation, 3.0)
    rollout = Rollout(samples, r.deltas, r.old_log_probs, r.ref_log_probs, weights, r.stats)
    meter = GradientNoiseMeter()
    st.optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, rollout, 1, meter)

    tokens = lengths.reshape(4, g).sum(dim=1).double()  # [B]
    sizes = (tokens / tokens.sum() * 4).tolist() if aggregation == "token_mean" else [1.0] * 4
    assert meter.sizes == pytest.approx(sizes, rel=1e-6)
    grads = []
    for k in range(4):
        st.optimizer.zero_grad(set_to_none=True)
        accumulate_gradients(config, st.policy, rollout.rows(slice(k * g, (k + 1) * g)), 1)
        grads.append(torch.cat([p.grad.reshape(-1) for p in st.policy.module.parameters()]).double())
    total = torch.stack(grads).sum(dim=0)
    pairs = [noise_estimates((4 / b) ** 2 * grad.square().sum().item(), b, total.square().sum().item(), 4.0)
             for grad, b in zip(grads, sizes)]
    expected = noise_scale(sum(p[0] for p in pairs) / 4, sum(p[1] for p in pairs) / 4)
    assert meter.metrics()["grad/noise_scale"] == pytest.approx(expected, rel=1e-4)


# ---------------------------------------------------------------- CISPO, the KL, GSPO


def test_cispo_can_leave_the_lower_clip_open():
    # ratio 0.1 keeps its weight 0.1 with no lower clip; ratio 3 is capped at 1 + 0.5.
    log_probs = torch.log(torch.tensor([[0.1, 3.0]], dtype=torch.float64)).requires_grad_()
    old = torch.zeros(1, 2, dtype=torch.float64)
    loss, stats = policy_loss(log_probs, torch.tensor([1.0], dtype=torch.float64), "cispo", old, None, 0.5)
    (grad,) = torch.autograd.grad(loss.sum(), log_probs)
    torch.testing.assert_close(grad, torch.tensor([[-0.1, -1.5]], dtype=torch.float64), rtol=1e-14, atol=0)
    assert stats["clipped"].tolist() == [[False, True]]


def test_cispo_defaults_to_trl_s_open_lower_clip():
    config = load_config(None, ["algo.loss=cispo"])
    assert config.algo.clip_eps is None and config.algo.clip_eps_high == 0.2
    assert load_config(None, ["algo.loss=cispo", "algo.clip_eps=0.3"]).algo.clip_eps == 0.3
    with pytest.raises(ConfigError, match="algo.clip_eps=null"):
        load_config(None, ["algo.loss=clipped", "algo.clip_eps=null"])


def test_trl_s_cispo_epsilon_high_is_the_cap_itself():
    assert "epsilon_high - 1" in trl_hint("epsilon_high")


def test_kl_in_the_reward_refuses_an_estimator_it_would_ignore():
    with pytest.raises(ConfigError, match="algo.kl_in=reward with algo.kl_estimator='k3'"):
        load_config(None, ["algo.kl_coef=0.1", "algo.kl_in=reward", "algo.kl_estimator=k3"])
    # not given: the reward's own estimator, k1
    assert load_config(None, ["algo.kl_coef=0.1", "algo.kl_in=reward"]).algo.kl_estimator == "k1"


def test_kl_in_the_reward_logs_the_policy_s_kl():
    config = load_config(None, QUIET + ["algo.kl_coef=0.5", "algo.kl_in=reward", "algo.kl_estimator=k1"])
    task, st = setup(config)
    optimizer_step(config, st, collect_rollout(config, task, st))  # move pi away from the reference
    st.epoch = 1  # the reference is refreshed every 10 epochs: epoch 1 keeps epoch 0's
    rollout = collect_rollout(config, task, st)
    with torch.no_grad():
        ref, _ = st.policy.log_probs(rollout.samples, 1.0, module=st.ref_module)
        log_probs, _ = st.policy.log_probs(rollout.samples, 1.0)
    record = optimizer_step(config, st, rollout)
    k1 = (log_probs - ref).mean().item()  # the toy's responses: every position a token
    assert abs(k1) > 1e-4
    assert record["kl"] == pytest.approx(k1, rel=1e-5)
    assert record["loss"] == record["pg_loss"]  # no KL term in the loss


def test_gspo_with_a_token_weighted_aggregation_warns():
    with pytest.warns(UserWarning, match="algo.loss='gspo' with algo.aggregation='token_mean'"):
        load_config(None, ["algo.loss=gspo", "algo.aggregation=token_mean"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(None, ["algo.loss=gspo", "algo.inner_steps=2"])


def test_a_run_with_cispo_defaults_trains():
    records = train(load_config(None, QUIET + ["algo.loss=cispo", "algo.epochs=2", "algo.inner_steps=2",
                                               "log.eval_every=2"]))
    assert all(math.isfinite(r["loss"]) for r in records if r["kind"] == "train")
