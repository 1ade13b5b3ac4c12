"""Worker processes that run untrusted calls: reward functions, tool calls, environment code.

A ``WorkerPool`` starts workers that each run ``serve(request)`` for every request sent to them. A request past its
time limit, a worker that dies or an answer past its size limit comes back as a ``WorkerFailed`` naming why (the
worker is stopped with its process group and replaced on next use). Requests and answers cross by plain ``pickle``,
not multiprocessing's pickler (torch's reducers share tensors through a server whose socket is left behind in a
``pymp-*`` folder when a worker is killed). Nothing a pool starts outlives the trainer: docs/explanation/isolation.md.
"""

from __future__ import annotations

import collections
import contextlib
import io
import math
import multiprocessing
import multiprocessing.util
import os
import pickle
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from rlvr.base.errors import STOPPING
from rlvr.base.processes import (
    become_subreaper,
    die_with_parent,
    kill_descendants,
    kill_group,
    kill_tree,
    limit_address_space,
)

STARTUP_TIMEOUT = 60.0  # seconds a new worker may take to start (spawn re-imports torch)
_POSIX = os.name == "posix"  # process groups, and the reaper; elsewhere workers are killed alone
_READY = "ready"  # a worker's first message

# The trainer's ends of the worker and reaper pipes. A process forked from the trainer closes its copies at once:
# were a worker to keep them, the other workers and the reaper would not read EOF when the trainer dies.
trainer_ends: weakref.WeakSet = weakref.WeakSet()


def _close_trainer_ends() -> None:
    for end in list(trainer_ends):
        end.close()
    trainer_ends.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_trainer_ends)


@dataclass(frozen=True)
class WorkerFailed:
    """Why a request has no answer, in its place: ``message`` (one line), whether it ran past its time
    (``timed_out``), and whether its worker was stopped for it (``lost``)."""

    message: str
    timed_out: bool = False
    lost: bool = False

    def __str__(self) -> str:
        return self.message


class WorkerStartError(RuntimeError):
    """A worker did not start: it exited or did not say it was ready in time."""


_REAPER = """
import os, shutil, signal, sys
groups = set()
for line in sys.stdin.buffer:  # until EOF: the trainer closed the pool, exited or died
    pgid = int(line)
    (groups.add if pgid > 0 else groups.discard)(abs(pgid))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
for folder in sys.argv[1:]:  # the trainer's folders (multiprocessing's: only its clean exit removes it)
    shutil.rmtree(folder, ignore_errors=True)
"""


class Reaper:
    """A process that kills the process groups it is told about once the trainer is gone, and removes ``folders``."""

    def __init__(self, folders: Sequence[str]) -> None:
        read_end, write_end = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER, *folders],
            stdin=read_end,
            start_new_session=True,
        )
        os.close(read_end)
        self._pipe = io.FileIO(write_end, "w")  # unbuffered: nothing is left to flush in a fork
        trainer_ends.add(self._pipe)

    def watch(self, pgid: int) -> None:
        self._tell(f"{pgid}\n")

    def forget(self, pgid: int) -> None:  # the group was killed: its id may be reused
        self._tell(f"-{pgid}\n")

    def close(self) -> None:
        """Stop it without killing anything."""
        self._process.kill()
        self._process.wait()
        self._pipe.close()

    def _tell(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError):  # it was killed; PR_SET_PDEATHSIG and EOF still stop the workers
            self._pipe.write(line.encode())


class _Worker:
    """One worker process, its end of the pipe, and the request it runs."""

    def __init__(self, process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
        self.process, self.conn = process, conn
        self.started = time.monotonic()
        self.ready = False
        self.task: Hashable | None = None  # the key of the request it runs
        self.waiting: bytes | None = None  # a request given to it before it was ready
        self.timeout = self.deadline = math.inf
        self.max_reply: int | None = None


class WorkerPool:
    """Up to ``num_workers`` worker processes (slots), each started on first use, that run ``serve(request)``.

    serve:        run on each request in a worker; with "spawn" or "forkserver" it must pickle
    start_method: "fork", "spawn" or "forkserver"
    role:         what the workers run, in their process name and errors ("reward", "tool", ...)
    memory_mb:    megabytes of address space a worker may grow by (None: no cap)
    subreaper:    each worker is the subreaper of what its calls start, all killed with it
    folder:       a folder of the trainer's removed once the trainer is gone, even after a SIGKILL
    ``map`` runs requests on whichever worker is free; ``submit`` and ``wait`` run them on the slot named (a worker
    that keeps state between requests). Not thread-safe.
    """

    def __init__(self, serve: Callable[[Any], Any], num_workers: int, start_method: str = "fork", *,
                 role: str = "call", memory_mb: int | None = None, subreaper: bool = False,
                 folder: str | None = None) -> None:
        self._context = multiprocessing.get_context(start_method)
        self.serve, self.num_workers, self.role = serve, num_workers, role
        self.memory_mb, self.subreaper = memory_mb, subreaper
        self._workers: dict[int, _Worker] = {}
        # a forkserver listens on a socket in multiprocessing's pymp-* temp folder
        folders = [multiprocessing.util.get_temp_dir()] if start_method == "forkserver" else []
        self._reaper = Reaper([*folders, *([folder] if folder else [])]) if _POSIX else None

    def map(self, requests: Sequence[Any], timeout: float) -> list[Any]:
        """What ``serve`` returned for each request, or its WorkerFailed; each limited to ``timeout`` seconds from
        when a worker receives it."""
        answers: list[Any] = [None] * len(requests)
        pending = collections.deque(range(len(requests)))
        try:
            while pending or self.busy():
                for slot in range(self.num_workers):
                    worker = self._workers.get(slot) or self._start(slot)
                    if worker.ready and worker.task is None and pending:
                        try:
                            self.submit(slot, pending[0], requests[pending[0]], timeout)
                        except OSError:  # it died while idle (e.g. killed for memory): the call goes to a new one
                            self.stop(slot)
                            continue
                        pending.popleft()
                for _, index, answer in self.wait():
                    answers[index] = answer
        finally:
            for slot in self.busy():  # left mid-call by an exception: its answer would be stale
                self.stop(slot)
        return answers

    def submit(self, slot: int, key: Hashable, request: Any, timeout: float, max_reply: int | None = None) -> None:
        """Send ``request`` to the worker of ``slot``, ``key`` naming it in ``wait``; its answer at most ``max_reply``
        bytes pickled (None: any). Raises what pickling raises, or OSError where the worker is gone."""
        worker = self._workers.get(slot) or self._start(slot)
        message = pickle.dumps((request, max_reply))
        if worker.ready:
            worker.conn.send_bytes(message)
        else:
            worker.waiting = message
        worker.task, worker.max_reply = key, max_reply
        worker.timeout, worker.deadline = timeout, time.monotonic() + timeout

    def busy(self) -> list[int]:
        return [slot for slot, worker in self._workers.items() if worker.task is not None]

    def pids(self) -> list[int]:
        return [worker.process.pid for worker in self._workers.values()]

    def wait(self, poll: float = math.inf) -> list[tuple[int, Hashable, Any]]:
        """Wait (``poll`` seconds at most) for the first answer, start, death or deadline among the busy and starting
        workers: (slot, key, answer or WorkerFailed) of each request that ended. A worker that failed is stopped."""
        waiting = {slot: w for slot, w in self._workers.items() if w.task is not None or not w.ready}
        if not waiting:
            return []
        until = min(w.deadline if w.task is not None else w.started + STARTUP_TIMEOUT for w in waiting.values())
        readable = wait([w.conn for w in waiting.values()], timeout=max(0.0, min(until - time.monotonic(), poll)))
        now, ended = time.monotonic(), []
        for slot, worker in waiting.items():
            if worker.conn in readable:
                answer = self._receive(worker)
                if answer is _READY:  # started (a request that waited for it is sent now)
                    continue
                if isinstance(answer, WorkerFailed) and answer.lost:
                    self.stop(slot)
                ended.append((slot, worker.task, answer))
                worker.task, worker.deadline = None, math.inf
            elif worker.task is not None and now >= worker.deadline:
                ended.append((slot, worker.task, WorkerFailed(
                    f"no answer within {worker.timeout:g} s (its worker was killed)", True, True)))
                self.stop(slot)
            elif worker.task is None and now >= worker.started + STARTUP_TIMEOUT:
                raise WorkerStartError(f"a {self.role} worker did not start within {STARTUP_TIMEOUT:.0f} s")
        return ended

    def stop(self, slot: int) -> None:
        """Kill the worker of ``slot`` and its process group (with ``subreaper``: all its calls started, daemons)."""
        worker = self._workers.pop(slot)
        if self.subreaper and worker.process.exitcode is None:
            kill_tree(worker.process.pid)
        if self._reaper is not None:
            kill_group(worker.process.pid)  # it may not have made its group yet: then it started nothing
            self._reaper.forget(worker.process.pid)
        worker.process.kill()
        worker.process.join()
        worker.conn.close()

    def close(self) -> None:
        for slot in list(self._workers):
            self.stop(slot)
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

    def _start(self, slot: int) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        trainer_ends.add(parent_conn)  # before the fork, so that the worker closes its copy too
        # the process whose death kills the worker: a forkserver's child has the server as parent
        parent = None if self._context.get_start_method() == "forkserver" else os.getpid()
        process = self._context.Process(
            target=_worker_main, args=(child_conn, self.serve, parent, self.memory_mb, self.subreaper),
            name=f"rlvr-{self.role}-worker", daemon=True,
        )
        process.start()
        child_conn.close()
        if self._reaper is not None:
            lead_group(process.pid)  # here too, so that the group exists before it is watched or killed
            self._reaper.watch(process.pid)
        self._workers[slot] = _Worker(process, parent_conn)
        return self._workers[slot]

    def _receive(self, worker: _Worker) -> Any:
        """The worker's message: its start-up (a request that waited for it is sent now), its answer, or a
        WorkerFailed (lost) where it cannot be read."""
        try:
            message = pickle.loads(worker.conn.recv_bytes(worker.max_reply if worker.ready else None))
        except (EOFError, OSError):
            if not worker.conn.readable:  # an answer past the limit, left unread
                return WorkerFailed(f"its answer is more than the {worker.max_reply:,} bytes a worker may send",
                                    lost=True)
            worker.process.join(timeout=1.0)
            code = worker.process.exitcode
            if not worker.ready and worker.task is None:
                raise WorkerStartError(
                    f"a {self.role} worker exited while starting (exit code {code}); with 'spawn' or "
                    f"'forkserver' every {self.role} function must import in a fresh process") from None
            return WorkerFailed(f"lost its worker process (exit code {code})", lost=True)
        if worker.ready:
            return message
        worker.ready = True
        if worker.waiting is not None:
            try:
                worker.conn.send_bytes(worker.waiting)
            except OSError:
                worker.process.join(timeout=1.0)
                return WorkerFailed(f"lost its worker process (exit code {worker.process.exitcode})", lost=True)
            finally:
                worker.waiting = None
        return _READY


def lead_group(pid: int) -> None:
    """Make process ``pid`` (0: this one) the leader of a new process group."""
    # from the trainer: OSError where the worker already did it and exec'd (spawn), or is not its child
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)


def _worker_main(conn: Connection, serve: Callable[[Any], Any], parent: int | None, memory_mb: int | None,
                 subreaper: bool) -> None:
    if _POSIX:
        lead_group(0)
    die_with_parent(parent)
    if subreaper:
        become_subreaper()
    if memory_mb is not None:
        limit_address_space(memory_mb << 20, grow=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C and the run's stop are the trainer's; it stops its workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    STOPPING.clear()
    message = pickle.dumps(_READY)
    try:
        while True:
            try:
                conn.send_bytes(message)
                request, max_reply = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):  # the trainer is gone (it may die while this worker starts)
                return
            message = answer_bytes(serve(request), max_reply)
    finally:
        close = getattr(serve, "close", None)
        if callable(close):
            close()
        if subreaper:
            kill_descendants()


def answer_bytes(answer: Any, max_reply: int | None) -> bytes:
    """``answer`` pickled, or a WorkerFailed that says why it cannot be sent back."""
    try:
        data = pickle.dumps(answer)
    except Exception as err:  # noqa: BLE001 - a value of the called code's that does not pickle
        return pickle.dumps(WorkerFailed(f"its answer could not be sent back: {type(err).__name__}: {err}"[:300]))
    if max_reply is not None and len(data) > max_reply:
        return pickle.dumps(WorkerFailed(f"its answer is {len(data):,} bytes pickled, more than the "
                                         f"{max_reply:,} a worker may send back"))
    return data
