"""Reward functions in the TRL form, how several combine, and how they run safely.

A reward function scores N = B*G completions at once (the form TRL's GRPOTrainer
calls, so functions move between the two)::

    fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]

``columns`` are the prompt dicts' other keys (e.g. ``answer=[...]``), each a list of
length N aligned with ``completions``. A function names the columns it needs and takes
``**kwargs`` for the rest. ``None`` abstains: the function has no opinion on that
completion (multi-task data, a grader that does not apply).

Combination. With weights w_f, the combined reward of a completion is
``sum_f w_f * r_f`` over the functions that did not abstain on it and have w_f != 0;
it is NaN (abstain) when no such function is left. TRL also skips None (a weighted
nansum) but gives 0.0 when every function abstains; here that case stays NaN so the
trainer leaves the completion out of its group instead of scoring it 0. A weight of
0 computes and reports a function (a metric) without making it part of the reward.

Safe execution (``RewardRunner``). A reward function is user code that sees model
output, so it may raise, hang, or return garbage:
  * raises on a completion: that completion abstains for that function, counted as an
    error; the first traceback of each (function, exception type) is logged once.
    A batched call that raises is retried one completion at a time, so only the
    completions that raise abstain.
  * returns NaN, inf, a non-number or the wrong number of items: those completions
    abstain, counted as invalid.
  * hangs: a spec with ``timeout`` runs in worker processes; a call still running at
    its limit has its worker killed and replaced, its completions abstain, counted as
    timeouts. Killing a process is the only limit that also stops code that never
    returns to the interpreter (a C loop, a huge integer power), and it works from any
    thread, unlike SIGALRM.
  * ``strict=True`` turns the first exception or invalid value into a ``RewardError``
    naming the function (for developing reward functions). Timeouts stay counted
    abstentions even then: a pathological input hangs a correct grader.
``timeout=None`` runs the function in-process, the fast path for cheap pure functions.

Workers start with ``fork`` by default: they inherit the functions, so lambdas and
closures work, and a restart after a timeout costs milliseconds. Functions run in a
forked worker must not use torch threads or CUDA (reward code rarely does); with
``start_method="spawn"`` or ``"forkserver"`` functions must be picklable (module-level
or ``functools.partial`` of one) and each worker start re-imports their modules
(about a second with torch).
"""

from __future__ import annotations

import collections
import importlib
import logging
import math
import multiprocessing
import numbers
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, NamedTuple

import torch

logger = logging.getLogger(__name__)

RewardFn = Callable[..., Sequence[Any]]


class RewardError(RuntimeError):
    """A reward function failed in strict mode, could not be loaded, or could not run."""


@dataclass(frozen=True)
class RewardSpec:
    """One reward function and how to run it.

    fn:      the function, in the TRL form above.
    weight:  its weight in the combined reward; 0 reports it without combining it.
    name:    its name in metrics and errors; defaults to the function's ``__name__``.
    timeout: seconds one call may take, enforced by running the function in a worker
             process that is killed past it; None runs it in-process, unlimited.
    """

    fn: RewardFn
    weight: float = 1.0
    name: str = ""
    timeout: float | None = None

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
    """What one reward function did on one batch; the five counts add up to N.

    mean:      mean of its scored values (NaN when none scored).
    scored:    completions it gave a finite number.
    abstained: completions it returned None for.
    errors:    completions lost to an exception (or to its worker dying).
    timeouts:  completions lost to a call past the time limit.
    invalid:   completions lost to a bad return value (NaN, inf, not a number, wrong count).
    """

    mean: float
    scored: int
    abstained: int
    errors: int
    timeouts: int
    invalid: int


@dataclass
class RewardResult:
    """Rewards of a batch, combined and per function.

    rewards:      [N] float32 (or [B, G] from ``score_groups``), NaN = abstain.
    per_function: [N, F] float32 (or [B, G, F]), column f from the f-th spec, NaN = abstain.
    stats:        function name -> its RewardStats, in spec order.
    """

    rewards: torch.Tensor
    per_function: torch.Tensor
    stats: dict[str, RewardStats]

    def column(self, name: str) -> torch.Tensor:
        """One function's rewards, [N] (or [B, G]), NaN where it abstained."""
        return self.per_function[..., list(self.stats).index(name)]

    def metrics(self) -> dict[str, float]:
        """Flat metrics: per function its stats, overall abstentions (and all-abstain groups)."""
        out: dict[str, float] = {}
        for name, stats in self.stats.items():
            for key, value in vars(stats).items():
                out[f"reward/{name}/{key}"] = float(value)
        abstained = torch.isnan(self.rewards)
        out["reward/abstained"] = float(abstained.sum())
        if self.rewards.dim() == 2:  # [B, G]: a group with no reward gives no learning signal
            out["reward/abstained_groups"] = float(abstained.all(dim=1).sum())
        return out


def combine_rewards(per_function: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted sum over the functions that scored each completion.

    per_function: [..., F] rewards, NaN = abstain. weights: [F].
    combined = sum_f w_f * r_f over f with r_f not NaN and w_f != 0; NaN where no f is
    left (everything abstained). Returns [...], the dtype of ``per_function``.
    """
    counted = ~torch.isnan(per_function) & (weights != 0)  # [..., F]
    total = torch.where(counted, per_function * weights, 0.0).sum(dim=-1)
    return torch.where(counted.any(dim=-1), total, torch.nan)


def load_reward_function(path: str) -> RewardFn:
    """Import the reward function named ``"module:function"`` (only that name).

    Raises RewardError for a malformed path, a missing module, a module that fails to
    import, a missing attribute or one that is not callable.
    """
    module_name, _, attr = path.partition(":")
    dotted = module_name.split(".")
    if not attr or not all(part.isidentifier() for part in dotted) or not attr.isidentifier():
        raise RewardError(
            f"reward function {path!r}: expected 'module:function', "
            "e.g. 'rlvr.tasks.gsm8k:answer_reward'"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in {".".join(dotted[: i + 1]) for i in range(len(dotted))}:
            raise RewardError(f"reward function {path!r}: no module named {exc.name!r}") from exc
        raise RewardError(f"reward function {path!r}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:  # the module's own import-time failure: say which import, keep the cause
        raise RewardError(
            f"reward function {path!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, attr):
        defined = sorted(
            name
            for name, value in vars(module).items()
            if callable(value) and not name.startswith("_")
            and getattr(value, "__module__", None) == module_name
        )
        known = f"; it defines: {', '.join(defined)}" if defined else ""
        raise RewardError(f"reward function {path!r}: module {module_name!r} has no {attr!r}{known}")
    fn = getattr(module, attr)
    if not callable(fn):
        raise RewardError(
            f"reward function {path!r}: {attr!r} is a {type(fn).__name__}, not a callable"
        )
    return fn
