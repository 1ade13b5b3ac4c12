"""One data-parallel learner, a Ray actor of ``rlvr.cluster.learners.LearnerGroup``: a replica (or, under FSDP, a
shard) of the policy, its optimizer and scheduler, and the KL reference, as one rank of a gloo (NCCL) group.
Besides its optimizer steps it scores its share of the samples, refreshes its reference, publishes the weights for
rollout workers and writes and reads its part of a sharded checkpoint.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rlvr.batch.record import Record
from rlvr.batch.rollout import Rollout, Samples, contiguous_bounds
from rlvr.cluster import READY_TIMEOUT, quiet_actor
from rlvr.cluster.sharded import load_sharded, save_sharded
from rlvr.cluster.watch import IDLE, Activity
from rlvr.cluster.weight_sync import backend_for, weights_payload
from rlvr.config import Config
from rlvr.config.compose import build_policy
from rlvr.loop.diagnostics import GradientNoiseMeter, flat_grad
from rlvr.loop.optim import build_optimizer, build_scheduler, clear_grads
from rlvr.loop.seams import reference_due
from rlvr.loop.state import TrainState, seed_everything
from rlvr.loop.step import accumulate_gradients, optimizer_step, whole
from rlvr.policies import frozen_copy


def share_bounds(num_rows: int, num_shares: int) -> list[tuple[int, int]]:
    """``num_shares`` contiguous ``[start, stop)`` parts of ``num_rows`` rows, sizes differing by at most one."""
    if num_rows < num_shares:
        raise ValueError(f"a rollout of {num_rows} responses cannot be split among {num_shares} learners")
    return contiguous_bounds(num_rows, num_shares)


class LearnerRank(Activity):
    """One learner: the policy, its optimizer and scheduler, and rank ``rank`` of a group of ``world_size``.

    ``cluster.learner_strategy``: ``ddp``, a full replica per learner and the gradients all-reduced; ``fsdp``, the
    parameters, gradients and Adam state sharded by FSDP2's ``fully_shard`` (one unit: the whole module), its
    reduce-scatter averaging turned back into the sum the shares' losses need. ``state``: what to start from
    (``rlvr.cluster.learners.train_state``); the policy is otherwise built as the driver's (seeded alike).
    """

    def __init__(self, config: Config, rank: int, world_size: int, init_method: str,
                 state: dict[str, Any] | None = None, timeout_s: float = 1800.0) -> None:
        torch.set_num_threads(config.torch_threads or 1)  # one thread per actor: oversubscription is slow
        quiet_actor()
        self.config, self.rank, self.world_size = config, rank, world_size
        generator = seed_everything(config.seed)  # as the driver's setup: seeded replicas start equal
        policy = build_policy(config)
        state = state or {}
        if state.get("model") is not None:  # before any sharding: every learner loads the whole weights
            policy.module.load_state_dict(state["model"])
        # the rendezvous waits for the slowest peer's start (READY_TIMEOUT); each collective for the slowest share
        timeout = datetime.timedelta(seconds=max(timeout_s, READY_TIMEOUT))
        dist.init_process_group(backend_for(policy.module), init_method=init_method, rank=rank, world_size=world_size,
                                timeout=timeout)
        self.fsdp = config.cluster.learner_strategy == "fsdp"
        if self.fsdp:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            self.mesh = init_device_mesh(policy_device(policy).type, (world_size,))
            fully_shard(policy.module, mesh=self.mesh)
        self.params = [p for p in policy.module.parameters() if p.requires_grad]
        optimizer = build_optimizer(config.optim, self.params)
        total = config.algo.epochs * config.algo.inner_steps
        self.st = TrainState(policy, optimizer, generator, build_scheduler(config.optim, optimizer, total))
        self.ref: torch.nn.Module | None = None  # the KL reference, sharded as the policy
        if state:
            self.load_train_state(state)
        if state.get("reference") is not None:
            self.ref = self._reference(state["reference"])
        self._doing(IDLE)

    def _reference(self, whole_state: dict[str, torch.Tensor] | None = None) -> torch.nn.Module:
        """A frozen copy of the policy (or a module holding ``whole_state``), sharded as the policy is."""
        if not self.fsdp:
            ref = frozen_copy(self.st.policy.module)
            if whole_state is not None:
                ref.load_state_dict(whole_state)
            return ref
        from torch.distributed.fsdp import fully_shard

        module = build_policy(self.config).module  # FSDP modules cannot be deep-copied
        if whole_state is not None:
            module.load_state_dict(whole_state)
        fully_shard(module, mesh=self.mesh)
        if whole_state is None:
            module.load_state_dict(self.st.policy.module.state_dict())  # shard to shard
        module.requires_grad_(False)
        return module.eval()

    def refresh_reference(self, epoch: int) -> None:
        """The reference a frozen copy of the weights now, when due at ``epoch`` (``reference_due``)."""
        if reference_due(self.config, epoch, self.ref is not None):
            with self._busy("copying the reference", waiting=self.fsdp):
                self.ref = self._reference()

    def log_probs(self, samples: Samples, temperature: float, reference: bool, with_entropy: bool
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``Policy.log_probs`` of this learner's share of ``samples`` (no gradient; a collective under FSDP)."""
        start, stop = share_bounds(samples.num_responses, self.world_size)[self.rank]
        with self._busy("scoring its share of the samples"), torch.no_grad():
            return self.st.policy.log_probs(samples.rows(slice(start, stop)), temperature,
                                            with_entropy=with_entropy, module=self.ref if reference else None)

    def publish_weights(self) -> list[Any] | None:
        """The weights whole, for rollout workers: rank 0 returns ``[ref]`` to them in the object store (a list, so
        the caller gets the reference, not the weights); under FSDP every learner takes part in gathering them."""
        import ray

        with self._busy("publishing the weights", waiting=self.fsdp):
            gathered = ((key, whole(value)) for key, value in self.st.policy.module.state_dict().items())
            if self.rank != 0:
                for _ in gathered:  # the other ranks' part of each gather
                    pass
                return None
            return [ray.put(weights_payload(gathered))]

    def _share(self, rollout: Rollout) -> Rollout:
        start, stop = share_bounds(rollout.samples.num_responses, self.world_size)[self.rank]
        return rollout.rows(slice(start, stop))

    def _reduced_gradients(self, rollout: Rollout, meter: GradientNoiseMeter | None = None
                           ) -> dict[str, torch.Tensor]:
        """Backpropagate this learner's share, then sum gradients and step sums over the group. ``meter``: the
        share's parts measured here, every learner's gathered into it after the sum."""
        clear_grads(self.st.optimizer)
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
        """One all-reduce (SUM) per gradient dtype over a flat buffer. A parameter keeps ``grad=None`` only if it
        has none on every learner (as Adam skips it in a single process): a 0/1 flag per parameter travels along."""
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
        with self._busy("computing its share's gradients"):
            self._reduced_gradients(rollout)
        grads = {name: whole(p.grad).detach().clone() for name, p in self.st.policy.module.named_parameters()
                 if p.grad is not None}
        clear_grads(self.st.optimizer)
        return grads

    def step(self, rollout: Rollout, epoch: int, step: int | None = None, measure_noise: bool = False) -> Record:
        """``optimizer_step`` with the gradient summed over the group: all take (or all skip) the same step.
        ``step``: the driver's step count (default: this learner's own)."""
        self.st.epoch = epoch
        if step is not None:
            self.st.step = step
        with self._busy("computing its share's gradients"):
            return optimizer_step(self.config, self.st, rollout, measure_noise,
                                  gradients=lambda meter: self._reduced_gradients(rollout, meter))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights, whole (copies, on the CPU)."""
        return {k: whole(v).detach().cpu().clone() for k, v in self.st.policy.module.state_dict().items()}

    def pid(self) -> int:
        return os.getpid()

    def save_sharded(self, folder: str) -> None:
        """This learner's part of the weights, optimizer state and reference into ``folder`` (with every learner)."""
        with self._busy("writing its checkpoint shards", waiting=True):
            save_sharded(self.st.policy.module, self.st.optimizer, Path(folder), self.ref)

    def load_sharded(self, folder: str) -> None:
        """This learner's part of a sharded checkpoint, however many learners wrote it."""
        with self._busy("reading its checkpoint shards", waiting=True):
            self.ref = load_sharded(self.st.policy.module, self.st.optimizer, Path(folder), self._reference) or self.ref

    def train_state(self, weights: bool = True) -> dict[str, Any]:
        """What the driver takes over at the end of an epoch; with ``weights``, the weights and optimizer state too
        (gathered whole under FSDP: every learner is asked)."""
        state = {"scheduler": self.st.scheduler.state_dict(), "bad_steps": self.st.bad_steps}
        if not weights:
            return state
        optimizer = self.st.optimizer.state_dict()
        optimizer["state"] = {i: {k: whole(v) for k, v in s.items()} for i, s in optimizer["state"].items()}
        return {"model": self.state_dict(), "optimizer": optimizer, **state}

    def load_train_state(self, state: dict[str, Any]) -> None:
        """``train_state``'s parts into this learner (whole weights are loaded before sharding, in ``__init__``)."""
        if not self.fsdp or state.get("optimizer") is None:
            load_train_state(self.st, {**state, "model": None})
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


def policy_device(policy: Any) -> torch.device:
    return next(policy.module.parameters()).device


def load_train_state(st: TrainState, state: dict[str, Any]) -> None:
    """``LearnerRank.train_state()`` (or the driver's ``train_state``) into ``st``, each part that is not None."""
    if state.get("model") is not None:
        st.policy.module.load_state_dict(state["model"])
    if state.get("optimizer") is not None:
        st.optimizer.load_state_dict(state["optimizer"])
    st.scheduler.load_state_dict(state["scheduler"])
    st.bad_steps = state["bad_steps"]
