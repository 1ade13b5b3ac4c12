"""Staleness in optimizer steps (rlvr.cluster.staleness): each batch's age when trained on,
logged per sample; under cluster.stale_policy=drop, batches older than
cluster.max_staleness_steps dropped, counted and sampled again with the current weights,
never trained on (admission, the default: tests/cluster/test_admission.py)."""

from types import SimpleNamespace

import pytest
import torch

from helpers import QUIET
from rlvr.api import run_loop
from rlvr.base.errors import ConfigError
from rlvr.batch.rollout import Samples
from rlvr.cluster.jobs import Job
from rlvr.cluster.session import loop_parts
from rlvr.cluster.staleness import Shift, sample_versions, staleness_stats, step_bound, too_old
from rlvr.config import load_config
from rlvr.loop.seams import LocalLearner
from rlvr.loop.trainer import setup, train

ASYNC = QUIET + ["algo.inner_steps=2", "log.eval_every=2", "log.checkpoint_every=0", "algo.tis_cap=2",
                 "cluster.rollout_workers=1", "cluster.max_staleness=1", "cluster.stale_policy=drop"]


def answered(version: int, responses: int) -> Job:
    ids = torch.zeros(responses, 1, dtype=torch.long)
    samples = Samples(None, ids, ids.bool(), ids, ids.bool())
    return Job(0, 0, version, 0, None, None, result=(samples, None, {}))


def test_ages_are_the_first_step_minus_each_samples_weights_version():
    jobs = [answered(4, 3), answered(2, 1)]  # a split batch: 3 samples of version 4, 1 of version 2
    versions = sample_versions(jobs)
    assert versions.tolist() == [4, 4, 4, 2]
    # trained from step 6: ages 2, 2, 2, 4 -> mean 10 / 4
    assert staleness_stats(6, versions, 1, 3) == {"cluster/staleness_steps": 2.5, "cluster/staleness_steps_max": 4.0,
                                                  "cluster/dropped_stale": 1.0, "cluster/dropped_stale_total": 3.0}
    assert too_old(jobs, 6, 3) == [jobs[1]]  # 4 > 3; age 2 is within
    assert too_old(jobs, 6, 4) == []


def test_the_bound_defaults_to_k_epochs_of_inner_steps_and_is_checked():
    assert step_bound(load_config(None, ASYNC + ["algo.inner_steps=3", "cluster.max_staleness=2"])) == 6
    assert step_bound(load_config(None, ASYNC + ["cluster.max_staleness_steps=1"])) == 1
    assert load_config(None, []).cluster.max_staleness_steps is None
    with pytest.raises(ConfigError, match="cluster.max_staleness=0 samples none ahead"):
        load_config(None, ["cluster.max_staleness_steps=2"])


class ExtraStepLearner(LocalLearner):
    """Takes an unrecorded optimizer step before each recorded one: the weights move twice as
    far per epoch, so a batch sampled one epoch ahead is 2 x inner_steps steps old, past the
    default bound of inner_steps."""

    def optimizer_step(self, st, rollout):
        super().optimizer_step(st, rollout)
        return super().optimizer_step(st, rollout)


def train_records(records):
    return [r for r in records if r["kind"] == "train"]


def test_a_trainer_that_outruns_the_bound_never_trains_on_a_batch_too_old(ray_local):
    config = load_config(None, ASYNC + ["algo.epochs=4"])
    task, st = setup(config)
    with loop_parts(config, st) as (source, _):
        records = train_records(train(config, state=(task, st), source=source, learner=ExtraStepLearner(config)))
        kept = source.state()
    assert len(records) == 8 and [r["step"] for r in records] == [1, 3, 5, 7, 9, 11, 13, 15]
    assert all(r["cluster/staleness_steps_max"] <= 2 for r in records)  # the bound: 1 epoch x 2 inner steps
    firsts = records[::2]
    # epoch e >= 1 was sampled at step 4 (e - 1), 4 steps before it trains: dropped, sampled again
    assert [r["cluster/dropped_stale"] for r in firsts] == [0.0, 1.0, 1.0, 1.0]
    assert [r["cluster/dropped_stale_total"] for r in firsts] == [0.0, 1.0, 2.0, 3.0]
    assert [r["cluster/weights_version"] for r in firsts] == [0.0, 4.0, 8.0, 12.0]  # the current weights
    assert kept["batches"] == [] and kept["dropped_stale"] == 3  # the count survives a resume


def test_a_bound_below_k_epochs_drops_the_parts_of_split_batches(ray_local):
    """k = 2, inner_steps = 2, bound 3: a batch sampled one epoch ahead (2 steps old) trains;
    one sampled two epochs ahead (4 steps) is dropped, each of its two parts, and sampled
    again with the current weights."""
    overrides = ASYNC + ["algo.epochs=5", "cluster.max_staleness=2", "cluster.max_staleness_steps=3",
                         "cluster.rollout_workers=2", "cluster.split_batch=true", "task.prompts=null",
                         "task.prompts_per_epoch=5"]
    records = train_records(run_loop(load_config(None, overrides)))
    firsts = records[::2]
    assert all(r["cluster/staleness_steps_max"] <= 3 for r in records)
    assert [r["cluster/staleness_steps_max"] for r in firsts] == [0.0, 2.0, 0.0, 0.0, 0.0]
    assert [r["cluster/dropped_stale"] for r in firsts] == [0.0, 0.0, 2.0, 2.0, 2.0]
    assert firsts[-1]["cluster/dropped_stale_total"] == 6.0
    assert all(r["response_tokens"] == 5 * 10 * 3 for r in records)  # B x G x n: every part replaced whole
    again = train_records(run_loop(load_config(None, overrides)))
    assert [r["loss"] for r in again] == [r["loss"] for r in records]  # a replaced part's generator is its own


def test_the_shift_is_trained_minus_sampled_and_survives_its_state():
    def batch(lengths, solved):
        mask = torch.arange(4) < torch.tensor(lengths).unsqueeze(-1)  # [N, 4]
        samples = Samples(None, mask.long(), mask, mask.long(), mask)
        return samples, SimpleNamespace(correct=torch.tensor(solved))

    shift = Shift()
    shift.add(*batch([4, 4], [False, False]), trained=False)  # long, unsolved: dropped
    shift.add(*batch([1, 3], [True, False]), trained=True)
    stats = shift.stats()
    assert stats["async/length_sampled"] == 3.0 and stats["async/length_trained"] == 2.0  # 12 / 4, 4 / 2
    assert stats["async/length_shift"] == -1.0
    assert stats["async/solve_sampled"] == 0.25 and stats["async/solve_shift"] == 0.25
    assert Shift(shift.state()).stats() == stats
    assert Shift().stats()["async/length_shift"] == 0.0  # nothing yet
