"""``rlvr compare``'s runs side by side: the positional toy's runs in worker processes, as many at once as there are
cores; other runs one after another."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from pathlib import Path
from typing import Any

from rlvr.base.errors import RunError, Stopped
from rlvr.base.processes import die_with
from rlvr.batch.record import Record
from rlvr.config import Config
from rlvr.runs.launch import start_or_continue
from rlvr.runs.stops import STOP_SIGNALS


def side_by_side(configs: list[Config]) -> list[tuple[list[Record], Path, str]]:
    """``start_or_continue`` of each run: for the positional toy as many at once as there are cores (a process each,
    each on one torch thread, ``threads``), for others one after another here (a model, Ray, a GPU are not for sharing).
    A stop signal here reaches every run, once: each stops with a checkpoint, and runs not begun do not begin. A run
    that fails is named on stderr when the others have ended; then its error is raised."""
    # the cores this process may use (taskset, a cpuset), not the machine's
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    workers = min(len(configs), cores) if configs[0].policy.name == "positional" else 1
    if workers == 1:
        return [start_or_continue(config) for config in configs]
    # a fork server that imported torch and rlvr once: each worker is a fork of it, not a fresh import (seconds)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["rlvr.runs.compare"])
    with ProcessPoolExecutor(workers, context, initializer=_worker_start, initargs=(os.getpid(),)) as pool:
        futures = [pool.submit(_worker_run, config) for config in configs]
        stopped = None
        while True:
            try:
                wait(futures)
                break
            except KeyboardInterrupt as err:  # Ctrl-C, or Stopped (SIGTERM): on to each run, as often as it comes
                signum = getattr(err, "signum", signal.SIGINT)
                stopped = Stopped(f"stopped by {signal.Signals(signum).name}: the runs stopped at checkpoints; "
                                  "the same rlvr compare again goes on from them", signum)
                for future in futures:
                    future.cancel()
                for child in multiprocessing.active_children():
                    with suppress(OSError):
                        os.kill(child.pid, signum)
    if stopped:
        raise stopped
    errors = [(config, f.exception()) for config, f in zip(configs, futures) if f.exception() is not None]
    cut = [config.name for config, err in errors if isinstance(err, BrokenProcessPool)]
    errors = [(config, err) for config, err in errors if not isinstance(err, BrokenProcessPool)]
    for config, err in errors:
        print(f"rlvr: run {config.name} failed: {type(err).__name__}: {err}", file=sys.stderr)
    if cut:  # a worker killed (out of memory, SIGKILL) ends the pool's others too
        raise RunError(f"a run's process ended without an error (killed?): {', '.join(cut)} did not finish; the same "
                       "rlvr compare again goes on from their checkpoints")
    if errors:
        raise errors[0][1]
    return [f.result() for f in futures]


class _NotATerminal:
    """stderr, saying it is no terminal: each run's progress comes as plain lines, since the bars of several processes
    would draw over each other."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_stop_signal: list[int] = []  # the stop signal a worker received between runs


def _worker_start(driver: int) -> None:
    """A ``side_by_side`` worker: its stop signals come from the driver alone (a group of its own, out of a terminal's
    Ctrl-C), and it dies with the driver."""
    os.setpgid(0, 0)
    die_with(driver)
    sys.stderr = _NotATerminal(sys.stderr)
    for signum in STOP_SIGNALS:  # a run's own handling takes over while it runs
        signal.signal(signum, lambda signum, frame: _stop_signal.append(signum))


def _worker_run(config: Config) -> tuple[list[Record], Path, str]:
    if _stop_signal:
        raise Stopped(f"{config.name}: not started, stopped by {signal.Signals(_stop_signal[0]).name}",
                      _stop_signal[0])
    try:
        return start_or_continue(config)
    except Stopped as err:  # the next run in this worker does not begin
        _stop_signal.append(err.signum)
        raise
