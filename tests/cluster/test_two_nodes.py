"""Rollout workers on a simulated two-node Ray cluster (``ray.cluster_utils.Cluster``): the
same records as the single-process run, and the workers spread over both nodes."""

import os
from pathlib import Path

import pytest
from ray_actors import record_actors

from helpers import QUIET, comparable
from rlvr.api import run_loop as train
from rlvr.cluster.session import remove_session
from rlvr.config import load_config

pytestmark = pytest.mark.ray

SORTING = QUIET + ["algo.epochs=4", "algo.inner_steps=2", "log.eval_every=2", "log.checkpoint_every=0"]



def test_two_workers_on_two_nodes_give_the_single_process_records(monkeypatch):
    built = record_actors(monkeypatch)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    # ports the OS picks (the dashboard's is 8265 unless given, its agent's 52365); the folder is
    # the suite's, RAY_TMPDIR (ray_temp_dir)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "dashboard_port": 0, "dashboard_agent_listen_port": 0})
    session = Path(cluster.head_node.get_session_dir_path())
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes(timeout=60)
        local = train(load_config(None, SORTING))
        nodes = []

        def record_nodes(st):
            if not nodes:
                nodes.extend(built[-1].worker_nodes())

        remote = train(load_config(None, SORTING + ["cluster.rollout_workers=2", f"cluster.address={cluster.address}"]),
                       on_epoch_end=record_nodes)
        assert comparable(remote) == comparable(local)
        assert len(nodes) == 2 and len(set(nodes)) == 2  # one worker on each node
        assert not ray.is_initialized()  # the run's source connected, and disconnected at the end
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        remove_session(session)  # the simulated cluster's folder, as a run removes its private Ray's
