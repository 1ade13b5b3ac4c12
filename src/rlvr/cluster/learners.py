"""Data-parallel learners: M Ray actors, each holding a replica (or, under FSDP, a shard) of the policy and its
optimizer, joined in a ``torch.distributed`` gloo group (``nccl`` on GPUs, written but not run here).

Each learner takes its share of the rollout; the shares' gradients and sums add up to the batch's (all-reduced
with SUM), so every learner takes the same step and the replicas stay equal. Every wait is bounded. Ray is
imported lazily. Design: docs/explanation/cluster.md."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rlvr.batch.record import Record
from rlvr.batch.rollout import Rollout, Samples
from rlvr.cluster import READY_TIMEOUT, first_line
from rlvr.cluster.learner_rank import LearnerRank, load_train_state, policy_device, share_bounds
from rlvr.cluster.sharded import has_reference
from rlvr.cluster.watch import WATCH, diagnose
from rlvr.cluster.weight_sync import free_port
from rlvr.config import Config
from rlvr.config.compose import driver_holds_weights
from rlvr.loop.seams import reference_due
from rlvr.loop.state import TrainingError, TrainState
from rlvr.loop.step import noise_due
from rlvr.policies import holds_weights


def train_state(st: TrainState) -> dict[str, Any]:
    """The driver's state that the learners start from (as ``LearnerRank.train_state``): the weights, optimizer
    state and reference where the driver holds them or keeps them for the learners (``st.handover``), else None."""
    state: dict[str, Any] = {"scheduler": st.scheduler.state_dict(), "bad_steps": st.bad_steps,
                             "model": None, "optimizer": None, "reference": None}
    if st.handover is not None:
        state.update(st.handover)
        st.handover = None
    elif holds_weights(st.policy.module):
        state.update(model={k: v.detach().cpu() for k, v in st.policy.module.state_dict().items()},
                     optimizer=st.optimizer.state_dict(),
                     reference=None if st.ref_module is None else st.ref_module.state_dict())
        st.ref_module = None  # the learners hold the reference from now on
    return state


class LearnerFault(TrainingError):
    """A learner died, failed or hung (one line naming its rank, ``rlvr.cluster.watch``)."""


def learners_stopped(st: TrainState, err: Exception) -> TrainingError:
    """The one-line error that stops a run whose learner (or node, or Ray) died, failed or hung."""
    cause = str(err) if isinstance(err, LearnerFault) else f"Ray failed: {type(err).__name__}: {first_line(err)}"
    return TrainingError(f"epoch {st.epoch}, step {st.step}: {cause}. The run stops; the checkpoints written before "
                         "are intact (resume=RUN_DIR continues from the last one)")


class LearnerGroup:
    """``num_learners`` data-parallel ``LearnerRank`` actors: the loop's learner with ``cluster.learners > 1``.

    The replicas start equal: each builds the policy seeded with ``config.seed`` and takes what ``state`` has of
    the trained state. ``num_cpus``: each actor's Ray CPU request (explicit: a default request can leave actors
    pending forever on a small machine). ``cluster.call_timeout`` bounds every call, READY_TIMEOUT the start.
    """

    def __init__(self, config: Config, num_learners: int, *, state: TrainState | None = None,
                 num_cpus: float = 0.5) -> None:
        import ray

        self.config = config
        if num_learners < 1:
            raise ValueError(f"num_learners must be at least 1, got {num_learners}")
        self._ray, self.call_timeout, self.num_learners = ray, config.cluster.call_timeout, num_learners
        self.driver_weights = driver_holds_weights(config)
        gpus = 1 if state is not None and policy_device(state.policy).type == "cuda" else 0
        actor = ray.remote(num_cpus=num_cpus, num_gpus=gpus, concurrency_groups={WATCH: 1})(LearnerRank)
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
        start = None if state is None else train_state(state)
        self.has_reference = start is not None and start["reference"] is not None  # updated by load_sharded
        state_ref = None if start is None else ray.put(start)
        self.learners = [actor.remote(config, rank, num_learners, init_method, state_ref, self.call_timeout)
                         for rank in range(num_learners)]
        # init_process_group returns only once all ranks joined: an answer from each proves the group is up
        try:
            self._each("pid", "starting (building the policy, joining the process group)", timeout=READY_TIMEOUT)
        except BaseException:
            self.close()
            raise

    def _get(self, refs: list, doing: str, timeout: float | None = None) -> list:
        """The results of ``refs`` (learner r's at index r) within ``timeout`` (default ``cluster.call_timeout``).
        The first failure is raised as soon as it is known (not after its peers time out waiting for it): a
        learner's own TrainingError as it is, else a LearnerFault naming the rank, ``doing`` and how long."""
        from ray.exceptions import RayActorError, RayTaskError

        start = time.monotonic()
        pending, deadline = list(refs), start + (self.call_timeout if timeout is None else timeout)
        while pending:
            ready, pending = self._ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                raise LearnerFault(diagnose(self._ray, self.learners, doing, time.monotonic() - start))
            try:
                self._ray.get(ready)
            except RayActorError as err:
                raise LearnerFault(f"learner rank {refs.index(ready[0])} died while {doing}, after "
                                   f"{time.monotonic() - start:.1f} s ({first_line(err)})") from err
            except RayTaskError as err:
                if isinstance(err.cause, TrainingError):  # its own (too many non-finite steps), as one process says
                    raise TrainingError(str(err.cause)) from err
                failed = (refs.index(ready[0]), err)
                raise LearnerFault(diagnose(self._ray, self.learners, doing, time.monotonic() - start, failed)
                                   ) from err
        return self._ray.get(refs)

    def step(self, rollout: Rollout, epoch: int = 0, step: int | None = None, measure_noise: bool = False) -> Record:
        """One optimizer step of every learner on the whole ``rollout``; rank 0's record (all are the same)."""
        share_bounds(rollout.samples.num_responses, self.num_learners)  # fail here, not inside the actors
        ref = self._ray.put(rollout)  # serialised once, read by every learner
        return self._each("step", "taking its optimizer step", ref, epoch, step, measure_noise)[0]

    def pids(self) -> list[int]:
        return self._each("pid", "telling its process id")

    def _each(self, method: str, doing: str, *args: Any, timeout: float | None = None) -> list:
        """``method(*args)`` on every learner: their answers in rank order (``_get``)."""
        return self._get([getattr(learner, method).remote(*args) for learner in self.learners], doing, timeout)

    def optimizer_step(self, st: TrainState, rollout: Rollout) -> Record:
        """The group's step at the driver's epoch and step count; a learner's fault stops the run (one line)."""
        with self._stops_run(st):
            record = self.step(rollout, st.epoch, st.step, noise_due(self.config, st))
        st.step += 1
        return record

    def pull(self, st: TrainState) -> None:
        """Rank 0's state into the driver's ``st`` (the weights and optimizer state where the driver holds them)."""
        state = self._call(st, "handing its state over", "train_state", self.driver_weights)  # a collective
        load_train_state(st, state)

    def log_probs(self, st: TrainState, samples: Samples, temperature: float, reference: bool = False,
                  with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``Policy.log_probs`` of ``samples`` [N, T]: each learner scores its share, in order."""
        share_bounds(samples.num_responses, self.num_learners)  # fail here, not inside the actors
        parts = self._call(st, "scoring its share of the samples", "log_probs", self._ray.put(samples), temperature,
                           reference, with_entropy, every=True)
        entropy = None if parts[0][1] is None else torch.cat([p[1] for p in parts])
        return torch.cat([p[0] for p in parts]), entropy

    def refresh_reference(self, st: TrainState) -> None:
        """Each learner's reference a frozen copy of its weights, when due (``reference_due``)."""
        if reference_due(self.config, st.epoch, self.has_reference):
            self._call(st, "copying the reference", "refresh_reference", st.epoch)
            self.has_reference = True

    def publish_weights(self, st: TrainState) -> Any:
        """The object-store reference of the weights of ``st.step``, which rollout workers load."""
        return self._call(st, "publishing the weights", "publish_weights")[0]

    def _call(self, st: TrainState, doing: str, method: str, *args: Any, every: bool = False) -> Any:
        """``method(*args)`` on every learner: rank 0's answer (``every``: all, in rank order); a learner's fault
        stops the run."""
        with self._stops_run(st):
            answers = self._each(method, doing, *args)
        return answers if every else answers[0]

    @contextmanager
    def _stops_run(self, st: TrainState) -> Iterator[None]:
        """A learner's fault, or Ray's own (a node that died), as the one line that stops the run."""
        from ray.exceptions import RayError

        try:
            yield
        except (LearnerFault, RayError) as err:
            raise learners_stopped(st, err) from err

    def save_sharded(self, folder: Path) -> None:
        """Every learner writes its part of the weights and optimizer state into ``folder`` (DCP)."""
        self._each("save_sharded", "writing its checkpoint shards", str(folder))

    def load_sharded(self, st: TrainState, folder: Path) -> None:
        """A sharded checkpoint's weights and optimizer state into the learners (resharded), then into ``st``."""
        self._each("load_sharded", "reading its checkpoint shards", str(folder))
        self.has_reference = self.has_reference or has_reference(folder)
        self.pull(st)

    def gradients(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """The full batch's gradient as the group computes it (rank 0's copy); no step."""
        share_bounds(rollout.samples.num_responses, self.num_learners)
        return self._each("gradients", "computing the gradient", self._ray.put(rollout))[0]

    def state_dict(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """The policy's weights from learner ``rank`` (all are equal)."""
        return self._each("state_dict", "handing its weights over")[rank]  # a collective

    def close(self) -> None:
        """End the actors; nothing is asked of them first (a survivor of a dead peer may wait in an all-reduce)."""
        for learner in self.learners:
            self._ray.kill(learner)
        self.learners = []

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
