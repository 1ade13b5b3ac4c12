"""Worker processes that run reward calls, each call under a time limit.

A call's request and outcome go through plain ``pickle``, not multiprocessing's pickler,
where torch registers reducers that share a tensor by passing its file descriptor through a
server whose socket lives in a ``pymp-*`` temp folder (left behind when the worker
is killed).

Nothing a pool starts outlives the trainer, however the trainer ends (SIGKILL too):
  * each worker leads its own process group, and a worker is stopped (timeout, close)
    by killing its group, so the processes its calls started die with it (unless
    they left the group, e.g. with ``start_new_session``);
  * every process forked from the trainer closes the trainer's ends of the pipes at
    once (``os.register_at_fork``), so an idle worker reads EOF and exits when the
    trainer is gone;
  * on Linux a worker asks the kernel to SIGKILL it when its parent dies
    (``PR_SET_PDEATHSIG``), which stops it even mid-call. The kernel ties this to the
    thread that started the worker: a runner called from a thread that then ends loses
    its workers, which are replaced (a call in flight counts as an error);
  * a reaper, a small Python process in a session of its own (out of reach of Ctrl-C
    and of signals to the trainer's group), is told each worker's group through a
    pipe and kills those groups when the pipe reads EOF, which is when the trainer
    exits or dies. It is what stops a call's children when the trainer is SIGKILLed,
    and it stops the workers too where there is no ``PR_SET_PDEATHSIG`` (macOS). With
    "forkserver" it also removes the trainer's ``pymp-*`` folder, where the server's
    socket lives and which only a clean exit of the trainer removes.
Why workers, and how they start (fork, spawn, forkserver): see ``rlvr.rewards.runner``.
"""

from __future__ import annotations

import collections
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
from multiprocessing.connection import Connection, wait

from rlvr.base.processes import die_with_parent
from rlvr.rewards.calls import RewardError, RewardFn, call_reward

_STARTUP_TIMEOUT = 60.0  # seconds a new worker may take to start (spawn re-imports torch)
_POSIX = os.name == "posix"  # process groups, and the reaper; elsewhere workers are killed alone

# The trainer's ends of the worker and reaper pipes. A process forked from the trainer
# closes its copies at once: were a worker to keep them, the other workers and the
# reaper would not read EOF when the trainer dies.
trainer_ends: weakref.WeakSet = weakref.WeakSet()


def _close_trainer_ends() -> None:
    for end in list(trainer_ends):
        end.close()
    trainer_ends.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_trainer_ends)


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
if len(sys.argv) > 1:  # the trainer's multiprocessing temp folder, which only its clean exit removes
    shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


class Reaper:
    """A process that kills the process groups it is told about once the trainer is gone,
    and removes ``tempdir`` (a folder of the trainer's) if given."""

    def __init__(self, tempdir: str | None) -> None:
        read_end, write_end = os.pipe()
        self._process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _REAPER, *([tempdir] if tempdir else [])],
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
        try:
            self._pipe.write(line.encode())
        except BrokenPipeError:  # it was killed; PR_SET_PDEATHSIG and EOF still stop the workers
            pass


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
        # a forkserver listens on a socket in multiprocessing's pymp-* temp folder
        tempdir = multiprocessing.util.get_temp_dir() if start_method == "forkserver" else None
        self._reaper = Reaper(tempdir) if _POSIX else None
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
            self._stop(worker)
        self._workers = []
        if self._reaper is not None:
            self._reaper.close()
            self._reaper = None

    def _start(self) -> _Worker:
        parent_conn, child_conn = self._context.Pipe()
        trainer_ends.add(parent_conn)  # before the fork, so that the worker closes its copy too
        # the process whose death kills the worker: a forkserver's child has the server as parent
        parent = None if self._context.get_start_method() == "forkserver" else os.getpid()
        process = self._context.Process(
            target=_worker_main, args=(child_conn, self._fns, parent), name="rlvr-reward-worker", daemon=True
        )
        process.start()
        child_conn.close()
        if self._reaper is not None:
            lead_group(process.pid)  # here too, so that the group exists before it is watched or killed
            self._reaper.watch(process.pid)
        return _Worker(process, parent_conn)

    def _stop(self, worker: _Worker) -> None:
        """Kill a worker and every process in its group."""
        if self._reaper is not None:
            try:
                os.killpg(worker.process.pid, signal.SIGKILL)
            except ProcessLookupError:  # it has not made its group yet, so it started nothing
                pass
            self._reaper.forget(worker.process.pid)
        worker.process.kill()
        worker.process.join()
        worker.conn.close()

    def _replace(self, slot: int) -> None:
        self._stop(self._workers[slot])
        self._workers[slot] = self._start()

    def _send(self, slot: int, pending: collections.deque, request: tuple, timeout: float) -> None:
        worker = self._workers[slot]
        try:
            worker.conn.send_bytes(pickle.dumps(request))
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
            message = pickle.loads(worker.conn.recv_bytes())
        except (EOFError, OSError):
            worker.process.join(timeout=1.0)
            code = worker.process.exitcode
            if not worker.ready:
                raise RewardError(
                    f"a reward worker exited while starting (exit code {code}); with "
                    "'spawn' or 'forkserver' every reward function must import in a fresh process"
                ) from None
            outcomes[worker.task] = ("error", f"lost its worker process (exit code {code})", "")
            self._replace(slot)
            return
        if not worker.ready:  # the start-up message
            worker.ready = True
            return
        outcomes[worker.task] = message
        worker.task, worker.deadline = None, math.inf


def lead_group(pid: int) -> None:
    """Make process ``pid`` (0: this one) the leader of a new process group."""
    try:
        os.setpgid(pid, pid)
    except OSError:  # from the trainer: the worker already did it and exec'd (spawn), or is not its child
        pass


def _worker_main(conn: Connection, fns: list[RewardFn | None], parent: int | None) -> None:
    """A worker's loop: receive (function index, arguments), send back the outcome."""
    if _POSIX:
        lead_group(0)
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's; it stops its workers
    outcome: tuple = ("ready",)
    while True:
        try:
            conn.send_bytes(pickle.dumps(outcome))
            index, request = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError):  # the trainer is gone (it may die while this worker starts)
            return
        outcome = call_reward(fns[index], *request)
