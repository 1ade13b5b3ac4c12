"""How the rewards of several functions combine into one, and what a batch's result holds.

The combined reward is ``sum_f w_f * r_f`` in spec order over the functions that scored (NaN when none did, or when
a ``required`` function did not); weight 0 reports a function without adding it. Why, and how this differs from
TRL: docs/explanation/rewards.md."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlvr.rewards.calls import RewardFn


@dataclass(frozen=True)
class RewardSpec:
    """One reward function (the TRL form) and how to run it."""

    fn: RewardFn
    weight: float = 1.0  # 0 reports it without combining it
    name: str = ""  # in metrics and errors; defaults to the function's ``__name__``
    timeout: float | None = None  # seconds a call may take, in a worker killed past it; None: in-process, unlimited
    required: bool = False  # a completion it does not score abstains (NaN) instead of combining the others

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"reward function must be callable, got {type(self.fn).__name__}")
        if not math.isfinite(self.weight):
            raise ValueError(f"reward weight must be finite, got {self.weight}")
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"reward timeout must be positive seconds or None, got {self.timeout}")
        if not self.name:
            inner = getattr(self.fn, "func", self.fn)  # functools.partial names its function
            object.__setattr__(self, "name", getattr(inner, "__name__", type(inner).__name__))


@dataclass(frozen=True)
class RewardStats:
    """What one reward function did on one batch; the five counts (completions) add up to N."""

    mean: float  # of its scored values (NaN when none scored)
    scored: int  # given a finite number
    abstained: int  # given None
    errors: int  # lost to an exception (or to its worker dying)
    timeouts: int
    invalid: int  # lost to a bad return value (NaN, inf, not a number, wrong count)


@dataclass
class RewardResult:
    """Rewards of a batch, combined and per function; NaN = abstain."""

    rewards: torch.Tensor  # [N] float32 (or [B, G] from ``score_groups``)
    per_function: torch.Tensor  # [N, F] float32 (or [B, G, F]), column f from the f-th spec
    stats: dict[str, RewardStats]  # in spec order
    failures: dict[str, str] = field(default_factory=dict)  # name -> its first failure, one line ("raised KeyError: 0")
    # [N] (flat, row b*G + g): what the scores said of each completion ("judge: <its reply>"; "" for none)
    notes: list[str] = field(default_factory=list)

    def column(self, name: str) -> torch.Tensor:
        """One function's rewards, [N] (or [B, G]), NaN where it abstained."""
        return self.per_function[..., list(self.stats).index(name)]

    def reshape(self, *shape: int) -> RewardResult:
        """The same result with the completions in ``shape``, e.g. [N] -> [B, G]."""
        return RewardResult(self.rewards.reshape(shape), self.per_function.reshape(*shape, len(self.stats)), self.stats,
                            self.failures, self.notes)

    def metrics(self, names: Sequence[str] | None = None) -> dict[str, float]:
        """Flat metrics: per function in ``names`` (default all) its stats, overall abstentions and all-abstain
        groups; an empty ``names`` gives none."""
        if names is not None and not names:
            return {}
        out: dict[str, float] = {}
        for name, stats in self.stats.items():
            if names is not None and name not in names:
                continue
            for key, value in vars(stats).items():
                out[f"reward/{name}/{key}"] = float(value)
        abstained = torch.isnan(self.rewards)
        out["reward/abstained"] = float(abstained.sum())
        if self.rewards.dim() == 2:  # [B, G]: a group with no reward gives no learning signal
            out["reward/abstained_groups"] = float(abstained.all(dim=1).sum())
        return out


def combine_rewards(
    per_function: torch.Tensor, weights: torch.Tensor, required: torch.Tensor | None = None
) -> torch.Tensor:
    """per_function [..., F] (NaN = abstain), weights [F], required [F] bool -> [...]: sum_f w_f * r_f over f with
    r_f not NaN and w_f != 0; NaN where no f is left or where a required f is NaN."""
    abstained = torch.isnan(per_function)  # [..., F]
    counted = ~abstained & (weights != 0)  # [..., F]
    total = torch.where(counted, per_function * weights, 0.0).sum(dim=-1)
    kept = counted.any(dim=-1)
    if required is not None:
        kept &= ~(abstained & required).any(dim=-1)
    return torch.where(kept, total, torch.nan)


def most_failed_message(name: str, failed: int, total: int, first: str) -> str:
    """What to say of a function that failed on ``failed`` of ``total`` completions."""
    return (f"reward function {name!r} failed on {failed / total:.0%} of its completions ({failed} of {total}); "
            f"first failure: {first}")


def failure_warnings(records: Iterable[dict[str, Any]], most: float = 0.5) -> list[str]:
    """Warnings for a run's summary: each reward function that failed on more than ``most`` of its completions over
    the run, from the train records' ``reward/<name>/*`` counts (each epoch once) and first failure line."""
    counted: dict[str, list[float]] = {}  # name -> [failed, total]
    first: dict[str, str] = {}
    seen_epochs = set()
    for record in records:
        if record.get("kind") != "train" or record["epoch"] in seen_epochs:
            continue  # the inner steps of an epoch repeat its batch's numbers
        seen_epochs.add(record["epoch"])
        for key, value in record.items():
            parts = key.split("/")
            if len(parts) < 3 or parts[0] != "reward":
                continue
            name, field_name = "/".join(parts[1:-1]), parts[-1]
            if field_name == "failure":
                first.setdefault(name, value)
            elif field_name in _COUNTS:
                counts = counted.setdefault(name, [0.0, 0.0])
                counts[0] += value if field_name in _FAILED else 0.0
                counts[1] += value
    return [most_failed_message(name, round(failed), round(total), first.get(name, "(not recorded)"))
            for name, (failed, total) in counted.items() if total and failed > most * total]


_FAILED = ("errors", "timeouts", "invalid")
_COUNTS = ("scored", "abstained", *_FAILED)  # RewardStats' counts: together, the completions of a batch
