"""Staleness in optimizer steps: how old the weights that sampled a batch are when the trainer trains on it, and the
bound past which a batch is not trained on.

Each sample carries the version (optimizer step count) of the weights that sampled it: its ``Job``'s ``version``. A
batch's age is the optimizer step of its first inner step minus that version. ``cluster.max_staleness_steps`` bounds
it (null: ``max_staleness`` x ``algo.inner_steps``, the age a batch submitted k epochs ahead reaches), and
``cluster.stale_policy`` keeps the bound:

- admit (the default): a batch is submitted only as far ahead as it can be trained within the bound (``lookahead``),
  so none is ever too old and nothing sampled is thrown away;
- drop: batches go ``max_staleness`` epochs ahead; a batch (or part) older than the bound when its training would
  start is dropped, counted, and sampled again with the current weights. What is dropped depends on when and how fast
  it was sampled, so the trained data can drift from the sampled (``Shift``: ``async/length_shift``, ``solve_shift``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass
from typing import Any

import torch

from rlvr.cluster.jobs import Job


def step_bound(config: Any) -> int:
    """The oldest a batch may be when trained on, in optimizer steps."""
    c = config.cluster
    return c.max_staleness * config.algo.inner_steps if c.max_staleness_steps is None else c.max_staleness_steps


def lookahead(config: Any) -> int:
    """How many epochs ahead of its training a batch is submitted: ``max_staleness`` under drop; under admit, no
    further than the bound lets it be trained (0: each batch sampled with the newest weights, from the run's own
    generator, as a synchronous run samples it)."""
    c = config.cluster
    if c.stale_policy == "drop":
        return c.max_staleness
    return min(c.max_staleness, step_bound(config) // config.algo.inner_steps)


def sample_versions(jobs: Sequence[Job]) -> torch.Tensor:
    """The weights version of each of the batch's samples [N] (the answered jobs' in order)."""
    return torch.cat([torch.full((job.size,), job.version, dtype=torch.long) for job in jobs])


def too_old(jobs: Sequence[Job], step: int, bound: int) -> list[Job]:
    """The jobs whose weights are more than ``bound`` optimizer steps behind ``step``."""
    return [job for job in jobs if step - job.version > bound]


def staleness_stats(step: int, versions: torch.Tensor, dropped: int, dropped_total: int) -> dict[str, float]:
    """``cluster/staleness_steps`` (mean) and ``_max`` over the samples ``versions`` [N] trained from ``step`` on;
    the batches (or parts) dropped as too old, this epoch and in all."""
    ages = (step - versions).double()  # [N]
    return {"cluster/staleness_steps": ages.mean().item(), "cluster/staleness_steps_max": ages.max().item(),
            "cluster/dropped_stale": float(dropped), "cluster/dropped_stale_total": float(dropped_total)}


def token_stats(step: int, samples: Any) -> dict[str, Any]:
    """With partial rollouts (``samples.token_versions``): the policy tokens trained from ``step`` on by the version
    that sampled them (``cluster/tokens_by_version``, a mapping), their age in steps (mean, max) and the share sampled
    by weights newer than those their response started with (``cluster/tokens_continued``); {} without."""
    if samples.token_versions is None:
        return {}
    versions = samples.token_versions[samples.policy_mask]  # [tokens]
    started = samples.token_versions[:, :1].expand_as(samples.token_versions)[samples.policy_mask]
    if versions.numel() == 0:
        return {}
    found, counts = versions.unique(return_counts=True)
    ages = (step - versions).double()
    return {"cluster/tokens_by_version": {str(v): int(c) for v, c in zip(found.tolist(), counts.tolist())},
            "cluster/token_age_mean": ages.mean().item(), "cluster/token_age_max": ages.max().item(),
            "cluster/tokens_continued": (versions > started).double().mean().item()}


@dataclass
class Totals:
    """Responses, their policy tokens and how many were solved, summed over batches."""

    responses: float = 0.0
    tokens: float = 0.0
    solved: float = 0.0

    def __add__(self, other: Totals) -> Totals:
        return Totals(self.responses + other.responses, self.tokens + other.tokens, self.solved + other.solved)


class Shift:
    """What was sampled against what was trained, over the run: ``Totals`` for every batch sampled (dropped ones
    included) and for those trained on. The means' differences (trained minus sampled) show a pipeline that trains on
    a biased share of what it samples: 0 when nothing is dropped."""

    def __init__(self, state: dict[str, list[float]] | None = None) -> None:
        self.sampled, self.trained = (Totals(), Totals()) if state is None else (
            Totals(*state["sampled"]), Totals(*state["trained"]))

    def add(self, samples: Any, grades: Any, trained: bool) -> None:
        """A batch (or part) sampled; ``trained``: and trained on (else dropped)."""
        tokens = samples.per_episode(samples.policy_mask.sum(-1).double())  # [N] policy tokens per response
        batch = Totals(float(tokens.numel()), tokens.sum().item(), grades.correct.double().sum().item())
        self.sampled += batch
        if trained:
            self.trained += batch

    def stats(self) -> dict[str, float]:
        """``async/length_*`` (mean policy tokens per response) and ``async/solve_*`` (solve rate), sampled and
        trained, and their shift (trained minus sampled)."""
        out = {}
        for name, field in (("length", "tokens"), ("solve", "solved")):
            sampled = getattr(self.sampled, field) / max(self.sampled.responses, 1.0)
            trained = getattr(self.trained, field) / max(self.trained.responses, 1.0)
            out.update({f"async/{name}_sampled": sampled, f"async/{name}_trained": trained,
                        f"async/{name}_shift": trained - sampled})
        return out

    def state(self) -> dict[str, list[float]]:
        """[responses, tokens, solved] sampled and trained: a checkpoint's lists."""
        return {"sampled": list(astuple(self.sampled)), "trained": list(astuple(self.trained))}
