"""Where environment code runs (``EnvironmentHosts``), and the contract every call into it has: a value or an
``EnvironmentFailed`` (one line naming the call); whatever the code does (an exception of any kind, a wrong type, a
call past its time), it ends that episode alone. Environments live in worker processes (a ``WorkerPool``, episode
row ``i`` in worker ``i % workers``) or, with no workers, in the trainer's process; how each is bounded and
stopped: docs/explanation/isolation.md.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

from rlvr.base.errors import STOPPING, CutShort
from rlvr.base.workers import WorkerFailed, WorkerPool
from rlvr.environments.base import Environment, describe_error
from rlvr.environments.calls import EnvironmentHost, call_name, reply_limit

HARD_GRACE = 2.0  # seconds past a call's limit before its worker is killed
WORKERS = 64  # worker processes at most by default: episodes beyond share them
_POLL = 0.25  # seconds between looks at the run's stop request while waiting on workers
logger = logging.getLogger(__name__)


class EnvironmentFailed(Exception):
    """Environment code failed (raised, ran past its time, answered with the wrong type): one line."""


class EnvironmentHosts:
    """The environments of a batch's episodes, by row, in ``workers`` worker processes (0: in this process), each
    with ``memory_mb`` of address space to grow by. All requests of a batch are in flight at once, one at a time
    per worker; a call has ``seconds`` (``StepTimeout``), and a worker silent ``HARD_GRACE`` seconds past that is
    killed, every episode it hosts ending with the error. The run's stop signal ends the waits (``CutShort``)."""

    def __init__(self, make_env: Callable[[], Environment], workers: int = WORKERS, memory_mb: int | None = None
                 ) -> None:
        self.make_env, self.memory_mb = make_env, memory_mb
        self.max_chars: int | None = None  # an observation's characters kept (None: all)
        self.num_workers = workers if hasattr(os, "fork") else 0
        self._here = EnvironmentHost(make_env)  # with no workers
        self._pool: WorkerPool | None = None
        self._names: dict[int, str] = {}  # row -> its environment's class name, as its worker made it
        self._hosted: dict[int, set[int]] = collections.defaultdict(set)  # worker -> the rows it made
        self._lost: dict[int, str] = {}  # row -> why its environment is gone (its worker was stopped)

    def call(self, requests: Sequence[tuple[int, str, tuple]], seconds: float | None) -> list[Any]:
        """Each request's value, or its EnvironmentFailed; a row's requests run in order."""
        if not self.num_workers:
            outcomes = [self._here((request, seconds, self.max_chars)) for request in requests]
        else:
            outcomes = self._in_workers(requests, seconds)
        return [self._value(outcome, seconds) for outcome in outcomes]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        for slot in list(self._hosted):
            self._forget(slot, "its worker was stopped")
        self._here.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()

    @staticmethod
    def _value(outcome: tuple, seconds: float | None) -> Any:
        if outcome[0] == "ok":
            return outcome[1]
        _, message, timed_out = outcome
        what = message.split(": ")[0]
        if timed_out and what not in _TIMED_OUT:  # said at once: the next may cost as long
            _TIMED_OUT.add(what)
            logger.warning("%s ran past its time limit of %g s: its episode ends with an error; calls that hang "
                           "like it time out together, each batch (task.options.step_timeout or tool_timeout)",
                           what, seconds)
        return EnvironmentFailed(message)

    def _in_workers(self, requests: Sequence[tuple[int, str, tuple]], seconds: float | None) -> list[tuple]:
        if self._pool is None:
            self._pool = WorkerPool(EnvironmentHost(self.make_env), self.num_workers, "fork", role="environment",
                                    memory_mb=self.memory_mb, subreaper=True)
        outcomes: list[tuple | None] = [None] * len(requests)
        queues: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        for index, (row, _, _) in enumerate(requests):
            queues[row % self.num_workers].append(index)
        try:
            for slot in queues:
                self._send_next(slot, queues, requests, outcomes, seconds)
            while self._pool.busy():
                if STOPPING.is_set():
                    raise CutShort("a stop signal cut the episodes' waits on their environments short")
                for slot, index, answer in self._pool.wait(_POLL):
                    self._answered(slot, requests[index], answer, outcomes, index, seconds)
                    self._send_next(slot, queues, requests, outcomes, seconds)
        finally:
            for slot in self._pool.busy():  # its reply would be stale
                self._pool.stop(slot)
                self._forget(slot, "its worker was stopped mid-call")
        return outcomes  # type: ignore[return-value]

    def _send_next(self, slot: int, queues: dict, requests: Sequence, outcomes: list, seconds: float | None) -> None:
        while queues[slot]:
            index = queues[slot].popleft()
            row, operation, _ = requests[index]
            if operation == "make":
                self._lost.pop(row, None)
                self._hosted[slot].add(row)
            elif row in self._lost:
                outcomes[index] = ("failed", f"{self._what(requests[index])}: its environment is gone "
                                   f"({self._lost[row]})", False)
                continue
            try:
                self._pool.submit(slot, index, (requests[index], seconds, self.max_chars),
                                  math.inf if seconds is None else seconds + HARD_GRACE, reply_limit(self.max_chars))
                return
            except (OSError, pickle.PicklingError, TypeError, AttributeError) as err:
                outcomes[index] = ("failed", f"{self._what(requests[index])}: its arguments could not reach the "
                                   f"environment's worker: {describe_error(err, 200)}", False)

    def _answered(self, slot: int, request: tuple, answer: Any, outcomes: list, index: int, seconds: float | None
                  ) -> None:
        """A worker's answer as the request's outcome; a lost worker fails every later call to the environments
        it hosted."""
        if isinstance(answer, WorkerFailed):
            why = f"StepTimeout: no answer within {seconds:g} s (its worker was killed)" if answer.timed_out \
                else answer.message
            outcomes[index] = ("failed", f"{self._what(request)}: {why}", answer.timed_out)
            if answer.lost:
                self._forget(slot, f"its worker was stopped: {self._what(request)}: {why}")
            return
        outcomes[index] = answer
        if request[1] == "make" and answer[0] == "ok":
            self._names[request[0]] = answer[1]

    def _forget(self, slot: int, why: str) -> None:
        """The environments a stopped worker hosted are gone."""
        for row in self._hosted.pop(slot, ()):
            self._lost[row] = why

    def _what(self, request: tuple) -> str:
        row, operation, args = request
        return call_name(self._names.get(row), operation, args)


_TIMED_OUT: set[str] = set()  # the calls whose time-out this process has said
