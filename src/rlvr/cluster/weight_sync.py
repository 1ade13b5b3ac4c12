"""Weights from the trainer to the rollout workers: as a payload in Ray's object store (the default; with
``cluster.weights_in_flight`` posted on a ``WeightsBoard`` after every optimizer step), or by a collective
broadcast; and the process groups' plumbing the learners share (docs/explanation/cluster.md).
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


def weights_payload(state: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
    """(name, tensor) pairs as numpy arrays (Ray shares those zero-copy); bfloat16, which numpy lacks, stays a
    tensor."""
    out: dict[str, Any] = {}
    for key, value in state:
        value = value.detach().cpu()
        out[key] = value if value.dtype == torch.bfloat16 else value.numpy()
    return out


class WeightsBoard:
    """The newest weights published (a Ray actor): their version and ``[ObjectRef]`` (a list, so Ray hands over the
    reference, not the weights), which keeps them alive in the object store."""

    def __init__(self) -> None:
        self.version, self.weights = -1, [None]

    def post(self, version: int, weights: list[Any]) -> None:
        if version > self.version:
            self.version, self.weights = version, weights

    def latest(self) -> tuple[int, list[Any]]:
        return self.version, self.weights


def free_port() -> int:
    """A TCP port free on this host now (for the process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def backend_for(module: torch.nn.Module) -> str:
    """The torch.distributed backend for ``module``'s device: NCCL on a GPU, gloo on the CPU."""
    return "nccl" if next(module.parameters()).device.type == "cuda" else "gloo"


def broadcast_state(state: dict[str, torch.Tensor], source: bool) -> None:
    """Broadcast ``state`` from rank 0 (``source``) into the same-shaped ``state`` of every other rank, in place:
    one flat buffer per dtype, keys in the state dict's order."""
    by_dtype: dict[torch.dtype, list[str]] = {}
    for key, value in state.items():
        by_dtype.setdefault(value.dtype, []).append(key)
    for dtype, keys in by_dtype.items():
        if source:
            buffer = torch.cat([state[k].detach().reshape(-1) for k in keys])
        else:
            buffer = torch.empty(sum(state[k].numel() for k in keys), dtype=dtype, device=state[keys[0]].device)
        dist.broadcast(buffer, src=0)
        if not source:
            offset = 0
            with torch.no_grad():
                for key in keys:
                    n = state[key].numel()
                    state[key].copy_(buffer[offset:offset + n].view_as(state[key]))
                    offset += n


def join(init_method: str, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    """Join the weights group (blocks until every rank has joined); each collective then waits at most
    ``timeout_s``."""
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))


class CollectiveWeights:
    """The driver's side: forms the group with the ``workers`` (Ray actors) and broadcasts each version once."""

    def __init__(self, ray: Any, workers: list[Any], module: torch.nn.Module, timeout_s: float) -> None:
        from ray.exceptions import RayError

        from rlvr.cluster import ClusterError, first_line

        self.ray, self.workers, self.timeout_s = ray, workers, timeout_s
        init_method = f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"
        world, backend = len(workers) + 1, backend_for(module)
        joined = [w.join_weights_group.remote(init_method, rank, world, backend, timeout_s)
                  for rank, w in enumerate(workers, start=1)]
        try:
            join(init_method, 0, world, backend, timeout_s)
            ray.get(joined, timeout=timeout_s)
        except (RuntimeError, RayError) as err:  # a worker that never joined: the rendezvous timed out
            raise ClusterError(f"forming the weights group (weight_sync=collective) within {timeout_s:g} s: "
                               f"{culprits(ray, joined, 'did not join')} ({first_line(err)})") from err
        self.version: int | None = None

    def send(self, module: torch.nn.Module, version: int) -> None:
        """Every worker's weights become ``module``'s, named ``version`` (once per version)."""
        from ray.exceptions import RayError

        from rlvr.cluster import ClusterError, first_line

        if version == self.version:
            return
        received = [w.receive_weights.remote(version) for w in self.workers]
        try:
            broadcast_state(module.state_dict(), source=True)
            self.ray.get(received, timeout=self.timeout_s)
        except (RuntimeError, RayError) as err:  # a member died (gloo's reset connection, Ray's error) or hung
            raise ClusterError(f"the weights broadcast of version {version} failed within {self.timeout_s:g} s: "
                               f"{culprits(self.ray, received, 'did not take it')} ({first_line(err)}); "
                               "weight_sync=collective cannot take a restarted worker back into its group "
                               "(weight_sync=object_store survives restarts)") from err
        self.version = version

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def culprits(ray: Any, refs: list[Any], silent: str) -> str:
    """Which workers a group's failure comes down to (``refs``: worker i's call at index i): those whose call
    failed (died), else those that have not answered."""
    done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
    dead = []
    for i, ref in enumerate(refs):
        try:
            if ref in done:
                ray.get(ref, timeout=0)
        except Exception:  # noqa: BLE001 - any failure of the call: the worker is the one named
            dead.append(i)
    late = [i for i, ref in enumerate(refs) if ref not in done]
    if dead:
        return f"rollout worker {', '.join(map(str, dead))} died"
    return f"rollout worker {', '.join(map(str, late))} {silent}" if late else "the group failed"
