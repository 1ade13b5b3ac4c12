"""A run on disk: its directory (locked while a process runs it), resolved config,
metrics, checkpoints, figure and progress bar; starting a run and resuming one."""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import itertools
import json
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rlvr.checkpoint import PREFIX, list_checkpoints, load_latest, save_checkpoint
from rlvr.config import Config, ConfigError, LogConfig, load_config
from rlvr.metrics import (
    ExperimentTrackerSink,
    JsonlSink,
    Record,
    TensorBoardSink,
    plot_runs,
    read_records,
    write_samples_markdown,
)
from rlvr.trainer import TrainState, setup, train

LOCK_FILE = ".lock"


class RunError(RuntimeError):
    """A run that cannot start or go on (its directory is taken, say)."""


def _reason(err: OSError) -> str:
    return err.strerror or str(err)


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
    """Lock ``RUN_DIR/.lock`` (flock, exclusive, non-blocking): its fd, or None when another
    process holds it. The kernel frees the lock when its process dies, however it dies,
    so a killed run leaves no stale lock."""
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise RunError(f"cannot lock run directory {run_dir}: {_reason(err)}") from err
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


@contextmanager
def new_run_dir(config: Config) -> Iterator[Path]:
    """A new, empty run directory, locked for the block.

    ``runs/<name>`` takes the first of ``runs/<name>``, ``runs/<name>-2``, ... that is
    empty and unlocked; the lock is taken before looking inside, so two concurrent
    starts pick different directories. An explicit ``out_dir`` that holds a run or is
    in use is an error (nothing is overwritten).
    """
    base = config.run_dir
    for k in itertools.count(1):
        run_dir = base if k == 1 else base.parent / f"{base.name}-{k}"
        if not config.out_dir and run_dir.is_dir() and _holds_files(run_dir):
            continue  # taken: not even a lock file is added to another run
        try:
            if run_dir.exists() and not run_dir.is_dir():
                raise RunError(f"cannot create run directory {run_dir}: a file of that name is in the way")
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise RunError(f"cannot create run directory {run_dir}: {_reason(err)}") from err
        fd = _try_lock(run_dir)
        if fd is not None and not _holds_files(run_dir):
            break
        if fd is not None:
            _unlock(fd)
        if config.out_dir:
            raise RunError(_in_use(run_dir) if fd is None else
                           f"run directory {run_dir} already holds files; choose another out_dir or resume={run_dir}")
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


class Progress:
    """A progress bar over epochs showing the mean reward and solve rate."""

    def __init__(self, epochs: int, enabled: bool, desc: str, initial: int = 0):
        self.bar = tqdm(total=epochs, initial=initial, disable=not enabled, desc=desc,
                        dynamic_ncols=True, leave=True, mininterval=0.5)
        self.epoch = -1

    def __call__(self, record: Record) -> None:
        if record["kind"] == "train" and record["epoch"] != self.epoch:
            self.epoch = record["epoch"]
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{record['reward_mean']:.3f}", solve=f"{record['solve_rate']:.2f}")
        elif record["kind"] == "eval":
            self.bar.set_postfix(eval_greedy=f"{record['greedy_solve_rate']:.2f}")

    def close(self) -> None:
        self.bar.close()


class Stopped(KeyboardInterrupt):
    """The run stopped on a signal; the CLI exits with 128 + ``signum``, as a shell
    reports a process the signal ended."""

    def __init__(self, message: str, signum: int = signal.SIGINT):
        super().__init__(message)
        self.signum = signum


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # Ctrl-C; schedulers and ``docker stop``


@contextmanager
def stop_on_signals(st: TrainState, run_dir: Path) -> Iterator[list[int]]:
    """First SIGINT or SIGTERM: finish the current step, checkpoint, stop. A second one:
    stop at once (the last checkpoint stays). Yields the signals received."""
    received: list[int] = []

    def handler(signum, frame):
        received.append(signum)
        name = signal.Signals(signum).name
        if st.stop_requested:
            raise Stopped(f"stopped by a second {name} without a checkpoint; continue from the last one "
                          f"with: rlvr train resume={run_dir}", signum)
        st.stop_requested = True
        print(f"\nrlvr: {name}: stopping after this step and writing a checkpoint (send it again to abort)", flush=True)

    try:
        previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    except ValueError:  # not the main thread: leave signals alone
        yield received
        return
    try:
        yield received
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _checkpointer(config: Config, run_dir: Path, metrics: JsonlSink):
    """Checkpoint every k epochs, at the end, and where a stop was requested (mid-epoch too)."""
    every = config.log.checkpoint_every

    def on_epoch_end(st: TrainState) -> None:
        boundary = st.inner_step == 0
        last = st.epoch == config.algo.epochs or st.stop_requested
        if not (last or (boundary and every and st.epoch % every == 0)):
            return
        try:
            metrics.sync()  # the records the checkpoint counts reach the disk before it
            save_checkpoint(run_dir, f"{PREFIX}{st.step:09d}", st.payload(), st.policy, config.log.keep_checkpoints)
        except OSError as err:
            raise RunError(f"cannot write a checkpoint in {run_dir / 'checkpoints'}: {_reason(err)}; the previous "
                           f"one is intact (rlvr train resume={run_dir} continues from it)") from err

    return on_epoch_end


# ---------------------------------------------------------------- resuming

# What a resume may change: how long the run goes on and what it reports, not what it
# computes. ``log.*`` only observes the run; reward limits, workers and threads change
# how fast it goes (a call on the edge of its time limit aside, and threads may change
# the last bits of CPU sums).
RESUMABLE = ("algo.epochs", "name", "threads", "rewards.timeout", "rewards.num_workers",
             *(f"log.{f.name}" for f in dataclasses.fields(LogConfig)))


def _flat(config: Config) -> dict[str, Any]:
    """``{"algo.epochs": 100, ...}``: every field of every section, and the top-level ones."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update({f"{f.name}.{g.name}": getattr(value, g.name) for g in dataclasses.fields(value)})
        else:
            out[f.name] = value
    return out


def resume_changes(stored: Config, config: Config) -> dict[str, dict[str, Any]]:
    """What ``config`` changes from the run's ``stored`` config, ``{key: {"was", "now"}}``
    (``out_dir`` aside: the directory may have moved); ConfigError naming every change
    a resume cannot honour."""
    was, now = _flat(stored), _flat(config)
    changes = {key: {"was": was[key], "now": now[key]} for key in now if key != "out_dir" and now[key] != was[key]}
    refused = [f"{key} (was {c['was']!r}, now {c['now']!r})" for key, c in changes.items() if key not in RESUMABLE]
    if refused:
        raise ConfigError(f"resume cannot change {', '.join(refused)}; allowed on resume: {', '.join(RESUMABLE)}")
    if "algo.epochs" in changes and stored.optim.schedule != "constant":
        c = changes["algo.epochs"]
        raise ConfigError(f"resume cannot change algo.epochs (was {c['was']}, now {c['now']}) with "
                          f"optim.schedule={stored.optim.schedule!r}: the learning rate decays over the epochs")
    return changes


def _metrics_at(path: Path, count: int, checkpoint: Path) -> list[Record]:
    """The run's first ``count`` records (those ``checkpoint`` follows), the file cut to
    them: records past the checkpoint and a torn last line (a kill mid-write) go."""
    try:
        records = read_records(path) if path.is_file() else []
    except ValueError as err:
        raise RunError(str(err)) from err
    if len(records) < count:
        raise RunError(f"{path} holds {len(records)} records but checkpoint {checkpoint.name} follows {count}: "
                       "the file was cut short or replaced, and resuming would lose records")
    records = records[:count]
    write_atomically(path, "".join(json.dumps(record) + "\n" for record in records))
    return records


def _discard_partial_outputs(run_dir: Path) -> None:
    """What a run killed before its first checkpoint wrote, but its config."""
    for name in ("metrics.jsonl", "samples.md"):
        (run_dir / name).unlink(missing_ok=True)
    for name in ("tensorboard", "checkpoints"):  # checkpoints: only half-written ones
        shutil.rmtree(run_dir / name, ignore_errors=True)


def _resume(config: Config, run_dir: Path, stack: ExitStack) -> tuple[Any, TrainState]:
    """The state to continue ``run_dir`` from, after checking what ``config`` changes;
    a run killed before its first checkpoint starts again from the beginning. The
    accepted changes go into ``config.yaml`` and a line of ``resumes.jsonl``."""
    changes = resume_changes(load_config(run_dir / "config.yaml"), config)
    _, st = state = _setup(config, stack)
    checkpoint = None
    if not list_checkpoints(run_dir):
        _discard_partial_outputs(run_dir)
    else:
        checkpoint, payload = load_latest(run_dir, TrainState.PAYLOAD_KEYS)
        if config.algo.epochs < payload["epoch"]:
            raise ConfigError(f"algo.epochs={config.algo.epochs} is below the epoch the run has reached "
                              f"({payload['epoch']})")
        st.restore(payload, _metrics_at(run_dir / "metrics.jsonl", payload["num_records"], checkpoint))
    entry = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "checkpoint": checkpoint and checkpoint.name, "epoch": st.epoch, "step": st.step, "changes": changes}
    with (run_dir / "resumes.jsonl").open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    if changes:
        config.out_dir = str(run_dir)
        write_atomically(run_dir / "config.yaml", config.to_yaml())
    return state


# ---------------------------------------------------------------- running


def _setup(config: Config, stack: ExitStack) -> tuple[Any, TrainState]:
    """``setup``, with the task closed (its reward workers stopped) when the run ends."""
    task, st = setup(config)
    close = getattr(task, "close", None)
    if close is not None:
        stack.callback(close)
    return task, st


def _start(config: Config, stack: ExitStack) -> tuple[Path, tuple[Any, TrainState]]:
    """A new run: built first, so a configuration that fails to build leaves nothing
    behind, then its directory (locked) with ``config.yaml``."""
    state = _setup(config, stack)
    run_dir = stack.enter_context(new_run_dir(config))
    config.out_dir = str(run_dir)
    try:
        write_atomically(run_dir / "config.yaml", config.to_yaml())
    except OSError as err:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise RunError(f"cannot write {run_dir / 'config.yaml'}: {_reason(err)}") from err
    return run_dir, state


def run_training(
    config: Config, plot: bool | None = None, resume: str | Path | None = None
) -> tuple[list[Record], Path]:
    """Train with everything written to the run directory; returns (records, run_dir).

    The directory is locked while the run lasts: a second run or resume of it is
    refused. With ``resume`` the run continues from the newest usable checkpoint of that
    directory (from the beginning if it was killed before its first one), after
    ``resume_changes`` accepted what ``config`` changes. SIGINT and SIGTERM stop after the
    current step with a checkpoint (``Stopped``); a file that cannot be written ends the
    run with a RunError naming it.
    """
    with ExitStack() as stack:
        if resume is None:
            run_dir, state = _start(config, stack)
        else:
            if not (Path(resume) / "config.yaml").is_file():
                raise ConfigError(f"resume={resume}: no config.yaml there (not a run directory)")
            run_dir = stack.enter_context(locked_run_dir(Path(resume)))
            state = _resume(config, run_dir, stack)
        st = state[1]
        metrics = JsonlSink(run_dir / "metrics.jsonl")
        sinks = [metrics]
        if config.log.tensorboard:
            sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        if config.log.tracker:
            sinks.append(ExperimentTrackerSink(config.log.tracker, config.log.tracker_project, config.name, config.to_dict()))
        progress = Progress(config.algo.epochs, config.log.progress, config.name, initial=st.epoch)

        def on_record(record: Record) -> None:
            writers = [(getattr(sink, "path", run_dir), sink) for sink in sinks]
            if record["kind"] == "samples":
                writers.append((run_dir / "samples.md", partial(write_samples_markdown, run_dir / "samples.md")))
            for path, write in writers:
                try:
                    write(record)
                except OSError as err:
                    raise RunError(f"cannot write {path}: {_reason(err)}") from err
            progress(record)

        try:
            with stop_on_signals(st, run_dir) as received:
                records = train(config, on_record=on_record, state=state,
                                on_epoch_end=_checkpointer(config, run_dir, metrics))
        finally:
            progress.close()
            for sink in sinks:
                with suppress(OSError):  # a close that fails follows a write that failed, reported above
                    sink.close()
    if st.stop_requested:
        signum = received[0] if received else signal.SIGINT
        raise Stopped(f"stopped by {signal.Signals(signum).name} at epoch {st.epoch} (step {st.step}), checkpoint "
                      f"written; continue with: rlvr train resume={run_dir}", signum)
    if config.log.plot if plot is None else plot:
        plot_runs({config.name: records}, run_dir / "plot.png", config.name)
    return records, run_dir


def resume_config(run_dir: str | Path, overrides: list[str]) -> Config:
    """The config a run was started with (its ``config.yaml``), plus overrides."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError(f"resume={run_dir}: no config.yaml there (not a run directory)")
    return load_config(run_dir / "config.yaml", overrides + [f"out_dir={run_dir}"])
