"""train_batched against the trainer run by run: every record's numbers equal (==), the
timings aside; what it refuses (every algo field declared); why one Adam over stacked
tensors is not used."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import rlvr
from rlvr.base.errors import ConfigError
from rlvr.config import AlgoConfig
from rlvr.loop.batched import ANY_VALUE, BATCHED_ALGO, TIMING_KEYS, BatchedPositional, batching_refusal, train_batched
from rlvr.loop.evaluation import evaluate, evaluate_runs
from rlvr.loop.trainer import rollout_stats, setup, train


def configs(modes=("raw", "centered", "normalized"), seeds=(0, 1), extra=()):
    base = ["log.progress=false", "algo.epochs=3", "algo.inner_steps=3", "log.eval_every=2", *extra]
    return [rlvr.load_config(None, [*base, f"algo.deltas={m}", f"seed={s}", f"name={m}-{s}"])
            for m in modes for s in seeds]


def without_timings(records):
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in records]


def assert_same_as_one_by_one(cs):
    alone = [train(c) for c in cs]
    batched = train_batched(cs)
    assert len(batched) == len(cs)
    for c, a, b in zip(cs, alone, batched):
        assert [r["kind"] for r in a] == [r["kind"] for r in b], c.name
        assert without_timings(a) == without_timings(b), c.name  # bit for bit: float == float
        assert set(a[-1]) == set(b[-1])


def test_lecture_runs_equal_one_by_one():
    # 3 modes x 2 seeds: 2 evals (start, epoch 2, end) and 9 steps each; the eval at epoch
    # 3 is the last one. Records include every step's loss, gradient norm and entropy.
    assert_same_as_one_by_one(configs())


def test_other_shapes_and_options_equal_one_by_one():
    # n=4, D=16, V=7, G=5, AdamW with decay and a cosine warm-up, temperature, token_mean,
    # two equal consecutive prompts (U=1 < B=2 distinct groups), eval chunks of 1 prompt
    # (small matmuls: run by run, see matmul_way), the other delta modes.
    extra = ["policy.embedding_dim=16", "task.num_numbers=4", "task.vocab_size=7", "algo.group_size=5",
             "task.prompts=[[1,0,2,6],[1,0,2,6],[3,2,4,5]]", "optim.name=adamw", "optim.weight_decay=0.1",
             "optim.schedule=cosine", "optim.warmup_steps=3", "policy.temperature=0.7",
             "algo.aggregation=token_mean", "log.eval_batch_size=1", "task.reward=position_match"]
    assert_same_as_one_by_one(configs(modes=("max_only", "leave_one_out"), seeds=(3,), extra=extra))


def test_epoch_end_state_is_each_runs_own():
    # on_epoch_end sees run r's TrainState with its own weights, Adam state and schedule,
    # as a checkpoint would save them; they equal the run trained alone.
    cs = configs(modes=("centered",), seeds=(0, 1))
    alone = [setup(c) for c in cs]
    for c, state in zip(cs, alone):
        train(c, state=state)
    states = [setup(c) for c in cs]
    seen = []
    train_batched(cs, states=states, on_epoch_end=[lambda st: seen.append((st.epoch, st.step))] * len(cs))
    assert seen == [(1, 3), (1, 3), (2, 6), (2, 6), (3, 9), (3, 9)]
    for (_, a), (_, b) in zip(alone, states):
        assert (a.epoch, a.step) == (b.epoch, b.step) == (3, 9)
        for (name, p), q in zip(a.policy.module.named_parameters(), b.policy.module.parameters()):
            assert torch.equal(p, q), name
        sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
        assert sa["param_groups"] == sb["param_groups"]
        for i in sa["state"]:
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(sa["state"][i][key], sb["state"][i][key]), (i, key)
        assert a.scheduler.state_dict() == b.scheduler.state_dict()
        assert torch.equal(a.generator.get_state(), b.generator.get_state())


def test_clipped_runs_equal_one_by_one():
    assert_same_as_one_by_one(configs(seeds=(0,), extra=["optim.max_grad_norm=0.5"]))


def test_evaluation_of_all_runs_at_once_equals_each_run_alone():
    # evaluate_runs samples every run in one batched pass (BatchedPositional as its
    # sampler) and grades every run's chunk in one call; each run's eval and samples
    # records are those of evaluate on its own policy. Chunks of 2 of the 3 eval prompts:
    # an uneven last chunk; 5 samples each: pass@1 and pass@5.
    extra = ["task.prompts=[[1,0,2],[4,0,2],[3,2,4]]", "log.eval_batch_size=2", "log.eval_samples=5"]
    cs = configs(modes=("centered",), seeds=(0, 1, 2), extra=extra)
    states = [setup(c) for c in cs]
    task = states[0][0]
    model = BatchedPositional([st.policy.module for _, st in states])
    if model.inexact_matmul([2, 1]) is not None:
        pytest.skip("this machine's batched matmul is not exact at these shapes (train_batched refuses)")
    together = evaluate_runs(cs, task, model, 2, 7)
    assert together == [evaluate(c, task, st.policy, 2, 7) for c, (_, st) in zip(cs, states)]
    assert len({str(recs[0]) for recs in together}) == 3  # the seeds' weights and draws differ


def test_rollout_stats_of_all_runs_at_once_equal_each_run_alone():
    # collect_batched's call: rewards, correct [R, B, G] of a sorting batch, deltas [R, N]
    gen = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 6, (6, 10, 8), generator=gen).float() / 5  # position_match-like shares
    correct, deltas = rewards == 1.0, torch.randn(6, 80, generator=gen)
    deltas[:, :8] = 0.0
    together = rollout_stats(rewards, correct, deltas, 8)
    assert together == [rollout_stats(rewards[r][None], correct[r][None], deltas[r][None], 8)[0] for r in range(6)]
    assert together[0]["frac_zero_delta_groups"] == pytest.approx(0.1)  # the first of 10 groups


def test_refusals_name_the_reason():
    cs = configs(seeds=(0,))
    assert batching_refusal(cs) is None
    cs[1] = rlvr.load_config(None, ["optim.lr=0.01", "name=other"])
    assert "differs from run 0" in batching_refusal(cs)
    with pytest.raises(ConfigError, match="differs from run 0"):
        train_batched(cs)
    assert "fixed task.options.prompts" in batching_refusal([rlvr.load_config(None, ["task.prompts=null"])])
    assert "algo.loss=naive" in batching_refusal([rlvr.load_config(None, ["algo.loss=clipped"])])
    assert batching_refusal([]) == "no runs"
    started = configs(seeds=(0,))[:1]
    state = setup(started[0])
    state[1].step = 1
    with pytest.raises(ConfigError, match="from the beginning"):
        train_batched(started, states=[state])


def test_every_algo_field_is_batched_or_refused():
    # A new AlgoConfig field fails here until BATCHED_ALGO says what the batched path does
    # with it: trains it as the trainer does (ANY_VALUE), or batches one value only.
    assert {f.name for f in dataclasses.fields(AlgoConfig)} == set(BATCHED_ALGO)
    base = configs(seeds=(0,))[0]
    assert batching_refusal([base]) is None
    others = {"loss": "clipped", "kl_coef": 0.1, "tis_cap": 2.0, "is_correction": "token_mis", "entropy_coef": 0.01,
              "dynamic_sampling": True, "overlong": "mask", "top_entropy_q": 0.2}  # a value not batched, per field
    assert set(others) == {name for name, value in BATCHED_ALGO.items() if value != ANY_VALUE}
    wants = {"loss": "naive", "kl_coef": "0", "tis_cap": "null", "is_correction": "null", "entropy_coef": "0",
             "dynamic_sampling": "false", "overlong": "none", "top_entropy_q": "null"}
    for name, value in others.items():
        config = dataclasses.replace(base, algo=dataclasses.replace(base.algo, **{name: value}))
        assert batching_refusal([config]) == f"batched runs need algo.{name}={wants[name]}"


def test_one_adam_over_stacked_tensors_differs():
    # Why train_batched gives its optimizer every run's tensors separately: the fused
    # Adam kernel runs the last numel % 16 elements of a tensor in double precision, the
    # rest in float32 vectors. A run's [3, 10, 10] tensor has 12 such elements; stacked
    # into [R, 3, 10, 10] they move into the vector loop and round differently.
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(15, 3, 10, 10, generator=gen)
    grads = [torch.randn(15, 3, 10, 10, generator=gen) for _ in range(100)]  # a differing bit is rare
    stacked = start.clone()
    alone = [start[r].clone() for r in range(15)]
    opt_stacked = torch.optim.Adam([stacked], lr=1e-3, fused=True)
    opts = [torch.optim.Adam([p], lr=1e-3, fused=True) for p in alone]
    views = start.clone()
    opt_views = torch.optim.Adam([views[r] for r in range(15)], lr=1e-3, fused=True)
    for g in grads:
        stacked.grad = g.clone()
        for r, (p, opt) in enumerate(zip(alone, opts)):
            p.grad = g[r].clone()
            opt.step()
        for r, p in enumerate(opt_views.param_groups[0]["params"]):
            p.grad = g[r].clone()
        opt_stacked.step()
        opt_views.step()
    assert not torch.equal(stacked, torch.stack(alone))
    assert torch.equal(views, torch.stack(alone))  # one optimizer over per-run tensors: the same bits


def test_a_non_finite_step_is_skipped_for_its_run_only(monkeypatch):
    # The trainer's skip rule (skip_step) per run: run 1's first step reads non-finite, so
    # the shared optimizer leaves its parameters alone (its Adam step count is one behind);
    # run 0 trains as alone. A second such step
    # in a row stops the runs at optim.max_bad_steps=2.
    import rlvr.loop.batched as batched
    from rlvr.loop.state import TrainingError

    real, calls = batched.step_batched, []

    def step_with_nan(*args, times=1):
        metrics = real(*args)
        calls.append(1)
        if len(calls) <= times:
            metrics[1]["loss"] = float("nan")
        return metrics

    cs = configs(modes=("centered",), seeds=(0, 1), extra=["optim.max_bad_steps=2"])
    monkeypatch.setattr(batched, "step_batched", step_with_nan)
    states = [setup(c) for c in cs]
    records = train_batched(cs, states=states, on_epoch_end=[lambda st: None] * 2)
    steps = [[r for r in run if r["kind"] == "train"] for run in records]
    assert [r["skipped_step"] for r in steps[1][:2]] == [1.0, 0.0] and steps[0][0]["skipped_step"] == 0.0
    assert without_timings(records[0]) == without_timings(train(cs[0]))
    adam = states[1][1].optimizer.state_dict()["state"]
    assert all(int(s["step"]) == len(steps[1]) - 1 for s in adam.values())  # one step fewer than run 0's
    calls.clear()
    monkeypatch.setattr(batched, "step_batched", lambda *args: step_with_nan(*args, times=2))
    with pytest.raises(TrainingError, match="2 consecutive steps"):
        train_batched(cs)
