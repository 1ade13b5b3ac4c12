import math

import pytest
import torch

from helpers import QUIET, train_record
from rlvr import core
from rlvr.batch.rollout import Rollout
from rlvr.config import ConfigError, load_config
from rlvr.loop.diagnostics import (
    GradientNoiseMeter,
    classify_prompts,
    epoch_series,
    fitted_change,
    flat_grad,
    hacking_warnings,
    max_reward_stats,
    noise_estimates,
    noise_scale,
    prompt_curves,
    prompt_solve_shares,
    prompt_summary,
    reward_gold_divergence,
)
from rlvr.loop.step import accumulate_gradients, micro_batches
from rlvr.loop.trainer import collect_rollout, setup
from rlvr.loop.trainer import train as train_run

# ---------------------------------------------------------------- gradient noise


def test_noise_estimates_invert_the_expected_norms():
    # E|G_b|^2 = |G|^2 + S / b. With |G|^2 = 2, S = 12: b = 2 gives 8, B = 8 gives 3.5.
    assert noise_estimates(8.0, 2, 3.5, 8) == pytest.approx((2.0, 12.0))
    with pytest.raises(ValueError, match="small batch < big batch"):
        noise_estimates(1.0, 8, 1.0, 8)


def test_two_unit_parts_by_hand():
    # Units x1 = (1, 0), x2 = (3, 2), one per part; B = 2, so each part's share is x / 2.
    # Own estimates G_k = x_k; G_B = (2, 1). S = |x1 - x2|^2 / 2 = 8 / 2 = 4 (the sample
    # variance, divisor m - 1 = 1); |G|^2 = x1 . x2 = 3 (the product of two independent
    # draws is unbiased for |mu|^2). B_simple = 4 / 3, snr = B / B_simple = 1.5.
    meter = GradientNoiseMeter()
    meter.add(torch.tensor([0.5, 0.0]), 1)
    meter.add(torch.tensor([1.5, 1.0]), 1)
    out = meter.metrics()
    assert out["grad/trace_cov"] == pytest.approx(4.0)
    assert out["grad/true_norm_sq"] == pytest.approx(3.0)
    assert out["grad/noise_scale"] == pytest.approx(4 / 3)
    assert out["grad/snr"] == pytest.approx(1.5)
    assert out["grad/batch_size"] == 2.0
    # The same parts given as the accumulated gradient after each one.
    running = GradientNoiseMeter()
    running.add_running_sum(torch.tensor([0.5, 0.0]), 1)
    running.add_running_sum(torch.tensor([2.0, 1.0]), 1)
    assert running.metrics() == pytest.approx(out)


def test_noise_scale_clamps_estimates_that_noise_made_negative():
    assert noise_scale(2.0, 6.0) == 3.0
    assert noise_scale(-1.0, 6.0) == math.inf  # no measurable signal
    assert noise_scale(2.0, -1.0) == 0.0
    assert math.isnan(noise_scale(0.0, 0.0))  # e.g. every delta 0: the gradient is exactly 0
    meter = GradientNoiseMeter()
    with pytest.raises(ValueError, match="at least 2 parts"):
        meter.add(torch.ones(3), 4)
        meter.metrics()
    with pytest.raises(ValueError, match="2 numbers, the earlier parts had 3"):
        meter.add(torch.ones(2), 4)
    with pytest.raises(ValueError, match="positive"):
        meter.add(torch.ones(3), 0)


@pytest.mark.parametrize("sizes", [[8, 8, 8, 8], [4, 4, 8, 16]])
def test_noise_estimates_are_unbiased_by_monte_carlo(sizes):
    # Units x ~ N(mu, diag(sigma^2)) in 10 dimensions; a part's share is the sum of its
    # units / B. Averaged over 4000 batches the estimates must match |mu|^2 = 1.1185 and
    # tr Sigma = 17.92 (standard errors about 1% and 0.5%). Dropping the m / (m - 1)
    # correction (x 0.75) or the B / b_k rescaling would miss by far more.
    g = torch.Generator().manual_seed(0)
    mu = torch.linspace(-0.5, 0.5, 10, dtype=torch.float64) + 0.1
    sigma = torch.linspace(0.5, 2.0, 10, dtype=torch.float64)
    batch, trials = sum(sizes), 4000
    units = mu + sigma * torch.randn(trials, batch, 10, generator=g, dtype=torch.float64)
    true_norm_sq, trace_cov = [], []
    for trial in units:
        meter = GradientNoiseMeter()
        for part in trial.split(sizes):
            meter.add(part.sum(dim=0) / batch, len(part))
        out = meter.metrics()
        true_norm_sq.append(out["grad/true_norm_sq"])
        trace_cov.append(out["grad/trace_cov"])
    mean_norm_sq, mean_trace = sum(true_norm_sq) / trials, sum(trace_cov) / trials
    assert mean_norm_sq == pytest.approx(mu.square().sum().item(), rel=0.05)
    assert mean_trace == pytest.approx(sigma.square().sum().item(), rel=0.025)
    assert noise_scale(mean_norm_sq, mean_trace) == pytest.approx(16.02, rel=0.06)  # 17.92 / 1.1185


def test_trainer_micro_batches_are_shares_of_the_batch_gradient():
    # The scaling the meter assumes, checked on the trainer itself: the parts' gradients
    # add up to the full-batch gradient, and a part's share times B / b_k is that part's
    # gradient as a batch of its own (its own aggregation weights).
    config = load_config(None, QUIET + ["task.prompts=null", "task.prompts_per_epoch=8", "algo.group_size=4",
                                        "algo.loss=clipped", "seed=3"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    module = st.policy.module
    meter, shares = GradientNoiseMeter(), []
    for part in micro_batches(rollout, 4):  # 2 groups each
        before = flat_grad(module).clone()
        accumulate_gradients(config, st.policy, part, 1)
        shares.append(flat_grad(module) - before)
        meter.add_running_sum(flat_grad(module), part.samples.num_responses / config.algo.group_size)
    module.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, rollout, 1)
    full = flat_grad(module).clone()
    assert torch.allclose(meter.total.float(), full, rtol=1e-5, atol=1e-7)
    part = rollout.rows(slice(8, 16))
    own = Rollout(part.samples, part.deltas, part.old_log_probs, None,
                  core.aggregation_weights(part.samples.response_mask, config.algo.aggregation), {})
    module.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, own, 1)
    assert torch.allclose(flat_grad(module), shares[1] * 4, rtol=1e-4, atol=1e-6)  # B / b_k = 8 / 2
    assert meter.metrics()["grad/batch_size"] == 8.0


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


# ---------------------------------------------------------------- reward hacking


def test_max_reward_stats_by_hand():
    rewards = torch.tensor([[5.0, 5.0, 3.0], [5.0, 2.0, math.nan]])
    correct = torch.tensor([[True, False, False], [False, False, False]])
    # 5 scored responses, 3 at the top (5); 2 of those 3 fail the gold check.
    out = max_reward_stats(rewards, correct, max_reward=5.0)
    assert out == pytest.approx({"hack/max_reward_frac": 3 / 5, "hack/max_reward_not_gold": 2 / 3})
    assert max_reward_stats(rewards, correct) == out  # the observed top is 5 too
    out = max_reward_stats(rewards, correct, max_reward=6.0)  # nothing reaches 6
    assert out["hack/max_reward_frac"] == 0.0 and out["hack/max_reward_not_gold"] == 0.0
    with pytest.raises(ValueError, match="differ in shape"):
        max_reward_stats(rewards, correct[:, :2])


def test_a_batch_of_equal_rewards_has_no_top_reward_to_hack():
    # Nothing solved, every reward 0: no response scored above a wrong answer.
    rewards, correct = torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.bool)
    assert max_reward_stats(rewards, correct) == {"hack/max_reward_frac": 0.0, "hack/max_reward_not_gold": 0.0}
    # A reward above the rest that fails the gold check still counts: 1 of the 2 at the top.
    rewards = torch.tensor([[0.0, 0.5, 0.5, 0.0]])
    correct = torch.tensor([[False, True, False, False]])
    assert max_reward_stats(rewards, correct) == {"hack/max_reward_frac": 0.5, "hack/max_reward_not_gold": 0.5}


def test_a_batch_without_a_right_answer_has_no_top_reward_to_hack():
    # A random model's partial credit: the best is what a wrong answer gets, no right answer scored less.
    rewards, correct = torch.tensor([[0.4, 0.0, 0.2], [0.4, 0.2, 0.0]]), torch.zeros(2, 3, dtype=torch.bool)
    assert max_reward_stats(rewards, correct) == {"hack/max_reward_frac": 0.0, "hack/max_reward_not_gold": 0.0}
    # One right answer that scored below the top: the top's wrong answers count.
    correct[1, 1] = True
    assert max_reward_stats(rewards, correct) == {"hack/max_reward_frac": 2 / 6, "hack/max_reward_not_gold": 1.0}
    # A known maximum needs no right answer to compare with.
    assert max_reward_stats(rewards, torch.zeros(2, 3, dtype=torch.bool), max_reward=0.4)["hack/max_reward_frac"] > 0


def test_a_reward_that_is_the_gold_check_is_not_monitored():
    # Partial credit from the gold spec itself (a grader's score): its top is not a hack.
    rewards, correct = torch.tensor([[0.5, 0.0, 0.5]]), torch.tensor([[False, True, False]])
    assert max_reward_stats(rewards, correct)["hack/max_reward_not_gold"] == 1.0
    assert max_reward_stats(rewards, correct, reward_is_gold=True) == {"hack/max_reward_frac": 0.0,
                                                                      "hack/max_reward_not_gold": 0.0}


def test_fitted_change():
    assert fitted_change([0.0, 1.0, 2.0, 3.0]) == pytest.approx(3.0)
    assert fitted_change([1.0, 1.0, 1.0]) == 0.0
    # x - mean = (-1, 0, 1), y - mean = (-1, 1, 0): slope 1 / 2, change over 2 steps 1.
    assert fitted_change([0.0, 2.0, 1.0]) == pytest.approx(1.0)


def epoch_records(rewards, gold):
    return [{"kind": "train", "epoch": e, "step": e, "reward_mean": r, "solve_rate": s}
            for e, (r, s) in enumerate(zip(rewards, gold))]


def test_partial_credit_that_the_gold_accuracy_catches_up_with_is_not_reported():
    """A shaped reward climbs first (epochs 0-9, gold flat), then the answers follow (gold
    0 -> 0.9 by epoch 29): the first window diverges, the run as a whole does not."""
    rewards = [e / 10 for e in range(10)] + [1.0 + e / 40 for e in range(20)]
    gold = [0.0] * 10 + [0.9 * (e + 1) / 20 for e in range(20)]
    records = epoch_records(rewards, gold)
    assert reward_gold_divergence(records)  # the early window alone trips
    assert hacking_warnings(records) == []
    stuck = epoch_records(rewards, [0.0] * 10 + [0.1] * 20)  # the answers never follow
    assert len(hacking_warnings(stuck)) == 1


def test_divergence_trips_when_gold_does_not_keep_up():
    rewards = [float(e) for e in range(10)]  # rises across its whole span: rho = 1
    assert reward_gold_divergence(epoch_records(rewards, [0.1] * 10)) != []
    assert reward_gold_divergence(epoch_records(rewards, [e / 9 for e in range(10)])) == []  # ds = 1
    # The threshold is ds < 0.5 * rho: gold rising 0.4 trips, 0.6 does not.
    [found] = reward_gold_divergence(epoch_records(rewards, [0.4 * e / 9 for e in range(10)]))
    assert (found.first_epoch, found.last_epoch) == (0, 9)
    assert found.reward_rise == pytest.approx(1.0) and found.gold_rise == pytest.approx(0.4)
    assert reward_gold_divergence(epoch_records(rewards, [0.6 * e / 9 for e in range(10)])) == []
    assert reward_gold_divergence(epoch_records([1.0] * 10, [0.0] * 10)) == []  # a flat reward: nothing rose
    no_gold = [{"kind": "train", "epoch": e, "step": e, "reward_mean": float(e)} for e in range(10)]
    assert reward_gold_divergence(no_gold) == []  # epochs without a solve rate are left out, not an error


# The sorting toy with n = 3 numbers from a vocabulary of 3: with repeats allowed most
# prompts repeat a number, and inclusion_ordering gives its maximum 3 + 2 = 5 to wrong
# answers ([0, 0, 2] for [2, 0, 2]). Without repeats every prompt is a permutation of
# 0, 1, 2, and a reward of 5 means the sorted answer: the control.
LOOPHOLE = ["task.prompts=null", "task.num_numbers=3", "task.vocab_size=3", "algo.epochs=24",
            "task.prompts_per_epoch=16", "algo.group_size=8", "algo.inner_steps=4", "optim.lr=0.01",
            "policy.embedding_std=0.3", "algo.loss=clipped", "log.eval_every=100"]


@pytest.mark.parametrize("seed", [0, 1])
def test_monitor_catches_the_sorting_loophole(seed):
    config = load_config(None, QUIET + LOOPHOLE + ["task.allow_repeats=true", f"seed={seed}"])
    records = train_run(config)
    train = [r for r in records if r["kind"] == "train" and r["step"] % 4 == 0]  # each epoch's first step
    assert len(train) == 24
    # The policy reaches the top reward, mostly with wrong answers (about 70% in these runs).
    assert sum(r["hack/max_reward_frac"] for r in train[-5:]) / 5 > 0.9
    assert sum(r["hack/max_reward_not_gold"] for r in train[-10:]) / 10 > 0.5
    warnings = hacking_warnings(records)
    assert len(warnings) == 2
    assert warnings[0].startswith("epochs 0-9: the reward rose")
    assert "failed the gold check" in warnings[1]


@pytest.mark.parametrize("seed", [0, 1])
def test_monitor_is_quiet_without_the_loophole(seed):
    config = load_config(None, QUIET + LOOPHOLE + ["task.allow_repeats=false", f"seed={seed}"])
    records = train_run(config)
    not_gold = [r["hack/max_reward_not_gold"] for r in records if r["kind"] == "train" and r["step"] % 4 == 0]
    assert all(v == 0.0 for v in not_gold)  # the top means the sorted answer
    assert sum(v == 0.0 for v in not_gold) > 15
    assert reward_gold_divergence(records) == [] and hacking_warnings(records) == []


def test_the_lecture_default_run_is_a_stall_not_a_hack():
    """The README's account of the default run: the first window trips, the whole run does not."""
    records = train_run(load_config(None, QUIET))
    _, rewards = epoch_series(records, "reward_mean")
    assert rewards[0] == pytest.approx(2.8) and rewards[-1] == pytest.approx(10 / 3)
    assert all(r["solve_rate"] == 0.0 for r in records if r["kind"] == "train")
    windows = reward_gold_divergence(records)
    assert windows and (windows[0].first_epoch, windows[0].last_epoch) == (0, 9)
    whole = fitted_change(rewards) / (max(rewards) - min(rewards))
    assert 0.05 < whole < 0.2  # under the 20% a warning needs (11% in the README)
    assert hacking_warnings(records) == []
    assert "3 never solved" in prompt_summary(records)


def test_warnings_count_in_words():
    rising = [train_record(e, reward_mean=float(e)) for e in range(15)]  # reward up, gold flat: windows 0-9, 5-14
    assert hacking_warnings(rising)[0].endswith("the reward may be hackable (1 more window)")
    one = [train_record(0, **{"hack/max_reward_not_gold": 1.0})]
    assert hacking_warnings(one) == ["over the last epoch, 100% of the responses with the top reward failed "
                                     "the gold check"]


# ---------------------------------------------------------------- per-prompt learning


def test_prompt_solve_shares_average_a_repeated_prompt():
    prompts = torch.tensor([[2, 0, 1], [1, 1, 0], [2, 0, 1]])
    correct = torch.tensor([[True, False], [False, False], [True, True]])
    assert prompt_solve_shares(prompts, correct) == {"2 0 1": 0.75, "1 1 0": 0.0}
    assert prompt_solve_shares(prompts, ~correct) == {"2 0 1": 0.25, "1 1 0": 1.0}
    assert prompt_solve_shares([{"prompt": "Q?"}], correct[:1]) == {"Q?": 0.5}
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q?"}]
    assert prompt_solve_shares([{"prompt": chat}], correct[:1]) == {"system: Be brief.\nuser: Q?": 0.5}


def test_classify_prompts_and_summary():
    shares = {"a": [0.0, 0.25, 0.75], "b": [1.0, 0.5], "c": [0.0, 0.0, 0.0], "d": [0.5, 0.0],
              "e": [0.0, 0.25], "f": [0.75, 0.0, 1.0]}
    records = [{"kind": "prompts", "epoch": e, "step": e, "solved": {k: v[e] for k, v in shares.items() if e < len(v)}}
               for e in range(3)]
    records += [{"kind": "train", "epoch": e, "step": e, "frac_zero_delta_groups": z} for e, z in enumerate([0.2, 0.6])]
    assert prompt_curves(records)["a"] == [(0, 0.0), (1, 0.25), (2, 0.75)]
    assert classify_prompts(prompt_curves(records)) == {
        "learned": ["a"], "always_solved": ["b"], "never_solved": ["c"], "forgotten": ["d"], "mixed": ["e", "f"]}
    assert prompt_summary(records) == ("6 prompts: 1 learned, 1 always solved, 1 never solved, 1 forgotten, 2 mixed; "
                                       "40% of groups had zero delta")
    assert prompt_summary([]) == "no per-prompt records and no zero-delta counts"


def test_divergence_reads_each_epoch_a_bounded_number_of_times(monkeypatch):
    """The reward's span so far is kept as the windows move: a run of n epochs costs O(n),
    not a max over the whole prefix for every window (100k epochs took 100 s and 1 GB)."""
    import rlvr.loop.diagnostics as diagnostics

    read = [0]

    def counting(extreme):
        def call(*args):
            values = list(args[0]) if len(args) == 1 else list(args)
            read[0] += len(values)
            return extreme(values)
        return call

    monkeypatch.setattr(diagnostics, "max", counting(max), raising=False)
    monkeypatch.setattr(diagnostics, "min", counting(min), raising=False)
    n = 4000
    rewards = [math.sin(e / 50) + e / n for e in range(n)]
    found = reward_gold_divergence(epoch_records(rewards, [0.0] * n))
    assert found and read[0] <= 8 * n


def test_no_gold_signal_or_a_reward_that_is_the_gold_check_keeps_the_monitor_quiet():
    from rlvr.loop.diagnostics import gold_notes

    rising = [e / 20 for e in range(20)]
    unknown = [dict(r, **{"episode/solved_reported": 0.0, "hack/max_reward_not_gold": 1.0})
               for r in epoch_records(rising, [0.0] * 20)]
    assert hacking_warnings(unknown) == []
    [note] = gold_notes(unknown)
    assert note.startswith("no gold signal: the environment never said whether an episode was solved")
    known = [dict(r, **{"episode/solved_reported": 1.0}) for r in epoch_records(rising, [0.0] * 20)]
    assert gold_notes(known) == [] and hacking_warnings(known)  # a gold check that stays at 0: a warning
    itself = epoch_records([0.1 + e / 100 for e in range(20)], [0.1 + e / 100 for e in range(20)])
    assert reward_gold_divergence(itself) and hacking_warnings(itself) == []
    assert gold_notes(itself) == ["the reward is the gold check itself (reward_mean equals solve_rate every epoch): "
                                  "the hacking monitor has nothing to compare"]
