"""Where environment code runs, and the contract every call into it has.

A call into environment code (making the environment, ``reset``, ``step``, ``tools()``, one
of its own tools) is a request to the host of its episode's environment, and answers with a
value or an ``EnvironmentFailed`` (one line naming the call). Whatever the code does, it
ends that episode alone: an exception of any kind (SystemExit, KeyboardInterrupt and
RecursionError too), a wrong type, or a call past its time limit.

``EnvironmentHosts(make_env, workers)`` keeps the environments of a batch's episodes:

  * ``workers`` > 0 (the default, where ``fork`` exists): in that many worker processes
    forked from the trainer, episode row ``i`` in worker ``i % workers`` (with as many
    workers as episodes, each episode has one of its own). The factory runs in the
    worker. All requests of a batch are in flight at once, one at a time per worker, so
    episodes that hang time out together, not one after another. A call has ``seconds``
    in the worker (``operations.StepTimeout``, raised again every half second, so that
    ``except Exception`` does not swallow it); a worker that has not answered
    ``HARD_GRACE`` seconds after that, whatever its code does (a C loop, a swallowed
    BaseException), is killed with its process group and every episode it hosts ends with
    the error. The run's first stop signal (``rlvr.base.errors.STOPPING``) ends the waits at
    once: the workers in mid-call are killed and ``CutShort`` is raised (the trainer drops
    the batch). Workers die with the trainer (as reward workers do:
    ``rlvr.rewards.workers``). A worker is the subreaper of the processes its environments
    start: when it is stopped (a time-out, ``close()``) they are all killed, daemons that
    left its session too (``rlvr.base.processes.kill_tree``), and it may grow by
    ``memory_mb`` of address space (``task.options.environment_memory_mb``).
  * ``workers`` = 0: in the trainer's process, one call after another, each under
    SIGALRM alone (``operations.time_limit``: in the main thread only; code that blocks signals or
    loops in C is not stopped).

A value crosses from a worker by ``pickle`` (a prompt, an observation, a tool's text): one
that does not pickle fails the call, named. A prompt, an observation or a tool's text is
cut past ``max_chars`` (what an episode could hold, ``operations.episode_chars``;
``start_episodes`` sets it) in the worker, and the trainer reads at most
``operations.reply_limit`` bytes of an answer: one past it ends its episode with the
error, and its worker is replaced.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import multiprocessing
import os
import pickle
import signal
import time
from collections.abc import Callable, Sequence
from typing import Any

from rlvr.base.errors import STOPPING, CutShort
from rlvr.base.processes import kill_tree
from rlvr.environments.base import Environment, describe_error
from rlvr.environments.operations import call_name, reply_limit, run_request, worker_main
from rlvr.rewards.workers import Reaper, lead_group, trainer_ends

HARD_GRACE = 2.0  # seconds past a call's limit before its worker is killed
WORKERS = 64  # worker processes at most by default: episodes beyond share them
_POLL = 0.25  # seconds between looks at the run's stop request while waiting on workers
logger = logging.getLogger(__name__)


class EnvironmentFailed(Exception):
    """Environment code failed (raised, ran past its time, answered with the wrong type): one line."""


class _Worker:
    """One worker process, its end of the pipe, and the request it runs."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Any) -> None:
        self.process, self.conn = process, conn
        self.task: int | None = None  # index of the request in flight
        self.deadline = math.inf


class EnvironmentHosts:
    """The environments of a batch's episodes, by row, made by ``make_env`` in ``workers``
    worker processes (0: in this process), each with ``memory_mb`` of address space to grow
    by (None: no cap); see the module docstring."""

    def __init__(self, make_env: Callable[[], Environment], workers: int = WORKERS, memory_mb: int | None = None
                 ) -> None:
        self.make_env, self.memory_mb = make_env, memory_mb
        self.max_chars: int | None = None  # an observation's characters kept (None: all)
        self.num_workers = workers if hasattr(os, "fork") else 0
        self._envs: dict[int, Any] = {}  # in this process
        self._workers: dict[int, _Worker] = {}
        self._names: dict[int, str] = {}  # row -> its environment's class name, as its worker made it
        self._hosted: dict[int, set[int]] = collections.defaultdict(set)  # worker -> the rows it made
        self._lost: dict[int, str] = {}  # row -> why its environment is gone (its worker was stopped)
        self._reaper: Reaper | None = None

    def call(self, requests: Sequence[tuple[int, str, tuple]], seconds: float | None) -> list[Any]:
        """Each request's value, or its EnvironmentFailed; a row's requests run in order."""
        if not self.num_workers:
            outcomes = [run_request(self._envs, self.make_env, request, seconds, self.max_chars)
                        for request in requests]
        else:
            outcomes = self._in_workers(requests, seconds)
        return [self._value(outcome, seconds) for outcome in outcomes]

    def close(self) -> None:
        for slot in list(self._workers):
            self._stop(slot)
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None
        self._envs.clear()

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
        outcomes: list[tuple | None] = [None] * len(requests)
        queues: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        for index, (row, _, _) in enumerate(requests):
            queues[row % self.num_workers].append(index)
        try:
            for slot in queues:
                self._send_next(slot, queues, requests, outcomes, seconds)
            while any(w.task is not None for w in self._workers.values()):
                if STOPPING.is_set():
                    raise CutShort("a stop signal cut the episodes' waits on their environments short")
                self._collect(queues, requests, outcomes, seconds)
        finally:
            for slot in [s for s, w in self._workers.items() if w.task is not None]:
                self._stop(slot, "its worker was stopped mid-call")  # its reply would be stale
        return outcomes  # type: ignore[return-value]

    def _send_next(self, slot: int, queues: dict, requests: Sequence, outcomes: list, seconds: float | None) -> None:
        if not queues[slot]:
            return
        index = queues[slot].popleft()
        row, operation, _ = requests[index]
        if operation == "make":
            self._lost.pop(row, None)
            self._hosted[slot].add(row)
        elif row in self._lost:
            outcomes[index] = ("failed", f"{self._what(requests[index])}: its environment is gone ({self._lost[row]})",
                               False)
            self._send_next(slot, queues, requests, outcomes, seconds)
            return
        worker = self._workers.get(slot) or self._start(slot)
        try:
            worker.conn.send_bytes(pickle.dumps((requests[index], seconds, self.max_chars)))
        except (OSError, pickle.PicklingError, TypeError, AttributeError) as err:
            outcomes[index] = ("failed", f"{self._what(requests[index])}: its arguments could not reach the "
                               f"environment's worker: {describe_error(err, 200)}", False)
            self._send_next(slot, queues, requests, outcomes, seconds)
            return
        worker.task = index
        worker.deadline = math.inf if seconds is None else time.monotonic() + seconds + HARD_GRACE

    def _collect(self, queues: dict, requests: Sequence, outcomes: list, seconds: float | None) -> None:
        """Wait for the first reply, death or deadline among the busy workers, and handle it."""
        from multiprocessing.connection import wait

        busy = {slot: w for slot, w in self._workers.items() if w.task is not None}
        until = min(w.deadline for w in busy.values())
        ready = wait([w.conn for w in busy.values()], timeout=max(0.0, min(until - time.monotonic(), _POLL)))
        now = time.monotonic()
        for slot, worker in busy.items():
            if worker.conn in ready:
                try:
                    outcomes[worker.task] = pickle.loads(worker.conn.recv_bytes(reply_limit(self.max_chars)))
                except (EOFError, OSError):
                    if not worker.conn.readable:  # an answer past the limit, left unread
                        why = f"its answer is more than the {reply_limit(self.max_chars):,} bytes a worker may send"
                    else:
                        worker.process.join(timeout=1.0)
                        why = f"lost its worker process (exit code {worker.process.exitcode})"
                    self._lose(slot, queues, requests, outcomes, why, seconds)
                    continue
                row, operation, _ = requests[worker.task]
                if operation == "make" and outcomes[worker.task][0] == "ok":
                    self._names[row] = outcomes[worker.task][1]
                worker.task, worker.deadline = None, math.inf
                self._send_next(slot, queues, requests, outcomes, seconds)
            elif now >= worker.deadline:
                self._lose(slot, queues, requests, outcomes,
                           f"StepTimeout: no answer within {seconds:g} s (its worker was killed)", seconds, True)

    def _lose(self, slot: int, queues: dict, requests: Sequence, outcomes: list, why: str, seconds: float | None,
              timed_out: bool = False) -> None:
        """A worker gone (killed here or dead): its call fails with ``why``, the rest of its
        queue and every later call to an environment it hosted with the worker named."""
        worker = self._workers[slot]
        request = requests[worker.task]
        outcomes[worker.task] = ("failed", f"{self._what(request)}: {why}", timed_out)
        self._stop(slot, f"its worker was stopped: {self._what(request)}: {why}")
        self._send_next(slot, queues, requests, outcomes, seconds)  # the rest: on a new worker, or failed

    def _what(self, request: tuple) -> str:
        row, operation, args = request
        return call_name(self._names.get(row), operation, args)

    def _start(self, slot: int) -> _Worker:
        if self._reaper is None and os.name == "posix":
            self._reaper = Reaper(None)
        context = multiprocessing.get_context("fork")
        parent_conn, child_conn = context.Pipe()
        trainer_ends.add(parent_conn)  # before the fork, so that the worker closes its copy too
        process = context.Process(target=worker_main, args=(child_conn, self.make_env, os.getpid(), self.memory_mb),
                                  name="rlvr-environment-worker", daemon=True)
        process.start()
        child_conn.close()
        if self._reaper is not None:
            lead_group(process.pid)
            self._reaper.watch(process.pid)
        self._workers[slot] = _Worker(process, parent_conn)
        return self._workers[slot]

    def _stop(self, slot: int, why: str = "its worker was stopped") -> None:
        """Kill a worker and every process in its group; the environments it hosted are gone."""
        worker = self._workers.pop(slot)
        for row in self._hosted.pop(slot, ()):
            self._lost[row] = why
        if worker.process.exitcode is None:
            kill_tree(worker.process.pid)  # what its environments started, daemons too (it is their subreaper)
        if self._reaper is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGKILL)
            self._reaper.forget(worker.process.pid)
        worker.process.kill()
        worker.process.join()
        worker.conn.close()


_TIMED_OUT: set[str] = set()  # the calls whose time-out this process has said
