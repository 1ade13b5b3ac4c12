"""Programs run in a jail of their own: ``jail()`` (bubblewrap's namespaces) and
``run_python``, which runs a program's source in a fresh interpreter under limits.

``run_python`` (the ``python`` tool's, ``rlvr.environments.tools``) runs a program in a jail
of its own (``jail()``, bubblewrap): new PID, network and mount namespaces, so every
process it starts ends with it, it reaches no socket of the host (not even loopback) and
sees only the system's and Python's folders, read-only, with a private tmpfs ``/tmp``. Where bwrap is missing or
cannot make namespaces, that is said once and the program runs under the guard alone (its
own process group, resource limits, blocked ``socket``), which a program can escape. Its
failures raise ``ToolError``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from typing import Any

from rlvr.base.processes import ProcessCap, die_with_parent, kill_tree, supervised
from rlvr.environments.base import ToolError

_MESSAGE_CHARS = 300  # bwrap's complaint is cut to this many characters


# python: a program in a fresh interpreter, under limits of its own; its source comes on stdin
_PYTHON_PRELUDE = """
import os, resource, socket, sys
for kind, value in zip((resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_FSIZE), map(int, sys.argv[1:4])):
    hard = resource.getrlimit(kind)[1]  # SIGXCPU ends it at the soft CPU limit, SIGKILL a second later
    cap = lambda limit: limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(kind, (cap(value), cap(value + (kind == resource.RLIMIT_CPU))))
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
_JAIL_WORK = "/tmp/work"  # the program's working folder inside its sandbox: its own tmpfs
_JAIL_TMPFS_BYTES = 64 * 2**20


@functools.cache
def jail() -> tuple[str, ...] | None:
    """bubblewrap's options that jail a program (the program and its working folder follow
    them): new PID, network, mount, IPC, UTS and user namespaces (every process it starts
    ends with it; no network but its own loopback), killed with its parent, read-only
    system and Python folders and nothing else of the host, a private tmpfs ``/tmp`` as its
    only writable place. None where ``bwrap`` is not installed or cannot make namespaces
    here (said once, as a warning)."""
    found = shutil.which("bwrap")
    if found is None:
        why = "bwrap is not installed (Debian: apt-get install bubblewrap)"
    else:
        interpreter = os.path.realpath(sys.executable)
        options = [found, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                   "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", _JAIL_WORK, "--setenv", "TMPDIR",
                   _JAIL_WORK]
        for name in ("usr", "bin", "lib", "lib32", "lib64", "sbin"):
            path = os.path.join("/", name)
            if os.path.islink(path):
                options += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                options += ["--ro-bind", path, path]
        options += ["--proc", "/proc", "--dev", "/dev", "--size", str(_JAIL_TMPFS_BYTES), "--tmpfs", "/tmp",
                    "--dir", _JAIL_WORK]
        # after the private /tmp, which would hide a virtual environment (or Python) under /tmp
        for path in sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(interpreter))}):
            if not path.startswith("/usr/"):
                options += ["--ro-bind", path, path]
        try:
            probe = subprocess.run([*options, "--chdir", _JAIL_WORK, "--", interpreter, "-I", "-S", "-c", "pass"],
                                   capture_output=True, timeout=30)
            if probe.returncode == 0:
                return tuple(options)
            why = f"bwrap cannot make its namespaces here ({_first_line(probe.stderr) or probe.returncode})"
        except (OSError, subprocess.TimeoutExpired) as err:
            why = f"bwrap does not run ({err})"
    warnings.warn(f"programs (the python tool's, an agent command) run without a namespace sandbox: {why}; a "
                  "program's processes are then bounded by its process group and resource limits only", stacklevel=2)
    return None


def _first_line(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").strip().split("\n", 1)[0][:_MESSAGE_CHARS]


def run_python(
    code: str, *, timeout: float = 10.0, cpu_seconds: int | None = None, memory_mb: int = 512,
    max_output_chars: int = 4000,
) -> str:
    """Run ``code`` as a program in a fresh ``python -I -S`` (no site packages, an empty
    environment), its source on stdin, in ``jail()`` where bwrap runs (else in a
    temp folder removed afterwards, its own process group), under a CPU-time (default: the
    timeout, rounded up), address-space and file-size limit, killed after ``timeout``
    seconds or once it prints past the output limit. Returns its stdout; raises ToolError
    with the head of its stdout, the tail of its stderr and why it ended when it failed
    (an exception, a non-zero exit, a limit) or printed more than ``max_output_chars``."""
    cpu_seconds = math.ceil(timeout) if cpu_seconds is None else cpu_seconds
    keep = 4 * max_output_chars  # bytes: a character is at most 4
    output_limit = max(8 * max_output_chars, 2**16)  # bytes a stream (or a file it writes) may reach
    limits = [str(cpu_seconds), str(memory_mb * 2**20), str(output_limit)]
    options = jail()
    python = [os.path.realpath(sys.executable), "-I", "-S", "-c", _PYTHON_PRELUDE, *limits]
    cap = ProcessCap()
    with contextlib.ExitStack() as stack:
        stack.callback(cap.close)
        if options is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="rlvr-python-", ignore_cleanup_errors=True))
            argv = supervised(python)
            env: dict[str, str] | None = {"PATH": os.defpath, "HOME": folder, "TMPDIR": folder}
        else:
            argv = [*options, "--chdir", _JAIL_WORK, "--", *supervised(python, jailed=True)]
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
            with contextlib.suppress(ProcessLookupError):  # it, and its group
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = out.head.decode("utf-8", errors="replace")
    if returncode == 0:
        if out.total <= keep and len(text) <= max_output_chars:
            return text
        raise ToolError(f"{text[:max_output_chars]}\n[output cut: {out.total} bytes in all, "
                        f"the limit is {max_output_chars} characters]")
    if isinstance(returncode, int) and returncode > 128:
        returncode = 128 - returncode  # bwrap and the supervisor report a death by signal N as exit code 128 + N
    if returncode == "flooded":
        why = f"stopped: it printed past {output_limit} bytes"
    elif returncode is None:
        why = f"timed out after {timeout:g}s"
    elif returncode == -signal.SIGXCPU:
        why = f"stopped at its CPU time limit of {cpu_seconds}s"
    elif isinstance(returncode, int) and returncode < 0:
        why = f"killed by {signal.Signals(-returncode).name if -returncode in signal.valid_signals() else -returncode}"
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
    """Feed ``data`` to the process's stdin, then read its stdout (the first ``keep`` bytes
    kept) and stderr (the last ``keep`` kept) until it exits: its exit code, None at the
    timeout, or "flooded" once either stream passed ``limit`` bytes. What it left running
    and holding the pipes keeps the call waiting ``settle`` seconds at most (a jail's
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
    """Read what ``pipe`` holds now into ``stream`` (unregistered at its end), stopping past
    ``limit`` bytes in all; its total."""
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
