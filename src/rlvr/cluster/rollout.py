"""Rollout workers on Ray: each epoch's batch sampled and graded by an actor.

The driver (``RayRolloutSource``) hands a worker the trainer's weights (a state dict of
numpy arrays, put into Ray's object store once per version; the version is the optimizer
step count) and the state of the run's ``torch.Generator``; the worker runs the trainer's
own ``sample_and_grade`` with a generator in that state and returns the samples, the
grades, the timings and the generator's new state, which the driver takes over. With
``max_staleness=0`` a batch is always sampled with the weights of the last optimizer step,
so a run's records equal the single-process run's (wall-clock ``time/*`` and ``cluster/*``
fields aside).

Faults: an actor restarts (Ray's ``max_restarts``) with fresh state; a call that fails with
``RayActorError`` is retried on the restarted actor after resending the weights, with the
same generator state, so the batch is the same one. ``cluster/worker_restarts`` counts the
failed calls so recovered.

Placement: with ``cluster.address`` set (a cluster of one or more nodes), the workers go into
a placement group of one ``{"CPU": WORKER_CPUS}`` bundle each with strategy ``SPREAD``: Ray
puts them on distinct nodes where it can (and packs them where it cannot); the group is
removed by ``close``. Without an address (a private local Ray) there is no group.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from typing import Any

import numpy as np
import torch

from rlvr.config import Config
from rlvr.rollout import Grades, Samples

WORKER_CPUS = 0.5  # Ray CPUs each worker holds (an explicit value: a default actor can pend forever)
MAX_RESTARTS = 100  # per worker, over a run
CALL_TIMEOUT = 3600.0  # seconds a batch may take before the run gives up
READY_TIMEOUT = 300.0  # seconds a restarting worker may take to answer again


class ClusterError(RuntimeError):
    """The rollout workers cannot go on (restarts used up, a call timed out)."""


def import_ray() -> Any:
    """``ray``, with its usage report and token auth off (set before the import, which
    worker processes inherit)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import ray
    except ImportError as err:
        raise ImportError("cluster.rollout_workers > 0 needs Ray: pip install 'rlvr[ray]'") from err
    return ray


def weights_payload(module: torch.nn.Module) -> dict[str, Any]:
    """A module's state dict as numpy arrays (Ray shares those zero-copy); a dtype numpy
    lacks (bfloat16) stays a tensor."""
    out: dict[str, Any] = {}
    for key, value in module.state_dict().items():
        value = value.detach().cpu()
        out[key] = value if value.dtype == torch.bfloat16 else value.numpy()
    return out


class RolloutWorker:
    """One rollout worker (a Ray actor once wrapped by ``ray.remote``): the task and the
    policy built from the config, in one torch thread."""

    def __init__(self, config: Config) -> None:
        torch.set_num_threads(1)
        from rlvr.policies import build_policy
        from rlvr.tasks import build_task

        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass
        self.config = config
        self.task = build_task(config)
        self.policy = build_policy(config)
        self.version: int | None = None
        self.engine_stats: dict[str, float] = {}

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        """The Ray node this worker runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def set_weights(self, weights: dict[str, Any], version: int) -> int:
        """Load the trainer's weights (an ObjectRef argument arrives resolved), named by
        ``version``; the policy's engine, if it has one, gets them too."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            state = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in weights.items()}
            self.policy.module.load_state_dict(state)  # copies out of the object store
        sync = getattr(self.policy, "sync_engine", None)
        self.engine_stats = {} if sync is None else sync(version)
        self.version = version
        return version

    def sample_and_grade(self, generator_state: torch.Tensor, version: int
                         ) -> tuple[Samples, Grades, dict[str, float], torch.Tensor]:
        """The trainer's ``sample_and_grade`` with a generator in ``generator_state``: the
        samples, the grades, the timings (and engine numbers) and the generator's new state."""
        from rlvr.trainer import sample_and_grade

        if version != self.version:  # e.g. restarted since the weights were sent
            raise ClusterError(f"worker holds weights version {self.version}, asked for {version}")
        generator = torch.Generator()
        generator.set_state(generator_state)
        samples, grades, timings = sample_and_grade(self.config, self.task, self.policy, generator)
        return samples, grades, {**timings, **self.engine_stats}, generator.get_state()


class RayRolloutSource:
    """The driver's side: ``cluster.rollout_workers`` actors, the weights each holds, and
    the restarts seen. Epoch e's batch goes to worker e mod W (k=0 leaves nothing to overlap
    yet); ``close`` ends the actors, and Ray if this source started it."""

    def __init__(self, config: Config) -> None:
        c = config.cluster
        self.ray = ray = import_ray()
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            if c.address is None:  # a private local instance, never someone else's cluster
                ray.init(address="local", num_cpus=math.ceil(c.rollout_workers * WORKER_CPUS) + 1,
                         include_dashboard=False, logging_level="ERROR")
            else:
                ray.init(address=c.address, logging_level="ERROR")
        actor = ray.remote(num_cpus=WORKER_CPUS, max_restarts=MAX_RESTARTS, max_task_retries=0)(RolloutWorker)
        self.placement_group = None
        if c.address is None:
            self.workers = [actor.remote(config) for _ in range(c.rollout_workers)]
        else:  # one bundle per worker, spread over the nodes where they fit
            from ray.exceptions import GetTimeoutError
            from ray.util.placement_group import placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            self.placement_group = placement_group([{"CPU": WORKER_CPUS}] * c.rollout_workers, strategy="SPREAD")
            try:
                ray.get(self.placement_group.ready(), timeout=READY_TIMEOUT)
            except GetTimeoutError as err:
                self.close()
                raise ClusterError(f"the cluster has no room for {c.rollout_workers} workers of "
                                   f"{WORKER_CPUS} CPU within {READY_TIMEOUT:.0f} s") from err
            self.workers = [actor.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=i)).remote(config)
                for i in range(c.rollout_workers)]
        self.versions: list[int | None] = [None] * len(self.workers)
        self.restarts = 0
        self._weights: tuple[int, Any] | None = None  # (version, ObjectRef): put once per version

    def sample_and_grade(self, st: Any) -> tuple[Samples, Grades, dict[str, float]]:
        """The epoch's batch from a worker holding the weights of step ``st.step``; the
        driver's generator moves on as if it had sampled the batch itself."""
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        index = st.epoch % len(self.workers)
        worker, version = self.workers[index], st.step
        generator_state = st.generator.get_state()
        sync = 0.0
        while True:
            try:
                clock = time.perf_counter()
                if self.versions[index] != version:
                    self.ray.get(worker.set_weights.remote(self._weights_ref(st.policy.module, version), version),
                                 timeout=CALL_TIMEOUT)
                    self.versions[index] = version
                sync += time.perf_counter() - clock
                result = self.ray.get(worker.sample_and_grade.remote(generator_state, version), timeout=CALL_TIMEOUT)
                break
            except ActorDiedError as err:
                raise ClusterError(f"rollout worker {index} is dead (restarts used up): {err}") from err
            except RayActorError:  # killed or lost: it restarts with fresh state; resend and retry
                self.restarts += 1
                self.versions[index] = None
                self._wait_ready(index)
            except GetTimeoutError as err:
                raise ClusterError(f"rollout worker {index}: no answer within {CALL_TIMEOUT:.0f} s") from err
        samples, grades, stats, new_state = result
        st.generator.set_state(new_state)
        stats = {**stats, "time/sync": sync, "cluster/weights_version": float(version),
                 "cluster/worker_restarts": float(self.restarts)}
        return samples, grades, stats

    def _weights_ref(self, module: torch.nn.Module, version: int) -> Any:
        if self._weights is None or self._weights[0] != version:
            self._weights = None  # drop the old reference first: its object can be freed
            self._weights = (version, self.ray.put(weights_payload(module)))
        return self._weights[1]

    def _wait_ready(self, index: int) -> None:
        """Until the restarted worker answers (calls fail at once while it restarts)."""
        from ray.exceptions import ActorDiedError, RayActorError

        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                self.ray.get(self.workers[index].pid.remote(), timeout=READY_TIMEOUT)
                return
            except ActorDiedError as err:
                raise ClusterError(f"rollout worker {index} is dead (restarts used up): {err}") from err
            except RayActorError as err:
                if time.monotonic() > deadline:
                    raise ClusterError(f"rollout worker {index} did not come back within {READY_TIMEOUT:.0f} s"
                                       ) from err
                time.sleep(0.2)

    def worker_pids(self) -> list[int]:
        return self.ray.get([w.pid.remote() for w in self.workers], timeout=READY_TIMEOUT)

    def worker_nodes(self) -> list[str]:
        return self.ray.get([w.node_id.remote() for w in self.workers], timeout=READY_TIMEOUT)

    def close(self) -> None:
        for worker in getattr(self, "workers", []):
            self.ray.kill(worker)
        self.workers, self._weights = [], None
        if self.placement_group is not None:  # after its actors are gone
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None
        if self.owns_ray:
            self.ray.shutdown()
