"""Running reward specs on a batch of completions, safely.

The design: ``docs/explanation/rewards.md`` (``rlvr.rewards.runner``).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import multiprocessing
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from rlvr.base.workers import WorkerFailed, WorkerPool, WorkerStartError
from rlvr.rewards.calls import RewardError, TrainerState, call_reward, check_picklable, judge_outcome
from rlvr.rewards.combine import RewardResult, RewardSpec, RewardStats, combine_rewards, most_failed_message

logger = logging.getLogger(__name__)

# the reward functions' own arguments, which no column may be named
ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state")


class _Failure(NamedTuple):
    sample: int  # index of the completion in the batch
    kind: str  # "errors", "timeouts" or "invalid"
    what: str  # what went wrong: "raised KeyError", "returned nan, not a finite number"
    detail: str  # the traceback, if any


class RewardRunner:
    """Runs reward specs on batches of completions, safely; ``strict`` raises RewardError on the first exception or
    invalid value. Specs with a timeout run in ``num_workers`` processes (started on first use), ``chunk_size``
    completions a call: 1 isolates each, so a hang or an error costs only the completion that caused it. A runner
    owns its workers: ``close()`` it (or use ``with``) when done. Not thread-safe.
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
        self.names = tuple(spec.name for spec in self.specs)
        repeated = sorted({name for name in self.names if self.names.count(name) > 1})
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
        required = [spec.required for spec in self.specs]
        self._required = torch.tensor(required) if any(required) else None
        self._pool: WorkerPool | None = None
        self._logged: set[tuple[str, str, str]] = set()
        self._most_failed: set[str] = set()  # functions already logged as failing on most of a batch

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        columns: dict[str, Sequence[Any]] | None = None,
        only: Sequence[str] | None = None,
        *,
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: TrainerState | None = None,
    ) -> RewardResult:
        """Score N completions: prompts [N], completions [N], columns name -> [N] values (any sequences: each call
        gets a slice). only: the specs to run (default all). completion_ids ([N] lists of token ids) and
        trainer_state reach every function when given, as TRL passes them. Returns rewards [N] and per_function
        [N, F] (F = the specs run).
        """
        columns = dict(columns or {})
        chosen = self._check_call(prompts, completions, columns, only)
        if completion_ids is not None:
            if len(completion_ids) != len(completions):
                raise ValueError(f"completion_ids has {len(completion_ids)} entries for {len(completions)} completions")
            columns["completion_ids"] = completion_ids
        constants = {} if trainer_state is None else {"trainer_state": trainer_state}
        n = len(completions)
        values, stats, failures, notes = [], {}, {}, [""] * n
        for index in chosen:
            spec = self.specs[index]
            spec_values, stats[spec.name], first, spec_notes = self._run_spec(index, spec, prompts, completions,
                                                                             columns, constants)
            values.append(torch.as_tensor(spec_values, dtype=torch.float32))
            if first:
                failures[spec.name] = first
            for i, note in spec_notes.items():
                notes[i] = f"{notes[i]}; {spec.name}: {note}" if notes[i] else f"{spec.name}: {note}"
        per_function = (torch.stack(values) if values else torch.empty(0, n)).T  # [N, F]
        weights, required = self._weights, self._required
        if len(chosen) < len(self.specs):
            weights, required = weights[chosen], None if required is None else required[chosen]
        combined = combine_rewards(per_function, weights, required)
        return RewardResult(combined, per_function, stats, failures, notes)

    def score_groups(
        self,
        prompts: Sequence[dict[str, Any]],
        responses: Sequence[Sequence[str]],
        only: Sequence[str] | None = None,
        *,
        completion_ids: Sequence[Sequence[int]] | None = None,
        trainer_state: TrainerState | None = None,
        completion_columns: dict[str, Sequence[Any]] | None = None,
    ) -> RewardResult:
        """Score G responses to each of B prompts: B dicts with "prompt" (text or a chat) and gold columns, the same
        keys in all, each key but "prompt" a column repeated for each response; a chat prompt's completions reach
        the functions as one assistant message each, as TRL gives them. completion_ids and completion_columns
        (name -> values) have B*G entries, row b*G + g. Returns rewards [B, G] and per_function [B, G, F].
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
        for name, values in (completion_columns or {}).items():
            if name in repeated or name in ARGUMENTS:
                raise ValueError(f"completion column {name!r} clashes with a prompt column or an argument")
            if len(values) != len(prompts) * group_size:
                raise ValueError(f"completion column {name!r} has {len(values)} values for "
                                 f"{len(prompts) * group_size} responses")
            repeated[name] = values
        completions = [as_completion(completion, prompt["prompt"]) for prompt, group in zip(prompts, responses)
                       for completion in group]
        result = self(texts, completions, repeated, only, completion_ids=completion_ids, trainer_state=trainer_state)
        return result.reshape(len(prompts), group_size)

    def close(self) -> None:
        """Stop the worker processes (a later call starts new ones)."""
        if self._pool is not None:
            self._close_pool()  # the finalizer: closes the pool once, now rather than at collection
            self._pool = None

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_call(
        self, prompts: Sequence, completions: Sequence, columns: dict[str, Sequence], only: Sequence[str] | None
    ) -> list[int]:
        """The indices of the specs to run; a ValueError for misaligned or clashing inputs."""
        n = len(completions)
        for name, values in [("prompts", prompts), *columns.items()]:
            if len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for {n} completions")
        clash = set(ARGUMENTS) & columns.keys()
        if clash:
            raise ValueError(f"column names {sorted(clash)} clash with the reward function arguments")
        if only is None:
            return list(range(len(self.specs)))
        only = [only] if isinstance(only, str) else only
        unknown = set(only) - set(self.names)
        if unknown:
            raise ValueError(f"unknown reward names {sorted(unknown)}; known: {', '.join(self.names)}")
        return [i for i, name in enumerate(self.names) if name in only]

    def _run_spec(
        self, index: int, spec: RewardSpec, prompts: Sequence, completions: Sequence, columns: dict[str, Sequence],
        constants: dict[str, Any],
    ) -> tuple[list[float] | torch.Tensor, RewardStats, str, dict[int, str]]:
        """One function on the batch: its values [N] (NaN unless scored), stats, first failure ("" when none) and
        the notes of its scored values (completion -> note)."""
        n = len(completions)
        size = max(n, 1) if spec.timeout is None else self.chunk_size
        calls = [range(start, min(start + size, n)) for start in range(0, n, size)]
        outcomes = self._execute(index, spec, calls, prompts, completions, columns, constants)
        if len(calls) == 1 and outcomes[0][0] == "scored":  # a tensor of finite floats: all scored at once
            return outcomes[0][1], RewardStats(outcomes[0][2], n, 0, 0, 0, 0), "", {}
        done, retry = [], []
        for call, outcome in zip(calls, outcomes):
            # a batched call that raised is retried one completion at a time, so only the ones that raise abstain
            if outcome[0] == "error" and len(call) > 1:
                retry += [range(i, i + 1) for i in call]
            else:
                done.append((call, outcome))
        if retry:
            done += zip(retry, self._execute(index, spec, retry, prompts, completions, columns, constants))
        return self._tally(spec, n, done)

    def _tally(self, spec: RewardSpec, n: int, done: list[tuple[range, tuple]]
               ) -> tuple[list[float], RewardStats, str, dict[int, str]]:
        """``_run_spec``'s answer from the outcomes of calls that cover the batch; failures are reported."""
        values, kinds, failures, notes = [math.nan] * n, ["scored"] * n, [], {}
        for call, outcome in done:
            for sample, (kind, value, what, detail) in zip(call, judge_outcome(outcome, len(call))):
                values[sample], kinds[sample] = value, kind
                if kind in ("errors", "timeouts", "invalid"):
                    failures.append(_Failure(sample, kind, what, detail))
                elif kind == "scored" and detail:
                    notes[sample] = detail
        failures.sort()
        self._report(spec, failures)
        first = _failure_line(spec, failures[0]) if failures else ""
        if 2 * len(failures) > n and spec.name not in self._most_failed:
            self._most_failed.add(spec.name)
            logger.warning("%s; its completions abstain", most_failed_message(spec.name, len(failures), n, first))
        counts = collections.Counter(kinds)
        scored = [value for value, kind in zip(values, kinds) if kind == "scored"]
        mean = math.fsum(scored) / len(scored) if scored else math.nan
        return values, RewardStats(
            mean, counts["scored"], counts["abstained"], counts["errors"], counts["timeouts"], counts["invalid"]
        ), first, notes

    def _execute(
        self, index: int, spec: RewardSpec, calls: list[range], prompts: Sequence, completions: Sequence,
        columns: dict[str, Sequence], constants: dict[str, Any],
    ) -> list[tuple]:
        """The outcome of each call (a slice of the batch; ``constants`` go to every call whole)."""
        requests = [
            (_part(prompts, c), _part(completions, c),
             {**{name: _part(values, c) for name, values in columns.items()}, **constants})
            for c in calls
        ]
        if spec.timeout is None:
            return [call_reward(spec.fn, *request, in_process=True) for request in requests]
        if self._pool is None:
            fns = [s.fn if s.timeout is not None else None for s in self.specs]
            self._pool = WorkerPool(functools.partial(_serve_reward, fns), self.num_workers, self.start_method,
                                    role="reward")
            self._close_pool = weakref.finalize(self, self._pool.close)
        # only plain lists cross to a worker, whatever sequence type the caller passed
        plain = [(index, (list(p), list(c), {name: v if name in constants else list(v) for name, v in cols.items()}))
                 for p, c, cols in requests]
        try:
            answers = self._pool.map(plain, spec.timeout)
        except WorkerStartError as err:
            raise RewardError(str(err)) from None
        return [_outcome(answer) for answer in answers]

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


def _part(values: Sequence, call: range) -> Sequence:
    """The slice of ``values`` one call gets."""
    return values[call.start : call.stop]


def as_completion(text: Any, prompt: Any) -> Any:
    """A completion as reward functions get it: for a chat prompt one assistant message in a list, as TRL gives it."""
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


def _failure_line(spec: RewardSpec, failure: _Failure) -> str:
    """One line saying how a completion failed: "raised KeyError: 0", "took over 5.0 s", ..."""
    if failure.kind == "timeouts":
        return f"took over {spec.timeout} s"
    last = failure.detail.strip().splitlines()[-1:] if failure.kind == "errors" else []
    if last and failure.what.startswith("raised "):  # the exception's own line: its type and message
        return f"raised {last[0].strip()}"
    return failure.what


def _serve_reward(fns: list, request: tuple) -> tuple:
    """A reward call in a worker: ``request`` is (the function's index in ``fns``, its arguments)."""
    index, arguments = request
    return call_reward(fns[index], *arguments)


def _outcome(answer: Any) -> tuple:
    """A worker's answer as a call's outcome: the pool's failures as a timeout or an error."""
    if not isinstance(answer, WorkerFailed):
        return answer
    return ("timeout",) if answer.timed_out else ("error", answer.message, "")
