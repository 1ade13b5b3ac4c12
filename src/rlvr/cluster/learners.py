"""Data-parallel learners: M Ray actors, each holding a full replica of the policy and its
optimizer, joined in a ``torch.distributed`` gloo group.

Each step the driver puts the rollout into the object store once; learner ``r`` takes its
contiguous share ``rollout.rows(...)`` of the N responses. A share's loss is its part of the
whole batch's loss (``Rollout.rows`` keeps the whole batch's aggregation weights), so the
shares' gradients and step sums *add up* to the full batch's: the learners all-reduce them
with SUM (the gradients as one flat buffer per dtype), then every learner clips, computes
``step_metrics`` and takes the same optimizer step on the same gradient, so the replicas stay
equal without ever exchanging weights.

In a run (``cluster.learners = M > 1``, see ``rlvr.cluster.session``) the group is the loop's
learner (``rlvr.seams.Learner``): it starts from the driver's state (weights, optimizer,
scheduler), takes every optimizer step, and hands its state back to the driver at the end of
each epoch (``pull``) to sample and evaluate with. A checkpoint's weights and optimizer state
are written by the learners themselves (DCP, ``rlvr.cluster.sharded``), and read back resharded
by any number of learners, or by one process. A learner that dies, fails or hangs stops the run
with a one-line ``TrainingError`` naming its rank, what it was doing and for how long
(``rlvr.cluster.watch``); the checkpoints written before are untouched. Every wait is
bounded: a group call by ``cluster.call_timeout`` (the actors' start by ``READY_TIMEOUT``),
each collective by the process group's ``timeout``: ``cluster.call_timeout``, or READY_TIMEOUT
if longer (the same timeout bounds the rendezvous, which waits for the slowest peer's start).
The driver's wait on a step starts first and fires first; the group's is the peers' backstop.

Transport: gloo on the CPU. On GPUs the same code runs with ``nccl`` (each actor asks Ray for
``num_gpus=1``); that path is written but has not run here (no GPU on the machine that tests it).

Ray is imported lazily: ``import rlvr.cluster.learners`` works without it. The caller starts
Ray (``ray.init``) before building a ``LearnerGroup`` and shuts it down after ``close()``.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlvr.cluster import READY_TIMEOUT, first_line
from rlvr.cluster.sharded import load_sharded, save_sharded
from rlvr.cluster.watch import IDLE, WATCH, Activity, diagnose
from rlvr.compose import build_policy
from rlvr.config import Config
from rlvr.diagnostics import GradientNoiseMeter, flat_grad
from rlvr.metrics import Record
from rlvr.optim import build_optimizer, build_scheduler
from rlvr.rollout import Rollout, contiguous_bounds
from rlvr.state import TrainingError, TrainState, seed_everything
from rlvr.step import accumulate_gradients, noise_due, optimizer_step, whole


def share_bounds(num_rows: int, num_shares: int) -> list[tuple[int, int]]:
    """``num_shares`` contiguous, nearly equal ``[start, stop)`` parts of ``num_rows`` rows
    (sizes differ by at most one; every part non-empty)."""
    if num_rows < num_shares:
        raise ValueError(f"a rollout of {num_rows} responses cannot be split among {num_shares} learners")
    return contiguous_bounds(num_rows, num_shares)


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LearnerRank(Activity):
    """One learner (run as a Ray actor by ``LearnerGroup``): the policy, its optimizer and
    scheduler, and rank ``rank`` of a gloo (NCCL) group of ``world_size``.

    ``cluster.learner_strategy``: ``ddp``, a full replica per learner and the gradients
    all-reduced; ``fsdp``, the policy's parameters, gradients and Adam state sharded over the
    group by FSDP2's ``fully_shard`` (one unit: the whole module), its reduce-scatter
    averaging turned back into the sum the shares' losses need. Either way the weights and
    optimizer state go to the driver whole (``train_state``), and to a checkpoint as DCP
    shards (``save_sharded``).
    """

    def __init__(self, config: Config, rank: int, world_size: int, init_method: str,
                 state: dict[str, Any] | None = None, timeout_s: float = 1800.0) -> None:
        torch.set_num_threads(config.torch_threads or 1)  # one thread per actor: oversubscription is slow
        self.config, self.rank, self.world_size = config, rank, world_size
        generator = seed_everything(config.seed)  # as the driver's setup: seeded replicas start equal
        policy = build_policy(config)
        if state is not None:  # before any sharding: every learner loads the whole weights
            policy.module.load_state_dict(state["model"])
        # the rendezvous waits for the slowest peer's start (READY_TIMEOUT); each collective for the slowest share
        timeout = datetime.timedelta(seconds=max(timeout_s, READY_TIMEOUT))
        dist.init_process_group(backend_for(policy.module), init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timeout)
        self.fsdp = config.cluster.learner_strategy == "fsdp"
        if self.fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            fully_shard(policy.module, mesh=init_device_mesh(policy_device(policy).type, (world_size,)))
        self.params = [p for p in policy.module.parameters() if p.requires_grad]
        optimizer = build_optimizer(config.optim, self.params)
        total = config.algo.epochs * config.algo.inner_steps
        self.st = TrainState(policy, optimizer, generator, build_scheduler(config.optim, optimizer, total))
        if state is not None:
            self.load_train_state(state)
        self._doing(IDLE)

    def _share(self, rollout: Rollout) -> Rollout:
        start, stop = share_bounds(rollout.samples.num_responses, self.world_size)[self.rank]
        return rollout.rows(slice(start, stop))

    def _reduced_gradients(self, rollout: Rollout, meter: GradientNoiseMeter | None = None
                           ) -> dict[str, torch.Tensor]:
        """Backpropagate this learner's share, then sum gradients and step sums over the group:
        afterwards every learner holds the full batch's gradient and sums. ``meter``: the
        share's parts measured here, every learner's gathered into it after the sum."""
        self._doing("computing its share's gradients")
        self.st.optimizer.zero_grad(set_to_none=True)
        sums = accumulate_gradients(self.config, self.st.policy, self._share(rollout), self.config.optim.micro_batches,
                                    meter, batch=rollout)
        self._doing("the all-reduce of the gradients", waiting=True)
        if self.fsdp:  # FSDP2 reduce-scattered the mean over the group (gloo has no pre-scaled sum): the sum
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(self.world_size)
        else:
            self._all_reduce_gradients()
        keys = sorted(sums)  # the same keys, in the same order, on every learner (same config)
        values = torch.stack([torch.as_tensor(sums[k]).detach().to(torch.float64) for k in keys])
        self._doing("the all-reduce of the step sums", waiting=True)
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        if meter is not None:  # every learner's parts; their sum is the reduced gradient (before clipping)
            parts: list[Any] = [None] * self.world_size
            self._doing("the all-gather of the noise meter's parts", waiting=True)
            dist.all_gather_object(parts, (meter.norms_sq, meter.sizes))
            meter.reset()
            for norms_sq, sizes in parts:
                meter.add_parts(norms_sq, sizes, flat_grad(self.st.policy.module))
        self._doing("taking the optimizer step")
        return {k: v.to(torch.as_tensor(sums[k]).dtype) for k, v in zip(keys, values)}

    def _all_reduce_gradients(self) -> None:
        """One all-reduce (SUM) per gradient dtype over a flat buffer. A parameter without a
        gradient counts as zero, and keeps ``grad=None`` only if it has none on every learner
        (as in a single process, where Adam skips it): a 0/1 flag per parameter travels along."""
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in self.params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, params in by_dtype.items():
            parts = [torch.zeros(p.numel(), dtype=dtype) if p.grad is None else p.grad.reshape(-1) for p in params]
            flags = torch.tensor([float(p.grad is not None) for p in params], dtype=dtype)
            flat = torch.cat([*parts, flags])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for p, has_grad in zip(params, flat[-len(params):].tolist()):
                n = p.numel()
                if has_grad:
                    p.grad = flat[offset:offset + n].view_as(p).clone()
                offset += n

    def gradients(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """The full batch's gradient (summed over the group), by parameter name; no step."""
        try:
            self._reduced_gradients(rollout)
        finally:
            self._doing(IDLE)
        grads = {name: whole(p.grad).detach().clone() for name, p in self.st.policy.module.named_parameters()
                 if p.grad is not None}
        self.st.optimizer.zero_grad(set_to_none=True)
        return grads

    def step(self, rollout: Rollout, epoch: int, step: int | None = None, measure_noise: bool = False) -> Record:
        """``rlvr.step.optimizer_step`` with the gradient summed over the group; every
        learner sees the same numbers, so all take (or all skip) the same step. ``step``:
        the driver's step count (default: this learner's own); ``measure_noise``: grad/*
        from the parts of every learner's share."""
        self.st.epoch = epoch
        if step is not None:
            self.st.step = step
        try:
            return optimizer_step(self.config, self.st, rollout, measure_noise,
                                  gradients=lambda meter: self._reduced_gradients(rollout, meter))
        finally:
            self._doing(IDLE)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights, whole (copies, on the CPU)."""
        return {k: whole(v).detach().cpu().clone() for k, v in self.st.policy.module.state_dict().items()}

    def pid(self) -> int:
        return os.getpid()

    def save_sharded(self, folder: str) -> None:
        """This learner's part of the weights and optimizer state into ``folder`` (with every learner)."""
        self._doing("writing its checkpoint shards", waiting=True)
        save_sharded(self.st.policy.module, self.st.optimizer, Path(folder))
        self._doing(IDLE)

    def load_sharded(self, folder: str) -> None:
        """This learner's part of a sharded checkpoint, however many learners wrote it."""
        self._doing("reading its checkpoint shards", waiting=True)
        load_sharded(self.st.policy.module, self.st.optimizer, Path(folder))
        self._doing(IDLE)

    def train_state(self) -> dict[str, Any]:
        """What the driver takes over at the end of an epoch: weights, optimizer and
        scheduler state, the count of consecutive skipped steps."""
        optimizer = self.st.optimizer.state_dict()
        optimizer["state"] = {i: {k: whole(v) for k, v in s.items()} for i, s in optimizer["state"].items()}
        return {"model": self.state_dict(), "optimizer": optimizer,
                "scheduler": self.st.scheduler.state_dict(), "bad_steps": self.st.bad_steps}

    def load_train_state(self, state: dict[str, Any]) -> None:
        if not self.fsdp:
            load_train_state(self.st, state)
            return
        from torch.distributed.tensor import distribute_tensor

        # the weights were loaded whole before sharding; the optimizer's moments are sharded as their parameters
        optimizer = dict(state["optimizer"])
        optimizer["state"] = {
            i: {k: distribute_tensor(v, self.params[i].device_mesh, self.params[i].placements)
                if isinstance(v, torch.Tensor) and v.shape == self.params[i].shape else v for k, v in s.items()}
            for i, s in optimizer["state"].items()}
        self.st.optimizer.load_state_dict(optimizer)
        self.st.scheduler.load_state_dict(state["scheduler"])
        self.st.bad_steps = state["bad_steps"]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def backend_for(module: torch.nn.Module) -> str:
    """The torch.distributed backend for ``module``'s device: NCCL on a GPU, gloo on the CPU."""
    return "nccl" if next(module.parameters()).device.type == "cuda" else "gloo"


def policy_device(policy: Any) -> torch.device:
    return next(policy.module.parameters()).device


def load_train_state(st: TrainState, state: dict[str, Any]) -> None:
    """``LearnerRank.train_state()`` (or the driver's ``train_state``) into ``st``."""
    st.policy.module.load_state_dict(state["model"])
    st.optimizer.load_state_dict(state["optimizer"])
    st.scheduler.load_state_dict(state["scheduler"])
    st.bad_steps = state["bad_steps"]


def train_state(st: TrainState) -> dict[str, Any]:
    """The driver's state that the learners start from (as ``LearnerRank.train_state``)."""
    return {"model": {k: v.detach().cpu() for k, v in st.policy.module.state_dict().items()},
            "optimizer": st.optimizer.state_dict(), "scheduler": st.scheduler.state_dict(),
            "bad_steps": st.bad_steps}


class LearnerFault(TrainingError):
    """A learner died, failed or hung (one line naming its rank, ``rlvr.cluster.watch``)."""


def learners_stopped(st: TrainState, err: Exception) -> TrainingError:
    """The one-line error that stops a run whose learner died, failed or hung (or whose node
    or Ray did): at the driver's epoch and step."""
    cause = str(err) if isinstance(err, LearnerFault) else f"Ray failed: {type(err).__name__}: {first_line(err)}"
    return TrainingError(f"epoch {st.epoch}, step {st.step}: {cause}. The run stops; the checkpoints written before "
                         "are intact (resume=RUN_DIR continues from the last one)")


class LearnerGroup:
    """``num_learners`` data-parallel ``LearnerRank`` actors on the running Ray instance: the
    loop's learner (``rlvr.seams.Learner``) in a run with ``cluster.learners > 1``.

    The replicas start equal: each builds the policy seeded with ``config.seed`` (as
    ``rlvr.trainer.setup`` does), or takes ``state`` (a driver's ``TrainState``: its weights,
    optimizer and scheduler) when given. ``num_cpus`` is each actor's Ray CPU request
    (explicit: a default request can leave actors pending forever on a small machine); on a
    GPU each actor also asks for one GPU. ``cluster.call_timeout`` bounds every call and
    collective, READY_TIMEOUT the actors' start.
    """

    def __init__(self, config: Config, num_learners: int, *, state: TrainState | None = None,
                 num_cpus: float = 0.5) -> None:
        import ray

        self.config = config
        if num_learners < 1:
            raise ValueError(f"num_learners must be at least 1, got {num_learners}")
        self._ray, self.call_timeout, self.num_learners = ray, config.cluster.call_timeout, num_learners
        gpus = 1 if state is not None and policy_device(state.policy).type == "cuda" else 0
        actor = ray.remote(num_cpus=num_cpus, num_gpus=gpus, concurrency_groups={WATCH: 1})(LearnerRank)
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
        state_ref = None if state is None else ray.put(train_state(state))
        self.learners = [actor.remote(config, rank, num_learners, init_method, state_ref, self.call_timeout)
                         for rank in range(num_learners)]
        # init_process_group returns only once all ranks joined: an answer from each proves the group is up
        try:
            self._get([learner.pid.remote() for learner in self.learners], "starting (building the policy, "
                      "joining the process group)", READY_TIMEOUT)
        except BaseException:
            self.close()
            raise

    def _get(self, refs: list, doing: str, timeout: float | None = None) -> list:
        """The results of ``refs`` (learner r's call at index r), within ``timeout`` seconds
        (default ``cluster.call_timeout``). The first failure is raised as soon as it is known (a
        dead learner's at once, not after its peers time out waiting for it): a learner's own
        TrainingError as it is, else a LearnerFault naming the rank, ``doing`` and how long."""
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
        """One optimizer step of every learner on the whole ``rollout``; rank 0's record
        (every learner computes the same metrics from the same summed numbers)."""
        share_bounds(rollout.samples.num_responses, self.num_learners)  # fail here, not inside the actors
        ref = self._ray.put(rollout)  # serialised once, read by every learner
        return self._get([learner.step.remote(ref, epoch, step, measure_noise) for learner in self.learners],
                         "taking its optimizer step")[0]

    def pids(self) -> list[int]:
        return self._get([learner.pid.remote() for learner in self.learners], "telling its process id")

    def optimizer_step(self, st: TrainState, rollout: Rollout) -> Record:
        """The group's step at the driver's epoch and step count (measuring the gradient's
        noise where ``rlvr.step.noise_due`` says). A learner that died, failed or hung stops
        the run with one line naming it (a ``TrainingError``); a learner's own TrainingError
        (too many non-finite steps) stops it as a single process does."""
        from ray.exceptions import RayError

        try:
            record = self.step(rollout, st.epoch, st.step, noise_due(self.config, st))
        except (LearnerFault, RayError) as err:  # a learner's, or Ray's own (a node that died)
            raise learners_stopped(st, err) from err
        st.step += 1
        return record

    def pull(self, st: TrainState) -> None:
        """The group's state into the driver's ``st`` (rank 0's: all are equal), so the driver
        samples, evaluates and checkpoints with the trained weights."""
        from ray.exceptions import RayError

        try:  # every learner is asked: gathering FSDP's shards whole is a collective
            state = self._get([learner.train_state.remote() for learner in self.learners], "handing its state over")[0]
        except (LearnerFault, RayError) as err:  # e.g. killed after its last step of the epoch
            raise learners_stopped(st, err) from err
        load_train_state(st, state)

    def save_sharded(self, folder: Path) -> None:
        """Every learner writes its part of the weights and optimizer state into ``folder`` (DCP)."""
        self._get([rank.save_sharded.remote(str(folder)) for rank in self.learners], "writing its checkpoint shards")

    def load_sharded(self, st: TrainState, folder: Path) -> None:
        """A sharded checkpoint's weights and optimizer state into the learners (resharded), then into ``st``."""
        self._get([rank.load_sharded.remote(str(folder)) for rank in self.learners], "reading its checkpoint shards")
        self.pull(st)

    def gradients(self, rollout: Rollout) -> dict[str, torch.Tensor]:
        """The full batch's gradient as the group computes it (rank 0's copy); no step."""
        share_bounds(rollout.samples.num_responses, self.num_learners)
        ref = self._ray.put(rollout)
        return self._get([learner.gradients.remote(ref) for learner in self.learners], "computing the gradient")[0]

    def state_dict(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """The policy's weights from learner ``rank`` (all are equal): for rollout workers and
        checkpoints."""
        return self._get([learner.state_dict.remote() for learner in self.learners], "handing its weights over"
                         )[rank]  # a collective

    def close(self) -> None:
        """End the actors (their process group ends with them; a survivor of a dead peer may be
        waiting inside an all-reduce, so nothing is asked of them first)."""
        for learner in self.learners:
            self._ray.kill(learner)
        self.learners = []

    def __enter__(self) -> LearnerGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
