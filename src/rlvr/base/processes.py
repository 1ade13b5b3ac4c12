"""How rlvr confines the processes that run untrusted code, in one place: the bubblewrap jail (``jail``), resource
limits (address space, processes, CPU time, file size), the network guard, ``MAX_PROCESSES`` (a pids cgroup of its
own where this process may make one, ``RLIMIT_NPROC`` inside a jail's user namespace), death with the parent, and the
end of every descendant (a subreaper kills its tree, ``kill_tree`` kills a subreaper's tree from outside, even what
left its session). Where each applies: docs/explanation/isolation.md.

Standard library only: the jails run this file's source as a program (``supervise``), which starts a command under
those limits and kills what it left when it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import itertools
import os
import select
import signal
import subprocess
import sys
import threading
import time

MAX_PROCESSES = 128  # processes (threads count too) a jailed program and all it starts may hold at once
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36  # from <linux/prctl.h>
_ROUNDS = 100  # scans of /proc at most while stopping a tree, should a fork bomb outpace them
_caps = itertools.count()
JAIL_WORK = "/tmp/work"  # a jailed program's working folder: its own tmpfs
_JAIL_TMPFS_BYTES = 64 * 2**20


def become_subreaper() -> None:
    """Linux: orphans below this process are re-parented to it, not to init, so that ``kill_tree`` finds them."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def die_with_parent(parent: int | None = None) -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies, even mid-call."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    except (OSError, AttributeError):  # no libc to call
        return
    if parent is not None and os.getppid() != parent:  # it died before the prctl took hold
        os._exit(0)


def die_with(pid: int) -> None:
    """Linux 5.3+: SIGKILL this process when process ``pid`` ends, any process, not only the parent (a fork server's
    child dies with the process that asked for it, while the server outlives that one)."""
    if not hasattr(os, "pidfd_open"):  # Linux alone
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:  # it has ended already
        os._exit(0)
    except OSError:  # a kernel without pidfds (before Linux 5.3)
        return

    def watch() -> None:
        select.select([pidfd], [], [])  # readable when the process ends
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()


def limit_address_space(limit_bytes: int, grow: bool = False) -> None:
    """Cap this process's address space at ``limit_bytes`` (``grow``: at what it uses now plus ``limit_bytes``, for
    a process forked from a big one), never above the hard limit."""
    if grow:
        try:
            with open("/proc/self/statm") as file:
                limit_bytes += int(file.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        except OSError:  # no /proc: RLIMIT_AS is not enforced there either (macOS)
            return
    set_limit("RLIMIT_AS", limit_bytes)


def set_limit(name: str, soft: int, hard: int | None = None) -> None:
    """Set the resource limit ``name`` to ``soft`` and ``hard`` (None: ``soft``), never above the hard limit this
    process has. ``RLIMIT_NPROC`` counts a jail's user namespace's processes alone (Linux 5.14+); outside one it
    counts all of the user's, and root is never held to it."""
    import resource  # POSIX only

    kind = getattr(resource, name)
    ceiling = resource.getrlimit(kind)[1]
    hard = soft if hard is None else hard
    if ceiling != resource.RLIM_INFINITY:
        soft, hard = min(soft, ceiling), min(hard, ceiling)
    resource.setrlimit(kind, (soft, hard))


def block_network(message: str = "no network access") -> None:
    """Make ``socket.socket``, ``create_connection`` and ``getaddrinfo`` raise: a guard against reaching the network
    by accident, not a jail (``_socket`` is still there)."""
    import socket

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(message)

    socket.socket = socket.create_connection = socket.getaddrinfo = refuse  # type: ignore[assignment, misc]


def kill_group(pgid: int) -> None:
    """SIGKILL every process of the process group ``pgid`` (gone already: nothing to do)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def killed_by(code: int) -> str | None:
    """The name of the signal that ended a process of exit status ``code`` (-N as Popen says it, 128 + N as a shell,
    bwrap and the supervisor do), None where it exited."""
    number = -code if code < 0 else code - 128 if code > 128 else 0
    if not number:
        return None
    return signal.Signals(number).name if number in signal.valid_signals() else str(number)


def descendants(root: int) -> set[int]:
    """The ids of every process below ``root`` (its children, theirs, ...), read from /proc."""
    parents: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for name in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{name}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])  # after "pid (command)": state, ppid
                parents.setdefault(parent, []).append(int(name))
    found, todo = set(), [root]
    while todo:
        for child in parents.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_tree(root: int) -> None:
    """SIGKILL every process below ``root``: each is stopped first, scan after scan, so that none forks while the
    tree is read; complete where ``root`` is a subreaper (what its processes orphan stays below it)."""
    stopped: set[int] = set()
    for _ in range(_ROUNDS):
        found = descendants(root) - stopped
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= found
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kill_descendants() -> None:
    """Kill and reap every process below this one (a subreaper): call it where it has no child left to keep."""
    kill_tree(os.getpid())
    with contextlib.suppress(ChildProcessError):  # no child left
        while True:
            os.waitpid(-1, 0)


class ProcessCap:
    """At most ``limit`` processes for one program and all it starts, even those that leave its session: a pids
    cgroup of its own below this process's, where the cgroup file system lets it write (``folder``; else None).
    The program's process calls ``join`` before it runs (a ``preexec_fn``); ``close`` kills what is left and
    removes the cgroup."""

    def __init__(self, limit: int = MAX_PROCESSES) -> None:
        self.folder: str | None = None
        parent = _pids_folder()
        if parent is None:
            return
        _remove_orphans(parent)
        folder = os.path.join(parent, f"rlvr-{os.getpid()}-{next(_caps)}")
        try:
            os.mkdir(folder)
        except OSError:
            return
        try:
            with open(os.path.join(folder, "pids.max"), "w") as file:
                file.write(str(limit))
        except OSError:  # cgroup v2 without the pids controller here
            with contextlib.suppress(OSError):
                os.rmdir(folder)
            return
        self.folder = folder

    def join(self) -> None:
        if self.folder is not None:
            with contextlib.suppress(OSError), open(os.path.join(self.folder, "cgroup.procs"), "w") as file:
                file.write(str(os.getpid()))

    def close(self) -> None:
        """Kill every process in the cgroup, wait for each to exit (only then does it leave), and remove it."""
        if self.folder is None:
            return
        for _ in range(_ROUNDS):
            try:
                with open(os.path.join(self.folder, "cgroup.procs")) as file:
                    pids = [int(line) for line in file if line.strip()]
            except OSError:
                break
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            _wait_gone(pids)
        for _ in range(_ROUNDS):  # a process gone may leave the cgroup busy a moment longer
            try:
                os.rmdir(self.folder)
                break
            except OSError as err:
                if err.errno != errno.EBUSY:
                    break
                time.sleep(0.01)
        self.folder = None


def _remove_orphans(parent: str) -> None:
    """Remove the empty cgroups of rlvr processes that are gone (a trainer killed outright leaves them behind)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            owner = name.split("-")[1] if name.startswith("rlvr-") and name.count("-") == 2 else ""
            if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(parent, name))


def _wait_gone(pids: list[int], timeout: float = 5.0) -> None:
    """Wait (``timeout`` seconds at most) until each of ``pids`` has exited (its pidfd reads)."""
    import select

    fds = []
    for pid in pids:
        with contextlib.suppress(OSError, AttributeError):  # gone already, or no pidfd (Linux before 5.3)
            fds.append(os.pidfd_open(pid))
    try:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        left = len(fds)
        while left:
            events = poller.poll(timeout * 1000)
            if not events:
                return
            for fd, _ in events:
                poller.unregister(fd)
            left -= len(events)
    finally:
        for fd in fds:
            os.close(fd)


def _pids_folder() -> str | None:
    """The folder of this process's pids cgroup (v1's pids hierarchy, or v2 with the pids controller), or None."""
    try:
        with open("/proc/self/cgroup") as file:
            own = dict(line.rstrip("\n").split(":", 2)[1:] for line in file if line.count(":") >= 2)
        with open("/proc/self/mountinfo") as file:
            mounts = [line.split() for line in file]
    except OSError:
        return None
    found = []
    for fields in mounts:
        if "-" not in fields:
            continue
        kind = fields[fields.index("-") + 1:]
        if kind[0] == "cgroup" and "pids" in kind[-1].split(","):
            path = next((p for c, p in own.items() if "pids" in c.split(",")), None)
        elif kind[0] == "cgroup2":
            path = own.get("")
        else:
            continue
        if path is None or os.path.relpath(path, fields[3]).startswith(".."):
            continue
        folder = os.path.normpath(os.path.join(fields[4], os.path.relpath(path, fields[3])))
        if kind[0] == "cgroup":
            return folder
        with contextlib.suppress(OSError), open(os.path.join(folder, "cgroup.controllers")) as file:
            if "pids" in file.read().split():
                found.append(folder)
    return found[0] if found else None


@functools.cache
def jail() -> tuple[str, ...] | None:
    """bubblewrap's options that jail a program (the program and its working folder follow them): new PID, network,
    mount, IPC, UTS and user namespaces (all it starts ends with it; only its own loopback), killed with its
    parent, read-only system and Python folders and nothing else of the host, a private tmpfs ``/tmp`` as its only
    writable place. None where ``bwrap`` is missing or cannot make namespaces here (said once, as a warning)."""
    import shutil
    import warnings

    found = shutil.which("bwrap")
    if found is None:
        why = "bwrap is not installed (Debian: apt-get install bubblewrap)"
    else:
        interpreter = os.path.realpath(sys.executable)
        options = [found, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                   "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", JAIL_WORK, "--setenv", "TMPDIR",
                   JAIL_WORK]
        for name in ("usr", "bin", "lib", "lib32", "lib64", "sbin"):
            path = os.path.join("/", name)
            if os.path.islink(path):
                options += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                options += ["--ro-bind", path, path]
        options += ["--proc", "/proc", "--dev", "/dev", "--size", str(_JAIL_TMPFS_BYTES), "--tmpfs", "/tmp",
                    "--dir", JAIL_WORK]
        # after the private /tmp, which would hide a virtual environment (or Python) under /tmp
        for path in sorted({sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(interpreter))}):
            if not path.startswith("/usr/"):
                options += ["--ro-bind", path, path]
        try:
            probe = subprocess.run([*options, "--chdir", JAIL_WORK, "--", interpreter, "-I", "-S", "-c", "pass"],
                                   capture_output=True, timeout=30)
            if probe.returncode == 0:
                return tuple(options)
            said = probe.stderr.decode("utf-8", errors="replace").strip().split("\n", 1)[0][:300]
            why = f"bwrap cannot make its namespaces here ({said or probe.returncode})"
        except (OSError, subprocess.TimeoutExpired) as err:
            why = f"bwrap does not run ({err})"
    warnings.warn(f"programs (the python tool's, an agent command) run without a namespace sandbox: {why}; a "
                  "program's processes are then bounded by its process group and resource limits only", stacklevel=2)
    return None


def supervised(argv: list[str], memory: int = 0, jailed: bool = False, cpu_seconds: int = 0, file_bytes: int = 0
               ) -> list[str]:
    """The command line that runs ``argv`` under ``supervise`` (``python -I -S`` and this file's source), with
    ``memory`` bytes of address space, ``cpu_seconds`` of CPU time and files of ``file_bytes`` at most (0: no cap)
    and, in a jail, an ``RLIMIT_NPROC`` of MAX_PROCESSES (outside a jail's user namespace it would count all of the
    user's processes; there the pids cgroup caps them)."""
    limits = (memory, MAX_PROCESSES if jailed else 0, cpu_seconds, file_bytes)
    return [os.path.realpath(sys.executable), "-I", "-S", "-c", _source(), *map(str, limits), "--", *argv]


@functools.cache
def _source() -> str:
    with open(__file__, encoding="utf-8") as file:
        return file.read()


def supervise(memory: int, processes: int, cpu_seconds: int, file_bytes: int, argv: list[str]) -> int:
    """Run ``argv`` with ``memory`` bytes of address space, an ``RLIMIT_NPROC`` of ``processes``, ``cpu_seconds`` of
    CPU time (SIGXCPU, SIGKILL a second later) and files of ``file_bytes`` (each where > 0), as the subreaper of all
    it starts, and kill what it left; its exit code (killed by signal N: 128 + N, as a shell says it)."""
    become_subreaper()

    def limits() -> None:
        die_with_parent()  # the supervisor's end (SIGKILL too) is the command's
        if memory > 0:
            limit_address_space(memory)
        if processes > 0:
            set_limit("RLIMIT_NPROC", processes)
        if cpu_seconds > 0:
            set_limit("RLIMIT_CPU", cpu_seconds, cpu_seconds + 1)
        if file_bytes > 0:
            set_limit("RLIMIT_FSIZE", file_bytes)

    try:
        child = subprocess.Popen(argv, preexec_fn=limits)
    except OSError as err:
        print(f"cannot start the command: {err}", file=sys.stderr)
        return 127
    code = child.wait()
    kill_descendants()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(supervise(*map(int, sys.argv[1:5]), sys.argv[6:]))
