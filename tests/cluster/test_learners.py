"""Data-parallel learners (rlvr.cluster.learners) against the single-process step."""


import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from ray_actors import record_actors

from rlvr.cluster.learners import LearnerGroup, share_bounds
from rlvr.config import ConfigError, load_config
from rlvr.loop.step import accumulate_gradients, optimizer_step
from rlvr.loop.trainer import collect_rollout, setup

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


RUN = OVERRIDES + ["algo.epochs=3", "algo.inner_steps=2", "log.eval_every=3", "log.checkpoint_every=0"]


def test_a_run_with_two_learners_follows_the_single_process_run(ray_local):
    """The whole loop with the optimizer steps on two learners: the records agree with the
    single-process run's to float rounding (the gradient is summed in another order), and the
    driver ends with the learners' weights."""
    from rlvr.api import run_loop as train

    local = train(load_config(None, RUN))
    states = []

    def keep_weights(st):
        states.append({k: v.clone() for k, v in st.policy.module.state_dict().items()})

    group = train(load_config(None, RUN + ["cluster.learners=2"]), on_epoch_end=keep_weights)
    assert [(r["kind"], r["epoch"], r["step"]) for r in group] == [(r["kind"], r["epoch"], r["step"]) for r in local]
    for a, b in zip(group, local):
        for key in ("loss", "pg_loss", "kl", "clip_frac", "grad_norm", "reward_mean", "solve_rate", "lr",
                    "eval_greedy_solve_rate"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    assert len(states) == 3 and not torch.equal(states[0]["embedding.weight"], states[-1]["embedding.weight"])


def test_a_dead_learner_stops_the_run_with_a_clear_message(ray_local, monkeypatch):
    import os
    import signal

    from rlvr.api import run_loop as train
    from rlvr.loop.state import TrainingError

    built = record_actors(monkeypatch)

    def kill_rank_one(st):
        if st.epoch == 1:
            os.kill(built[-1].pids()[1], signal.SIGKILL)

    # the first call of epoch 1: scoring the batch under the learners' reference (algo.kl_coef > 0)
    message = (r"^epoch 1, step 2: learner rank 1 died while scoring its share of the samples, after \d+\.\d s "
               r"\(.*\)\. "
               "The run stops; the checkpoints written before are intact")
    with pytest.raises(TrainingError, match=message):
        train(load_config(None, RUN + ["cluster.learners=2"]), on_epoch_end=kill_rank_one)
    assert ray_local.available_resources().get("CPU", 0) > 0  # its actors were ended


def test_a_two_learner_run_checkpoints_and_resumes_in_one_process(ray_local, tmp_path):
    """The learners write the checkpoint's weights and optimizer state as shards; resumed
    without the cluster (one process reads the shards whole), the run goes on as the
    single-process run does."""
    from rlvr.cli import main
    from rlvr.runs.metrics import read_records

    base = [f"{o}" for o in RUN if not o.startswith(("algo.epochs", "log.checkpoint_every"))]
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert main(["train", f"out_dir={straight}", "algo.epochs=4", "log.checkpoint_every=1", *base]) == 0
    assert main(["train", f"out_dir={split}", "algo.epochs=2", "log.checkpoint_every=1", "cluster.learners=2",
                 *base]) == 0
    assert main(["train", f"resume={split}", "algo.epochs=4", "cluster.learners=1"]) == 0
    # the split run also evaluated at its first end (epoch 2): compare the optimizer steps
    a, b = ([r for r in read_records(d / "metrics.jsonl") if r["kind"] == "train"] for d in (split, straight))
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(8))
    for ra, rb in zip(a, b):
        for key in ("loss", "grad_norm", "reward_mean", "kl"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-6), (rb["step"], key)


def lm_config(tiny_model, *extra):
    from helpers import QUIET

    return load_config(None, QUIET + [
        "task.name=sort_text", "task.options={num_digits: 3, num_eval: 4}", "task.prompts_per_epoch=2",
        "policy.name=causal_lm", f"policy.options={{model: '{tiny_model}', max_new_tokens: 7}}",
        "algo.epochs=2", "algo.inner_steps=2", "algo.group_size=4", "algo.loss=clipped", "optim.lr=1e-3",
        "log.eval_every=2", "log.eval_samples=1", "log.checkpoint_every=0", "log.entropy=false", "threads=1",
        *extra])


def test_fsdp_learners_match_the_single_process_gradient_and_run(ray_local, tiny_model):
    """FSDP2 (parameters, gradients and Adam state sharded over two learners): the summed
    gradient is the single-process one, and a short run follows the single-process run."""
    pytest.importorskip("transformers")
    from rlvr.api import run_loop as train

    config = lm_config(tiny_model, "cluster.learners=2", "cluster.learner_strategy=fsdp")
    task, st = setup(config)
    rollout = collect_rollout(config, task, st)
    st.optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(config, st.policy, rollout, config.optim.micro_batches)
    full_grads = {name: p.grad.clone() for name, p in st.policy.module.named_parameters() if p.grad is not None}
    task.close()
    group = LearnerGroup(config, 2, state=st)
    try:
        grads = group.gradients(rollout)
        assert grads.keys() == full_grads.keys()
        for key, value in full_grads.items():
            torch.testing.assert_close(grads[key], value, rtol=1e-4, atol=1e-6)
    finally:
        group.close()

    local = [r for r in train(lm_config(tiny_model)) if r["kind"] == "train"]
    sharded = [r for r in train(config) if r["kind"] == "train"]
    for a, b in zip(sharded, local):
        for key in ("loss", "grad_norm", "reward_mean", "clip_frac"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-5), (a["step"], key)


def test_fsdp_is_refused_for_the_positional_toy():
    from rlvr.base.errors import ConfigError

    with pytest.raises(ConfigError, match="fused scorer"):
        load_config(None, ["cluster.learners=2", "cluster.learner_strategy=fsdp"])


def test_two_learners_measure_the_gradient_noise_of_the_single_process_step(ray_local):
    """Each learner splits its share (whole groups) into parts and the parts of both are
    gathered: 4 prompts in 2 shares of 2, parts of one group each, as the single process
    splits the batch, so grad/* agree to float rounding."""
    from rlvr.api import run_loop as train

    run = RUN + ["task.prompts=null", "task.prompts_per_epoch=4", "log.grad_noise_every=1", "algo.epochs=2",
                 "log.eval_every=2"]
    local = [r for r in train(load_config(None, run)) if "grad/noise_scale" in r]
    group = [r for r in train(load_config(None, run + ["cluster.learners=2"])) if "grad/noise_scale" in r]
    assert [r["step"] for r in group] == [r["step"] for r in local] == [0, 2]
    for a, b in zip(group, local):
        for key in ("grad/true_norm_sq", "grad/batch_size"):
            assert a[key] == pytest.approx(b[key], rel=1e-4), key
        # trace_cov is a difference of squared norms: the two sides' float32 sums in another order
        # (all-reduced across learners) lose more digits to the cancellation (2e-4 on an AMD EPYC).
        for key in ("grad/trace_cov", "grad/noise_scale"):
            assert a[key] == pytest.approx(b[key], rel=1e-3), key


def test_the_noise_meter_refuses_learner_shares_that_split_groups():
    with pytest.raises(ConfigError, match="must split evenly"):
        load_config(None, ["log.grad_noise_every=1", "cluster.learners=2"])  # 3 prompts over 2 learners


def test_a_cluster_run_of_an_lm_prints_no_progress_bars_or_escapes_and_leaves_no_ray_folder(tiny_model, tmp_path):
    """Ray prints actors' output behind a colored prefix; a progress bar's carriage returns and
    escapes arrive as raw text in a log (the learners load the model, so each printed a bar)."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths have a length limit
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "rlvr", "train", "task.name=sort_text", "policy.name=causal_lm",
               f"policy.options={{model: '{tiny_model}', max_new_tokens: 4}}", "cluster.learners=2",
               "algo.epochs=1", "algo.group_size=2", "task.prompts_per_epoch=2", "log.progress=false",
               "log.plot=false", f"out_dir={tmp_path / 'run'}"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        sessions = list(Path(ray_tmp, "ray").glob("session_*"))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "Loading weights" not in done.stderr, done.stderr[-500:]
    assert not sessions
