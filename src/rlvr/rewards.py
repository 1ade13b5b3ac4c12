"""Reward functions in the TRL form, how several combine, and how they run safely.

A reward function scores N = B*G completions at once (the form TRL's GRPOTrainer
calls, so functions move between the two)::

    fn(prompts: list[str], completions: list[str], **columns) -> list[float | None]

``columns`` are the prompt dicts' other keys (e.g. ``answer=[...]``), each a list of
length N aligned with ``completions``. Everything is passed by keyword, as TRL does, so
a function names the arguments and columns it needs and takes ``**kwargs`` for the rest
(``def f(completions, **kwargs)`` works). ``None`` abstains: the function has no opinion on that
completion (multi-task data, a grader that does not apply).

Combination. With weights w_f, the combined reward of a completion is
``sum_f w_f * r_f`` over the functions that did not abstain on it and have w_f != 0;
it is NaN (abstain) when no such function is left. TRL also skips None (a weighted
nansum) but gives 0.0 when every function abstains; here that case stays NaN so the
trainer leaves the completion out of its group instead of scoring it 0. A weight of
0 computes and reports a function (a metric) without making it part of the reward.

Required functions. A spec with ``required=True`` (a task's answer check; a user
function with ``required: true``) must score a completion for it to have a reward:
when it does not (an error, a timeout, an invalid value, or a deliberate None), the
completion's combined reward is NaN, whatever the others scored. Without the answer's
verdict the other terms (format, length) would rank the completion against its group
on a different scale. A required function with weight 0 still gates. Any other
function that does not score only drops its own term.

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
(about a second with torch). The workers themselves live in ``rlvr.reward_workers``.
"""

from __future__ import annotations

import collections
import importlib
import logging
import math
import multiprocessing
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from rlvr.reward_workers import (  # RewardError and RewardFn are part of this module's interface
    RewardError,
    RewardFn,
    WorkerPool,
    call_reward,
    check_picklable,
    judge_outcome,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewardSpec:
    """One reward function and how to run it.

    fn:      the function, in the TRL form above.
    weight:  its weight in the combined reward; 0 reports it without combining it.
    name:    its name in metrics and errors; defaults to the function's ``__name__``.
    timeout: seconds one call may take, enforced by running the function in a worker
             process that is killed past it; None runs it in-process, unlimited.
    required: when this function does not score a completion (error, timeout, invalid
             value or None), the completion's combined reward abstains (NaN) instead
             of combining the others.
    """

    fn: RewardFn
    weight: float = 1.0
    name: str = ""
    timeout: float | None = None
    required: bool = False

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

    rewards:      [N] float32 (or [B, G] from ``score_groups``), NaN = abstain (no function
                  left to combine, or a required one did not score).
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


def combine_rewards(
    per_function: torch.Tensor, weights: torch.Tensor, required: torch.Tensor | None = None
) -> torch.Tensor:
    """Weighted sum over the functions that scored each completion.

    per_function: [..., F] rewards, NaN = abstain. weights: [F]. required: [F] bool,
    default none. combined = sum_f w_f * r_f over f with r_f not NaN and w_f != 0; NaN
    where no f is left (everything abstained) or where a required f is NaN.
    Returns [...], the dtype of ``per_function``.
    """
    abstained = torch.isnan(per_function)  # [..., F]
    counted = ~abstained & (weights != 0)  # [..., F]
    total = torch.where(counted, per_function * weights, 0.0).sum(dim=-1)
    kept = counted.any(dim=-1)
    if required is not None:
        kept &= ~(abstained & required).any(dim=-1)
    return torch.where(kept, total, torch.nan)


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


class _Failure(NamedTuple):
    sample: int  # index of the completion in the batch
    kind: str  # "errors", "timeouts" or "invalid"
    what: str  # what went wrong: "raised KeyError", "returned nan, not a finite number"
    detail: str  # the traceback, if any


class RewardRunner:
    """Runs reward specs on batches of completions, safely (see the module docstring).

    strict:       raise RewardError on the first exception or invalid value.
    num_workers:  worker processes for specs with a timeout, started on first use.
    chunk_size:   completions per worker call; 1 isolates each completion, so a hang
                  or an error costs only the completion that caused it.
    start_method: how workers start: "fork" (default), "spawn" or "forkserver".
    A runner owns its workers: ``close()`` it (or use ``with``) when done. Not thread-safe.
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        *,
        strict: bool = False,
        num_workers: int = 2,
        chunk_size: int = 1,
        start_method: str = "fork",
    ) -> None:
        self.specs = tuple(specs)
        names = [spec.name for spec in self.specs]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if not self.specs:
            raise ValueError("RewardRunner needs at least one RewardSpec")
        if repeated:
            raise ValueError(f"reward names must be unique (pass name=...); repeated: {', '.join(repeated)}")
        if num_workers < 1 or chunk_size < 1:
            raise ValueError(f"num_workers and chunk_size must be >= 1, got {num_workers}, {chunk_size}")
        methods = multiprocessing.get_all_start_methods()
        if start_method not in methods:
            raise ValueError(f"unknown start_method {start_method!r}; allowed: {', '.join(methods)}")
        if start_method != "fork":  # fork workers inherit the functions; the others unpickle them
            for spec in self.specs:
                if spec.timeout is not None:  # only functions with a timeout go to workers
                    check_picklable(spec.fn, spec.name, start_method)
        self.strict = strict
        self.num_workers = num_workers
        self.chunk_size = chunk_size
        self.start_method = start_method
        self._weights = torch.tensor([spec.weight for spec in self.specs], dtype=torch.float32)
        self._required = torch.tensor([spec.required for spec in self.specs])
        self._pool: WorkerPool | None = None
        self._logged: set[tuple[str, str, str]] = set()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        columns: dict[str, Sequence[Any]] | None = None,
        only: Sequence[str] | None = None,
    ) -> RewardResult:
        """Score N completions: prompts [N], completions [N], columns name -> [N] values.

        only: names of the specs to run (default all), e.g. just the gold check.
        Returns rewards [N] and per_function [N, F] (F = the specs run).
        """
        columns = {name: list(values) for name, values in (columns or {}).items()}
        n = len(completions)
        for name, values in [("prompts", prompts), *columns.items()]:
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} completions")
        clash = {"prompts", "completions"} & columns.keys()
        if clash:
            raise ValueError(f"column names {sorted(clash)} clash with the reward function arguments")
        only = [only] if isinstance(only, str) else only
        unknown = set(only or ()) - set(self.names)
        if unknown:
            raise ValueError(f"unknown reward names {sorted(unknown)}; known: {', '.join(self.names)}")
        chosen = [i for i, name in enumerate(self.names) if only is None or name in only]
        values, stats = [], {}
        for index in chosen:
            spec = self.specs[index]
            spec_values, stats[spec.name] = self._run_spec(index, spec, list(prompts), list(completions), columns)
            values.append(spec_values)
        per_function = torch.tensor(values, dtype=torch.float32).reshape(len(chosen), n).T  # [N, F]
        combined = combine_rewards(per_function, self._weights[chosen], self._required[chosen])
        return RewardResult(combined, per_function, stats)

    def score_groups(
        self,
        prompts: Sequence[dict[str, Any]],
        responses: Sequence[Sequence[str]],
        only: Sequence[str] | None = None,
    ) -> RewardResult:
        """Score G responses to each of B prompts.

        prompts: B dicts, each with "prompt" (the text) and gold columns, the same keys in
        all; responses: B lists of G completions. Every key but "prompt" becomes a column,
        repeated for each response. Returns rewards [B, G] and per_function [B, G, F].
        """
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} groups of responses")
        group_size = len(responses[0]) if responses else 0
        if any(len(group) != group_size for group in responses):
            raise ValueError(f"groups differ in size: {sorted({len(group) for group in responses})}")
        keys = list(prompts[0]) if prompts else ["prompt"]
        for b, prompt in enumerate(prompts):
            if sorted(prompt) != sorted(keys) or "prompt" not in prompt:
                raise ValueError(f"prompt {b} has keys {sorted(prompt)}; expected 'prompt' and {sorted(keys)}")
        repeated = {key: [p[key] for p in prompts for _ in range(group_size)] for key in keys}
        texts = repeated.pop("prompt")
        completions = [completion for group in responses for completion in group]
        result = self(texts, completions, repeated, only)
        shape = (len(prompts), group_size)
        return RewardResult(
            result.rewards.reshape(shape), result.per_function.reshape(*shape, len(result.stats)), result.stats
        )

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        if self._pool is not None:
            self._close_pool()  # the finalizer: closes the pool once, now rather than at collection
            self._pool = None

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run_spec(
        self, index: int, spec: RewardSpec, prompts: list, completions: list, columns: dict[str, list]
    ) -> tuple[list[float], RewardStats]:
        """One function on the batch: its values [N] (NaN unless scored) and stats."""
        n = len(completions)
        size = max(n, 1) if spec.timeout is None else self.chunk_size
        calls = [range(start, min(start + size, n)) for start in range(0, n, size)]
        done, retry = [], []
        for call, outcome in zip(calls, self._execute(index, spec, calls, prompts, completions, columns)):
            # a batched call that raised is retried one completion at a time, so that only
            # the completions that raise abstain
            if outcome[0] == "error" and len(call) > 1:
                retry += [range(i, i + 1) for i in call]
            else:
                done.append((call, outcome))
        if retry:
            done += zip(retry, self._execute(index, spec, retry, prompts, completions, columns))
        values, kinds, failures = [math.nan] * n, ["scored"] * n, []
        for call, outcome in done:
            for sample, (kind, value, what, detail) in zip(call, judge_outcome(outcome, len(call))):
                values[sample], kinds[sample] = value, kind
                if kind in ("errors", "timeouts", "invalid"):
                    failures.append(_Failure(sample, kind, what, detail))
        self._report(spec, sorted(failures))
        counts = collections.Counter(kinds)
        scored = [value for value, kind in zip(values, kinds) if kind == "scored"]
        mean = math.fsum(scored) / len(scored) if scored else math.nan
        return values, RewardStats(
            mean, counts["scored"], counts["abstained"], counts["errors"], counts["timeouts"], counts["invalid"]
        )

    def _execute(
        self, index: int, spec: RewardSpec, calls: list[range], prompts: list, completions: list,
        columns: dict[str, list],
    ) -> list[tuple]:
        """The outcome of each call (a slice of the batch), in-process or in the workers."""
        requests = [
            (prompts[c.start : c.stop], completions[c.start : c.stop],
             {name: values[c.start : c.stop] for name, values in columns.items()})
            for c in calls
        ]
        if spec.timeout is None:
            return [call_reward(spec.fn, *request) for request in requests]
        if self._pool is None:
            fns = [s.fn if s.timeout is not None else None for s in self.specs]
            self._pool = WorkerPool(fns, self.num_workers, self.start_method)
            self._close_pool = weakref.finalize(self, self._pool.close)
        return self._pool.run(index, requests, spec.timeout)

    def _report(self, spec: RewardSpec, failures: list[_Failure]) -> None:
        """Raise the first failure (strict) or log the first of each kind once."""
        for failure in failures:
            if failure.kind == "timeouts":
                message = f"reward function {spec.name!r} took over {spec.timeout} s on completion {failure.sample}"
            else:  # what says it: "raised ValueError", "returned nan, not a finite number", ...
                message = f"reward function {spec.name!r} {failure.what} on completion {failure.sample}"
            if self.strict and failure.kind != "timeouts":
                raise RewardError(f"{message}\n{failure.detail}".rstrip())
            key = (spec.name, failure.kind, failure.what if failure.kind == "errors" else "")
            if key not in self._logged:
                self._logged.add(key)
                detail = f"\n{failure.detail}".rstrip()
                logger.warning("%s; it abstains (later ones alike are counted, not logged)%s", message, detail)
