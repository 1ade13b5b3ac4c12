"""Ray for one run: joined or started once, holding the run's rollout workers and learners.

``Cluster(config, st)`` is made by ``rlvr.trainer.train`` when the config asks for workers
(``cluster.rollout_workers > 0``) or several learners (``cluster.learners > 1``), and closed
when the run ends, however it ends. Without ``cluster.address`` it starts a private local Ray
with just the CPUs its actors ask for (plus one for the driver) and no dashboard, never
joining someone else's instance by accident; with an address it joins that cluster. A Ray
already initialised in this process (a test's, a notebook's) is used as it is and left running.
"""

from __future__ import annotations

import math
import os
from typing import Any

from rlvr.config import Config

WORKER_CPUS = 0.5  # Ray CPUs each rollout worker holds (explicit: a default request can pend forever)
LEARNER_CPUS = 0.5  # Ray CPUs each learner holds


def import_ray() -> Any:
    """``ray``, with its usage report and token auth off (set before the import, which
    worker processes inherit)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import ray
    except ImportError as err:
        raise ImportError("the cluster section (rollout workers, learners) needs Ray: pip install 'rlvr[ray]'"
                          ) from err
    return ray


def wanted(config: Config) -> bool:
    """Whether ``config`` runs any part of the loop on Ray."""
    return config.cluster.rollout_workers > 0 or config.cluster.learners > 1


class Cluster:
    """The run's Ray actors: ``rollouts`` (a ``RayRolloutSource``, or None: the driver samples)
    and ``learners`` (a ``LearnerGroup`` started from the driver's state, or None: the driver
    steps). ``close`` ends them, and Ray if this run started it."""

    def __init__(self, config: Config, st: Any) -> None:
        from rlvr.cluster.learners import LearnerGroup
        from rlvr.cluster.rollout import RayRolloutSource

        c = config.cluster
        self.ray = ray = import_ray()
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            if c.address is None:
                cpus = c.rollout_workers * WORKER_CPUS + (c.learners if c.learners > 1 else 0) * LEARNER_CPUS
                ray.init(address="local", num_cpus=math.ceil(cpus) + 1, include_dashboard=False,
                         logging_level="ERROR")
            else:
                ray.init(address=c.address, logging_level="ERROR")
        self.rollouts = self.learners = None
        try:
            if c.rollout_workers > 0:
                self.rollouts = RayRolloutSource(config, ray)
            if c.learners > 1:
                self.learners = LearnerGroup(config, c.learners, state=st, num_cpus=LEARNER_CPUS)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        try:
            for part in (self.rollouts, self.learners):
                if part is not None:
                    part.close()
        finally:
            self.rollouts = self.learners = None
            if self.owns_ray:
                self.ray.shutdown()
                self.owns_ray = False
