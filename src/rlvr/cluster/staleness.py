"""Staleness in optimizer steps: how old the weights that sampled a batch are when the
trainer trains on it, and the bound past which a batch is not trained on.

Each sample carries the version of the weights that sampled it (their optimizer step count:
its ``Job``'s ``version``, per part of a split batch). A batch's age when trained on is the
optimizer step at which its first inner step is taken minus that version.
``cluster.max_staleness_steps`` bounds it (null: ``max_staleness`` x ``algo.inner_steps``,
the age a batch submitted k epochs ahead reaches, so a run with the default drops nothing);
a batch, or part of a split batch, older than the bound when its training would start is
dropped, counted, and sampled again with the current weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rlvr.cluster.jobs import Job


def step_bound(config: Any) -> int:
    """The oldest a batch may be when trained on, in optimizer steps."""
    c = config.cluster
    return c.max_staleness * config.algo.inner_steps if c.max_staleness_steps is None else c.max_staleness_steps


def sample_versions(jobs: Sequence[Job]) -> torch.Tensor:
    """The weights version of each of the batch's samples [N] (the answered jobs' in order)."""
    return torch.cat([torch.full((job.size,), job.version, dtype=torch.long) for job in jobs])


def too_old(jobs: Sequence[Job], step: int, bound: int) -> list[Job]:
    """The jobs whose weights are more than ``bound`` optimizer steps behind ``step``."""
    return [job for job in jobs if step - job.version > bound]


def staleness_stats(step: int, versions: torch.Tensor, dropped: int, dropped_total: int) -> dict[str, float]:
    """``cluster/staleness_steps`` (mean) and ``_max`` over the samples ``versions`` [N] trained
    from ``step`` on; the batches (or parts) dropped as too old, this epoch and in all."""
    ages = (step - versions).double()  # [N]
    return {"cluster/staleness_steps": ages.mean().item(), "cluster/staleness_steps_max": ages.max().item(),
            "cluster/dropped_stale": float(dropped), "cluster/dropped_stale_total": float(dropped_total)}
