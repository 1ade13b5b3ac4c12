"""Rollout workers on Ray (rlvr.cluster.rollout): the same records as the single-process
run, and a killed worker restarted without losing a batch."""

import os
import signal
import time

import pytest

from conftest import QUIET
from rlvr.config import load_config
from rlvr.errors import ConfigError
from rlvr.trainer import train

pytestmark = pytest.mark.ray

SORTING = QUIET + ["algo.epochs=4", "algo.inner_steps=2", "log.eval_every=2", "log.checkpoint_every=0"]


def comparable(records):
    """Records minus wall-clock (time/*, tokens_per_sec*) and cluster/* fields."""
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "tokens_per_sec", "cluster/"))}
            for r in records]


def cpus_freed(ray, timeout=20.0):
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0) < 2:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_only_rollout_workers_are_implemented():
    for override in ("cluster.learners=2", "cluster.max_staleness=1"):
        with pytest.raises(ConfigError, match="not implemented yet"):
            load_config(None, [override])
    assert load_config(None, []).cluster.rollout_workers == 0


def test_one_worker_gives_the_single_process_records(ray_local):
    local = train(load_config(None, SORTING))
    remote = train(load_config(None, SORTING + ["cluster.rollout_workers=1"]))
    assert comparable(remote) == comparable(local)
    train_records = [r for r in remote if r["kind"] == "train"]
    assert [r["cluster/weights_version"] for r in train_records] == [r["step"] - r["step"] % 2 for r in train_records]
    assert all(r["cluster/worker_restarts"] == 0 and r["time/sync"] >= 0 for r in train_records)
    assert cpus_freed(ray_local)  # the run ended its worker


def test_a_killed_worker_is_restarted_and_the_batch_retried(ray_local):
    local = train(load_config(None, SORTING))
    killed = []

    def kill_after_first_epoch(st):
        if st.epoch == 1:
            pid = st.rollout_source.worker_pids()[0]
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
