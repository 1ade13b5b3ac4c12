"""A rollout worker, a Ray actor of ``rlvr.cluster.rollout.RayRolloutSource``: the task and the policy built from
the config, sampling and grading an epoch's batch, or evaluating, with the weights of the version it is asked for.
"""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from rlvr.batch.record import Record
from rlvr.batch.rollout import Grades, Samples
from rlvr.cluster import ClusterError, quiet_actor
from rlvr.config import Config
from rlvr.loop.evaluation import evaluate
from rlvr.loop.seams import sample_and_grade, trainer_state_at


class RolloutWorker:
    """One rollout worker (a Ray actor once wrapped by ``ray.remote``), in one torch thread."""

    def __init__(self, config: Config) -> None:
        torch.set_num_threads(1)
        from rlvr.config.compose import build_policy, build_task

        quiet_actor()
        self.config = config
        self.task = build_task(config)
        self.policy = build_policy(config, self.task)
        self.version: int | None = None
        self.engine_stats: dict[str, float] = {}
        self.partial = config.cluster.partial_rollouts
        engine = getattr(self.policy, "engine", None)
        if self.partial and not engine.takes_new_weights:
            raise ClusterError(f"cluster.partial_rollouts=true: the installed {type(engine).__name__} cannot take new "
                               "weights mid-generation (vLLM needs LLM.sleep(mode='keep') and reset_prefix_cache("
                               "reset_running_requests=True)); upgrade it or set cluster.partial_rollouts=false")

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def set_weights(self, weights: dict[str, Any], version: int) -> int:
        """Load the trainer's weights, named by ``version``, into the policy and its engine."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            state = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in weights.items()}
            self.policy.module.load_state_dict(state)  # copies out of the object store
        self.engine_stats = self.policy.sync_engine(version)
        self.version = version
        return version

    def join_weights_group(self, init_method: str, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
        from rlvr.cluster.weight_sync import join

        join(init_method, rank, world_size, backend, timeout_s)

    def receive_weights(self, version: int) -> int:
        """The driver's broadcast of the weights of ``version``, straight into the policy."""
        from rlvr.cluster.weight_sync import broadcast_state

        broadcast_state(self.policy.module.state_dict(), source=False)
        self.engine_stats = self.policy.sync_engine(version)
        self.version = version
        return version

    def sample_and_grade(self, weights: list[Any], version: int, generator_state: torch.Tensor, prompts: Any = None,
                         epoch: int = 0, board: Any = None
                         ) -> tuple[Samples, Grades, dict[str, float], torch.Tensor, int, int]:
        """``rlvr.loop.seams.sample_and_grade`` with the weights of ``version`` (``weights``: ``[ObjectRef]``,
        fetched only when this worker holds another version; ``[None]``: they came by broadcast), or the newer ones
        posted on ``board``: the samples, the grades, the timings and engine numbers, the generator's new state,
        this process's id and the version sampled with."""
        import ray

        if board is not None:
            newest, posted = ray.get(board.latest.remote())
            if newest > version:
                version, weights = newest, posted
        self._hold(weights, version)
        generator = torch.Generator()
        generator.set_state(generator_state)
        state = trainer_state_at(self.config, epoch, version)
        engine = getattr(self.policy, "engine", None)
        if self.partial and board is not None:
            engine.new_weights = NewWeights(self, board)
        try:
            samples, grades, timings = sample_and_grade(self.config, self.task, self.policy, generator, prompts, state)
        finally:
            if engine is not None:
                engine.new_weights = None
        return samples, grades, {**timings, **self.engine_stats}, generator.get_state(), os.getpid(), version

    def evaluate(self, weights: list[Any], version: int, epoch: int) -> list[Record]:
        """``rlvr.loop.evaluation.evaluate`` with the weights of ``version`` (as for ``sample_and_grade``)."""
        self._hold(weights, version)
        return evaluate(self.config, self.task, self.policy, epoch, version)

    def _hold(self, weights: list[Any], version: int) -> None:
        """Load the weights of ``version`` if this worker holds another (a new one, or it restarted since)."""
        import ray

        if version == self.version:
            return
        if weights[0] is None:  # weights come by broadcast (weight_sync=collective)
            raise ClusterError(f"worker holds weights version {self.version}, asked for {version}: restarted "
                               "since the broadcast? weight_sync=collective cannot take a restarted worker "
                               "back; weight_sync=object_store survives restarts")
        self.set_weights(ray.get(weights[0]), version)


class NewWeights:
    """A partial rollout's look at the weights board between tokens (``Engine.new_weights``), at most every
    ``POLL_SECONDS``: a version newer than the worker holds is loaded."""

    POLL_SECONDS = 0.02  # a board call costs about a millisecond: not every token

    def __init__(self, worker: RolloutWorker, board: Any) -> None:
        self.worker, self.board, self.next_look = worker, board, time.monotonic() + self.POLL_SECONDS

    def __call__(self) -> bool:
        import ray

        if time.monotonic() < self.next_look:
            return False
        self.next_look = time.monotonic() + self.POLL_SECONDS
        newest, posted = ray.get(self.board.latest.remote())
        if self.worker.version is not None and newest <= self.worker.version:
            return False
        self.worker._hold(posted, newest)
        return True
