import math
from pathlib import Path

import pytest
import torch

from helpers import QUIET
from rlvr.config import load_config
from rlvr.loop.seams import LocalLearner
from rlvr.loop.step import accumulate_gradients, optimizer_step
from rlvr.loop.trainer import collect_rollout, rollout_stats, setup, train
from rlvr.runs.metrics import without_timings

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run(overrides):
    return train(load_config(None, QUIET + overrides))


def train_records(records):
    return [r for r in records if r["kind"] == "train"]


def test_records_hold_consistent_metrics_and_evals():
    records = run(["algo.epochs=4", "log.eval_every=2", "algo.kl_coef=0.1", "algo.loss=clipped"])
    train_rs = train_records(records)
    assert [(r["epoch"], r["step"]) for r in train_rs] == [(s // 10, s) for s in range(40)]
    for r in train_rs:
        # Every response has all n tokens here, so the KL term's weighted mean in the loss is
        # the token mean the record reports: loss = pg_loss + kl_coef * kl.
        assert r["loss"] == pytest.approx(r["pg_loss"] + 0.1 * r["kl"], rel=1e-5, abs=1e-7)
        assert 0.0 <= r["clip_frac"] <= 1.0 and r["kl"] >= 0.0
        assert 0.0 < r["entropy"] <= math.log(5) + 1e-6  # a mean over 5 numbers per position
        assert math.isfinite(r["grad_norm"]) and r["grad_norm"] > 0 and r["skipped_step"] == 0.0
        assert 0.0 <= r["solve_rate"] <= 1.0 and 0.0 <= r["frac_zero_delta_groups"] <= 1.0
        assert 0.0 <= r["reward_mean"] <= 5.0  # inclusion_ordering: at most 3 + 2 for n = 3
    for epoch in range(4):
        steps = train_rs[10 * epoch: 10 * epoch + 10]
        assert len({s["reward_mean"] for s in steps}) == 1  # one rollout per epoch
        assert steps[0]["clip_frac"] == 0.0  # pi == pi_old at an epoch's first step: nothing clipped
    evals = [r for r in records if r["kind"] == "eval"]
    assert [(e["epoch"], e["step"]) for e in evals] == [(0, 0), (2, 20), (4, 40)]  # start, then every 2
    for e in evals:
        assert 0.0 <= e["greedy_solve_rate"] <= 1.0 and 0.0 <= e["sampled_solve_rate"] <= 1.0
        assert 0.0 <= e["sampled_reward"] <= 5.0
    # The reference is refreshed from the current policy: at the first step of the
    # run the policy equals the reference, so k3 is exactly 0.
    assert train_rs[0]["kl"] == 0.0
    assert any(r["kl"] > 0 for r in train_rs)


def test_fixed_seed_gives_identical_runs():
    a = without_timings(run(["algo.epochs=5", "algo.loss=clipped", "seed=3"]))
    b = without_timings(run(["algo.epochs=5", "algo.loss=clipped", "seed=3"]))
    c = without_timings(run(["algo.epochs=5", "algo.loss=clipped", "seed=4"]))
    assert a == b
    assert a != c


def test_training_raises_the_mean_reward():
    records = train_records(run(["algo.deltas=centered", "seed=1"]))
    first = sum(r["reward_mean"] for r in records[:10]) / 10
    last = sum(r["reward_mean"] for r in records[-10:]) / 10
    assert last > first + 0.5


def epoch_gradient(overrides):
    """Gradient of the first inner step of one epoch (inner_steps=1, lr ~ 0)."""
    config = load_config(None, QUIET + ["algo.epochs=1", "algo.inner_steps=1", "optim.lr=1e-30"] + overrides)
    task, st = setup(config)
    optimizer_step(config, st, collect_rollout(config, task, st))
    return [p.grad.clone() for p in st.policy.module.parameters()]


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum"])
@pytest.mark.parametrize("loss", ["naive", "clipped"])
def test_micro_batching_gives_the_same_gradient(aggregation, loss):
    base = [f"algo.aggregation={aggregation}", f"algo.loss={loss}", "algo.kl_coef=0.05"]
    one = epoch_gradient(base + ["optim.micro_batches=1"])
    five = epoch_gradient(base + ["optim.micro_batches=5"])
    for g1, g5 in zip(one, five):
        torch.testing.assert_close(g1, g5, rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in one)


def test_old_log_probs_are_cached_constants():
    # With the ratio loss at the first inner step, pi == pi_old: the gradient must equal
    # the naive loss's gradient (d ratio = ratio * d log pi = d log pi). Were the old
    # log-probs recomputed with gradient, it would be 0.
    ratio = epoch_gradient(["algo.loss=ratio"])
    naive = epoch_gradient(["algo.loss=naive"])
    for a, b in zip(ratio, naive):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in ratio)


def test_no_reference_model_without_kl():
    config = load_config(None, QUIET + ["algo.epochs=2"])
    task, st = setup(config)
    train(config, state=(task, st))
    assert st.ref_module is None
    config = load_config(None, QUIET + ["algo.epochs=3", "algo.kl_coef=0.1", "algo.ref_update_every=2"])
    task, st = setup(config)
    train(config, state=(task, st))
    assert st.ref_module is not None
    assert all(not p.requires_grad for p in st.ref_module.parameters())


def test_epoch_stats_show_collapse():
    # A collapsed policy samples identical responses: every group's deltas are zero.
    records = train_records(run(["seed=0"]))
    assert records[-1]["frac_zero_delta_groups"] == 1.0
    assert records[-1]["grad_norm"] == 0.0
    assert records[0]["frac_zero_delta_groups"] < 1.0


def test_best_example_config_solves_where_the_lecture_default_stalls():
    from rlvr.runs.metrics import summary

    best = summary(train(load_config(EXAMPLES / "sorting_best.yaml", QUIET + ["log.checkpoint_every=0"])))
    lecture = summary(run(["log.checkpoint_every=0"]))
    assert best["eval_greedy_solve_rate"] == 1.0  # all 3 prompts, seed 0
    assert lecture["eval_greedy_solve_rate"] < 1.0
    assert lecture["frac_zero_delta_groups_end"] == 1.0  # the stall: every group's deltas are 0


@pytest.mark.parametrize("schedule, expected", [
    # 2 warm-up steps (lr/2, lr), then over the remaining 8 of 10 steps:
    ("constant", [0.5, 1, 1, 1, 1, 1, 1, 1, 1, 1]),
    ("linear", [0.5, 1, 1, 7 / 8, 6 / 8, 5 / 8, 4 / 8, 3 / 8, 2 / 8, 1 / 8]),
])
def test_learning_rate_schedule(schedule, expected):
    records = train_records(run(["algo.epochs=2", "algo.inner_steps=5", f"optim.schedule={schedule}",
                                 "optim.warmup_steps=2", "optim.lr=0.01"]))
    assert [r["lr"] for r in records] == pytest.approx([0.01 * e for e in expected])


def test_cosine_schedule_ends_near_zero_and_eval_can_start_later():
    records = run(["algo.epochs=2", "optim.schedule=cosine", "log.eval_at_start=false"])
    lrs = [r["lr"] for r in train_records(records)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[-1] < 0.05 * 1e-3
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert [r["epoch"] for r in records if r["kind"] == "eval"] == [2]


def test_rollout_stats_by_hand():
    # Two groups of 2: rewards (1, 0) and (0.5, 0.5), the second group's deltas 0.
    # mean 0.5; std over 4 values with mean 0.5: sqrt((0.25 + 0.25 + 0 + 0) / 3) = sqrt(1/6).
    rewards = torch.tensor([[1.0, 0.0], [0.5, 0.5]])
    stats = rollout_stats(rewards, rewards == 1.0, torch.tensor([0.5, -0.5, 0.0, 0.0]), group_size=2)
    assert stats == pytest.approx({"reward_mean": 0.5, "reward_std": math.sqrt(1 / 6), "solve_rate": 0.25,
                                   "frac_zero_delta_groups": 0.5, "abstain_frac": 0.0})
    # one abstention: it reduces over the 3 scored rewards (1, 0, 0): mean 1/3, std sqrt((4/9 + 1/9 + 1/9) / 2)
    rewards = torch.tensor([[1.0, float("nan")], [0.0, 0.0]])
    stats = rollout_stats(rewards, rewards == 1.0, torch.zeros(4), group_size=2)
    assert stats == pytest.approx({"reward_mean": 1 / 3, "reward_std": 1 / math.sqrt(3), "solve_rate": 0.25,
                                   "frac_zero_delta_groups": 1.0, "abstain_frac": 0.25})
    rewards = torch.full((2, 2), float("nan"))  # every response abstained
    stats = rollout_stats(rewards, rewards == 1.0, torch.zeros(4), group_size=2)
    assert math.isnan(stats["reward_mean"]) and stats["reward_std"] == 0.0 and stats["abstain_frac"] == 1.0


def test_evaluation_in_chunks_equals_one_batch():
    from rlvr.loop.evaluation import evaluate

    config = load_config(None, QUIET + ["task.prompts=null", "task.eval_size=10"])
    task, st = setup(config)
    whole = evaluate(config, task, st.policy, 0, 0)[0]
    config = load_config(None, QUIET + ["task.prompts=null", "task.eval_size=10", "log.eval_batch_size=3"])
    chunked = evaluate(config, task, st.policy, 0, 0)[0]
    assert whole["greedy_reward"] == pytest.approx(chunked["greedy_reward"])
    assert whole["greedy_solve_rate"] == chunked["greedy_solve_rate"]


def test_entropy_is_computed_only_when_logged():
    with_entropy = without_timings(run(["algo.epochs=2", "algo.loss=clipped"]))
    without = without_timings(run(["algo.epochs=2", "algo.loss=clipped", "log.entropy=false"]))
    assert all("entropy" in r for r in with_entropy if r["kind"] == "train")
    assert not any("entropy" in r for r in without)
    # the same run otherwise: entropy is a metric, not part of the loss
    assert [{k: v for k, v in r.items() if k != "entropy"} for r in with_entropy] == without


def test_shares_of_a_rollout_add_up_to_the_full_batch_loss_and_gradient():
    # What a data-parallel learner relies on: each share's loss is its part of the whole
    # batch's loss (the aggregation weights are the whole batch's), so shares add up.
    config = load_config(None, QUIET + ["algo.epochs=1", "algo.loss=clipped", "algo.kl_coef=0.05",
                                        "algo.aggregation=seq_mean_token_sum", "seed=2"])
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    params = list(st.policy.module.parameters())
    full = accumulate_gradients(config, st.policy, rollout, 1)
    full_grads = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    parts = [accumulate_gradients(config, st.policy, rollout.rows(rows), 1) for rows in (slice(0, 11), slice(11, 30))]
    for a, b in zip(full_grads, [p.grad for p in params]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    for key in full:
        torch.testing.assert_close(full[key], parts[0][key] + parts[1][key], rtol=1e-5, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in full_grads)


# ---------------------------------------------------------------- the loop's seams


class StubSource:
    """A rollout source that samples one batch in this process and hands the same one back
    every epoch, counting the epochs it was asked for and those it evaluated."""

    def __init__(self, config, st, task):
        from rlvr.loop.seams import LocalRolloutSource

        self.local = LocalRolloutSource(config)
        self.batch = self.local.sample_and_grade(st, task)
        self.epochs, self.evaluated = [], []

    def sample_and_grade(self, st, task):
        self.epochs.append(st.epoch)
        samples, grades, stats = self.batch
        return samples, grades, dict(stats)

    def evaluate(self, st, task):
        self.evaluated.append(st.epoch)
        return self.local.evaluate(st, task)

    def offer_weights(self, st):
        self.local.offer_weights(st)


class StubLearner(LocalLearner):
    """A learner that takes no step (it scores in this process): a record per call, the step
    count advanced, pulls counted."""

    def __init__(self, config):
        super().__init__(config)
        self.pulls = []

    def optimizer_step(self, st, rollout):
        record = {"kind": "train", "epoch": st.epoch, "step": st.step, "stub": True,
                  "reward_mean": rollout.stats["reward_mean"]}
        st.step += 1
        return record

    def pull(self, st):
        self.pulls.append(st.step)


def test_train_runs_with_the_rollout_source_and_learner_it_is_given():
    # cluster.learners=2 in the config: the loop builds nothing when it is handed its parts
    config = load_config(None, QUIET + ["algo.epochs=3", "algo.inner_steps=2", "log.eval_every=3",
                                        "cluster.learners=2"])
    task, st = setup(config)
    start = {k: v.clone() for k, v in st.policy.module.state_dict().items()}
    source, learner = StubSource(config, st, task), StubLearner(config)
    records = train(config, state=(task, st), source=source, learner=learner)
    steps = [r for r in records if r["kind"] == "train"]
    assert [(r["epoch"], r["step"]) for r in steps] == [(e, 2 * e + i) for e in range(3) for i in range(2)]
    assert all(r["stub"] for r in steps) and len({r["reward_mean"] for r in steps}) == 1
    assert source.epochs == [0, 1, 2] and learner.pulls == [2, 4, 6]  # one batch and one pull an epoch
    assert [r["epoch"] for r in records if r["kind"] == "eval"] == [0, 3] == source.evaluated
    for key, value in st.policy.module.state_dict().items():  # no step was taken but the learner's
        assert torch.equal(value, start[key]), key
    with pytest.raises(ValueError, match="both a rollout source and a learner"):
        train(config, state=(task, st), source=source)


def test_the_local_parts_handed_in_give_the_default_run():
    from rlvr.loop.seams import LocalLearner, LocalRolloutSource

    overrides = QUIET + ["algo.epochs=2", "algo.loss=clipped", "algo.kl_coef=0.05", "log.grad_noise_every=1"]
    config = load_config(None, overrides)
    task, st = setup(config)
    handed = train(config, state=(task, st), source=LocalRolloutSource(config), learner=LocalLearner(config))
    assert without_timings(handed) == without_timings(train(load_config(None, overrides)))
