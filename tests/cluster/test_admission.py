"""Asynchronous sampling without bias (rlvr.cluster.staleness): under admission control
(cluster.stale_policy=admit, the default) a batch is submitted only as far ahead as it can be
trained within the staleness bound, so nothing is dropped; at a bound of 0 that is the
synchronous run, record for record. Partial rollouts (cluster.partial_rollouts) take weights
published mid-batch, and no token trained is older than the bound."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter

import pytest

from helpers import QUIET, comparable, sigkill_mid_run
from rlvr.api import run_loop
from rlvr.base.errors import ConfigError
from rlvr.cli import main
from rlvr.config import load_config
from rlvr.runs.checkpoint import list_checkpoints, load_latest
from rlvr.runs.metrics import read_records

SORT = QUIET + ["algo.inner_steps=2", "log.eval_every=2", "log.checkpoint_every=0", "algo.tis_cap=2",
                "algo.epochs=4"]
# k = 2 epochs ahead, a bound of 3 steps: one epoch ahead (2 steps) fits it, two (4 steps) do not
SPLIT = SORT + ["algo.epochs=5", "cluster.max_staleness=2", "cluster.max_staleness_steps=3",
                "cluster.rollout_workers=2", "cluster.split_batch=true", "task.prompts=null",
                "task.prompts_per_epoch=5"]



def trains(records):
    return [r for r in records if r["kind"] == "train"]


@pytest.mark.parametrize("in_flight", [False, True], ids=["weights-by-batch", "weights-in-flight"])
def test_admission_at_a_bound_of_zero_gives_the_synchronous_records(ray_local, in_flight):
    synchronous = run_loop(load_config(None, SORT))
    overrides = SORT + ["cluster.rollout_workers=1", "cluster.max_staleness=2", "cluster.max_staleness_steps=0",
                        *(["cluster.weights_in_flight=true"] if in_flight else [])]
    records = run_loop(load_config(None, overrides))
    assert comparable(records, "async/") == comparable(synchronous)  # async/*: measured by the pipeline alone
    assert all(r["cluster/lookahead"] == 0 and r["cluster/staleness_steps_max"] == 0 and r["cluster/dropped_stale"] == 0
               for r in trains(records))


def test_admission_keeps_the_bound_without_dropping_what_drop_throws_away(ray_local):
    admitted = trains(run_loop(load_config(None, SPLIT)))
    assert all(r["cluster/admission"] == 1 and r["cluster/lookahead"] == 1 and r["cluster/dropped_stale_total"] == 0
               for r in admitted)
    assert [r["cluster/staleness_steps_max"] for r in admitted[::2]] == [0.0, 2.0, 2.0, 2.0, 2.0]  # within 3
    assert all(r["async/length_shift"] == 0 and r["async/solve_shift"] == 0 for r in admitted)
    dropped = trains(run_loop(load_config(None, SPLIT + ["cluster.stale_policy=drop"])))
    assert all(r["cluster/admission"] == 0 and r["cluster/lookahead"] == 2 for r in dropped)
    assert dropped[-1]["cluster/dropped_stale_total"] == 6.0  # two parts in each of the last three epochs
    assert all(r["cluster/staleness_steps_max"] <= 3 for r in dropped)
    assert dropped[-1]["async/length_sampled"] > 0 and "async/solve_shift" in dropped[-1]


def test_partial_rollouts_are_refused_where_they_cannot_run():
    base = ["cluster.rollout_workers=1", "cluster.max_staleness=1", "algo.tis_cap=2", "cluster.partial_rollouts=true"]
    with pytest.raises(ConfigError, match="cluster.weights_in_flight=true"):
        load_config(None, base)
    with pytest.raises(ConfigError, match="no token prefix"):
        load_config(None, [*base, "cluster.weights_in_flight=true"])
    lm = [*base, "cluster.weights_in_flight=true", "policy.name=causal_lm", "policy.options.model=m",
          "task.name=sort_text"]
    assert load_config(None, [*lm, "policy.options.engine=vllm"]).cluster.partial_rollouts  # vLLM can pause
    with pytest.raises(ConfigError, match="single-turn"):
        load_config(None, [*lm, "task.name=environment", "task.options={environment: guessing}"])


def test_a_worker_whose_engine_cannot_pause_refuses_partial_rollouts(tiny_model, monkeypatch):
    """An installed vLLM without the pause API (its engine's takes_new_weights is False): the
    worker refuses at its start, before any batch, in one line."""
    pytest.importorskip("transformers")
    from rlvr.cluster import ClusterError
    from rlvr.cluster.worker import RolloutWorker
    from rlvr.engines.hf import HFEngine

    monkeypatch.setattr(HFEngine, "takes_new_weights", False)
    # a worker's one thread and quiet transformers: not this process's
    monkeypatch.setattr("torch.set_num_threads", lambda threads: None)
    monkeypatch.setattr("rlvr.cluster.worker.quiet_actor", lambda: None)
    with pytest.raises(ClusterError, match=r"^cluster.partial_rollouts=true: the installed HFEngine cannot take new "
                                           r"weights mid-generation .*set cluster.partial_rollouts=false$"):
        RolloutWorker(load_config(None, lm_overrides(tiny_model, 1)))


def lm_overrides(model, epochs: int) -> list[str]:
    """A causal LM on sort_text, sampled one epoch ahead with weights taken mid-batch."""
    return QUIET + [
        "task.name=sort_text", "task.options={num_digits: 3, num_eval: 4}", "task.prompts_per_epoch=4",
        "policy.name=causal_lm", f"policy.options={{model: '{model}', max_new_tokens: 24, min_new_tokens: 24}}",
        f"algo.epochs={epochs}", "algo.inner_steps=2", "algo.group_size=8", "algo.tis_cap=2",
        f"log.eval_every={epochs}", "log.eval_samples=1", "log.entropy=false", "threads=1",
        "cluster.rollout_workers=1", "cluster.max_staleness=1", "cluster.weights_in_flight=true",
        "cluster.partial_rollouts=true"]


def test_partial_rollouts_never_train_a_token_older_than_the_bound(ray_local, tiny_model):
    pytest.importorskip("transformers")
    records = trains(run_loop(load_config(None, [*lm_overrides(tiny_model, 4), "log.checkpoint_every=0"])))
    assert len(records) == 8
    for r in records:
        assert r["cluster/staleness_steps_max"] <= 2 and r["cluster/token_age_max"] <= 2  # bound: 1 epoch x 2 steps
        assert sum(r["cluster/tokens_by_version"].values()) == r["response_tokens"]  # every token, tagged once
        versions = [int(v) for v in r["cluster/tokens_by_version"]]
        assert min(versions) == r["cluster/weights_version"] and max(versions) <= r["step"] - r["step"] % 2


def test_a_run_killed_mid_partial_rollouts_trains_every_sampled_batch_once(ray_local, tiny_model, tmp_path,
                                                                          monkeypatch):
    """Which weights reach a batch mid-generation depends on timing, so the resumed run is not
    compared with a straight one. What it must do: train each epoch's batch exactly once
    (every optimizer step once in metrics.jsonl) and train the batch the checkpoint held in
    flight, tokens and versions as sampled, not one sampled again."""
    pytest.importorskip("transformers")
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # the killed run's private Ray: its folder goes here
    monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
    args = [*lm_overrides(tiny_model, 8), "log.checkpoint_every=1"]  # killed by step 7 of 16: mid-run
    killed = tmp_path / "killed"
    try:
        sigkill_mid_run([f"out_dir={killed}", *args], killed)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    _, payload = load_latest(killed)
    held = payload["source"]["batches"]
    resumed_epoch = payload["epoch"]
    assert main(["train", f"resume={killed}"]) == 0
    records = trains(read_records(killed))
    assert Counter(r["step"] for r in records) == Counter(range(16))  # every step once, none lost or repeated
    (batch,) = held  # killed mid-run: the next epoch's batch was in flight, sampled with partial rollouts
    samples = batch["samples"]
    tokens = samples["token_versions"][samples["policy_mask"]]
    counts = Counter(str(v) for v in tokens.tolist())
    first = next(r for r in records if r["epoch"] == resumed_epoch)
    assert batch["epoch"] == resumed_epoch and first["cluster/tokens_by_version"] == dict(counts)


def test_a_run_is_killed_after_its_first_checkpoint_however_late_by_the_clock(tmp_path, monkeypatch):
    """sigkill_mid_run waits on the run, not on time: with a clock that runs 1000 s a call (a
    machine so loaded the first checkpoint comes minutes late), the kill still comes after it.
    The lecture's toy, no Ray: sigkill_mid_run is what this tests."""
    import itertools
    import time

    ticks = itertools.count()
    monkeypatch.setattr(time, "time", lambda: 1000.0 * next(ticks))
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0 * next(ticks))
    killed = tmp_path / "killed"
    sigkill_mid_run([f"out_dir={killed}", *QUIET, "algo.epochs=300", "log.checkpoint_every=1"], killed)
    assert list_checkpoints(killed)
