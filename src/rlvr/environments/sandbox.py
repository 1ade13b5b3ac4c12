"""``run_python`` (the ``python`` tool's): a program's source run in a fresh interpreter, in a jail of its own
(``rlvr.base.processes.jail``) where bubblewrap runs, under time, CPU, memory, file-size and output limits. Where
bwrap is missing or cannot make namespaces, that is said once and the program runs under the guard alone (its own
process group, resource limits, blocked ``socket``), which a program can escape. Its failures raise ``ToolError``.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from rlvr.base.processes import (
    JAIL_WORK,
    ProcessCap,
    die_with_parent,
    jail,
    kill_group,
    kill_tree,
    killed_by,
    supervised,
)
from rlvr.environments.base import ToolError

# python: a program in a fresh interpreter (its limits set by its supervisor); its source comes on stdin
_PYTHON_PRELUDE = """
import os, socket, sys
def refuse(*args, **kwargs):
    raise PermissionError("no network access")
socket.socket = socket.create_connection = socket.getaddrinfo = refuse
source = sys.stdin.read()
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
sys.argv = ["main.py"]
code = compile(source, "main.py", "exec")
del source
exec(code, {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__})
"""
def run_python(
    code: str, *, timeout: float = 10.0, cpu_seconds: int | None = None, memory_mb: int = 512,
    max_output_chars: int = 4000,
) -> str:
    """Run ``code`` in a fresh ``python -I -S`` (no site packages, an empty environment), in ``jail()`` where bwrap
    runs (else in a temp folder, its own process group), under a CPU-time (default: the timeout, rounded up),
    address-space and file-size limit, killed after ``timeout`` seconds or once it prints past the output limit.
    Returns its stdout; ToolError with the head of its stdout, the tail of its stderr and why it ended when it
    failed or printed more than ``max_output_chars``."""
    cpu_seconds = math.ceil(timeout) if cpu_seconds is None else cpu_seconds
    keep = 4 * max_output_chars  # bytes: a character is at most 4
    output_limit = max(8 * max_output_chars, 2**16)  # bytes a stream (or a file it writes) may reach
    limits = {"memory": memory_mb * 2**20, "cpu_seconds": cpu_seconds, "file_bytes": output_limit}
    options = jail()
    python = [os.path.realpath(sys.executable), "-I", "-S", "-c", _PYTHON_PRELUDE]
    cap = ProcessCap()
    with contextlib.ExitStack() as stack:
        stack.callback(cap.close)
        if options is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="rlvr-python-", ignore_cleanup_errors=True))
            argv = supervised(python, **limits)
            env: dict[str, str] | None = {"PATH": os.defpath, "HOME": folder, "TMPDIR": folder}
        else:
            argv = [*options, "--chdir", JAIL_WORK, "--", *supervised(python, jailed=True, **limits)]
            folder, env = None, {"PATH": os.defpath}

        def started() -> None:
            cap.join()
            if options is None:
                die_with_parent()

        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   cwd=folder, env=env, start_new_session=True, preexec_fn=started)
        try:
            returncode, out, err = _communicate(process, code.encode("utf-8", errors="replace"), timeout,
                                                keep, output_limit, settle=0.0 if options is None else 1.0)
        finally:
            if process.poll() is None:  # cut short: what it started, in a session of its own too (its
                kill_tree(process.pid)  # supervisor is their subreaper; one that ended killed them itself)
            kill_group(process.pid)  # it, and its group
            process.wait()
    text = out.head.decode("utf-8", errors="replace")
    if returncode == 0:
        if out.total <= keep and len(text) <= max_output_chars:
            return text
        raise ToolError(f"{text[:max_output_chars]}\n[output cut: {out.total} bytes in all, "
                        f"the limit is {max_output_chars} characters]")
    if returncode == "flooded":
        why = f"stopped: it printed past {output_limit} bytes"
    elif returncode is None:
        why = f"timed out after {timeout:g}s"
    elif killed_by(returncode) == "SIGXCPU":
        why = f"stopped at its CPU time limit of {cpu_seconds}s"
    elif killed_by(returncode) is not None:
        why = f"killed by {killed_by(returncode)}"
    else:
        why = f"exit code {returncode}"
    half = max_output_chars // 2
    shown = text[:half] + (f"\n[output cut: {out.total} bytes in all]" if out.total > len(text[:half]) else "")
    tail = err.tail.decode("utf-8", errors="replace").rstrip()[-half:]
    raise ToolError("\n".join(part for part in (shown if text else "", tail, f"[{why}]") if part))


@dataclass
class _Stream:
    head: bytes = b""
    tail: bytes = b""
    total: int = 0


def _communicate(process: subprocess.Popen, data: bytes, timeout: float, keep: int, limit: int, settle: float = 0.0
                 ) -> tuple[int | str | None, _Stream, _Stream]:
    """Feed ``data`` to stdin and read stdout (its first ``keep`` bytes kept) and stderr (its last) until the
    process exits: its exit code, None at the timeout, or "flooded" once either stream passed ``limit`` bytes.
    What it left running and holding the pipes keeps the call waiting ``settle`` seconds at most (a jail's
    processes are being killed then: the pipes close when the last is gone)."""
    import selectors

    deadline, settled = time.monotonic() + timeout, math.inf
    out, err = _Stream(), _Stream()
    streams = {process.stdout: out, process.stderr: err}
    pending = memoryview(data)
    with contextlib.ExitStack() as stack:
        selector = stack.enter_context(selectors.DefaultSelector())
        for pipe in streams:
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe, selectors.EVENT_READ)
        os.set_blocking(process.stdin.fileno(), False)
        selector.register(process.stdin, selectors.EVENT_WRITE)
        try:
            ended: int | None = os.pidfd_open(process.pid)
            stack.callback(os.close, ended)
            selector.register(ended, selectors.EVENT_READ)
        except (AttributeError, OSError):  # no pidfd (Linux before 5.3): look every 50 ms
            ended = None
        while True:
            if any(_drain(pipe, stream, selector, keep, limit) > limit for pipe, stream in streams.items()):
                return "flooded", out, err
            if settled == math.inf and process.poll() is not None:
                settled = time.monotonic() + settle
                if ended is not None:
                    selector.unregister(ended)  # readable from now on: no longer a thing to wait for
            open_pipes = any(pipe in selector.get_map() for pipe in streams)
            if settled < math.inf and (time.monotonic() >= settled or not open_pipes):
                return process.returncode, out, err
            left = min(deadline, settled) - time.monotonic()
            if left <= 0:
                return None, out, err
            wait = left if ended is not None or settled < math.inf else min(left, 0.05)
            if any(key.fileobj is process.stdin for key, _ in selector.select(wait)):
                try:
                    pending = pending[os.write(process.stdin.fileno(), pending[:2**16]):]
                except BrokenPipeError:
                    pending = pending[:0]
                if not pending:
                    selector.unregister(process.stdin)
                    process.stdin.close()


def _drain(pipe: Any, stream: _Stream, selector: Any, keep: int, limit: int) -> int:
    """Read what ``pipe`` holds now into ``stream`` (unregistered at its end), stopping past ``limit``; its total."""
    while pipe in selector.get_map() and stream.total <= limit:
        try:
            chunk = os.read(pipe.fileno(), 2**16)
        except BlockingIOError:
            break
        if not chunk:
            selector.unregister(pipe)
            break
        stream.head += chunk[: max(0, keep - len(stream.head))]
        stream.tail = (stream.tail + chunk)[-keep:]
        stream.total += len(chunk)
    return stream.total
