"""Weights in flight (cluster.weights_in_flight): the weights are posted after every optimizer
step on a board, where a rollout worker looks before each batch and takes the newest; the
batch carries the version it sampled with, and the staleness bound holds."""

import pytest

from helpers import QUIET
from rlvr.base.errors import ConfigError
from rlvr.cluster import ClusterError
from rlvr.config import load_config

IN_FLIGHT = QUIET + ["algo.inner_steps=2", "log.eval_every=2", "log.checkpoint_every=0", "algo.tis_cap=2",
                     "cluster.rollout_workers=1", "cluster.max_staleness=2", "cluster.weights_in_flight=true"]


def test_a_worker_takes_the_newest_weights_posted_on_the_board(ray_local):
    from rlvr.cluster.weight_sync import WeightsBoard, weights_payload
    from rlvr.cluster.worker import RolloutWorker
    from rlvr.config.compose import build_policy

    config = load_config(None, IN_FLIGHT)
    module = build_policy(config).module
    submitted = ray_local.put(weights_payload(module.state_dict().items()))
    for p in module.parameters():
        p.data.add_(1.0)
    newer = ray_local.put(weights_payload(module.state_dict().items()))
    board = ray_local.remote(num_cpus=0)(WeightsBoard).remote()
    worker = ray_local.remote(num_cpus=0.5)(RolloutWorker).remote(config)
    try:
        import torch

        state = torch.Generator().manual_seed(0).get_state()
        *_, version = ray_local.get(worker.sample_and_grade.remote([submitted], 0, state, None, 0, board))
        assert version == 0  # nothing posted yet: the weights it was given
        ray_local.get(board.post.remote(5, [newer]))
        ray_local.get(board.post.remote(3, [submitted]))  # an older version never replaces a newer one
        *_, version = ray_local.get(worker.sample_and_grade.remote([submitted], 2, state, None, 1, board))
        assert version == 5
        # it holds version 5 now: asked for it without weights, it samples; another version it cannot load
        assert ray_local.get(worker.sample_and_grade.remote([None], 5, state))[-1] == 5
        with pytest.raises(Exception, match="holds weights version 5, asked for 7") as caught:
            ray_local.get(worker.sample_and_grade.remote([None], 7, state))
        assert isinstance(caught.value.cause, ClusterError)
    finally:
        ray_local.kill(worker)
        ray_local.kill(board)


def test_a_run_with_weights_in_flight_keeps_every_batch_within_the_bound(ray_local):
    from rlvr.api import run_loop as train

    records = train(load_config(None, IN_FLIGHT + ["algo.epochs=5"]))
    steps = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in steps] == list(range(10))
    for r in steps:
        assert r["cluster/weights_version"] <= r["step"] - r["step"] % 2  # never newer than the epoch's first step
        assert r["cluster/staleness_steps_max"] <= 4  # max_staleness x inner_steps
    assert [r["epoch"] for r in records if r["kind"] == "eval"] == [0, 2, 4, 5]


@pytest.mark.parametrize("extra", [["cluster.max_staleness=0", "algo.tis_cap=null"],
                                   ["cluster.weight_sync=collective"]])
def test_weights_in_flight_needs_batches_ahead_in_the_object_store(extra):
    with pytest.raises(ConfigError, match="cluster.weights_in_flight=true needs batches sampled ahead"):
        load_config(None, IN_FLIGHT + extra)
