"""Data-parallel learners (rlvr.cluster.learners) against the single-process step."""


import pytest
import torch

from rlvr.cluster.learners import LearnerGroup, share_bounds
from rlvr.config import load_config
from rlvr.trainer import accumulate_gradients, collect_rollout, optimizer_step, setup

OVERRIDES = ["log.progress=false", "log.plot=false", "algo.loss=clipped", "algo.kl_coef=0.05"]


def test_share_bounds_are_contiguous_and_cover_every_row():
    assert share_bounds(30, 2) == [(0, 15), (15, 30)]
    assert share_bounds(7, 3) == [(0, 2), (2, 4), (4, 7)]
    with pytest.raises(ValueError, match="cannot be split"):
        share_bounds(1, 2)


def test_two_learners_match_the_single_process_gradient_and_step(ray_local):
    config = load_config(None, OVERRIDES)
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    start = {k: v.clone() for k, v in st.policy.module.state_dict().items()}
    named = dict(st.policy.module.named_parameters())
    st.optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, rollout, config.optim.micro_batches)
    full_grads = {name: p.grad.clone() for name, p in named.items() if p.grad is not None}
    record = optimizer_step(config, st, rollout)  # zeroes the gradient, then the same one again
    after = st.policy.module.state_dict()

    group = LearnerGroup(config, 2)  # seeded as setup(): the replicas start as the driver did
    try:
        for key, value in group.state_dict().items():
            torch.testing.assert_close(value, start[key], rtol=0, atol=0)
        grads = group.gradients(rollout)
        assert grads.keys() == full_grads.keys()
        for key, value in full_grads.items():
            torch.testing.assert_close(grads[key], value, rtol=1e-5, atol=1e-7)
        assert any(g.abs().sum() > 0 for g in grads.values())

        group_record = group.step(rollout)
        for key in ("loss", "pg_loss", "kl", "clip_frac", "entropy", "grad_norm"):
            assert group_record[key] == pytest.approx(record[key], rel=1e-5, abs=1e-7), key
        assert group_record["lr"] == record["lr"] and group_record["skipped_step"] == 0.0

        rank0, rank1 = group.state_dict(0), group.state_dict(1)
        for key, value in rank0.items():  # the same step on the same summed gradient: bitwise equal
            assert torch.equal(value, rank1[key]), key
        # Adam's first step moves each weight by lr * g / (|g| + eps), about lr * sign(g), so it passes the
        # gradient's rounding (summation order differs: ~4e-8 absolute on |g| up to 0.32) through damped by
        # lr * eps / |g|^2; only a |g| near eps (1e-8) could move by up to ~lr. The toy's smallest nonzero
        # |g| is 5.7e-6: measured differences 1.2e-10 (2 learners) and 1.9e-9 (3), under 1e-4 * lr = 1e-7.
        lr = config.optim.lr
        for key, value in rank0.items():
            torch.testing.assert_close(value, after[key], rtol=0, atol=1e-4 * lr)
            assert not torch.equal(value, start[key]) or torch.equal(after[key], start[key]), key
    finally:
        group.close()
