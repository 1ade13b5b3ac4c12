"""A run's directory: created empty, locked for the life of the run, written atomically."""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from rlvr.base.errors import RunError, os_reason

if TYPE_CHECKING:
    from rlvr.config import Config

LOCK_FILE = ".lock"
# What a run writes beside its config.yaml before its first checkpoint (checkpoints: only
# temporary folders then); a resume may replace all of it.
PARTIAL_OUTPUTS = ("metrics.jsonl", "samples.md", "tensorboard", "checkpoints")
DATA_FILES = "data_files.json"  # the fingerprints of the data files the run reads (rlvr.runs.resume)


# ---------------------------------------------------------------- the run directory and its lock

_held_locks: set[int] = set()  # fds of the run-directory locks this process holds


def _drop_locks_in_child() -> None:
    # A forked child (a reward worker) shares the lock's open file; closing its copy
    # (not unlocking: that would free the parent's lock) means a child that outlives
    # the run does not keep its directory locked.
    for fd in _held_locks:
        with suppress(OSError):
            os.close(fd)
    _held_locks.clear()


os.register_at_fork(after_in_child=_drop_locks_in_child)


def _try_lock(run_dir: Path) -> int | None:
    """Lock ``RUN_DIR/.lock`` (flock, exclusive, non-blocking): its fd, or None when another process holds it.
    The kernel frees the lock however its process dies: a killed run leaves no stale lock."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise RunError(f"cannot lock run directory {run_dir}: {os_reason(err)}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    with suppress(OSError):  # the pid is only for the "in use" message
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
    _held_locks.add(fd)
    return fd


def _unlock(fd: int) -> None:
    _held_locks.discard(fd)
    os.close(fd)


def _in_use(run_dir: Path) -> str:
    try:
        holder = f" (pid {int((run_dir / LOCK_FILE).read_text())})"
    except (OSError, ValueError):
        holder = ""
    return f"run directory {run_dir} is in use by another process{holder}; one run at a time"


def _holds_files(run_dir: Path) -> bool:
    """Anything but the lock and a temporary file (a start killed while writing config.yaml)."""
    return any(p.name != LOCK_FILE and not p.name.startswith(".tmp-") for p in run_dir.iterdir())


@contextmanager
def locked_run_dir(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock for the block; RunError when another process holds it."""
    fd = _try_lock(run_dir)
    if fd is None:
        raise RunError(_in_use(run_dir))
    try:
        yield run_dir
    finally:
        _unlock(fd)


def stopped_before_first_checkpoint(run_dir: Path) -> bool:
    """Does ``run_dir`` hold only a training run that ended before its first checkpoint (config.yaml, metrics.jsonl
    and partial outputs)? A resume would keep nothing of it."""
    allowed = {LOCK_FILE, "config.yaml", "resumes.jsonl", DATA_FILES, *PARTIAL_OUTPUTS}
    names = {p.name for p in run_dir.iterdir() if not p.name.startswith(".tmp-")}
    checkpoints = run_dir / "checkpoints"
    finished = checkpoints.is_dir() and any(not p.name.startswith(".tmp-") for p in checkpoints.iterdir())
    return {"config.yaml", "metrics.jsonl"} <= names <= allowed and not finished


def discard_partial_outputs(run_dir: Path) -> None:
    """Delete what a run killed before its first checkpoint wrote, but its config and resume history."""
    for name in PARTIAL_OUTPUTS:
        path = run_dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _reuse_stopped_run(run_dir: Path) -> bool:
    """With the lock held: empty a run that stopped before its first checkpoint (with a warning), and True."""
    if not stopped_before_first_checkpoint(run_dir):
        return False
    warnings.warn(f"{run_dir} held a run that stopped before its first checkpoint; the new run takes its place "
                  "(its partial records are discarded)", stacklevel=3)
    discard_partial_outputs(run_dir)
    for name in ("config.yaml", "resumes.jsonl", DATA_FILES):
        (run_dir / name).unlink(missing_ok=True)
    return True


@contextmanager
def new_run_dir(config: Config, resumable: bool = True) -> Iterator[Path]:
    """A new, empty run directory, locked for the block.

    The first empty, unlocked one of ``runs/<name>``, ``runs/<name>-2``, ...; the lock is taken before looking
    inside, so concurrent starts pick different directories. An explicit ``out_dir`` that holds a run or is in use
    is an error. ``resumable`` (training, not sft): takes the place of a run that stopped before its first
    checkpoint, and the "already holds files" error suggests ``resume=``.
    """
    base = config.run_dir
    for k in itertools.count(1):
        run_dir = base if k == 1 else base.parent / f"{base.name}-{k}"
        reusable = resumable and run_dir.is_dir() and stopped_before_first_checkpoint(run_dir)
        if not config.out_dir and run_dir.is_dir() and _holds_files(run_dir) and not reusable:
            continue  # taken: not even a lock file is added to another run
        try:
            if run_dir.exists() and not run_dir.is_dir():
                raise RunError(f"cannot create run directory {run_dir}: a file of that name is in the way")
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RunError(f"cannot create run directory {run_dir}: {os_reason(err)}") from err
        fd = _try_lock(run_dir)
        if fd is not None and (not _holds_files(run_dir) or (resumable and _reuse_stopped_run(run_dir))):
            break
        if fd is not None:
            _unlock(fd)
        if config.out_dir:
            again = (f"choose another out_dir, or continue that run with: rlvr train resume={run_dir}" if resumable
                     else "choose another out_dir (sft has no resume: a new run needs an empty directory)")
            raise RunError(_in_use(run_dir) if fd is None else f"run directory {run_dir} already holds files; {again}")
    if run_dir != base:
        warnings.warn(f"{base} holds another run; this one writes {run_dir} (name=... or out_dir=... chooses "
                      "the directory)", stacklevel=3)
    try:
        yield run_dir
    finally:
        _unlock(fd)


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step: a kill leaves the old file or the new."""
    tmp = path.with_name(f".tmp-{path.name}")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
