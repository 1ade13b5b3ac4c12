"""train_batched against the trainer run by run: every record's numbers equal (==), the
timings aside; what it refuses; why one Adam over stacked tensors is not used."""

from __future__ import annotations

import pytest
import torch

import rlvr
from rlvr.batched import TIMING_KEYS, batching_refusal, train_batched
from rlvr.errors import ConfigError
from rlvr.trainer import setup, train


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
    # (small matmuls: run by run, see matmul_strategy), the other delta modes.
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


def test_refusals_name_the_reason():
    cs = configs(seeds=(0,))
    assert batching_refusal(cs) is None
    cs[1] = rlvr.load_config(None, ["optim.lr=0.01", "name=other"])
    assert "differs from run 0" in batching_refusal(cs)
    with pytest.raises(ConfigError, match="differs from run 0"):
        train_batched(cs)
    assert "fixed task.prompts" in batching_refusal([rlvr.load_config(None, ["task.prompts=null"])])
    assert "algo.loss=naive" in batching_refusal([rlvr.load_config(None, ["algo.loss=clipped"])])
    assert batching_refusal([]) == "no runs"
    started = configs(seeds=(0,))[:1]
    state = setup(started[0])
    state[1].step = 1
    with pytest.raises(ConfigError, match="from the beginning"):
        train_batched(started, states=[state])


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
