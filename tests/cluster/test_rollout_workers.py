"""Rollout workers on Ray (rlvr.cluster.rollout): the same records as the single-process
run, and a killed worker restarted without losing a batch."""

import os
import signal
import time

import pytest
import torch
from ray_actors import record_actors

from helpers import QUIET, comparable
from rlvr.api import run_loop as train
from rlvr.base.errors import ConfigError
from rlvr.config import load_config

pytestmark = pytest.mark.ray

SORTING = QUIET + ["algo.epochs=4", "algo.inner_steps=2", "log.eval_every=2", "log.checkpoint_every=0"]



def cpus_freed(ray, timeout=20.0):
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0) < 2:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_the_cluster_settings_are_checked_before_any_work():
    assert load_config(None, []).cluster.rollout_workers == 0
    with pytest.raises(ConfigError, match="needs rollout workers"):
        load_config(None, ["cluster.max_staleness=1", "algo.tis_cap=2"])
    with pytest.raises(ConfigError, match="set algo.tis_cap"):
        load_config(None, ["cluster.max_staleness=1", "cluster.rollout_workers=1"])
    with pytest.raises(ConfigError, match="more learners than the 30 responses"):
        load_config(None, ["cluster.learners=31"])


def test_one_worker_gives_the_single_process_records(ray_local):
    local = train(load_config(None, SORTING))
    remote = train(load_config(None, SORTING + ["cluster.rollout_workers=1"]))
    assert comparable(remote) == comparable(local)
    train_records = [r for r in remote if r["kind"] == "train"]
    assert [r["cluster/weights_version"] for r in train_records] == [r["step"] - r["step"] % 2 for r in train_records]
    assert all(r["cluster/worker_restarts"] == 0 and r["time/sync"] >= 0 for r in train_records)
    assert cpus_freed(ray_local)  # the run ended its worker


def test_a_killed_worker_is_restarted_and_the_batch_retried(ray_local, monkeypatch):
    built = record_actors(monkeypatch)
    local = train(load_config(None, SORTING))
    killed = []

    def kill_after_first_epoch(st):
        if st.epoch == 1:
            pid = built[-1].worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    remote = train(load_config(None, SORTING + ["cluster.rollout_workers=1"]), on_epoch_end=kill_after_first_epoch)
    assert killed
    assert comparable(remote) == comparable(local)  # every epoch's batch full, and the same batch
    restarts = [r["cluster/worker_restarts"] for r in remote if r["kind"] == "train"]
    assert restarts == [0, 0] + [1] * 6


def test_a_language_model_run_gives_the_single_process_records(ray_local, tiny_model):
    pytest.importorskip("transformers")
    overrides = QUIET + [
        "task.name=sort_text", "task.options={num_digits: 3, num_eval: 8}", "task.prompts_per_epoch=2",
        "policy.name=causal_lm", f"policy.options={{model: '{tiny_model}', max_new_tokens: 7}}",
        "algo.epochs=2", "algo.inner_steps=2", "algo.group_size=4", "log.eval_every=2", "log.eval_samples=2",
        "log.checkpoint_every=0", "log.entropy=false", "threads=1"]
    local = train(load_config(None, overrides))
    remote = train(load_config(None, overrides + ["cluster.rollout_workers=1"]))
    assert comparable(remote) == comparable(local)


def test_an_episode_run_gives_the_single_process_records(ray_local, tiny_model):
    # multi-turn episodes on the worker: the same task and policy, built there, run them
    pytest.importorskip("transformers")
    overrides = QUIET + [
        "task.name=environment", "task.options={environment: guessing, environment_options: {high: 8}, "
        "max_turns: 3, max_tokens: 24, eval_size: 4}", "task.prompts_per_epoch=2", "policy.name=causal_lm",
        f"policy.options={{model: '{tiny_model}', max_new_tokens: 3}}", "algo.epochs=2", "algo.inner_steps=2",
        "algo.group_size=3", "log.eval_every=2", "log.eval_samples=2", "log.checkpoint_every=0", "threads=1"]
    local = train(load_config(None, overrides))
    remote = train(load_config(None, overrides + ["cluster.rollout_workers=1"]))
    assert comparable(remote) == comparable(local)
    assert all(r["episode/turns"] >= 1 for r in local if r["kind"] == "train")


def test_asynchronous_batches_are_at_most_k_versions_old_and_corrected(ray_local):
    """k = 1: the batch of epoch e+1 is sampled with the weights held at the start of epoch e
    (while the trainer trains on epoch e): one version old, corrected by TIS."""
    overrides = SORTING + ["cluster.rollout_workers=1", "cluster.max_staleness=1", "algo.tis_cap=2"]
    records = train(load_config(None, overrides))
    firsts = [r for r in records if r["kind"] == "train" and r["step"] % 2 == 0]  # each epoch's first step
    assert [r["cluster/staleness"] for r in firsts] == [0.0, 1.0, 1.0, 1.0]
    # epoch e >= 1 sampled with the weights at the start of epoch e-1: after 2 (e-1) optimizer steps
    assert [r["cluster/weights_version"] for r in firsts] == [0.0, 0.0, 2.0, 4.0]
    # in optimizer steps: each first step minus the version, at most the bound 1 x inner_steps; none dropped
    assert [r["cluster/staleness_steps_max"] for r in firsts] == [0.0, 2.0, 2.0, 2.0]
    assert all(r["cluster/staleness_steps"] == r["cluster/staleness_steps_max"] for r in firsts)
    assert all(r["cluster/dropped_stale_total"] == 0 for r in records if r["kind"] == "train")
    stale, fresh = firsts[1:], firsts[:1]
    assert all(r["mismatch/max_abs_gap"] > 0 for r in stale)  # the sampler's weights are not the trainer's
    assert all(r["mismatch/max_abs_gap"] == 0 for r in fresh)
    assert len([r for r in records if r["kind"] == "train"]) == 8


def test_a_killed_worker_with_batches_in_flight_is_restarted_once(ray_local, monkeypatch):
    built = record_actors(monkeypatch)
    overrides = QUIET + ["algo.epochs=6", "algo.inner_steps=2", "log.eval_every=3", "log.checkpoint_every=0",
                         "cluster.rollout_workers=1", "cluster.max_staleness=1", "algo.tis_cap=2"]
    expected = train(load_config(None, overrides))
    killed = []

    def kill_after_second_epoch(st):  # the batch of epoch 2 is delivered; that of epoch 3 is not asked yet
        if st.epoch == 2:
            pid = built[-1].worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    records = train(load_config(None, overrides), on_epoch_end=kill_after_second_epoch)
    assert killed
    # the same batches: each asynchronous batch has its own generator and its weights reference
    assert comparable(records) == comparable(expected)
    restarts = [r["cluster/worker_restarts"] for r in records if r["kind"] == "train"]
    assert restarts == [0] * 6 + [1] * 6  # seen with the batch of epoch 3, from the new process


def test_weights_by_collective_broadcast_give_the_same_records(ray_local):
    """weight_sync=collective (a gloo group of this process and the workers, one broadcast per
    dtype) hands the workers the same weights as the object store: the same records."""
    overrides = SORTING + ["cluster.rollout_workers=2"]
    store = train(load_config(None, overrides))
    broadcast = train(load_config(None, overrides + ["cluster.weight_sync=collective"]))
    assert comparable(broadcast) == comparable(store)
    assert not torch.distributed.is_initialized()  # the run's group ended with it


def test_a_collective_worker_that_dies_ends_the_run_clearly(ray_local, monkeypatch):
    from rlvr.cluster import ClusterError

    built = record_actors(monkeypatch)

    def kill_after_first_epoch(st):
        if st.epoch == 1:
            os.kill(built[-1].worker_pids()[0], signal.SIGKILL)

    with pytest.raises(ClusterError, match="weight_sync=collective cannot take a restarted worker"):
        train(load_config(None, SORTING + ["cluster.rollout_workers=1", "cluster.weight_sync=collective"]),
              on_epoch_end=kill_after_first_epoch)
    assert not torch.distributed.is_initialized()


def test_a_batch_split_over_two_workers(ray_local):
    """split_batch: the driver draws the epoch's prompts (the same as one process draws) and
    each worker samples its part with its own generator; the batch is whole and the run
    repeats exactly. The lecture's 3 prompts split 1 + 2."""
    overrides = SORTING + ["task.prompts=null", "task.prompts_per_epoch=5"]
    local = train(load_config(None, overrides))
    split = train(load_config(None, overrides + ["cluster.rollout_workers=2", "cluster.split_batch=true"]))
    again = train(load_config(None, overrides + ["cluster.rollout_workers=2", "cluster.split_batch=true"]))
    assert comparable(split) == comparable(again)
    first = [r for r in split if r["kind"] == "prompts"][0], [r for r in local if r["kind"] == "prompts"][0]
    assert set(first[0]["solved"]) == set(first[1]["solved"])  # the same prompts, drawn by the driver
    trains = [r for r in split if r["kind"] == "train"]
    assert all(r["response_tokens"] == 5 * 10 * 3 for r in trains)  # B x G x n: every part came back
    assert comparable(split) != comparable(local)  # the parts' own generators: other responses


def test_split_batches_ahead_of_the_trainer(ray_local):
    overrides = SORTING + ["task.prompts=null", "task.prompts_per_epoch=5", "cluster.rollout_workers=2",
                           "cluster.split_batch=true", "cluster.max_staleness=1", "algo.tis_cap=2"]
    records = [r for r in train(load_config(None, overrides)) if r["kind"] == "train"]
    assert [r["cluster/staleness"] for r in records if r["step"] % 2 == 0] == [0.0, 1.0, 1.0, 1.0]
    assert all(r["response_tokens"] == 5 * 10 * 3 for r in records)
