"""The loop's parts for a run: its rollout source and learner, in this process or Ray actors in a ``Cluster``
closed when the run ends. A Ray the run starts is private and the run's alone (its SIGTERM handler undone, its
session folder removed); a joined or already initialised one is left as it is (docs/explanation/cluster.md)."""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlvr.config import Config
from rlvr.config.compose import driver_holds_weights, runs_on_ray
from rlvr.loop.seams import Learner, LocalRolloutSource, RolloutSource, local_learner
from rlvr.loop.state import TrainState
from rlvr.policies import holds_weights

logger = logging.getLogger(__name__)

LEARNER_CPUS = 0.5  # Ray CPUs each learner holds


def import_ray() -> Any:
    """``ray``, with its usage report, token auth and C++ crash handler off (set before the import). The crash
    handler takes SIGTERM at ``ray.init`` and resets it midway through ``ray.shutdown``: a second stop signal then
    killed the run mid-shutdown, its session folder left."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import ray
    except ImportError as err:
        raise ImportError("the cluster section (rollout workers, learners) needs Ray: pip install 'rlvr[ray]'"
                          ) from err
    return ray


@contextmanager
def loop_parts(config: Config, st: TrainState) -> Iterator[tuple[RolloutSource, Learner]]:
    """The rollout source and the learner ``config`` asks for; Ray's actors (and Ray, if this starts it) end with
    the block."""
    if not runs_on_ray(config):
        yield LocalRolloutSource(config), local_learner(config)
        return
    cluster = Cluster(config, st)
    try:
        yield (LocalRolloutSource(config) if cluster.rollouts is None else cluster.rollouts,
               local_learner(config) if cluster.learners is None else cluster.learners)
    finally:
        cluster.close()


def trained_policy(config: Config, task: Any, st: TrainState, learner: Learner) -> Any:
    """The trained policy, with weights: the driver's own, or built anew with the learners' (call it inside
    ``loop_parts``, while they run)."""
    if holds_weights(st.policy.module):
        return st.policy
    from rlvr.config.compose import build_policy

    policy = build_policy(config, task)
    policy.module.load_state_dict(learner.state_dict())  # a LearnerGroup: the weights gathered whole
    return policy


class Cluster:
    """The run's Ray actors: ``rollouts`` (None: the driver samples) and ``learners`` (None: the driver steps);
    with both, the rollout workers take their weights from the learners and the driver holds none."""

    def __init__(self, config: Config, st: TrainState) -> None:
        from rlvr.cluster.learners import LearnerGroup
        from rlvr.cluster.rollout import WORKER_CPUS, RayRolloutSource

        c = config.cluster
        self.ray = ray = import_ray()
        self.owns_ray = not ray.is_initialized()
        self.session_dir: Path | None = None  # the private Ray's session folder, removed by close
        if self.owns_ray:
            handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
            if not sys.stderr.isatty():  # actors' lines go to a file or a pipe: no color escapes in their prefix
                os.environ.setdefault("RAY_COLOR_PREFIX", "0")
            if c.address is None:
                cpus = c.rollout_workers * WORKER_CPUS + (c.learners if c.learners > 1 else 0) * LEARNER_CPUS
                # without dashboard_port, Ray's dashboard process (started even without the dashboard) takes 8265,
                # which another program may hold
                ray.init(address="local", num_cpus=math.ceil(cpus) + 1, include_dashboard=False, dashboard_port=0,
                         logging_level="ERROR")
                context = ray.get_runtime_context()
                self.session_dir = Path(context.get_temp_dir()) / context.get_session_name()
            else:
                ray.init(address=c.address, logging_level="ERROR")
            _restore_handlers(handlers)
        self.rollouts = self.learners = None
        try:
            if c.learners > 1:
                self.learners = LearnerGroup(config, c.learners, state=st, num_cpus=LEARNER_CPUS)
            if c.rollout_workers > 0:  # the weights from the learners where the driver holds none
                publish = None if driver_holds_weights(config) else self.learners.publish_weights
                self.rollouts = RayRolloutSource(config, ray, publish)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End the actors, then Ray and its session folder if the run started them. Ray's errors here are logged,
        not raised: the error that ended the run, if any, is the one to show."""
        from ray.exceptions import RayError

        try:
            for part in (self.rollouts, self.learners):
                if part is not None:
                    try:
                        part.close()
                    except RayError as err:
                        logger.warning("ending the run's Ray actors failed: %s", str(err).strip().split("\n")[0])
        finally:
            self.rollouts = self.learners = None
            if self.owns_ray:
                self.ray.shutdown()
                self.owns_ray = False
                if self.session_dir is not None:
                    remove_session(self.session_dir)
                    self.session_dir = None


def _restore_handlers(handlers: dict[int, Any]) -> None:
    """Put back the signal handlers ``ray.init`` replaced (in the main thread: elsewhere it installed none)."""
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is not handler and handler is not None:
            try:
                signal.signal(signum, handler)
            except ValueError:  # not the main thread
                return


def remove_session(session_dir: Path) -> None:
    """Remove a private Ray's session folder, and Ray's ``session_latest`` link if it points there."""
    latest = session_dir.parent / "session_latest"
    if latest.is_symlink() and Path(os.readlink(latest)).name == session_dir.name:
        latest.unlink(missing_ok=True)
    shutil.rmtree(session_dir, ignore_errors=True)
