"""Tools a policy calls during an episode, and ``ToolBox``, which runs a turn's calls under limits.

A tool (``TOOLS``: a calculator, a Python runner) is a function that returns text. It sees model output, so it may
raise, hang, fork, allocate without end or print a gigabyte; ``ToolBox`` makes each a failed ``ToolResult`` whose
message the policy reads. The calls of one turn of all running episodes run in parallel in a ``WorkerPool``, each in
a child process its worker forks for it, under the limits listed in docs/explanation/isolation.md. The ``python``
tool runs the policy's program with ``rlvr.environments.sandbox.run_python``, under the box's limits.
"""

from __future__ import annotations

import functools
import inspect
import io
import json
import os
import select
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from rlvr.base.processes import block_network, die_with_parent, jail, kill_descendants, killed_by, limit_address_space
from rlvr.base.workers import WorkerFailed, WorkerPool
from rlvr.environments.base import ToolCall, ToolError, ToolResult, describe_error
from rlvr.environments.sandbox import run_python
from rlvr.environments.tool_parsing import calculator, call_arguments

_GRACE = 5.0  # seconds past a call's timeout before the pool kills a worker stuck outside the call
_MESSAGE_CHARS = 300  # an exception's message is cut to this many characters


@dataclass(frozen=True)
class _Limits:
    timeout: float
    memory_mb: int
    max_output_chars: int


class ToolBox:
    """Runs tool calls in ``num_workers`` worker processes (started on first use), each call under ``timeout``
    seconds, ``memory_mb`` added to its worker's address space and ``max_output_chars`` of output (printed, then
    returned). With a ``start_method`` other than "fork" the tools must be picklable. A box owns its workers and a
    temp folder: ``close()`` it (or use ``with``). Not thread-safe.
    """

    def __init__(self, tools: Mapping[str, Callable[..., Any]], *, timeout: float = 10.0, memory_mb: int = 1024,
                 max_output_chars: int = 4000, num_workers: int = 2, start_method: str = "fork") -> None:
        if not (timeout > 0 and min(memory_mb, max_output_chars, num_workers) >= 1):
            raise ValueError(f"timeout must be > 0, memory_mb, max_output_chars, num_workers >= 1; got "
                             f"{timeout}, {memory_mb}, {max_output_chars}, {num_workers}")
        self.tools = dict(tools)
        self.names = tuple(self.tools)  # what parse_tool_calls takes as known
        self.limits = _Limits(timeout, memory_mb, max_output_chars)
        if any(getattr(fn, "runs_programs", False) for fn in self.tools.values()):
            jail()  # found (or its absence said) before any work
        self._folder = tempfile.mkdtemp(prefix="rlvr-tools-")
        serve = functools.partial(_run_call, tools=self.tools, limits=self.limits, folder=self._folder)
        self._pool: WorkerPool | None = WorkerPool(serve, num_workers, start_method, role="tool", subreaper=True,
                                                   folder=self._folder)  # workers start on first use

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """The result of each call, in order; calls of unknown tools or with bad arguments fail without running."""
        results: list[ToolResult | None] = [self._refusal(call) for call in calls]
        todo = [index for index, result in enumerate(results) if result is None]
        answers = self._pool.map([calls[i] for i in todo], self.limits.timeout + _GRACE) if todo else []
        for index, answer in zip(todo, answers):
            if isinstance(answer, WorkerFailed):
                answer = ToolResult(calls[index].name, f"timed out after {self.limits.timeout:g}s" if answer.timed_out
                                    else f"its worker failed: {answer}", True)
            results[index] = answer
        return [result for result in results if result is not None]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        shutil.rmtree(self._folder, ignore_errors=True)

    def __enter__(self) -> ToolBox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _refusal(self, call: ToolCall) -> ToolResult | None:
        """A failed result for a call that must not run, else None."""
        if call.name not in self.tools:
            return ToolResult(call.name, f"unknown tool {call.name!r}; tools: {', '.join(sorted(self.names))}", True)
        args, kwargs = call_arguments(call.arguments)
        try:
            inspect.signature(self.tools[call.name]).bind(*args, **kwargs)
        except TypeError as err:
            return ToolResult(call.name, f"bad arguments: {err}", True)
        except ValueError:  # a callable without a signature: its call will tell
            pass
        return None

def _run_call(call: ToolCall, *, tools: Mapping[str, Callable[..., Any]], limits: _Limits, folder: str
              ) -> ToolResult:
    """One tool call, run in a worker (the subreaper of what the call starts, all killed when it ends): in a child
    process forked for it, in a scratch folder under ``folder``."""
    if getattr(tools[call.name], "runs_programs", False):
        jail()  # probed once in this worker, not in each call's process
    scratch = tempfile.mkdtemp(dir=folder)
    result_path = scratch + ".json"  # beside the scratch folder, which the call may empty
    pid = os.fork()
    if pid == 0:
        _child(tools[call.name], call.arguments, limits, scratch, result_path)
    try:
        code = _wait(pid, limits.timeout)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    finally:
        kill_descendants()
        shutil.rmtree(scratch, ignore_errors=True)
    if code is None:
        return ToolResult(call.name, f"timed out after {limits.timeout:g}s", True)
    if code < 0:
        return ToolResult(call.name, f"its process was killed by {killed_by(code)}", True)
    if code > 0 or not os.path.exists(result_path):
        return ToolResult(call.name, f"its process exited with code {code} and no result", True)
    with open(result_path, encoding="utf-8") as file:
        written = json.load(file)
    os.remove(result_path)
    return ToolResult(call.name, written["content"], written["error"])


def _child(fn: Callable[..., Any], arguments: Mapping[str, Any], limits: _Limits, scratch: str, result_path: str
           ) -> NoReturn:
    """The forked process of one call: limits, then the call, then its result written."""
    global _BOX_LIMITS
    code = 1
    try:
        die_with_parent()  # the worker's end (the trainer's, a SIGKILL) is this call's end
        _BOX_LIMITS = limits
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # what it prints by any route but sys.stdout goes nowhere
            os.dup2(null, fd)
        os.chdir(scratch)
        tempfile.tempdir = os.environ["TMPDIR"] = scratch
        limit_address_space(limits.memory_mb * 2**20, grow=True)
        block_network("tools have no network access")
        content, error = _call(fn, arguments, limits.max_output_chars)
        _write_result(result_path, content, error)
        code = 0
    finally:
        os._exit(code)


def _call(fn: Callable[..., Any], arguments: Mapping[str, Any], max_chars: int) -> tuple[str, bool]:
    """(content, error) of one call: what it printed, then what it returned."""
    printed = _BoundedText(max_chars + 1)
    sys.stdout = printed
    try:
        args, kwargs = call_arguments(arguments)
        returned = fn(*args, **kwargs)
        shown = "" if returned is None else str(returned)
        text, total = printed.text + shown[: max_chars + 1], printed.count + len(shown)
    except ToolError as exc:  # the tool's own account of its failure, shown whole
        text, room = str(exc), max_chars + _MESSAGE_CHARS  # the output it shows, and a line on why
        return text if len(text) <= room else f"{text[:room]}\n[message cut: {len(text)} characters]", True
    except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the call failed, the process ends anyway
        return describe_error(exc, _MESSAGE_CHARS), True
    finally:
        sys.stdout = sys.__stdout__
    if total > max_chars:
        return f"{text[:max_chars]}\n[output cut: {total} characters, the limit is {max_chars}]", True
    return text, False


class _BoundedText(io.TextIOBase):
    """A text stream that keeps the first ``limit`` characters written to it and counts all."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.count, self._parts = limit, 0, []

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._parts.append(text[: max(0, self.limit - self.count)])
        self.count += len(text)
        return len(text)

    @property
    def text(self) -> str:
        return "".join(self._parts)


def _write_result(path: str, content: str, error: bool) -> None:
    with open(path + ".part", "w", encoding="utf-8") as file:
        json.dump({"content": content, "error": error}, file)
    os.replace(path + ".part", path)  # a process killed while writing leaves no half result


def _wait(pid: int, timeout: float) -> int | None:
    """Wait for child ``pid`` to end: its exit code (-N: killed by signal N), or None at the timeout."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfd (macOS, Linux before 5.3): poll
        deadline = time.monotonic() + timeout
        while (reaped := os.waitpid(pid, os.WNOHANG))[0] == 0:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)
        return os.waitstatus_to_exitcode(reaped[1])
    try:
        if not select.select([fd], [], [], timeout)[0]:
            return None
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


_BOX_LIMITS: _Limits | None = None  # in a tool call's process: the limits of the box that runs it


def python(code: str) -> str:
    """Run a Python program and return what it printed (with the error, if it failed).

    Args:
        code: The program's source code; print what you want to see.
    """
    limits = _BOX_LIMITS or _Limits(timeout=10.0, memory_mb=512, max_output_chars=4000)
    return run_python(code, timeout=limits.timeout, memory_mb=limits.memory_mb,
                      max_output_chars=limits.max_output_chars)


python.runs_programs = True  # type: ignore[attr-defined]  # ToolBox checks for the sandbox before work


TOOLS: dict[str, Callable[..., str]] = {"calculator": calculator, "python": python}
