"""Running reward calls: in-process, or in worker processes each call under a time limit.

The outcome of one call (a slice of the batch) is a tuple:
  ("ok", returned value)                the function returned (its value not yet checked)
  ("error", exception type, traceback)  it raised, or its worker died
  ("timeout",)                          it ran past its limit; its worker was killed
``judge_outcome`` turns an outcome into what each completion of the call gets. Why
workers, and how they start (fork, spawn, forkserver): see ``rlvr.rewards``.
"""

from __future__ import annotations

import collections
import math
import multiprocessing
import numbers
import pickle
import signal
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

RewardFn = Callable[..., Sequence[Any]]


class RewardError(RuntimeError):
    """A reward function failed in strict mode, could not be loaded, or could not run."""


def call_reward(fn: RewardFn, prompts: list, completions: list, columns: dict[str, list]) -> tuple:
    """("ok", returned value) or ("error", exception type, traceback) of one call."""
    try:
        return ("ok", fn(prompts=prompts, completions=completions, **columns))  # keywords, as TRL calls
    except Exception as exc:  # not swallowed: the runner counts it, logs it once or raises it (strict)
        return ("error", type(exc).__qualname__, traceback.format_exc())


def check_picklable(fn: RewardFn, name: str, start_method: str) -> None:
    """Raise RewardError unless ``fn`` can be sent to a worker started with ``start_method``."""
    try:
        pickle.dumps(fn)
    except Exception as exc:  # pickle raises several types; all mean the same here
        raise RewardError(
            f"reward function {name!r} cannot be sent to a {start_method!r} worker "
            f"({type(exc).__name__}: {exc}); use a module-level function (or a "
            "functools.partial of one), or start_method='fork'"
        ) from exc


def judge_outcome(outcome: tuple, size: int) -> list[tuple[str, float, str, str]]:
    """(kind, value, what, detail) of each completion of a call from the call's outcome."""
    if outcome[0] == "timeout":
        return [("timeouts", math.nan, "", "")] * size
    if outcome[0] == "error":
        return [("errors", math.nan, outcome[1], outcome[2])] * size
    returned = outcome[1]
    if not isinstance(returned, (list, tuple)):
        return [("invalid", math.nan, f"returned a {type(returned).__name__}, not a list", "")] * size
    if len(returned) != size:
        return [("invalid", math.nan, f"returned {len(returned)} values for {size} completions", "")] * size
    return [_judge_value(value) for value in returned]


def _judge_value(value: Any) -> tuple[str, float, str, str]:
    if value is None:
        return ("abstained", math.nan, "", "")
    if not isinstance(value, numbers.Real):  # bool, int, float and numpy scalars pass; str does not
        return ("invalid", math.nan, f"returned {value!r:.60} ({type(value).__name__}), not a number", "")
    try:
        as_float = float(value)
    except OverflowError:  # an int past float range, whose repr may even be refused
        return ("invalid", math.nan, f"returned an int of {int(value).bit_length()} bits, too large", "")
    if not math.isfinite(as_float):
        return ("invalid", math.nan, f"returned {value!r:.60}, not a finite number", "")
    return ("scored", as_float, "", "")


_STARTUP_TIMEOUT = 60.0  # seconds a new worker may take to start (spawn re-imports torch)


class _Worker:
    """One worker process, its end of the pipe, and the call it runs."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.started = time.monotonic()
        self.ready = False
        self.task: int | None = None  # index of the request it runs
        self.deadline = math.inf


class WorkerPool:
    """Worker processes that run reward calls, each call under a time limit."""

    def __init__(self, fns: list[RewardFn | None], num_workers: int, start_method: str) -> None:
        self._context = multiprocessing.get_context(start_method)
        self._fns = fns
        self._workers = [self._start() for _ in range(num_workers)]

    def run(self, index: int, requests: list[tuple], timeout: float) -> list[tuple | None]:
        """The outcome of ``fns[index](*request)`` for each request, each call limited to
        ``timeout`` seconds from when a worker receives it."""
        outcomes: list[tuple | None] = [None] * len(requests)
        pending = collections.deque(range(len(requests)))
        try:
            while pending or any(worker.task is not None for worker in self._workers):
                for slot, worker in enumerate(self._workers):
                    if worker.ready and worker.task is None and pending:
                        self._send(slot, pending, (index, requests[pending[0]]), timeout)
                self._collect(outcomes)
        finally:
            for slot, worker in enumerate(self._workers):
                if worker.task is not None:  # left mid-call by an exception: its reply would be stale
                    self._replace(slot)
        return outcomes

    def close(self) -> None:
        for worker in self._workers:
            worker.process.kill()
            worker.process.join()
            worker.conn.close()
        self._workers = []

    def _start(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=_worker_main, args=(child_conn, self._fns), name="rlvr-reward-worker", daemon=True
        )
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _replace(self, slot: int) -> None:
        worker = self._workers[slot]
        worker.process.kill()
        worker.process.join()
        worker.conn.close()
        self._workers[slot] = self._start()

    def _send(self, slot: int, pending: collections.deque, request: tuple, timeout: float) -> None:
        worker = self._workers[slot]
        try:
            worker.conn.send(request)
        except OSError:  # it died while idle (e.g. killed for memory): the call goes to a new one
            self._replace(slot)
            return
        worker.task = pending.popleft()
        worker.deadline = time.monotonic() + timeout

    def _collect(self, outcomes: list[tuple | None]) -> None:
        """Wait for the first reply, start, death or deadline among the workers, and handle it."""
        waiting = [worker for worker in self._workers if worker.task is not None or not worker.ready]
        until = min(w.deadline if w.ready else w.started + _STARTUP_TIMEOUT for w in waiting)
        readable = wait([worker.conn for worker in waiting], timeout=max(0.0, until - time.monotonic()))
        now = time.monotonic()
        for slot, worker in enumerate(self._workers):
            if worker.conn in readable:
                self._receive(slot, outcomes)
            elif worker.task is not None and now >= worker.deadline:
                outcomes[worker.task] = ("timeout",)
                self._replace(slot)
            elif not worker.ready and now >= worker.started + _STARTUP_TIMEOUT:
                raise RewardError(f"a reward worker did not start within {_STARTUP_TIMEOUT:.0f} s")

    def _receive(self, slot: int, outcomes: list[tuple | None]) -> None:
        worker = self._workers[slot]
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            worker.process.join(timeout=1.0)
            code = worker.process.exitcode
            if not worker.ready:
                raise RewardError(
                    f"a reward worker exited while starting (exit code {code}); with "
                    "'spawn' or 'forkserver' every reward function must import in a fresh process"
                ) from None
            outcomes[worker.task] = ("error", "WorkerDied", f"its worker process died (exit code {code})")
            self._replace(slot)
            return
        if not worker.ready:  # the start-up message
            worker.ready = True
            return
        outcomes[worker.task] = message
        worker.task, worker.deadline = None, math.inf


def _worker_main(conn: Connection, fns: list[RewardFn | None]) -> None:
    """A worker's loop: receive (function index, arguments), send back the outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's; it stops its workers
    conn.send(("ready",))
    while True:
        try:
            index, request = conn.recv()
        except EOFError:  # the runner is gone
            return
        outcome = call_reward(fns[index], *request)
        try:
            conn.send(outcome)
        except Exception as exc:  # the result does not pickle: report that instead of dying
            conn.send(("error", type(exc).__qualname__, f"could not send the result back: {exc}"))
